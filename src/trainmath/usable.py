"""The one fit rule every command applies: what of a GPU's memory a job may use, and what counts against it.

A job fits a GPU when

    peak_bytes + CUDA_CONTEXT_BYTES <= memory_bytes · mem_util_percent / 100

- ``peak_bytes``: what ``torch.cuda.max_memory_allocated`` reports for the job (training: the largest event of
  the step's timeline; serving: weights + KV cache + the prefill's transient), every tensor rounded up to the
  caching allocator's 512-byte blocks: the fragmentation modelled.
- ``CUDA_CONTEXT_BYTES``: the CUDA context (driver, loaded kernels), outside the allocator: 300 MiB, the size
  PyTorch's maintainers give for it with CUDA ≥ 11.7's lazy module loading ("the currently used ~300MB",
  pytorch/pytorch#107667, ptrblck, 2023-08-28; "MB" read as MiB); NCCL's buffers are not counted.
- ``mem_util_percent`` (``--mem-util``, default ``MEM_UTIL_PERCENT``): the share of the datasheet memory the job
  may take; the rest is headroom for what is not modelled: the allocator's cached-free segments (fragmentation
  beyond block rounding), NCCL and cuBLAS workspaces. vLLM's ``gpu_memory_utilization`` has the same meaning
  (its default is 0.9: pass ``--mem-util 90`` to match it).
"""

from __future__ import annotations

from trainmath.errors import TrainmathError

MEM_UTIL_PERCENT = 95
"""The default ``--mem-util`` of memory, estimate, plan, infer, report and the web page."""
CUDA_CONTEXT_BYTES = 300 * 2**20
"""The CUDA context a process holds outside the allocator (module docstring: source)."""


def check_mem_util(percent) -> None:
    """One ``TrainmathError`` unless ``percent`` is an integer in 1..100."""
    if isinstance(percent, bool) or not isinstance(percent, int) or not 1 <= percent <= 100:
        raise TrainmathError(f"--mem-util must be an integer percentage in 1..100, got {percent!r}")


def usable_bytes(memory_bytes: int, mem_util_percent: int = MEM_UTIL_PERCENT) -> int:
    """What the allocator's peak may reach: memory · mem_util / 100 (floored) less the CUDA context."""
    check_mem_util(mem_util_percent)
    return memory_bytes * mem_util_percent // 100 - CUDA_CONTEXT_BYTES


def rule_text(memory_bytes: int, mem_util_percent: int = MEM_UTIL_PERCENT) -> str:
    """The rule as printed beside every verdict."""
    return (f"fit rule: peak_bytes (torch.cuda.max_memory_allocated, 512-byte blocks) + {CUDA_CONTEXT_BYTES // 2**20}"
            f" MiB CUDA context <= {mem_util_percent}% (--mem-util) of {memory_bytes / 2**30:.2f} GiB: peak_bytes "
            f"<= {usable_bytes(memory_bytes, mem_util_percent):,} bytes")
