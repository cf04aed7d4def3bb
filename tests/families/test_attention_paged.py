"""Attention's decode from a paged KV cache (`decode_paged`) on the CPU (TRITON_INTERPRET=1, exact float64 dot): the
bits of `decode` on the same logical cache, whatever the page size, the page order and the knobs; the family's
check catching a paged path that reads the wrong pages; and the KV append into pages feeding it."""

from __future__ import annotations

import math

import pytest
import torch
from _attention import (
    interpreter,  # noqa: F401 (an autouse fixture: the exact-dot interpreter)
    load,
    record_launches,
    with_knobs,
)

from tik_evo.candidate import load_module
from tik_evo.families import load_family
from tik_evo_kernels.attention import FAMILY
from tik_evo_kernels.attention.family import _paged_checks, paged_cache

B, HQ, HKV, D, CAP = 3, 4, 2, 64, 70
LENS = [70, 1, 37]  # the longest fills the cache; none is a multiple of a page (but 1 of page 1)


def _inputs(seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    q, kc, vc = (torch.randn(s, generator=g).bfloat16() for s in ((B, HQ, 1, D), (B, HKV, CAP, D), (B, HKV, CAP, D)))
    return q, kc, vc, torch.tensor(LENS, dtype=torch.int32)


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.view(torch.int16 if t.dtype == torch.bfloat16 else torch.int32)


def _decode(mod, q, *cache, paged: bool):
    """(out, out32) of decode (cache: k, v, lens) or decode_paged (cache: k_pages, v_pages, table, lens)."""
    out, out32 = torch.full_like(q, float("nan")), torch.full(q.shape, float("nan"))
    (mod.decode_paged if paged else mod.decode)(q, *cache, 1 / math.sqrt(D), out, out32)
    return out, out32


_ROOT = []


def _root():
    """The root, loaded once (for tests that run no kernel or keep its knobs)."""
    if not _ROOT:
        _ROOT.append(load(FAMILY.root_source()))
    return _ROOT[0]


def _same(a, b) -> bool:
    return all(torch.equal(_bits(x), _bits(y)) for x, y in zip(a, b))


# Knobs scaled down (as in test_attention.py) so that 70 keys cross blocks and split chunks; each with page sizes
# that split blocks (1: each key's own page), hold whole blocks (64: one page a block, TMA), or straddle them (48, 56).
@pytest.mark.parametrize("knobs, pages", [
    ({"BLOCK_N": 32, "SPLIT_TOKENS": 64, "BLOCK_M": 64}, (1,)),
    ({"BLOCK_N": 32, "SPLIT_TOKENS": 64, "BLOCK_M": 64, "DECODE_KV_LOADS": "tma", "DECODE_MERGE_LAUNCH": "fused",
      "DECODE_MERGE_ROWS": 1, "DECODE_CHUNKS_PER_PROGRAM": 0, "DECODE_CHUNK_LOOP": "flatten"}, (64,)),
    ({"BLOCK_N": 16, "SPLIT_TOKENS": 0, "ROW_SUM": "tree", "DECODE_BLOCK_M": 16, "DECODE_PACK_GQA": False}, (48,)),
    # Contiguous capacity 70 fits one 128-key chunk (one launch); the paged table's 168 keys do not (a merge):
    # another launch plan, the same bits.
    ({"BLOCK_N": 32, "SPLIT_TOKENS": 128, "BLOCK_M": 64, "DECODE_FINISH_SINGLE": True}, (56,)),
], ids=["split", "tma-fused-flatten", "nosplit-tree-unpacked", "finish-single"])
def test_paged_decode_gives_the_contiguous_bits(knobs, pages):
    mod = load(with_knobs(FAMILY.root_source(), **knobs))
    launches = []
    record_launches(mod, "_decode_kernel", lambda grid, kw: launches.append(kw))
    q, kc, vc, lens = _inputs()
    want = _decode(mod, q, kc, vc, lens, paged=False)
    assert torch.isfinite(want[1]).all()
    for page in pages:
        kp, vp, table = paged_cache(kc, vc, lens, page, torch.Generator().manual_seed(page))
        assert table.stride(0) > table.shape[1]  # rows of a wider table, as an engine's may be
        got = _decode(mod, q, kp, vp, table, lens, paged=True)
        assert _same(got, want), (knobs, page)
        kw = launches[-1]
        assert (kw["PAGE"], kw["KV_ROW"], kw["TMA"]) == (page, HKV * D, knobs.get("DECODE_KV_LOADS") == "tma")
        if page == pages[0] == 1:  # a table that deals one sequence's pages the other way round: other keys
            bad = table.clone()
            bad[0, :2] = table[0, :2].flip(0)
            assert not _same(_decode(mod, q, kp, vp, bad, lens, paged=True), want)
    assert launches[0]["PAGE"] == 0 and launches[0]["TMA"] == (knobs.get("DECODE_KV_LOADS") == "tma")


def test_every_named_set_plans_the_paged_launch_as_the_contiguous_one():
    # Launches recorded, not run: with the same capacity (2048 keys, 128 pages of 16), every named set's paged
    # decode launches the same kernels with the same grids and constexprs as its contiguous decode, but the page
    # (its size and row stride) and the pipeline depth: the knobs the two share apply to both.
    q = torch.zeros((2, 8, 1, D), dtype=torch.bfloat16)
    kc = torch.zeros((2, 2, 2048, D), dtype=torch.bfloat16)
    kp = torch.zeros((300, 16, 2, D), dtype=torch.bfloat16)
    table = torch.zeros((2, 128), dtype=torch.int32)
    lens = torch.tensor([2048, 5], dtype=torch.int32)
    mod = load(FAMILY.root_source())
    root_knobs = dict(mod.KNOBS)
    for name, changes in FAMILY.named_sets().items():
        mod.KNOBS = {**root_knobs, **changes}  # the host plan reads KNOBS at each call (no kernel compiles here)
        plans = {}
        for paged, args in ((False, (kc, kc, lens)), (True, (kp, kp, table, lens))):
            plan = plans[paged] = []

            class Recorder:
                def __getitem__(self, grid, plan=plan):
                    return lambda *a, **kw: plan.append((grid, {k: v for k, v in kw.items()
                                                                if k not in ("PAGE", "KV_ROW", "num_stages")}))

            mod._decode_kernel = mod._decode_merge_kernel = Recorder()
            (mod.decode_paged if paged else mod.decode)(q, *args, 0.125, torch.empty_like(q))
        assert plans[True] == plans[False], name


def test_the_family_check_catches_a_paged_decode_reading_the_wrong_table_row():
    # A paged decode that takes the block table's width for its row stride reads another sequence's pages from
    # an engine's wider table: the family's paged check (its tables are such slices) fails it, bit for bit.
    src = FAMILY.root_source()
    right = "table if page else context_lens, table.stride(0) if page else 0,"
    assert src.count(right) == 1
    q, kc, vc, lens = _inputs(1)
    want = None
    for source, passes in ((src, True), (src.replace(right, right.replace("stride(0)", "shape[1]")), False)):
        mod = load(with_knobs(source, BLOCK_N=32, SPLIT_TOKENS=64, BLOCK_M=64))
        want = want or _decode(mod, q, kc, vc, lens, paged=False)  # (the contiguous decode is the same)
        dec, dec32 = want
        results = _paged_checks(mod, q, kc, vc, lens, 1 / math.sqrt(D), dec, dec32, 16, 0, "tag")
        assert [c.name.split(" page")[0] for c in results] == [
            "paged decode finite", "paged decode == decode (bf16)", "paged decode == decode (fp32)"]
        assert all(c.passed for c in results) == passes, [(c.name, c.details) for c in results]


@pytest.mark.parametrize("change, words", [
    ({"block_table": lambda t: t.long()}, "block_table torch.int64"),
    ({"block_table": lambda t: t.t().contiguous().t()}, "unit column stride"),
    ({"context_lens": lambda t: t[:2]}, "context_lens torch.int32 (2,)"),
    ({"v_pages": lambda t: t[:, :8]}, "v_pages (4, 8, 2, 64)"),
    ({"k_pages": lambda t: t.float(), "v_pages": lambda t: t.float()}, "k_pages dtype torch.float32"),
    ({"k_pages": lambda t: t[:, :, :1].repeat(1, 1, 3, 1), "v_pages": lambda t: t[:, :, :1].repeat(1, 1, 3, 1)},
     "3 KV heads: expected a divisor of q's 4 heads"),
    ({"q": lambda t: t[:, :, 0]}, "q (3, 4, 64): expected a contiguous [B, HQ, 1, D]"),
    ({"out32": lambda t: t.bfloat16()}, "out32 torch.bfloat16"),
])
def test_decode_paged_refuses_what_it_cannot_read(change, words):
    mod = _root()
    args = {"q": torch.zeros((B, HQ, 1, D), dtype=torch.bfloat16),
            "k_pages": torch.zeros((4, 16, HKV, D), dtype=torch.bfloat16),
            "v_pages": torch.zeros((4, 16, HKV, D), dtype=torch.bfloat16),
            "block_table": torch.zeros((B, 2), dtype=torch.int32), "context_lens": torch.ones(B, dtype=torch.int32),
            "sm_scale": 0.125, "out": torch.zeros((B, HQ, 1, D), dtype=torch.bfloat16),
            "out32": torch.zeros((B, HQ, 1, D))}
    for name, f in change.items():
        args[name] = f(args[name])
    with pytest.raises(ValueError, match="decode_paged: ") as e:
        mod.decode_paged(**args)
    assert words in str(e.value), str(e.value)


def test_appending_into_pages_then_decoding_them_equals_the_contiguous_decode():
    # A rollout step as a paged engine runs it: the new token's K/V appended into its page (kv_append's decode path,
    # block table + position, and its slot-mapped path), then decode_paged over the pages: decode's bits on the
    # contiguous cache holding the same keys.
    kv = load_family("kv_append")
    append = load_module(kv.root_path, "paged_kv_append_root")
    mod = load(with_knobs(FAMILY.root_source(), BLOCK_N=32, SPLIT_TOKENS=64, BLOCK_M=64))
    q, kc, vc, lens = _inputs(2)
    page = 16
    kp, vp, table = paged_cache(kc, vc, lens, page, torch.Generator().manual_seed(3))
    # each sequence's new key and value [B, HKV, D], at position lens - 1: not in the pages yet
    pos, rows = (lens - 1).long(), torch.arange(B)
    k_new, v_new = kc[rows, :, pos].contiguous(), vc[rows, :, pos].contiguous()
    slots = table[rows, pos // page].long() * page + pos % page
    kp.view(-1, HKV, D)[slots], vp.view(-1, HKV, D)[slots] = float("nan"), float("nan")
    want = _decode(mod, q, kc, vc, lens, paged=False)
    by_table, by_slot = (kp.clone(), vp.clone()), (kp.clone(), vp.clone())
    append.kv_append_decode(k_new, v_new, *by_table, table, lens - 1)
    append.kv_append_slots(k_new, v_new, *by_slot, slots)
    assert torch.equal(by_table[0].view(torch.int16), by_slot[0].view(torch.int16))
    assert _same(_decode(mod, q, *by_table, table, lens, paged=True), want)


def test_paged_decode_benchmark_smoke_checks_the_bits_and_names_the_machine(tmp_path):
    # `tik-evo bench paged-decode --smoke`: a tiny cell on the CPU interpreter: the paged output equals the
    # contiguous one bit for bit, every implementation has a time (one call's wall clock here), flash-attn's
    # absence is said, and the JSON names the machine and versions.
    import json

    from tik_evo.cli import main

    out = tmp_path / "paged.json"
    assert main(["bench", "paged-decode", "--smoke", "--variants", "nope", "--out", str(out)]) == 2
    assert main(["bench", "paged-decode", "--smoke", "--out", str(out)]) == 0
    r = json.loads(out.read_text())
    assert r["smoke"] and r["gpu"] == "cpu (interpreter)" and {"date", "torch", "triton"} <= set(r)
    assert r["all_bits_equal"] and r["flash_attn"]  # a version, or why it is not timed
    assert {t["impl"] for t in r["timings"]} >= {"sdpa", "root.contiguous", "root.paged16"}
    assert all("us" in t for t in r["timings"]), r["timings"]
    (bits,) = r["bits"]
    assert bits["bf16_equal"] and bits["fp32_equal"] and bits["rel_l2_vs_sdpa"] < 1.6e-2, bits
    assert r["summary"]["root.paged16"]["cells_vs_contiguous"] == 1
