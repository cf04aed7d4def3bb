"""`tik-evo kernel` and `audit`: kernel files outside a search: write one, judge one."""

from __future__ import annotations

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
