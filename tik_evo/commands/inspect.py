"""`tik-evo status`, `show`, `lineage`, `export`, `compare`, `plot` and `tui`: read-only views of runs."""

from __future__ import annotations

import sys
from pathlib import Path

from tik_evo.commands import console, out, write_text
from tik_evo.config import ConfigError
from tik_evo.store import Store


def cmd_status(args) -> int:
    from tik_evo.report import status

    with Store.open_reader(Path(args.run_dir)) as store:
        out.print(status(store))
    return 0


def cmd_show(args) -> int:
    from tik_evo.report import show

    with Store.open_reader(Path(args.run_dir)) as store:
        impl_id = args.impl_id
        if impl_id in ("best", "root"):  # aliases for the run's current best and its root
            st = store.state()
            impl_id = (st.best if impl_id == "best" else st.root) or impl_id
        if args.output:
            # The whole candidate file: a drop-in for the family's root.py (its KNOBS say what the search chose).
            impl = store.get(impl_id)
            write_text(args.output, store.source(impl.source_hash))
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
