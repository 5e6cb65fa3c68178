"""Writes the results: one JSON per workload, and a Markdown summary and PNG chart over all of them."""

from __future__ import annotations

import json
from pathlib import Path

from benchmarks import stats

SUMMARY_MD = "summary.md"
CHART_PNG = "summary.png"


def write_workload_json(results_dir: Path, data: dict[str, object]) -> Path:
    results_dir.mkdir(parents=True, exist_ok=True)
    path = results_dir / f"{data['workload']}.json"
    path.write_text(json.dumps(data, indent=2, sort_keys=False) + "\n")
    return path


def load_results(results_dir: Path, order: list[str] | None = None) -> list[dict]:
    """Every workload's latest JSON in the folder, in `order` first, then by name."""
    found = {}
    for path in sorted(results_dir.glob("*.json")):
        try:
            data = json.loads(path.read_text())
        except (OSError, json.JSONDecodeError):
            continue
        if isinstance(data, dict) and {"workload", "cases", "systems"} <= data.keys():
            found[data["workload"]] = data
    ranked = [name for name in (order or []) if name in found] + sorted(n for n in found if n not in (order or []))
    return [found[name] for name in ranked]


def _summary_from_json(data: dict | None) -> stats.Summary | None:
    return stats.Summary(**data) if data else None


def markdown(results: list[dict]) -> str:
    lines = ["# Fluvial and Apache Kafka, side by side", ""]
    if not results:
        return "\n".join(lines + ["No results yet: run `python -m benchmarks run`.", ""])
    first = results[0]
    machine = first["machine"]
    lines += [
        f"Machine: {machine['cpu']}, {machine['logical_cores']} logical cores, {machine['memory_gb']} GB RAM, "
        f"{machine['os']}; Python {machine['python']}; {machine['java']}; confluent-kafka "
        f"{machine['confluent_kafka']} (librdkafka {machine['librdkafka']}); Apache Kafka "
        f"{machine['apache_kafka']}; Fluvial at commit {machine['git_commit']}.",
        "",
        "Each figure is the median of the counted rounds with (min–max); warm-up rounds are not counted. "
        "Systems run alternately, one case at a time (A B C, then C B A). The ratio is Fluvial / Kafka "
        "taken round by round (each round's pair ran back to back), median (min–max). "
        "↑ higher is better, ↓ lower is better. MB = 10^6 bytes. Peak RSS is the broker process's resident memory, "
        "sampled every 50 ms during the case.",
        "",
        "Systems and durability:",
        "",
    ]
    for system in first["systems"]:
        lines.append(f"- **{system['label']}** (`{system['name']}`): {system['durability']}.")
    lines.append("")
    for data in results:
        lines += _workload_section(data)
    return "\n".join(lines)


def _workload_section(data: dict) -> list[str]:
    systems = data["systems"]
    baseline = data["baseline"]
    others = [s for s in systems if s["name"] != baseline]
    counted = data["rounds"] - data["warmup_rounds"]
    load = data.get("load_average_1m") or {}
    load_text = (f" Load average (1 min) at start / end: {load.get('start', '?')} / {load.get('end', '?')} "
                 f"on {data['machine']['logical_cores']} cores." if load else "")
    lines = [
        f"## {data['workload']}",
        "",
        data["description"],
        "",
        f"`{data['command']}` — {data['mode']} mode, {data['started']}, {counted} counted round(s) after "
        f"{data['warmup_rounds']} warm-up.{load_text}",
        "",
    ]
    header = ["case", "figure"] + [s["label"] for s in systems] + [f"{s['name']} / {baseline}" for s in others]
    lines.append("| " + " | ".join(header) + " |")
    lines.append("|" + "---|" * len(header))
    for case in data["cases"]:
        for metric in case["metrics"]:
            arrow = "↑" if metric["higher_is_better"] else "↓"
            unit = "" if metric["unit"] == metric["metric"] else f" ({metric['unit']})"
            row = [case["case"], f"{metric['metric']}{unit} {arrow}"]
            row += [stats.format_summary(_summary_from_json(metric["systems"][s["name"]]["summary"]))
                    for s in systems]
            row += [stats.format_ratio(_summary_from_json(metric["ratio_to_kafka"].get(s["name"])))
                    for s in others]
            lines.append("| " + " | ".join(row) + " |")
    lines.append("")
    if data["failures"]:
        lines += ["Failed:", ""]
        for failure in data["failures"]:
            where = "start" if failure["round"] is None else f"round {failure['round'] + 1}"
            first_line = failure["error"].strip().splitlines()[0][:240] if failure["error"].strip() else "?"
            lines.append(f"- `{failure['system']}` — {failure['case']} ({where}): {first_line}")
        lines.append("")
    return lines


def write_markdown(results_dir: Path, results: list[dict]) -> Path:
    path = results_dir / SUMMARY_MD
    path.write_text(markdown(results))
    return path


# --- chart ----------------------------------------------------------------------------------------

_COLOURS = {"kafka": "#4c72b0", "fluvial": "#dd8452", "fluvial-flush-none": "#55a868"}


def _panels(results: list[dict]) -> list[tuple[str, str, list[str], dict[str, list], list[dict]]]:
    """(title, y label, x labels, system -> [(median, min, max) | None], systems) per panel."""
    panels = []
    memory: dict[str, list] = {}
    memory_labels: list[str] = []
    memory_systems: list[dict] = []
    for data in results:
        systems = data["systems"]
        by_chart: dict[str, list[tuple[str, dict]]] = {}
        for case in data["cases"]:
            for metric in case["metrics"]:
                if metric["chart"]:
                    by_chart.setdefault(metric["chart"], []).append((case["case"], metric))
        for chart in ("throughput", "latency"):
            entries = by_chart.get(chart)
            if not entries:
                continue
            labels = [case if chart == "throughput" else metric["metric"] for case, metric in entries]
            bars = {s["name"]: [_triple(metric["systems"][s["name"]]["summary"]) for _, metric in entries]
                    for s in systems}
            unit = entries[0][1]["unit"]
            panels.append((f"{data['workload']}: {chart}", unit, labels, bars, systems))
        if "memory" in by_chart:
            memory_labels.append(data["workload"])
            memory_systems = systems
            for s in systems:
                peaks = [_triple(metric["systems"][s["name"]]["summary"]) for _, metric in by_chart["memory"]]
                peaks = [p for p in peaks if p is not None]
                memory.setdefault(s["name"], []).append(
                    max(peaks, key=lambda p: p[0]) if peaks else None)
    if memory_labels:
        panels.append(("broker peak RSS (largest case median)", "MB", memory_labels, memory, memory_systems))
    return panels


def _triple(summary: dict | None) -> tuple[float, float, float] | None:
    return (summary["median"], summary["min"], summary["max"]) if summary else None


def write_chart(results_dir: Path, results: list[dict]) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = _panels(results)
    rows = max(1, len(panels))
    fig, axes = plt.subplots(rows, 1, figsize=(10, 3.6 * rows), squeeze=False)
    for ax, (title, unit, labels, bars, systems) in zip(axes[:, 0], panels):
        width = 0.8 / max(1, len(systems))
        for i, system in enumerate(systems):
            values = bars.get(system["name"], [])
            xs = [j + (i - (len(systems) - 1) / 2) * width for j in range(len(labels))]
            heights = [v[0] if v else float("nan") for v in values]
            low = [v[0] - v[1] if v else 0.0 for v in values]
            high = [v[2] - v[0] if v else 0.0 for v in values]
            ax.bar(xs, heights, width, yerr=[low, high], capsize=3, label=system["label"],
                   color=_COLOURS.get(system["name"]))
            for x, v in zip(xs, values):
                if v is None:
                    ax.text(x, 0.02, "failed", rotation=90, ha="center", va="bottom", fontsize=7,
                            transform=ax.get_xaxis_transform())
        if title.endswith("latency"):
            ax.set_yscale("log")  # medians and tails of different systems can be decades apart
        ax.set_xticks(range(len(labels)))
        ax.set_xticklabels(labels, fontsize=8)
        ax.set_title(title, fontsize=10)
        ax.set_ylabel(unit, fontsize=8)
        ax.grid(axis="y", alpha=0.3)
        ax.legend(fontsize=7)
    if not panels:
        axes[0, 0].text(0.5, 0.5, "no results", ha="center")
    fig.tight_layout()
    path = results_dir / CHART_PNG
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
