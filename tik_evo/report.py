"""Read-only views of a run: status, show, lineage, export. Each reads one store snapshot."""

from __future__ import annotations

import difflib
import json
import statistics
from collections import Counter
from collections.abc import Iterator
from typing import Any

from rich.console import Group
from rich.table import Table
from rich.text import Text
from rich.tree import Tree

from tik_evo.config import start_label
from tik_evo.lineage import root_latencies
from tik_evo.records import to_dict
from tik_evo.store import Store
from tik_evo.timing import LABELS, WALL_INTERPRETER

STATUS_STYLE = {"best": "bold green", "active": "green", "archived": "yellow", "failed": "red",
                "abandoned": "red", "pending": "dim"}


def fmt_time(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    if seconds >= 1:
        return f"{seconds:.3f} s"
    if seconds >= 1e-3:
        return f"{seconds * 1e3:.3f} ms"
    return f"{seconds * 1e6:.2f} µs"


def timer_note(timer: str) -> str:
    return " + ".join(LABELS.get(t, t) for t in timer.split("+") if t)


def speedups(snap: dict[str, Any], impl_id: str) -> dict[str, float]:
    """Per-workload speed-up of an implementation over the root (root time / its time), the root as timed on
    the GPU that audited it."""
    audits = {a.impl: a for a in snap["U"]}
    a = audits.get(impl_id)
    if not a or not a.measurements:
        return {}
    root = root_latencies(snap["state"], a.device.get("gpu_index"))
    return {n: root[n] / m["median_s"] for n, m in a.measurements.items() if n in root and m["median_s"] > 0}


def status(store: Store) -> Group:
    snap = store.snapshot()
    st = snap["state"]
    impls = {i.id: i for i in snap["I"]}
    audits = {a.impl: a for a in snap["U"]}
    timer = audits[st.root].timer if st.root in audits else ""
    head = Table.grid(padding=(0, 2))
    head.add_row("run", str(store.run_dir))
    head.add_row("family / device", f"{st.family} / {st.device} "
                 f"({st.device_facts.get('actual_gpu') or 'no GPU'})")
    start = start_label(st.start or {})
    if start:
        head.add_row("root", f"the family's root with start {start}")
    head.add_row("timings", timer_note(timer) + (" — interpreter timings say nothing about GPU speed"
                                                   if WALL_INTERPRETER in timer else ""))
    best = st.best
    if best:
        head.add_row("best", f"{best}  T={st.best_objective:.6g}  root T={st.root_objective:.6g}  "
                     f"speed-up {st.root_objective / st.best_objective:.3f}x")
    head.add_row("κ", str(st.kappa))
    head.add_row("evaluations", f"{st.evaluations} audited, {st.duplicates} repeats/no-change")
    moves = st.moves
    if moves:  # search.neighbours: the best's one-knob moves still to try before the sampler's draws
        head.add_row("one-knob moves", f"{len(moves['left'])} of {moves['of']}'s left")
    per_gpu = Counter(a.device.get("gpu_index") for a in audits.values() if a.device.get("gpu_index") is not None)
    if len(per_gpu) > 1:  # concurrent audits (evaluate.gpus)
        head.add_row("audits per GPU", ", ".join(f"GPU {g}: {n}" for g, n in sorted(per_gpu.items())))
    fails = ", ".join(f"{k}: {v}" for k, v in sorted(st.failures_by_kind.items())) or "none"
    head.add_row("failures by kind", fails)
    b = st.budgets
    head.add_row("budget used", f"wall {b['wall_s']:.0f} s, tokens {b['tokens']}, USD {b['usd']:.4f}")
    for op, (n, calls, p, c, usd) in operator_accounting(snap["A"]).items():
        head.add_row(f"  operator {op}", f"{n} actions, {calls} LLM calls, tokens {p} prompt + {c} completion, "
                     f"USD {usd:.4f}")
    over = st.engine_overhead_s
    if over:
        head.add_row("engine overhead", f"{statistics.mean(over) * 1e3:.1f} ms/step mean (store + scheduler)")
    spent = audit_time(snap["U"], st.root)
    if spent:
        head.add_row("audit time", spent)
    rate = throughput(snap["U"], st.root, b["wall_s"])
    if rate:
        head.add_row("throughput", rate)
    head.add_row("frontier / archive", f"{', '.join(st.frontier)} / {', '.join(st.archive) or '-'}")
    if st.finished:
        head.add_row("finished", st.finished["reason"])
    else:
        pid = store.writer_pid()
        head.add_row("finished", f"no: running (pid {pid})" if pid else
                     f"no: interrupted; `tik-evo resume {store.run_dir}` continues it")
    parts: list[Any] = [head]
    if best and best in impls:
        sp = speedups(snap, best)
        t = Table(title=f"best {best} vs root, per workload ({timer_note(timer)})")
        for col in ("workload", "root", "best", "speed-up", "limit"):
            t.add_column(col, justify="right" if col != "workload" else "left")
        a = audits[best]
        root = root_latencies(st, a.device.get("gpu_index"))
        for n, s in sp.items():
            t.add_row(n, fmt_time(root[n]), fmt_time(a.measurements[n]["median_s"]),
                      f"{s:.3f}x", f"{st.limits[n]['limit']:.2f}x")
        parts.append(t)
    return Group(*parts)


def offspring_audits(audits: list[Any], root: str | None) -> list[Any]:
    """The audits of the search's offspring that recorded their time (the root's, before any search, excluded)."""
    return [a for a in audits if a.impl != root and a.seconds]


def audit_time(audits: list[Any], root: str | None) -> str:
    """The offspring's mean audit time and the stages that take it (a stage's mean over the audits that reached
    it): where a search's wall time goes, e.g. timing many large workloads."""
    spent = offspring_audits(audits, root)
    if not spent:
        return ""
    per_stage: dict[str, list[float]] = {}
    for a in spent:
        for stage in a.stages:
            per_stage.setdefault(stage["name"], []).append(stage.get("seconds") or 0.0)
    stages = ", ".join(f"{name} {statistics.mean(v):.1f} s" for name, v in per_stage.items()
                       if statistics.mean(v) >= 0.05)
    return f"{statistics.mean(a.seconds for a in spent):.1f} s mean over {len(spent)} offspring" + \
        (f" ({stages})" if stages else "")


def throughput_figures(audits: list[Any], root: str | None, wall_s: float) -> tuple[float, float | None] | None:
    """(offspring audited per minute of the run's wall time after the root's audit, the mean GPU hold per
    offspring with audits in flight or None), or None before any offspring: what the audit's settings buy."""
    spent = offspring_audits(audits, root)
    root_s = next((a.seconds for a in audits if a.impl == root and a.seconds), 0.0)
    after = wall_s - root_s
    if not spent or after <= 0:
        return None
    holds = [a.device["gpu_lock"]["released_at"] - a.device["gpu_lock"]["acquired_at"] for a in spent
             if (a.device.get("gpu_lock") or {}).get("released_at")]
    return 60.0 * len(spent) / after, statistics.mean(holds) if holds else None


def throughput(audits: list[Any], root: str | None, wall_s: float) -> str:
    """`throughput_figures` in words (`tik-evo status`)."""
    figures = throughput_figures(audits, root, wall_s)
    if figures is None:
        return ""
    per_min, held = figures
    out = f"{per_min:.2f} offspring/min after the root's audit"
    return out + (f"; GPU held {held:.1f} s per offspring (audits in flight)" if held is not None else "")


def operator_accounting(actions: list[Any]) -> dict[str, tuple[int, int, int, int, float]]:
    """Per operator: actions, LLM calls (repair attempts count), prompt tokens, completion tokens, USD."""
    out: dict[str, list] = {}
    for a in actions:
        row = out.setdefault(a.operator, [0, 0, 0, 0, 0.0])
        row[0] += 1
        row[1] += len(a.params.get("llm.attempts", []))
        row[2] += a.tokens.get("prompt", 0)
        row[3] += a.tokens.get("completion", 0)
        row[4] += a.cost_usd
    return {k: tuple(v) for k, v in sorted(out.items())}  # type: ignore[misc]


def show(store: Store, impl_id: str) -> Group:
    impl = store.get(impl_id)
    st = store.state()
    parts: list[Any] = []
    head = Table.grid(padding=(0, 2))
    head.add_row("implementation", f"{impl.id} [{impl.status}] scope {impl.scope}, parents {impl.parents or '-'}")
    head.add_row("objective", f"{impl.objective:.6g}" if impl.objective is not None else "-")
    if impl.action:
        a = store.get(impl.action)
        head.add_row("action", f"{a.id} by {a.operator} on opportunity {a.opportunity}: {a.rationale}")
        if a.tokens:
            head.add_row("tokens", f"{a.tokens} (${a.cost_usd:.4f})")
    parts.append(head)
    src = store.source(impl.source_hash)
    if impl.parents:
        parent = store.get(impl.parents[0])
        diff = difflib.unified_diff(store.source(parent.source_hash).splitlines(), src.splitlines(),
                                    f"{parent.id}", f"{impl.id}", lineterm="")
        parts.append(Text("\n".join(diff) or "(identical source)", style="cyan"))
    else:
        parts.append(Text(src))
    if impl.audit:
        audit = store.get(impl.audit)
        checks = Table(title=f"audit {audit.id}: {'passed' if audit.passed else 'FAILED ' + str(audit.failure_kind)}")
        for col in ("stage", "check", "ok", "details"):
            checks.add_column(col)
        for s in audit.stages:
            checks.add_row(s["name"], "", "✓" if s["passed"] else "✗", (s.get("error") or "")[:300])
            for c in s.get("checks", []):
                checks.add_row("", c["name"], "✓" if c["passed"] else "✗", json.dumps(c["details"])[:160])
        parts.append(checks)
        if audit.measurements:
            m = Table(title=f"measurements ({timer_note(audit.timer)})")
            for col in ("workload", "time", "spread", "vs root", "limit", "best (same audit)"):
                m.add_column(col)
            for n, x in audit.measurements.items():
                root = st.root_latencies.get(n)
                retimed = audit.best_retimed.get(n, {}).get("median_s")
                m.add_row(n, fmt_time(x["median_s"]), f"{x.get('spread', 0):.1%}",
                          f"{x['median_s'] / root:.3f}x" if root else "-",
                          f"{st.limits.get(n, {}).get('limit', 0):.2f}x", fmt_time(retimed))
            parts.append(m)
    return Group(*parts)


def lineage_tree(store: Store) -> Tree:
    snap = store.snapshot()
    impls = {i.id: i for i in snap["I"]}
    children: dict[str, list[str]] = {}
    for i in snap["I"]:
        if i.parents:
            children.setdefault(i.parents[0], []).append(i.id)
    root = snap["state"].root or (snap["I"][0].id if snap["I"] else None)
    if root is None:
        return Tree("(empty run)")
    actions = {a.id: a for a in snap["A"]}

    def label(iid: str) -> Text:
        i = impls[iid]
        a = actions.get(i.action) if i.action else None
        obj = f" T={i.objective:.4g}" if i.objective is not None else ""
        what = f" {a.operator}/{i.scope}: {a.rationale[:70]}" if a else " root"
        return Text(f"{iid} [{i.status}]{obj}{what}", style=STATUS_STYLE.get(i.status, ""))

    tree = Tree(label(root))
    stack = [(root, tree)]
    while stack:
        iid, node = stack.pop()
        for c in children.get(iid, []):
            stack.append((c, node.add(label(c))))
    return tree


def export(store: Store) -> Iterator[str]:
    snap = store.snapshot()
    yield json.dumps({"type": "state", **snap["state"].to_dict()})
    for kind, name in (("I", "implementation"), ("O", "opportunity"), ("A", "action"), ("U", "audit"),
                       ("D", "decision")):
        for r in snap[kind]:
            d = to_dict(r)
            if kind == "I":
                d["source"] = store.source(r.source_hash)
            yield json.dumps({"type": name, **d})
    for e in store.events():
        yield json.dumps({"type": "event", **e})


