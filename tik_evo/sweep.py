"""Ablation sweeps by config overrides: `tik-evo sweep CAMPAIGN ablation.evidence=true,false search.seed=0,1`
runs every combination of the comma-separated values (one run directory each) and compares them.

With `--gpus 0,1,…` (or `--jobs N` under the interpreter) the runs go concurrently, each a `tik-evo run` child
process pinned to its own GPU and its own share of the CPUs: one GPU per run, so no run times its kernels
while another's share the device."""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import re
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.live import Live
from rich.table import Table

from tik_evo.store import Store

_LIST = re.compile(r"^\[.*\]$")


def axes(overrides: list[str]) -> tuple[list[str], dict[str, list[str]]]:
    """Split overrides into fixed ones and sweep axes (values with commas, outside a [list])."""
    fixed, swept = [], {}
    for o in overrides:
        key, _, value = o.partition("=")
        if "," in value and not _LIST.match(value.strip()):
            swept[key] = [v.strip() for v in value.split(",") if v.strip()]
        else:
            fixed.append(o)
    return fixed, swept


def combinations(swept: dict[str, list[str]]) -> list[dict[str, str]]:
    keys = list(swept)
    return [dict(zip(keys, values)) for values in itertools.product(*(swept[k] for k in keys))]


def run_name(combo: dict[str, str]) -> str:
    return ",".join(f"{k.split('.')[-1]}={v}" for k, v in combo.items()) or "base"


def summary(run_dir: Path) -> dict[str, Any]:
    with Store.open_reader(run_dir) as store:
        st = store.state()
    best, root = st.best_objective, st.root_objective
    return {"run": str(run_dir), "evaluations": st.evaluations, "kappa": st.kappa,
            "speedup": (root / best) if best and root else None, "best": st.best,
            "failures": sum(st.failures_by_kind.values()), "tokens": st.budgets["tokens"],
            "usd": st.budgets["usd"], "wall_s": st.budgets["wall_s"],
            "finished": (st.finished or {}).get("reason")}


def run_state(run_dir: Path, finished: str | None) -> str:
    """"finished: <reason>", "running" (its writer's pid is alive) or "stopped", read from files only (the sweep
    view polls every run each second; a writer waits out a lock probe, but no need to make it wait)."""
    if finished:
        return f"finished: {finished}"
    try:
        pid = int((run_dir / "writer.lock").read_text().strip())
        os.kill(pid, 0)
    except (OSError, ValueError):
        return "stopped"
    return "running"


def table(rows: list[dict[str, Any]], labels: list[str]) -> Table:
    t = Table(title="speed-up = T(root) / T(best), each run on its own timings; * = not finished")
    for col in ("run", "evals", "speed-up", "best", "κ", "fails", "tokens", "USD", "wall s"):
        t.add_column(col, no_wrap=col != "run", overflow="fold")
    for label, r in zip(labels, rows):
        mark = " (failed)" if r.get("status") == "failed" else ("" if r["finished"] else " *")
        t.add_row(label + mark, str(r["evaluations"]),
                  f"{r['speedup']:.3f}x" if r["speedup"] else "-", str(r["best"]), str(r["kappa"]),
                  str(r["failures"]), str(r["tokens"]), f"{r['usd']:.2f}", f"{r['wall_s']:.0f}")
    return t


def write_summary(sweep_dir: Path, rows: list[dict[str, Any]], combos: list[dict[str, str]]) -> Path:
    path = sweep_dir / "sweep.json"
    path.write_text(json.dumps([{"overrides": c, **r} for c, r in zip(combos, rows)], indent=1))
    return path


@dataclass
class Slot:
    """Where one concurrent run goes: a logical CUDA index for its audits (None on the CPU) and the CPUs its
    processes are pinned to (None: not pinned); or (`--ray`) the overrides sending its audits to a cluster."""
    gpu: int | None
    cpus: set[int] | None
    overrides: list[str] = field(default_factory=list)
    on: str = ""  # where its audits go, in the live table ("" : its GPU or the CPU)


def slots(gpus: list[int] | None, jobs: int) -> list[Slot]:
    """One slot per GPU (or `jobs` CPU slots), each with an equal, disjoint share of this process's CPUs."""
    n = len(gpus) if gpus else jobs
    cpus = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []
    share = len(cpus) // n
    return [Slot(gpus[i] if gpus else None, set(cpus[i * share:(i + 1) * share]) if share else None)
            for i in range(n)]


@dataclass
class SweepRun:
    name: str
    run_dir: Path
    run_args: list[str]  # `tik-evo run` arguments: the campaign and its overrides, store.path included
    status: str = "queued"  # queued → running → done | failed; "kept" for a run finished before this sweep
    rc: int | None = None
    slot: Slot | None = None
    proc: subprocess.Popen | None = field(default=None, repr=False)

    def argv(self) -> list[str]:
        gpu = [f"evaluate.gpu_index={self.slot.gpu}"] if self.slot and self.slot.gpu is not None else []
        gpu += self.slot.overrides if self.slot else []
        cmd = [sys.executable, "-m", "tik_evo.cli"]
        if (self.run_dir / "ir.lmdb").exists():  # a sweep killed midway: the run continues where it stopped
            return [*cmd, "resume", str(self.run_dir), *gpu, "--quiet"]
        return [*cmd, "run", *self.run_args, *gpu, "--quiet"]

    def start(self, slot: Slot) -> None:
        self.slot, self.status = slot, "running"
        self.run_dir.mkdir(parents=True, exist_ok=True)
        pin = (lambda: os.sched_setaffinity(0, slot.cpus)) if slot.cpus else None
        if slot.overrides:  # a sweep killed outright takes its runs' engines along: their Ray jobs end with them
            from tik_evo.executor import die_with_parent

            pin = die_with_parent
        with open(self.run_dir / "run.log", "ab") as log:
            # Own session: a Ctrl-C reaches the sweep, which stops its runs in order (see `stop`).
            self.proc = subprocess.Popen(self.argv(), stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                         start_new_session=True, preexec_fn=pin,
                                         env={**os.environ, "PYTHONUNBUFFERED": "1"})

    def poll(self) -> bool:
        """True once the child has exited (its status is then set)."""
        if self.proc is None or self.proc.poll() is None:
            return False
        self.rc = self.proc.returncode
        self.status = "done" if self.rc == 0 else "failed"
        return True

    def log_tail(self, lines: int = 12) -> str:
        try:
            return "\n".join((self.run_dir / "run.log").read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""


def live_row(run: SweepRun) -> list[str]:
    """What the run's store says now (it may not exist yet, or be mid-initialization)."""
    where = "-" if run.slot is None else (run.slot.on or (f"GPU {run.slot.gpu}" if run.slot.gpu is not None
                                                          else "CPU"))
    status = run.status + (f" (exit {run.rc})" if run.status == "failed" else "")
    try:
        with Store.open_reader(run.run_dir) as store:
            st = store.state()
    except Exception:  # not created yet, or being created: nothing to show
        return [run.name, where, status, "-", "-", "-", "-"]
    best, root = st.best_objective, st.root_objective
    return [run.name, where, status, str(st.evaluations), f"{root / best:.3f}x" if best and root else "-",
            str(st.kappa), f"{st.budgets.get('wall_s', 0):.0f}"]


def live_table(runs: list[SweepRun]) -> Table:
    t = Table(title="sweep (speed-up = T(root) / T(best) so far)")
    for col in ("run", "on", "status", "evals", "speed-up", "κ", "wall s"):
        t.add_column(col, no_wrap=col != "run", overflow="fold")
    for r in runs:
        t.add_row(*live_row(r))
    return t


def run_concurrently(runs: list[SweepRun], free: list[Slot], console: Console, live: bool,
                     poll_s: float = 1.0) -> None:
    """Run the queued runs, as many at once as there are slots, until all have exited. Ctrl-C stops them all."""
    queue = [r for r in runs if r.status == "queued"]
    running: list[SweepRun] = []
    view = Live(live_table(runs), console=console, auto_refresh=False) if live else contextlib.nullcontext()
    try:
        with view:
            while queue or running:
                while queue and free:
                    run = queue.pop(0)
                    run.start(free.pop(0))
                    running.append(run)
                    console.print(f"started {run.name} on {live_row(run)[1]} (log: {run.run_dir / 'run.log'})")
                for run in [r for r in running if r.poll()]:
                    running.remove(run)
                    free.append(run.slot)
                    console.print(f"{run.name}: {run.status}" + (f" (exit {run.rc})" if run.rc else ""))
                if live:
                    view.update(live_table(runs), refresh=True)
                if running:
                    time.sleep(poll_s)
    except KeyboardInterrupt:
        stop(running, console)
        raise


def stop(running: list[SweepRun], console: Console, grace_s: float = 30.0) -> None:
    """Interrupt every running child as a Ctrl-C would (each stores what it finished and stops its audit), then
    kill what is still there after the grace period. Every run can be resumed."""
    for r in running:
        if r.proc and r.proc.poll() is None:
            r.proc.send_signal(signal.SIGINT)
    deadline = time.time() + grace_s
    for r in running:
        if r.proc is None:
            continue
        try:
            r.proc.wait(timeout=max(0.1, deadline - time.time()))
        except subprocess.TimeoutExpired:
            os.killpg(r.proc.pid, signal.SIGKILL)
            r.proc.wait()
        r.poll()
    console.print(f"stopped {len(running)} running run(s); running the same sweep again resumes them")

