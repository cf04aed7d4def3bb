"""tik_evo.graph_replay (and its whole-rollout harness, which `tik-evo bench model-graphs` runs) on the CPU. A
CUDA graph needs a GPU, so a stand-in "graph" here (`Rerun`) replays by calling the captured function again; what
is checked is the bookkeeping: the arguments put back before the replay, a replay that writes nothing or other bits
reported, a failed capture leaving the eager outputs, and a whole rollout going on from replayed outputs."""

from types import SimpleNamespace

import pytest
import torch

from tik_evo.candidate import load_module, load_source
from tik_evo.families import available, load_family
from tik_evo.graph_replay import CaptureError, Rerun, audit_checks, graph_rollout, mismatches, replay_check
from tik_evo.knobs import read_knobs, write_knobs
from tik_evo_kernels import peers
from tik_evo_kernels.decoder import roots
from tik_evo_kernels.moe_decoder import MoEDecoder, MoEShape

LENS, PROMPTS = [9, 12, 7], [5, 8, 4]


class Inert:
    """A "graph" whose replay launches nothing."""

    def __init__(self, fn):
        pass

    def replay(self):
        pass


def test_a_family_kernel_replays_to_its_eager_bits():
    rms = roots(("rmsnorm",))["rmsnorm"]
    g = torch.Generator().manual_seed(0)
    x = torch.randn(3, 64, generator=g).to(torch.bfloat16)
    w = torch.randn(64, generator=g).to(torch.bfloat16)
    out = torch.empty_like(x)
    r = replay_check(rms.rmsnorm_decode, x, w, 1e-6, out, capture=Rerun)
    assert (r.written, r.elements, r.differ) == (1, x.numel(), 0)
    want = torch.empty_like(x)
    rms.rmsnorm_decode(x, w, 1e-6, want)
    assert torch.equal(out, want)  # the replay's outputs are left in place


def test_a_replay_that_writes_nothing_reads_as_differing():
    x, out = torch.arange(6.0), torch.full((6,), 7.0)
    r = replay_check(lambda a, b: b.copy_(a * 2), x, out, capture=Inert)
    assert r.written == 1 and r.differ == 6
    assert torch.equal(out, torch.full((6,), 7.0))  # put back before the replay, and the replay wrote nothing


def test_a_call_that_keeps_host_state_between_calls_is_caught():
    calls = []

    def baked(a, b):  # e.g. a launch that reads a host-side counter at capture
        calls.append(1)
        b.copy_(a + len(calls))

    r = replay_check(baked, torch.zeros(4), torch.zeros(4), capture=Rerun)
    assert r.written == 1 and r.differ == 4


def test_in_place_updates_are_put_back_before_the_replay():
    cache = torch.zeros(8)
    r = replay_check(lambda c, v: c.__setitem__(slice(2, 4), c[2:4] + v), cache, torch.ones(2), capture=Rerun)
    assert r.differ == 0 and cache.tolist() == [0, 0, 1, 1, 0, 0, 0, 0]  # written once, not twice


def test_a_large_argument_written_by_the_call_is_refused_by_name():
    big, out = torch.zeros(64), torch.zeros(4)
    with pytest.raises(ValueError, match=r"argument 0 \[64\].*large_bytes"):
        replay_check(lambda a, b: a.add_(1), big, out, capture=Rerun, large_bytes=128)
    r = replay_check(lambda a, b: b.copy_(a[:4] + 1), big, out, capture=Rerun, large_bytes=128)
    assert (r.written, r.differ) == (1, 0)  # a large input that is only read is fine


def test_a_failed_capture_leaves_the_eager_outputs():
    def no_capture(fn):
        raise RuntimeError("operation not permitted when stream is capturing")

    out = torch.zeros(3)
    with pytest.raises(CaptureError, match="not permitted") as e:
        replay_check(lambda a, b: (b.copy_(a), "eager")[1], torch.ones(3), out, capture=no_capture)
    assert e.value.result == "eager" and torch.equal(out, torch.ones(3))


def sequences(seed: int) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(0, 512, (n,), generator=g).to(torch.int32) for n in LENS]


def test_a_rollout_from_replays_gives_the_eager_rollouts_log_probs():
    m = MoEDecoder(MoEShape(max_pos=32), 0, "cpu", impls=peers.torch_impls())
    seqs = sequences(1)
    eager = m.rollout_logprobs(seqs, PROMPTS)
    replayed, tally = graph_rollout(m, seqs, PROMPTS, capture=Rerun)
    assert mismatches(replayed, eager) == 0
    assert m._op.__func__ is MoEDecoder._op  # the model is given back unwrapped
    assert {"attention.full", "attention.decode", "linear.grouped_decode", "moe_routing.decode",
            "kv_append.decode", "logprob.decode"} <= set(tally)
    assert all(t["calls"] > 0 and t["written"] > 0 and t["differ"] == 0 for t in tally.values()), tally
    # A kernel whose bits change from call to call (every second call of SiLU-and-mul's decode here) is named.
    peer, calls = peers.torch_impls(), []

    def flaky(gate, up, out):
        peer["silu_mul"].silu_mul_decode(gate, up, out)
        calls.append(1)
        if len(calls) % 2 == 0:
            out.add_(1)

    m.k = {**peer, "silu_mul": SimpleNamespace(silu_mul_full=peer["silu_mul"].silu_mul_full, silu_mul_decode=flaky)}
    _, tally = graph_rollout(m, seqs, PROMPTS, capture=Rerun)
    assert tally["silu_mul.decode"]["differ"] > 0
    assert all(t["differ"] == 0 for key, t in tally.items() if key != "silu_mul.decode"), tally


@pytest.mark.parametrize("name", available())
def test_every_family_root_passes_the_graph_stage_on_the_cpu(name):
    # The stage runs by default on GPUs; here its plumbing meets every family's checks (keyword and tuple
    # arguments, helpers read through the proxy), with `Rerun` for the graph: each root's forward entry points
    # are called, and a second call writes the first one's bits.
    family = load_family(name)
    impl = load_module(family.folder / "root.py", f"graph_root_{name}")
    got = audit_checks(family, impl, 0, "cpu")
    assert all(c.passed for c in got), [(c.name, c.details) for c in got if not c.passed][:3]
    replays = [c for c in got if c.name.startswith("graph replay == eager call")]
    assert replays and all(c.details["written"] > 0 for c in replays), [(c.name, c.details) for c in replays]


def test_the_graph_stage_shows_families_each_entry_points_own_signature():
    # RoPE passes `inv_freq` only to entry points that take it (COS_SIN 'sincos' needs it); behind a stand-in
    # with a bare (*args, **kwargs) signature that candidate raised in the graph stage of a GPU audit.
    family = load_family("rope")
    source = family.root_source()
    impl = load_source(write_knobs(source, {**read_knobs(source), "COS_SIN": "sincos"}), "graph_rope_sincos")
    got = audit_checks(family, impl, 0, "cpu")
    assert all(c.passed for c in got), [(c.name, c.details) for c in got if not c.passed][:3]


def test_keyword_and_tuple_arguments_are_put_back_too():
    rows, out = (torch.zeros(3), torch.ones(3)), torch.zeros(3)
    r = replay_check(lambda o, rows: o.copy_(rows[0] + rows[1]), out, rows=rows, capture=Inert)
    assert (r.written, r.differ) == (1, 3) and torch.equal(out, torch.zeros(3))


def test_audit_checks_judge_the_replays_and_name_each_entry_point():
    family = load_family("rmsnorm")
    impl = roots(("rmsnorm",))["rmsnorm"]
    good = audit_checks(family, impl, 0, "cpu")
    assert all(c.passed for c in good), [c for c in good if not c.passed]
    assert {c.name.split(": ")[1].split(" ")[0] for c in good if c.name.startswith("graph replay")} == \
        {"rmsnorm_full", "rmsnorm_decode"}
    bad = audit_checks(family, impl, 0, "cpu", capture=Inert)  # replays that launch nothing
    failed = [c for c in bad if not c.passed]
    assert any(c.name.startswith("replayed: ") for c in failed)  # the cases' own checks see the unwritten outputs
    assert {c.kind for c in failed if c.name.startswith("graph replay")} == {"consistency"}

    def refuse(fn):
        raise RuntimeError("operation not permitted when stream is capturing")

    no_graph = [c for c in audit_checks(family, impl, 0, "cpu", capture=refuse) if not c.passed]
    assert no_graph and all(c.kind == "graph" for c in no_graph)  # eager outputs stand, so only these fail
    assert "not permitted" in no_graph[0].details["first_failure"]
