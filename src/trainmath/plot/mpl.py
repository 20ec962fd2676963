"""matplotlib drawing of ``charts`` objects: ``figure(charts)`` builds the figure (tests inspect its legends),
``save(fig, path)`` writes it whole by suffix (.png, .svg, .pdf). The only module of trainmath that imports
matplotlib; it does so on import, so import it only inside a plotting command.
"""

from __future__ import annotations

import textwrap
from pathlib import Path

from trainmath.errors import TrainmathError
from trainmath.plot.charts import BarChart, LineChart, ScatterChart
from trainmath.plot.output import write_atomic
from trainmath.plot.palette import colour, is_light

try:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FuncFormatter
except ImportError:  # pragma: no cover - the plot extra is missing
    raise TrainmathError('plotting needs matplotlib: pip install "trainmath[plot]"') from None

SUFFIXES = (".png", ".svg", ".pdf")
LABEL_MIN = 0.045
"""A segment is labelled only when it is at least this share of the axis: smaller ones have no room for text."""


CHAR_IN = 7 * 0.6 / 72
"""Width of one character of a 7 pt segment label, inches (DejaVu Sans averages 0.6 em)."""


def _ink(hex_colour: str) -> str:
    """Black or white text, whichever reads better on ``hex_colour``."""
    return "black" if is_light(hex_colour) else "white"


def size_label(n: float, _pos=None) -> str:
    """Bytes as 64K / 4M / 1G (powers of 2, as `comm bench --sizes` writes them)."""
    for div, suffix in ((2**30, "G"), (2**20, "M"), (2**10, "K")):
        if n >= div:
            return f"{n / div:g}{suffix}"
    return f"{n:g}"


def _bars(ax, c: BarChart) -> None:
    pos = list(range(len(c.bars)))
    base = [0.0] * len(c.bars)
    top = max([sum(s.values[i] for s in c.stacks) for i in pos] + [c.hline[1] if c.hline else 0.0])
    span = c.ymax or top or 1.0
    draw = ax.barh if c.horizontal else ax.bar
    bar_in = 0.7 * (_width(c) - 3.2) / max(len(c.bars), 1)  # a vertical bar's width on paper, inches
    for s in c.stacks:
        kw = {"left": base} if c.horizontal else {"bottom": base}
        draw(pos, s.values, 0.7, color=s.colour, label=s.name, edgecolor="white", linewidth=0.6, **kw)
        for i, (v, text) in enumerate(zip(s.values, s.labels)):
            if not c.horizontal and len(text) * CHAR_IN > 0.95 * bar_in:
                text = text.split(" (")[0]  # the count alone, without the share in parentheses
            if not c.horizontal and len(text) * CHAR_IN > 0.95 * bar_in:
                text = ""  # no room inside the bar: the legend and the axis tell the rest
            if text and v >= LABEL_MIN * span:
                mid = base[i] + v / 2
                xy = (mid, i) if c.horizontal else (i, mid)
                ax.text(*xy, text, ha="center", va="center", fontsize=7, color=_ink(s.colour))
        base = [b + v for b, v in zip(base, s.values)]
    for i, t in enumerate(c.totals):
        if c.horizontal:
            ax.text(base[i] + 0.01 * span, i, t, ha="left", va="center", fontsize=8)
        else:
            ax.text(i, base[i] + 0.01 * span, t, ha="center", va="bottom", fontsize=8)
    if c.hline:
        (ax.axvline if c.horizontal else ax.axhline)(c.hline[1], color=colour("capacity"), linestyle="--",
                                                    linewidth=1.2, label=c.hline[0])
    limit = (c.ymax or top) * (1.12 if not c.horizontal else 1.3)
    if c.horizontal:
        ax.set_yticks(pos, c.bars, fontsize=8)
        ax.invert_yaxis()
        ax.set_xlim(0, limit)
        ax.set_xlabel(c.ylabel)
    else:
        widest = max(len(line) for b in c.bars for line in b.split("\n"))
        per_bar_in = (_width(c) - 3.2) / len(c.bars)  # axes width (figure less legend) per bar, inches
        long = widest * 0.075 > 0.95 * per_bar_in  # ~0.075 in per character at 8 pt
        ax.set_xticks(pos, c.bars, rotation=25 if long else 0, ha="right" if long else "center", fontsize=8)
        ax.set_ylim(0, limit)
        ax.set_ylabel(c.ylabel)
    ax.spines[["top", "right"]].set_visible(False)


def _lines(ax, c: LineChart) -> None:
    seen = set()
    for x0, x1, phase in c.bands:
        ax.axvspan(x0, x1, color=colour(phase), alpha=0.12, linewidth=0, label=None if phase in seen else phase)
        seen.add(phase)
    for ln in c.lines:
        ax.plot(ln.xs, ln.ys, color=ln.colour, linestyle="--" if ln.dashed else "-", marker="o" if ln.markers else None,
                markersize=3.5, linewidth=1.4, label=ln.name)
    if c.hline:
        ax.axhline(c.hline[1], color=colour("capacity"), linestyle="--", linewidth=1.2, label=c.hline[0])
    for x, y, text in c.marks:
        ax.plot([x], [y], marker="v", color=colour("winner"), markersize=8, linestyle="none")
        ax.annotate(text, (x, y), xytext=(0, 10), textcoords="offset points", ha="center", fontsize=8)
    if c.xlog2:
        ax.set_xscale("log", base=2)
        ax.xaxis.set_major_formatter(FuncFormatter(size_label))
    if c.xticks:
        ax.set_xticks([x for x, _ in c.xticks], [t if len(t) <= 22 else t[:21] + "…" for _, t in c.xticks],
                      rotation=90, fontsize=7)  # upright boxes of slanted names would overlap
    ax.set_ylim(bottom=0, top=max([max(ln.ys) for ln in c.lines] + [c.hline[1] if c.hline else 0]) * 1.15 or 1)
    ax.set_xlabel(c.xlabel)
    ax.set_ylabel(c.ylabel)
    ax.grid(alpha=0.3)
    ax.spines[["top", "right"]].set_visible(False)


def _scatter(ax, c: ScatterChart) -> None:
    for g in reversed(c.groups):  # the winners last, on top
        ax.scatter(g.xs, g.ys, s=g.size, color=g.colour, label=g.name, edgecolor="white", linewidth=0.5,
                   zorder=3 if g.labels else 2)
        # layouts (nearly) equal in memory and step time share one label ("#1, #2"): to 0.01 s and 0.1 GiB
        at: dict[tuple, tuple[float, float, list[str]]] = {}
        for x, y, t in zip(g.xs, g.ys, g.labels):
            at.setdefault((round(x, 2), round(y, 1)), (x, y, []))[2].append(t)
        for x, y, texts in at.values():
            ax.annotate(", ".join(texts), (x, y), xytext=(5, 4), textcoords="offset points", fontsize=8)
    if c.hline:
        ax.axhline(c.hline[1], color=colour("capacity"), linestyle="--", linewidth=1.2, label=c.hline[0])
    ax.set_xlabel(c.xlabel)
    ax.set_ylabel(c.ylabel)
    ax.grid(alpha=0.3)
    ax.spines[["top", "right"]].set_visible(False)


DRAW = {BarChart: _bars, LineChart: _lines, ScatterChart: _scatter}


def _width(c) -> float:
    if isinstance(c, BarChart) and not c.horizontal:
        return min(16.0, max(6.5, 0.9 * len(c.bars) + 4.5))
    return 7.0


def figure(charts):
    """One matplotlib figure with the charts side by side, each with its title, legend (outside the axes, on
    the right) and notes (under the figure, wrapped)."""
    charts = charts if isinstance(charts, (list, tuple)) else [charts]
    widths = [_width(c) for c in charts]
    fig, axes = plt.subplots(1, len(charts), figsize=(sum(widths), 5.2), layout="constrained",
                             gridspec_kw={"width_ratios": widths}, squeeze=False)
    notes = []
    for ax, c in zip(axes[0], charts):
        DRAW[type(c)](ax, c)
        ax.set_title(c.title, fontsize=11, pad=12)  # clear of a top tick label
        handles, labels = ax.get_legend_handles_labels()
        if handles and isinstance(c, ScatterChart):
            ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.14), ncols=2, fontsize=8, frameon=False)
        elif handles:
            ax.legend(handles[::-1] if isinstance(c, BarChart) and not c.horizontal else handles,
                      labels[::-1] if isinstance(c, BarChart) and not c.horizontal else labels,
                      loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8, frameon=False)
        notes.extend(c.notes)
    if notes:
        chars = int(sum(widths) * 15)
        text = "\n".join(textwrap.fill(n, chars) for n in notes)
        fig.supxlabel(text, x=0.01, ha="left", fontsize=7, color="#444444")
    return fig


def save(fig, path: Path) -> Path:
    """Write ``fig`` to ``path`` whole (format from the suffix) and close it."""
    try:
        return write_atomic(path, lambda tmp: fig.savefig(tmp, format=path.suffix[1:].lower(), dpi=120))
    finally:
        plt.close(fig)
