"""The benchmark suites behind `tik-evo bench NAME [ARGS ...]`, imported as `tik_evo_bench`.

The folder `benchmarks/` installs under the import name `tik_evo_bench` (as `kernels/` installs as
`tik_evo_kernels`), so a benchmark module never takes a generic name such as `benchmarks`. `SUITES` below is the one
list of what `tik-evo bench` runs: each suite is a module with `main(argv) -> int` (its own argparse command line;
`--help` describes it), a one-line description, and whether it needs a GPU (CPU suites compile offline, summarise a
run or time the engine). `tik-evo bench` (or `tik-evo bench --list`) prints the list. Shared helpers (the JSON
header every result carries, writing an output file) are in `tik_evo_bench.common`.

On a machine without tik-evo installed (the bare GPU image), `PYTHONPATH=$PWD python3 -m tik_evo.cli bench NAME`
works too: importing `tik_evo` maps the two names to the folders.
"""

from __future__ import annotations

import importlib
import inspect
import sys
from dataclasses import dataclass


@dataclass(frozen=True)
class Suite:
    name: str  # the NAME of `tik-evo bench NAME`
    module: str  # the module whose main(argv) runs it
    about: str  # one line for `tik-evo bench --list`
    gpu: bool  # needs a CUDA GPU for a measurement (a --smoke / --dry-run form may still run on the CPU)


_B = "tik_evo_bench."
SUITES: dict[str, Suite] = {s.name: s for s in (
    # a family's own bench, and the search against plain samplers
    Suite("attention", "tik_evo_kernels.attention.bench", "attention against cuDNN SDPA / flash: named sets, a "
          "run's best or kernel files, the grid's cells", True),
    Suite("search", "tik_evo.search_bench", "gap to a known good set closed by the engine vs plain TPE / random "
          "(CAMPAIGN ...)", True),
    Suite("rl", "tik_evo.rl.bench", "a GRPO loop: the unified kernels reusing rollout log-probs vs a vendor stack "
          "that recomputes them (arms A/B/C)", True),
    Suite("rl-parity", "tik_evo.rl.parity", "reward parity: GRPO runs of every arm over seeds (resumable), mean "
          "reward curves and B vs A within noise", True),
    # operator families and the models composed of them
    Suite("ops", _B + "ops_gpu", "the operator families against torch eager, torch.compile, Liger / cuBLAS", True),
    Suite("ops-rowwise", _B + "ops_rowwise_gpu", "the row-wise and elementwise families alone (what `ops` runs "
          "for them)", True),
    Suite("ops-matmul", _B + "ops_matmul_gpu", "linear, logprob and moe_routing alone (what `ops` runs for them)",
          True),
    Suite("model", _B + "model_consistency_gpu", "rollout vs training log-probs of a whole model, bit for bit",
          True),
    Suite("model-speed", _B + "model_speed_gpu", "a model's training forward on the kernels vs cuBLAS / SDPA / "
          "torch", True),
    Suite("model-graphs", _B + "model_graphs_gpu", "a rollout with every kernel call replayed from a CUDA graph",
          True),
    Suite("hf", _B + "hf_gpu", "transformers Qwen3 / Qwen2.5 models patched by tik_evo.hf: generate vs training "
          "log-prob bits, forward time vs Liger and SDPA, torch.compile (--smoke: CPU)", True),
    Suite("policy", _B + "policy_gpu", "the policy update (forward + backward) on the kernels vs a torch trainer",
          True),
    Suite("policy-glue", _B + "policy_glue_gpu", "the policy update's glue kernels vs the torch code they "
          "replaced", True),
    Suite("norm-backward", _B + "norm_backward_gpu", "RMSNorm backward schedules at the policy step's shapes",
          True),
    Suite("linear-backward", _B + "linear_backward_gpu", "the dense linear backward vs cuBLAS", True),
    Suite("linear-grouped", _B + "linear_grouped_gpu", "an MoE layer's experts in grouped launches vs "
          "torch._grouped_mm and a cuBLAS loop (--smoke: the backward cell on the CPU)", True),
    # attention studies beside the family's bench
    Suite("attention-ab", _B + "attention_prefill_ab", "prefill variants vs cuDNN in interleaved graph rounds",
          True),
    Suite("attention-ws", _B + "attention_ws_gpu", "the warp-specialised Gluon prefill: bits, then speed "
          "(--smoke: a quick bits-only launch)", True),
    Suite("attention-gluon-decode", _B + "attention_gluon_decode_gpu", "the Gluon decode / prefill vs the Triton "
          "kernels, bit for bit", True),
    Suite("attention-host-time", _B + "attention_host_time_gpu", "host time per attention call vs torch SDPA",
          True),
    Suite("paged-decode", _B + "paged_decode_gpu", "decode from a paged KV cache vs the contiguous decode, SDPA and "
          "flash-attn's paged kernel; bits paged == contiguous (--smoke: tiny, on the CPU)", True),
    # Nsight Compute drivers (run under `ncu`; `summarize` reads the exported report)
    Suite("attention-ncu", _B + "attention_decode_profile", "attention launches under Nsight Compute "
          "(run / summarize)", True),
    Suite("linear-ncu", _B + "linear_profile", "linear launches and cuBLAS under Nsight Compute (run / summarize)",
          True),
    Suite("rowwise-ncu", _B + "rowwise_ncu", "row-wise kernels vs Liger under Nsight Compute (run / summarize)",
          True),
    # offline sm_90a compiles: no GPU needed
    Suite("attention-compile", _B + "attention_compile_report", "attention kernels compiled for sm_90a: shared "
          "memory, registers, spills, wgmma / TMA", False),
    Suite("linear-compile", _B + "linear_compile_report", "linear kernels compiled for sm_90a", False),
    Suite("routing-compile", _B + "routing_compile_report", "the MoE routing kernel compiled for sm_90a: "
          "instructions per token", False),
    # the engine and the audit
    Suite("family-checks", _B + "family_checks_gpu", "every family's own checks on its root", True),
    Suite("knob-moves", _B + "knob_moves_gpu", "every one-knob move of each family's root through its checks",
          True),
    Suite("audit", _B + "audit_gpu", "the audit on a GPU: hostile candidates, false rejections, audit time",
          True),
    Suite("audit-profile", _B + "audit_profile_gpu", "where an audit's correctness stages spend their time", True),
    Suite("concurrent-audits", _B + "concurrent_audits_gpu", "concurrent audits on several GPUs of one host",
          True),
    Suite("engine-overhead", _B + "engine_overhead", "the engine's own time per step, the audit synthetic", False),
    Suite("ray-startup", _B + "ray_startup", "an audit worker's start-up through a Ray task against the local "
          "executors (CPU, a local cluster)", False),
    Suite("audit-throughput", _B + "audit_throughput", "offspring audited per minute of runs, from their exports "
          "(LABEL=EXPORT ...)", False),
    Suite("campaign-summary", _B + "campaign_summary", "a finished run directory as a results file (RUN_DIR "
          "OUT.json)", False),
)}


def listing() -> str:
    """The registry as `tik-evo bench --list` prints it."""
    width = max(map(len, SUITES))
    lines = ["tik-evo bench NAME [ARGS ...]  (tik-evo bench NAME --help: a suite's arguments)"]
    lines += [f"  {s.name:<{width}}  {'GPU' if s.gpu else 'CPU'}  {s.about}" for s in SUITES.values()]
    return "\n".join(lines)


def run(name: str, argv: list[str]) -> int:
    """Import suite `name` and run its main with `argv`. While it runs, sys.argv reads `tik-evo bench NAME ARGS`:
    its usage names the command, and a suite that picks Triton's interpreter at import (`--smoke` / `--dry-run`
    in sys.argv, before Triton loads) sees its arguments; a main without a parameter parses sys.argv itself."""
    saved = sys.argv
    sys.argv = [f"tik-evo bench {name}", *argv]
    try:
        module = importlib.import_module(SUITES[name].module)
        main = module.cli if name == "search" else module.main
        return int((main(list(argv)) if inspect.signature(main).parameters else main()) or 0)
    finally:
        sys.argv = saved
