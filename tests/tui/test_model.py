"""The numbers every pane shows, from RunView alone (no Textual)."""

from __future__ import annotations

import pytest

from tik_evo.records import Audit, Implementation
from tik_evo.run_state import RunState
from tui.model import RunConfig, RunView, path_of
from tui.source import RunSource, change_key


def test_phases_group_into_full_and_decode():
    assert [path_of(p) for p in ("full", "prefill", "train_forward", "decode")] == ["full", "full", "full", "decode"]


def _view(factor: float) -> RunView:
    """Root I0 and child I1 with three workloads of a family whose phases are prefill/train_forward/decode."""
    state = RunState(root="I0")
    audits, impls = [], []
    for n, f in enumerate((1.0, factor)):
        m = {"a.prefill": {"median_s": 2e-3 * f, "phase": "prefill"},
             "a.train": {"median_s": 2e-3 * f, "phase": "train_forward"},
             "a.decode": {"median_s": 1e-5, "phase": "decode"}}
        audits.append(Audit(f"U{n}", f"I{n}", measurements=m, promoted=True))
        impls.append(Implementation(f"I{n}", f"h{n}", ["I0"] if n else [], "full" if n else "root",
                                    "best" if n else "archived", audit=f"U{n}"))
    return RunView({"state": state, "I": impls, "O": [], "A": [], "U": audits, "D": []})


def test_path_speedups_from_measurements_when_objective_missing():
    view = _view(0.5)
    paths = view.path_speedups("I1")
    assert paths["full"] == pytest.approx(2.0)
    assert paths["decode"] == pytest.approx(1.0)
    assert view.speedup("I1") == pytest.approx((4e-3 + 1e-5) / (2e-3 + 1e-5))
    assert [p for _, p in view.history()] == [False, True]


def test_fixture_run_numbers(gpu_run):
    source = RunSource(gpu_run)
    try:
        view = source.poll()
        assert [i.id for i in view.frontier()] == ["I3", "I4", "I1", "I0"]
        assert view.speedup("I0") == pytest.approx(1.0)
        assert view.path_speedups("I3")["decode"] == pytest.approx(1 / 0.71)
        rows = {r.name: r for r in view.workload_rows("I3")}
        assert rows["qwen3-4b.decode.B64"].of_limit == pytest.approx(0.71 / 1.05)
        assert rows["qwen3-4b.decode.B64"].vs_parent == pytest.approx(0.97 / 0.71)
        assert view.impl_for_ref("audit:U4") == "I4" and view.impl_for_ref("A2") == "I2"
        assert "-    \"DECODE_NUM_STAGES\": 1," in view.diff("I3", source.source)
        assert source.poll() is None, "an unchanged store must not be reloaded"
        assert view.config.kappa_threshold == 4 and view.config.max_usd == 5.0
    finally:
        source.close()


def test_change_key_moves_with_events():
    st = RunState()
    before = change_key(st)
    st["events"] = 3
    assert change_key(st) != before


def test_missing_config_gives_empty_limits(tmp_path):
    assert RunConfig.load(tmp_path).kappa_threshold is None


def test_status_counts_audits_per_gpu_when_they_ran_on_several(tmp_path):
    import io

    import fixture_store
    from rich.console import Console

    from tik_evo.report import status
    from tik_evo.store import Store

    run = fixture_store.build(tmp_path / "run")
    with Store.open_writer(run) as s, s.transaction() as txn:
        for n, audit in enumerate(s.all("U")):
            audit.device = {**audit.device, "gpu_index": n % 2}
            txn.put(audit)

    console = Console(file=io.StringIO(), width=120)
    with Store.open_reader(run) as s:
        n = len(s.all("U"))
        console.print(status(s))
    out = console.file.getvalue()
    assert "audits per GPU" in out and f"GPU 0: {(n + 1) // 2}, GPU 1: {n // 2}" in out, out


def test_vs_root_uses_the_root_as_timed_on_the_audits_gpu():
    # Concurrent audits: I1 ran on GPU 1, where the root timed 10% slower than at initialization. Its "vs root"
    # divides by GPU 1's root time; without per-GPU timings, the initialization's.
    view = _view(0.5)
    view.state["root_latencies"] = {"a.prefill": 2e-3, "a.train": 2e-3, "a.decode": 1e-5}
    assert {r.name: r.vs_root for r in view.workload_rows("I1")}["a.prefill"] == pytest.approx(2.0)
    view.audits["U1"].device = {"gpu_index": 1}
    view.state["root_latencies_by_gpu"] = {"1": {"a.prefill": 2.2e-3, "a.train": 2.2e-3, "a.decode": 1.1e-5},
                                           "0": {"a.prefill": 2e-3, "a.train": 2e-3, "a.decode": 1e-5}}
    assert {r.name: r.vs_root for r in view.workload_rows("I1")}["a.prefill"] == pytest.approx(2.2)
    assert view.path_speedups("I1")["full"] == pytest.approx(2.2)


def test_a_store_that_keeps_refusing_is_reported_not_waited_on_forever(tmp_path):
    # A run being made refuses a reader for a moment (no tables yet); a directory that never becomes a store, or a
    # damaged one, is reported after a few polls (the app shows the message) instead of a silent "waiting".
    from tik_evo.store import StoreError
    from tui import source as src

    (tmp_path / "ir.lmdb").mkdir()
    s = RunSource(tmp_path)
    for _ in range(src.PATIENCE - 1):
        assert s.poll() is None
    with pytest.raises(StoreError):
        s.poll()
