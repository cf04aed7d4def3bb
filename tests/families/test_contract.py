"""Every family's declared entry points (what the judge calls in another process, through shared buffers) against
its root and its own harness code, and its drawn check cases (new shapes for every audit) against its root."""

from __future__ import annotations

import ast
import inspect
import json
import random

import _family as R
import pytest

from tik_evo.candidate import load_module
from tik_evo.families import available, load_family

R.setup()
FAMILIES = available()


def _root(family):
    return load_module(family.root_path, f"_contract_root_{family.name}")


def _harness_calls(family) -> tuple[set[str], set[str]]:
    """(names the family's harness takes from a candidate module, the names it guards with hasattr): every
    `impl.<name>` in family.py, and every constant-string `hasattr(impl, ...)` / `getattr(impl, ...)`."""
    tree = ast.parse((family.folder / "family.py").read_text())
    used, guarded = set(), set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "impl":
            used.add(node.attr)
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in ("hasattr", "getattr")
              and len(node.args) >= 2 and isinstance(node.args[0], ast.Name) and node.args[0].id == "impl"
              and isinstance(node.args[1], ast.Constant) and isinstance(node.args[1].value, str)):
            used.add(node.args[1].value)
            if node.func.id == "hasattr":
                guarded.add(node.args[1].value)
    return used - {"KNOBS"}, guarded


@pytest.mark.parametrize("name", FAMILIES)
def test_signatures_match_the_root_and_cover_every_call(name):
    family = load_family(name)
    sigs = {s.name: s for s in family.signatures}
    assert len(sigs) == len(family.signatures), "an entry point is declared twice"
    # The static scan requires entry_points: they and only they are required.
    assert {n for n, s in sigs.items() if s.required} == set(family.entry_points)
    root = _root(family)
    for sig in family.signatures:
        fn = getattr(root, sig.name, None)
        assert inspect.isfunction(fn), f"the root has no function {sig.name}"
        params = inspect.signature(fn).parameters
        assert sig.params == tuple(params), (sig.name, sig.params, tuple(params))
        assert set(sig.writes) <= set(sig.params) and set(sig.optional) <= set(sig.writes), sig.name
        for p in sig.optional:  # left out (None) by production calls: the root must accept that
            assert params[p].default is None, (sig.name, p)
        ret = inspect.signature(fn).return_annotation
        assert sig.returns == (ret not in (None, "None", inspect.Signature.empty)), (sig.name, ret)
    used, guarded = _harness_calls(family)
    assert used, "the harness calls no entry point?"
    assert used <= set(sigs), f"called but not declared: {sorted(used - set(sigs))}"
    # A function the harness only calls where present is one a file may lack (unless the static scan requires it).
    assert all(not sigs[n].required for n in guarded - set(family.entry_points)), guarded


@pytest.mark.parametrize("interpreting", [True, False], ids=["cpu", "gpu"])
@pytest.mark.parametrize("name", FAMILIES)
def test_drawn_cases_are_fresh_plain_data_in_the_fixed_cases_form(name, interpreting, monkeypatch):
    """Drawn from the judge's rng alone (the same seed, the same cases; other seeds, other cases), plain data a
    process boundary keeps, with every key all fixed cases have. The GPU draws are checked for form only here."""
    from tik_evo import interp

    monkeypatch.setattr(interp, "interpreting", lambda: interpreting)
    family = load_family(name)
    fixed = family.check_cases("full")
    common = set.intersection(*(set(c) for c in fixed))
    draws = [family.drawn_cases(random.Random(s)) for s in range(8)]
    assert family.drawn_cases(random.Random(3)) == draws[3]
    assert len({json.dumps(d, sort_keys=True) for d in draws}) > 1
    for cases in draws:
        assert 1 <= len(cases) <= 3
        for case in cases:
            assert json.loads(json.dumps(case)) == case
            assert common <= set(case), sorted(common - set(case))
            rows = case.get("tokens", sum(case.get("lengths", ())))
            assert all(0 <= i < rows for i in [*case.get("zero_rows", ()), *case.get("pad_rows", ())]), case
            if "q_heads" in case:
                assert case["q_heads"] % case["kv_heads"] == 0 and case["head_dim"] in (64, 128), case


# Draws per family run under the interpreter (a few seconds a case for attention, linear and rope, far less for
# the others).
SEEDS = {"attention": (0, 1), "linear": (0, 1), "rope": (0, 1)}


@pytest.mark.parametrize("name", FAMILIES)
def test_root_passes_its_drawn_cases(name):
    family = load_family(name)
    root = _root(family)
    bad = []
    for s in SEEDS.get(name, (0, 1, 2)):
        for case in family.drawn_cases(random.Random(s)):
            bad += [(s, case, c.name, c.details) for c in family.run_checks(root, case, 0, "cpu") if not c.passed]
    assert bad == []


@pytest.mark.parametrize("name", FAMILIES)
def test_the_graph_stage_replays_what_the_family_declares_forward(name):
    """The declaration, not the names, says which entry points the graph stage replays: every forward one the
    root defines, no backward one (a gradient need not be bit-exact between paths)."""
    from tik_evo.graph_replay import replayed_names

    family = load_family(name)
    replayed = replayed_names(_root(family), family.signatures)
    assert set(family.entry_points) - {s.name for s in family.signatures if s.backward} <= set(replayed)
    assert not {s.name for s in family.signatures if s.backward} & set(replayed)
    # A gradient is declared as one: no undeclared backward hides among the forward entry points.
    assert all(s.backward == ("backward" in s.name) for s in family.signatures), name
