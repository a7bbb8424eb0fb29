"""Small PNG charts embedded in Markdown metadata, because a curve is read faster than a table.

Rendered with matplotlib's Agg backend (no display, no fonts from the network) and inlined as a
base64 data URI, which the Dagster UI shows in the materialization's metadata panel. Each chart is
kept to a few tens of kilobytes so that the event log stays small.
"""

import base64
import io
from collections.abc import Mapping, Sequence

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt


def _markdown_png(fig: "plt.Figure", alt: str) -> str:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=80, bbox_inches="tight")
    plt.close(fig)
    return f"![{alt}](data:image/png;base64,{base64.b64encode(buf.getvalue()).decode()})"


def bar_chart_md(values: Mapping[str, float], title: str, ylabel: str) -> str:
    fig, ax = plt.subplots(figsize=(5, 2.6))
    names = list(values)
    ax.bar(names, [values[n] for n in names], color="#4c72b0")
    ax.set_title(title)
    ax.set_ylabel(ylabel)
    ax.grid(axis="y", alpha=0.3)
    return _markdown_png(fig, title)


def line_chart_md(series: Mapping[str, Sequence[tuple[float, float]]], title: str, xlabel: str, ylabel: str) -> str:
    fig, ax = plt.subplots(figsize=(5, 2.6))
    for name, points in series.items():
        if points:
            xs, ys = zip(*points, strict=True)
            ax.plot(xs, ys, label=name, linewidth=1.2)
    ax.set_title(title)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.grid(alpha=0.3)
    if len(series) > 1:
        ax.legend(fontsize=7)
    return _markdown_png(fig, title)


def grouped_bars_md(groups: Mapping[str, Sequence[float]], labels: Sequence[str], title: str, ylabel: str) -> str:
    """One bar per label for each group, side by side (e.g. acceptance per position, trained vs untrained)."""
    fig, ax = plt.subplots(figsize=(5, 2.6))
    width = 0.8 / max(len(groups), 1)
    for g, (name, values) in enumerate(groups.items()):
        xs = [i + g * width for i in range(len(values))]
        ax.bar(xs, list(values), width=width, label=name)
    ax.set_xticks([i + 0.4 - width / 2 for i in range(len(labels))], list(labels))
    ax.set_title(title)
    ax.set_ylabel(ylabel)
    ax.set_ylim(0, 1.05)
    ax.grid(axis="y", alpha=0.3)
    ax.legend(fontsize=7)
    return _markdown_png(fig, title)


def tau_comparison_md(
    ours: Mapping[str, float | None],
    references: Mapping[str, Mapping[str, float]],
    labels: Mapping[str, str],
    title: str,
) -> str:
    """τ per benchmark: this draft in solid bars, published figures hatched and labelled as reference."""
    names = list(labels)
    groups: list[tuple[str, Mapping[str, float | None], bool]] = [("this draft", ours, False)]
    groups += [(f"{n} (reference)", v, True) for n, v in references.items()]
    fig, ax = plt.subplots(figsize=(6, 2.8))
    width = 0.8 / max(len(groups), 1)
    for g, (name, values, ref) in enumerate(groups):
        xs = [i + g * width for i, n in enumerate(names) if values.get(n) is not None]
        ys = [v for n in names if (v := values.get(n)) is not None]
        if xs:
            ax.bar(xs, ys, width=width, label=name, hatch="//" if ref else None, alpha=0.55 if ref else 1.0)
    ax.set_xticks([i + 0.4 - width / 2 for i in range(len(names))], [labels[n] for n in names])
    ax.set_title(title)
    ax.set_ylabel("τ (tokens per verification)")
    ax.grid(axis="y", alpha=0.3)
    ax.legend(fontsize=6)
    return _markdown_png(fig, title)


def plan_cost_md(costs: Mapping[str, tuple[float, float, float]], available: float, title: str) -> str:
    """Two panels: each dataset's expected dollars with its interval, and their running sum against the money
    available (the budget line). ``costs``: name → (expected, low, high), in the order they run."""
    names = list(costs)
    exp = [costs[n][0] for n in names]
    err = [[costs[n][0] - costs[n][1] for n in names], [costs[n][2] - costs[n][0] for n in names]]
    fig, (left, right) = plt.subplots(1, 2, figsize=(8, 2.8))
    left.bar(names, exp, yerr=err, capsize=3, color="#4c72b0")
    left.set_title("cost per dataset (95%)")
    left.set_ylabel("USD")
    left.grid(axis="y", alpha=0.3)
    running, hi, total, total_hi = [], [], 0.0, 0.0
    for n in names:
        total, total_hi = total + costs[n][0], total_hi + costs[n][2]
        running.append(total)
        hi.append(total_hi)
    xs = list(range(len(names)))
    right.plot(xs, running, marker="o", linewidth=1.4, label="cumulative, expected")
    right.plot(xs, hi, linestyle="--", linewidth=1.0, label="cumulative, 95% high")
    right.axhline(available, color="#c44e52", linewidth=1.4, label=f"available ${available:,.2f}")
    right.set_xticks(xs, names)
    right.set_title("cumulative against the budget")
    right.grid(alpha=0.3)
    right.legend(fontsize=7)
    fig.tight_layout()
    return _markdown_png(fig, title)


def throughput_md(
    with_draft: Mapping[str, float | None],
    without: Mapping[str, float | None],
    speedup: Mapping[str, float | None],
    title: str,
) -> str:
    """Two panels per prompt set: output tokens/s with and without the draft, and their ratio against 1×.

    A set without a figure (no baseline pass, or nothing answered) keeps its place with no bar."""
    names = list(with_draft)
    xs = list(range(len(names)))
    fig, (left, right) = plt.subplots(1, 2, figsize=(8, 2.8))
    for offset, (label, values) in ((-0.2, ("with the draft", with_draft)), (0.2, ("without", without))):
        left.bar([x + offset for x in xs], [values.get(n) or 0.0 for n in names], width=0.4, label=label)
    left.set_xticks(xs, names)
    left.set_title("output tokens/s")
    left.grid(axis="y", alpha=0.3)
    left.legend(fontsize=7)
    right.bar(xs, [speedup.get(n) or 0.0 for n in names], color="#55a868")
    right.axhline(1.0, color="#c44e52", linewidth=1.0, label="no speedup")
    right.set_xticks(xs, names)
    right.set_title("speedup (with / without)")
    right.grid(axis="y", alpha=0.3)
    right.legend(fontsize=7)
    fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    return _markdown_png(fig, title)
