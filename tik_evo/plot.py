"""`tik-evo plot RUN_DIR`: speed-up over the root per audited offspring and the best so far (matplotlib)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tik_evo.store import Store
from tik_evo.timing import LABELS


def series(store: Store) -> dict[str, Any]:
    snap = store.snapshot()
    st = snap["state"]
    root_t = st.root_objective
    points = {"verified": [], "over limit": [], "promoted": [], "failed": []}
    best = []
    for h in st.history:
        n = h["evaluation"]
        best.append((n, root_t / h["best"]))
        if n == 0:
            continue
        if h.get("failed") or h["objective"] is None:
            kind = "failed"
        elif h["promoted"]:
            kind = "promoted"
        else:
            kind = "over limit" if h.get("admissible") is False else "verified"
        points[kind].append((n, root_t / h["objective"] if h["objective"] else 0.0))
    timers = {a.timer for a in snap["U"] if a.timer}
    return {"best": best, "points": points, "timer": " + ".join(LABELS.get(t, t) for t in sorted(timers)),
            "title": f"{st.family} on {st.device_facts.get('actual_gpu') or 'CPU interpreter'}"}


def plot(run_dir: Path, output: Path) -> dict[str, Any]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    with Store.open_reader(run_dir) as store:
        data = series(store)
    fig, ax = plt.subplots(figsize=(8, 4.5))
    xs, ys = zip(*data["best"]) if data["best"] else ((), ())
    ax.step(xs, ys, where="post", color="black", label="best so far")
    style = {"verified": ("tab:blue", "o"), "over limit": ("tab:orange", "v"), "promoted": ("tab:green", "*"),
             "failed": ("tab:red", "x")}
    for kind, pts in data["points"].items():
        if pts:
            px, py = zip(*pts)
            ax.scatter(px, py, c=style[kind][0], marker=style[kind][1], label=kind, zorder=3)
    ax.axhline(1.0, color="grey", linewidth=0.8, linestyle=":")
    ax.set_xlabel("audited offspring")
    ax.set_ylabel("speed-up over root (T(root) / T)")
    ax.set_title(f"{data['title']}\n{data['timer']}", fontsize=10)
    ax.legend(loc="best", fontsize=8)
    fig.tight_layout()
    fig.savefig(output, dpi=120)
    plt.close(fig)
    return data
