"""The loader benchmark's chart: samples/s per loader at 224 and 64 px, with the limits marked; the baseline's
rows (``(before: REF)``) in a colour of their own."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402 (after choosing the backend)
from results import limits as limits_of  # noqa: E402

RENDERED, BEFORE, BASELINE, LIMIT = "#2b6cb0", "#90cdf4", "#a0aec0", "#c53030"


def _colour(name: str) -> str:
    if "(before: " in name:  # the project rendered from the baseline commit
        return BEFORE
    return RENDERED if "rendered" in name else BASELINE


def _panel(ax, rows: list[dict], limits: dict[str, float], title: str) -> None:
    rows = [r for r in rows if r["median"]]
    names = [r["name"] for r in rows][::-1]
    values = [r["median"] for r in rows][::-1]
    low = [r["median"] - r["range"][0] for r in rows][::-1]
    high = [r["range"][1] - r["median"] for r in rows][::-1]
    colours = [_colour(n) for n in names]
    ax.barh(names, values, xerr=[low, high], color=colours, error_kw={"elinewidth": 0.8, "capsize": 2})
    for y, (name, value, above) in enumerate(zip(names, values, high)):
        label = {"boxstyle": "square,pad=0.1", "facecolor": "white", "edgecolor": "none", "alpha": 0.8}
        ax.text(value + above, y, f"  {value:.0f}", va="center", ha="left", fontsize=8, bbox=label, zorder=3)
        if name in limits:
            ax.plot([limits[name]] * 2, [y - 0.4, y + 0.4], color=LIMIT, linewidth=2)
    ax.set_title(title, fontsize=10, loc="left")
    ax.set_xlabel("samples/s (median; whiskers: range over rounds)", fontsize=8)
    ax.tick_params(labelsize=8)
    ax.set_xlim(0, max([*(r["range"][1] for r in rows), *limits.values()], default=1) * 1.15)


def draw(result: dict, path: Path) -> None:
    """Write the chart of ``result`` (from ``report.collect``) to ``path`` (PNG)."""
    rows, cores, m = result["rows"], result["cores"], result["machine"]
    limit_of = {r["name"]: r["median"] * cores for r in rows if r["group"] == "limit" and r["median"]}
    ref = result["settings"].get("baseline")
    limits = {name: limit_of[limit] for name, limit in limits_of(ref).items() if limit in limit_of}
    fig, axes = plt.subplots(2, 1, figsize=(9, 7), height_ratios=[9, 4])
    _panel(axes[0], [r for r in rows if r["group"] == "224"], limits, "224 px crops from 400-600 px JPEG photos")
    _panel(axes[1], [r for r in rows if r["group"] == "64"], {}, "64 px crops of sample-data")
    axes[0].plot([], [], color=LIMIT, linewidth=2, label=f"limit: one process's per-sample work x {cores} cores")
    axes[0].legend(fontsize=8, loc="lower right")
    s = result["settings"]
    fig.suptitle(
        f"{m['cpu']}, {cores} usable cores, torch {m['torch']}; batch {s['batch_size']}, "
        f"{s['workers']} workers; {m['date']}",
        fontsize=9,
    )
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
