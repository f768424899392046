# torchfeed's file: `copier update` replaces it. Your model is model.py; your augmentations, loss and
# metric are task.py; your settings configs/default.yaml (README.md: "Which files are yours").
"""The benchmark's report: terminal/Markdown table, bench.md, bench.json and bench.png."""

from __future__ import annotations

import json
from pathlib import Path


def table(report: dict) -> str:
    """The sweep as a Markdown table, the chosen row marked."""
    rows = [
        "| num_workers | prefetch_factor | samples/s | ms/batch (median) | ms/batch (p90) | first batch (s) "
        "| RSS main (MB) | RSS worker (MB) | /dev/shm (MB) |",
        "| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    c = report["chosen_point"]
    for p in report["points"]:
        mark = " **chosen**" if p == c else ""
        rows.append(
            f"| {p['num_workers']}{mark} | {p['prefetch_factor']} | {p['samples_per_s']:.1f} | "
            f"{p['ms_per_batch']:.2f} | {p['ms_per_batch_p90']:.2f} | {p['first_batch_s']:.3f} | "
            f"{p['rss_main_mb']:.0f} | {p['rss_worker_mb']:.0f} | {p.get('shm_mb', 0):.0f} |"
        )
    for p in report.get("shm", {}).get("skipped", []):
        rows.append(f"| {p['num_workers']} (skipped) | {p['prefetch_factor']} | | | | | | | {p['shm_mb']:.0f} |")
    return "\n".join(rows)


def summary(report: dict) -> str:
    """What was chosen and why, the stall verdict and the checks, as plain lines."""
    lines = [f"chosen: {report['chosen']}"]
    if shm := report.get("shm"):
        out = shm["skipped"]
        skipped = ", ".join(f"num_workers={p['num_workers']} prefetch_factor={p['prefetch_factor']}" for p in out)
        lines.append(
            f"/dev/shm: {shm['size_mb']:.0f} MB ({shm['free_mb']:.0f} MB free); each setting's need is its row's"
            + (f"; skipped, as they do not fit: {skipped} ({out[0]['why']})" if out else "")
        )
    if "batch_pool_samples_per_s" in report:
        p, on = report["batch_pool_samples_per_s"], report["chosen"]["batch_pool"]
        lines.append(
            f"batch pool (data/batch_pool.py): {p['on']:.0f} samples/s with it, {p['off']:.0f} without: "
            f"{'on' if on else 'off'} (on where its best run beats the best without it, the sweep's among them, by 5%)"
        )
    if "epoch_switch_s" in report:
        s = report["epoch_switch_s"]
        lines.append(f"epoch switch: {s['persistent']:.3f} s with persistent workers, {s['fresh']:.3f} s without")
    if "cache" in report:
        c = report["cache"]
        lines.append(
            f"cache: {c['speedup']:.1f}x the source ({c['cache_samples_per_s']:.0f} against "
            f"{c['source_samples_per_s']:.0f} samples/s at the chosen setting)"
        )
    if "mix" in report:
        m = report["mix"]
        each = ", ".join(
            f"{name} {e['samples_per_s']:.0f} samples/s alone, {e['share']:.0%} of the samples, {e['time_share']:.0%} "
            "of the time"
            for name, e in m["entries"].items()
        )
        lines.append(
            f"mix: {m['mix_samples_per_s']:.0f} samples/s; {each}; {m['limiting']} limits the mix (its entries allow "
            f"{m['entries_allow_samples_per_s']:.0f} samples/s)"
        )
    if "pin_memory_samples_per_s" in report:
        lines.append(f"host-to-device samples/s by pin_memory: {report['pin_memory_samples_per_s']}")
    if "stall" in report:
        st = report["stall"]
        lines.append(
            f"model step on {st['device']}: {st['model_ms_per_step']:.1f} ms "
            f"({st['model_samples_per_s']:.0f} samples/s) -> {st['verdict']}"
        )
    if "capacity" in report:
        c = report["capacity"]
        lines.append(
            f"capacity: the model consumes {c['model_samples_per_s']:.0f} samples/s per process, one loader worker "
            f"delivers {c['worker_samples_per_s']:.0f}: {c['verdict']}"
        )
    lines += report.get("paths", {}).get("lines", [])  # an image project's paths, timed on a GPU
    if "ranks" in report:  # under `launch -- bench`: what each rank's loader delivered
        r = report["ranks"]
        rates = ", ".join(f"rank {x['rank']} {x['samples_per_s']:.0f}" for x in r["by_rank"])
        lines.append(f"ranks (samples/s at each rank's chosen setting): {rates}; slowest: rank {r['slowest_rank']}")
        lines += [r["warning"]] if "warning" in r else []
    for check in report.get("checks", []):
        line = f"{check['status']:4}  {check['name']}: {check['value']}"
        lines.append(line + (f"\n      {check['advice']}" if check["advice"] else ""))
    return "\n".join(lines)


def write_reports(out: Path, report: dict) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / "bench.json").write_text(json.dumps(report, indent=2), encoding="utf-8")
    fp = report["fingerprint"]
    md = [
        "# Data-loading benchmark",
        "",
        f"Loader alone on `{fp['data']['root']}` ({_describe(fp['source'])}), "
        f"batch size {report['batch_size']}, {fp['cpus']} CPUs, {fp['processes_per_node']} process(es) per node, "
        f"torch {fp['torch']}. Chosen: the cheapest setting with workers within 5% of the best; "
        "0 workers is the baseline (loading in the training process cannot overlap the step).",
        "",
        table(report),
        "",
        "```",
        summary(report),
        "```",
        "",
    ]
    (out / "bench.md").write_text("\n".join(md), encoding="utf-8")
    plot(out / "bench.png", report)


def _describe(source) -> str:
    if isinstance(source, dict):
        return ", ".join(f"{k.replace('_', ' ')}: {v}" for k, v in source.items())
    return str(source)


def plot(path: Path, report: dict) -> None:
    """Throughput against num_workers, one line per prefetch_factor, the chosen point marked,
    and the model's consumption rate as a horizontal line."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.4, 4.2), dpi=100)
    for pf in sorted({p["prefetch_factor"] for p in report["points"] if p["num_workers"] > 0} or {2}):
        pts = sorted(
            (p for p in report["points"] if p["prefetch_factor"] == pf or p["num_workers"] == 0),
            key=lambda p: p["num_workers"],
        )
        ax.plot(
            [p["num_workers"] for p in pts],
            [p["samples_per_s"] for p in pts],
            marker="o",
            label=f"prefetch_factor={pf}",
        )
    c = report["chosen_point"]
    ax.scatter(
        [c["num_workers"]],
        [c["samples_per_s"]],
        s=180,
        facecolors="none",
        edgecolors="red",
        linewidths=2,
        label="chosen",
        zorder=3,
    )
    if "stall" in report:
        rate = report["stall"]["model_samples_per_s"]
        ax.axhline(rate, color="gray", linestyle="--", label=f"model consumes ({report['stall']['device']})")
    ax.set_xlabel("num_workers")
    ax.set_ylabel("samples/s (loader alone)")
    ax.set_title("Data-loading throughput")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
