"""Attention on Hopper without a GPU: offline sm_90a compiles of the root's knob sets, and the host-side launch
plans (the Gluon kernels' shared memory, head bands, fall-backs and descriptors; decode waves; grid helpers)."""

from __future__ import annotations

import pytest
import torch
from _attention import (
    interpreter,  # noqa: F401 (an autouse fixture: the exact-dot interpreter)
    load,
    with_knobs,
)

from tik_evo_kernels.attention import FAMILY


def _compile_report(offline, knobs: list[dict], paths: str, head_dim: int = 128) -> list[dict]:
    """The offline sm_90a compile report of the root with each knob set, from one process (`offline`: the
    conftest fixture)."""
    import json

    reps = json.loads(offline("-m", "tik_evo.cli", "bench", "attention-compile", "--knobs", json.dumps(knobs),
                              "--paths", paths, "--head-dim", str(head_dim), timeout=900))
    assert len(reps) == len(knobs)
    return reps


def test_root_and_hopper_knobs_compile_for_hopper(offline):
    # The interpreter never compiles; this catches sources that run on the CPU but do not build for sm_90a.
    sets = [({}, False), ({"FULL_SPLIT_LOOP": "flatten", "FULL_KV_LOADS": "tma", "DECODE_MERGE_LAUNCH": "pdl",
                           "DECODE_CHUNKS_PER_PROGRAM": 0, "DECODE_CHUNK_LOOP": "flatten", "DECODE_MERGE_LOADS": 8,
                           "DECODE_MERGE_ROWS": 1, "FULL_WS_PERSISTENT": "snake"}, True),
            ({"DECODE_FINISH_SINGLE": True}, False),
            ({"DECODE_MERGE_LAUNCH": "fused", "DECODE_MERGE_ROWS": 1, "DECODE_MERGE_LOADS": 8,
              "FULL_WS_CONSUMERS": 3}, False)]
    head_64 = ({"ROW_SUM": "tree", "FULL_WS_SCHEDULE": "serial", "FULL_WS_BUFFERS": 2, "FULL_WS_CONSUMERS": 3}, False)
    paths = "prefill,decode,merge,prefill_ws"
    reps = _compile_report(offline, [k for k, _ in sets], paths) + _compile_report(offline, [head_64[0]], paths,
                                                                                   head_dim=64)
    for (knobs, tma), rep in zip(sets + [head_64], reps):
        for path in ("prefill", "decode", "prefill_ws"):
            assert rep[path]["HGMMA"] > 0 and rep[path]["spill_store_bytes"] == 0, (knobs, path, rep[path])
            assert 0 < rep[path]["shared_bytes"] <= 227 * 1024
        assert (rep["prefill"]["UTMALDG"] > 0) == tma
        assert rep["merge"]["LDG"] > 0 and rep["merge"]["spill_store_bytes"] == 0, rep["merge"]
        # The Gluon prefill: TMA loads and register budgets set per warp-specialised partition.
        assert rep["prefill_ws"]["UTMALDG"] > 0 and rep["prefill_ws"]["USETMAXREG"] > 0, rep["prefill_ws"]


def test_packed_prefill_compiles_to_the_prefill_tiles_arithmetic(offline):
    # prefill_packed runs the prefill tile over rows heads * D apart: for sm_90a the same floating-point and wgmma
    # instructions as the prefill kernel (only address code differs), with no spill; with FULL_KV_LOADS "tma" both
    # load the blocks below the diagonal through TMA.
    for rep, tma in zip(_compile_report(offline, [{}, {"FULL_KV_LOADS": "tma"}], "prefill,prefill_packed"),
                        (False, True)):
        packed, prefill = rep["prefill_packed"], rep["prefill"]
        assert packed["fp_ops"] == prefill["fp_ops"] and packed["HGMMA"] > 0, (packed["fp_ops"], prefill["fp_ops"])
        assert packed["spill_store_bytes"] == 0 and (packed["UTMALDG"] > 0) == tma == (prefill["UTMALDG"] > 0)


def test_gluon_layout_free_row_sum_kernels_compile_for_hopper(offline):
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
    reps = dict(zip(cases, _compile_report(offline, sets, "prefill,prefill_ws,decode_ws")))
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
    ws_half, ws_overlap = (rep["prefill_ws"] for rep in _compile_report(offline, [half, overlap], "prefill_ws"))
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
