"""The α–β–γ model against `trainmath comm bench` on this machine: predicted / measured per size, with the link
calibrated three ways in the same run, for 2 and 4 gloo ranks on one node (loopback).

Usage: python benchmarks/comm_model.py [--nprocs 2,4] [--sizes 64K:16M] [--ops all_reduce,all_gather,reduce_scatter]
                                       [--rounds 3] [--iters 10] [--warmup 3]

Columns (each a ratio predicted / measured, 1.00 = exact):
- p2p: the link `comm bench` calibrates from a point-to-point ring exchange (α, β) and an add (γ) — as before;
- fit all: α, β fitted to this op's own times at every size (trainmath.comm.calibrate, least squares on the
  relative error; γ from the add) — in-sample;
- fit ends: α, β fitted to the smallest and largest size only; every other size is out-of-sample.
A measured time is the median of `--rounds` runs of `comm bench`'s timing (barrier, warm-up, timed iterations,
max over ranks).
"""

from __future__ import annotations

import argparse
import statistics

from trainmath.comm.calibrate import fit_collective_link, ratios
from trainmath.comm.cost import predict_time_s
from trainmath.comm.sizes import format_size, parse_size_range
from trainmath.runtime.bench import _make, _timed, calibrate
from trainmath.runtime.launch import JobSpec, launch


def _worker(ctx, ops, sizes, rounds, warmup, iters):
    import torch

    link = calibrate(ctx, torch.float32)
    out = {}
    for op in ops:
        for size in sizes:
            fn, count = _make(ctx, op, "native", size, torch.float32)
            out[(op, count * 4)] = statistics.median(_timed(ctx, fn, warmup, iters) for _ in range(rounds))
    return (link, out) if ctx.rank == 0 else None


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--nprocs", default="2,4")
    p.add_argument("--sizes", default="64K:16M")
    p.add_argument("--ops", default="all_reduce,all_gather,reduce_scatter")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--iters", type=int, default=10)
    p.add_argument("--warmup", type=int, default=3)
    a = p.parse_args()
    sizes = parse_size_range(a.sizes, 2)
    ops = a.ops.split(",")
    print("| op | ranks | size | measured (µs) | p2p | fit all | fit ends |")
    print("|---|---|---|---|---|---|---|")
    summary = []
    for n in (int(x) for x in a.nprocs.split(",")):
        link, times = launch(JobSpec(nproc_per_node=n, timeout_s=900), _worker, ops, sizes, a.rounds, a.warmup,
                             a.iters)[0]
        for op in ops:
            pts = sorted((s, t) for (o, s), t in times.items() if o == op)
            fit_all = fit_collective_link(op, "native", n, pts, reduce_bytes_per_s=link.reduce_bytes_per_s)
            fit_ends = fit_collective_link(op, "native", n, [pts[0], pts[-1]],
                                           reduce_bytes_per_s=link.reduce_bytes_per_s)
            cols = [[predict_time_s(op, "native", s, n, link, "gloo") / t for s, t in pts],
                    ratios(op, "native", n, pts, fit_all), ratios(op, "native", n, pts, fit_ends)]
            for i, (s, t) in enumerate(pts):
                print(f"| {op} | {n} | {format_size(s)} | {t * 1e6:.0f} | {cols[0][i]:.2f} | {cols[1][i]:.2f} "
                      f"| {cols[2][i]:.2f} |", flush=True)
            inner = cols[2][1:-1]
            summary.append(f"| {op} | {n} | α {fit_all.alpha_s * 1e6:.0f} µs, {fit_all.bandwidth_bytes_per_s / 1e9:.2f}"
                           f" GB/s | {min(cols[0]):.2f}–{max(cols[0]):.2f} | {min(cols[1]):.2f}–{max(cols[1]):.2f} "
                           f"| {min(inner):.2f}–{max(inner):.2f} |")
    print("\n| op | ranks | fitted link (all sizes) | p2p: min–max | fit all: min–max "
          "| fit ends, inner sizes: min–max |")
    print("|---|---|---|---|---|---|")
    print("\n".join(summary))


if __name__ == "__main__":
    main()
