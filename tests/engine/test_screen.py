"""The screen (evaluate.screen): an offspring timed right after its small checks, its audit stopped there when it
cannot become the best; the others audited in full, exactly as without a screen."""

from tik_evo import screen
from tik_evo.audit import AuditJob, run_audit
from tik_evo.families import load_family
from tik_evo.store import source_hash

FAMILY = load_family("rmsnorm")
ROOT_SRC = FAMILY.root_source()
WORKLOADS = [{"name": "full", "phase": "full", "tokens": 4, "hidden": 256},
             {"name": "decode", "phase": "decode", "batch": 2, "hidden": 256}]
ROOT_S = {"full": 1.0, "decode": 1.0}


def ref(best_objective: float, limits=None) -> dict:
    limits = limits or {"full": {"limit": 1e9}, "decode": {"limit": 1e9}}
    return screen.spec({"full": 0.5, "decode": 0.5}, ROOT_S, limits, True, best_objective, 0.05)


def test_decide_screens_what_cannot_be_the_best_and_passes_the_rest():
    m = {"full": {"median_s": 1.0}, "decode": {"median_s": 2.0}}  # normalised objective 1.5
    assert screen.decide(m, ref(1.5))[0] and screen.decide(m, ref(1.43))[0]  # within the 5% margin
    ok, why = screen.decide(m, ref(1.4))
    assert not ok and "above the best's" in why
    ok, why = screen.decide(m, ref(100.0, {"full": {"limit": 1.0}, "decode": {"limit": 1.5}}))
    assert not ok and "decode is 33.3% over its slowdown limit" in why
    assert screen.decide({"full": {"median_s": 1.0}}, ref(0.1))[0]  # a workload not measured: no screen
    # with stepping stones kept, over a limit but better on the objective goes on to be verified
    stones = {**ref(2.0, {"full": {"limit": 1.0}, "decode": {"limit": 1.5}}), "stones": True}
    ok, why = screen.decide(m, stones)
    assert ok and "stepping stone" in why
    assert not screen.decide(m, {**stones, "best_objective": 1.0})[0]


def audit(tmp_path, best_objective: float):
    job = AuditJob(FAMILY, ROOT_SRC, source_hash(ROOT_SRC), "I1", WORKLOADS, [0],
                   {"timeout_s": 120, "interpreter_reps": 1, "check_procs": 2, "graph_replay": "off"}, "cpu",
                   time=True, screen=ref(best_objective))
    return run_audit(tmp_path, job)


def test_an_offspring_slower_than_the_best_stops_at_the_screen_and_a_faster_one_is_audited_in_full(tmp_path):
    # Root times on the CPU are wall-clock seconds of the interpreter; against a root time of 1 s per workload the
    # normalised objective is tiny, so a best of 1e-9 screens the root out and a best of 1e9 lets it through.
    out = audit(tmp_path / "slow", 1e-9)
    assert not out.passed and out.failure_kind == screen.SCREENED, out.failure
    names = [s["name"] for s in out.stages]
    assert names[:4] == ["static", "import", "small", "screen"] and "full" not in names, names
    assert "above the best's" in out.failure and set(out.measurements) == {"full", "decode"}
    out = audit(tmp_path / "fast", 1e9)
    assert out.passed, out.failure
    names = [s["name"] for s in out.stages]
    assert names == ["static", "import", "small", "screen", "full", "repeat", "timing"], names
    assert out.device["check_procs"] == 2  # the gated shards ran the full stage once released
