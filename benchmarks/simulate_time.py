"""Wall time of ``trainmath memory MODEL --simulate`` on the defaults (mixed-bf16, AdamW foreach, one device), with
and without ``--simulate-layers N``: the estimate printed before starting, the simulation's own seconds, the whole
command's, and the simulated peak beside the ``--device cpu`` prediction. A model of several layer types (Gemma-2:
``google/gemma-2-9b --attention eager``, whose code has no SDPA path) folds over repeats of its type pattern; the
last column says which layers each run simulated.

    python benchmarks/simulate_time.py [MODEL] [--seq 4096] [--layers 4] [--attention eager]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time


def run(argv: list[str]) -> tuple[float, dict, str]:
    start = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "trainmath", *argv, "--json"], capture_output=True, text=True,
                          check=True)
    return time.perf_counter() - start, json.loads(done.stdout)["simulation"], done.stderr


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("model", nargs="?", default="Qwen/Qwen3-8B")
    p.add_argument("--seq", type=int, default=4096)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--attention", default="sdpa")
    a = p.parse_args()
    base = ["memory", a.model, "--micro-batch", "1", "--seq", str(a.seq), "--attention", a.attention, "--simulate"]
    print("| run | estimate (s) | simulation (s) | command wall (s) | simulated peak − buffers (B) "
          "| predicted cpu (B) | simulated |")
    print("|---|---:|---:|---:|---:|---:|---|")
    for name, extra in [("full", []), (f"--simulate-layers {a.layers}", ["--simulate-layers", str(a.layers)])]:
        wall, sim, _ = run(base + extra)
        measured = sim["peak_bytes"] - sim["buffers_bytes"]
        ran = sim["folded"] or f"all {sim['layers']} layers"
        print(f"| {name} | {sim['estimated_seconds']:.0f} | {sim['seconds']:.1f} | {wall:.1f} | {measured:,} | "
              f"{sim['predicted_cpu_peak_bytes']:,} | {ran} |", flush=True)


if __name__ == "__main__":
    main()
