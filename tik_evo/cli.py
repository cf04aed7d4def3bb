"""`tik-evo` command line: run, resume, status, show, lineage, export, check, audit, bench, kernel, tui."""

# The parser and the dispatch; the commands themselves live in `tik_evo.commands`, by theme.
from __future__ import annotations

import argparse
import os
import sys

from rich.markup import escape

from tik_evo.commands import bench, check, console, inspect, kernel, run
from tik_evo.commands.check import check_family  # noqa: F401 - tests import it from here
from tik_evo.config import ConfigError
from tik_evo.initialization import InitError
from tik_evo.store import StoreError


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="tik-evo", description=__doc__)
    sub = p.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run", help="run a campaign from its root")
    r.add_argument("campaign")
    r.add_argument("overrides", nargs="*", help="dotted overrides, e.g. search.max_evaluations=20")
    r.add_argument("--tui", action="store_true", help="watch the run in the TUI")
    r.add_argument("--quiet", action="store_true", help="no live progress display")
    r.set_defaults(fn=run.cmd_run)
    r = sub.add_parser("resume", help="continue a run that stopped or was killed")
    r.add_argument("run_dir")
    r.add_argument("overrides", nargs="*")
    r.add_argument("--quiet", action="store_true")
    r.add_argument("--from-backup", metavar="NAME", help="first put this backup of RUN/backups (or latest) in "
                                                         "place of the run's store, which is kept aside")
    r.set_defaults(fn=run.cmd_resume)
    for name, fn, help_ in (("status", inspect.cmd_status, "best, speed-ups, κ, budgets"),
                            ("lineage", inspect.cmd_lineage, "the derivation tree"),
                            ("tui", inspect.cmd_tui, "watch a run (live or finished), or a sweep's runs")):
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
    r.add_argument("--ray", nargs="?", const="auto", metavar="ADDRESS",
                   help="audit on a Ray cluster (auto: the running one; local: start one here; or its address): "
                        "runs at once share its GPUs, each run's engine and run directory stay here")
    r.add_argument("--quiet", action="store_true")
    r.set_defaults(fn=run.cmd_sweep)
    r = sub.add_parser("compare", help="compare finished or running runs side by side")
    r.add_argument("run_dirs", nargs="+", help="run directories, or a sweep's directory for all its runs")
    r.set_defaults(fn=inspect.cmd_compare)
    r = sub.add_parser("show", help="one implementation: source diff, checks, measurements")
    r.add_argument("run_dir")
    r.add_argument("impl_id", help="an implementation id (I3), or best / root")
    r.add_argument("-o", "--output", help="write the implementation's whole source file here instead")
    r.set_defaults(fn=inspect.cmd_show)
    r = sub.add_parser("plot", help="speed-up per offspring and best so far, as a PNG (matplotlib)")
    r.add_argument("run_dir")
    r.add_argument("-o", "--output", help="PNG path (default: RUN_DIR/progress.png)")
    r.set_defaults(fn=inspect.cmd_plot)
    r = sub.add_parser("export", help="all records as JSON lines")
    r.add_argument("run_dir")
    r.add_argument("-o", "--output")
    r.add_argument("--salvage", action="store_true", help="from a damaged store: every intact record, and the "
                                                          "damaged ones named (exit 1 if any)")
    r.set_defaults(fn=inspect.cmd_export)
    r = sub.add_parser("check", help="validate a campaign, its workloads and its family without running")
    r.add_argument("campaign")
    r.add_argument("overrides", nargs="*")
    r.set_defaults(fn=check.cmd_check)
    r = sub.add_parser("audit", help="audit one kernel file as an offspring of a campaign's root; exit 0 only if "
                                     "it is verified")
    r.add_argument("campaign")
    r.add_argument("file", help="the candidate source file")
    r.add_argument("overrides", nargs="*", help="dotted overrides, e.g. evaluate.sandbox=strict")
    r.add_argument("--json", action="store_true", help="the verdict as JSON")
    r.set_defaults(fn=kernel.cmd_audit)
    r = sub.add_parser("kernel", help="write a family's root with a named set and knob changes applied")
    r.add_argument("family")
    r.add_argument("knobs", nargs="*", help="KNOB=VALUE changes applied after the set")
    r.add_argument("--set", dest="set_name", help="a named knob set of the family (see --list)")
    r.add_argument("--list", action="store_true", help="list the family's named sets and knobs")
    r.add_argument("-o", "--output", help="write the source here (default: standard output)")
    r.set_defaults(fn=kernel.cmd_kernel)
    r = sub.add_parser("bench", help="run a benchmark suite (NAME ARGS ...; `tik-evo bench NAME --help`), or list "
                                     "the suites (no NAME, or --list)")
    r.add_argument("name", nargs="?", help="a suite, e.g. attention, ops, model, policy, search")
    r.add_argument("rest", nargs=argparse.REMAINDER)
    r.add_argument("--list", action="store_true", help="list the suites: name, GPU or CPU, what each measures")
    r.set_defaults(fn=bench.cmd_bench)
    return p


def main(argv: list[str] | None = None) -> int:
    p = parser()
    argv = sys.argv[1:] if argv is None else list(argv)
    if len(argv) >= 2 and argv[0] == "bench" and not argv[1].startswith("-"):
        # everything after `bench NAME` is the benchmark's own command line, options and overrides in their order
        args, extra = argparse.Namespace(fn=bench.cmd_bench, name=argv[1], rest=argv[2:], list=False), []
    else:
        args, extra = p.parse_known_args(argv)
    if extra and args.cmd == "kernel":  # KNOB=VALUE items given after --set / -o
        args.knobs += extra
    elif extra and hasattr(args, "overrides") and all("=" in e and not e.startswith("-") for e in extra):
        args.overrides += extra  # dotted overrides given after an option (`audit C F --json key=value`)
    elif extra:
        p.error(f"unrecognized arguments: {' '.join(extra)}")
    try:
        return args.fn(args)
    except (ConfigError, StoreError) as e:
        console.print(f"[red]error:[/] {escape(str(e))}")  # a message may name an extra: pip install '.[ray]'
        return 2
    except InitError as e:
        console.print(f"[red]error:[/] {escape(str(e))}")
        return 1
    except KeyboardInterrupt:
        console.print("interrupted: every finished step is stored; `tik-evo resume RUN_DIR` continues")
        return 130


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main())
