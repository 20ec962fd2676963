"""Plain-text rendering for people: aligned tables and human units.

Written by hand on purpose: importing rich costs ~30 ms, twice Python's own start-up, and the calculator's CLI
must start in a few tens of milliseconds. Units are named in full: B/M/K for counts (1e9/1e6/1e3), GiB (2**30)
and GB (1e9) for bytes, never the ambiguous "MB".
"""

from __future__ import annotations


def human_count(n: int) -> str:
    """1234567890 → '1.23B'; counts use powers of 1000 (a model's '32B' is 32e9 parameters)."""
    for div, suffix in ((10**12, "T"), (10**9, "B"), (10**6, "M"), (10**3, "K")):
        if abs(n) >= div:
            return f"{n / div:.2f}{suffix}"
    return str(n)


FLOP_PREFIXES = ((1e24, "Y"), (1e21, "Z"), (1e18, "E"), (1e15, "P"), (1e12, "T"), (1e9, "G"), (1e6, "M"),
                 (1e3, "K"))
"""SI prefixes for FLOP counts, largest first (a training run's 2e23 FLOPs reads 200 ZFLOP, not 200,000 EFLOP)."""


def human_flops(n: float) -> str:
    """FLOPs with the largest SI prefix that leaves at least 1 (1.84e15 → '1.84 PFLOP'); past Y (1e24) the count
    is written as a power of ten (3.10e+26 FLOP)."""
    if abs(n) >= 1e27:
        return f"{n:.2e} FLOP"
    for div, prefix in FLOP_PREFIXES:
        if abs(n) >= div:
            return f"{n / div:.2f} {prefix}FLOP"
    return f"{n:.0f} FLOP"


def human_bytes(n: int | float, unit: str = "GiB") -> str:
    """Bytes in GiB (2**30, default) or GB (1e9)."""
    div = {"GiB": 2**30, "MiB": 2**20, "GB": 1e9, "MB": 1e6}[unit]
    return f"{n / div:,.2f} {unit}"


def table(headers: list[str], rows: list[list[object]], *, align: str | None = None, indent: str = "") -> str:
    """An aligned text table. ``align`` has one letter per column: 'l' or 'r' (default: first left, rest right)."""
    cells = [[str(c) for c in r] for r in rows]
    widths = [max(len(h), *(len(r[i]) for r in cells)) if cells else len(h) for i, h in enumerate(headers)]
    align = align or "l" + "r" * (len(headers) - 1)

    def fmt(row: list[str]) -> str:
        cells = (c.ljust(w) if a == "l" else c.rjust(w) for c, w, a in zip(row, widths, align))
        return indent + "  ".join(cells).rstrip()

    rule = indent + "  ".join("─" * w for w in widths)
    return "\n".join([fmt(headers), rule, *(fmt(r) for r in cells)])


def context_text(f) -> str:
    """The largest context at the batch, capped at the model's max_position_embeddings, with what the memory
    alone would hold when that is more."""
    if f.max_context is not None and f.max_context <= f.max_position_embeddings:
        return f"{f.max_context:,}"
    held = "any context (no layer's cache grows with it)" if f.max_context is None else f"{f.max_context:,}"
    return (f"{f.usable_context:,}, the config's max_position_embeddings (the memory alone would hold {held}; "
            f"going past it needs a rope scaling the config does not state)")
