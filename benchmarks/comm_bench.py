"""Ring (isend/irecv) vs native gloo collectives: bus bandwidth and ratio, 2 and 4 ranks, 1-64 MiB.

Usage: python benchmarks/comm_bench.py [--nprocs 2,4] [--sizes 1M:64M] [--factor 2] [--ops all_reduce,...]
                                       [--rounds 6] [--iters 40] [--warmup 5] [--jobs 1]

Method: each timed run is `trainmath comm bench`'s (barrier, `--warmup` untimed iterations, `--iters` timed
iterations, time = max over ranks). Per size, native and ring take turns in `--rounds` rounds inside one job,
in the order native-ring, ring-native, native-ring, ... so that neither always runs first, and both meet the
same machine noise (single runs on a shared 2-core VM vary by 2x). `--jobs J` repeats the whole job J times
with fresh processes, because a job keeps its state (where the kernel put each rank's threads) for its whole
life and the ratio at 2 ranks and 1-4 MiB moved between 0.7 and 1.5 from one job to the next. A figure is the
mean over every timed iteration of every round of every job (total bytes / total time, as nccl-tests averages
its iterations); the last column gives the lowest and highest ring/native ratio of a single round.
"""

from __future__ import annotations

import argparse

from trainmath.comm.busbw import busbw_bytes_per_s
from trainmath.comm.sizes import format_size, parse_size_range
from trainmath.runtime.bench import _make, _timed
from trainmath.runtime.launch import JobSpec, launch

IMPLS = ("native", "ring")


def _worker(ctx, ops, sizes, rounds, warmup, iters):
    import torch

    out = {}
    for op in ops:
        for size in sizes:
            fns = {impl: _make(ctx, op, impl, size, torch.float32) for impl in IMPLS}
            times = {impl: [] for impl in IMPLS}
            for i in range(rounds):
                for impl in IMPLS if i % 2 == 0 else IMPLS[::-1]:
                    times[impl].append(_timed(ctx, fns[impl][0], warmup, iters))
            out[(op, size)] = {"bytes": fns["native"][1] * 4, **times}
    return out if ctx.rank == 0 else None


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--nprocs", default="2,4")
    p.add_argument("--sizes", default="1M:64M")
    p.add_argument("--factor", type=int, default=2)
    p.add_argument("--ops", default="all_reduce,reduce_scatter,all_gather")
    p.add_argument("--rounds", type=int, default=6)
    p.add_argument("--iters", type=int, default=40)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--jobs", type=int, default=1)
    a = p.parse_args()
    sizes = parse_size_range(a.sizes, a.factor)
    ops = a.ops.split(",")
    print("| op | ranks | size | native busbw (GB/s) | ring busbw (GB/s) | ring / native | one round: min–max |")
    print("|---|---|---|---|---|---|---|")
    for n in (int(x) for x in a.nprocs.split(",")):
        res: dict = {}
        for _ in range(a.jobs):
            for key, r in launch(JobSpec(nproc_per_node=n, timeout_s=900), _worker, ops, sizes, a.rounds, a.warmup,
                                 a.iters)[0].items():
                acc = res.setdefault(key, {"bytes": r["bytes"], "native": [], "ring": []})
                acc["native"] += r["native"]
                acc["ring"] += r["ring"]
        for (op, size), r in res.items():
            nat = busbw_bytes_per_s(op, r["bytes"], sum(r["native"]) / len(r["native"]), n)
            ring = busbw_bytes_per_s(op, r["bytes"], sum(r["ring"]) / len(r["ring"]), n)
            per_round = [t_nat / t_ring for t_nat, t_ring in zip(r["native"], r["ring"])]
            print(f"| {op} | {n} | {format_size(size)} | {nat / 1e9:.3f} | {ring / 1e9:.3f} | {ring / nat:.2f} "
                  f"| {min(per_round):.2f}–{max(per_round):.2f} |", flush=True)


if __name__ == "__main__":
    main()
