"""Cold wall time of `trainmath params Qwen/Qwen3-32B` against bare `python -c pass`.

Method: each command is run 21 times as a fresh process (the first 3 are discarded as warm-up of the OS file
cache; bytecode is already compiled at install); the median wall time is reported. Target (issue 2): under 3×
bare start-up. Run: `python benchmarks/cli_startup.py` (with bytecode compiled, as a pip install leaves it: where
PYTHONDONTWRITEBYTECODE is set, run `python -m compileall src` first or every run recompiles the package).
The "stdlib floor" row is what the CLI's own libraries cost before any trainmath code runs (argparse for the
CLI, dataclasses for the frozen specs, json for configs).
"""

from __future__ import annotations

import shutil
import statistics
import subprocess
import sys
import time


def median_s(cmd: list[str], runs: int = 21, warmup: int = 3) -> float:
    times = []
    for i in range(runs + warmup):
        t = time.perf_counter()
        subprocess.run(cmd, stdout=subprocess.DEVNULL, check=True)
        if i >= warmup:
            times.append(time.perf_counter() - t)
    return statistics.median(times)


def main() -> None:
    exe = shutil.which("trainmath")
    cli = [exe] if exe else [sys.executable, "-m", "trainmath"]
    bare = median_s([sys.executable, "-c", "pass"])
    floor = "import argparse, dataclasses, json, os; argparse.ArgumentParser().add_argument('x')"
    rows = [
        ("python -c pass", bare),
        ("stdlib floor: argparse + dataclasses + json", median_s([sys.executable, "-c", floor])),
        ("trainmath params Qwen/Qwen3-32B", median_s(cli + ["params", "Qwen/Qwen3-32B"])),
        ("trainmath params Qwen/Qwen3-32B --json", median_s(cli + ["params", "Qwen/Qwen3-32B", "--json"])),
        ("trainmath params Qwen/Qwen3-235B-A22B", median_s(cli + ["params", "Qwen/Qwen3-235B-A22B"])),
    ]
    print(f"python {sys.version.split()[0]}, median of 21 cold process starts")
    print(f"{'command':<42} {'wall (ms)':>10} {'× bare':>8}")
    for name, t in rows:
        print(f"{name:<42} {t * 1000:>10.1f} {t / bare:>8.2f}")


if __name__ == "__main__":
    main()
