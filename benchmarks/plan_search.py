"""How long `trainmath plan` searches: Llama-3.1-70B (and others) on up to 4096 GPUs, cold caches each time.

Prints candidates, memory-model calls, the whole search's wall time and CPU time of this process (medians of
--repeat runs, the spec loaded afresh each time so no cache carries over; on a shared machine the CPU time is
the figure to read) and the wall time spent inside the memory model.

    python benchmarks/plan_search.py [--repeat 3]
"""

from __future__ import annotations

import argparse
import statistics
import time

import trainmath.plan.search as search
from trainmath.hardware import gpu
from trainmath.perf import Job
from trainmath.sources import load_spec

CASES = [  # model, GPUs, GPU, seq, global batch
    ("meta-llama/Llama-3.1-70B", 4096, "h100", 8192, 2048),
    ("meta-llama/Llama-3.1-70B", 64, "h100", 4096, 256),
    ("Qwen/Qwen3-32B", 512, "h100", 4096, 1024),
    ("Qwen/Qwen3-30B-A3B", 256, "h100", 4096, 1024),
    ("meta-llama/Llama-3.1-405B", 16384, "h100", 8192, 2048),
]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    real_peak = search._peak
    print(f"{'model':28s} {'GPUs':>6s} {'candidates':>10s} {'memory calls':>12s} {'wall s':>7s} {'CPU s':>6s} "
          f"{'in memory model s':>17s}  best layout")
    for model, n, name, seq, batch in CASES:
        walls, cpus, mems = [], [], []
        for _ in range(args.repeat):
            spec = load_spec(model)  # a new spec: the planner's caches start empty
            spent = [0.0]

            def timed(*a, **k):
                t = time.perf_counter()
                try:
                    return real_peak(*a, **k)
                finally:
                    spent[0] += time.perf_counter() - t

            search._peak = timed
            t0, c0 = time.perf_counter(), time.process_time()
            result = search.plan(spec, gpus=n, gpu=gpu(name), job=Job(global_batch=batch, seq=seq))
            walls.append(time.perf_counter() - t0)
            cpus.append(time.process_time() - c0)
            mems.append(spent[0])
            search._peak = real_peak
        best = result.layouts[0] if result.layouts else None
        desc = (f"{best.layout.describe()} mb={best.job.micro_batch} v={best.job.virtual_stages} "
                f"{best.job.recompute}: {best.step_time_s:.2f} s, MFU {100 * best.mfu:.1f}%") if best else "none fits"
        print(f"{model.split('/')[-1]:28s} {n:6d} {result.candidates:10,d} {result.memory_checks:12d} "
              f"{statistics.median(walls):7.3f} {statistics.median(cpus):6.3f} {statistics.median(mems):17.3f}  {desc}")


if __name__ == "__main__":
    main()
