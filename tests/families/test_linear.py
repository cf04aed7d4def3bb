"""linear family under TRITON_INTERPRET=1 on the CPU: consistency structure, knob variants, backward, a caught
mismatch. The interpreter's dot is exact (tik_evo.interp), so a different K order in one path shows up."""

from pathlib import Path
from types import SimpleNamespace

import _family
import pytest

from tik_evo_kernels.linear import FAMILY

_load, failures = _family.loader(FAMILY)


def load(tag="root", source_edit=None, **knobs):
    # The CPU cases have K <= 1088 and the root splits only weights of K >= 4096: a test that sets K_CHUNK
    # means a split at these sizes unless it says otherwise.
    if "K_CHUNK" in knobs:
        knobs = {"K_CHUNK_MIN_K": 0, "K_CHUNK_SHORT": 0, **knobs}
    return _load(tag, source_edit, **knobs)


def test_root_passes_all_cases():
    impl = load()
    assert failures(impl) == []
    assert failures(impl, seeds=(1,), cases=FAMILY.check_cases("small")) == []


@pytest.mark.parametrize("knobs", [
    {"K_CHUNK": 512, "DECODE_BLOCK_M": 16, "DECODE_BLOCK_N": 32, "DECODE_USE_TMA": False},
    {"K_CHUNK": 512, "FULL_SPLIT_PARALLEL": True, "DECODE_SPLIT_PARALLEL": False, "FULL_BLOCK_M": 64,
     "FULL_BLOCK_N": 256, "FULL_GROUP_M": 1},
    # Persistent full path (4 "SMs" on the CPU): 37 x 96 in 32 x 32 tiles is 6 tiles, so programs take two.
    {"FULL_PERSISTENT": "all", "FULL_BLOCK_M": 32, "FULL_BLOCK_N": 32, "FULL_GROUP_M": 4, "FULL_SHORT_K": 0},
    {"FULL_PERSISTENT": "all", "K_CHUNK": 512, "FULL_BLOCK_M": 32, "FULL_BLOCK_N": 64},
    # Chunks as (tile, chunk) items of the persistent loop: k = 1088 in two chunks of 17 32-column steps.
    {"FULL_PERSISTENT": "all", "FULL_PERSISTENT_MAX_CHUNKS": 2, "BLOCK_K": 32, "K_CHUNK": 544, "FULL_BLOCK_M": 32,
     "FULL_BLOCK_N": 32, "FULL_GROUP_M": 4, "DECODE_SPLIT_PARALLEL": False},
    # Unsplit full-path launches in 128x128 tiles (the root takes 128x256), or in one persistent 256x128 tile,
    # where the K 1088 case splits at 544 and keeps 32x32.
    {"FULL_UNSPLIT_TILE": "same"},
    # Equal chunks: k = 1088 (34 steps of 32) in two of 544 instead of 1024 + 64, run as persistent items.
    {"K_CHUNK": 1024, "K_CHUNK_EQUAL": True, "BLOCK_K": 32, "FULL_PERSISTENT": "all", "FULL_BLOCK_M": 32,
     "FULL_BLOCK_N": 32, "DECODE_SPLIT_PARALLEL": True},
    # Persistent (tile, chunk) items in the wide tile too, the chunk total in registers.
    {"FULL_CHUNKED_WIDE": "on", "FULL_PERSISTENT": "all", "FULL_PERSISTENT_MAX_CHUNKS": 2, "BLOCK_K": 32,
     "K_CHUNK": 544, "DECODE_SPLIT_PARALLEL": False},
    {"FULL_UNSPLIT_TILE": "256x128", "K_CHUNK": 544, "BLOCK_K": 32, "K_CHUNK_MIN_K": 1024, "FULL_BLOCK_M": 32,
     "FULL_BLOCK_N": 32},
])
def test_knob_variants_pass(knobs):
    tag = "v" + str(abs(hash(tuple(sorted(knobs.items())))))
    assert failures(load(tag, **knobs)) == []


@pytest.mark.parametrize("knobs", [
    {"DECODE_BLOCK_N": 16, "DECODE_K_UNROLL": 4, "DECODE_SMALL_M": 4, "DECODE_SMALL_BLOCK_N": 8,
     "DECODE_SMALL_K_UNROLL": 8, "DECODE_SMALL_NUM_WARPS": 1},
    {"DECODE_BLOCK_M": 16, "DECODE_BLOCK_N": 16, "DECODE_K_UNROLL": 8, "DECODE_USE_TMA": False},
    {"K_CHUNK": 512, "DECODE_BLOCK_N": 32, "DECODE_K_UNROLL": 2},
    {"DECODE_SMALL_M": 1, "DECODE_FULL_TILES_M": 8, "DECODE_BLOCK_N": 32, "FULL_BLOCK_M": 32, "FULL_BLOCK_N": 64},
    {"K_CHUNK": 512, "FULL_CHUNK_LOOP": "flat", "DECODE_SPLIT_MAX_M": 4, "DECODE_CHUNK_LOOP": "flat"},
    {"K_CHUNK": 512, "FULL_CHUNK_LOOP": "flat", "FULL_USE_TMA": False, "DECODE_SPLIT_PARALLEL": False,
     "DECODE_K_UNROLL": 4},
    {"K_CHUNK": 512, "K_CHUNK_MIN_K": 1024, "DECODE_FULL_TILES_M": 8, "DECODE_FULL_TILES_MIN_PROGRAMS": 64,
     "FULL_BLOCK_M": 32, "FULL_BLOCK_N": 64, "FULL_CHUNK_LOOP": "flat", "FULL_SHORT_K": 2048,
     "FULL_SHORT_K_NUM_STAGES": 2, "FULL_NUM_STAGES": 5},
    # n = 80 in 16-column small tiles: 5 tiles, so chunks fold in-program at 4 and run in parallel at 8.
    {"K_CHUNK": 512, "DECODE_SPLIT_MAX_TILES": 4, "DECODE_SMALL_BLOCK_N": 16, "DECODE_CHUNK_LOOP": "unrolled"},
    {"K_CHUNK": 512, "DECODE_SPLIT_MAX_TILES": 8, "DECODE_SMALL_BLOCK_N": 16, "FULL_CHUNK_LOOP": "flat"},
    # k = 1088 <= K_CHUNK takes the short chunks (512, 512, 64), k = 200 < K_CHUNK_MIN_K stays whole.
    {"K_CHUNK": 2048, "K_CHUNK_SHORT": 512, "K_CHUNK_MIN_K": 1024, "FULL_CHUNK_LOOP": "flat"},
    # Stages per launch (the depth that fits the launch in the fewest waves of the CPU's 4 "SMs").
    {"DECODE_NUM_STAGES": 0, "DECODE_BLOCK_M": 16, "DECODE_BLOCK_N": 16, "DECODE_SMALL_M": 1},
])
def test_unrolled_decode_variants_pass(knobs):
    # k = 200: 4 tiles, the last one partial (inside a group of 4, a leftover for 8); k = 1088: 17 tiles, groups
    # plus a leftover (with K_CHUNK 512: chunks of 8, 8 and 1 tiles). Decode launches have 1, 3 and 9 rows: with
    # DECODE_SMALL_M 4 both decode schedules run (all three with DECODE_FULL_TILES_M 8). Decode-only knobs: the
    # backward is skipped.
    impl = load("u" + str(abs(hash(tuple(sorted(knobs.items()))))), **knobs)
    paths = SimpleNamespace(linear_full=impl.linear_full, linear_decode=impl.linear_decode)
    assert failures(paths, cases=FAMILY.check_cases("full")[1:]) == []


@pytest.mark.parametrize("full_knobs,decode_knobs", [
    ({"BLOCK_K": 64}, {"BLOCK_K": 32}),
    ({"K_CHUNK": 0}, {"K_CHUNK": 512}),
    ({"K_CHUNK": 512, "K_CHUNK_MIN_K": 4096}, {"K_CHUNK": 512}),
    ({"K_CHUNK": 2048, "K_CHUNK_SHORT": 512}, {"K_CHUNK": 2048}),
])
def test_contract_mismatch_is_caught(full_knobs, decode_knobs):
    impl = _family.split_paths(load("mf", **full_knobs), load("md", **decode_knobs))
    case = [c for c in FAMILY.check_cases("full") if c["k"] > 512]
    bad = failures(impl, cases=case)
    assert any(kind == "consistency" and name.startswith("decode == full") for name, kind, _ in bad), bad
    assert all(kind == "consistency" for _, kind, _ in bad)


def test_flat_chunks_equal_unrolled_chunks():
    # The flat loop must give the unrolled chunks' bits: full path flat against decode unrolled (in-program), and
    # the reverse. k = 1088 with K_CHUNK 512: chunks of 8, 8 and 1 tiles, the last fold at K, not at a boundary.
    case = [c for c in FAMILY.check_cases("full") if c["k"] > 512]
    common = {"K_CHUNK": 512, "DECODE_SPLIT_PARALLEL": False}
    flat = load("flat_both", **common, FULL_CHUNK_LOOP="flat", DECODE_CHUNK_LOOP="flat")
    unrolled = load("unrolled_both", **common)
    assert failures(_family.split_paths(flat, unrolled), cases=case) == []
    assert failures(_family.split_paths(unrolled, flat), cases=case) == []


def test_flat_chunk_fold_at_wrong_boundary_is_caught():
    # Folding after the first tile of each chunk instead of its last regroups the sums: decode (parallel chunks)
    # must then differ from the flat full path.
    def early_fold(src):
        assert src.count("k_next % K_CHUNK == 0") == 1
        return src.replace("k_next % K_CHUNK == 0", "k_next % K_CHUNK == 64")  # BLOCK_K 64: after a chunk's first tile

    impl = load("flat_early", early_fold, K_CHUNK=512, FULL_CHUNK_LOOP="flat")
    bad = failures(impl, cases=[c for c in FAMILY.check_cases("full") if c["k"] > 512])
    assert any(kind == "consistency" and name.startswith("decode == full") for name, kind, _ in bad), bad


def test_unrolled_decode_out_of_order_is_caught():
    # The unrolled group's dots applied in descending k: decode must no longer equal the full path.
    def reverse(src):
        assert src.count("k0 + u * BLOCK_K") == 2
        return src.replace("k0 + u * BLOCK_K", "k0 + (UNROLL - 1 - u) * BLOCK_K")

    impl = load("unroll_rev", reverse, DECODE_K_UNROLL=4)
    bad = failures(impl, cases=[c for c in FAMILY.check_cases("full") if c["k"] > 512])
    assert any(kind == "consistency" and name.startswith("decode == full") for name, kind, _ in bad), bad
    assert all(kind == "consistency" for _, kind, _ in bad)


def test_workloads_validate():
    import yaml

    spec = yaml.safe_load((Path(__file__).parents[2] / "workloads" / "linear_models.yaml").read_text())
    assert spec["family"] == "linear"
    names = [w["name"] for w in spec["workloads"]]
    assert len(names) == len(set(names))
    for w in spec["workloads"]:
        FAMILY.validate_workload(w)


def test_root_schedule_follows_the_launch_shape():
    # Schedule choices (no bits depend on them) as the root makes them at model shapes: full tiles for large
    # decode batches only when they fill the GPU, parallel K chunks only for weights with K > K_CHUNK and decode
    # launches of at most 128 rows, the pipeline depth of the full path by K.
    sch = load()._schedule
    qkv256, o256 = sch(256, 6144, 2560, "DECODE"), sch(256, 2560, 4096, "DECODE")
    assert (qkv256["bm"], qkv256["bn"], qkv256["warps"]) == (128, 128, 8)  # 96 programs
    assert (o256["bm"], o256["bn"]) == (64, 128)  # 128x128: 40 programs; 64x64: 160, two waves of 132
    o64 = sch(64, 2560, 4096, "DECODE")  # the o weight's two 2048-column chunks in parallel: 80 programs
    assert (o64["bn"], o64["n_chunks"], o64["parallel"]) == (64, 2, True)
    assert sch(64, 6144, 2560, "DECODE")["bn"] == 64  # 96 programs already
    down256 = sch(256, 2560, 9728, "DECODE")
    assert not down256["parallel"] and down256["n_chunks"] == 3 and down256["bn"] == 128  # 80 tiles in-program
    assert sch(128, 2560, 9728, "DECODE")["parallel"]
    one = sch(1, 2560, 9728, "DECODE")
    assert one["parallel"] and one["bm"] == 16 and one["unroll"] == 4
    assert sch(4096, 2560, 9728, "FULL")["flat"] and sch(4096, 2560, 9728, "FULL")["stages"] == 5
    qkv = sch(4096, 6144, 2560, "FULL")  # unsplit: the 128x256 tile, persistent, 4 stages
    assert (qkv["bm"], qkv["bn"], qkv["stages"], qkv["n_chunks"]) == (128, 256, 4, 1)
    # Persistent programs for unsplit launches and the deep-pipeline launches of the full path of at most two
    # equal K chunks (o: K 4096 in two 2048-column chunks; down: three chunks, the flat loop).
    assert [sch(4096, n, k, "FULL")["persistent_per_sm"] for n, k in ((2560, 4096), (6144, 2560), (2560, 9728))] \
        == [1, 1, 0]
    assert load("s", FULL_UNSPLIT_TILE="same")._schedule(4096, 6144, 2560, "FULL")["stages"] == 3  # short K
    assert sch(256, 2560, 4096, "DECODE")["persistent_per_sm"] == 0


def test_short_chunks_follow_the_weight_only():
    impl = load("ks", K_CHUNK=4096, K_CHUNK_MIN_K=4096, K_CHUNK_SHORT=2048)
    assert [impl._k_chunk(k) for k in (2560, 4096, 9728)] == [0, 2048, 4096]
    for m in (1, 64, 256, 4096):  # the rows never change it
        assert impl._schedule(m, 2560, 4096, "DECODE")["k_chunk"] == impl._schedule(m, 2560, 4096, "FULL")["k_chunk"]


def test_equal_chunks_follow_the_weight_only():
    # K 9728 (152 steps of 64) splits into four equal chunks, llama's 14336 into four of 3584; o keeps its two
    # 2048-column chunks and the K 2560 weights stay whole. With four items a tile, the down projection's full
    # path runs the persistent loop.
    impl = load("eq", K_CHUNK=4096, K_CHUNK_MIN_K=4096, K_CHUNK_SHORT=2048, K_CHUNK_EQUAL=True,
                FULL_PERSISTENT_MAX_CHUNKS=4)
    assert [impl._k_chunk(k) for k in (2560, 4096, 9728, 14336)] == [0, 2048, 2432, 3584]
    assert impl._schedule(6144, 2560, 9728, "FULL")["persistent_per_sm"] == 1
    assert load("ne", K_CHUNK=4096, K_CHUNK_MIN_K=4096)._k_chunk(9728) == 4096
    # No equal split within twice the chunk count (17 steps of 64: prime) keeps the plain width.
    assert load("eq17", K_CHUNK=512, K_CHUNK_EQUAL=True)._k_chunk(1088) == 512


def test_persistent_chunks_take_only_short_splits():
    # With the o weight (K 4096) in two 2048-column chunks, its full path stays persistent at
    # FULL_PERSISTENT_MAX_CHUNKS 2; the down projection's three 4096-column chunks keep the flat loop.
    sch = load("pc", K_CHUNK=4096, K_CHUNK_MIN_K=4096, K_CHUNK_SHORT=2048, FULL_PERSISTENT_MAX_CHUNKS=2)._schedule
    o, down = sch(4096, 2560, 4096, "FULL"), sch(4096, 2560, 9728, "FULL")
    assert (o["n_chunks"], o["persistent_per_sm"]) == (2, 1)
    assert load("pc3", K_CHUNK=544, BLOCK_K=32, FULL_PERSISTENT="all", FULL_PERSISTENT_MAX_CHUNKS=2)._schedule(
        67, 80, 1088, "FULL")["persistent_per_sm"] > 0  # the knob variant above runs the item loop
    assert (down["n_chunks"], down["persistent_per_sm"], down["flat"]) == (3, 0, True)
    assert load("pc1", K_CHUNK=4096, K_CHUNK_MIN_K=4096, K_CHUNK_SHORT=2048, FULL_PERSISTENT_MAX_CHUNKS=1)._schedule(
        4096, 2560, 4096, "FULL")["persistent_per_sm"] == 0


def test_unsplit_tile_takes_only_one_chunk_full_launches():
    # qkv and gate_up (K 2560) are unsplit: 128x256, 8 warps, persistent one per SM (not the short-K two);
    # o (K 4096 in two chunks) keeps 128x128 without FULL_CHUNKED_WIDE, and decode never sees the knob.
    sch = load("ut", FULL_UNSPLIT_TILE="128x256", FULL_UNSPLIT_NUM_STAGES=4, FULL_CHUNKED_WIDE="off")._schedule
    qkv, o = sch(16384, 6144, 2560, "FULL"), sch(16384, 2560, 4096, "FULL")
    assert (qkv["bm"], qkv["bn"], qkv["warps"], qkv["stages"], qkv["persistent_per_sm"]) == (128, 256, 8, 4, 1)
    assert sch(16384, 6144, 2560, "FULL", write32=True)["stages"] == 3  # the fp32 output's staging fits beside 3
    assert (o["bm"], o["bn"], o["n_chunks"]) == (128, 128, 2)
    assert sch(256, 6144, 2560, "DECODE")["bn"] <= 128
    assert sch(16384, 6144, 2560, "FULL", tma=False)["bn"] == 128  # the pointer kernel (backward) keeps 128x128
    assert load("same", FULL_UNSPLIT_TILE="same")._schedule(16384, 6144, 2560, "FULL")["bn"] == 128
    cw = load("cw", FULL_CHUNKED_WIDE="on")._schedule
    assert (cw(16384, 2560, 4096, "FULL")["bn"], cw(16384, 2560, 9728, "FULL")["bn"]) == (256, 128)  # o; down: flat
    # The root's "auto": o at M 16384 is 1280 wide tiles, 10 rounds on 132 SMs against 20 of 2560 narrow ones;
    # at M 4096, 3 rounds of 320 against 5 of 640: narrow.
    assert [load()._schedule(m, 2560, 4096, "FULL")["bn"] for m in (4096, 16384)] == [128, 256]
    assert load("off", FULL_CHUNKED_WIDE="off")._schedule(16384, 2560, 4096, "FULL")["bn"] == 128


def test_decode_stages_fit_the_launch_in_fewest_waves():
    # DECODE_NUM_STAGES 0: gate_up at 64 rows is 304 tiles of 64x64; 6 stages (96 KB) hold two programs an SM,
    # two waves on 132 SMs; 4 stages (64 KB) hold three, one wave. Launches that fit anyway keep 6.
    sch = load("st", DECODE_NUM_STAGES=0)._schedule
    assert sch(64, 19456, 2560, "DECODE")["stages"] == 4
    assert sch(64, 2560, 4096, "DECODE")["stages"] == 6 and sch(64, 6144, 2560, "DECODE")["stages"] == 6
    assert sch(4096, 19456, 2560, "FULL")["stages"] == load()._schedule(4096, 19456, 2560, "FULL")["stages"]


def _profile_script():
    """`tik-evo bench linear-ncu`'s cell parsing and launch labelling (tik_evo_kernels.linear.ncu)."""
    from tik_evo_kernels.linear import ncu

    return ncu


def test_profile_cells_name_weights_exactly_or_by_unique_suffix():
    prof = _profile_script()
    shapes = [("qwen3-4b.o", 2560, 4096), ("qwen3-4b.down", 2560, 9728), ("llama3-8b.down", 4096, 14336)]
    assert prof.parse_cells("o:256, llama3-8b.down:16384", shapes) == [
        ("qwen3-4b.o", 2560, 4096, 256), ("llama3-8b.down", 4096, 14336, 16384)]
    for bad, why in (("down:64", "matches 2 of"), ("up:64", "matches 0 of"), ("o", "is not WEIGHT:M"),
                     ("o:0", "is not WEIGHT:M")):
        with pytest.raises(SystemExit, match=why):
            prof.parse_cells(bad, shapes)


def test_profile_labels_each_launch_with_its_call():
    prof = _profile_script()
    order = ["root o M256", "cublas o M256", "root qkv M16384", "v2 qkv M16384", "cublas qkv M16384"]
    kernels = ["_linear_chunk_kernel", "_linear_merge_kernel", "nvjet_tst_128x64", "splitKreduce_kernel",
               "_linear_persistent_kernel", "_linear_kernel", "sm90_xmma_gemm_bf16"]
    assert prof.label_launches(kernels, order) == [
        "root o M256", "root o M256", "cublas o M256", "cublas o M256", "root qkv M16384", "v2 qkv M16384",
        "cublas qkv M16384"]
    assert prof.label_launches(kernels + ["_linear_kernel"], order)[-1] == "?"  # more launches than calls


@pytest.mark.parametrize("knobs,k", [({}, 160), ({"K_CHUNK": 544, "BLOCK_K": 32}, 1088)])
def test_grouped_launch_gives_each_row_its_weights_linear_bits(knobs, k):
    # One launch for several weights (an MoE layer's experts): rows starts[e]:starts[e+1] through weights[e].
    # Every row must get linear_full's bits (bf16 and fp32) for its weight, in both paths, with empty experts,
    # experts of one row and experts of several row tiles; k = 1088 with K_CHUNK 544 folds chunks.
    import torch

    impl = load("grouped" + str(k), **knobs)
    g = torch.Generator().manual_seed(k)
    counts = [3, 0, 70, 1, 0, 37]
    starts = torch.tensor([0] + list(torch.tensor(counts).cumsum(0)), dtype=torch.int32)
    T, n = int(starts[-1]), 40
    x = torch.randn(T, k, generator=g).to(torch.bfloat16)
    w = (torch.randn(len(counts), n, k, generator=g) * k ** -0.5).to(torch.bfloat16)
    for grouped, single in ((impl.linear_grouped_full, impl.linear_full), (impl.linear_grouped_decode,
                                                                          impl.linear_full)):
        y, y32 = torch.full((T, n), float("nan"), dtype=torch.bfloat16), torch.full((T, n), float("nan"))
        grouped(x, w, starts, y, y32)
        for e in range(len(counts)):
            lo, hi = int(starts[e]), int(starts[e + 1])
            if lo == hi:
                continue
            ye, ye32 = torch.empty(hi - lo, n, dtype=torch.bfloat16), torch.empty(hi - lo, n)
            single(x[lo:hi].contiguous(), w[e], None, ye, ye32)
            assert torch.equal(y[lo:hi].view(torch.int16), ye.view(torch.int16)), e
            assert torch.equal(y32[lo:hi].view(torch.int32), ye32.view(torch.int32)), e
    with pytest.raises(ValueError, match="do not agree"):
        impl.linear_grouped_full(x, w, starts[:-1], y, None)


def test_grouped_launch_compiles_for_hopper_to_wgmma_without_spills(offline):
    # No GPU in CI: the grouped launch is compiled for sm_90a offline (Triton's bundled ptxas), both paths, on a
    # weight that folds K chunks (K 9728); it must use wgmma, not spill and fit in shared memory.
    import json

    rep = json.loads(offline("-m", "tik_evo.cli", "bench", "linear-compile", "--grouped", "--k", "9728", "--n", "2560"))
    for path in ("grouped.full", "grouped.decode"):
        assert rep[path]["k_chunk"] == 4096 and rep[path]["HGMMA"] > 0, rep[path]
        assert rep[path]["spill_store_bytes"] == 0 and 0 < rep[path]["shared_bytes"] <= 227 * 1024, rep[path]


def test_grouped_workload_bench_runs_and_verifies():
    # Workloads with `experts` time the grouped launch on routed rows (the linear campaign's MoE cells); the
    # bench's own verify must pass on the root and fail on a launch that drops an expert's rows.
    wl = {"name": "experts", "phase": "full", "tokens": 12, "n": 64, "k": 96, "experts": 4, "top_k": 2}
    FAMILY.validate_workload(wl)
    impl = load()
    bench = FAMILY.make_bench(impl, wl, 0, "cpu")
    bench.run()
    assert all(c.passed for c in bench.verify())
    assert bench.flops == 2 * 24 * 64 * 96

    def drop_first(x, w, starts, out, out32=None):
        impl.linear_grouped_full(x, w, starts, out, out32)
        out[: int(starts[1])] = 0  # expert 0's rows never computed

    broken = SimpleNamespace(linear_grouped_full=drop_first, linear_grouped_decode=drop_first)
    assert not all(c.passed for c in FAMILY.make_bench(broken, wl, 0, "cpu").verify())
    with pytest.raises(ValueError, match="top_k 5 must be in 1..experts"):
        FAMILY.make_bench(impl, {**wl, "top_k": 5}, 0, "cpu")
    # `tik-evo check` refuses such workloads before a run, naming the key.
    for bad, message in (({"top_k": 5}, "top_k 5 must be an integer in 1..experts"),
                         ({"experts": 0}, "experts 0 must be a positive integer"),
                         ({"bias": True}, "bias: the grouped expert launches take no bias")):
        with pytest.raises(ValueError, match=message):
            FAMILY.validate_workload({**wl, **bad})


def test_grouped_backward_checks_catch_a_wrong_weight_gradient():
    # The family's grouped backward checks (dX, dW against fp64 autograd, zeros for an expert without rows) pass
    # on the root and fail when dW skips the expert's last row block.
    assert [c for c in failures(load(), cases=FAMILY.check_cases("small")) if "grouped" in c[0]] == []
    broken = load("grouped_dw_short", lambda s: s.replace("for r0 in range(lo, hi, BLOCK_R):",
                                                          "for r0 in range(lo, hi - BLOCK_R, BLOCK_R):"))
    bad = failures(broken, cases=FAMILY.check_cases("small"))
    assert [name for name, kind, _ in bad] and all("grouped backward dW vs autograd" in name for name, _, _ in bad), bad


def test_grouped_backward_through_tma_passes_the_checks_and_equals_the_pointer_kernel():
    # DW_KERNEL "tma": descriptors over each expert's own rows (zeros past its last row, none of the next
    # expert's); the family's grouped backward checks pass, and under the interpreter dW equals the pointer kernel's
    # bit for bit (the same row blocks in the same order), an expert without rows included.
    import torch

    tma = load("grouped_dw_tma", lambda s: s.replace('DW_KERNEL = "pointer"', 'DW_KERNEL = "tma"'))
    assert tma.DW_KERNEL == "tma"
    assert [c for c in failures(tma, cases=FAMILY.check_cases("small")) if "grouped" in c[0]] == []
    g = torch.Generator().manual_seed(0)
    starts = torch.tensor([0, 70, 70, 211, 300], dtype=torch.int32)
    x, gy = torch.randn((300, 64), generator=g).bfloat16(), torch.randn((300, 48), generator=g).bfloat16()
    w = torch.randn((4, 48, 64), generator=g).bfloat16()
    grads = []
    for impl in (tma, load()):
        gx, gw = torch.empty_like(x), torch.full_like(w, float("nan"))
        impl.linear_grouped_backward(x, w, starts, gy, gx, gw)
        grads.append(gw)
    assert torch.equal(grads[0], grads[1]) and not grads[0][1].any()


def test_grouped_tile_follows_the_knobs_and_stays_128_square_where_chunks_fold():
    # The grouped launches' own tile knobs (0 = the path's tile); a weight whose K chunks fold keeps two
    # accumulators, where 128x256 spills on sm_90a, so it falls back to the path's 128x128 tile.
    tile = load()._grouped_tile
    assert tile("FULL", 2048) == (128, 256, 4) and tile("FULL", 768) == (128, 256, 4)
    assert tile("FULL", 9728) == (128, 128, 4)
    assert tile("DECODE", 2048) == (64, 128, 4)
    assert load("grouped_tile_knobs", None, FULL_GROUPED_BLOCK_N=0, DECODE_GROUPED_BLOCK_M=16)._grouped_tile(
        "DECODE", 2048)[0] == 16


@pytest.mark.parametrize("m, n, k, kernel, strided", [
    (37, 200, 72, "dedicated", False),  # neither dimension a multiple of a tile
    (2100, 16, 32, "dedicated", False),  # few output tiles, a long reduction: dW in split fp32 partials
    (0, 8, 16, "dedicated", False),  # no rows: dW is zero
    (37, 96, 160, "transposed", False),  # the forward kernel on transposed views
    (37, 96, 160, "dedicated", True),  # a grad_out TMA cannot read (odd row stride) takes the transposed path
])
def test_dense_backward_matches_autograd(m, n, k, kernel, strided):
    import torch

    from tik_evo import checks

    impl = load("bwd_" + kernel, lambda s: s.replace('BWD_KERNEL = "dedicated"', f'BWD_KERNEL = "{kernel}"'))
    g = checks.generator(m + n + k)
    x = checks.randn((m, k), g, torch.bfloat16, "cpu")
    w = checks.randn((n, k), g, torch.bfloat16, "cpu")
    gy = checks.randn((m, n + 1), g, torch.bfloat16, "cpu")[:, :n] if strided else \
        checks.randn((m, n), g, torch.bfloat16, "cpu")
    gx, gw = torch.full_like(x, float("nan")), torch.full_like(w, float("nan"))
    impl.linear_backward(x, w, gy, gx, gw)
    ref_x, ref_w = gy.double() @ w.double(), gy.double().t() @ x.double()
    assert checks.reference("dX", gx, ref_x, tol=1.6e-2).passed
    assert checks.reference("dW", gw, ref_w, tol=1.6e-2).passed if m else bool((gw == 0).all())


def test_dense_backward_splits_only_small_outputs_with_long_reductions():
    root = load()
    # (BLOCK_P, BLOCK_Q, splits, rows per split) on 132 SMs: the lm_head's dW and dX fill the GPU unsplit.
    assert root._bwd_schedule(151936, 2560, 4096, 132)[:3] == (128, 256, 1)
    assert root._bwd_schedule(4096, 2560, 151936, 132)[:3] == (128, 256, 1)
    # A router's dW (128 x 2048 from 8192 rows): 8 tiles of 128x256 would leave 124 SMs idle; it splits into
    # 128x128 tiles, each split keeping at least 1024 rows, whole BLOCK_R steps, covering all of R.
    bp, bq, split, r_split = root._bwd_schedule(128, 2048, 8192, 132)
    assert (bp, bq) == (128, 128) and split == 8 and r_split % 64 == 0 and split * r_split >= 8192
    assert root._bwd_schedule(128, 2048, 1500, 132)[2] == 1  # too few rows to split


def test_dense_backward_compiles_for_hopper_to_wgmma_from_tma_without_spills(offline):
    # No GPU in CI: the dedicated backward GEMM is compiled for sm_90a offline, dX and dW, unsplit and split, and
    # the grouped dW kernels; they must use wgmma (on TMA loads, but for the pointer dW), not spill and fit in
    # shared memory.
    import json

    rep = json.loads(offline("-m", "tik_evo.cli", "bench", "linear-compile", "--backward"))
    for launch in ("dX.split1", "dX.split2", "dW.split1", "dW.split2", "grouped_dW.tma"):
        assert rep[launch]["HGMMA"] > 0 and rep[launch]["UTMALDG"] > 0, rep[launch]
        assert rep[launch]["spill_store_bytes"] == 0 and 0 < rep[launch]["shared_bytes"] <= 227 * 1024, rep[launch]
    assert rep["grouped_dW.pointer"]["HGMMA"] > 0 and rep["grouped_dW.pointer"]["spill_store_bytes"] == 0


def test_backward_benchmark_smoke_times_every_implementation_and_checks_them(tmp_path):
    # `tik-evo bench linear-backward --smoke`: tiny shapes under the interpreter: every implementation ran, agrees
    # with the fp32 product, and the JSON names the machine (speed under the interpreter means nothing).
    import json

    from tik_evo.cli import main

    out = tmp_path / "lb.json"
    assert main(["bench", "linear-backward", "--smoke", "--out", str(out)]) == 0
    result = json.loads(out.read_text())
    assert result["smoke"] and result["gpu"] == "cpu (interpreter)" and len(result["cells"]) == 2
    for cell in result["cells"]:
        assert cell["errors"] == {} and set(cell["ms"]) == {"dedicated", "transposed", "cublas"}, cell
        assert all(v < 1e-2 for errs in cell["rel_l2_vs_fp32"].values() for v in errs.values()), cell


def test_grouped_benchmark_backward_cell_times_both_dw_kernels_and_restores_the_root(tmp_path):
    # `tik-evo bench linear-grouped --smoke`: its backward cell on the CPU (interpreter, 4 experts, tiny sizes, one
    # call's wall clock for a time): every dW variant, pointer and TMA, ran and agrees with the root's dW; the
    # root's choice is restored.
    import json

    from tik_evo.cli import main

    out = tmp_path / "lg.json"
    assert main(["bench", "linear-grouped", "--smoke", "--out", str(out)]) == 0
    result = json.loads(out.read_text())
    assert result["smoke"] and result["gpu"] == "cpu (interpreter)" and result["experts"] == 4
    assert result["starts"] == [0, 9, 9, 40, 53]
    assert result["dw_tiles"] == result["tma_dw_tiles"] == [[64, 64, 32, 4, 2]]
    (cell,) = result["backward"]
    assert (cell["shape"], cell["n"], cell["k"], cell["rows"]) == ("tiny", 48, 64, 53), cell
    assert "errors" not in cell, cell.get("errors")
    assert set(cell["us"]) == {"root", "dw_tile_64x64x32x4x2", "dw_tma_64x64x32x4x2"}
    assert all(v < 1e-2 for v in cell["dw_rel_l2_vs_root_tile"].values()), cell["dw_rel_l2_vs_root_tile"]
    root = load()
    assert result["root_dw"]["before"] == {"kernel": root.DW_KERNEL, "tile": list(root.DW_TILE)}, result["root_dw"]
    assert result["root_dw"]["after"] == result["root_dw"]["before"], result["root_dw"]
