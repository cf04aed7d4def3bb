"""Static scan: the cheapest audit stage. Refuses sources that could cheat the audit or escape it."""

from __future__ import annotations

import ast

from tik_evo.family import Check
from tik_evo.knobs import KnobsError, read_knobs

# triton.language.extra.cuda: device intrinsics (libdevice, grid-dependency control), nothing host-side.
# Gluon (Triton's explicit-layout language) and its Hopper ops and host TMA descriptors: kernels, nothing else.
# tik_evo.launch: the fast launch path (it calls the compiled kernel Triton built; no timing, no results).
ALLOWED_IMPORTS = {"tik_evo.launch", "torch", "triton", "triton.language", "triton.language.extra.cuda", "math", "functools", "typing",
                   "__future__", "triton.experimental", "triton.experimental.gluon",
                   "triton.experimental.gluon.language", "triton.experimental.gluon.language.nvidia.hopper",
                   "triton.experimental.gluon.nvidia.hopper"}
# Names whose use means side streams, patched timers, cached results or escaping the sandbox.
FORBIDDEN_ATTRS = {"Stream", "stream", "Event", "set_stream", "do_bench", "do_bench_cudagraph", "perf_counter",
                   "CUDAGraph", "graph", "environ", "system", "popen", "_exit"}
# Dunder access is how sandboxes are escaped (__builtins__, __globals__, __subclasses__, ...).
ALLOWED_DUNDERS = {"__name__", "__doc__", "__file__"}
FORBIDDEN_CALLS = {"open", "eval", "exec", "compile", "__import__", "globals", "setattr", "getattr", "input"}


def _dunder(name: str) -> bool:
    return name.startswith("__") and name.endswith("__") and name not in ALLOWED_DUNDERS


def scan(source: str, entry_points: tuple[str, ...], knob_names: tuple[str, ...] = ()) -> list[Check]:
    try:
        tree = ast.parse(source)
    except SyntaxError as e:
        return [Check("parses", False, "static", {"error": f"line {e.lineno}: {e.msg}"})]
    problems: list[str] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            problems += [f"line {node.lineno}: import {a.name}" for a in node.names if a.name not in ALLOWED_IMPORTS]
        elif isinstance(node, ast.ImportFrom):
            if (node.module or "") not in ALLOWED_IMPORTS:
                problems.append(f"line {node.lineno}: from {node.module} import ...")
        elif isinstance(node, ast.Attribute) and (node.attr in FORBIDDEN_ATTRS or _dunder(node.attr)):
            problems.append(f"line {node.lineno}: .{node.attr}")
        elif isinstance(node, ast.Name) and _dunder(node.id) and node.id not in ALLOWED_DUNDERS:
            problems.append(f"line {node.lineno}: {node.id}")
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in FORBIDDEN_CALLS:
            problems.append(f"line {node.lineno}: {node.func.id}()")
    defined = {n.name for n in tree.body if isinstance(n, ast.FunctionDef)}
    missing = [e for e in entry_points if e not in defined]
    out = [Check("parses", True, "static"),
           Check("allowed constructs only", not problems, "static", {"violations": problems[:20]}),
           Check("entry points defined", not missing, "static", {"missing": missing})]
    try:
        knobs = read_knobs(source)
        unknown = [k for k in knob_names if k not in knobs]
        out.append(Check("KNOBS dict", True, "static", {"knobs": knobs, "absent_knobs": unknown}))
    except KnobsError as e:
        out.append(Check("KNOBS dict", not knob_names, "static", {"error": str(e)}))
    return out
