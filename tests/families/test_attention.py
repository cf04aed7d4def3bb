"""Attention family on the CPU (TRITON_INTERPRET=1, exact float64 dot): the structure of bitwise consistency.

These tests prove logic (same blocks, same order, same merges), not GPU bits or speed; those are measured by
`tik-evo bench attention` (results under `results/attention/`).
"""

from __future__ import annotations

import math
import random

import pytest
import torch
import yaml
from _attention import (
    REPO,
    SMALL,
    TINY,
    failed,
    interpreter,  # noqa: F401 (an autouse fixture: the exact-dot interpreter)
    load,
    record_launches,
    with_knobs,
)

from tik_evo.knobs import read_knobs
from tik_evo_kernels.attention import FAMILY
from tik_evo_kernels.attention.family import reference


def test_knob_space_matches_root():
    knobs = read_knobs(FAMILY.root_source())
    assert set(knobs) == {k.name for k in FAMILY.knobs}
    for k in FAMILY.knobs:
        assert knobs[k.name] in k.values, k.name
    assert {k.role for k in FAMILY.knobs if k.name in ("BLOCK_N", "SPLIT_TOKENS")} == {"contract"}
    # Every split size is a whole number of KV blocks for every block width.
    for split in FAMILY.knob("SPLIT_TOKENS").values:
        assert all(split % bn == 0 for bn in FAMILY.knob("BLOCK_N").values)
    # Hopper: both paths stay in the wgmma layout family.
    # Row sums reduced over the accumulator round by MMA layout: prefill tiles stay >= 64 rows, and decode tiles
    # below 64 rows are only launched with a layout-free (dot or tree) row sum, a contract knob.
    assert min(FAMILY.knob("BLOCK_M").values) >= 64 and FAMILY.knob("ROW_SUM").role == "contract"
    src = FAMILY.root_source()
    assert 'layout_free = KNOBS["ROW_SUM"] != "reduce"' in src
    assert 'KNOBS["DECODE_BLOCK_M"] if layout_free else max(KNOBS["DECODE_BLOCK_M"], 64)' in src
    for opp in FAMILY.opportunities():
        assert all(n in knobs for n in opp.knobs), opp.kind


def test_reference_matches_torch_sdpa():
    g = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(s, generator=g, dtype=torch.float64) for s in ((2, 6, 9, 16), (2, 3, 9, 16), (2, 3, 9, 16)))
    want = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
    assert torch.allclose(reference(q, k, v), want, atol=1e-12)
    rows = torch.tensor([4, 8])
    assert torch.allclose(reference(q[:, :, rows], k, v, rows=rows), want[:, :, rows], atol=1e-12)


def test_root_passes_small_case():
    results = FAMILY.run_checks(load(FAMILY.root_source()), SMALL, 0, "cpu")
    assert len(results) >= 15
    assert not failed(results), failed(results)


def test_split_kv_mha_passes_every_case():
    # Split-KV with chunks much shorter than the sequence (several merges per row, chunk edges inside the answer),
    # GQA ratio 1, larger input scale: the prefill must reproduce decode's chunks and merge order exactly.
    src = with_knobs(FAMILY.root_source(), BLOCK_N=32, SPLIT_TOKENS=32, BLOCK_M=64, DECODE_CHUNKS_PER_PROGRAM=2)
    case = {"batch": 1, "q_heads": 2, "kv_heads": 2, "head_dim": 64, "prompt": 50, "answer": 27, "scale": 3.0}
    results = FAMILY.run_checks(load(src), case, 1, "cpu")
    assert not failed(results), failed(results)


@pytest.mark.parametrize("loop", ["nested", "flatten"])
def test_decode_programs_owning_several_chunks_agree(loop):
    # "auto" chunks per program (several per program here) with both chunk loops: whole chunks and the
    # partial last chunk split between the flattened loop and the per-chunk loop, in mixed-length batches.
    src = with_knobs(FAMILY.root_source(), BLOCK_N=32, SPLIT_TOKENS=32, BLOCK_M=64, DECODE_CHUNKS_PER_PROGRAM=0,
                     DECODE_CHUNK_LOOP=loop)
    mod = load(src)
    case = {"batch": 2, "q_heads": 4, "kv_heads": 2, "head_dim": 64, "prompt": 61, "answer": 20, "scale": 1.0}
    results = FAMILY.run_checks(mod, case, 3, "cpu")
    assert not failed(results), failed(results)


@pytest.mark.parametrize("loop", ["nested", "flatten"])
def test_decode_of_a_one_chunk_cache_is_one_launch(loop):
    # Contexts of 1..70 keys in caches that fit one 128-token chunk: each chunk program normalises its own
    # chunk, and the merge kernel must not be launched at all (it raises here).
    src = with_knobs(FAMILY.root_source(), BLOCK_N=32, SPLIT_TOKENS=128, BLOCK_M=64, DECODE_FINISH_SINGLE=True,
                     DECODE_CHUNKS_PER_PROGRAM=0 if loop == "flatten" else 1, DECODE_CHUNK_LOOP=loop)
    mod = load(src)

    class NoMerge:
        def __getitem__(self, grid):
            raise AssertionError("merge launched for a one-chunk cache")

    mod._decode_merge_kernel = NoMerge()
    results = FAMILY.run_checks(mod, SMALL, 4, "cpu")
    assert len(results) >= 15
    assert not failed(results), failed(results)


@pytest.mark.parametrize("loads,rows", [(8, 1), (4, 4)])
def test_merge_loading_several_partials_agrees(loads, rows):
    # Contexts of up to 150 keys in 16-token chunks: up to ten partials, so an 8-wide merge folds a full group
    # and a partial one; tiles of exactly the query heads (rows 1) or padded (4).
    src = with_knobs(FAMILY.root_source(), BLOCK_N=16, SPLIT_TOKENS=16, BLOCK_M=64, DECODE_MERGE_LOADS=loads,
                     DECODE_MERGE_ROWS=rows)
    # (a short answer: the prompt's edge positions give the other context lengths, 1 to 146 keys)
    case = {"batch": 1, "q_heads": 2, "kv_heads": 1, "head_dim": 64, "prompt": 146, "answer": 4, "scale": 1.0}
    results = FAMILY.run_checks(load(src), case, 5, "cpu")
    assert not failed(results), failed(results)


@pytest.mark.parametrize("pack,loads,cpp", [(True, 8, 1), (False, 4, 2)])
def test_fused_merge_folds_in_the_last_program_without_a_merge_launch(pack, loads, cpp):
    # Up to five 16-token chunks per sequence in mixed-length batches, on 5 or 3 programs per row group: the last
    # to arrive folds the partials itself (the merge kernel raises if launched), with the same bits as the merge
    # launch, and leaves every arrival counter at zero for the next call. (The interpreter runs programs in order,
    # so arrivals out of order are checked on the GPU: `tik-evo bench attention-ws --smoke`.)
    src = with_knobs(FAMILY.root_source(), BLOCK_N=16, SPLIT_TOKENS=16, BLOCK_M=64, DECODE_MERGE_LAUNCH="fused",
                     DECODE_PACK_GQA=pack, DECODE_MERGE_LOADS=loads, DECODE_CHUNKS_PER_PROGRAM=cpp)
    mod = load(src)

    class NoMerge:
        def __getitem__(self, grid):
            raise AssertionError("merge launched although it is fused")

    mod._decode_merge_kernel = NoMerge()
    case = {"batch": 2, "q_heads": 2, "kv_heads": 1, "head_dim": 64, "prompt": 62, "answer": 14, "scale": 1.0}
    results = FAMILY.run_checks(mod, case, 6, "cpu")
    assert len(results) >= 15
    assert not failed(results), failed(results)
    assert mod._ARRIVALS and all(int(buf.abs().sum()) == 0 for bufs in mod._ARRIVALS.values() for buf in bufs)
    first = mod._arrivals(torch.device("cpu"), 1)
    assert mod._arrivals(torch.device("cpu"), 5000) is not first  # grown ...
    assert any(buf is first for buf in mod._ARRIVALS[(torch.device("cpu"), 0)])  # ... and the old one kept alive


class _Spy:
    """A kernel whose launches are recorded."""

    def __init__(self, kernel, launched: list):
        self.kernel, self.launched = kernel, launched

    def __getitem__(self, grid):
        self.launched.append(grid)
        return self.kernel[grid]


def test_auto_merge_launch_follows_the_chunk_grid():
    # "auto" folds in the chunk programs when their grid fills at least 3/4 of the SMs, else launches the merge
    # (PDL on the GPU, plain here): same bits either way.
    src = with_knobs(FAMILY.root_source(), BLOCK_N=16, SPLIT_TOKENS=16, BLOCK_M=64, DECODE_MERGE_LAUNCH="auto")
    g = torch.Generator().manual_seed(3)
    q = torch.randn((2, 4, 1, 64), generator=g).to(torch.bfloat16)
    kc = torch.randn((2, 2, 70, 64), generator=g).to(torch.bfloat16)
    vc = torch.randn((2, 2, 70, 64), generator=g).to(torch.bfloat16)
    ctx = torch.tensor([70, 33], dtype=torch.int32)
    outs = {}
    for sms, merge_launched in ((1, False), (1000, True)):  # 5 chunks x 4 row groups = 20 programs
        mod = load(src)
        mod._sm_count = lambda device, sms=sms: sms
        launched = []
        mod._decode_merge_kernel = _Spy(mod._decode_merge_kernel, launched)
        out = torch.empty_like(q)
        mod.decode(q, kc, vc, ctx, 0.125, out)
        assert bool(launched) == merge_launched, sms
        outs[sms] = out
    assert torch.equal(outs[1].view(torch.int16), outs[1000].view(torch.int16))


# Knob combinations the search may choose: path-only knobs from the legal space; contract knobs scaled down so
# that the tiny CPU shapes still cross block and chunk edges (the legal splits are >= 256 tokens).
_rng = random.Random(0)
_COMBOS = []
for contract in ({"BLOCK_N": 64, "SPLIT_TOKENS": 0}, {"BLOCK_N": 32, "SPLIT_TOKENS": 64},
                 {"BLOCK_N": 64, "SPLIT_TOKENS": 64}):
    path = {k.name: _rng.choice(k.values) for k in FAMILY.knobs if k.role != "contract"}
    _COMBOS.append({**path, **contract})
# The load and loop variants every search can reach, pinned so each runs in CI whatever the draw above gives.
for loop, cpp in (("flatten", 0), ("flat", 2)):
    _COMBOS.append({"BLOCK_N": 32, "SPLIT_TOKENS": 64, "FULL_SPLIT_LOOP": loop, "FULL_KV_LOADS": "tma",
                    "DECODE_KV_LOADS": "tma", "DECODE_MERGE_LAUNCH": "pdl", "BLOCK_M": 64,
                    "DECODE_CHUNKS_PER_PROGRAM": cpp, "DECODE_CHUNK_LOOP": "flatten"})
for split, persistent in ((0, "row_blocks"), (64, "heads")):  # one program walking every tile (one "SM" on the CPU)
    _COMBOS.append({"BLOCK_N": 32, "SPLIT_TOKENS": split, "FULL_PERSISTENT": persistent, "BLOCK_M": 64,
                    "FULL_SPLIT_LOOP": "flatten", "FULL_KV_LOADS": "tma"})
for tile in (16, 32):  # the layout-free row sum lets decode use tiles below 64 rows
    _COMBOS.append({"BLOCK_N": 32, "SPLIT_TOKENS": 64, "ROW_SUM": "dot", "DECODE_BLOCK_M": tile, "BLOCK_M": 64})
for loads in ("auto", "tma"):  # auto: pointer loads below 2048 tokens (every CPU case), TMA above
    _COMBOS.append({"BLOCK_N": 32, "SPLIT_TOKENS": 64, "FULL_KV_LOADS": loads, "FULL_PERSISTENT": "snake",
                    "BLOCK_M": 64, "FULL_SPLIT_LOOP": "flatten"})
# The tree row sum with every block width the interpreter reaches, small decode tiles, both split layouts.
_COMBOS.append({"BLOCK_N": 16, "SPLIT_TOKENS": 0, "ROW_SUM": "tree", "DECODE_BLOCK_M": 16, "BLOCK_M": 64})
_COMBOS.append({"BLOCK_N": 32, "SPLIT_TOKENS": 64, "ROW_SUM": "tree", "DECODE_BLOCK_M": 16, "BLOCK_M": 64,
                "DECODE_CHUNKS_PER_PROGRAM": 0, "DECODE_CHUNK_LOOP": "flatten", "DECODE_KV_LOADS": "tma"})
_COMBOS.append({"BLOCK_N": 128, "SPLIT_TOKENS": 0, "ROW_SUM": "tree", "DECODE_BLOCK_M": 32, "BLOCK_M": 128})
# One reciprocal per row (NORMALIZE): the Triton prefill, the chunked decode, its merge launch and the fused fold.
_COMBOS.append({"BLOCK_N": 32, "SPLIT_TOKENS": 64, "ROW_SUM": "tree", "NORMALIZE": "reciprocal", "BLOCK_M": 64})
_COMBOS.append({"BLOCK_N": 32, "SPLIT_TOKENS": 64, "NORMALIZE": "reciprocal", "BLOCK_M": 64,
                "DECODE_MERGE_LAUNCH": "fused", "DECODE_MERGE_ROWS": 1, "DECODE_MERGE_LOADS": 8})


@pytest.mark.parametrize("knobs", _COMBOS, ids=lambda k: f"BN{k['BLOCK_N']}-split{k['SPLIT_TOKENS']}-"
                         f"{k.get('FULL_SPLIT_LOOP')}-{k.get('FULL_KV_LOADS')}-{k.get('ROW_SUM', 'reduce')}"
                         f"{k.get('DECODE_BLOCK_M', '')}")
def test_sampled_knob_combos_stay_consistent(knobs):
    case = {"batch": 1, "q_heads": 4, "kv_heads": 1, "head_dim": 64, "prompt": 50, "answer": 16, "scale": 0.5}
    results = FAMILY.run_checks(load(with_knobs(FAMILY.root_source(), **knobs)), case, 2, "cpu")
    assert not failed(results), failed(results)


def test_reciprocal_normalize_rounds_once_more_than_the_division():
    # NORMALIZE is a contract knob: it must change the pre-cast fp32 outputs (else it is no choice at all), by no
    # more than the one extra rounding of the reciprocal (a few fp32 ulps).
    q, k, v = (torch.randn(1, h, 50, 64, generator=torch.Generator().manual_seed(3), dtype=torch.float32)
               .to(torch.bfloat16) for h in (2, 1, 1))
    outs = {}
    for mode in ("divide", "reciprocal"):
        mod = load(with_knobs(FAMILY.root_source(), BLOCK_N=32, SPLIT_TOKENS=64, BLOCK_M=64, NORMALIZE=mode))
        out, out32 = torch.empty_like(q), torch.empty(q.shape, dtype=torch.float32)
        mod.prefill(q, k, v, 0.125, out, out32)
        outs[mode] = out32
    diff = (outs["divide"] - outs["reciprocal"]).abs()
    assert diff.max() > 0
    assert (diff <= 4 * torch.finfo(torch.float32).eps * outs["divide"].abs()).all()


_TREE_PROBE = """

@triton.jit
def tree_probe(P, OUT, R: tl.constexpr, N: tl.constexpr, TRANS: tl.constexpr):
    r = tl.arange(0, R)
    c = tl.arange(0, N)
    if TRANS:
        s = _tree_rows(tl.trans(tl.load(P + c[:, None] * R + r[None, :])), N)
    else:
        s = _tree_rows(tl.load(P + r[:, None] * N + c[None, :]), N)
    tl.store(OUT + r, s)
"""


@pytest.mark.parametrize("width", [16, 32, 64, 128])
def test_tree_row_sum_is_the_documented_pairing(width):
    # The tree row sum's bits are the pairing alone: reproduce it with float32 adds in torch, with the rows
    # loaded as rows and loaded as columns then transposed (another layout of the same values).
    mod = load(with_knobs(FAMILY.root_source(), ROW_SUM="tree") + _TREE_PROBE)
    g = torch.Generator().manual_seed(width)
    p = torch.rand((8, width), generator=g) * torch.exp2(torch.randint(-20, 20, (8, width), generator=g).float())
    bits = int(math.log2(width))
    x = p.view(8, *([2] * bits))  # axes 1..bits hold column bits (bits - 1) .. 0
    order = [0, *range(3, bits), 1, 2]
    for b in order:
        axes = [a for a in range(bits) if a not in order[: order.index(b)]]  # column bits still present
        axis = 1 + sorted(axes, reverse=True).index(b)
        x = x.select(axis, 0) + x.select(axis, 1)
    want = x
    assert not torch.equal(want, p.sum(1))  # the data tell pairings apart
    for trans in (False, True):
        out = torch.empty(8)
        src = p.t().contiguous() if trans else p
        mod.tree_probe[(1,)](src, out, R=8, N=width, TRANS=trans)
        assert torch.equal(out, want), (trans, (out - want).abs().max())


@pytest.mark.parametrize("sms", [3, 5])
def test_snake_persistent_prefill_covers_every_tile(sms):
    # Several programs dealing the tiles forwards and backwards in turn (on the CPU `_sm_count` is 1 otherwise):
    # a tile dealt twice or never shows up as a mismatch or as the harness's NaN poison.
    mod = load(with_knobs(FAMILY.root_source(), BLOCK_N=32, SPLIT_TOKENS=64, BLOCK_M=64, FULL_PERSISTENT="snake"))
    mod._sm_count = lambda device: sms
    # 3 row blocks x 4 heads: 12 tiles over 3 or 5 programs (a short answer: the decode checks cost the most here)
    case = {"batch": 2, "q_heads": 2, "kv_heads": 1, "head_dim": 64, "prompt": 146, "answer": 4, "scale": 1.0}
    results = FAMILY.run_checks(mod, case, 6, "cpu")
    assert not failed(results), failed(results)


def test_auto_persistence_deals_small_launches_only():
    # "auto": snake programs while the tiles fit 8 waves over the SMs, one program per tile beyond; both
    # launches must agree with decode (checked through the family's cases with 1 "SM": 8 tiles at most; short
    # answers keep the decode checks cheap).
    mod = load(with_knobs(FAMILY.root_source(), BLOCK_N=32, SPLIT_TOKENS=64, BLOCK_M=64, FULL_PERSISTENT="auto"))
    mod._sm_count = lambda device: 1
    seen = set()
    record_launches(mod, "_prefill_kernel", lambda grid, kw: seen.add((len(grid), kw["PERSISTENT"])))
    small = {"batch": 1, "q_heads": 2, "kv_heads": 1, "head_dim": 64, "prompt": 116, "answer": 4, "scale": 1.0}
    big = {"batch": 2, "q_heads": 2, "kv_heads": 1, "head_dim": 64, "prompt": 146, "answer": 4, "scale": 1.0}
    for case in (small, big):  # 2 x 2 = 4 tiles (snake), 3 x 4 = 12 tiles (one program per tile)
        results = FAMILY.run_checks(mod, case, 7, "cpu")
        assert not failed(results), failed(results)
    assert seen == {(1, "snake"), (2, "off")}


def test_auto_kv_loads_switch_at_2048_tokens():
    mod = load(with_knobs(FAMILY.root_source(), FULL_KV_LOADS="auto"))
    t = torch.zeros(16, dtype=torch.bfloat16)
    assert [mod._use_tma("FULL_KV_LOADS", t, t, seq=s) for s in (1152, 2047, 2048, 16384)] == \
        [False, False, True, True]


def test_small_decode_tiles_need_a_layout_free_row_sum():
    # With the reduced row sum a 16-row tile would round differently from prefill's: decode keeps 64 rows.
    launched = set()
    for row_sum in ("reduce", "tree"):
        mod = load(with_knobs(FAMILY.root_source(), ROW_SUM=row_sum, DECODE_BLOCK_M=16))
        record_launches(mod, "_decode_kernel", lambda grid, kw, r=row_sum: launched.add((r, kw["BLOCK_M"])))
        results = FAMILY.run_checks(mod, TINY, 0, "cpu")
        assert not failed(results), failed(results)
    assert launched == {("reduce", 64), ("tree", 16)}


def _decode_reads(source: str, knob: str, new_knob: str) -> str:
    """A copy of the root whose decode launch reads ``new_knob`` where both paths should read ``knob``."""
    start = source.index("def decode(")
    body = source[start:]
    assert f'KNOBS["{knob}"]' in body
    return source[:start] + body.replace(f'KNOBS["{knob}"]', f'KNOBS["{new_knob}"]')


def test_mismatched_block_n_is_caught():
    # Decode walks 32-key blocks while prefill walks 64-key blocks: accurate, but not the same bits.
    src = _decode_reads(FAMILY.root_source(), "BLOCK_N", "DECODE_BLOCK_N")
    src = with_knobs(src, BLOCK_N=64, DECODE_BLOCK_N=32)
    results = FAMILY.run_checks(load(src), TINY, 0, "cpu")
    bad = failed(results)
    assert any(n.startswith("decode == prefill row at answer positions (fp32)") for n in bad), bad
    assert all(c.passed for c in results if c.kind == "reference")
    # Decode alone vs in a batch is still consistent (the mismatch is between paths, not batch sizes).
    assert not any("alone" in n for n in bad), bad


def test_mismatched_split_is_caught():
    # Decode splits the keys into 32-token chunks, prefill does not split.
    src = _decode_reads(FAMILY.root_source(), "SPLIT_TOKENS", "DECODE_SPLIT")
    src = with_knobs(src, BLOCK_N=32, SPLIT_TOKENS=0, DECODE_SPLIT=32)
    results = FAMILY.run_checks(load(src), TINY, 0, "cpu")
    assert any("decode == prefill row" in n for n in failed(results)), failed(results)


@pytest.mark.parametrize("knobs", [{}, {"SPLIT_TOKENS": 64, "BLOCK_N": 32, "FULL_SPLIT_LOOP": "flat"},
                                   {"SPLIT_TOKENS": 64, "BLOCK_N": 32, "BLOCK_M": 64, "FULL_KV_LOADS": "tma"}])
def test_packed_prefill_gives_each_sequence_its_own_prefill_bits(knobs):
    # Lengths of 1, past one 128-row tile, and odd offsets; with 64-token chunks the longest one folds 3 chunks.
    # With TMA, the blocks below each tile come through descriptors from rows that are not multiples of a block.
    mod = load(with_knobs(FAMILY.root_source(), **knobs))
    lens, HQ, HKV, D = [1, 130, 37, 64], 4, 2, 64
    g = torch.Generator().manual_seed(5)
    q, k, v = (torch.randn((sum(lens), h, D), generator=g).to(torch.bfloat16) for h in (HQ, HKV, HKV))
    cu = torch.tensor([0, *lens], dtype=torch.int32).cumsum(0).to(torch.int32)
    out, out32 = torch.full_like(q, float("nan")), torch.full(q.shape, float("nan"))
    mod.prefill_packed(q, k, v, cu, max(lens), 0.125, out, out32)
    for lo, hi in zip(cu[:-1].tolist(), cu[1:].tolist()):
        one, one32 = torch.empty((1, HQ, hi - lo, D), dtype=torch.bfloat16), torch.empty((1, HQ, hi - lo, D))
        mod.prefill(*(t[lo:hi].transpose(0, 1).unsqueeze(0).contiguous() for t in (q, k, v)), 0.125, one, one32)
        assert torch.equal(out[lo:hi].view(torch.int16), one[0].transpose(0, 1).view(torch.int16)), (lo, hi)
        assert torch.equal(out32[lo:hi].view(torch.int32), one32[0].transpose(0, 1).view(torch.int32)), (lo, hi)


def test_packed_prefill_refuses_strided_or_mismatched_tensors():
    mod = load(FAMILY.root_source())
    q, kv = torch.zeros((8, 4, 64), dtype=torch.bfloat16), torch.zeros((8, 2, 64), dtype=torch.bfloat16)
    cu = torch.tensor([0, 8], dtype=torch.int32)
    for args in ((q.transpose(0, 1).contiguous().transpose(0, 1), kv, kv, cu), (q, kv[:4], kv[:4], cu),
                 (q, kv, kv, cu.long())):
        with pytest.raises(ValueError, match="expected contiguous q/out"):
            mod.prefill_packed(*args, 8, 0.125, torch.empty_like(q))


def test_packed_prefill_on_other_blocks_is_caught():
    # The packed launch walking 32-key blocks where prefill walks 64: accurate, not the same bits.
    src = FAMILY.root_source().replace('KV_ROW=HKV * D, HEAD_D=D, BLOCK_M=KNOBS["BLOCK_M"], BLOCK_N=KNOBS["BLOCK_N"]',
                                       'KV_ROW=HKV * D, HEAD_D=D, BLOCK_M=KNOBS["BLOCK_M"], BLOCK_N=32')
    results = FAMILY.run_checks(load(with_knobs(src, BLOCK_N=64)), TINY, 0, "cpu")
    assert {n.split(" B")[0] for n in failed(results)} == {"packed prefill == prefill per sequence (bf16)",
                                                            "packed prefill == prefill per sequence (fp32)"}


def test_decode_ignores_cache_beyond_context():
    mod = load(FAMILY.root_source())
    g = torch.Generator().manual_seed(5)
    B, HQ, HKV, D, cap = 3, 4, 2, 64, 40
    q = torch.randn((B, HQ, 1, D), generator=g).bfloat16()
    kc = torch.randn((B, HKV, cap, D), generator=g).bfloat16()
    vc = torch.randn((B, HKV, cap, D), generator=g).bfloat16()
    ctx = torch.tensor([1, 17, 40], dtype=torch.int32)
    out = torch.full((B, HQ, 1, D), float("nan"), dtype=torch.bfloat16)
    mod.decode(q, kc, vc, ctx, 1 / math.sqrt(D), out)
    garbage_k, garbage_v = kc.clone(), vc.clone()
    for b, n in enumerate(ctx.tolist()):
        garbage_k[b, :, n:] = float("inf")
        garbage_v[b, :, n:] = float("nan")
    out2 = torch.full_like(out, float("nan"))
    mod.decode(q, garbage_k, garbage_v, ctx, 1 / math.sqrt(D), out2)
    assert torch.equal(out.view(torch.int16), out2.view(torch.int16))
    for b, n in enumerate(ctx.tolist()):
        ref = reference(q[b:b + 1], kc[b:b + 1], vc[b:b + 1], rows=torch.tensor([n - 1]))
        assert float((out[b:b + 1].double() - ref).norm() / ref.norm()) < 1.6e-2


@pytest.mark.parametrize("merge", ["plain", "fused"])
def test_a_padded_decode_row_leaves_the_other_rows_bits(merge):
    # Engines pad a decode batch up to a captured graph's size; a padded slot may come with context length 0.
    # Its own row is NaN (nothing to attend to); every other row keeps its bits, in this launch and the next
    # (the fused merge's arrival counters are left at zero).
    mod = load(with_knobs(FAMILY.root_source(), SPLIT_TOKENS=64, DECODE_MERGE_LAUNCH=merge,
                          DECODE_MERGE_ROWS=1 if merge == "fused" else 4))
    fused = []
    record_launches(mod, "_decode_kernel", lambda grid, kw: fused.append(kw["FUSED_MERGE"]))
    g = torch.Generator().manual_seed(6)
    B, HQ, HKV, D, cap = 3, 4, 2, 64, 150
    q = torch.randn((B, HQ, 1, D), generator=g).bfloat16()
    kc = torch.randn((B, HKV, cap, D), generator=g).bfloat16()
    vc = torch.randn((B, HKV, cap, D), generator=g).bfloat16()
    outs = []
    for lens in ([100, 1, 150], [100, 0, 150], [100, 1, 150]):
        out = torch.full((B, HQ, 1, D), float("nan"), dtype=torch.bfloat16)
        mod.decode(q, kc, vc, torch.tensor(lens, dtype=torch.int32), 1 / math.sqrt(D), out)
        outs.append(out.view(torch.int16))
    assert torch.isnan(outs[1][1].view(torch.bfloat16)).all()  # as docs/using.md says
    assert torch.equal(outs[1][0], outs[0][0]) and torch.equal(outs[1][2], outs[0][2])
    assert torch.equal(outs[2], outs[0])  # the launch after the padded one is unaffected
    assert fused == [merge == "fused"] * 3


def test_benches_on_cpu_workloads():
    mod = load(FAMILY.root_source())
    spec = yaml.safe_load((REPO / "workloads" / "attention_cpu.yaml").read_text())
    assert spec["family"] == "attention"
    phases = set()
    for wl in spec["workloads"]:
        FAMILY.validate_workload(wl)
        bench = FAMILY.make_bench(mod, wl, 0, "cpu")
        bench.run()
        results = bench.verify()
        assert results and all(c.passed for c in results), [c.to_dict() for c in results]
        assert bench.bytes_moved > 0 and bench.flops > 0
        assert bench.graph_friendly == (wl["phase"] == "decode")
        phases.add(wl["phase"])
    assert phases == set(FAMILY.phases)


def test_packed_workload_bench_times_prefill_packed_and_catches_a_wrong_sequence():
    """The train_packed phase launches `prefill_packed` once (not prefill), and its verify reads every
    sequence, so a packed path that mixes up sequence bounds fails it."""
    mod = load(FAMILY.root_source())
    wl = {"name": "p", "phase": "train_packed", "q_heads": 4, "kv_heads": 2, "head_dim": 64, "lengths": [37, 1, 70]}
    calls = []

    class Spy:
        def __getattr__(self, name):
            calls.append(name)
            return getattr(mod, name)

    bench = FAMILY.make_bench(Spy(), wl, 0, "cpu")
    bench.run()
    assert calls == ["prefill_packed"]
    assert all(c.passed for c in bench.verify())
    assert bench.flops == sum(4 * 4 * 64 * n * (n + 1) // 2 for n in (37, 1, 70)) and not bench.graph_friendly

    class OneSequence:  # treats the whole batch as one sequence: the last one then attends earlier rows
        @staticmethod
        def prefill_packed(q, k, v, cu, longest, scale, out, out32=None):
            whole = torch.tensor([0, q.shape[0]], dtype=torch.int32)
            mod.prefill_packed(q, k, v, whole, q.shape[0], scale, out, out32)

    assert not all(c.passed for c in FAMILY.make_bench(OneSequence(), wl, 0, "cpu").verify())


# Cheats a verify reading only batch item 0's first GQA group let through: every query head reads KV head 0, or
# every batch item reads batch item 0's keys and values. Finite, written, and right on that group.
_PREFILL_KV = "kv = _kv_source(K, V, b * HKV + h // GROUP,"
_CHEATS = {"kv_head_0": "kv = _kv_source(K, V, b * HKV,", "batch_item_0": "kv = _kv_source(K, V, h // GROUP,"}


@pytest.mark.parametrize("cheat", sorted(_CHEATS))
def test_prefill_verify_reads_every_batch_item_and_kv_group(cheat):
    from tik_evo import checks
    from tik_evo_kernels.attention.family import _prefill_inputs

    src = FAMILY.root_source()
    assert src.count(_PREFILL_KV) == 1
    mod = load(src.replace(_PREFILL_KV, _CHEATS[cheat]))
    wl = {"name": "p", "phase": "prefill", "batch": 2, "q_heads": 4, "kv_heads": 2, "head_dim": 64, "seq": 37}
    bench = FAMILY.make_bench(mod, wl, 0, "cpu")
    bench.run()
    results = {c.name: c.passed for c in bench.verify()}
    assert results == {"fresh inputs finite": True,
                       "fresh inputs vs fp64 (sampled rows, every batch item and head)": False}
    # Batch item 0's first group, all the verify read before, is right.
    q, k, v = _prefill_inputs(2, 4, 2, 64, 37, checks.generator(7919), "cpu")
    y = torch.empty_like(q)
    mod.prefill(q, k, v, 64 ** -0.5, y)
    assert checks.reference("group 0", y[:1, :2], reference(q[:1, :2], k[:1, :1], v[:1, :1])).passed


def test_packed_verify_reads_every_sequence_and_kv_group():
    src = FAMILY.root_source()
    packed_kv = "k0 = (start.to(tl.int64) * HKV + h // GROUP) * HEAD_D"
    assert src.count(packed_kv) == 1
    mod = load(src.replace(packed_kv, "k0 = (start.to(tl.int64) * HKV) * HEAD_D"))  # every head reads KV head 0
    wl = {"name": "p", "phase": "train_packed", "q_heads": 4, "kv_heads": 2, "head_dim": 64, "lengths": [21, 1, 30]}
    bench = FAMILY.make_bench(mod, wl, 0, "cpu")
    bench.run()
    assert {c.name: c.passed for c in bench.verify()} == {
        "fresh inputs finite": True, "fresh inputs vs fp64 (sampled rows of every sequence, every head)": False}


@pytest.mark.parametrize("lengths", [None, [], [3, 0], [2.5], "37,70", [True]])
def test_packed_workload_names_bad_lengths(lengths):
    wl = {"name": "p", "phase": "train_packed", "q_heads": 4, "kv_heads": 2, "head_dim": 64}
    if lengths is not None:
        wl["lengths"] = lengths
    with pytest.raises(ValueError, match="lengths"):
        FAMILY.validate_workload(wl)


def test_grid_workloads_are_valid():
    for name in ("attention_grid.yaml", "attention_heldout.yaml"):
        spec = yaml.safe_load((REPO / "workloads" / name).read_text())
        names = [w["name"] for w in spec["workloads"]]
        assert len(names) == len(set(names))
        for wl in spec["workloads"]:
            FAMILY.validate_workload(wl)
            assert wl["head_dim"] in (64, 128) and wl["q_heads"] % wl["kv_heads"] == 0
    grid = yaml.safe_load((REPO / "workloads" / "attention_grid.yaml").read_text())["workloads"]
    assert len(grid) == 50 and sum(w["phase"] == "train_packed" for w in grid) == 2


def test_autograd_forward_is_the_kernels_and_gradients_match_the_reference(tmp_path):
    # The differentiable call: the forward is the kernel file's prefill, bit for bit; the gradients (SDPA's,
    # recomputed) agree with fp64 autograd of the reference on a GQA case with a length no block divides.
    from tik_evo_kernels.attention.autograd import attention, load_kernel

    path = tmp_path / "attention_kernel.py"
    path.write_text(with_knobs(FAMILY.root_source(), BLOCK_N=32, SPLIT_TOKENS=32, BLOCK_M=64))
    impl = load_kernel(path)
    g = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn((1, h, 45, 64), generator=g).to(torch.bfloat16).requires_grad_() for h in (4, 2, 2))
    out = attention(q, k, v, impl)
    direct = torch.empty_like(q)
    impl.prefill(q.detach(), k.detach(), v.detach(), 1 / math.sqrt(64), direct)
    assert torch.equal(out, direct)
    grad_out = torch.randn(out.shape, generator=g).to(torch.bfloat16)
    out.backward(grad_out)
    qd, kd, vd = (t.detach().double().requires_grad_() for t in (q, k, v))
    reference(qd, kd, vd).backward(grad_out.double())
    for ours, ref in ((q.grad, qd.grad), (k.grad, kd.grad), (v.grad, vd.grad)):
        assert ours.dtype == torch.bfloat16 and ours.shape == ref.shape
        assert float((ours.double() - ref).norm() / ref.norm()) < 2e-2
    with pytest.raises(ValueError, match="HKV dividing HQ"):
        attention(q, k[:, :1].expand(1, 3, 45, 64), v[:, :1].expand(1, 3, 45, 64), impl)


def test_packed_autograd_backward_takes_varlen_flash_once_it_works_and_falls_back_for_good(monkeypatch):
    # The packed backward recomputes on a GPU through torch's varlen flash attention in one call (PACKED_BACKWARD
    # "auto" or "varlen_flash"), with SDPA per sequence elsewhere or when asked; where varlen fails it warns once
    # and uses SDPA per sequence from then on. Here a packed SDPA with a block-diagonal causal mask stands in for
    # the flash kernel (the CPU has none): same gradients as the per-sequence path. Empty sequences (repeated
    # bounds, as the transformers patch's padding segments give) cost no call and change nothing.
    from tik_evo_kernels.attention import autograd as ag

    impl = load(FAMILY.root_source())
    bounds, HQ, HKV, D = [0, 7, 7, 30, 31, 31], 4, 2, 64
    g = torch.Generator().manual_seed(9)
    q, k, v = (torch.randn((31, h, D), generator=g).to(torch.bfloat16) for h in (HQ, HKV, HKV))
    grad_out = torch.randn((31, HQ, D), generator=g).to(torch.bfloat16)

    def grads():
        leaves = [t.clone().requires_grad_() for t in (q, k, v)]
        ag.attention_packed(*leaves, bounds, impl, D ** -0.5).backward(grad_out)
        return [t.grad for t in leaves]

    def packed_sdpa(qs, ks, vs, cu, max_len, scale):
        seq = torch.repeat_interleave(torch.arange(cu.numel() - 1), cu.diff())
        assert bool((cu.diff() > 0).all())  # the empty sequences were dropped
        pos = torch.arange(qs.shape[0])
        mask = (seq[:, None] == seq[None, :]) & (pos[None, :] <= pos[:, None])
        o = torch.nn.functional.scaled_dot_product_attention(
            *(t.transpose(0, 1)[None] for t in (qs, ks, vs)), attn_mask=mask, scale=scale, enable_gqa=True)
        calls.append(max_len)
        return o[0].transpose(0, 1)

    calls = []
    monkeypatch.setitem(ag._VARLEN, "ok", None)
    per_sequence = grads()  # on the CPU: never the varlen path
    assert calls == [] and ag._VARLEN["ok"] is None
    monkeypatch.setattr(ag, "_use_varlen", lambda q: ag._VARLEN["ok"] is not False)
    monkeypatch.setattr(ag, "varlen_flash", packed_sdpa)
    monkeypatch.setattr(ag, "PACKED_BACKWARD", "sdpa_per_sequence")
    assert all(torch.equal(a, b) for a, b in zip(grads(), per_sequence)) and calls == []
    assert ag.packed_backward_path("cuda") == "sdpa_per_sequence"
    monkeypatch.setattr(ag, "PACKED_BACKWARD", "bogus")
    with pytest.raises(ValueError, match="PACKED_BACKWARD 'bogus'"):
        grads()
    monkeypatch.setattr(ag, "PACKED_BACKWARD", "auto")  # the default: varlen where there is a GPU
    for ours, ref in zip(grads(), per_sequence):
        assert float((ours.double() - ref.double()).norm() / ref.double().norm()) < 1e-2
    assert calls == [23] and ag._VARLEN["ok"] is True  # one call over the whole batch, the longest sequence 23
    assert ag.packed_backward_path("cuda") == "varlen_flash" and ag.packed_backward_path("cpu") == "sdpa_per_sequence"

    def broken(*args):
        raise RuntimeError("no flash kernel for this GPU")

    monkeypatch.setattr(ag, "varlen_flash", broken)
    monkeypatch.setitem(ag._VARLEN, "ok", None)
    with pytest.warns(RuntimeWarning, match="no flash kernel"):
        fallback = grads()
    assert ag._VARLEN["ok"] is False and all(torch.equal(a, b) for a, b in zip(fallback, per_sequence))
    assert ag.packed_backward_path("cuda") == "sdpa_per_sequence (varlen failed)"
    monkeypatch.setattr(ag, "varlen_flash", packed_sdpa)
    grads()  # not tried again in this process
    assert calls == [23]
