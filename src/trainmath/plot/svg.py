"""The stacked bar charts and line charts of ``charts`` as inline SVG, with the standard library only: the report
and the web page show the same bars, lines, colours and labels as ``trainmath plot`` without matplotlib (and
without a network: the markup is self-contained, fonts are the viewer's sans-serif).

Each bar segment carries a ``<title>`` (hover text with the exact value) and ``data-series``/``data-value``
attributes, each line point ``data-x``/``data-y`` (the value exactly, as Python's ``repr``) and ``data-label``, so
a page script or a test can read the numbers back.
"""

from __future__ import annotations

import math
import textwrap
from html import escape

from trainmath.plot.charts import BarChart, LineChart
from trainmath.plot.palette import colour, is_light

LABEL_MIN = 0.045
"""Same rule as the matplotlib figures: a segment under this share of the axis gets no text."""


def nice_ticks(top: float, n: int = 5) -> list[float]:
    """Round tick values from 0 to at least ``top`` (steps of 1, 2 or 5 × 10^k)."""
    if top <= 0:
        return [0.0, 1.0]
    raw = top / n
    mag = 10 ** math.floor(math.log10(raw))
    step = next(m * mag for m in (1, 2, 2.5, 5, 10) if m * mag >= raw)
    return [i * step for i in range(int(math.ceil(top / step)) + 1)]


def _ink(hex_colour: str) -> str:
    return "#000" if is_light(hex_colour) else "#fff"


def _fmt(v: float) -> str:
    return f"{v:g}" if abs(v) >= 1 or v == 0 else f"{v:.2g}"


def _open(c, width: int, height: int, chart_id: str) -> tuple[list[str], list[str]]:
    """The ``<svg>`` element's opening, title and heading of a chart, tall enough for its wrapped notes; returns
    (the lines so far, the note lines ``_close`` writes)."""
    note_lines = [ln for note in c.notes for ln in textwrap.wrap(note, width // 6)]
    full_h = height + 15 * len(note_lines) + (6 if note_lines else 0)
    id_attr = f' id="{escape(chart_id)}"' if chart_id else ""
    head = [f'<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {width} {full_h:.0f}" role="img" class="chart"'
            f'{id_attr} font-family="sans-serif" font-size="12">',
            f'<title>{escape(c.title)}</title>',
            f'<text x="{width / 2:.0f}" y="22" text-anchor="middle" font-size="15">{escape(c.title)}</text>']
    return head, note_lines


def _close(out: list[str], note_lines: list[str], height: int) -> str:
    """The chart's notes under its plot, and the closing tag."""
    for k, line in enumerate(note_lines):
        out.append(f'<text x="8" y="{height + 8 + 15 * k}" font-size="10.5" fill="#444">{escape(line)}</text>')
    out.append("</svg>")
    return "\n".join(out)


def bar_chart_svg(c: BarChart, *, width: int = 720, height: int = 380, chart_id: str = "") -> str:
    """One ``<svg>`` element: title, y axis with unit, stacked bars (bottom to top in ``c.stacks`` order),
    totals above the bars, the capacity line, a legend on the right and the notes underneath."""
    legend_w = 230
    n = len(c.bars)
    left, right, top = 64, width - legend_w, 44
    band = (right - left) / max(n, 1)
    names = [[w for part in name.split("\n") for w in textwrap.wrap(part, max(6, int(band / 6.4)))]
             for name in c.bars]
    bottom = height - 24 - 13 * max(len(w) for w in names)
    totals = [sum(s.values[i] for s in c.stacks) for i in range(n)]
    peak = max(totals + [c.hline[1] if c.hline else 0.0])
    ticks = nice_ticks(c.ymax or peak * 1.08)
    ymax = ticks[-1]

    def y(v: float) -> float:
        return bottom - (bottom - top) * v / ymax

    bw = min(0.62 * band, 120)
    out, note_lines = _open(c, width, height, chart_id)
    for t in ticks:
        out.append(f'<line x1="{left}" x2="{right}" y1="{y(t):.1f}" y2="{y(t):.1f}" stroke="#e4e4e4"/>'
                   f'<text x="{left - 6}" y="{y(t) + 4:.1f}" text-anchor="end" font-size="11">{_fmt(t)}</text>')
    out.append(f'<text transform="translate(16 {(top + bottom) / 2:.0f}) rotate(-90)" text-anchor="middle" '
               f'font-size="11">{escape(c.ylabel)}</text>')
    for i, name in enumerate(c.bars):
        cx, base = left + band * (i + 0.5), 0.0
        for s in c.stacks:
            v = s.values[i]
            if v <= 0:
                continue
            y0, y1 = y(base + v), y(base)
            out.append(f'<rect x="{cx - bw / 2:.1f}" y="{y0:.1f}" width="{bw:.1f}" height="{y1 - y0:.1f}" '
                       f'fill="{s.colour}" stroke="#fff" stroke-width="0.8" data-series="{escape(s.name)}" '
                       f'data-value="{v:.6g}"><title>{escape(name)} · {escape(s.name)}: {v:.4g}</title></rect>')
            text = s.labels[i]
            if len(text) * 6.2 > bw - 4:
                text = text.split(" (")[0]  # drop the share in parentheses when the count alone fits
            if text and v >= LABEL_MIN * ymax and len(text) * 6.2 <= bw - 4:
                out.append(f'<text x="{cx:.1f}" y="{(y0 + y1) / 2 + 4:.1f}" text-anchor="middle" font-size="11" '
                           f'fill="{_ink(s.colour)}">{escape(text)}</text>')
            base += v
        out.append(f'<text x="{cx:.1f}" y="{y(base) - 5:.1f}" text-anchor="middle" font-size="11" '
                   f'class="total">{escape(c.totals[i])}</text>')
        for k, line in enumerate(names[i]):
            out.append(f'<text x="{cx:.1f}" y="{bottom + 16 + 13 * k}" text-anchor="middle" font-size="11">'
                       f'{escape(line)}</text>')
    out.append(f'<line x1="{left}" x2="{right}" y1="{bottom}" y2="{bottom}" stroke="#333"/>')
    legend = [(s.name, s.colour, False) for s in reversed(c.stacks)]
    if c.hline:
        hy = y(c.hline[1])
        out.append(f'<line x1="{left}" x2="{right}" y1="{hy:.1f}" y2="{hy:.1f}" stroke="{colour("capacity")}" '
                   f'stroke-dasharray="6 4" stroke-width="1.4" class="capacity"/>')
        legend.append((c.hline[0], colour("capacity"), True))
    for k, (name, col, dashed) in enumerate(legend):
        ly = top + 18 * k
        mark = (f'<line x1="{right + 16}" x2="{right + 30}" y1="{ly + 5}" y2="{ly + 5}" stroke="{col}" '
                f'stroke-dasharray="4 3" stroke-width="1.6"/>' if dashed else
                f'<rect x="{right + 16}" y="{ly}" width="14" height="11" fill="{col}"/>')
        out.append(f'<g class="legend-item">{mark}<text x="{right + 36}" y="{ly + 10}" font-size="11">'
                   f'{escape(name)}</text></g>')
    return _close(out, note_lines, height)


def _short(text: str, n: int = 22) -> str:
    return text if len(text) <= n else text[: n - 1] + "…"


def line_chart_svg(c: LineChart, *, width: int = 720, height: int = 420, chart_id: str = "") -> str:
    """One ``<svg>`` element, as ``trainmath plot``'s line charts: shaded phase bands, each line through its points
    (a dot per point unless the line has too many), the capacity line, the marked points (the peak) with their
    text, upright x tick names, a legend on the right and the notes underneath. Linear axes (no log-2 x)."""
    legend_w = 170
    left, right, top = 64, width - legend_w, 44
    tick_h = 5.6 * min(22, max((len(t) for _, t in c.xticks), default=4))  # upright names, 10 px font
    bottom = height - 40 - tick_h
    xs = [x for ln in c.lines for x in ln.xs] + [b for band in c.bands for b in band[:2]]
    x0, x1 = min(xs), max(xs)
    x0, x1 = (x0 - 0.5, x1 + 0.5) if x0 == x1 else (x0, x1)
    peak = max([y for ln in c.lines for y in ln.ys] + [c.hline[1] if c.hline else 0.0])
    ticks = nice_ticks(peak * 1.15)
    ymax = ticks[-1] or 1.0

    def px(v: float) -> float:
        return left + (right - left) * (v - x0) / (x1 - x0)

    def py(v: float) -> float:
        return bottom - (bottom - top) * v / ymax

    out, note_lines = _open(c, width, height, chart_id)
    legend, seen = [], set()
    for b0, b1, phase in c.bands:
        out.append(f'<rect class="band" data-phase="{escape(phase)}" x="{px(b0):.1f}" y="{top}" '
                   f'width="{px(b1) - px(b0):.1f}" height="{bottom - top:.1f}" fill="{colour(phase)}" '
                   f'fill-opacity="0.12"/>')
        if phase not in seen:
            seen.add(phase)
            legend.append((phase, colour(phase), "band"))
    for t in ticks:
        out.append(f'<line x1="{left}" x2="{right}" y1="{py(t):.1f}" y2="{py(t):.1f}" stroke="#e4e4e4"/>'
                   f'<text x="{left - 6}" y="{py(t) + 4:.1f}" text-anchor="end" font-size="11">{_fmt(t)}</text>')
    out.append(f'<text transform="translate(16 {(top + bottom) / 2:.0f}) rotate(-90)" text-anchor="middle" '
               f'font-size="11">{escape(c.ylabel)}</text>')
    for ln in c.lines:
        dash = ' stroke-dasharray="6 4"' if ln.dashed else ""
        pts = " ".join(f"{px(x):.1f},{py(y):.1f}" for x, y in zip(ln.xs, ln.ys))
        out.append(f'<g class="line" data-series="{escape(ln.name)}"><polyline points="{pts}" fill="none" '
                   f'stroke="{ln.colour}" stroke-width="1.4"{dash}/>')
        r = 2.6 if ln.markers else 1.2
        for i, (x, y) in enumerate(zip(ln.xs, ln.ys)):
            label = ln.labels[i] if i < len(ln.labels) else ""
            hover = f"{label}: {y:.4g}" if label else f"{x:g}: {y:.4g}"
            out.append(f'<circle class="point" cx="{px(x):.1f}" cy="{py(y):.1f}" r="{r}" fill="{ln.colour}" '
                       f'data-x="{x!r}" data-y="{y!r}" data-label="{escape(label)}"><title>{escape(hover)}</title>'
                       f'</circle>')
        out.append("</g>")
        legend.append((ln.name, ln.colour, "dashed" if ln.dashed else "line"))
    if c.hline:
        hy = py(c.hline[1])
        out.append(f'<line x1="{left}" x2="{right}" y1="{hy:.1f}" y2="{hy:.1f}" stroke="{colour("capacity")}" '
                   f'stroke-dasharray="6 4" stroke-width="1.4" class="capacity"/>')
        legend.append((c.hline[0], colour("capacity"), "dashed"))
    for x, y, text in c.marks:
        mx, my = px(x), py(y)
        anchor = "end" if mx > (left + right) / 2 else "start"
        out.append(f'<g class="mark"><path d="M{mx - 5:.1f},{my - 12:.1f} h10 l-5,8 z" fill="{colour("winner")}"/>'
                   f'<text x="{mx:.1f}" y="{my - 16:.1f}" text-anchor="{anchor}" font-size="11">{escape(text)}'
                   f'</text></g>')
    for x, text in c.xticks:
        tx = px(x)
        out.append(f'<text transform="translate({tx + 4:.1f} {bottom + 6:.1f}) rotate(-90)" text-anchor="end" '
                   f'font-size="10" class="xtick">{escape(_short(text))}</text>')
    out.append(f'<line x1="{left}" x2="{right}" y1="{bottom:.1f}" y2="{bottom:.1f}" stroke="#333"/>'
               f'<text x="{(left + right) / 2:.0f}" y="{bottom + tick_h + 26:.0f}" text-anchor="middle" font-size="11">'
               f'{escape(c.xlabel)}</text>')
    for k, (name, col, kind) in enumerate(legend):
        ly = top + 18 * k
        mark = {"band": f'<rect x="{right + 16}" y="{ly}" width="14" height="11" fill="{col}" fill-opacity="0.3"/>',
                "line": f'<line x1="{right + 16}" x2="{right + 30}" y1="{ly + 5}" y2="{ly + 5}" stroke="{col}" '
                        f'stroke-width="1.6"/>',
                "dashed": f'<line x1="{right + 16}" x2="{right + 30}" y1="{ly + 5}" y2="{ly + 5}" stroke="{col}" '
                          f'stroke-dasharray="4 3" stroke-width="1.6"/>'}[kind]
        out.append(f'<g class="legend-item">{mark}<text x="{right + 36}" y="{ly + 10}" font-size="11">'
                   f'{escape(name)}</text></g>')
    return _close(out, note_lines, height)


def chart_svg(c, *, chart_id: str = "") -> str:
    """The SVG of a bar chart or a line chart."""
    if isinstance(c, LineChart):
        return line_chart_svg(c, chart_id=chart_id)
    return bar_chart_svg(c, chart_id=chart_id)
