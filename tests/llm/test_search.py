"""LLM actions through the search loop and the audit (each audit takes tens of seconds under the interpreter,
so only two here), plus merge-later decisions and merge actions (no audit)."""

from __future__ import annotations

from conftest import answer
from optuna.trial import FixedTrial

from tik_evo import lineage
from tik_evo.families import load_family
from tik_evo.operators.base import ActionContext
from tik_evo.operators.llm import LLMOperator
from tik_evo.records import VERIFIED, Audit, Implementation

STAGES = ('    "DECODE_NUM_STAGES": 1,', '    "DECODE_NUM_STAGES": 2,')
FULL_STAGES = ('    "FULL_NUM_STAGES": 1,', '    "FULL_NUM_STAGES": 2,')
# Decode reduces rows in 128-wide chunks while full keeps 256: a different row-sum order, so different bits.
SPLIT_BLOCK_H = [
    ("def _launch(x, weight, eps, out, out32, rows_per_program, num_stages):",
     "def _launch(x, weight, eps, out, out32, rows_per_program, num_stages, block_h=None):"),
    ('ROWS_PER_PROGRAM=rows_per_program, BLOCK_H=block, WRITE32=out32 is not None,',
     'ROWS_PER_PROGRAM=rows_per_program, BLOCK_H=block_h or block, WRITE32=out32 is not None,'),
    ('KNOBS["DECODE_ROWS_PER_PROGRAM"], KNOBS["DECODE_NUM_STAGES"])',
     'KNOBS["DECODE_ROWS_PER_PROGRAM"], KNOBS["DECODE_NUM_STAGES"], block_h=128)'),
]


def test_good_edit_becomes_verified_offspring_with_follow_up(run_copy, server):
    search, store, _ = run_copy(server)
    follow = [{"kind": "decode_rows", "mechanism": "two rows per decode program", "paths": ["decode"]}]
    server.push({"content": answer(STAGES, scope="decode", rationale="deeper decode pipeline", follow_ups=follow)})
    search.step(store.state())
    a = store.get("A0")
    assert a.outcome == "audited" and a.offspring == "I1" and a.operator == "llm", a.error
    child, audit = store.get("I1"), store.get(store.get("I1").audit)
    assert audit.passed and child.status in VERIFIED and child.scope == "decode" and child.parents == ["I0"]
    assert child.knobs["DECODE_NUM_STAGES"] == 2
    opp = [o for o in store.all("O") if o.origin == f"audit:{audit.id}"]
    assert [(o.kind, o.paths, o.status) for o in opp] == [("decode_rows", ["decode"], "pending")]
    assert opp[0].id in store.state()["pending_opportunities"]


def test_contract_breaking_edit_is_caught_by_the_audit(run_copy, server):
    search, store, _ = run_copy(server)
    server.push({"content": answer(*SPLIT_BLOCK_H, scope="decode", rationale="narrower decode chunks")})
    search.step(store.state())
    child = store.get("I1")
    audit = store.get(child.audit)
    assert not audit.passed and audit.failure_kind == "consistency", audit.failure
    assert child.status == "failed" and store.state()["frontier"] == ["I0"]
    assert any(d.decision == "abandon" and d.impl == "I1" for d in store.all("D"))


def test_knobs_laid_out_anew_repeat_the_parent_without_an_audit(run_copy, server):
    search, store, _ = run_copy(server)
    relaid = ('    "DECODE_NUM_STAGES": 1,', "    'DECODE_NUM_STAGES':   1,  # unchanged")
    server.push({"content": answer(relaid, scope="decode", rationale="same knobs, new layout")})
    search.step(store.state())
    a = store.get("A0")
    assert (a.outcome, a.offspring) == ("duplicate", "I0"), (a.outcome, a.error)
    assert store.state()["counters"]["I"] == 1 and not store.all("U")[1:]


def _add_verified_child(store, cfg, faster: float, change=STAGES, promoted=False) -> None:
    """An audited, verified, non-promoted offspring of I0 (records only), decided by lineage.apply."""
    st = store.state()
    root_audit = store.get(store.get("I0").audit)
    meas = {n: {**m, "median_s": m["median_s"] * faster} for n, m in root_audit.measurements.items()}
    src = store.source(store.get("I0").source_hash).replace(*change)
    with store.transaction() as txn:
        iid, uid = txn.new_id("I"), txn.new_id("U")
        h = txn.put_source(src)
        verdict = lineage.judge(True, meas, {}, st, cfg)
        verdict.promoted = promoted
        txn.put(Implementation(iid, h, ["I0"], "decode", "pending", None, uid, None, verdict.objective))
        txn.put(Audit(uid, iid, [], meas, passed=True, admissible=True, objective=verdict.objective))
        lineage.apply(txn, iid, "I0", verdict, uid, cfg, False, "")


def test_merge_later_decision_and_merge_action(run_copy, server):
    _, store, cfg = run_copy(server)
    _add_verified_child(store, cfg, faster=0.8)
    later = [d for d in store.all("D") if d.decision == "merge-later"]
    assert [d.impl for d in later] == ["I1"] and "decode.B3xH1024" in later[0].reason
    # Another child becomes the best; a merge action on it takes I1 as its second parent.
    _add_verified_child(store, cfg, faster=0.5, change=FULL_STAGES, promoted=True)
    assert store.state()["best"] == "I2"
    parent = store.get("I2")
    ctx = ActionContext(load_family("rmsnorm"), parent, store.source(parent.source_hash), store.get("O0"), cfg,
                        store, FixedTrial({"llm.model_u": 0.1, "llm.scope": "joint", "llm.action": "merge"}))
    server.push({"content": answer(STAGES, scope="decode", rationale="port I1's decode pipelining")})
    prop = LLMOperator().propose(ctx)
    assert '"FULL_NUM_STAGES": 2,' in prop.source and '"DECODE_NUM_STAGES": 2,' in prop.source
    assert prop.parents == ["I1"] and prop.params["llm.action"] == "merge" and prop.error == ""
    prompt = server.requests[0]["messages"][1]["content"]
    assert "merge I1 into I2" in prompt and "(the current best)" in prompt and '+    "DECODE_NUM_STAGES": 2,' in prompt


def test_no_merge_later_without_lineage_management_or_gain(run_copy, server):
    _, store, cfg = run_copy(server)
    _add_verified_child(store, cfg, faster=1.2)  # slower everywhere: nothing worth merging
    from omegaconf import OmegaConf

    off = OmegaConf.merge(cfg, OmegaConf.from_dotlist(["ablation.lineage_management=false"]))
    _add_verified_child(store, off, faster=0.8)  # faster, but lineage management is off
    assert not [d for d in store.all("D") if d.decision == "merge-later"]
