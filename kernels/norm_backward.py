"""RMSNorm's backward in one pass for the policy update (kernels/autograd.py: RMSNorm, QK RMSNorm and add + RMSNorm;
fp32 math, checked by tolerance: backward has no bitwise contract).

For rows x of width H, y = x * rstd * w with rstd = 1 / sqrt(mean(x^2) + eps):
    dx = rstd * (dy*w - xhat * mean(dy*w * xhat)),  xhat = x * rstd;   dw = sum over rows of dy * xhat.
Each program walks tiles of whole rows (several rows per tile for narrow ones, as QK norm's 128-wide heads), keeps
its share of dw in fp32 and stores it to a workspace row; the caller sums the workspace. Replaces eager torch
that made fp32 copies of x and dy and read them about ten times.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from tik_evo.launch import cdiv, fast, pow2

# Schedule choices (none changes what is computed beyond fp32 summation order): TILE elements per step (rows of a
# narrow width share it); PREFETCH loads a program's next tile before working on the current one, so a program
# keeps a tile's loads in flight through its row reductions; DW_IN_TILE keeps dw's partial sums per tile
# position and reduces over rows once at the end, instead of a reduction across warps every step (QK norm's
# 128-wide heads: 32 rows a tile); PROGRAMS_PER_SM sizes the persistent grid (programs past what fits on an SM at
# once wait for a whole program to finish; 0: as many as fit, from the compiled kernel's registers); NUM_WARPS 0
# takes 4 warps up to 2048 elements a tile, else 8; MIN_TILES_PER_PROGRAM caps the grid so each program walks at
# least that many tiles (a program's prologue and dw epilogue are paid once per program).
# tik-evo bench norm-backward times them against each other. These are among the best schedules over the
# policy step's five shapes on an H100 (results/ops/gpu_2026-12-06.md section 1: 348 us in all against 517 us for
# the kernel before, the mean of two runs; the next three schedules were within the 3-5% two runs differ by).
KNOBS = {"TILE": 4096, "PREFETCH": True, "DW_IN_TILE": True, "PROGRAMS_PER_SM": 0, "NUM_WARPS": 0,
         "MIN_TILES_PER_PROGRAM": 2}


@triton.jit
def _tile(first, n_rows, H, cols, cmask, ROWS: tl.constexpr):
    """(offsets, mask) of the ROWS rows from `first`."""
    rows = first + tl.arange(0, ROWS)
    return rows.to(tl.int64)[:, None] * H + cols[None, :], (rows[:, None] < n_rows) & cmask[None, :]


@triton.jit
def _load_rows(x_ptr, dy_ptr, dres_ptr, first, n_rows, H, cols, cmask, ROWS: tl.constexpr, HAS_RES: tl.constexpr):
    """x, dy and (with HAS_RES) the residual output's gradient of one tile, as stored (bf16)."""
    offs, mask = _tile(first, n_rows, H, cols, cmask, ROWS)
    x = tl.load(x_ptr + offs, mask=mask, other=0.0)
    dy = tl.load(dy_ptr + offs, mask=mask, other=0.0)
    if HAS_RES:
        dres = tl.load(dres_ptr + offs, mask=mask, other=0.0)
    else:
        dres = dy
    return x, dy, dres


@triton.jit
def _rms_bwd_kernel(x_ptr, w_ptr, dy_ptr, dres_ptr, dx_ptr, ws_ptr, n_rows, H, eps,
                    ROWS: tl.constexpr, BLOCK_H: tl.constexpr, HAS_RES: tl.constexpr, PREFETCH: tl.constexpr,
                    DW_IN_TILE: tl.constexpr):
    cols = tl.arange(0, BLOCK_H)
    cmask = cols < H
    w = tl.load(w_ptr + cols, mask=cmask, other=0.0).to(tl.float32)
    step = tl.num_programs(0) * ROWS
    start = tl.program_id(0) * ROWS
    if DW_IN_TILE:
        dw = tl.zeros([ROWS, BLOCK_H], dtype=tl.float32)
    else:
        dw = tl.zeros([BLOCK_H], dtype=tl.float32)
    if PREFETCH:
        x_n, dy_n, dres_n = _load_rows(x_ptr, dy_ptr, dres_ptr, start, n_rows, H, cols, cmask, ROWS, HAS_RES)
    for first in range(start, n_rows, step):
        if PREFETCH:  # this tile was loaded a step ago; load the next one (masked off past the end) now
            x, dy, dres = x_n, dy_n, dres_n
            x_n, dy_n, dres_n = _load_rows(x_ptr, dy_ptr, dres_ptr, first + step, n_rows, H, cols, cmask, ROWS,
                                           HAS_RES)
        else:
            x, dy, dres = _load_rows(x_ptr, dy_ptr, dres_ptr, first, n_rows, H, cols, cmask, ROWS, HAS_RES)
        x = x.to(tl.float32)
        dy = dy.to(tl.float32)
        rstd = 1.0 / tl.sqrt(tl.sum(x * x, axis=1) / H + eps)
        xhat = x * rstd[:, None]
        gxhat = dy * w[None, :]
        dx = rstd[:, None] * (gxhat - xhat * (tl.sum(gxhat * xhat, axis=1) / H)[:, None])
        if HAS_RES:  # add + RMSNorm: the gradient arriving on the sum's own output joins
            dx += dres.to(tl.float32)
        offs, mask = _tile(first, n_rows, H, cols, cmask, ROWS)
        tl.store(dx_ptr + offs, dx.to(dx_ptr.dtype.element_ty), mask=mask)
        if DW_IN_TILE:
            dw += dy * xhat
        else:
            dw += tl.sum(dy * xhat, axis=0)
    if DW_IN_TILE:
        dw_row = tl.sum(dw, axis=0)
    else:
        dw_row = dw
    tl.store(ws_ptr + tl.program_id(0).to(tl.int64) * H + cols, dw_row, mask=cmask)


def resident_programs(n_regs: int, shared: int, warps: int, regs_per_sm: int = 65536,
                      shared_per_sm: int = 232448, warps_per_sm: int = 64, blocks_per_sm: int = 32) -> int:
    """How many programs of a compiled kernel an SM holds at once (registers, shared memory, warps, blocks); at
    least one. Registers are allocated per warp in units of 256."""
    regs_per_warp = -(-max(n_regs, 1) * 32 // 256) * 256
    fits = [regs_per_sm // (regs_per_warp * warps), warps_per_sm // warps, blocks_per_sm]
    if shared:
        fits.append(shared_per_sm // shared)
    return max(1, min(fits))


def launch_constants(H: int, has_res: bool, knobs: dict | None = None) -> dict:
    """The kernel's constexprs and warp count for rows of width H under `knobs` (default KNOBS)."""
    k = KNOBS if knobs is None else knobs
    block = pow2(H)
    rows = max(1, k["TILE"] // block)
    return {"ROWS": rows, "BLOCK_H": block, "HAS_RES": has_res, "PREFETCH": k["PREFETCH"],
            "DW_IN_TILE": k["DW_IN_TILE"], "num_warps": k["NUM_WARPS"] or (4 if block * rows <= 2048 else 8)}


_RESIDENT: dict[tuple, int] = {}  # (device, launch constants) -> programs an SM holds


def _programs(device: torch.device, tiles: int, warmup_args, consts: dict) -> int:
    """The persistent grid: PROGRAMS_PER_SM per SM, or with 0 as many as the SMs hold at once (read from the
    compiled kernel), so no program waits for another to finish its whole walk; and no more programs than give
    each MIN_TILES_PER_PROGRAM tiles."""
    most = cdiv(tiles, KNOBS["MIN_TILES_PER_PROGRAM"])
    if device.type != "cuda":
        return min(most, 4)  # the interpreter: several programs' worth of rows each
    props = torch.cuda.get_device_properties(device)
    per_sm = KNOBS["PROGRAMS_PER_SM"]
    if not per_sm:
        key = (device, tuple(sorted(consts.items())))
        if key not in _RESIDENT:
            k = _rms_bwd_kernel.warmup(*warmup_args(), grid=(1,), **consts)
            k._init_handles()
            _RESIDENT[key] = resident_programs(
                k.n_regs, k.metadata.shared, consts["num_warps"], getattr(props, "regs_per_multiprocessor", 65536),
                getattr(props, "shared_memory_per_multiprocessor", 232448),
                getattr(props, "max_threads_per_multi_processor", 2048) // 32)
        per_sm = _RESIDENT[key]
    return min(most, per_sm * props.multi_processor_count)


def rms_backward(x: torch.Tensor, weight: torch.Tensor, grad_out: torch.Tensor, eps: float,
                 grad_res: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(grad_x, grad_weight) of y = x * rsqrt(mean(x^2) + eps) * weight over the last dimension of x; with
    `grad_res` (add + RMSNorm, x being the sum h) that gradient is added to grad_x."""
    H = x.shape[-1]
    x2, dy2 = x.reshape(-1, H).contiguous(), grad_out.reshape(-1, H).contiguous()
    dres = grad_res.reshape(-1, H).contiguous() if grad_res is not None else dy2
    n_rows = x2.shape[0]
    dx = torch.empty_like(x2)
    if n_rows == 0:
        return dx.view(x.shape), torch.zeros_like(weight)
    consts = launch_constants(H, grad_res is not None)
    rows = consts["ROWS"]
    # the warmup compile (PROGRAMS_PER_SM 0, once per launch constants) takes an empty workspace of the right type
    args = lambda ws: (x2, weight, dy2, dres, dx, ws, n_rows, H, eps)  # noqa: E731
    programs = _programs(x.device, cdiv(n_rows, rows), lambda: args(dx.new_empty(0, dtype=torch.float32)), consts)
    ws = torch.empty((programs, H), dtype=torch.float32, device=x.device)
    fast(_rms_bwd_kernel)[(programs,)](*args(ws), **consts)
    return dx.view(x.shape), ws.sum(0).to(weight.dtype)


# An H200's SM resources, for an offline report's residency (no GPU needed).
H200 = {"sms": 132, "regs_per_sm": 65536, "shared_per_sm": 232448, "warps_per_sm": 64}


def offline_schedules(shapes: dict, schedules: list[dict]) -> list[dict]:
    """Each schedule compiled for sm_90a at each shape (the launch's constants, width 16-byte aligned as the
    runtime specialises it), with the residency it implies on an H200: `shapes` {name: (rows, width, with the
    residual output's gradient)}, `schedules` a list of KNOBS changes (tik-evo bench norm-backward --offline)."""
    from tik_evo.sm90 import compile_sm90

    ptrs = {"x_ptr": "*bf16", "w_ptr": "*bf16", "dy_ptr": "*bf16", "dres_ptr": "*bf16", "dx_ptr": "*bf16",
            "ws_ptr": "*fp32"}
    sig = {**ptrs, "n_rows": "i32", "H": "i32", "eps": "fp32"}
    rows_out = []
    for name, (rows, width, res) in shapes.items():
        tiles = -(-rows // launch_constants(width, res)["ROWS"])
        row = {"shape": name, "rows": rows, "width": width, "residual": res, "tiles": tiles, "schedules": []}
        for sched in schedules:
            consts = launch_constants(width, res, {**KNOBS, **sched})
            warps = consts.pop("num_warps")
            rep = compile_sm90(_rms_bwd_kernel, sig, consts, warps, 3, set(ptrs) | {"H"})
            held = resident_programs(rep["registers"], rep["shared_bytes"], warps, H200["regs_per_sm"],
                                     H200["shared_per_sm"], H200["warps_per_sm"])
            handed = min(-(-tiles // sched["MIN_TILES_PER_PROGRAM"]), (sched["PROGRAMS_PER_SM"] or held) * H200["sms"])
            row["schedules"].append({"knobs": dict(sched), "num_warps": warps, "registers": rep["registers"],
                                     "spill_store_bytes": rep["spill_store_bytes"], "instructions": rep["instructions"],
                                     "programs_an_sm_holds": held, "programs": handed,
                                     "rounds_of_programs": -(-handed // (held * H200["sms"])),
                                     "warps_resident_per_sm": min(held, -(-handed // H200["sms"])) * warps})
        rows_out.append(row)
        print(name, [(e["knobs"]["PREFETCH"], e["knobs"]["PROGRAMS_PER_SM"], e["num_warps"], e["registers"],
                      e["programs_an_sm_holds"], e["rounds_of_programs"]) for e in row["schedules"]], flush=True)
    return rows_out
