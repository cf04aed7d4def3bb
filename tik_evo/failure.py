"""Failure kinds of an audit, named the same in the judge, its shards and the candidate's runner."""

from __future__ import annotations

# Triton raises these when a (legal) knob choice cannot be built; OutOfResources when it builds but does not fit
# the GPU (shared memory, registers), which is worth telling apart: a smaller tile or fewer stages may fit.
COMPILE_ERRORS = {"CompilationError", "CompileTimeAssertionFailure"}
RESOURCE_ERRORS = {"OutOfResources"}


def error_kind(e: BaseException) -> str:
    """The failure kind of an exception raised by a candidate (or carried back from its runner as `kind`)."""
    kind = getattr(e, "kind", None)
    name = getattr(e, "type_name", None) or type(e).__name__
    if kind and kind != "exception":
        return kind
    if name in RESOURCE_ERRORS:
        return "resources"
    return "compile" if name in COMPILE_ERRORS or "Compil" in name else "exception"


def clip(text: str, n: int = 1500) -> str:
    """``text`` cut to about ``n`` characters, keeping its start and its end (a traceback's last lines name the
    error: a cut that keeps only the start loses them)."""
    if len(text) <= n:
        return text
    half = n // 2
    return f"{text[:half]}\n[... {len(text) - 2 * half} characters ...]\n{text[-half:]}"
