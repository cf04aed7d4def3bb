"""`tik-evo bench rl-parity`: does a model trained with the unified kernels (arm B, no recompute) learn as well as
with the vendor stack (arm A, recompute) and with the mismatched log-probs reused (arm C)?

For each seed it runs `tik-evo bench rl` (a supervised warm-up, then GRPO steps, the arms interleaved) into
OUT/seed_<n>.json, skipping seeds whose file is complete, so a long study is made of several short runs (a GPU
lease ends; run the same command again). Then it writes OUT/parity.json and OUT/parity.png: each arm's mean reward
per step over the seeds, the mean over the last `--window` steps per seed, and whether B's is within noise of A's
(|mean_B - mean_A| <= 2 standard errors of the difference over seeds) and C's effect, whatever it is.

    tik-evo bench rl-parity --seeds 0,1,2 --out results/rl/parity_DATE -- --model small --sft-steps 300 \\
        --steps 200 --lr 1e-4
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
from pathlib import Path


def parse(argv: list[str] | None) -> tuple[argparse.Namespace, list[str]]:
    ap = argparse.ArgumentParser(prog="tik-evo bench rl-parity", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seeds", default="0,1,2", help="comma-separated seeds, one GRPO run each")
    ap.add_argument("--window", type=int, default=20, help="the last steps whose rewards are compared")
    ap.add_argument("--out", required=True, help="a folder: one JSON per seed, parity.json and parity.png")
    argv = list(sys.argv[1:] if argv is None else argv)
    rest = argv[argv.index("--") + 1:] if "--" in argv else []
    args = ap.parse_args(argv[: argv.index("--")] if "--" in argv else argv)
    return args, rest


def seed_runs(seeds: list[int], out: Path, rl_args: list[str]) -> dict[int, dict]:
    """Each seed's `bench rl` record, run where its file is missing or was cut short."""
    from tik_evo.rl import bench

    runs = {}
    for seed in seeds:
        path = out / f"seed_{seed}.json"
        rec = json.loads(path.read_text()) if path.exists() else None
        if rec is None or rec.get("partial", True):
            print(f"seed {seed}: running", flush=True)
            rc = bench.main([*rl_args, "--seed", str(seed), "--out", str(path)])
            if rc != 0:
                raise SystemExit(rc)
            rec = json.loads(path.read_text())
        else:
            print(f"seed {seed}: {path} is complete, kept", flush=True)
        runs[seed] = rec
    return runs


def summarize(runs: dict[int, dict], window: int) -> dict:
    """Per arm: the mean reward curve over seeds and each seed's mean over the last `window` steps; B and C each
    against A (difference of means over seeds, its standard error, within two of them)."""
    arms = sorted({a for rec in runs.values() for a in rec["arms"]})
    out: dict = {"seeds": sorted(runs), "window": window, "arms": {}}
    for arm in arms:
        curves = [[s["reward_mean"] for s in rec["arms"][arm]["steps"]] for rec in runs.values() if arm in rec["arms"]]
        n = min(len(c) for c in curves)
        out["arms"][arm] = {
            "mean_curve": [statistics.fmean(c[i] for c in curves) for i in range(n)],
            "final": [statistics.fmean(c[max(0, n - window):n]) for c in curves],
        }
    base = out["arms"].get("A")
    for arm in arms:
        if arm == "A" or base is None:
            continue
        a, b = base["final"], out["arms"][arm]["final"]
        k = min(len(a), len(b))
        diffs = [b[i] - a[i] for i in range(k)]  # paired by seed: the arms of a seed share prompts and weights
        se = statistics.stdev(diffs) / math.sqrt(k) if k > 1 else None
        mean = statistics.fmean(diffs) if diffs else None
        out[f"{arm}_minus_A"] = {"mean": mean, "stderr": se,
                                 "within_noise": None if se is None else abs(mean) <= 2 * se + 1e-12}
    return out


def plot(summary: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    for arm, data in summary["arms"].items():
        ax.plot(range(1, len(data["mean_curve"]) + 1), data["mean_curve"], label=f"arm {arm}")
    ax.set_xlabel("GRPO step")
    ax.set_ylabel(f"mean reward over {len(summary['seeds'])} seed(s)")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    args, rl_args = parse(argv)
    try:
        seeds = [int(s) for s in args.seeds.split(",") if s.strip()]
    except ValueError:
        print(f"error: --seeds {args.seeds!r}: comma-separated integers")
        return 2
    if not seeds or args.window < 1:
        print("error: at least one seed and a window of at least one step")
        return 2
    if "--seed" in rl_args or "--out" in rl_args:
        print("error: --seed and --out are set per seed by rl-parity; pass the others after --")
        return 2
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    summary = summarize(seed_runs(seeds, out, rl_args), args.window)
    try:
        plot(summary, out / "parity.png")
        summary["plot"] = "parity.png"
    except ImportError as e:  # no matplotlib on this machine: the numbers are in the JSON all the same
        summary["plot"] = f"not drawn ({e}); pip install matplotlib"
    (out / "parity.json").write_text(json.dumps(summary, indent=1) + "\n")
    for arm, data in summary["arms"].items():
        print(f"arm {arm}: final-window mean reward per seed {[round(x, 3) for x in data['final']]}")
    for key in ("B_minus_A", "C_minus_A"):
        if key in summary:
            d = summary[key]
            print(f"{key}: {d['mean']:+.4f} (stderr {d['stderr']}, within noise: {d['within_noise']})")
    print(f"wrote {out / 'parity.json'} (plot: {summary['plot']})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
