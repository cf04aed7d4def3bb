"""The run state: typed, stored as the dict of its fields, and a state record in the older dict form still loads."""

import json

import pytest

from tik_evo.run_state import RunState
from tik_evo.store import Store
from tik_evo.store_integrity import seal, unseal

# A state record as the engine wrote it before the state was typed: the keys it started with, those a run added,
# none of the ones it added only on demand (moves, parent_streak, duplicates_in_a_row, root_latencies_by_gpu), and
# one no version names.
OLD = {
    "schema": 2, "root": "I0", "best": "I2", "frontier": ["I2", "I0"], "archive": ["I1"],
    "pending_opportunities": ["O0", "O1"], "kappa": 1, "step": 3, "evaluations": 2, "duplicates": 1,
    "failures_by_kind": {"over-limit": 1}, "budgets": {"wall_s": 12.5, "tokens": 0, "usd": 0.0},
    "counters": {"I": 3, "O": 2, "A": 3, "U": 3, "D": 3}, "finished": {"reason": "κ reached 1", "at": 1.0e9},
    "root_latencies": {"w": 2e-3}, "limits": {"w": {"limit": 1.05, "max_s": 2.1e-3}}, "weights": {"w": 1.0},
    "best_objective": 1.5e-3, "root_objective": 2e-3, "sources": {"h0": "I0", "h1": "I1", "h2": "I2"},
    "engine_overhead_s": [0.01], "history": [{"evaluation": 0, "impl": "I0", "objective": 2e-3, "best": 2e-3,
                                             "promoted": True}],
    "workloads": [{"name": "w", "phase": "full", "weight": 1.0, "limit": 1.05}], "device": "cpu",
    "device_facts": {"actual_gpu": None}, "family": "rmsnorm", "started_at": 1.0e9,
    "start": {"set": None, "knobs": {}}, "events": 7, "a_key_from_elsewhere": {"kept": True},
}


def _write_raw_state(run_dir, state: dict) -> None:
    with Store.open_writer(run_dir) as s, s._env.begin(write=True) as t:
        t.put(b"state", seal(json.dumps(state).encode()), db=s._dbs["state"])


def _raw_state(run_dir) -> dict:
    with Store.open_reader(run_dir) as s, s._env.begin() as t:
        return json.loads(unseal(bytes(t.get(b"state", db=s._dbs["state"])), True))


def test_a_state_record_in_the_old_dict_form_loads(tmp_path):
    Store.create(tmp_path).close()
    _write_raw_state(tmp_path, OLD)
    with Store.open_reader(tmp_path) as s:
        st = s.state()
    assert isinstance(st, RunState)
    assert (st.best, st.frontier, st.kappa, st.evaluations, st.family) == ("I2", ["I2", "I0"], 1, 2, "rmsnorm")
    assert st.budgets["wall_s"] == 12.5 and st.limits["w"]["limit"] == 1.05 and st.finished["reason"] == "κ reached 1"
    # Keys the old record lacks take their defaults...
    assert (st.moves, st.parent_streak, st.duplicates_in_a_row, st.root_latencies_by_gpu) == (None, {}, 0, {})
    # ... and dict-style reads still answer as the old dict did.
    assert st["best"] == "I2" and st.get("moves") is None and st["a_key_from_elsewhere"] == {"kept": True}


def test_a_resumed_run_writes_every_key_back(tmp_path):
    Store.create(tmp_path).close()
    _write_raw_state(tmp_path, OLD)
    with Store.open_writer(tmp_path) as s, s.transaction() as txn:
        txn.state.finished = None
        txn.event("resume", "resumed")
    raw = _raw_state(tmp_path)
    assert {k: v for k, v in raw.items() if k not in ("finished", "events")} == \
        {k: v for k, v in {**RunState().to_dict(), **OLD}.items() if k not in ("finished", "events")}
    assert raw["finished"] is None and raw["events"] == 8  # the event took the next number
    assert RunState.from_dict(raw).to_dict() == raw


def test_dict_style_writes_take_only_its_fields():
    st = RunState()
    st["kappa"] = 3
    assert st.kappa == 3
    with pytest.raises(KeyError):
        st["kapa"] = 3
