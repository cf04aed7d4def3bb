import pytest

from tik_evo.knobs import KnobsError, read_knobs, write_knobs
from tik_evo.operators.knob import scope_of

SRC = '''import triton

KNOBS = {"A": 1, "B": "x"}


def f():
    return KNOBS["A"]
'''


def test_roundtrip_changes_only_the_dict():
    new = write_knobs(SRC, {"A": 2, "B": "x"})
    assert read_knobs(new) == {"A": 2, "B": "x"}
    old_lines = [line for line in SRC.splitlines() if "KNOBS =" not in line and '"A"' not in line]
    for line in old_lines:
        assert line in new.splitlines()
    assert new.count("def f") == 1


@pytest.mark.parametrize("src,msg", [("x = 1\n", "no module-level"), ("KNOBS = dict(a=1)\n", "dict literal"),
                                     ("KNOBS = {'a': f()}\n", "literals only"), ("KNOBS = {\n", "does not parse")])
def test_bad_knobs_named(src, msg):
    with pytest.raises(KnobsError, match=msg):
        read_knobs(src)


def test_scope_follows_roles():
    assert scope_of({"contract"}) == "joint"
    assert scope_of({"contract", "decode"}) == "joint"
    assert scope_of({"full"}) == "full"
    assert scope_of({"decode"}) == "decode"
    assert scope_of({"full", "decode"}) == "joint"


def test_variant_knobs_outside_the_space_are_named():
    from tik_evo_kernels.linear import FAMILY

    FAMILY.check_knobs({"FULL_PERSISTENT": "long_k", "DECODE_BLOCK_N": 0}, "ok")
    with pytest.raises(ValueError, match=r"variant 'p1': FULL_PERSISTENT=1 is not one of \['off', 'long_k', 'all'\]"):
        FAMILY.check_knobs({"FULL_PERSISTENT": 1}, "variant 'p1'")
    with pytest.raises(ValueError, match="variant 'x': family 'linear' has no knob 'NO_SUCH'"):
        FAMILY.check_knobs({"NO_SUCH": 1}, "variant 'x'")


def test_canonical_source_gives_one_text_for_one_knob_set():
    from tik_evo.knobs import canonical_source

    other = SRC.replace('KNOBS = {"A": 1, "B": "x"}', "KNOBS = {'A':   1,\n         'B': 'x'}  # hand-written")
    assert other != SRC and canonical_source(other) == canonical_source(SRC)
    assert canonical_source(canonical_source(SRC)) == canonical_source(SRC)
    assert canonical_source("no knobs here\n") == "no knobs here\n"
    quoted = write_knobs(SRC, {"A": 'say "hi"', "B": "it's"})  # strings that need repr's quoting
    assert read_knobs(quoted) == {"A": 'say "hi"', "B": "it's"}


@pytest.mark.parametrize("name", ["rmsnorm", "add_rmsnorm", "qk_rmsnorm", "rope", "silu_mul", "kv_append",
                                  "embedding", "logprob", "moe_routing", "linear", "attention"])
def test_every_root_is_written_as_the_knob_operator_writes(name):
    # A knob offspring that puts back the root's values must hash as the root, not be audited again.
    from tik_evo.families import load_family
    from tik_evo.knobs import canonical_source

    source = load_family(name).root_source()
    assert canonical_source(source) == source


def test_a_written_source_reads_back_as_a_parse_of_it_would():
    import tik_evo.knobs as knobs_module
    from tik_evo.families import load_family
    from tik_evo.knobs import canonical_source, read_knobs, write_knobs

    src = load_family("rmsnorm").root_source()
    knobs = {**read_knobs(src), "NUM_WARPS": 8, "FULL_NUM_STAGES": 3}
    new = write_knobs(src, knobs)
    remembered = read_knobs(new)
    assert canonical_source(new) == new
    knobs_module._WRITTEN.clear()  # now read by parsing
    knobs_module._knobs_node.cache_clear()
    assert read_knobs(new) == remembered == knobs and canonical_source(new) == new
    remembered["NUM_WARPS"] = 1  # a caller's copy: changing it changes nothing remembered
    assert read_knobs(write_knobs(src, knobs))["NUM_WARPS"] == 8
