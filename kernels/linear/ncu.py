"""The linear family under Nsight Compute (tik-evo bench linear-ncu): the cells a profile run takes (a weight and
its rows) and which call each profiled launch belongs to, from the family's kernel names."""

from __future__ import annotations


def parse_cells(text: str, shapes: list[tuple[str, int, int]]) -> list[tuple[str, int, int, int]]:
    """'o:256,qwen3-4b.qkv:16384' -> [(weight name, N, K, M)]; a name matches a weight exactly or as the unique
    suffix after a dot."""
    cells = []
    for item in (c.strip() for c in text.split(",") if c.strip()):
        name, sep, m = item.partition(":")
        if not sep or not m.isdigit() or int(m) < 1:
            raise SystemExit(f"--cells: {item!r} is not WEIGHT:M (e.g. qwen3-4b.o:256)")
        found = [s for s in shapes if s[0] == name] or [s for s in shapes if s[0].endswith("." + name)]
        if len(found) != 1:
            known = ", ".join(s[0] for s in shapes)
            raise SystemExit(f"--cells: weight {name!r} matches {len(found)} of: {known}")
        cells.append((*found[0], int(m)))
    return cells


# Our kernels' names: a call launches one of SINGLE, or CHUNK then MERGE.
SINGLE = ("_linear_kernel", "_linear_persistent_kernel")
CHUNK, MERGE = "_linear_chunk_kernel", "_linear_merge_kernel"


def label_launches(kernels: list[str], order: list[str]) -> list[str]:
    """The call (an --order entry) each profiled launch belongs to, from the launches' kernel names in order."""
    labels, i = [], -1
    prev_ours = False  # whether the previous launch was one of ours (cuBLAS launches after it start a new call)
    for name in kernels:
        ours = name.startswith(SINGLE + (CHUNK, MERGE))
        if not (name.startswith(MERGE) or (not ours and not prev_ours and i >= 0)):
            i += 1  # a new call: ours (not a merge), or the first cuBLAS launch after one of ours
        labels.append(order[i] if 0 <= i < len(order) else "?")
        prev_ours = ours
    return labels
