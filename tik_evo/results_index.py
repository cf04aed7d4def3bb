"""results/index.csv: one row per file under results/ (date, card, area, what, file), generated, never edited by hand.

    python -m tik_evo.results_index            # rewrite results/index.csv
    python -m tik_evo.results_index --check    # exit 1 if the committed index differs from a fresh one

The files follow three naming schemes, all parsed here:
- `<card>_<what>_<date>[letter][_detail]` (most of attention/, engine/, model/: `h200_run58_ab_tma_2026-12-04`);
- `<what>_<card>_<date>[letter][_detail]` (ops/: `rowwise_h100_2026-12-06e_rms_blocks_silu_rope`);
- `<what>_<date>[letter][_detail]` with no card (ops/: `linear_full_ab_2026-12-02`), and a few with no date
  (`h200_run1`).
The date comes from the name, else from the JSON's own `date` field; the card from the name (`h100`, `h200`, or
`sm90` for an offline sm_90a compile, no GPU), else from the JSON's `gpu` field (top level or up to three levels
down: `env`, `meta`, `device`), else from the JSON of the same stem (an export's or lineage's summary), else from
the device names in a dated markdown or text file's first 64 KiB (`NVIDIA H200`, `H100 80GB`; both: `h100+h200`;
undated notebooks such as README.md are not scanned). What cannot be told is left empty; compressed files are
never opened. `tests/engine/test_results_index.py` fails when the committed index is stale, so a new results file
is committed with a regenerated index.
"""

from __future__ import annotations

import argparse
import csv
import io
import json
import re
import sys
from pathlib import Path

COLUMNS = ("date", "card", "area", "what", "file")
CARDS = ("h100", "h200", "sm90")
# a date in a name, then an optional run letter glued to it: 2026-12-05d
_DATE = re.compile(r"(?<![0-9])(\d{4}-\d{2}-\d{2})([a-z]?)(?![0-9A-Za-z])")
_ISO_DAY = re.compile(r"^(\d{4}-\d{2}-\d{2})")
# suffixes that belong to a result's sibling files: the run's JSON summary is `<stem>.json`
_SIBLING_TAILS = ("_export", "_lineage", "_details", "_order", "_sass")
_HEAD_BYTES = 65536
# how a markdown file records the device it ran on (a bare "H200" may be a target or a wish, not the device)
_DEVICE_NAMES = (("h100", re.compile(r"NVIDIA H100|H100 80GB")), ("h200", re.compile(r"NVIDIA H200")))


def _split_ext(name: str) -> tuple[str, str]:
    """('h200_campaign2_2026-12-02_export', '.jsonl.gz'): compound extensions stay whole."""
    for ext in (".jsonl.gz", ".csv.gz", ".json.gz", ".txt.gz"):
        if name.endswith(ext):
            return name[: -len(ext)], ext
    stem, dot, ext = name.rpartition(".")
    return (stem, "." + ext) if dot else (name, "")


def parse_name(name: str) -> dict[str, str]:
    """What a file name alone says: {'date', 'run', 'card', 'what', 'ext'}; empty strings where it says nothing.

    `run` is the letter after the date (`2026-12-05d` -> 'd'); `what` is the name without its card, date and run
    letter, its words joined by '_'."""
    stem, ext = _split_ext(name)
    date = run = ""
    m = _DATE.search(stem)
    if m:
        date, run = m.group(1), m.group(2)
        stem = stem[: m.start()] + "_" + stem[m.end():]
    words = [w for w in stem.split("_") if w]
    cards = [w for w in words if w.lower() in CARDS]
    card = cards[0].lower() if len(cards) == 1 else ""
    if card:
        words = [w for w in words if w.lower() != card]
    return {"date": date, "run": run, "card": card, "what": "_".join(words), "ext": ext}


def scheme_of(name: str) -> str:
    """Which of the three naming schemes a name follows: 'card_first', 'card_after', 'no_card' or 'no_date'
    ('' for README.md and STATUS.md, notebooks that follow none)."""
    if name.lower() in ("readme.md", "status.md"):
        return ""
    stem, _ = _split_ext(name)
    parsed = parse_name(name)
    if not parsed["date"]:
        return "no_date"
    if not parsed["card"]:
        return "no_card"
    return "card_first" if stem.split("_", 1)[0].lower() == parsed["card"] else "card_after"


def card_of_gpu(text: str) -> str:
    """'NVIDIA H100 80GB HBM3' -> 'h100'; '' for anything that names neither or both."""
    found = sorted({c for c in ("h100", "h200") if c in text.lower()})
    return found[0] if len(found) == 1 else ""


def _json_fields(data: object) -> tuple[str, str]:
    """(date, card) from a result's JSON: its own `date` and `gpu` (or a string `device`), else the shallowest
    ones in the dicts below it (`env`, `meta`, `device`, a script's section), at most three levels down."""
    date = card = ""
    layer = [data] if isinstance(data, dict) else []
    for _ in range(3):
        for d in layer:
            if not date and isinstance(d.get("date"), str):
                m = _ISO_DAY.match(d["date"])
                date = m.group(1) if m else ""
            for key in ("gpu", "device"):
                if not card and isinstance(d.get(key), str):
                    card = card_of_gpu(d[key])
        if date and card:
            break
        layer = [v for d in layer for v in d.values() if isinstance(v, dict)]
    return date, card


def _read_head(path: Path) -> str:
    with open(path, "rb") as f:
        return f.read(_HEAD_BYTES).decode("utf-8", errors="replace")


def _load_json(path: Path) -> object:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def _text_card(path: Path) -> str:
    """The cards a markdown or text file records as its device ('NVIDIA H200', 'H100 80GB'), joined by '+'."""
    head = _read_head(path)
    return "+".join(card for card, pattern in _DEVICE_NAMES if pattern.search(head))


def _sibling_json(path: Path) -> Path | None:
    stem, _ = _split_ext(path.name)
    for tail in _SIBLING_TAILS:
        if stem.endswith(tail):
            stem = stem[: -len(tail)]
            break
    candidate = path.with_name(stem + ".json")
    return candidate if candidate != path and candidate.is_file() else None


def row_for(path: Path, results: Path) -> dict[str, str]:
    """The index row of one file under `results`."""
    rel = path.relative_to(results)
    parsed = parse_name(path.name)
    date, card = parsed["date"], parsed["card"]
    if not (date and card):
        sources = []
        if parsed["ext"] == ".json":
            sources.append(path)
        sibling = _sibling_json(path)
        if sibling is not None:
            sources.append(sibling)
        for source in sources:
            d, c = _json_fields(_load_json(source))
            date, card = date or d, card or c
    # a dated note records its device; an undated notebook (README.md, STATUS.md) spans cards and is edited
    # often, so it is not scanned (its row would change with every edit)
    if not card and parsed["date"] and parsed["ext"] in (".md", ".txt"):
        card = _text_card(path)
    area = rel.parts[0] if len(rel.parts) > 1 else ""
    what = parsed["what"] or "notes"  # `h200_2026-12-05b.md`: a day's notebook, named by card and date alone
    if parsed["run"]:
        what = f"{what} ({parsed['run']})"
    return {"date": date, "card": card, "area": area, "what": what, "file": "results/" + rel.as_posix()}


def rows(results: Path) -> list[dict[str, str]]:
    """Every file under `results` but the index itself, sorted by date, then area, then file."""
    out = []
    for path in results.rglob("*"):
        if path.is_file() and path.name != "index.csv" and not path.name.startswith("."):
            out.append(row_for(path, results))
    return sorted(out, key=lambda r: (r["date"], r["area"], r["file"]))


def render(results: Path) -> str:
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=COLUMNS, lineterminator="\n")
    writer.writeheader()
    writer.writerows(rows(results))
    return buf.getvalue()


def default_results() -> Path:
    return Path(__file__).resolve().parents[1] / "results"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tik_evo.results_index", description=__doc__.splitlines()[0])
    parser.add_argument("--results", type=Path, default=default_results(), help="the results folder")
    parser.add_argument("--check", action="store_true", help="compare with the committed index; write nothing")
    args = parser.parse_args(argv)
    text = render(args.results)
    target = args.results / "index.csv"
    if args.check:
        current = target.read_text(encoding="utf-8") if target.is_file() else ""
        if current != text:
            print(f"{target} is stale: run python -m tik_evo.results_index", file=sys.stderr)
            return 1
        return 0
    target.write_text(text, encoding="utf-8")
    print(f"{target}: {text.count(chr(10)) - 1} files")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
