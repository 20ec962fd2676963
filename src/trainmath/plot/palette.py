"""One colour per component, used by every chart (matplotlib figures, the report's and the served page's SVG).

Pure data: no matplotlib. Colours are the Okabe–Ito colour-blind-safe set plus a few neutrals, fixed per name so
that "attention" is the same blue in the parameter chart, the report and the web page. A name not listed here
gets a colour from ``EXTRA`` chosen by a stable checksum of the name (never Python's salted ``hash``).
"""

from __future__ import annotations

import zlib

COLOURS = {
    # parameters (the groups of Jiang Yi's blog series: Embedding, Attention, FFN / MoE, Others)
    "embedding": "#E69F00",
    "attention": "#0072B2",
    "ffn": "#009E73",
    "moe": "#CC79A7",
    "others": "#999999",
    # training memory per GPU
    "weights": "#0072B2",
    "gradients": "#D55E00",
    "master weights": "#56B4E9",
    "optimizer states": "#E69F00",
    "activations": "#009E73",
    "logits and loss": "#CC79A7",
    "weight copies and ZeRO-3 buffers": "#F0E442",
    "optimizer step temporaries": "#8C564B",
    "framework buffers": "#999999",
    "other": "#BBBBBB",
    # serving
    "kv cache": "#009E73",
    "workspace": "#999999",
    # step phases (timeline)
    "forward": "#0072B2",
    "loss": "#CC79A7",
    "backward": "#D55E00",
    "optimizer": "#E69F00",
    "zero_grad": "#999999",
    # collective implementations
    "native": "#0072B2",
    "ring": "#D55E00",
    "naive": "#009E73",
    # planner
    "fits": "#0072B2",
    "does not fit": "#BBBBBB",
    "winner": "#D55E00",
    "capacity": "#000000",
    # step time (planner breakdown); other names get a stable colour from EXTRA
    "compute": "#009E73",
    "pipeline_bubble": "#BBBBBB",
    "bubble": "#BBBBBB",
}
_LOWER = {k.lower(): v for k, v in COLOURS.items()}

EXTRA = ("#1F77B4", "#FF7F0E", "#2CA02C", "#D62728", "#9467BD", "#8C564B", "#E377C2", "#7F7F7F", "#BCBD22",
         "#17BECF")


def colour(name: str) -> str:
    """The colour of ``name`` (case-insensitive), the same in every chart."""
    key = name.lower()
    if key in _LOWER:
        return _LOWER[key]
    return EXTRA[zlib.crc32(key.encode()) % len(EXTRA)]


def is_light(hex_colour: str) -> bool:
    """Whether dark text reads better than light text on ``hex_colour`` (WCAG relative luminance above 0.45)."""
    r, g, b = (int(hex_colour[i:i + 2], 16) / 255 for i in (1, 3, 5))
    return 0.2126 * r + 0.7152 * g + 0.0722 * b > 0.45
