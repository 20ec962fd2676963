"""How long the pictures take: `trainmath report`, the web page's /api/calc answer, and `trainmath plot`.

Method: `report` and `plot` are run as fresh processes (what a user waits for), 5 runs after 1 warm-up, median
wall time; the page's answer is `trainmath.serve.app.calc` in-process (the server adds only the HTTP round trip on
127.0.0.1), 20 calls after 2 warm-ups, median. The interesting figure is that a report or a page update needs no
matplotlib and costs about what one `trainmath memory` does. Run: `python benchmarks/viz.py`.
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import tempfile
import time

SETUPS = [
    ("Qwen/Qwen3-8B", ["--micro-batch", "1", "--seq", "4096", "--gpu", "h100"]),
    ("Qwen/Qwen3-235B-A22B", ["--micro-batch", "1", "--seq", "4096", "--dp", "64", "--ep", "8", "--zero", "3",
                              "--gpu", "h100"]),
    ("deepseek-ai/DeepSeek-V3", ["--micro-batch", "1", "--seq", "4096", "--dp", "64", "--zero", "3", "--gpu",
                                 "h200"]),
]


def median_s(fn, runs: int, warmup: int) -> float:
    times = []
    for i in range(runs + warmup):
        t = time.perf_counter()
        fn()
        if i >= warmup:
            times.append(time.perf_counter() - t)
    return statistics.median(times)


def cli(argv: list[str]) -> None:
    subprocess.run([sys.executable, "-m", "trainmath", *argv], stdout=subprocess.DEVNULL, check=True)


def main() -> None:
    from trainmath.serve.app import calc

    with tempfile.TemporaryDirectory(prefix="trainmath-viz-") as out:
        table(calc, out)


def table(calc, out: str) -> None:
    """The benchmark's table, its files written under ``out``."""
    print("| model | `trainmath report` (process) | page answer `/api/calc` (in-process) "
          "| `trainmath plot memory` (process) |")
    print("|---|---:|---:|---:|")
    for model, flags in SETUPS:
        fields = {"model": model, **{flags[i][2:]: flags[i + 1] for i in range(0, len(flags), 2)}}
        report = median_s(lambda: cli(["report", model, *flags, "-o", os.path.join(out, "r.html")]), 5, 1)
        page = median_s(lambda: calc(fields), 20, 2)
        plot = median_s(lambda: cli(["plot", "memory", model, *flags, "-o", os.path.join(out, "m.png")]), 5, 1)
        print(f"| {model} | {report * 1e3:.0f} ms | {page * 1e3:.0f} ms | {plot * 1e3:.0f} ms |")


if __name__ == "__main__":
    main()
