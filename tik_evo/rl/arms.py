"""The arms compared by the GRPO benchmark (issue 44), each a way to run the same loop on the same model:

- A, the baseline people run: rollout and training through a torch stack (`baseline_ops`: on a GPU cuBLAS linear
  layers, SDPA / flash attention and Liger-Kernel's RMSNorm, RoPE, SwiGLU and cross-entropy where importable; on
  the CPU `TorchOps`), **and the recompute pass**: before the update, the old log-probs are recomputed by a
  training forward, because the rollout's differ from the trainer's in some bits.
- B, the unified kernels: rollout on the families' decode paths, training on their full paths (`KernelOps`), and
  **no recompute**: the rollout's log-probs are the old log-probs, and equal the training forward's bit for bit,
  so in synchronous mode every PPO ratio of the first update is exactly 1.0.
- C, A without the recompute: the rollout's mismatched log-probs reused, to show what the mismatch does.

`mismatched_decode` builds a deliberately wrong variant of B (the rollout's linear layers summing their reduction in
two halves rounded to bf16, as a split-K GEMM with bf16 partials does; training keeps the kernels): its ratios are
not all 1.0.
"""

from __future__ import annotations

from dataclasses import dataclass
from types import ModuleType

import torch

from tik_evo_kernels.autograd import KernelOps, TorchOps


@dataclass(frozen=True)
class Arm:
    name: str
    kernels: bool  # rollout and training on the unified kernels (else the baseline's torch stack)
    recompute: bool  # old log-probs recomputed by a training forward (else the rollout's reused)
    doc: str


ARMS = {
    "A": Arm("A", False, True, "torch baseline (cuBLAS, SDPA/flash, Liger where importable) + recompute pass"),
    "B": Arm("B", True, False, "unified kernels, rollout log-probs reused (no recompute)"),
    "C": Arm("C", False, False, "torch baseline, rollout's mismatched log-probs reused (A without recompute)"),
}


def parse_arms(text: str) -> list[Arm]:
    names = [n.strip() for n in text.split(",") if n.strip()]
    bad = [n for n in names if n not in ARMS]
    if bad or not names:
        raise ValueError(f"arms {text!r}: expected a comma-separated subset of {', '.join(ARMS)}")
    return [ARMS[n] for n in names]


def baseline_ops(device: str) -> tuple[object, list[str]]:
    """The strongest torch stack available here for arms A and C, and notes on what it is: on a GPU the vendor
    ops (`tik_evo.rl.vendor.VendorOps`: bf16 cuBLAS and flash attention, Liger-Kernel where it imports and
    passes a probe); on the CPU TorchOps (fp32 arithmetic, bf16 in and out)."""
    if torch.device(device).type != "cuda":
        return TorchOps(), ["cpu: TorchOps (fp32 arithmetic, SDPA), no vendor kernels"]
    from tik_evo.rl.vendor import VendorOps

    ops = VendorOps(device)
    return ops, list(ops.notes)


def arm_ops(arm: Arm, model, device: str) -> tuple[object | None, object, list[str]]:
    """(rollout ops, training ops, notes) of an arm on a model: rollout ops None means the model's kernels."""
    if arm.kernels:
        return None, KernelOps(model.k), [f"unified kernels: {', '.join(sorted(model.k))}"]
    ops, notes = baseline_ops(device)
    return ops, ops, notes


class _Override:
    """A kernel module with some entry points replaced (attribute access falls through to the module)."""

    def __init__(self, base: ModuleType, **entries):
        self._base, self._entries = base, entries

    def __getattr__(self, name: str):
        entries = self.__dict__["_entries"]
        return entries[name] if name in entries else getattr(self.__dict__["_base"], name)


def mismatched_decode(impls: dict[str, ModuleType]) -> dict[str, object]:
    """`impls` with the linear family's decode entry point replaced by a split-K product in torch (the two halves
    of the reduction each summed in fp32 and rounded to bf16, then added: the rollout's projections rounded
    differently); the full path, grouped launches and backward stay the kernel file's."""
    def linear_decode(x, weight, bias, out, out32=None):
        half = x.shape[1] // 2
        xf, wf = x.float(), weight.float()
        y = (xf[:, :half] @ wf[:, :half].t()).to(out.dtype) + (xf[:, half:] @ wf[:, half:].t()).to(out.dtype)
        out.copy_(y if bias is None else y + bias)

    return {**impls, "linear": _Override(impls["linear"], linear_decode=linear_decode)}
