"""The GRPO benchmark's summary: per arm, mean seconds per phase over the timed steps, generated tokens per second,
peak memory, rewards and the first micro-batch's PPO ratios; B's and C's throughput over A's; a markdown table."""

from __future__ import annotations

from tik_evo.rl.trainer import PHASES


def summarize(arms: dict[str, dict], skip: int) -> dict:
    """arms: {name: {"steps": [step records], ...}}; the first `skip` steps of each arm (compilation, warm-up)
    are left out of the times, not of the rewards or ratios."""
    out: dict = {"skip": skip, "arms": {}}
    for name, arm in arms.items():
        steps = arm["steps"]
        timed = steps[skip:]
        total = sum(r["total_s"] for r in timed)
        gen = sum(r["tokens"]["generated"] for r in timed)
        peaks = [r["peak_mem_bytes"] for r in steps if r["peak_mem_bytes"] is not None]
        first = [r["ratio_first_micro_batch"] for r in steps]
        out["arms"][name] = {
            "steps": len(steps), "steps_timed": len(timed),
            "mean_phase_s": {p: sum(r["times_s"][p] for r in timed) / len(timed) for p in PHASES} if timed else None,
            "mean_step_s": total / len(timed) if timed else None,
            "generated_tokens_per_s": gen / total if total else None,
            "peak_mem_bytes": max(peaks) if peaks else None,
            "reward_first": steps[0]["reward_mean"] if steps else None,
            "reward_last": steps[-1]["reward_mean"] if steps else None,
            "ratios_exactly_one_every_step": all(f["all_exactly_one"] for f in first),
            "ratio_not_one_tokens": sum(f["not_one"] for f in first),
            "ratio_tokens": sum(f["tokens"] for f in first),
            "ratio_abs_dev_max": max((f["abs_dev_max"] for f in first), default=None),
            "ratio_clipped_fraction_mean": sum(f["clipped_fraction"] for f in first) / len(first) if first else None,
        }
    a = out["arms"].get("A", {}).get("generated_tokens_per_s")
    for name in ("B", "C"):
        x = out["arms"].get(name, {}).get("generated_tokens_per_s")
        out[f"{name}_over_A_throughput"] = x / a if a and x else None
    return out


def _fmt(x, spec: str = ".3f") -> str:
    return "-" if x is None else format(x, spec)


def markdown(record: dict) -> str:
    """A short report of one benchmark record (what `bench.py` writes beside its JSON)."""
    s, cfg = record["summary"], record["config"]
    lines = [f"# GRPO step by arm: {record['model']} ({record['shape']['layers']} layers)", "",
             f"{record['date']}, {record['device']}, torch {record['torch']}, Triton {record['triton']}, "
             f"Liger {record['liger'] or 'not installed'}. {cfg['prompts']} prompts x {cfg['group']} samples, "
             f"prompts of {record['task']['prompt_tokens']} tokens, answers up to {cfg['max_new']}, "
             f"micro-batches of {cfg['micro_batch']}, {s['skip']} step(s) per arm left out of the times.", ""]
    if not record["timed"]:
        lines += ["**No speed figures**: this run was on the CPU (Triton's interpreter for the kernels); it checks "
                  "the loop, not its speed.", ""]
    lines += ["| arm | step s | rollout | recompute | update | other | gen tok/s | peak GiB | reward first -> last "
              "| ratios of the first micro-batch |", "|---|---|---|---|---|---|---|---|---|---|"]
    for name, a in s["arms"].items():
        ph = a["mean_phase_s"] or {}
        peak = a["peak_mem_bytes"] / 2 ** 30 if a["peak_mem_bytes"] else None
        ratios = ("exactly 1.0 every step" if a["ratios_exactly_one_every_step"] else
                  f"{a['ratio_not_one_tokens']} of {a['ratio_tokens']} not 1; max abs(r-1) "
                  f"{_fmt(a['ratio_abs_dev_max'], '.2e')}; clipped {_fmt(a['ratio_clipped_fraction_mean'], '.4f')}")
        phases = " | ".join(_fmt(ph.get(p)) for p in ("rollout", "recompute", "update", "other"))
        lines.append(f"| {name} | {_fmt(a['mean_step_s'])} | {phases} | {_fmt(a['generated_tokens_per_s'], '.1f')} "
                     f"| {_fmt(peak, '.2f')} | {_fmt(a['reward_first'])} -> {_fmt(a['reward_last'])} | {ratios} |")
    lines += ["", f"B / A throughput: {_fmt(s.get('B_over_A_throughput'))}; C / A: {_fmt(s.get('C_over_A_throughput'))}"
              " (generated tokens per second of the timed steps).", ""]
    if record["order"] == "interleaved" and record["timed"]:
        lines += ["Peaks of interleaved arms include the other arms' weights and optimizer states; compare memory "
                  "from an `--order sequential` run.", ""]
    for name, arm in record["arms"].items():
        lines.append(f"- {name}: {arm['doc']}. " + "; ".join(arm["notes"]))
    for name, arm in record["arms"].items():
        prof = arm.get("profile")
        if prof:
            kern = "" if prof["kernel_ms"] is None else f", kernels {prof['kernel_ms']:.0f} ms"
            tops = "; ".join(f"{k['name'][:60]} {k['ms']:.0f} ms" for k in prof["top_kernels"][:4])
            lines.append(f"- {name}, one profiled step: wall {prof['wall_ms']:.0f} ms{kern}" + (f" ({tops})" if tops
                                                                                             else ""))
    if record.get("packed_backward"):
        pb = record["packed_backward"]
        lines.append(f"- the unified kernels' packed attention backward: {pb['ran']} (setting {pb['setting']})")
    return "\n".join(lines) + "\n"
