"""Attention family on the CPU (TRITON_INTERPRET=1, exact float64 dot): the structure of bitwise consistency.

These tests prove logic (same blocks, same order, same merges), not GPU bits or speed; those are measured by
`benchmarks/attention_gpu.py` (results under `results/attention/`).
"""

from __future__ import annotations

import importlib.util
import math
import random
import tempfile
from pathlib import Path
from types import ModuleType

import pytest
import torch
import yaml

from kernels.attention import FAMILY
from kernels.attention.family import reference
from tik_evo import interp
from tik_evo.knobs import read_knobs, write_knobs

REPO = Path(__file__).resolve().parents[2]
SMALL = FAMILY.check_cases("small")[0]
# Negative tests only need one decode position to differ: a smaller case keeps them fast.
TINY = {"batch": 1, "q_heads": 2, "kv_heads": 1, "head_dim": 64, "prompt": 40, "answer": 10, "scale": 1.0}
_TMP = Path(tempfile.mkdtemp(prefix="tik_attention_"))
_count = [0]


@pytest.fixture(scope="module", autouse=True)
def _interpreter():
    interp.install()


def load(source: str) -> ModuleType:
    """Import a candidate source from a real file (Triton needs one)."""
    _count[0] += 1
    path = _TMP / f"attention_cand_{_count[0]}.py"
    path.write_text(source)
    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def record_launches(mod: ModuleType, kernel: str, record) -> None:
    """Replace ``mod.<kernel>`` by a launcher that calls ``record(grid, kwargs)`` before each real launch."""
    real = getattr(mod, kernel)

    class Recorder:
        def __getitem__(self, grid):
            def launch(*args, **kw):
                record(grid, kw)
                return real[grid](*args, **kw)
            return launch

    setattr(mod, kernel, Recorder())


def with_knobs(source: str, **changes) -> str:
    return write_knobs(source, {**read_knobs(source), **changes})


def failed(results) -> list[str]:
    return [c.name for c in results if not c.passed]


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
    case = {"batch": 1, "q_heads": 2, "kv_heads": 1, "head_dim": 64, "prompt": 130, "answer": 20, "scale": 1.0}
    results = FAMILY.run_checks(load(src), case, 5, "cpu")
    assert not failed(results), failed(results)


@pytest.mark.parametrize("pack,loads,cpp", [(True, 8, 1), (False, 4, 2)])
def test_fused_merge_folds_in_the_last_program_without_a_merge_launch(pack, loads, cpp):
    # Up to five 16-token chunks per sequence in mixed-length batches, on 5 or 3 programs per row group: the last
    # to arrive folds the partials itself (the merge kernel raises if launched), with the same bits as the merge
    # launch, and leaves every arrival counter at zero for the next call. (The interpreter runs programs in order,
    # so arrivals out of order are checked on the GPU: benchmarks/attention_ws_smoke.py.)
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
    case = {"batch": 2, "q_heads": 4, "kv_heads": 2, "head_dim": 64, "prompt": 150, "answer": 20, "scale": 1.0}
    results = FAMILY.run_checks(mod, case, 6, "cpu")  # 3 row blocks x 8 heads: 24 tiles over 3 or 5 programs
    assert not failed(results), failed(results)


def test_auto_persistence_deals_small_launches_only():
    # "auto": snake programs while the tiles fit 8 waves over the SMs, one program per tile beyond; both
    # launches must agree with decode (checked through the family's cases with 2 "SMs": 16 tiles at most).
    mod = load(with_knobs(FAMILY.root_source(), BLOCK_N=32, SPLIT_TOKENS=64, BLOCK_M=64, FULL_PERSISTENT="auto"))
    mod._sm_count = lambda device: 2
    seen = set()
    record_launches(mod, "_prefill_kernel", lambda grid, kw: seen.add((len(grid), kw["PERSISTENT"])))
    small = {"batch": 1, "q_heads": 2, "kv_heads": 1, "head_dim": 64, "prompt": 100, "answer": 20, "scale": 1.0}
    big = {"batch": 2, "q_heads": 4, "kv_heads": 2, "head_dim": 64, "prompt": 200, "answer": 20, "scale": 1.0}
    for case in (small, big):  # 2 x 2 = 4 tiles (snake), 4 x 8 = 32 tiles (one program per tile)
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


def test_grid_workloads_are_valid():
    for name in ("attention_grid.yaml", "attention_heldout.yaml"):
        spec = yaml.safe_load((REPO / "workloads" / name).read_text())
        names = [w["name"] for w in spec["workloads"]]
        assert len(names) == len(set(names))
        for wl in spec["workloads"]:
            FAMILY.validate_workload(wl)
            assert wl["head_dim"] in (64, 128) and wl["q_heads"] % wl["kv_heads"] == 0
    grid = yaml.safe_load((REPO / "workloads" / "attention_grid.yaml").read_text())["workloads"]
    assert len(grid) == 48


def test_bench_needs_a_gpu(capsys):
    from kernels.attention import bench

    if torch.cuda.is_available():
        pytest.skip("a GPU is present")
    assert bench.main([]) == 2


def test_bench_names_a_kernel_file_it_cannot_use(tmp_path, capsys):
    # Checked before anything runs (and before the GPU check): a missing file, a file without KNOBS, a knob
    # outside the family's space.
    from kernels.attention import bench

    bad_knob = tmp_path / "bad_knob.py"
    bad_knob.write_text(with_knobs(FAMILY.root_source(), BLOCK_N=128).replace("'BLOCK_N': 128", "'BLOCK_N': 96"))
    no_knobs = tmp_path / "no_knobs.py"
    no_knobs.write_text("def prefill(): pass\n")
    for path, message in ((tmp_path / "missing.py", "No such file or directory"),
                          (no_knobs, "KNOBS"), (bad_knob, "BLOCK_N=96 is not one of [32, 64, 128]")):
        assert bench.main(["--kernel", str(path)]) == 2
        err = capsys.readouterr().err
        assert err.startswith(f"--kernel {path}: ") and message in err, err


def test_bench_grid_and_geomeans():
    from kernels.attention.bench import geomeans, grid_cells

    decode, prefill = grid_cells()
    assert len(decode) == 16 and len(prefill) == 32  # the paper grid: 16 decode, 16 prefill, 16 train_forward
    assert ("train_forward", 4, 4096 + 128) in prefill and (16, 8192) in decode
    rows = [{"phase": "decode", "cell": "a", "impl": "sdpa", "us": 10.0},
            {"phase": "decode", "cell": "a", "impl": "root", "us": 20.0},
            {"phase": "decode", "cell": "b", "impl": "sdpa", "us": 10.0},
            {"phase": "decode", "cell": "b", "impl": "root", "us": 2.5},
            {"phase": "prefill", "cell": "p", "impl": "sdpa_cudnn", "ms": 3.0},
            {"phase": "prefill", "cell": "p", "impl": "sdpa_flash", "ms": 1.0},
            {"phase": "prefill", "cell": "p", "impl": "root", "ms": 4.0},
            {"phase": "prefill", "cell": "q", "impl": "root", "error": "boom"}]
    g = geomeans(rows)
    assert g["decode"]["root"] == pytest.approx(math.sqrt(2)) and g["decode"]["root_cells"] == 2  # 0.5 and 4
    assert g["prefill"]["root"] == pytest.approx(0.75) and g["prefill"]["root_cells"] == 1  # cuDNN is the peer


def test_bench_graph_geomeans_beside_the_event_ones():
    from kernels.attention.bench import geomeans

    def row(cell, impl, ms, graph):  # graph: a graph time, or None for a failed capture
        phase = cell.split()[0]
        return {"phase": phase, "cell": cell, "impl": impl, "ms": ms,
                **({"graph_error": "RuntimeError('capture')"} if graph is None else {"graph_ms": graph})}

    rows = [row("prefill a", "sdpa_cudnn", 3.0, 2.0), row("prefill a", "root", 4.0, 2.0),  # event 0.75, graph 1
            row("prefill b", "sdpa_cudnn", 1.0, 1.0), row("prefill b", "root", 1.0, 0.25),  # event 1, graph 4
            row("prefill c", "sdpa_cudnn", 2.0, None), row("prefill c", "root", 2.0, 1.0),  # the peer's capture failed
            row("prefill d", "sdpa_cudnn", 1.0, 1.0), row("prefill d", "root", 2.0, None),  # ours failed
            row("prefill a", "nograph", 1.0, None), row("prefill b", "nograph", 1.0, None),
            # an older file's rows (no graph fields): event geomeans only, no graph key, nothing counted
            {"phase": "train_forward", "cell": "train_forward t", "impl": "sdpa_cudnn", "ms": 2.0},
            {"phase": "train_forward", "cell": "train_forward t", "impl": "root", "ms": 1.0},
            {"phase": "decode", "cell": "decode x", "impl": "sdpa", "us": 10.0},
            {"phase": "decode", "cell": "decode x", "impl": "root", "us": 5.0}]
    g = geomeans(rows)
    assert set(g) == {"prefill", "prefill_graph", "train_forward", "decode"}
    # The event geomeans are unchanged by the graph figures: all four cells, from "ms".
    assert g["prefill"]["root"] == pytest.approx((0.75 * 1 * 1 * 0.5) ** 0.25) and g["prefill"]["root_cells"] == 4
    assert "root_graph_errors" not in g["prefill"]
    # The graph geomean: cells a and b only; c (peer) and d (ours) failed capture, excluded and counted.
    assert g["prefill_graph"]["root"] == pytest.approx(2.0) and g["prefill_graph"]["root_cells"] == 2
    assert g["prefill_graph"]["root_graph_errors"] == 2
    assert "nograph" not in g["prefill_graph"] and g["prefill_graph"]["nograph_graph_errors"] == 2
    assert g["prefill"]["nograph"] == pytest.approx(math.sqrt(3.0)) and g["prefill"]["nograph_cells"] == 2
    assert g["train_forward"] == {"root": 2.0, "root_cells": 1}
    assert g["decode"] == {"root": 2.0, "root_cells": 1}


def test_bench_prints_graph_times_and_geomeans(capsys):
    from kernels.attention.bench import geomeans, print_table

    timings = [{"phase": "prefill", "cell": "prefill B1 S1024", "impl": "sdpa_cudnn", "ms": 0.05, "graph_ms": 0.036},
               {"phase": "prefill", "cell": "prefill B1 S1024", "impl": "root", "ms": 0.055, "graph_ms": 0.04},
               {"phase": "prefill", "cell": "prefill B1 S1024", "impl": "sync", "ms": 0.06, "graph_error": "x"},
               {"phase": "decode", "cell": "decode B1 ctx8192", "impl": "sdpa", "us": 16.9},
               {"phase": "decode", "cell": "decode B1 ctx8192", "impl": "root", "us": 14.6}]
    report = {"gpu": "H200", "torch": "2.11", "triton": "3.6", "ceilings": {"copy_TBps": 4.1,
              "bf16_matmul_TFLOPs": 700.0}, "consistency": {}, "timings": timings, "skipped": [],
              "geomean_speedup_vs_peer": geomeans(timings)}
    print_table(report)
    lines = capsys.readouterr().out.splitlines()
    i = next(n for n, line in enumerate(lines) if line.startswith("prefill B1 S1024"))
    assert lines[i].split("ms: ")[1] == "sdpa_cudnn=0.05 root=0.055 sync=0.06"  # the event line as before
    assert lines[i + 1].split("graph ms: ")[1] == "sdpa_cudnn=0.036 root=0.04 sync=ERR"
    assert not any("graph ms" in line for line in lines if line.startswith("decode")) and \
        sum("graph ms" in line for line in lines) == 1
    geo = {line.split()[2]: line for line in lines if line.startswith("geomean")}
    assert "root=0.909 over 1 cells" in geo["prefill"] and "sync=0.833 over 1 cells" in geo["prefill"]
    assert "root=0.900 over 1 cells" in geo["prefill_graph"]
    assert "sync=none, 1 without a graph time" in geo["prefill_graph"]
    assert "root=1.158 over 1 cells" in geo["decode"]


def test_bench_graph_plan_bounds_replays_of_long_cells():
    from kernels.attention import bench

    assert bench.graph_plan(0.037, 8) == {"calls": 20, "replays": 30, "warmup": 3}  # B1 1K: as decode's timing
    assert bench.graph_plan(60.0) == {"calls": 1, "replays": 5, "warmup": 1}  # B16 S16K: 7 calls, not 663
    assert bench.graph_plan(1.5, 2)["calls"] == 2  # every input set in each replay
    for ms in (0.01, 0.037, 0.3, 1.0, 2.9, 4.0, 9.0, 10.0, 15.0, 30.0, 60.0, 100.0):
        p = bench.graph_plan(ms)
        assert 1 <= p["calls"] <= 20 and 5 <= p["replays"] <= 30 and p["warmup"] >= 1
        executed = p["warmup"] + (p["warmup"] + p["replays"]) * p["calls"]  # side-stream warm-ups, then replays
        assert executed * ms <= max(120.0, 7 * ms), ms  # GPU time per implementation and cell
    # Extra input sets only while they fit the byte budget; the big cells (B16 S16K: 3 GB a set) get one.
    _, cells = bench.grid_cells()
    for _, B, S in cells:
        n = bench.n_prefill_sets(B, S)
        assert n == 1 or n * B * (bench.HQ + 2 * bench.HKV) * S * bench.D * 2 <= bench.PREFILL_SETS_BYTES
    assert bench.n_prefill_sets(1, 1024) == 8 and bench.n_prefill_sets(16, 16384) == 1


def test_bench_interleaves_a_cells_graph_replays_and_keeps_going_when_capture_fails(monkeypatch):
    # Each implementation is captured once with its own plan; the replays run in rounds whose order rotates, and
    # graph_ms is the median over rounds (so a clock drift during the cell does not favour whoever ran last).
    from kernels.attention import bench

    order, seqs = [], {"a": iter([5.0, 1.0, 3.0, 2.0, 4.0]), "c": iter([10.0] * 5)}

    def capture(fn, calls, warmup):
        for _ in range(calls):
            fn()
        return fn.name

    def replay(graph, replays, calls):
        order.append(graph)
        return next(seqs[graph])

    def job(name, fails=False):
        def fn(i):
            if fails:
                raise RuntimeError("operation not permitted when stream is capturing")
        return fn

    class Named:  # checks.rotate's result, named for the stubs
        def __init__(self, fn, n):
            self.fn, self.n, self.i, self.name = fn, n, 0, None

        def __call__(self):
            self.fn(self.i % self.n)
            self.i += 1

    def rotate(fn, idx):
        r = Named(fn, len(idx))
        r.name = names[id(fn)]
        return r

    fns = {"a": job("a"), "b": job("b", fails=True), "c": job("c")}
    names = {id(f): n for n, f in fns.items()}
    monkeypatch.setattr(bench, "capture_graph", capture)
    monkeypatch.setattr(bench, "replay_us", replay)
    monkeypatch.setattr(bench.checks, "rotate", rotate)
    rows = {n: {"impl": n} for n in fns}
    bench.interleaved_graph_fields([(rows["a"], fns["a"], 3, 0.3), (rows["b"], fns["b"], 1, 0.3),
                                    (rows["c"], fns["c"], 1, 2.0)], rounds=5)
    plan = bench.graph_plan(0.3, 3)
    assert rows["a"] == {"impl": "a", "graph_ms": 0.003, "graph_calls": plan["calls"],
                         "graph_replays": max(1, plan["replays"] // 5) * 5, "graph_rounds": 5,
                         "graph_round_ms": [0.005, 0.001, 0.003, 0.002, 0.004]}
    assert rows["c"]["graph_ms"] == 0.01 and rows["c"]["graph_calls"] == bench.graph_plan(2.0, 1)["calls"]
    assert "graph_ms" not in rows["b"] and "capturing" in rows["b"]["graph_error"]
    assert order == ["a", "c", "c", "a", "a", "c", "c", "a", "a", "c"]


def test_bench_time_prefill_adds_graph_times_beside_event_ones(monkeypatch):
    # time_prefill on the CPU, with SDPA's math backend for the peers and the two timers stubbed: the rows carry
    # both figures, a module that cannot be captured keeps its event figure, and the graph replays run on the
    # same input sets and output as the event timing.
    import contextlib
    from types import SimpleNamespace

    from kernels.attention import bench

    F = torch.nn.functional
    g = torch.Generator().manual_seed(0)
    sets = [tuple(torch.randn((1, h, 8, bench.D), generator=g, dtype=torch.bfloat16)
                  for h in (bench.HQ, bench.HKV, bench.HKV)) for _ in range(3)]
    state = {"capturing": False, "outs": set(), "inputs": set()}

    def sdpa(q, k, v, scale, out, syncs=False):
        if syncs and state["capturing"]:
            raise RuntimeError("syncs during capture")
        state["outs"].add(id(out))
        state["inputs"].add(id(q))
        out.copy_(F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=scale, enable_gqa=True))

    def capture_graph(fn, calls, warmup):  # the capture: the sets in turn, the last one's output left behind
        state["capturing"] = True
        try:
            for _ in range(calls):
                fn()
        finally:
            state["capturing"] = False
        return "graph"

    monkeypatch.setattr(bench, "prefill_sets", lambda B, S: sets)
    monkeypatch.setattr(bench, "_sdpa", lambda backend: contextlib.nullcontext())
    monkeypatch.setattr(bench, "_event_ms", lambda fn: (fn(), 0.5)[1])
    monkeypatch.setattr(bench, "capture_graph", capture_graph)
    monkeypatch.setattr(bench, "replay_us", lambda graph, replays, calls: 300.0)
    eager_calls = []
    monkeypatch.setattr(bench, "eager_us", lambda fn: (eager_calls.append(fn()), 42.0)[1])
    modules = {"ours": SimpleNamespace(prefill=sdpa),
               "syncs": SimpleNamespace(prefill=lambda *a: sdpa(*a, syncs=True))}
    rows, keep = [], {}
    bench.time_prefill(modules, "prefill", 1, 8, rows, keep=keep)
    by = {r["impl"]: r for r in rows}
    assert list(by) == ["sdpa_cudnn", "sdpa_flash", "ours", "syncs"]
    calls = bench.graph_plan(0.5, 3)["calls"]
    for name in ("sdpa_cudnn", "sdpa_flash", "ours"):
        assert by[name]["ms"] == 0.5 and by[name]["graph_ms"] == pytest.approx(0.3), name
        assert by[name]["graph_calls"] == calls and "graph_error" not in by[name]
    assert by["sdpa_cudnn"]["gqa_expanded"] is False
    assert by["syncs"]["ms"] == 0.5 and "graph_ms" not in by["syncs"] and "syncs" in by["syncs"]["graph_error"]
    # The error and the kept output are set 0's, though the graph capture left another set's output in `out`.
    assert by["ours"]["rel_l2_vs_sdpa"] == 0.0 and by["syncs"]["rel_l2_vs_sdpa"] == 0.0
    q, k, v = sets[0]
    assert torch.equal(keep["ours"], F.scaled_dot_product_attention(q, k, v, is_causal=True,
                                                                     scale=1 / math.sqrt(bench.D), enable_gqa=True))
    assert len(state["outs"]) == 1 and state["inputs"] == {id(s[0]) for s in sets}
    assert bench.geomeans(rows)["prefill_graph"] == {"ours": 1.0, "ours_cells": 1, "syncs_graph_errors": 1}
    # A short cell (0.5 ms by events, EAGER_MAX_MS) also gets its back-to-back time, the peers' too; a longer one not.
    assert all(by[n]["eager_us"] == 42.0 for n in by) and len(eager_calls) == 4
    assert bench.geomeans(rows)["prefill_eager"] == {"ours": 1.0, "ours_cells": 1, "syncs": 1.0, "syncs_cells": 1}
    monkeypatch.setattr(bench, "_event_ms", lambda fn: (fn(), bench.EAGER_MAX_MS * 2)[1])
    rows = []
    bench.time_prefill(modules, "prefill", 1, 8, rows)
    assert not any("eager_us" in r for r in rows) and len(eager_calls) == 4


def test_bench_decode_rows_carry_eager_times(monkeypatch):
    # time_decode on the CPU (SDPA for the peer and a stand-in decode), the graph timer stubbed: every row gets its
    # graph figure and its back-to-back figure, and the table prints both.
    from types import SimpleNamespace

    from kernels.attention import bench

    real = {name: getattr(torch, name) for name in ("Generator", "randn", "full", "empty")}
    # (bench.torch is torch: these stand-ins drop device="cuda" for the test's duration)
    monkeypatch.setattr(torch, "Generator", lambda device=None: real["Generator"]().manual_seed(0))
    for name in ("randn", "full", "empty"):
        monkeypatch.setattr(torch, name, lambda *a, device=None, _f=real[name], **k: _f(*a, **k))
    monkeypatch.setattr(bench, "graph_time_us", lambda fn, n_sets: (fn(0), 10.0)[1])
    monkeypatch.setattr(bench, "eager_us", lambda fn: (fn(), 30.0 if fn.func.__name__ == "peer" else 60.0)[1])
    ours = SimpleNamespace(decode=lambda q, k, v, lens, scale, out: out.zero_())
    rows = []
    bench.time_decode({"ours": ours}, 1, 64, rows)
    assert [(r["impl"], r["us"], r["eager_us"]) for r in rows] == [("sdpa", 10.0, 30.0), ("ours", 10.0, 60.0)]
    g = bench.geomeans(rows)
    assert g["decode"]["ours"] == 1.0 and g["decode_eager"]["ours"] == 0.5
    lines = bench.cell_lines("decode B1 ctx64", {r["impl"]: r for r in rows})
    assert lines == [f"{'decode B1 ctx64':28s} us: sdpa=10 ours=10", f"{'':28s} eager us: sdpa=30 ours=60"]


def test_named_bench_variants_use_declared_knob_values():
    # `tik-evo bench attention --variants NAME` runs these; a misspelt knob or value would time something else.
    from kernels.attention.bench import VARIANTS

    space = {k.name: k.values for k in FAMILY.knobs}
    for name, knobs in VARIANTS.items():
        for knob, value in knobs.items():
            assert knob in space and value in space[knob], (name, knob, value)
    # They are also the sets a campaign may start from (`start.set`), and `tik-evo check` validates that.
    assert FAMILY.named_sets() is VARIANTS
    from tik_evo.cli import main

    campaign = REPO / "campaigns" / "h200_attention.yaml"
    assert main(["check", str(campaign), "start.set=hopper_bn128_tree_s512"]) == 0


def test_bench_takes_the_best_of_a_run(tmp_path):
    from kernels.attention.bench import best_of
    from tik_evo.records import Implementation
    from tik_evo.store import Store

    source = with_knobs(FAMILY.root_source(), FULL_KV_LOADS="tma")
    for name, family, best in (("att", "attention", True), ("rms", "rmsnorm", True), ("new", "attention", False)):
        with Store.create(tmp_path / name) as store, store.transaction() as t:
            t.state["family"] = family
            t.put(Implementation("I0", t.put_source(source), [], "root", "best"))
            t.state["best"] = "I0" if best else None
    impl_id, text = best_of(tmp_path / "att")
    assert impl_id == "I0" and text == source
    with pytest.raises(SystemExit, match="family 'rmsnorm', not 'attention'"):
        best_of(tmp_path / "rms")
    with pytest.raises(SystemExit, match="no best implementation yet"):
        best_of(tmp_path / "new")


def _compile_report(knobs: list[dict], paths: str, head_dim: int = 128) -> list[dict]:
    """The offline sm_90a compile report of the root with each knob set, from one process."""
    import json
    import os
    import subprocess
    import sys

    root = Path(__file__).resolve().parents[2]
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    r = subprocess.run([sys.executable, str(root / "benchmarks" / "attention_compile_report.py"),
                        "--knobs", json.dumps(knobs), "--paths", paths, "--head-dim", str(head_dim)],
                       capture_output=True, text=True, env=env, timeout=900)
    assert r.returncode == 0, r.stderr[-2000:]
    reps = json.loads(r.stdout)
    assert len(reps) == len(knobs)
    return reps


def test_root_and_hopper_knobs_compile_for_hopper():
    # The interpreter never compiles; this catches sources that run on the CPU but do not build for sm_90a.
    sets = [({}, False), ({"FULL_SPLIT_LOOP": "flatten", "FULL_KV_LOADS": "tma", "DECODE_MERGE_LAUNCH": "pdl",
                           "DECODE_CHUNKS_PER_PROGRAM": 0, "DECODE_CHUNK_LOOP": "flatten", "DECODE_MERGE_LOADS": 8,
                           "DECODE_MERGE_ROWS": 1, "FULL_WS_PERSISTENT": "snake"}, True),
            ({"DECODE_FINISH_SINGLE": True}, False),
            ({"DECODE_MERGE_LAUNCH": "fused", "DECODE_MERGE_ROWS": 1, "DECODE_MERGE_LOADS": 8,
              "FULL_WS_CONSUMERS": 3}, False)]
    head_64 = ({"ROW_SUM": "tree", "FULL_WS_SCHEDULE": "serial", "FULL_WS_BUFFERS": 2, "FULL_WS_CONSUMERS": 3}, False)
    paths = "prefill,decode,merge,prefill_ws"
    reps = _compile_report([k for k, _ in sets], paths) + _compile_report([head_64[0]], paths, head_dim=64)
    for (knobs, tma), rep in zip(sets + [head_64], reps):
        for path in ("prefill", "decode", "prefill_ws"):
            assert rep[path]["HGMMA"] > 0 and rep[path]["spill_store_bytes"] == 0, (knobs, path, rep[path])
            assert 0 < rep[path]["shared_bytes"] <= 227 * 1024
        assert (rep["prefill"]["UTMALDG"] > 0) == tma
        assert rep["merge"]["LDG"] > 0 and rep["merge"]["spill_store_bytes"] == 0, rep["merge"]
        # The Gluon prefill: TMA loads and register budgets set per warp-specialised partition.
        assert rep["prefill_ws"]["UTMALDG"] > 0 and rep["prefill_ws"]["USETMAXREG"] > 0, rep["prefill_ws"]


def test_gluon_layout_free_row_sum_kernels_compile_for_hopper():
    # 128-key blocks with the dot or tree row sum: the Gluon prefill issues the ones dot (one more wgmma per block
    # and consumer) or the tree's adds, and the Gluon decode streams 64-key sub-blocks; nothing spills, and the
    # decode's default three slots leave room for two programs an SM. The tree case also folds its partials in
    # the kernel (the fused merge: an arrival counter, 8 partials loaded ahead on a 4-row tile), without a spill.
    cases = (("serial", "dot"), ("overlap", "dot"), ("serial", "tree"))
    sets = []
    for sched, row_sum in cases:
        knobs = {"BLOCK_N": 128, "ROW_SUM": row_sum, "SPLIT_TOKENS": 1024, "FULL_WS_SCHEDULE": "serial",
                 "FULL_NUM_STAGES": 2, "DECODE_WS_SCHEDULE": sched}
        if row_sum == "tree":
            knobs.update(DECODE_MERGE_LAUNCH="fused", DECODE_MERGE_LOADS=8, DECODE_MERGE_ROWS=1)
        sets.append(knobs)
    reps = dict(zip(cases, _compile_report(sets, "prefill,prefill_ws,decode_ws")))
    for (_sched, row_sum), rep in reps.items():
        ws, dec = rep["prefill_ws"], rep["decode_ws"]
        assert ws["spill_store_bytes"] == 0 and ws["HGMMA"] > 0 and ws["shared_bytes"] <= 227 * 1024, ws
        assert dec["spill_store_bytes"] == 0 and dec["UTMALDG"] > 0 and dec["USETMAXREG"] > 0, dec
        assert (dec["ATOM"] > 0) == (row_sum == "tree"), dec  # only the fused merge counts arrivals
        assert rep["prefill"]["shared_bytes"] <= 227 * 1024  # three Triton stages would not fit here
    assert 2 * (reps["serial", "dot"]["decode_ws"]["shared_bytes"] + 1024) <= 228 * 1024
    assert reps["overlap", "dot"]["decode_ws"]["HGMMA"] > reps["serial", "dot"]["decode_ws"]["HGMMA"]  # + prologue
    # the tree needs no ones product: fewer wgmmas than the dot in both kernels
    for path in ("prefill_ws", "decode_ws"):
        assert reps["serial", "tree"][path]["HGMMA"] < reps["serial", "dot"][path]["HGMMA"], path
    # FULL_WS_DIAG "half": the lower consumer's diagonal block as its own 64-key QK^T (8 k-steps over head dim 128)
    # and PV (4 k-steps over 64 keys), beside the loop's; no spill with the loader's registers at 24 (as measured;
    # at the default 40 the consumers spill 48 bytes).
    # The overlapped schedule at 128-key blocks spills in registers (444 bytes with the accumulator there); with
    # the merged accumulator in shared memory (FULL_WS_ACC) it does not, and the block still fits.
    half = {"BLOCK_N": 128, "ROW_SUM": "tree", "SPLIT_TOKENS": 1024, "FULL_WS_SCHEDULE": "serial",
            "FULL_NUM_STAGES": 2, "FULL_WS_DIAG": "half", "NORMALIZE": "reciprocal", "FULL_WS_LOADER_REGS": 24}
    overlap = {**half, "FULL_WS_SCHEDULE": "overlap", "FULL_WS_DIAG": "full", "FULL_WS_ACC": "shared",
               "FULL_WS_STORE": "tma"}
    ws_half, ws_overlap = (rep["prefill_ws"] for rep in _compile_report([half, overlap], "prefill_ws"))
    assert ws_half["spill_store_bytes"] == 0, ws_half
    assert ws_half["HGMMA"] == reps["serial", "tree"]["prefill_ws"]["HGMMA"] + 12, ws_half
    assert ws_overlap["spill_store_bytes"] == 0 and ws_overlap["shared_bytes"] <= 227 * 1024, ws_overlap


def test_gluon_decode_plan_never_starves_its_ring():
    # A 128-key block holds two 64-key slots until its PV is done, and the overlapped schedule also needs the next
    # block's K tiles by then: fewer slots than that deadlock the loader against the consumer (seen on the GPU).
    for bn, sched, bufs, dim, want in ((128, "serial", 3, 128, (3, 128)), (128, "overlap", 3, 128, (4, 168)),
                                       (128, "overlap", 2, 64, (4, 128)), (64, "overlap", 2, 128, (2, 128)),
                                       (128, "serial", 2, 128, (2, 128)), (128, "serial", 6, 128, (6, 168))):
        mod = load(with_knobs(FAMILY.root_source(), DECODE_WS_SCHEDULE=sched, DECODE_WS_BUFFERS=bufs))
        slots, regs = mod._dec_plan(bn, dim)
        assert (slots, regs) == want, (bn, sched, bufs, dim, slots, regs)
        assert slots >= bn // 64 * (2 if sched == "overlap" else 1)
        # registers: two programs of two warpgroups fit the SM's 65,536 only at 128 a thread
        smem = slots * 2 * 64 * dim * 2 + mod.DEC_FIXED_SMEM + 1024
        assert (regs == mod.DEC_MAXNREG) == (2 * smem <= 228 * 1024)
        assert regs * 256 * (2 if regs == mod.DEC_MAXNREG else 1) <= 65536


def test_decode_waves_chunk_assignment():
    # DECODE_CHUNKS_PER_PROGRAM "waves": one program an SM (the Gluon decode at 4 slots) streams a whole batch's
    # chunks in one wave where a wave holds them, and never leaves chunks without a program.
    mod = load(FAMILY.root_source())
    for B, n_chunks, per_sm, want in ((16, 8, 1, 8), (4, 8, 1, 2), (1, 8, 1, 1), (8, 4, 1, 2), (16, 3, 1, 4),
                                      (16, 8, 2, 4), (1, 1, 1, 1), (64, 8, 1, 8)):
        cpp = mod._waves_cpp(n_chunks, B * 8, per_sm, 132)
        assert cpp == want, (B, n_chunks, per_sm, cpp)
        assert -(-n_chunks // cpp) * cpp >= n_chunks and cpp < 2 * n_chunks
    # a path choice: the same bits as one chunk a program (mixed lengths, more chunks than programs)
    g = torch.Generator().manual_seed(2)
    q = torch.randn((2, 4, 1, 64), generator=g).to(torch.bfloat16)
    k = torch.randn((2, 2, 300, 64), generator=g).to(torch.bfloat16)
    v = torch.randn((2, 2, 300, 64), generator=g).to(torch.bfloat16)
    ctx = torch.tensor([300, 129], dtype=torch.int32)
    outs = []
    for cpp in (1, "waves"):
        out = torch.empty_like(q)
        load(with_knobs(FAMILY.root_source(), SPLIT_TOKENS=64, DECODE_CHUNKS_PER_PROGRAM=cpp)).decode(
            q, k, v, ctx, 0.125, out)
        outs.append(out)
    assert torch.equal(outs[0].view(torch.int16), outs[1].view(torch.int16))


def test_gluon_decode_falls_back_to_triton_where_it_does_not_apply():
    # The Gluon decode needs a Hopper GPU (and GQA packing, a dot row sum at 128-key blocks); elsewhere DECODE_IMPL
    # runs the Triton kernel, with the same bits.
    g = torch.Generator().manual_seed(1)
    q = torch.randn((2, 4, 1, 64), generator=g).to(torch.bfloat16)
    k = torch.randn((2, 2, 200, 64), generator=g).to(torch.bfloat16)
    v = torch.randn((2, 2, 200, 64), generator=g).to(torch.bfloat16)
    ctx = torch.tensor([200, 77], dtype=torch.int32)
    want = torch.empty_like(q)
    load(FAMILY.root_source()).decode(q, k, v, ctx, 0.125, want)
    mod = load(with_knobs(FAMILY.root_source(), DECODE_IMPL="gluon_ws"))
    assert mod._dec_covers(q, k, v) is False
    assert load(with_knobs(FAMILY.root_source(), DECODE_IMPL="gluon_ws", BLOCK_N=128, ROW_SUM="tree")) \
        ._dec_covers(q, k, v) is False  # (a CPU tensor)
    got = torch.empty_like(q)
    mod.decode(q, k, v, ctx, 0.125, got)
    assert torch.equal(got.view(torch.int16), want.view(torch.int16))


def test_gluon_prefill_shared_memory_plan():
    # Three consumers keep their merged accumulators (padded rows) in shared memory; at head dim 128 that leaves
    # room for one query tile and two K/V slots, and every plan must fit a Hopper block.
    for cons, dim, split, want in ((2, 128, 1024, (2, 2, False, 4)), (2, 64, 512, (2, 2, False, 4)),
                                   (3, 128, 1024, (3, 1, True, 2)), (3, 64, 512, (3, 2, True, 4)),
                                   (3, 128, 0, (3, 2, False, 4))):
        mod = load(with_knobs(FAMILY.root_source(), FULL_WS_CONSUMERS=cons))
        plan = mod._ws_plan(64, dim, split)
        assert plan == want, (cons, dim, split, plan)
        _, q_tiles, acc_smem, slots = plan
        used = q_tiles * cons * 64 * dim * 2 + slots * 2 * 64 * dim * 2 + (cons * 64 * (dim + 4) * 4 if acc_smem else 0)
        assert used <= mod.WS_SMEM_BYTES - 1024
        # Every register split fits the launch's budget (setmaxnreg.inc waits for registers that never come
        # otherwise) and is a multiple of 8 in setmaxnreg's range.
        for loader_knob in FAMILY.knob("FULL_WS_LOADER_REGS").values:
            regs, loader, launch = load(with_knobs(FAMILY.root_source(), FULL_WS_CONSUMERS=cons,
                                                   FULL_WS_LOADER_REGS=loader_knob))._ws_regs(cons)
            assert cons * regs + loader <= launch * (cons + 1) and launch * 32 * 4 * (cons + 1) <= 65536
            assert all(r % 8 == 0 and 24 <= r <= 256 for r in (regs, loader)), (cons, loader_knob, regs, loader)
    assert load(with_knobs(FAMILY.root_source(), FULL_WS_LOADER_REGS=24))._ws_regs(2) == (240, 24, 168)
    # One query tile gives its room to K/V slots: 128-key blocks at head dim 128 get a third slot, and it fits.
    for q_tiles, want in ((2, (2, 2, False, 2)), (1, (2, 1, False, 3))):
        mod = load(with_knobs(FAMILY.root_source(), FULL_WS_QUERY_TILES=q_tiles))
        plan = mod._ws_plan(128, 128, 1024)
        assert plan == want, (q_tiles, plan)
        assert plan[1] * 2 * 64 * 128 * 2 + plan[3] * 2 * 128 * 128 * 2 <= mod.WS_SMEM_BYTES - 1024
    # FULL_WS_ACC "shared" with two consumers: at 128-key blocks and head dim 128 the two padded accumulators fit
    # beside one query tile and two K/V slots; without a split there is no merged accumulator to keep.
    for dim, split, want in ((128, 1024, (2, 1, True, 2)), (64, 512, (2, 2, True, 4)), (128, 0, (2, 2, False, 2))):
        mod = load(with_knobs(FAMILY.root_source(), FULL_WS_ACC="shared"))
        plan = mod._ws_plan(128 if dim == 128 else 64, dim, split)
        assert plan == want, (dim, split, plan)
    # A plan that does not fit is Triton's OutOfResources, which the audit files as "resources" (campaign 6 drew
    # 128-key blocks with three consumers twice).
    from tik_evo.worker import error_kind

    mod = load(with_knobs(FAMILY.root_source(), FULL_WS_CONSUMERS=3))
    with pytest.raises(Exception) as e:
        mod._ws_plan(128, 128, 1024)
    assert error_kind(e.value) == "resources" and e.value.required > mod.WS_SMEM_BYTES, e.value


def test_gluon_prefill_head_bands():
    # A band holds whole GQA groups, divides the launch's heads and, unless it is all of them, makes the knob's
    # rounds of programs; off keeps every head in one band (the unbanded snake).
    assert load(FAMILY.root_source())._ws_band(128, 32, 4, 132) == 32
    for rounds, n_m, bh, group, want in ((8, 128, 32, 4, 16), (4, 128, 32, 4, 8), (8, 32, 128, 4, 64),
                                         (4, 33, 64, 4, 16), (8, 8, 128, 4, 128), (4, 64, 24, 8, 24),
                                         (4, 128, 24, 8, 8)):
        band = load(with_knobs(FAMILY.root_source(), FULL_WS_BANDS=rounds))._ws_band(n_m, bh, group, 132)
        assert band == want, (rounds, n_m, bh, group, band)
        assert bh % band == 0 and band % group == 0 and (band == bh or n_m * band >= rounds * 132)


def test_gluon_prefill_falls_back_to_triton_where_it_does_not_apply():
    # The Gluon prefill needs a Hopper GPU; elsewhere (here: the interpreter on the CPU) FULL_IMPL runs the Triton
    # kernel, with the same bits as the root.
    g = torch.Generator().manual_seed(0)
    q = torch.randn((1, 4, 128, 64), generator=g).to(torch.bfloat16)
    k = torch.randn((1, 2, 128, 64), generator=g).to(torch.bfloat16)
    v = torch.randn((1, 2, 128, 64), generator=g).to(torch.bfloat16)
    want = torch.empty_like(q)
    load(FAMILY.root_source()).prefill(q, k, v, 0.125, want)
    for impl in ("gluon_ws", "auto"):
        mod = load(with_knobs(FAMILY.root_source(), FULL_IMPL=impl))
        assert mod._ws_prefill(q, k, v, 0.125, torch.empty_like(q), None) is False
        got = torch.empty_like(q)
        mod.prefill(q, k, v, 0.125, got)
        assert torch.equal(got.view(torch.int16), want.view(torch.int16)), impl


def test_gluon_kernels_need_contiguous_aligned_tensors_the_output_included():
    # The Gluon prefill addresses q, k, v and (FULL_WS_STORE "tma") its output through TMA descriptors: a
    # misaligned or strided output sends the launch to the Triton kernel instead of faulting.
    mod = load(FAMILY.root_source())
    buf = torch.empty(2 * 4 * 128 * 64 + 8, dtype=torch.bfloat16)
    aligned = buf[:4 * 128 * 64].view(1, 4, 128, 64)
    shifted = buf[1:1 + 4 * 128 * 64].view(1, 4, 128, 64)  # 2 bytes past a 16-byte boundary
    strided = torch.empty((1, 128, 4, 64), dtype=torch.bfloat16).transpose(1, 2)
    assert mod._tma_ready(aligned, aligned)
    assert not mod._tma_ready(aligned, shifted) and not mod._tma_ready(strided)


def test_light_descriptor_keys_like_the_triton_descriptor_it_stands_for():
    from tik_evo import launch

    mod = load(FAMILY.root_source())
    k = torch.zeros(2, 4, 40, 64, dtype=torch.bfloat16)
    light = mod._Desc(k, (8, 40, 64), (40 * 64, 64, 1), (1, 64, 64))
    full = light.full()  # Triton's own object, validated
    assert isinstance(full, mod.TensorDescriptor) and full.base is k and list(full.shape) == [8, 40, 64]
    assert launch.arg_key(light) == launch.arg_key(full)
    # Anything the launcher encodes is in the key: the block, the geometry, the base's alignment.
    assert launch.arg_key(mod._Desc(k, (8, 40, 64), (40 * 64, 64, 1), (1, 128, 64))) != launch.arg_key(light)
    assert launch.arg_key(mod._Desc(k, (8, 41, 64), (41 * 64, 64, 1), (1, 64, 64))) != launch.arg_key(light)
    flat = k.flatten()
    assert launch.arg_key(mod._Desc(flat[1:], (8, 40, 64), (40 * 64, 64, 1), (1, 64, 64)))[1] is False
    # Triton's path gets real descriptors; the fast path passes the light ones through.
    assert [type(a) for a in launch._full((light, 3, k))] == [mod.TensorDescriptor, int, torch.Tensor]


def test_host_helpers_match_triton():
    import triton

    mod = load(FAMILY.root_source())
    assert all(mod._pow2(n) == triton.next_power_of_2(n) for n in range(0, 600))
    assert all(mod._cdiv(a, b) == triton.cdiv(a, b) for a in range(0, 300) for b in range(1, 70))


def test_autograd_forward_is_the_kernels_and_gradients_match_the_reference(tmp_path):
    # The differentiable call: the forward is the kernel file's prefill, bit for bit; the gradients (SDPA's,
    # recomputed) agree with fp64 autograd of the reference on a GQA case with a length no block divides.
    from kernels.attention.autograd import attention, load_kernel

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
