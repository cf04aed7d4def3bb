"""`tik-evo check`, and the checks every command that starts a run makes first: the campaign's family, its
workloads and its start, without running anything."""

from __future__ import annotations

from tik_evo.commands import console, out
from tik_evo.config import ConfigError, load_campaign
from tik_evo.families import FamilyError, load_family


def family_of(cfg):
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
    problems += [f"kernels/{family.name}: {p}" for p in family.condition_problems()]
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


def check_campaign(cfg):
    """(family, workloads, the start's knob changes, the family's problems): everything that can be checked
    before a run directory exists. Bad workloads or start changes raise ConfigError."""
    from tik_evo import warm_start
    from tik_evo.initialization import start_changes
    from tik_evo.workloads import resolve_workloads

    family = family_of(cfg)
    workloads = resolve_workloads(cfg, family)
    start = start_changes(cfg, family)
    warm_start.points(list(cfg.search.warm_start), family, cfg.source_file or "campaign")
    return family, workloads, start, check_family(family)


def prepare(cfg):
    """The campaign's family and workloads, checked as `tik-evo check` checks them (ConfigError otherwise)."""
    family, workloads, _, problems = check_campaign(cfg)
    if problems:
        raise ConfigError("; ".join(problems))
    return family, workloads


def cmd_check(args) -> int:
    cfg = load_campaign(args.campaign, args.overrides)
    family, workloads, start, problems = check_campaign(cfg)
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
