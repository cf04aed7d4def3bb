"""Every family's entry points as `torch.library` custom ops under the namespace `tik_evo::`.

    import tik_evo.ops as T
    y = T.rmsnorm(x, w, 1e-6)                           # torch.ops.tik_evo.rmsnorm: the root's full-sequence path
    y = T.rmsnorm(x, w, 1e-6, decode=True)              # the decode path: the same bits, tuned for few rows
    name = T.kernel_set({"rope": "rope_kernel.py"}, attention_set="hopper")
    y = T.attention_prefill(q, k, v, scale, kernels=name)

The ops are functional: each allocates and returns its outputs, where the kernel files' entry points write into
`out` arguments. Functional ops need no functionalization under torch.compile (no mutation to track, no aliasing
to reason about), may have `register_autograd` (torch refuses autograd formulas on ops that mutate their inputs),
and AOTAutograd can trace their backward as a graph of further ops. The cost is an allocation per call, which the
caching allocator makes cheap; the one exception is the KV-cache append, whose point is to write a cache the
caller owns (`mutates_args=("k_cache", "v_cache")`).

Every op takes `kernels`, the name of a registered set of implementations (`registry.py`): "root" by default, or
what `kernel_set` returns for named sets, kernel files or a run's best. Fake (meta) kernels give shapes for
torch.compile and export; the backward ops (`*_backward`) are ops too, so a compiled backward calls the same
kernels opaquely. Under TRITON_INTERPRET=1 the interpreter's fixes (`tik_evo.interp`) are installed on import, so
CPU runs check bits as the tests do.
"""

from __future__ import annotations

from tik_evo import interp

if interp.interpreting():
    interp.install()

from tik_evo.ops.attention import (  # noqa: E402
    attention_decode,
    attention_decode_paged,
    attention_packed,
    attention_prefill,
    kv_append,
    kv_append_decode,
    kv_append_slots,
)
from tik_evo.ops.matmul import (  # noqa: E402
    linear,
    linear_grouped,
    logprob,
    moe_combine,
    moe_dispatch,
    moe_routing,
)
from tik_evo.ops.registry import FAMILIES, impl, kernel_set, register, registered  # noqa: E402
from tik_evo.ops.rowwise import add_rmsnorm, embedding, qk_rmsnorm, rmsnorm, rope, silu_mul  # noqa: E402

# The forward ops a user calls, by name (the backward ops are registered too: `torch.ops.tik_evo.*_backward`).
OPS = ("rmsnorm", "add_rmsnorm", "qk_rmsnorm", "rope", "silu_mul", "embedding", "linear", "linear_grouped",
       "logprob", "moe_routing", "moe_dispatch", "moe_combine", "attention_prefill", "attention_packed",
       "attention_decode", "attention_decode_paged", "kv_append", "kv_append_decode", "kv_append_slots")

__all__ = ["FAMILIES", "OPS", "impl", "kernel_set", "register", "registered", "rmsnorm", "add_rmsnorm", "qk_rmsnorm",
           "rope", "silu_mul", "embedding", "linear", "linear_grouped", "logprob", "moe_routing", "moe_dispatch",
           "moe_combine", "attention_prefill", "attention_packed", "attention_decode", "attention_decode_paged",
           "kv_append", "kv_append_decode", "kv_append_slots"]
assert set(__all__) >= set(OPS)
