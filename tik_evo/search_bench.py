"""`tik-evo bench search CAMPAIGN`: how much of the gap to a known good point a campaign closes at a fixed budget.

The reference point is a named set of the family (or a kernel file): it is audited as an offspring of the root
with the root re-timed in the same audit, so its speed-up over the root is one run's ratio. Each arm (the engine
as configured, and baselines: plain TPE and random search over one flat opportunity of every knob) runs as a
campaign from the root per seed, in its own run directory under OUT; an arm's speed-ups are ratios against its
own run's root. Gap closed = (speed-up − 1) / (reference speed-up − 1), on the objective and per workload.

Every step is resumable: a finished run is read, an unfinished one resumed (`tik-evo resume`), a missing one
started, so a long benchmark can be made of several short machine leases (copy OUT between them).
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from tik_evo.store import Store

# The baselines search one opportunity naming every knob, without the engine's extras (one-knob neighbour moves
# of each new best, split bundles), so they measure the sampler alone on the same budget.
BASELINE = ["search.space=flat", "search.neighbours=0", "search.split_bundles=false"]
ARMS: dict[str, list[str]] = {
    "engine": [],
    "tpe": ["search.sampler=tpe", *BASELINE],
    "random": ["search.sampler=random", *BASELINE],
    # the engine with one proposal option on, then all of them: each option is kept only if it measures better
    "stones": ["search.stepping_stones=true"],
    "constraints": ["search.constraints=true"],
    "multivariate": ["search.multivariate=true"],
    "valleys": ["search.stepping_stones=true", "search.constraints=true", "search.multivariate=true"],
}
DEFAULT_ARMS = ("engine", "tpe", "random")


def _cli(args: list[str], log) -> int:
    """One `tik-evo` command in a child process: a crash or a hang of a run must not take the benchmark down."""
    cmd = [sys.executable, "-m", "tik_evo.cli", *args]
    log("$ tik-evo " + " ".join(args))
    return subprocess.run(cmd).returncode


def reference(campaign: str, out: Path, set_name: str, file: str | None, overrides: list[str], log=print
              ) -> dict[str, Any]:
    """The reference point's verdict (cached in OUT/reference.json): a named set (or a file) audited against the
    root, both timed in one audit."""
    path = out / "reference.json"
    if path.exists():
        return json.loads(path.read_text())
    if file is None:
        from tik_evo.config import load_campaign
        from tik_evo.families import load_family
        from tik_evo.knobs import read_knobs, write_knobs

        family = load_family(load_campaign(campaign, overrides).kernel)
        sets = family.named_sets()
        if set_name not in sets:
            raise ValueError(f"--reference {set_name!r}: family {family.name!r} has no such named set "
                             f"(sets: {', '.join(sets) or 'none'})")
        root = family.root_source()
        src = write_knobs(root, {**read_knobs(root), **sets[set_name]})
        tmp = Path(tempfile.mkdtemp(prefix="tik_evo_ref_"))
        file = str(tmp / f"{set_name}.py")
        Path(file).write_text(src)
    out.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, "-m", "tik_evo.cli", "audit", campaign, file, "--json", *overrides]
    log("$ tik-evo audit " + " ".join([campaign, file, "--json", *overrides]))
    r = subprocess.run(cmd, capture_output=True, text=True)
    try:
        verdict = json.loads(r.stdout[r.stdout.index("{"):])
    except ValueError:
        raise RuntimeError(f"the reference audit gave no verdict (exit {r.returncode}): {r.stderr[-2000:]}") from None
    if not verdict.get("verified"):
        raise RuntimeError(f"the reference {set_name or file} failed its audit ({verdict.get('failure_kind')}): "
                           f"{verdict.get('message', '')[:1500]}")
    verdict["name"] = set_name or Path(file).name
    path.write_text(json.dumps(verdict, indent=1))
    return verdict


def run_arm(campaign: str, out: Path, arm: str, seed: int, overrides: list[str], log=print) -> Path:
    """The arm's run for ``seed``: started, resumed or left as finished. Returns its run directory."""
    run_dir = out / "runs" / f"{arm}-s{seed}"
    budget = [o for o in overrides if o.split("=", 1)[0] in ("search.max_evaluations", "search.wall_time_s")]
    if (run_dir / "ir.lmdb").exists():
        with Store.open_reader(run_dir) as store:
            if store.state().get("finished"):
                return run_dir
        rc = _cli(["resume", str(run_dir), "--quiet", *budget], log)
    else:
        rc = _cli(["run", campaign, f"store.path={run_dir}", f"search.seed={seed}", *ARMS[arm], *overrides,
                   "--quiet"], log)
    if rc:  # reported and left out of the summary while it has no verified root; the other runs go on
        log(f"warning: {arm} seed {seed} exited with {rc}; see {run_dir}")
    return run_dir


def curve(run_dir: Path) -> dict[str, Any]:
    """Best speed-up so far against audited offspring and against cumulative audit seconds, and the final best's
    speed-up per workload (each a ratio against this run's root)."""
    with Store.open_reader(run_dir) as store:
        snap = store.snapshot()
    st = snap["state"]
    impls = {i.id: i for i in snap["I"]}
    audit_s = {a.id: a.seconds for a in snap["U"]}
    root_t = st["root_objective"]
    points, spent = [], 0.0
    for h in st["history"]:
        impl = impls.get(h.get("impl"))
        spent += audit_s.get(impl.audit, 0.0) if impl and impl.audit else 0.0
        points.append({"audits": h["evaluation"], "audit_s": round(spent, 2), "speedup": root_t / h["best"]})
    best = impls[st["best"]]
    best_audit = next(a for a in snap["U"] if a.id == best.audit)
    per_workload = {n: st["root_latencies"][n] / m["median_s"] for n, m in best_audit.measurements.items()}
    return {"run": str(run_dir), "points": points, "speedup": root_t / st["best_objective"],
            "per_workload": per_workload, "best_knobs": best.knobs, "evaluations": st["evaluations"],
            "finished": (st.get("finished") or {}).get("reason"), "device": best_audit.device.get("gpu", "cpu")}


def gap_closed(speedup: float, reference: float) -> float | None:
    """(speed-up − 1) / (reference − 1); None when the reference is no faster than the root (no gap to close)."""
    return (speedup - 1.0) / (reference - 1.0) if reference > 1.0 else None


def summarise(out: Path, arms: list[str], seeds: list[int]) -> dict[str, Any]:
    ref = json.loads((out / "reference.json").read_text())
    ref_speedup = ref["best_objective_retimed"] / ref["objective"]
    ref_root = {n: t for n, t in (ref.get("root_measurements") or {}).items()}
    ref_workloads = ({n: ref_root[n] / t for n, t in ref["measurements"].items() if n in ref_root}
                     if ref_root else {})
    result: dict[str, Any] = {"reference": {"name": ref["name"], "speedup": ref_speedup, "device": ref["device"],
                                            "per_workload": ref_workloads}, "arms": {}}
    for arm in arms:
        runs = []
        for seed in seeds:
            run_dir = out / "runs" / f"{arm}-s{seed}"
            if not (run_dir / "ir.lmdb").exists():
                continue
            with Store.open_reader(run_dir) as store:
                if store.state().best is None:  # its root never verified: nothing to compare
                    continue
            c = curve(run_dir)
            c["seed"] = seed
            c["gap_closed"] = gap_closed(c["speedup"], ref_speedup)
            c["gap_closed_per_workload"] = {n: gap_closed(s, ref_workloads[n]) for n, s in c["per_workload"].items()
                                            if n in ref_workloads}
            runs.append(c)
        closed = [r["gap_closed"] for r in runs if r["gap_closed"] is not None]
        result["arms"][arm] = {"runs": runs, "median_speedup": statistics.median(r["speedup"] for r in runs)
                               if runs else None, "median_gap_closed": statistics.median(closed) if closed else None}
    return result


def markdown(s: dict[str, Any]) -> str:
    ref = s["reference"]
    lines = [f"# Search benchmark: gap closed to `{ref['name']}` ({ref['device']})", "",
             f"Reference speed-up over the root (one audit, both timed): **{ref['speedup']:.3f}×**.", "",
             "| arm | seed | audits | speed-up | gap closed | finished |", "|---|---|---|---|---|---|"]
    for arm, a in s["arms"].items():
        for r in a["runs"]:
            g = "—" if r["gap_closed"] is None else f"{r['gap_closed']:.0%}"
            lines.append(f"| {arm} | {r['seed']} | {r['evaluations']} | {r['speedup']:.3f}× | {g} | {r['finished']} |")
    lines += ["", "| arm | median speed-up | median gap closed |", "|---|---|---|"]
    for arm, a in s["arms"].items():
        sp = "—" if a["median_speedup"] is None else f"{a['median_speedup']:.3f}×"
        g = "—" if a["median_gap_closed"] is None else f"{a['median_gap_closed']:.0%}"
        lines.append(f"| {arm} | {sp} | {g} |")
    return "\n".join(lines) + "\n"


def plot(s: dict[str, Any], path: Path) -> None:
    """Best-so-far gap closed against audits (left) and audit seconds (right), one line per run."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ref = s["reference"]["speedup"]
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2), sharey=True)
    colours = dict(zip(s["arms"], ["tab:green", "tab:blue", "tab:grey", "tab:orange", "tab:red"]))
    for arm, a in s["arms"].items():
        for i, r in enumerate(a["runs"]):
            ys = [gap_closed(p["speedup"], ref) or 0.0 for p in r["points"]]
            for ax, key in zip(axes, ("audits", "audit_s")):
                ax.step([p[key] for p in r["points"]], ys, where="post", color=colours.get(arm), alpha=0.8,
                        label=arm if i == 0 else None)
    for ax, label in zip(axes, ("audited offspring", "audit seconds (cumulative)")):
        ax.axhline(1.0, color="black", linewidth=0.8, linestyle=":")
        ax.set_xlabel(label)
    axes[0].set_ylabel(f"gap closed to {s['reference']['name']}")
    axes[0].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(campaign: str, out: Path, reference_set: str, reference_file: str | None, arms: list[str],
         seeds: list[int], overrides: list[str], log=print) -> dict[str, Any]:
    unknown = [a for a in arms if a not in ARMS]
    if unknown:
        raise ValueError(f"--arms: unknown {unknown}; arms are {', '.join(ARMS)}")
    out.mkdir(parents=True, exist_ok=True)
    reference(campaign, out, reference_set, reference_file, overrides, log)
    for seed in seeds:  # seeds outermost: a lease that ends early leaves every arm with the same seeds done
        for arm in arms:
            run_arm(campaign, out, arm, seed, overrides, log)
    s = summarise(out, arms, seeds)
    (out / "search.json").write_text(json.dumps(s, indent=1))
    (out / "search.md").write_text(markdown(s))
    plot(s, out / "search.png")
    log(markdown(s))
    return s


def cli(argv: list[str]) -> int:
    """`tik-evo bench search CAMPAIGN --reference SET [--arms ...] [--seeds ...] [--out DIR] [overrides]`."""
    import argparse

    p = argparse.ArgumentParser(prog="tik-evo bench search", description=__doc__.split("\n\n")[0])
    p.add_argument("campaign")
    p.add_argument("overrides", nargs="*", help="dotted overrides for every run, e.g. search.max_evaluations=40")
    p.add_argument("--reference", default=None, help="the named knob set of the family to close the gap to")
    p.add_argument("--reference-file", default=None, help="a kernel file to close the gap to instead")
    p.add_argument("--arms", default=",".join(DEFAULT_ARMS), help=f"comma-separated, of {', '.join(ARMS)}")
    p.add_argument("--seeds", default="0", help="comma-separated search seeds, e.g. 0,1,2")
    p.add_argument("--out", default="runs/search-bench", help="where the reference, runs and summary go")
    a = p.parse_intermixed_args(argv)  # overrides may come before or after the options
    if (a.reference is None) == (a.reference_file is None):
        p.error("give one of --reference SET or --reference-file FILE")
    try:
        seeds = [int(x) for x in a.seeds.split(",") if x]
    except ValueError:
        p.error(f"--seeds {a.seeds!r}: comma-separated integers")
    if a.reference_file and not Path(a.reference_file).is_file():
        p.error(f"--reference-file {a.reference_file}: no such file")
    try:
        main(a.campaign, Path(a.out), a.reference, a.reference_file, [x for x in a.arms.split(",") if x], seeds,
             a.overrides)
    except (ValueError, RuntimeError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0
