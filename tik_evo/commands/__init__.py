"""The `tik-evo` subcommands by theme: `run` (run, resume, sweep), `inspect` (status, show, lineage, export,
compare, plot, tui), `check` (a campaign and its family, checked without running), `kernel` (kernel,
audit), `bench` (the benchmark suites).
`tik_evo.cli` parses the command line and calls one of them; each returns the exit code."""

from __future__ import annotations

from pathlib import Path

from rich.console import Console

from tik_evo.config import ConfigError

console = Console(stderr=True)  # messages, warnings, progress
out = Console()  # what the command was asked for (a table, a source, JSON)


def write_text(path: str, text: str) -> None:
    """Write an `-o` file; a path that cannot be written is a ConfigError naming it, not a traceback."""
    try:
        Path(path).write_text(text)
    except OSError as e:
        raise ConfigError(f"-o {path}: {e.strerror or e}") from None
