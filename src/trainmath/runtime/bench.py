"""An nccl-tests-style benchmark of native, ring and naive collectives, with the cost model's prediction beside it.

Method (mirrors nccl-tests ``common.cu`` and stas00's ``all_reduce_bench.py``):

1. Buffers are allocated and filled once per size, outside the timed region. The size column is the whole
   buffer as in nccl-tests (all-gather: the gathered output; reduce-scatter: the full input); the element count
   is rounded down to a multiple of the rank count where the op splits the buffer.
2. A barrier, then ``warmup`` untimed iterations (and a device synchronise under NCCL). Warm-up comes after
   the barrier, not before as in nccl-tests: on CPU ranks gloo's barrier runs on its worker thread, and the
   thread hand-offs it causes left a p2p ring's next few iterations up to 1.6x slower on a 2-core machine; the
   warm-up collectives themselves line the ranks up again.
3. ``iters`` iterations timed together with ``time.perf_counter`` (synchronising the device before reading the
   clock); a rank's time is the total divided by ``iters``.
4. Ranks agree on one time: the maximum over ranks (``all_reduce`` MAX), the slowest rank being when the
   collective is done. (nccl-tests averages over ranks by default, ``-a 1``; on one host the two differ little.)
5. ``algbw = size / time``; ``busbw = algbw · factor`` with nccl-tests' factors (``trainmath.comm.busbw``).

Prediction: the α–β–γ model of :mod:`trainmath.comm.cost` with α and β fitted to a ring exchange (every rank
sends to rank+1 while receiving from rank-1, the step every ring algorithm repeats) timed in the same run, and
γ to an in-place add timed on every rank at once, unless the caller gives a link. Values grow by a factor n
per all-reduce iteration; they stay finite for n^(warmup+iters) < 3e38 in float32.
"""

from __future__ import annotations

import time
from typing import Any, Callable

import torch
import torch.distributed as dist

from trainmath.comm.busbw import algbw_bytes_per_s, busbw_bytes_per_s
from trainmath.comm.cost import Link, fit_link, predict_time_s
from trainmath.errors import TrainmathError
from trainmath.runtime.launch import RankContext
from trainmath.runtime.ring import RING_IMPLS, SEGMENT_BYTES

DTYPES = {"float32": torch.float32, "float64": torch.float64, "bfloat16": torch.bfloat16, "float16": torch.float16,
          "int32": torch.int32, "int64": torch.int64}
BENCH_OPS = ("all_reduce", "reduce_scatter", "all_gather", "broadcast", "reduce", "all_to_all", "send_recv")
IMPLS = ("native", "ring", "naive")

# Sizes (bytes) of the calibration exchange: one small for α, two large for β.
_CALIBRATION_SIZES = (4096, 1 << 20, 4 << 20)


def supported(op: str, impl: str) -> bool:
    return impl == "native" and op in BENCH_OPS or (op, impl) in RING_IMPLS


def _sync(ctx: RankContext) -> None:
    if ctx.backend == "nccl":
        torch.cuda.synchronize()


def _make(ctx: RankContext, op: str, impl: str, size_bytes: int, dtype: torch.dtype,
          segment_bytes: int = SEGMENT_BYTES) -> tuple[Callable[[], Any], int]:
    """A closure running one iteration of ``op`` on preallocated buffers, and the element count.
    ``segment_bytes``: the ring's segment size (ring impl only)."""
    g, n, r = ctx.group, ctx.world_size, ctx.rank
    esize = torch.tensor([], dtype=dtype).element_size()
    count = size_bytes // esize
    if op in ("reduce_scatter", "all_gather", "all_to_all"):
        count = count // n * n
    if count == 0:
        raise TrainmathError(f"size {size_bytes} B is too small for {op} of {dtype} on {n} ranks")
    dev = ctx.device
    if dtype.is_floating_point:
        full = torch.rand(count, device=dev).to(dtype)
    else:
        full = torch.ones(count, dtype=dtype, device=dev)
    part = full[: count // n].clone() if op in ("reduce_scatter", "all_gather") else None
    if impl == "native":
        calls = {
            "all_reduce": lambda: dist.all_reduce(full, group=g),
            "reduce_scatter": lambda: dist.reduce_scatter_tensor(part, full, group=g),
            "all_gather": lambda: dist.all_gather_into_tensor(full, part, group=g),
            "broadcast": lambda: dist.broadcast(full, src=dist.get_global_rank(g, 0), group=g),
            "reduce": lambda: dist.reduce(full, dst=dist.get_global_rank(g, 0), group=g),
            "all_to_all": lambda: dist.all_to_all_single(part_out, full, group=g),
            "send_recv": lambda: _exchange(full, part_out, g, n, r),
        }
        part_out = torch.empty_like(full)
        return calls[op], count
    fn = RING_IMPLS[(op, impl)]
    seg = {"segment_bytes": segment_bytes} if impl == "ring" else {}
    if op == "all_reduce":
        return (lambda: fn(full, g, **seg)), count
    if op == "reduce_scatter":
        return (lambda: fn(part, full, g, **seg)), count
    return (lambda: fn(full, part, g, **seg)), count  # all_gather


def _exchange(send: torch.Tensor, recv: torch.Tensor, group, n: int, r: int) -> None:
    """nccl-tests' sendrecv: send to rank+1 while receiving from rank-1."""
    if n == 1:
        recv.copy_(send)
        return
    reqs = [dist.irecv(recv, src=dist.get_global_rank(group, (r - 1) % n), group=group),
            dist.isend(send, dst=dist.get_global_rank(group, (r + 1) % n), group=group)]
    for q in reqs:
        q.wait()


def _timed(ctx: RankContext, fn: Callable[[], Any], warmup: int, iters: int) -> float:
    """Seconds per iteration, the maximum over ranks."""
    _sync(ctx)
    dist.barrier(group=ctx.group)
    for _ in range(warmup):  # after the barrier: its own thread hand-offs leave the CPU ranks cold again
        fn()
    _sync(ctx)
    t0 = time.perf_counter()
    for _ in range(iters):
        fn()
    _sync(ctx)
    elapsed = torch.tensor([(time.perf_counter() - t0) / iters], dtype=torch.float64, device=ctx.device)
    dist.all_reduce(elapsed, op=dist.ReduceOp.MAX, group=ctx.group)
    return float(elapsed.item())


def calibrate(ctx: RankContext, dtype: torch.dtype, iters: int = 5) -> Link:
    """Fit α, β to a timed ring exchange and γ to a timed in-place add, on every rank at once."""
    points = []
    for size in _CALIBRATION_SIZES:
        fn, _ = _make(ctx, "send_recv", "native", size, torch.uint8)
        points.append((size, _timed(ctx, fn, 2, iters)))
    a = torch.rand((4 << 20) // torch.tensor([], dtype=dtype).element_size(), device=ctx.device).to(dtype)
    b = a.clone()
    t = _timed(ctx, lambda: a.add_(b), 2, iters)
    try:
        return fit_link(points, reduce_bytes_per_s=a.numel() * a.element_size() / t)
    except TrainmathError:  # times too noisy to fit a line: fall back to the largest point alone
        size, secs = points[-1]
        return Link(alpha_s=0.0, bandwidth_bytes_per_s=size / secs, reduce_bytes_per_s=a.numel() * a.element_size() / t)


def run_bench(ctx: RankContext, cfg: dict) -> dict | None:
    """Worker entry. ``cfg``: op, impl, sizes (bytes), dtype, warmup, iters, link (dict or None), and optionally
    segment_bytes (ring impl).

    Returns (on global rank 0 only) ``{"link": {...}, "calibrated": bool, "rows": [...]}``.
    """
    op, impl, dtype = cfg["op"], cfg["impl"], DTYPES[cfg["dtype"]]
    n = ctx.world_size
    if cfg.get("link"):
        link, calibrated = Link(**cfg["link"]), False
    elif n > 1:
        link, calibrated = calibrate(ctx, dtype), True
    else:
        link, calibrated = Link(alpha_s=0.0, bandwidth_bytes_per_s=1.0), False  # n = 1: the model says 0 s
    rows = []
    segment = cfg.get("segment_bytes") or SEGMENT_BYTES
    for size in cfg["sizes"]:
        fn, count = _make(ctx, op, impl, size, dtype, segment)
        actual_bytes = count * torch.tensor([], dtype=dtype).element_size()
        t = _timed(ctx, fn, cfg["warmup"], cfg["iters"])
        rows.append({
            "op": op, "impl": impl, "nproc": n, "backend": ctx.backend, "dtype": cfg["dtype"],
            "size_bytes": actual_bytes, "count": count, "time_s": t,
            "algbw_bytes_per_s": algbw_bytes_per_s(actual_bytes, t),
            "busbw_bytes_per_s": busbw_bytes_per_s(op, actual_bytes, t, n),
            "predicted_time_s": predict_time_s(op, impl, actual_bytes, n, link, ctx.backend),
            **({"segment_bytes": segment} if impl == "ring" else {}),
        })
    if ctx.rank != 0:
        return None
    return {"link": {"alpha_s": link.alpha_s, "bandwidth_bytes_per_s": link.bandwidth_bytes_per_s,
                     "reduce_bytes_per_s": link.reduce_bytes_per_s}, "calibrated": calibrated, "rows": rows}
