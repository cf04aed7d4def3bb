"""Kernel files given on a benchmark's command line: `--kernel FAMILY=FILE` (a file from `tik-evo kernel` or
`tik-evo show RUN best -o FILE`) and `--best RUN_DIR` (a search's best, read from its IR store).

Each is read and its KNOBS checked against its family's knob space before anything runs, so a wrong path,
family or knob is named at once. The model benchmarks put them in place of the roots (`impls_from_args`,
`model_impls`); the operator benchmark times them beside the roots (`tik-evo bench ops`).
"""

from __future__ import annotations

import argparse
import importlib
import re
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType


class KernelArgError(ValueError):
    """A --kernel / --best argument that cannot be used; the message names it."""


@dataclass(frozen=True)
class KernelSource:
    arg: str  # the argument as given, for messages and records
    family: str
    stem: str  # a name for labels: file_<file stem> or best_<implementation id>
    source: str


def _name(text: str) -> str:
    return re.sub(r"\W", "_", text)


def add_arguments(ap: argparse.ArgumentParser, what: str) -> None:
    """--best RUN_DIR and --kernel FAMILY=FILE (both repeatable); `what` says what is done with them."""
    ap.add_argument("--best", metavar="RUN_DIR", action="append", default=[],
                    help=f"the best implementation of a run directory: {what} (repeatable)")
    ap.add_argument("--kernel", metavar="FAMILY=FILE", action="append", default=[],
                    help=f"a kernel file of FAMILY: {what} (repeatable)")


def kernel_sources(best: list[str], kernels: list[str], families: tuple[str, ...],
                   elsewhere: str = "") -> list[KernelSource]:
    """The runs' bests and the files, read and checked; a family outside `families` is refused (naming
    `elsewhere`, where it can be benchmarked instead)."""
    from tik_evo.knobs import read_knobs

    def known(arg: str, family: str) -> None:
        if family not in families:
            raise KernelArgError(f"{arg}: family {family!r} is not one of {', '.join(families)}" +
                                 (f" ({elsewhere})" if elsewhere else ""))

    found = []
    for run_dir in best:
        from tik_evo.store import StoreError, best_of  # lmdb: only where a run directory is given

        try:
            family, impl_id, source = best_of(Path(run_dir))
        except StoreError as e:
            raise KernelArgError(f"--best {run_dir}: {e}") from None
        known(f"--best {run_dir}", family)
        found.append(KernelSource(f"--best {run_dir}", family, _name(f"best_{impl_id}"), source))
    for item in kernels:
        family, sep, path = item.partition("=")
        if not sep or not path:
            raise KernelArgError(f"--kernel {item}: expected FAMILY=FILE, e.g. rope=rope_kernel.py")
        known(f"--kernel {item}", family)
        try:
            source = Path(path).read_text()
        except OSError as e:
            raise KernelArgError(f"--kernel {item}: {e.strerror or e}") from None
        found.append(KernelSource(f"--kernel {item}", family, _name(f"file_{Path(path).stem}"), source))
    for k in found:
        try:
            importlib.import_module(f"tik_evo_kernels.{k.family}").FAMILY.check_knobs(read_knobs(k.source), "its KNOBS")
        except ValueError as e:  # no KNOBS dict, or a knob outside the family's space (KnobsError is one too)
            raise KernelArgError(f"{k.arg}: {e}") from None
    return found


def model_impls(args: argparse.Namespace, families: tuple[str, ...],
                impls: dict[str, ModuleType] | None = None) -> tuple[dict[str, ModuleType], dict[str, str]]:
    """A model's kernels: `impls` (default: the roots) with each family of `args.best` / `args.kernel` replaced by
    that file; and {family: argument} of the replacements. One file per family."""
    from tik_evo.candidate import load_source
    from tik_evo_kernels.decoder import roots

    impls = dict(impls or roots(families))
    given: dict[str, str] = {}
    for k in kernel_sources(args.best, args.kernel, families, "the families of this model"):
        if k.family in given:
            raise KernelArgError(f"{k.arg}: {k.family} is already given by {given[k.family]} (one file per family)")
        impls[k.family], given[k.family] = load_source(k.source, f"{k.family}_{k.stem}"), k.arg
    return impls, given


def impls_from_args(args: argparse.Namespace, families: tuple[str, ...],
                    attention_set: str = "") -> tuple[dict[str, ModuleType], dict[str, dict]] | None:
    """A model benchmark's kernels: the roots (attention as its named set `attention_set`, if given) with the files of
    --best / --kernel in place, and a record of the replacements ({family: {"from": argument, "knobs": ...}}) for
    its JSON. None, with the error printed, when an argument cannot be used (before any GPU is needed)."""
    from tik_evo_kernels.decoder import with_sets

    try:
        impls = with_sets({"attention": attention_set}, "--attention-set", families) if attention_set else None
        impls, given = model_impls(args, families, impls)
    except KernelArgError as e:
        print(f"error: {e}")
        return None
    return impls, {f: {"from": arg, "knobs": impls[f].KNOBS} for f, arg in given.items()}
