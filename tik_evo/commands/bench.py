"""`tik-evo bench [NAME [ARGS ...]]`: list the benchmark suites, or run one (the registry: tik_evo_bench.SUITES,
in benchmarks/__init__.py)."""

from __future__ import annotations

from tik_evo.commands import out
from tik_evo.config import ConfigError


def cmd_bench(args) -> int:
    """No NAME, or --list: the suites with a line each. NAME: the suite's main with everything after NAME, options
    and overrides in their order (`tik-evo bench NAME --help` gives its arguments)."""
    import tik_evo  # noqa: F401 - maps tik_evo_bench to benchmarks/ where tik-evo is not installed
    import tik_evo_bench

    if args.list or not args.name:
        out.file.write(tik_evo_bench.listing() + "\n")
        return 0
    if args.name not in tik_evo_bench.SUITES:
        from tik_evo.families import available

        if args.name in available():
            raise ConfigError(f"family {args.name!r} has no benchmark of its own (kernels/{args.name}/bench.py); "
                              f"operator families are benchmarked together: `tik-evo bench ops --families "
                              f"{args.name}`")
        raise ConfigError(f"tik-evo bench: {args.name!r} is not a suite (`tik-evo bench --list`: "
                          f"{', '.join(tik_evo_bench.SUITES)})")
    return tik_evo_bench.run(args.name, args.rest)
