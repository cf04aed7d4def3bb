"""`tik-evo run`, `resume` and `sweep`: the commands that search."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

from tik_evo.commands import console, out
from tik_evo.commands.check import family_of, prepare
from tik_evo.config import ConfigError, load_campaign
from tik_evo.store import Store


def cmd_run(args) -> int:
    cfg = load_campaign(args.campaign, args.overrides)
    run_dir = Path(cfg.store.path)
    if args.tui:
        _refuse_existing(run_dir)
        return _run_with_tui(args, run_dir)
    run_campaign(cfg, args.quiet)
    return 0


def run_campaign(cfg, quiet: bool) -> Path:
    """Initialize a new run from the campaign and search until a stop condition; returns the run directory."""
    from tik_evo.initialization import initialize, resolve_device

    family, workloads = prepare(cfg)
    run_dir = Path(cfg.store.path)
    _refuse_existing(run_dir)
    device, facts, warnings = resolve_device(cfg)
    for w in warnings:
        console.print(f"[yellow]warning:[/] {w}")
    store = Store.create(run_dir)
    console.print(f"run directory: {run_dir}")
    try:
        initialize(store, cfg, family, workloads, device, facts, log=lambda m: console.print(m))
        reason = _search(store, cfg, family, quiet)
        _summary(store, reason)
    finally:
        store.close()
    return run_dir


def _refuse_existing(run_dir: Path) -> None:
    if (run_dir / "ir.lmdb").exists():
        raise ConfigError(f"key 'store.path': {run_dir} already holds a run; `tik-evo resume {run_dir}` continues "
                          f"it, or pass store.path=<new dir>")


def _run_with_tui(args, run_dir: Path) -> int:
    """The search runs in a child process; the TUI reads the store read-only from this one."""
    run_dir.mkdir(parents=True, exist_ok=True)
    log = open(run_dir / "run.log", "ab")
    # The child must write where this process reads, even when store.path holds ${now:...}.
    argv = [sys.executable, "-m", "tik_evo.cli", "run", args.campaign, *args.overrides, f"store.path={run_dir}",
            "--quiet"]
    child = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    while not (run_dir / "ir.lmdb" / "data.mdb").exists() and child.poll() is None:
        time.sleep(0.2)
    if child.poll() not in (None, 0):
        console.print(f"[red]error:[/] the search exited with code {child.returncode}; see {run_dir / 'run.log'}")
        return child.returncode or 1
    from tui.app import run_tui

    run_tui(run_dir)
    if child.poll() is None:
        console.print(f"the search continues in the background (pid {child.pid}); log: {run_dir / 'run.log'}; "
                      f"`tik-evo tui {run_dir}` reopens the view")
    return 0


def _search(store, cfg, family, quiet: bool) -> str:
    from tik_evo.loop import Search
    from tik_evo.progress import LiveProgress

    with LiveProgress(cfg, console, enabled=not quiet) as progress:
        return Search(store, cfg, family, on_step=progress.update).run()


def _summary(store: Store, reason: str) -> None:
    from tik_evo.report import status

    out.print(status(store))
    out.print(f"\n[bold]finished:[/] {reason}\n[bold]run directory:[/] {store.run_dir}")


def cmd_resume(args) -> int:
    if args.from_backup:
        from tik_evo.store_salvage import restore_backup

        console.print(restore_backup(Path(args.run_dir), args.from_backup), markup=False)
    try:
        resume_run(Path(args.run_dir), args.overrides, args.quiet)
    except OSError as e:  # a full disk met outside the store (an audit's files): the store's steps are safe
        from tik_evo.store_integrity import full, is_full

        if not is_full(e):
            raise
        raise full(Path(args.run_dir), e, None, 0, in_store=False) from None
    return 0


def resume_run(run_dir: Path, overrides: list[str], quiet: bool) -> None:
    from tik_evo.initialization import initialize, resolve_device

    if not (run_dir / "config.yaml").is_file():
        raise ConfigError(f"{run_dir}: no config.yaml; is this a run directory?")
    cfg = load_campaign(run_dir / "config.yaml", overrides)
    cfg.store.path = str(run_dir)  # where the run is now: a run directory may have been moved or copied
    family = family_of(cfg)
    store = Store.open_writer(run_dir)
    try:
        st = store.state()
        if cfg.evaluate.executor == "ray":
            _reap_on_cluster(store, cfg)
        if st.device == "cuda":
            from tik_evo.initialization import anchor_gpus, check_gpus

            check_gpus(cfg)  # GPUs changed by the overrides, or fewer visible than when the run started
            if st.root:  # a GPU added on resume gets the root's timings before it audits anything
                anchor_gpus(store, cfg, family, "cuda", log=lambda m: console.print(m))
        if st.root is None:
            if not st.workloads:
                raise ConfigError(f"{run_dir}: the run stopped before it recorded its workloads; start it again "
                                  f"with `tik-evo run`")
            console.print("the run was interrupted before its root was verified: initializing again")
            device, facts, _ = resolve_device(cfg)
            initialize(store, cfg, family, st.workloads, device, facts, log=lambda m: console.print(m))
        elif st.finished:
            with store.transaction() as txn:
                txn.state.finished = None
                txn.event("resume", "resumed after finishing: " + " ".join(overrides))
        else:
            with store.transaction() as txn:
                txn.event("resume", f"resumed at step {txn.state.evaluations}")
        if overrides:
            from tik_evo.config import to_yaml

            (run_dir / "config.yaml").write_text(to_yaml(cfg))
        console.print(f"resuming {run_dir}: {store.state().evaluations} evaluations so far")
        reason = _search(store, cfg, family, quiet)
        _summary(store, reason)
    finally:
        store.close()


def _reap_on_cluster(store: Store, cfg) -> None:
    """Audits an earlier engine of this run left on the cluster (killed with -9, its node's Ray worker not yet
    gone) are ended before this one audits anything."""
    from tik_evo.ray_executor import reap

    ended = reap(store.run_dir, cfg.evaluate)
    if ended:
        console.print(f"ended {len(ended)} process(es) an earlier engine of this run left on the Ray cluster")
        with store.transaction() as txn:
            txn.event("resume", f"ended {len(ended)} process(es) of an earlier engine on the Ray cluster: {ended}")


def cmd_sweep(args) -> int:
    """Every combination of the comma-separated override values, one run each, then a comparison."""
    from tik_evo import sweep

    fixed, swept = sweep.axes(args.overrides)
    if not swept:
        raise ConfigError("command line: no override has comma-separated values to sweep (e.g. "
                          "ablation.evidence=true,false)")
    combos = sweep.combinations(swept)
    base_cfg = load_campaign(args.campaign, fixed)
    sweep_dir = Path(args.dir or f"{base_cfg.store.path}-sweep")
    runs = [sweep.SweepRun(sweep.run_name(c), sweep_dir / sweep.run_name(c),
                           [args.campaign, *fixed, *(f"{k}={v}" for k, v in c.items()),
                            f"store.path={sweep_dir / sweep.run_name(c)}"]) for c in combos]
    cfgs = [load_campaign(r.run_args[0], r.run_args[1:]) for r in runs]
    for cfg in cfgs:
        prepare(cfg)  # every run's campaign is checked before the first starts
    slots = _sweep_slots(args, base_cfg, len(runs))
    console.print(f"sweep of {len(combos)} runs into {sweep_dir}"
                  + (f", {len(slots)} at a time" if slots else ""))
    for run in runs:
        if (run.run_dir / "ir.lmdb").exists():
            with Store.open_reader(run.run_dir) as store:
                if store.state().finished:
                    run.status = "kept"
    if slots:
        sweep.run_concurrently(runs, slots, console, live=not args.quiet)
    else:
        for i, (run, cfg) in enumerate(zip(runs, cfgs)):
            console.rule(f"run {i + 1}/{len(runs)}: {run.name}")
            if run.status == "queued" and not (run.run_dir / "ir.lmdb").exists():
                run_campaign(cfg, args.quiet)
            elif run.status == "queued":
                resume_run(run.run_dir, [], args.quiet)  # a sweep killed midway continues where it stopped
            run.status = "done" if run.status == "queued" else run.status
    kept = [(c, r) for c, r in zip(combos, runs) if (r.run_dir / "ir.lmdb").exists()]
    rows = [{**sweep.summary(r.run_dir), "status": r.status, "gpu_index": r.slot.gpu if r.slot else None}
            for _, r in kept]
    out.print(sweep.table(rows, [r.name for _, r in kept]))
    console.print(f"summary: {sweep.write_summary(sweep_dir, rows, [c for c, _ in kept])}")
    failed = [r for r in runs if r.status == "failed"]
    for r in failed:
        console.print(f"[red]failed:[/] {r.name} (exit {r.rc}); the end of {r.run_dir / 'run.log'}:\n{r.log_tail()}")
    return 1 if failed else 0


def _sweep_slots(args, cfg, runs: int) -> list:
    """Concurrent slots for `--gpus` / `--jobs`, or [] to run one after another in this process."""
    from tik_evo import sweep
    from tik_evo.initialization import resolve_device

    if args.jobs < 1:
        raise ConfigError(f"--jobs {args.jobs}: must be at least 1")
    if args.ray is not None:
        if args.gpus is not None or args.jobs != 1:
            raise ConfigError("--ray: the cluster's GPUs are shared among the runs; drop --gpus / --jobs")
        from tik_evo.ray_executor import sweep_slots

        return sweep_slots(cfg, args.ray, runs)
    if args.gpus is None and args.jobs == 1:
        return []
    if cfg.evaluate.gpus or cfg.evaluate.parallel > 1:
        raise ConfigError(f"{cfg.source_file}: keys 'evaluate.gpus' / 'evaluate.parallel': a sweep with --gpus or "
                          f"--jobs gives each run one GPU (or CPU share); drop one or the other")
    if args.gpus is None:
        if resolve_device(cfg)[0] == "cuda":
            raise ConfigError(f"--jobs {args.jobs}: these runs time their kernels on a GPU, and runs sharing one "
                              f"GPU time each other's kernels; give each run its own with --gpus 0,1,...")
        return sweep.slots(None, args.jobs)
    try:
        gpus = [int(g) for g in args.gpus.split(",") if g.strip()]
    except ValueError:
        raise ConfigError(f"--gpus {args.gpus!r}: expected comma-separated device indices, e.g. 0,1,2,3") from None
    import torch

    count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    bad = [g for g in gpus if not 0 <= g < count]
    if not count:
        raise ConfigError(f"--gpus {args.gpus!r}: no CUDA device is visible (under the interpreter, --jobs N runs "
                          f"N at once)")
    if not gpus or bad or len(set(gpus)) != len(gpus):
        raise ConfigError(f"--gpus {args.gpus!r}: {count} CUDA device(s) are visible (indices 0..{count - 1} within "
                          f"CUDA_VISIBLE_DEVICES); each index may appear once")
    return sweep.slots(gpus, len(gpus))
