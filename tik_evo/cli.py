"""`tik-evo` command line: run, resume, status, show, lineage, export, check, audit, bench, kernel, tui."""

from __future__ import annotations

import argparse
import importlib
import os
import subprocess
import sys
import time
from pathlib import Path

from rich.console import Console

from tik_evo.config import ConfigError, load_campaign
from tik_evo.families import FamilyError, load_family
from tik_evo.initialization import InitError
from tik_evo.store import Store, StoreError

console = Console(stderr=True)
out = Console()


def _family(cfg):
    try:
        return load_family(cfg.kernel)
    except FamilyError as e:
        raise ConfigError(f"{cfg.source_file}: key 'kernel': {e}") from e


def check_family(family) -> list[str]:
    """Problems with a family's root and knob space, found without running anything."""
    from tik_evo import staticscan
    from tik_evo.knobs import KnobsError, read_knobs

    problems = []
    src = family.root_source()
    for c in staticscan.scan(src, family.entry_points, tuple(k.name for k in family.knobs)):
        if not c.passed:
            problems.append(f"kernels/{family.name}/root.py: {c.name}: {c.details}")
    try:
        knobs = read_knobs(src)
        for k in family.knobs:
            if k.name not in knobs:
                problems.append(f"kernels/{family.name}/root.py: KNOBS has no {k.name!r}")
            elif knobs[k.name] not in k.values:
                problems.append(f"kernels/{family.name}/root.py: KNOBS[{k.name!r}]={knobs[k.name]!r} "
                                f"is not among the knob's values {list(k.values)}")
    except KnobsError as e:
        problems.append(f"kernels/{family.name}/root.py: {e}")
    names = {k.name for k in family.knobs}
    for o in family.opportunities():
        for k in o.knobs:
            if k not in names:
                problems.append(f"kernels/{family.name}: opportunity {o.kind!r} names unknown knob {k!r}")
        for k, v in o.values:
            if k not in o.knobs:
                problems.append(f"kernels/{family.name}: opportunity {o.kind!r} fixes {k!r}, not one of its knobs")
            elif k in names and v not in family.knob(k).values:
                problems.append(f"kernels/{family.name}: opportunity {o.kind!r} fixes {k}={v!r}, not one of "
                                f"{list(family.knob(k).values)}")
    return problems


def cmd_check(args) -> int:
    cfg = load_campaign(args.campaign, args.overrides)
    family, workloads, start, problems = _check_campaign(cfg)
    if problems:
        for p in problems:
            console.print(f"[red]error:[/] {p}")
        return 2
    phases: dict[str, int] = {}
    for w in workloads:
        phases[w["phase"]] = phases.get(w["phase"], 0) + 1
    out.print(f"[green]ok[/] {args.campaign}: campaign {cfg.name!r}, family {family.name!r}, "
              f"{len(workloads)} workloads ({', '.join(f'{k} {v}' for k, v in phases.items())}), "
              f"{len(family.knobs)} knobs, {len(family.opportunities())} opportunities, "
              f"sampler {cfg.search.sampler}, operators {list(cfg.search.operators)}, GPU {cfg.gpu.name} "
              f"(policy {cfg.gpu.policy})" + (f", starting from {len(start)} knob changes" if start else ""))
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


def cmd_run(args) -> int:
    cfg = load_campaign(args.campaign, args.overrides)
    run_dir = Path(cfg.store.path)
    if args.tui:
        _refuse_existing(run_dir)
        return _run_with_tui(args, run_dir)
    run_campaign(cfg, args.quiet)
    return 0


def _refuse_existing(run_dir: Path) -> None:
    if (run_dir / "ir.lmdb").exists():
        raise ConfigError(f"key 'store.path': {run_dir} already holds a run; `tik-evo resume {run_dir}` continues "
                          f"it, or pass store.path=<new dir>")


def _check_campaign(cfg):
    """(family, workloads, the start's knob changes, the family's problems): everything that can be checked
    before a run directory exists. Bad workloads or start changes raise ConfigError."""
    from tik_evo.initialization import start_changes
    from tik_evo.workloads import resolve_workloads

    family = _family(cfg)
    workloads = resolve_workloads(cfg, family)
    start = start_changes(cfg, family)
    return family, workloads, start, check_family(family)


def prepare(cfg):
    """The campaign's family and workloads, checked as `tik-evo check` checks them (ConfigError otherwise)."""
    family, workloads, _, problems = _check_campaign(cfg)
    if problems:
        raise ConfigError("; ".join(problems))
    return family, workloads


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
    family = _family(cfg)
    store = Store.open_writer(run_dir)
    try:
        st = store.state()
        if st.get("device") == "cuda":
            from tik_evo.initialization import anchor_gpus, check_gpus

            check_gpus(cfg)  # GPUs changed by the overrides, or fewer visible than when the run started
            if st.get("root"):  # a GPU added on resume gets the root's timings before it audits anything
                anchor_gpus(store, cfg, family, "cuda", log=lambda m: console.print(m))
        if st.get("root") is None:
            if not st.get("workloads"):
                raise ConfigError(f"{run_dir}: the run stopped before it recorded its workloads; start it again "
                                  f"with `tik-evo run`")
            console.print("the run was interrupted before its root was verified: initializing again")
            device, facts, _ = resolve_device(cfg)
            initialize(store, cfg, family, st["workloads"], device, facts, log=lambda m: console.print(m))
        elif st.get("finished"):
            with store.transaction() as txn:
                txn.state["finished"] = None
                txn.event("resume", "resumed after finishing: " + " ".join(overrides))
        else:
            with store.transaction() as txn:
                txn.event("resume", f"resumed at step {txn.state['evaluations']}")
        if overrides:
            from tik_evo.config import to_yaml

            (run_dir / "config.yaml").write_text(to_yaml(cfg))
        console.print(f"resuming {run_dir}: {store.state()['evaluations']} evaluations so far")
        reason = _search(store, cfg, family, quiet)
        _summary(store, reason)
    finally:
        store.close()


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
    slots = _sweep_slots(args, base_cfg)
    console.print(f"sweep of {len(combos)} runs into {sweep_dir}"
                  + (f", {len(slots)} at a time" if slots else ""))
    for run in runs:
        if (run.run_dir / "ir.lmdb").exists():
            with Store.open_reader(run.run_dir) as store:
                if store.state().get("finished"):
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


def _sweep_slots(args, cfg) -> list:
    """Concurrent slots for `--gpus` / `--jobs`, or [] to run one after another in this process."""
    from tik_evo import sweep
    from tik_evo.initialization import resolve_device

    if args.jobs < 1:
        raise ConfigError(f"--jobs {args.jobs}: must be at least 1")
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


def cmd_compare(args) -> int:
    from tik_evo import sweep
    from tik_evo.store import runs_under

    dirs, labels = [], []
    for d in map(Path, args.run_dirs):  # a sweep's directory stands for its runs, labelled by their names
        inside = [] if (d / "ir.lmdb").exists() else runs_under(d)
        dirs += inside or [d]
        labels += [r.name for r in inside] or [str(d)]
    out.print(sweep.table([sweep.summary(d) for d in dirs], labels))
    return 0


def cmd_status(args) -> int:
    from tik_evo.report import status

    with Store.open_reader(Path(args.run_dir)) as store:
        out.print(status(store))
    return 0


def _write(path: str, text: str) -> None:
    try:
        Path(path).write_text(text)
    except OSError as e:
        raise ConfigError(f"-o {path}: {e.strerror or e}") from None


def cmd_show(args) -> int:
    from tik_evo.report import show

    with Store.open_reader(Path(args.run_dir)) as store:
        impl_id = args.impl_id
        if impl_id in ("best", "root"):  # aliases for the run's current best and its root
            impl_id = store.state().get(impl_id) or impl_id
        if args.output:
            # The whole candidate file: a drop-in for the family's root.py (its KNOBS say what the search chose).
            impl = store.get(impl_id)
            _write(args.output, store.source(impl.source_hash))
            console.print(f"wrote {impl.id} ({impl.status}, knobs {impl.knobs}) to {args.output}")
        else:
            out.print(show(store, impl_id))
    return 0


def cmd_lineage(args) -> int:
    from tik_evo.report import lineage_tree

    with Store.open_reader(Path(args.run_dir)) as store:
        out.print(lineage_tree(store))
    return 0


def cmd_export(args) -> int:
    from tik_evo.report import export

    if args.salvage:
        return _salvage(args)
    with Store.open_reader(Path(args.run_dir)) as store:
        fh = open(args.output, "w") if args.output else sys.stdout
        n = 0
        for line in export(store):
            fh.write(line + "\n")
            n += 1
        if args.output:
            fh.close()
            console.print(f"wrote {n} records to {args.output}")
    return 0


def _salvage(args) -> int:
    """`export --salvage`: every intact record of a damaged store; exit 1 if anything was damaged."""
    from rich.markup import escape

    from tik_evo.store_salvage import salvage

    lines, damaged = salvage(Path(args.run_dir))
    fh = open(args.output, "w") if args.output else sys.stdout
    fh.write("".join(line + "\n" for line in lines))
    if args.output:
        fh.close()
    for d in damaged:
        console.print(f"[yellow]damaged:[/] {escape(d)}")
    n = sum('"type": "damaged"' not in line[:20] for line in lines)
    console.print(f"salvaged {n} intact records" + (f" to {escape(args.output)}" if args.output else "") +
                  (f"; {len(damaged)} damaged (listed above, and as \"damaged\" lines)" if damaged else
                   "; nothing is damaged"))
    return 1 if damaged else 0


# `tik-evo bench NAME` for the benchmarks that are not one family's: NAME -> benchmarks/<script>.py
SUITES = {"ops": "ops_gpu", "model": "model_consistency_gpu", "model-speed": "model_speed_gpu",
          "model-graphs": "model_graphs_gpu", "policy": "policy_gpu", "policy-glue": "policy_glue_gpu"}


def cmd_bench(args) -> int:
    """`tik-evo bench attention` runs kernels/attention/bench.py; `tik-evo bench ops` the operator families;
    `tik-evo bench model` rollout against training log-probs of a whole model, `model-speed` its training forward
    against cuBLAS / SDPA / torch, `model-graphs` its rollout with every kernel call replayed from a CUDA graph,
    `policy` the policy update (forward + backward) on the kernels, `policy-glue` its glue kernels against the
    torch code they replaced."""
    if args.family in SUITES:
        sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))
        module = importlib.import_module(SUITES[args.family])
    else:
        try:
            module = importlib.import_module(f"kernels.{args.family}.bench")
        except ModuleNotFoundError as e:
            from tik_evo.families import available

            if args.family not in available():
                raise ConfigError(f"tik-evo bench: {args.family!r} is neither a suite ({', '.join(SUITES)}) nor a "
                                  f"kernel family ({', '.join(available())})") from e
            raise ConfigError(f"family {args.family!r} has no benchmark of its own (kernels/{args.family}/bench.py);"
                              f" operator families are benchmarked together: `tik-evo bench ops --families "
                              f"{args.family}`") from e
    return int(module.main(args.rest) or 0)


def _knob_value(family, item: str):
    """'BLOCK_N=128' -> ('BLOCK_N', 128): the value is read as one of the knob's declared values (so 'off' stays a
    string and 'true' is True only where the knob takes booleans)."""
    name, sep, text = item.partition("=")
    if not sep:
        raise ConfigError(f"tik-evo kernel {family.name}: {item!r} is not KNOB=VALUE")
    try:
        knob = family.knob(name)
    except KeyError as e:
        raise ConfigError(f"tik-evo kernel {family.name}: {e.args[0]}") from None
    for value in knob.values:
        if str(value) == text or (isinstance(value, bool) and str(value).lower() == text.lower()):
            return name, value
    raise ConfigError(f"tik-evo kernel {family.name}: {name}={text!r} is not one of {list(knob.values)}")


def cmd_kernel(args) -> int:
    """A family's root with a named set and knob changes applied: a drop-in kernel file for a trainer and a rollout
    (both must use the same file: the contract knobs decide the bits)."""
    from tik_evo.initialization import knob_changes, source_with

    try:
        family = load_family(args.family)
    except FamilyError as e:
        raise ConfigError(str(e)) from e
    if args.list:
        sets = family.named_sets()
        lines = [f"{family.name}: {len(sets)} named sets" + (":" if sets else "")]
        lines += [f"  {name}: " + ", ".join(f"{k}={v!r}" for k, v in changes.items()) for name, changes in sets.items()]
        lines.append("knobs (contract knobs change the bits; full / decode knobs only a path's speed):")
        lines += [f"  {k.name} ({k.role}): {list(k.values)}" for k in family.knobs]
        out.file.write("\n".join(lines) + "\n")
        return 0
    knobs = dict(_knob_value(family, item) for item in args.knobs)
    changes = knob_changes(family, args.set_name, knobs, f"tik-evo kernel {family.name}", ("--set", "KNOB=VALUE"))
    source = source_with(family, changes)
    if args.output:
        _write(args.output, source)
        console.print(f"wrote {family.name}'s root" + (f" with {args.set_name}" if args.set_name else "") +
                      (f" and {knobs}" if knobs else "") + f" to {args.output}")
    else:
        out.file.write(source)
    return 0


def cmd_plot(args) -> int:
    from tik_evo.plot import plot

    run_dir = Path(args.run_dir)
    output = Path(args.output or run_dir / "progress.png")
    try:
        plot(run_dir, output)
    except ImportError as e:
        raise ConfigError(f"plotting needs matplotlib: pip install -e '.[plot]' ({e})") from e
    except OSError as e:
        raise ConfigError(f"-o {output}: {e.strerror or e}") from None
    console.print(f"wrote {output}")
    return 0


def cmd_tui(args) -> int:
    from tik_evo.store import runs_under

    run_dir = Path(args.run_dir)
    if not (run_dir / "ir.lmdb").exists() and runs_under(run_dir):
        from tui.sweep import run_sweep_tui

        run_sweep_tui(run_dir)  # a sweep's directory: its runs in one table
        return 0
    from tui.app import run_tui

    Store.open_reader(run_dir).close()  # fail early with a clear message
    run_tui(run_dir)
    return 0


def cmd_audit(args) -> int:
    import json

    from tik_evo.audit_file import audit_file, render

    result = audit_file(args.campaign, args.file, args.overrides,
                        log=(lambda m: None) if args.json else (lambda m: console.print(m)))
    if args.json:
        out.print_json(json.dumps(result))
    else:
        out.print(render(result), highlight=False, soft_wrap=True)
    return 0 if result["verified"] else 1


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="tik-evo", description=__doc__)
    sub = p.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run", help="run a campaign from its root")
    r.add_argument("campaign")
    r.add_argument("overrides", nargs="*", help="dotted overrides, e.g. search.max_evaluations=20")
    r.add_argument("--tui", action="store_true", help="watch the run in the TUI")
    r.add_argument("--quiet", action="store_true", help="no live progress display")
    r.set_defaults(fn=cmd_run)
    r = sub.add_parser("resume", help="continue a run that stopped or was killed")
    r.add_argument("run_dir")
    r.add_argument("overrides", nargs="*")
    r.add_argument("--quiet", action="store_true")
    r.add_argument("--from-backup", metavar="NAME", help="first put this backup of RUN/backups (or latest) in "
                                                         "place of the run's store, which is kept aside")
    r.set_defaults(fn=cmd_resume)
    for name, fn, help_ in (("status", cmd_status, "best, speed-ups, κ, budgets"),
                            ("lineage", cmd_lineage, "the derivation tree"),
                            ("tui", cmd_tui, "watch a run (live or finished), or a sweep's runs")):
        r = sub.add_parser(name, help=help_)
        r.add_argument("run_dir")
        r.set_defaults(fn=fn)
    r = sub.add_parser("sweep", help="run every combination of comma-separated overrides and compare them")
    r.add_argument("campaign")
    r.add_argument("overrides", nargs="+", help="e.g. ablation.evidence=true,false search.seed=0,1")
    r.add_argument("--dir", help="where the runs go (default: <store.path>-sweep)")
    r.add_argument("--gpus", help="run concurrently, one run per listed GPU (e.g. 0,1,2,3); each run's audits go "
                                  "to its GPU, and each run gets an equal share of the CPUs")
    r.add_argument("--jobs", type=int, default=1,
                   help="runs at once without --gpus (interpreter runs only: runs on one GPU would time each other)")
    r.add_argument("--quiet", action="store_true")
    r.set_defaults(fn=cmd_sweep)
    r = sub.add_parser("compare", help="compare finished or running runs side by side")
    r.add_argument("run_dirs", nargs="+", help="run directories, or a sweep's directory for all its runs")
    r.set_defaults(fn=cmd_compare)
    r = sub.add_parser("show", help="one implementation: source diff, checks, measurements")
    r.add_argument("run_dir")
    r.add_argument("impl_id", help="an implementation id (I3), or best / root")
    r.add_argument("-o", "--output", help="write the implementation's whole source file here instead")
    r.set_defaults(fn=cmd_show)
    r = sub.add_parser("plot", help="speed-up per offspring and best so far, as a PNG (matplotlib)")
    r.add_argument("run_dir")
    r.add_argument("-o", "--output", help="PNG path (default: RUN_DIR/progress.png)")
    r.set_defaults(fn=cmd_plot)
    r = sub.add_parser("export", help="all records as JSON lines")
    r.add_argument("run_dir")
    r.add_argument("-o", "--output")
    r.add_argument("--salvage", action="store_true", help="from a damaged store: every intact record, and the "
                                                          "damaged ones named (exit 1 if any)")
    r.set_defaults(fn=cmd_export)
    r = sub.add_parser("check", help="validate a campaign, its workloads and its family without running")
    r.add_argument("campaign")
    r.add_argument("overrides", nargs="*")
    r.set_defaults(fn=cmd_check)
    r = sub.add_parser("audit", help="audit one kernel file as an offspring of a campaign's root; exit 0 only if "
                                     "it is verified")
    r.add_argument("campaign")
    r.add_argument("file", help="the candidate source file")
    r.add_argument("overrides", nargs="*", help="dotted overrides, e.g. evaluate.sandbox=strict")
    r.add_argument("--json", action="store_true", help="the verdict as JSON")
    r.set_defaults(fn=cmd_audit)
    r = sub.add_parser("kernel", help="write a family's root with a named set and knob changes applied")
    r.add_argument("family")
    r.add_argument("knobs", nargs="*", help="KNOB=VALUE changes applied after the set")
    r.add_argument("--set", dest="set_name", help="a named knob set of the family (see --list)")
    r.add_argument("--list", action="store_true", help="list the family's named sets and knobs")
    r.add_argument("-o", "--output", help="write the source here (default: standard output)")
    r.set_defaults(fn=cmd_kernel)
    r = sub.add_parser("bench", help="benchmark a family against its peers, or run ops / model / model-speed / "
                                     "model-graphs / policy / policy-glue (GPU)")
    r.add_argument("family")
    r.add_argument("rest", nargs=argparse.REMAINDER)
    r.set_defaults(fn=cmd_bench)
    return p


def main(argv: list[str] | None = None) -> int:
    p = parser()
    args, extra = p.parse_known_args(argv)
    if extra and args.cmd == "kernel":  # KNOB=VALUE items given after --set / -o
        args.knobs += extra
    elif extra:
        p.error(f"unrecognized arguments: {' '.join(extra)}")
    try:
        return args.fn(args)
    except (ConfigError, StoreError) as e:
        console.print(f"[red]error:[/] {e}")
        return 2
    except InitError as e:
        console.print(f"[red]error:[/] {e}")
        return 1
    except KeyboardInterrupt:
        console.print("interrupted: every finished step is stored; `tik-evo resume RUN_DIR` continues")
        return 130


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main())
