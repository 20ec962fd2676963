"""Ring (isend/irecv) vs native gloo collectives: bus bandwidth and ratio, 2 and 4 ranks, 1-64 MiB.

Usage: python benchmarks/comm_bench.py [--nprocs 2,4] [--sizes 1M:64M] [--ops all_reduce,...] [--reps 3]

Method: as `trainmath comm bench` (warm-up, timed iterations, time = max over ranks), except that native and
ring runs alternate `--reps` times per size inside one job and the median of each is kept: on a shared 2-core
machine single runs vary by 2x, and alternating exposes both to the same noise.
"""

from __future__ import annotations

import argparse
import statistics

from trainmath.comm.busbw import busbw_bytes_per_s
from trainmath.comm.sizes import format_size, parse_size_range
from trainmath.runtime.bench import _make, _timed
from trainmath.runtime.launch import JobSpec, launch


def _worker(ctx, ops, sizes, reps, iters):
    import torch

    out = {}
    for op in ops:
        for size in sizes:
            times = {"native": [], "ring": []}
            fns = {impl: _make(ctx, op, impl, size, torch.float32) for impl in times}
            for _ in range(reps):
                for impl, (fn, _) in fns.items():
                    times[impl].append(_timed(ctx, fn, 2, iters))
            out[(op, size)] = {impl: statistics.median(t) for impl, t in times.items()}
            out[(op, size)]["bytes"] = fns["native"][1] * 4
    return out if ctx.rank == 0 else None


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--nprocs", default="2,4")
    p.add_argument("--sizes", default="1M:64M")
    p.add_argument("--factor", type=int, default=4)
    p.add_argument("--ops", default="all_reduce,reduce_scatter,all_gather")
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--iters", type=int, default=5)
    a = p.parse_args()
    sizes = parse_size_range(a.sizes, a.factor)
    ops = a.ops.split(",")
    print("| op | ranks | size | native busbw (GB/s) | ring busbw (GB/s) | ring / native |")
    print("|---|---|---|---|---|---|")
    for n in (int(x) for x in a.nprocs.split(",")):
        res = launch(JobSpec(nproc_per_node=n, timeout_s=120), _worker, ops, sizes, a.reps, a.iters)[0]
        for (op, size), r in res.items():
            nat = busbw_bytes_per_s(op, r["bytes"], r["native"], n)
            ring = busbw_bytes_per_s(op, r["bytes"], r["ring"], n)
            print(f"| {op} | {n} | {format_size(size)} | {nat / 1e9:.3f} | {ring / 1e9:.3f} | {ring / nat:.2f} |",
                  flush=True)


if __name__ == "__main__":
    main()
