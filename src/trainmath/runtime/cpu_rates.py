"""This machine's CPU as a serving device: its matmul FLOP/s and memory bandwidth, measured by a microbenchmark
(torch, fp32, the threads torch uses), returned as a ``GPU`` preset so ``infer.speed`` can predict for it.

- FLOP/s: the best of a few fp32 (n × n) @ (n × n) products, 2n³ FLOPs each, n = 1024;
- bandwidth: the best of a few sums over a 256 MiB fp32 tensor (a read-bound stream, bytes read / time).

The measured rates are what the machine achieves, so the efficiencies are 1 (``speed.FLOOR``).
"""

from __future__ import annotations

import time


def _best(fn, repeats: int) -> float:
    best = float("inf")
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t)
    return best


def measure(n: int = 1024, stream_bytes: int = 256 << 20, repeats: int = 10) -> tuple[float, float]:
    """(fp32 matmul FLOP/s, read bandwidth in bytes/s) of this CPU."""
    import torch

    a, b = torch.randn(n, n), torch.randn(n, n)
    a @ b  # warm-up
    flops = 2 * n**3 / _best(lambda: a @ b, repeats)
    x = torch.ones(stream_bytes // 4)
    x.sum()
    bandwidth = stream_bytes / _best(lambda: x.sum(), repeats)
    return flops, bandwidth


def measured_cpu():
    """(a ``GPU`` describing this CPU, efficiencies of 1)."""
    from trainmath.hardware import GPU
    from trainmath.infer.speed import FLOOR

    flops, bandwidth = measure()
    cpu = GPU(name="cpu (measured)", aliases=(), memory_bytes=1 << 40, memory_type="DRAM",
              bf16_flops_per_s=int(flops), fp8_flops_per_s=None, hbm_bytes_per_s=int(bandwidth),
              interconnect="none", interconnect_bidirectional_bytes_per_s=1, source="measured by a microbenchmark",
              generation="cpu", gpus_per_node=1, nvlink_generation=None, nvlink_sharp=False,
              intra_node_latency_s=0.0, nics_per_gpu=0, nic_gbps=0, inter_node_latency_s=0.0,
              topology_source="measured")
    return cpu, FLOOR
