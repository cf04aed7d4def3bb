"""moe_routing family under TRITON_INTERPRET=1 on the CPU: consistency structure, knob variants, backward, a caught
mismatch. The interpreter's dot is exact (tik_evo.interp), so a different division or tie rule in one path shows up.
The selection methods (SELECT) are compared with each other and with a stable fp64 top-k on tie-heavy logits."""

from pathlib import Path

import _family
import pytest
import torch

from tik_evo_kernels.moe_routing import FAMILY
from tik_evo_kernels.moe_routing.family import reference

load, failures = _family.loader(FAMILY)
OLD_ROOT = {"SELECT": "rounds", "EXPERT_GROUP": 0, "BLOCK_T": 4, "NUM_WARPS": 1}


def test_root_passes_all_cases():
    impl = load()
    assert failures(impl) == []
    assert failures(impl, seeds=(1,), cases=FAMILY.check_cases("small")) == []


@pytest.mark.parametrize("knobs", [
    OLD_ROOT,
    {"SELECT": "packed_prob", "EXPERT_GROUP": 0, "BLOCK_T": 4},
    {"SELECT": "logit_key", "EXPERT_GROUP": 0, "BLOCK_T": 8, "NUM_WARPS": 2},  # staged keys, flat tile
    {"BLOCK_T": 8, "NUM_WARPS": 1, "FULL_TILES_PER_PROGRAM": 4, "DECODE_TILES_PER_PROGRAM": 2},  # staged
    {"BLOCK_T": 32, "NUM_WARPS": 1, "FULL_NUM_STAGES": 2},  # one thread per row
    {"SELECT": "packed_prob", "BLOCK_T": 16, "NUM_WARPS": 4},
    {"SELECT": "rounds", "BLOCK_T": 8, "NUM_WARPS": 2},
    # the next tile loaded before this one is routed; tile counts that do not divide by tiles per program
    {"FULL_TILES_PER_PROGRAM": 3, "FULL_PREFETCH": True, "DECODE_TILES_PER_PROGRAM": 2, "DECODE_PREFETCH": True},
    {"BLOCK_T": 8, "FULL_STAGE_KEYS": "auto"},  # keys staged (round trip through the ids) in the full path only
    {"BLOCK_T": 8, "DECODE_STAGE_KEYS": "auto"},
    # per-path tiles (a row per thread in the full path; decode tiles of 2 tokens on 2 warps); the renormalize=False
    # case keeps the contract tile in both paths
    {"FULL_BLOCK_T": 32, "FULL_NUM_WARPS": 1, "DECODE_BLOCK_T": 2, "DECODE_NUM_WARPS": 2},
    {"FULL_BLOCK_T": 64, "FULL_NUM_WARPS": 2, "RENORM_FROM": "probs"},  # a row sum: the path tiles are ignored
    # the top-k network: a row per thread in the full path; a flat tile (rows over 16 threads) with staged keys
    {"FULL_TOPK_NET": True, "FULL_BLOCK_T": 32, "FULL_NUM_WARPS": 1, "DECODE_TOPK_NET": True, "DECODE_BLOCK_T": 2},
    {"FULL_TOPK_NET": True, "EXPERT_GROUP": 0, "BLOCK_T": 8, "NUM_WARPS": 2, "FULL_STAGE_KEYS": "auto"},
])
def test_knob_variants_pass(knobs):
    tag = "v" + str(abs(hash(tuple(sorted(knobs.items())))))
    assert failures(load(tag, **knobs)) == []


def _tie_logits(tokens: int, experts: int, seed: int = 0) -> torch.Tensor:
    """Scaled-down logits (many bf16 ties) plus rows of exact ties, signed zeros, -inf and an equal top run."""
    g = torch.Generator().manual_seed(seed)
    x = (torch.randn(tokens, experts, generator=g) * 0.02).to(torch.bfloat16)
    x[1] = 0.0
    x[2, ::2] = -0.0
    x[3, : experts // 3] = float("-inf")
    x[4, 5:13] = x[4].max() + 1
    x[5] = x[5, 7]
    x[6, experts - 9:] = 1.0  # the top-k at the last experts
    return x


def _route(impl, x, top_k, renorm=True, decode=False):
    w = torch.empty(x.shape[0], top_k, dtype=torch.bfloat16)
    w32 = torch.empty(x.shape[0], top_k)
    ids = torch.full((x.shape[0], top_k), -1, dtype=torch.int32)
    (impl.moe_routing_decode if decode else impl.moe_routing_full)(x, w, ids, w32, renorm)
    return w.view(torch.int16), w32.view(torch.int32), ids


@pytest.mark.parametrize("tile", [{"EXPERT_GROUP": 0, "BLOCK_T": 4, "NUM_WARPS": 1},
                                  {"EXPERT_GROUP": 8, "BLOCK_T": 16, "NUM_WARPS": 1}])
@pytest.mark.parametrize("experts,top_k,renorm", [(128, 8, True), (60, 6, False)])
def test_select_methods_identical_on_ties(tile, experts, top_k, renorm):
    # One tile (so one row-sum order): every selection method gives the same bits (weights renormalised from the
    # probabilities, the one form all methods share), ids equal a stable fp64 top-k, and decode rows equal full rows.
    x = _tie_logits(45, experts)
    ref_ids = reference(x, top_k, renorm)[1]
    outs = {sel: _route(load(f"sel_{sel}", SELECT=sel, RENORM_FROM="probs", **tile), x, top_k, renorm)
            for sel in ("rounds", "packed_prob", "logit_key")}
    for sel, out in outs.items():
        assert torch.equal(out[2], ref_ids), sel
        for a, b in zip(out, outs["rounds"]):
            assert torch.equal(a, b), sel
    rows = torch.tensor([0, 1, 2, 3, 4, 5, 6, 17, 44])
    dec = _route(load("sel_logit_key", SELECT="logit_key", RENORM_FROM="probs", **tile), x[rows].contiguous(), top_k,
                 renorm, True)
    for a, b in zip(dec, outs["logit_key"]):
        assert torch.equal(a, b[rows])


def test_top_k_network_gives_the_roots_bits():
    # FULL_/DECODE_TOPK_NET take the root's keys through tl.topk instead of k rounds: the same outputs bit for
    # bit, on tie-heavy rows (signed zeros, -inf, equal runs), with and without renormalisation (the contract
    # tile's row sum then), in both paths and at the tiles a campaign would try with it.
    for experts, top_k, renorm in ((128, 8, True), (60, 6, False)):
        x = _tie_logits(33, experts, seed=1)  # 33 rows: partial tiles at 8 and 32 (the reduce is per element)
        root = load()
        want = {decode: _route(root, x, top_k, renorm, decode) for decode in (False, True)}  # once, not per tile
        # Under the interpreter a tile is its row count alone (warps lay out threads): the root's 8 and a row per
        # thread's 32 (the tile a campaign would try with the network), each with a partial last tile.
        for tile in ({}, {"FULL_BLOCK_T": 32, "FULL_NUM_WARPS": 1}):
            net = load("topk_net" + "_".join(map(str, tile.values())), FULL_TOPK_NET=True, DECODE_TOPK_NET=True,
                       **tile)
            for decode in (False, True) if not tile else (False,):  # the tiles are FULL_ ones: decode checked once
                for a, b in zip(_route(net, x, top_k, renorm, decode), want[decode]):
                    assert torch.equal(a, b), (experts, tile, decode)


def test_top_k_network_with_a_row_per_thread_compiles_to_fewer_instructions_for_hopper(offline):
    # Offline sm_90a compile (no GPU in CI): with a row per thread the network stays in each thread's registers
    # (no spills; the 16 shuffles are the epilogue's, a row over 4 threads needs 64) and issues fewer warp
    # instructions per token than the rounds at the same tile.
    import json

    full = {}
    for name, knobs in (("rounds", {}), ("net", {"FULL_TOPK_NET": True})):
        out = offline("-m", "tik_evo.cli", "bench", "routing-compile", "--knobs",
                      json.dumps({"FULL_BLOCK_T": 32, "FULL_NUM_WARPS": 1, **knobs}))
        full[name] = json.loads(out.splitlines()[0])
    net, rounds = full["net"], full["rounds"]
    assert net["path"] == "FULL" and net["SHFL"] <= 16 and net["spill_store_bytes"] == 0, net
    assert net["warp_instructions_per_token"] < 0.9 * rounds["warp_instructions_per_token"], (net, rounds)
    assert net["registers"] < rounds["registers"], (net, rounds)


def test_grouped_tile_keeps_ids_and_bf16_weights():
    # The grouped tile reduces the row sum in another order (a contract change): fp32 weights may differ in the
    # last bits, the ids and (here) the bf16 weights do not.
    x = _tie_logits(37, 128, seed=3)
    flat = _route(load("flat_old", **OLD_ROOT), x, 8)
    grouped = _route(load(), x, 8)
    assert torch.equal(flat[2], grouped[2])
    assert torch.equal(flat[0], grouped[0])


def test_reciprocal_in_one_path_is_caught():
    edit = lambda s: s.replace("top_w = tl.exp(top_x - m[:, None]) / s[:, None]",  # noqa: E731
                               "top_w = tl.exp(top_x - m[:, None]) * (1.0 / s[:, None])")
    bad = failures(_family.split_paths(load("rf"), load("rd", source_edit=edit)))
    assert any(kind == "consistency" and name.startswith("decode == full") for name, kind, _ in bad), bad
    assert all(kind == "consistency" for _, kind, _ in bad)


def test_ties_to_higher_index_in_one_path_is_caught():
    edit = lambda s: s.replace("return val * BLOCK_E + (BLOCK_E - 1 - cols)",  # noqa: E731
                               "return val * BLOCK_E + cols")
    bad = failures(_family.split_paths(load("tf"), load("td", source_edit=edit)), cases=FAMILY.check_cases("full")[:2])
    assert any(kind == "consistency" and "(ids)" in name for name, kind, _ in bad), bad


def test_ties_to_higher_index_in_old_rounds_is_caught():
    def edit(src):
        old = 'idx = _row(tl.where(work == _bc(v, GROUP), cols, BLOCK_E), "min", GROUP)'
        assert src.count(old) == 1
        return src.replace(old, 'idx = _row(tl.where(work == _bc(v, GROUP), cols, -1), "max", GROUP)')

    bad = failures(_family.split_paths(load("of", **OLD_ROOT), load("od", source_edit=edit, **OLD_ROOT)),
                   cases=FAMILY.check_cases("full")[:2])
    assert any(kind == "consistency" and "(ids)" in name for name, kind, _ in bad), bad


def test_workloads_validate():
    import yaml

    spec = yaml.safe_load((Path(__file__).parents[2] / "workloads" / "moe_routing_models.yaml").read_text())
    assert spec["family"] == "moe_routing"
    names = [w["name"] for w in spec["workloads"]]
    assert len(names) == len(set(names))
    for w in spec["workloads"]:
        FAMILY.validate_workload(w)


def test_path_tiles_apply_only_without_a_row_sum():
    impl = load("tiles", FULL_BLOCK_T=32, FULL_NUM_WARPS=1, DECODE_BLOCK_T=2)
    assert impl._tile("FULL", True) == (32, 1) and impl._tile("DECODE", True) == (2, 1)
    assert impl._tile("FULL", False) == (4, 1)  # renormalize=False: the weights divide by the row sum
    probs = load("tiles_probs", FULL_BLOCK_T=32, FULL_NUM_WARPS=2, RENORM_FROM="probs")
    assert probs._tile("FULL", True) == (4, 1)


def test_padded_rows_keep_expert_ids_in_range_and_the_other_rows_bits():
    # An engine pads a decode batch up to a captured graph's size, and a padded row's router logits may be NaN
    # (its attention saw no keys). Its ids must still index real experts (the expert dispatch gathers by them),
    # and every other row keeps its bits.
    impl = load()
    g = torch.Generator().manual_seed(3)
    x = torch.randn(6, 128, generator=g).to(torch.bfloat16)
    padded = x.clone()
    padded[1] = float("nan")
    padded[4, :5] = float("nan")
    outs = []
    for logits in (x, padded):
        w, w32 = torch.empty(6, 8, dtype=torch.bfloat16), torch.empty(6, 8)
        ids = torch.full((6, 8), -1, dtype=torch.int32)
        impl.moe_routing_decode(logits, w, ids, w32, True)
        outs.append((w32.view(torch.int32), ids))
    keep = [0, 2, 3, 5]
    assert torch.equal(outs[1][0][keep], outs[0][0][keep]) and torch.equal(outs[1][1][keep], outs[0][1][keep])
    ids = outs[1][1]
    assert bool(((ids >= 0) & (ids < 128)).all()), ids
    assert all(len(set(row.tolist())) == 8 for row in ids)  # distinct experts in every row
