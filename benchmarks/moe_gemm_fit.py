"""Fit the grouped GEMM's token half-point (``trainmath.perf.moe.GROUPED_GEMM_HALF_TOKENS``) to DeepGEMM's
published M-grouped GEMM table, and print each figure beside the curve.

    python benchmarks/moe_gemm_fit.py

Per (n, k) shape, the published TFLOPS are divided by that shape's largest-m figure (so the shape's own plateau,
which the token curve does not model, cancels); the model's ratio is grouped_efficiency(m) /
grouped_efficiency(m_max). The half-point is chosen on a grid (16–512 by 16) to minimise the sum of squared
relative errors.
"""

from __future__ import annotations

import json
import pathlib

from trainmath.perf import moe

DATA = json.loads((pathlib.Path(__file__).resolve().parents[1] / "tests" / "perf"
                   / "published_grouped_gemm.json").read_text())
GRID = range(16, 513, 16)


def ratios() -> list[tuple[dict, float, int]]:
    """(point, published TFLOPS / its shape's largest-m TFLOPS, that largest m)."""
    out = []
    for p in DATA["points"]:
        same = [q for q in DATA["points"] if (q["n"], q["k"]) == (p["n"], p["k"])]
        top = max(same, key=lambda q: q["m"])
        out.append((p, p["tflops"] / top["tflops"], top["m"]))
    return out


def model_ratio(m: float, m_max: float, half: float) -> float:
    return (m / (m + half)) / (m_max / (m_max + half))


def fit() -> int:
    rs = ratios()
    return min(GRID, key=lambda h: (sum((model_ratio(p["m"], top, h) / r - 1) ** 2 for p, r, top in rs), h))


def main() -> None:
    half = fit()
    print(f"fitted half-point: {half} tokens per expert (in the code: {moe.GROUPED_GEMM_HALF_TOKENS})")
    print(f"{'layout':10s} {'groups':>6s} {'m':>5s} {'n':>5s} {'k':>5s} {'TFLOPS':>6s} {'published':>9s} "
          f"{'model':>6s} {'ratio':>6s}")
    for p, r, top in ratios():
        mr = model_ratio(p["m"], top, moe.GROUPED_GEMM_HALF_TOKENS)
        print(f"{p['layout']:10s} {p['groups']:6d} {p['m']:5d} {p['n']:5d} {p['k']:5d} {p['tflops']:6d} "
              f"{r:9.3f} {mr:6.3f} {mr / r:6.3f}")
    print("published / model = efficiency relative to the shape's largest m; source: " + DATA["source"][:90] + "...")


if __name__ == "__main__":
    main()
