"""Builds a small, realistic run directory for the TUI tests (and for looking at the app by hand).

    python tests/tui/fixture_store.py RUN_DIR [--interp]      # build
    python tests/tui/fixture_store.py RUN_DIR --add N         # append N promoted offspring (a live run)

It writes through the real Store API so the tests see exactly what the engine would write; the `--add` form
runs in a separate process in the refresh test, because LMDB allows one open environment per process.
"""

from __future__ import annotations

import re
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from tik_evo.records import Action, Audit, Decision, Implementation, Opportunity
from tik_evo.store import Store

WORKLOADS = {  # name -> (phase, root median seconds, weight)
    "qwen3-4b.full.T8192": ("full", 210e-6, 1.0),
    "qwen3-4b.full.T1000": ("full", 31e-6, 1.0),
    "qwen3-4b.decode.B64": ("decode", 6.1e-6, 2.0),
    "qwen3-4b.decode.B1": ("decode", 4.4e-6, 2.0),
}
LIMIT = 1.05
ROOT_SOURCE = (ROOT / "kernels" / "rmsnorm" / "root.py").read_text()
CONFIG = """\
campaign: quickstart
family: rmsnorm
search:
  kappa_threshold: 4
  max_evaluations: 40
  wall_time_s: 3600
llm:
  model: fake
  max_usd: 5.0
  max_tokens: 200000
"""


def knob_source(**knobs: int) -> str:
    src = ROOT_SOURCE
    for k, v in knobs.items():
        src = re.sub(rf'"{k}": \d+,', f'"{k}": {v},', src, count=1)
    return src


def stages(ok: bool, fail_check: str = "") -> list[dict]:
    small = [{"name": "decode == full rows (bf16) T37xH320/seed0", "passed": True, "kind": "bitwise", "details": ""},
             {"name": "full vs fp64 T37xH320/seed0", "passed": True, "kind": "reference",
              "details": "max abs err 3.1e-3 <= 7.8e-3"}]
    full = [{"name": "decode == full rows (fp32) T70xH1000/seed1", "passed": ok, "kind": "bitwise",
             "details": "" if ok else "412 of 9000 elements differ; first at row 3 col 17"},
            {"name": "full finite T19xH1536/seed2", "passed": True, "kind": "finite", "details": ""}]
    # The engine's static stage reports structured details (a dict), the others sentences.
    knobs = {"name": "KNOBS dict", "passed": True, "kind": "static",
             "details": {"knobs": {"BLOCK_H": 1024, "NUM_WARPS": 4}, "absent_knobs": []}}
    out = [{"name": "static", "passed": True, "seconds": 0.01, "error": "",
            "checks": [{"name": "allowed imports", "passed": True, "kind": "static", "details": ""}, knobs]},
           {"name": "small", "passed": True, "seconds": 0.4, "checks": small, "error": ""},
           {"name": "full", "passed": ok, "seconds": 1.9, "checks": full, "error": fail_check}]
    if ok:
        out.append({"name": "bench", "passed": True, "seconds": 3.2, "checks": [], "error": ""})
    return out


def measurements(factors: dict[str, float], timer: str) -> dict:
    return {w: {"median_s": t * factors.get(ph, 1.0), "spread": 0.012, "timer": timer, "phase": ph}
            for w, (ph, t, _) in WORKLOADS.items()}


def objective(m: dict) -> float:
    return sum(WORKLOADS[w][2] * v["median_s"] for w, v in m.items())


def add_impl(tx, *, parents, scope, status, operator, src, factors, timer, opp=None, promoted=False,
             fail=None, rationale="", decision=None) -> str:
    iid, aid, uid = tx.new_id("I"), tx.new_id("A"), tx.new_id("U")
    h = tx.put_source(src)
    ok = fail is None
    m = measurements(factors, timer) if ok else {}
    obj = objective(m) if ok else None
    tx.put(Action(aid, opp, parents, scope, operator, rationale=rationale, expected="faster " + scope,
                  offspring=iid, outcome="audited", tokens={"prompt": 1800, "completion": 420},
                  cost_usd=0.0123, started=time.time() - 5, finished=time.time()))
    tx.put(Audit(uid, iid, stages=stages(ok, fail or ""), measurements=m, objective=obj, passed=ok,
                 admissible=ok, promoted=promoted, failure_kind="bitwise" if fail else None,
                 failure=fail or "", timer=timer, seconds=5.5,
                 limits={w: {"limit": LIMIT, "max_s": t * LIMIT} for w, (_, t, _) in WORKLOADS.items()}))
    tx.put(Implementation(iid, h, parents, scope, status, action=aid, audit=uid, objective=obj,
                          knobs={}, created=time.time()))
    st = tx.state
    st["step"] += 1
    st["evaluations"] += 1
    st["budgets"]["tokens"] += 2220
    st["budgets"]["usd"] += 0.0123
    st["budgets"]["wall_s"] += 42.0
    tx.event("audit", f"{uid} {iid} ({operator}, {scope}): " + ("passed" if ok else f"failed: {fail}"))
    best = obj if promoted or st["best_objective"] is None else st["best_objective"]
    st["history"].append({"evaluation": len(st["history"]), "impl": iid, "objective": obj, "best": best,
                          "promoted": promoted, "failed": not ok})
    if fail:
        st["failures_by_kind"]["bitwise"] = st["failures_by_kind"].get("bitwise", 0) + 1
    if promoted:
        st["best"], st["best_objective"], st["kappa"] = iid, obj, 0
        tx.put(Decision(tx.new_id("D"), iid, "promote", "faster than best in the same audit", [uid], st["step"]))
        tx.event("promote", f"{iid} is the new best ({st['root_objective'] / obj:.3f}x over root)")
    elif decision:
        tx.put(Decision(tx.new_id("D"), iid, decision, f"{decision} after audit {uid}", [uid], st["step"]))
        st["kappa"] += 1
    return iid


def build(run_dir: Path, interp: bool = False, finished: bool = False) -> Path:
    timer = "wall-interpreter" if interp else "cuda-event"
    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "config.yaml").write_text(CONFIG)
    store = Store.create(run_dir)
    with store.transaction() as tx:
        st = tx.state
        st["weights"] = {w: wt for w, (_, _, wt) in WORKLOADS.items()}
        st["root_latencies"] = {w: t for w, (_, t, _) in WORKLOADS.items()}
        st["limits"] = {w: {"limit": LIMIT, "max_s": t * LIMIT} for w, (_, t, _) in WORKLOADS.items()}
        st["root_objective"] = objective(measurements({}, timer))
        opps = {}
        for kind, mech, paths in [("knob", "reduction_width", ["full", "decode"]),
                                  ("knob", "decode_schedule", ["decode"]),
                                  ("knob", "full_schedule", ["full"]),
                                  ("rewrite", "vectorised loads", ["full", "decode"])]:
            oid = tx.new_id("O")
            opps[mech] = oid
            tx.put(Opportunity(oid, kind, mech, paths, status="pending", repeatable=kind == "knob",
                               created=time.time()))
        root = add_impl(tx, parents=[], scope="root", status="archived", operator="root", src=ROOT_SOURCE,
                        factors={}, timer=timer, rationale="the family's root implementation")
        st["root"] = st["best"] = root
        st["best_objective"] = st["root_objective"]
        tx.event("init", f"root {root} audited; {len(opps)} opportunities from the family")
    with store.transaction() as tx:
        i1 = add_impl(tx, parents=[root], scope="joint", status="active", operator="knob",
                      src=knob_source(BLOCK_H=1024), factors={"full": 0.82, "decode": 0.97}, timer=timer,
                      opp=opps["reduction_width"], promoted=True,
                      rationale="hidden=2560 fits 3 chunks of 1024: fewer loop trips per row")
    with store.transaction() as tx:
        add_impl(tx, parents=[i1], scope="joint", status="failed", operator="llm-rewrite",
                 src=knob_source(BLOCK_H=1024, NUM_WARPS=8), factors={}, timer=timer, opp=opps["vectorised loads"],
                 fail="decode != full bitwise (fp32)", rationale="vectorise the row loads with tl.reshape")
    with store.transaction() as tx:
        i3 = add_impl(tx, parents=[i1], scope="decode", status="best", operator="knob",
                      src=knob_source(BLOCK_H=1024, DECODE_NUM_STAGES=2), factors={"full": 0.82, "decode": 0.71},
                      timer=timer, opp=opps["decode_schedule"], promoted=True,
                      rationale="pipeline the decode loads: the batch is too small to hide latency")
        tx.state["frontier"] = [i1, i3]
    with store.transaction() as tx:
        i4 = add_impl(tx, parents=[i1], scope="full", status="archived", operator="knob",
                      src=knob_source(BLOCK_H=1024, FULL_ROWS_PER_PROGRAM=4), factors={"full": 0.80, "decode": 1.0},
                      timer=timer, opp=opps["full_schedule"], decision="archive",
                      rationale="4 rows per program amortise the weight load")
        tx.state["archive"] = [i4]
    with store.transaction() as tx:
        add_impl(tx, parents=[root], scope="decode", status="abandoned", operator="knob",
                 src=knob_source(DECODE_ROWS_PER_PROGRAM=4), factors={"full": 1.0, "decode": 1.2}, timer=timer,
                 opp=opps["decode_schedule"], decision="abandon", rationale="fewer programs for tiny batches")
        tx.state["kappa"] = 2
        tx.put(Opportunity(tx.new_id("O"), "rewrite", "merge full schedule of I4 into I3", ["full"],
                           status="consumed", origin="audit:U4",
                           evidence=["U4", "I4"], uses=1, created=time.time()))
        tx.put(Opportunity(tx.new_id("O"), "rewrite", "persistent kernel for decode", ["decode"],
                           status="withdrawn", origin="action:A2", evidence=["A2"], created=time.time()))
        if finished:
            tx.state["finished"] = {"reason": "max_evaluations", "t": time.time()}
            tx.event("finish", "run finished: max_evaluations reached")
    store.close()
    return run_dir


def add(run_dir: Path, n: int) -> list[str]:
    """Append n promoted offspring of the current best, as the live engine would."""
    store = Store.open_writer(Path(run_dir))
    new = []
    for k in range(n):
        with store.transaction() as tx:
            best = tx.state["best"]
            prev = tx.get(best)
            timer = tx.get(prev.audit).timer
            f = 0.6 - 0.05 * k
            tx.put(Implementation(**{**prev.__dict__, "status": "active"}))
            new.append(add_impl(tx, parents=[best], scope="joint", status="best", operator="llm-rewrite",
                                src=knob_source(BLOCK_H=2048, NUM_WARPS=k + 2), factors={"full": f, "decode": f},
                                timer=timer, promoted=True, rationale=f"live offspring {k}"))
    store.close()
    return new


if __name__ == "__main__":
    target = Path(sys.argv[1])
    if "--add" in sys.argv:
        print(" ".join(add(target, int(sys.argv[sys.argv.index("--add") + 1]))))
    else:
        build(target, interp="--interp" in sys.argv, finished="--finished" in sys.argv)
        print(target)
