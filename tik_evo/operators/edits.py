"""Parse an LLM operator's answer and apply it to the parent source.

An answer holds one ```json block (scope, rationale, expected effect, follow-up opportunities) and either
SEARCH/REPLACE edits or one whole file in a ```python block. Edits apply exactly first; when the search text
is not there verbatim (models often re-indent or drop trailing spaces), line by line ignoring surrounding
whitespace, re-indenting the replacement by the indentation difference. Anything else is an
:class:`EditError` naming the edit, so the failed action says what went wrong.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

SCOPES = ("full", "decode", "joint")
PATHS = ("full", "decode")
MAX_FOLLOW_UPS = 3  # each one becomes a pending opportunity; more would flood the queue

_EDIT = re.compile(r"<{5,9} ?SEARCH[^\n]*\n(.*?)\n?={5,9}[^\n]*\n(.*?)\n?>{5,9} ?REPLACE", re.DOTALL)
_FENCE = re.compile(r"```([A-Za-z0-9_+-]*)[^\n]*\n(.*?)\n```", re.DOTALL)


class EditError(ValueError):
    pass


@dataclass
class Answer:
    scope: str | None = None
    rationale: str = ""
    expected: str = ""
    follow_ups: list[dict[str, Any]] = field(default_factory=list)
    edits: list[tuple[str, str]] = field(default_factory=list)
    file: str | None = None
    notes: list[str] = field(default_factory=list)  # tolerated problems, kept in the action record


def parse_answer(text: str) -> Answer:
    ans = Answer()
    fences = _FENCE.findall(text)
    meta = next((body for lang, body in fences if lang.lower() == "json"), None)
    if meta is None:
        ans.notes.append("no ```json block: scope, rationale and follow-ups missing")
    else:
        _read_meta(ans, meta)
    ans.edits = [(s, r) for s, r in _EDIT.findall(text)]
    if not ans.edits:
        code = [body for lang, body in fences if lang.lower() in ("python", "py", "")]
        if code:
            ans.file = max(code, key=len) + "\n"
    return ans


def _read_meta(ans: Answer, raw: str) -> None:
    try:
        meta = json.loads(raw)
    except json.JSONDecodeError as e:
        ans.notes.append(f"```json block does not parse ({e}); ignored")
        return
    if not isinstance(meta, dict):
        ans.notes.append("```json block is not an object; ignored")
        return
    scope = str(meta.get("scope", "")).lower()
    ans.scope = scope if scope in SCOPES else None
    if scope and ans.scope is None:
        ans.notes.append(f"declared scope {scope!r} is not one of {list(SCOPES)}")
    ans.rationale = str(meta.get("rationale", ""))[:2000]
    ans.expected = str(meta.get("expected_effect", meta.get("expected", "")))[:1000]
    for f in (meta.get("follow_ups") or [])[:MAX_FOLLOW_UPS]:
        if not isinstance(f, dict) or not f.get("mechanism"):
            ans.notes.append(f"follow-up without a mechanism ignored: {str(f)[:80]}")
            continue
        paths = [p for p in (f.get("paths") or PATHS) if p in PATHS] or list(PATHS)
        kind = re.sub(r"[^a-z0-9_]+", "_", str(f.get("kind") or "follow_up").lower())[:40]
        ans.follow_ups.append({"kind": kind, "mechanism": str(f["mechanism"])[:600], "paths": paths})


def apply_answer(source: str, ans: Answer) -> tuple[str, list[str]]:
    """The new source and how each edit matched ("exact" | "whitespace"); raises EditError."""
    if ans.edits:
        how = []
        for i, (search, replace) in enumerate(ans.edits, 1):
            source, mode = apply_edit(source, search, replace, i, len(ans.edits))
            how.append(mode)
        return source, how
    if ans.file is not None:
        return ans.file, ["file"]
    raise EditError("the answer holds neither SEARCH/REPLACE edits nor a ```python file")


def apply_edit(source: str, search: str, replace: str, i: int = 1, n: int = 1) -> tuple[str, str]:
    where = f"edit {i} of {n}"
    if not search.strip():
        raise EditError(f"{where}: empty SEARCH text")
    count = source.count(search)
    if count == 1:
        return source.replace(search, replace, 1), "exact"
    if count > 1:
        raise EditError(f"{where}: SEARCH text occurs {count} times; include more lines to make it unique")
    return _apply_tolerant(source, search, replace, where), "whitespace"


def _apply_tolerant(source: str, search: str, replace: str, where: str) -> str:
    src = source.splitlines(keepends=True)
    pat = [ln for ln in search.splitlines()]
    while pat and not pat[0].strip():
        pat.pop(0)
    while pat and not pat[-1].strip():
        pat.pop()
    key = [ln.strip() for ln in pat]
    hits = [i for i in range(len(src) - len(key) + 1)
            if all(src[i + k].strip() == key[k] for k in range(len(key)))]
    if not hits:
        first = key[0][:80] if key else ""
        raise EditError(f"{where}: SEARCH text not found, exactly or ignoring whitespace (first line "
                        f"{first!r}); copy the lines verbatim from the current source")
    if len(hits) > 1:
        raise EditError(f"{where}: SEARCH text matches {len(hits)} places ignoring whitespace; make it unique")
    i = hits[0]
    have = _indent(src[i])
    want = _indent(pat[0])
    out = []
    for ln in replace.splitlines():
        if ln.strip():
            ln = have + ln[len(want):] if ln.startswith(want) else have + ln.lstrip()
        out.append(ln + "\n")
    return "".join(src[:i]) + "".join(out) + "".join(src[i + len(key):])


def _indent(line: str) -> str:
    return line[: len(line) - len(line.lstrip())]
