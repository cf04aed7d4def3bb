"""Read and rewrite a candidate's module-level ``KNOBS = {...}`` dict without executing the source."""

from __future__ import annotations

import ast
import functools
import math
from collections import OrderedDict
from typing import Any

# Sources this process wrote with `write_knobs`, with the KNOBS written into them: they are canonical by
# construction and their KNOBS are known, so reading them back needs no parse (the last few only).
_WRITTEN: OrderedDict[str, dict[str, Any]] = OrderedDict()
_LITERALS = (bool, int, float, str, type(None))


class KnobsError(ValueError):
    pass


# A step reads and rewrites the same few sources several times (parent, offspring, its canonical form), and a
# family's source is thousands of lines: parsing each once saves most of the engine's own time a step.
@functools.lru_cache(maxsize=32)
def _knobs_node(source: str) -> ast.Assign:
    """The module-level KNOBS assignment (shared between callers: read it, never change it)."""
    try:
        tree = ast.parse(source)
    except SyntaxError as e:
        raise KnobsError(f"source does not parse: line {e.lineno}: {e.msg}") from e
    for node in tree.body:
        if (isinstance(node, ast.Assign) and len(node.targets) == 1
                and isinstance(node.targets[0], ast.Name) and node.targets[0].id == "KNOBS"):
            if not isinstance(node.value, ast.Dict):
                raise KnobsError("KNOBS must be a dict literal")
            return node
    raise KnobsError("source has no module-level `KNOBS = {...}` assignment")


def read_knobs(source: str) -> dict[str, Any]:
    if source in _WRITTEN:
        return dict(_WRITTEN[source])
    node = _knobs_node(source)
    try:
        return ast.literal_eval(node.value)
    except ValueError as e:
        raise KnobsError(f"KNOBS must hold literals only: {e}") from e


def knobs_or_none(source: str | None) -> dict[str, Any] | None:
    """The KNOBS of a source, or None for sources without a readable one (e.g. an LLM rewrite)."""
    try:
        return read_knobs(source or "")
    except KnobsError:
        return None


def write_knobs(source: str, knobs: dict[str, Any]) -> str:
    """Return ``source`` with the KNOBS literal replaced; every other line is kept byte for byte."""
    node = _knobs_node(source)
    lines = source.splitlines(keepends=True)
    start, end = node.lineno - 1, node.end_lineno  # type: ignore[attr-defined]
    # One entry per line, so a knob change is a one-line diff.
    new = "KNOBS = {\n" + "".join(f"    {_literal(k)}: {_literal(v)},\n" for k, v in knobs.items()) + "}\n"
    out = "".join(lines[:start]) + new + "".join(lines[end:])
    if all(isinstance(k, str) and isinstance(v, _LITERALS) and (not isinstance(v, float) or math.isfinite(v))
           for k, v in knobs.items()):  # values whose text reads back as the same value
        _WRITTEN[out] = dict(knobs)
        _WRITTEN.move_to_end(out)
        while len(_WRITTEN) > 32:
            _WRITTEN.popitem(last=False)
    return out


def _literal(value: Any) -> str:
    """``repr``, but plain strings in double quotes as the kernel files write them, so a root's own KNOBS
    rewritten with its own values is the root byte for byte (one source, one hash, one audit)."""
    if isinstance(value, str) and not any(c in value for c in "\"\\'\n"):
        return f'"{value}"'
    return repr(value)


def canonical_source(source: str) -> str:
    """``source`` with its KNOBS written as `write_knobs` writes them (unchanged if it has none readable): two
    sources that differ only in how the same KNOBS are laid out get the same text and so the same hash."""
    if source in _WRITTEN:
        return source
    try:
        return write_knobs(source, read_knobs(source))
    except KnobsError:
        return source
