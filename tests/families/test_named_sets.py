"""Named sets declared in a family folder's sets.yaml: inheritance by `base`, and errors that name the file, the
set and the knob."""

from pathlib import Path

import pytest

from tik_evo_kernels.attention.family import AttentionFamily
from tik_evo_kernels.rmsnorm.family import RMSNormFamily


def _family(folder: Path):
    class Here(RMSNormFamily):
        @property
        def folder(self) -> Path:
            return folder

    return Here()


def _knob(fam):
    k = next(k for k in fam.knobs if len(k.values) > 1)
    return k.name, k.values[1]


def test_base_sets_are_updated_with_their_own_knobs(tmp_path):
    fam = _family(tmp_path)
    assert fam.named_sets() == {}  # no sets.yaml: no sets
    name, value = _knob(fam)
    other = next(k for k in fam.knobs if k.name != name and len(k.values) > 1)
    (tmp_path / "sets.yaml").write_text(f"a:\n  about: one knob\n  knobs: {{{name}: {value!r}}}\n"
                                        f"b:\n  base: a\n  knobs: {{{other.name}: {other.values[1]!r}}}\n")
    fam = _family(tmp_path)
    sets = fam.named_sets()
    assert sets == {"a": {name: value}, "b": {name: value, other.name: other.values[1]}}
    assert fam.named_sets() is sets  # read once: bench tables and campaigns see the same dict


@pytest.mark.parametrize("text, words", [
    ("a:\n  knobs: {NOT_A_KNOB: 1}\n", ["set 'a'", "NOT_A_KNOB"]),
    ("a:\n  base: b\n  knobs: {}\n", ["set 'a'", "base 'b'"]),
    ("a:\n  knobs: {}\n  colour: red\n", ["set 'a'", "about/base/knobs"]),
    ("a: [1, 2\n", ["not valid YAML"]),
])
def test_bad_sets_name_file_set_and_key(tmp_path, text, words):
    (tmp_path / "sets.yaml").write_text(text)
    with pytest.raises(ValueError) as e:
        _family(tmp_path).named_sets()
    assert str(tmp_path / "sets.yaml") in str(e.value)
    for w in words:
        assert w in str(e.value)


def test_bad_knob_value_is_refused(tmp_path):
    fam = _family(tmp_path)
    name, _ = _knob(fam)
    (tmp_path / "sets.yaml").write_text(f"a:\n  knobs: {{{name}: 123456789}}\n")
    with pytest.raises(ValueError, match=f"{name}=123456789 is not one of"):
        _family(tmp_path).named_sets()


def test_attention_sets_resolve_to_full_knob_changes():
    sets = AttentionFamily().named_sets()
    assert sets["root"] == {}
    # a chain of bases: the last set carries every change of its ancestors
    tma = sets["hopper_bn128_tma_s512"]
    assert tma["SPLIT_TOKENS"] == 512 and tma["BLOCK_N"] == 128 and tma["ROW_SUM"] == "tree"
    assert tma["FULL_KV_LOADS"] == "auto" and tma["FULL_WS_STORE"] == "tma"
    assert sets["hopper_bn128_tma_s1024"]["SPLIT_TOKENS"] == 1024
