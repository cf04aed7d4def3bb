"""`tik-evo kernel`, `audit` and `bench`: kernel files outside a search: write one, judge one, benchmark them."""

from __future__ import annotations

import importlib
import sys
from pathlib import Path

from tik_evo.commands import console, out, write_text
from tik_evo.config import ConfigError
from tik_evo.families import FamilyError, load_family


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
        write_text(args.output, source)
        console.print(f"wrote {family.name}'s root" + (f" with {args.set_name}" if args.set_name else "") +
                      (f" and {knobs}" if knobs else "") + f" to {args.output}")
    else:
        out.file.write(source)
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


# `tik-evo bench NAME` for the benchmarks that are not one family's: NAME -> benchmarks/<script>.py
SUITES = {"ops": "ops_gpu", "model": "model_consistency_gpu", "model-speed": "model_speed_gpu",
          "model-graphs": "model_graphs_gpu", "policy": "policy_gpu", "policy-glue": "policy_glue_gpu"}


def cmd_bench(args) -> int:
    """`tik-evo bench attention` runs kernels/attention/bench.py; `tik-evo bench ops` the operator families;
    `tik-evo bench model` rollout against training log-probs of a whole model, `model-speed` its training forward
    against cuBLAS / SDPA / torch, `model-graphs` its rollout with every kernel call replayed from a CUDA graph,
    `policy` the policy update (forward + backward) on the kernels, `policy-glue` its glue kernels against the
    torch code they replaced; `search CAMPAIGN` how much of the gap to a known good set each search arm closes."""
    if args.family == "search":
        from tik_evo import search_bench

        return search_bench.cli(args.rest)
    if args.family in SUITES:
        sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
        module = importlib.import_module(SUITES[args.family])
    else:
        try:
            module = importlib.import_module(f"tik_evo_kernels.{args.family}.bench")
        except ModuleNotFoundError as e:
            from tik_evo.families import available

            if args.family not in available():
                raise ConfigError(f"tik-evo bench: {args.family!r} is neither a suite ({', '.join(SUITES)}) nor a "
                                  f"kernel family ({', '.join(available())})") from e
            raise ConfigError(f"family {args.family!r} has no benchmark of its own (kernels/{args.family}/bench.py);"
                              f" operator families are benchmarked together: `tik-evo bench ops --families "
                              f"{args.family}`") from e
    return int(module.main(args.rest) or 0)
