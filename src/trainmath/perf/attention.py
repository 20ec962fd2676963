"""Which flash-attention kernel a run executes, and the share of the tensor-core peak it reaches.

A flash kernel's speed depends on whether it is written for the GPU's generation. On Hopper, FlashAttention-2
(Dao 2023; the ``flash-attn`` 2.x package, and PyTorch's ``scaled_dot_product_attention`` flash backend) uses
none of the chip's asynchronous features (wgmma, TMA): "FlashAttention-2 achieving only 35% utilization on the
H100 GPU", while kernels written for Hopper (FlashAttention-3, cuDNN's fused attention that Transformer Engine
calls) reach "up to 740 TFLOPs/s (75% utilization)" forward (Shah et al. 2024, FlashAttention-3,
arXiv:2407.08608, Abstract). So the step-time model keeps one attention share per kernel per GPU generation:

- ``native``: the generation's own (``gpus.json`` ``attention_peak_fraction``, fitted by plan_calibrate.py with the
  GEMM curve: on Hopper to Dubey et al. 2024's runs, Meta's own stack; on Ampere FlashAttention-2, native there);
- ``te``: Transformer Engine's ``DotProductAttention`` as Megatron-Core (``--transformer-impl transformer_engine``,
  its default), NeMo and Megatron-Bridge run it, cuDNN's fused attention or TE's flash backend as TE selects:
  ``TE_PEAK_FRACTION`` where fitted (Hopper), elsewhere ``native``;
- ``fa2``: FlashAttention-2 on a generation it was not written for: ``FA2_PEAK_FRACTION`` where fitted (Hopper);
  elsewhere ``native``.

Both shares are achieved ones over a training step, forward and backward together (the backward's 2.5× FLOPs at
the same share), causal blocks skipped; they are fitted per generation by ``benchmarks/attention_fit.py`` on the
published runs whose predicted step is at least ``FIT_SHARE`` attention (long sequences), never per run.
"""

from __future__ import annotations

from dataclasses import replace

from trainmath.hardware import Efficiency

KERNELS = ("native", "te", "fa2")

FA2_PEAK_FRACTION: dict[str, float] = {"hopper": 0.18}
"""Per GPU generation: FlashAttention-2's achieved share of the dense BF16 peak (forward and backward), fitted by
``benchmarks/attention_fit.py`` on the attention-dominated FlashAttention-2 runs of tests/perf/
published_runs_more.json (LLM Foundry's flash-attn 2 and torchtitan's SDPA at 16K-262K tokens)."""

TE_PEAK_FRACTION: dict[str, float] = {"hopper": 0.32}
"""Per GPU generation: Transformer Engine attention's achieved share of the dense BF16 peak (forward and backward),
fitted by ``benchmarks/attention_fit.py`` on the attention-dominated Transformer Engine runs of
tests/perf/published_runs_more.json (NeMo's long-sequence Llama 2 7B table, 32K-1M tokens)."""

FIT_SHARE = 0.5
"""A run enters the attention fit when the attention cores are at least this share of its predicted step: there
the kernel, not the GEMM curve or the communication, sets the step."""


def kernel_problems(kernel: str) -> list[str]:
    if kernel not in KERNELS:
        return [f"flash kernel must be one of {', '.join(KERNELS)}, got {kernel!r}"]
    return []


def fraction(eff: Efficiency, kernel: str) -> float:
    """The attention share of peak ``kernel`` reaches on ``eff``'s generation."""
    table = {"fa2": FA2_PEAK_FRACTION, "te": TE_PEAK_FRACTION}.get(kernel, {})
    return table.get(eff.generation, eff.attention_peak_fraction)


def kernel_efficiency(eff: Efficiency, kernel: str) -> Efficiency:
    """``eff`` with the attention share of ``kernel`` (the same object when it does not change)."""
    a = fraction(eff, kernel)
    return eff if a == eff.attention_peak_fraction else replace(eff, attention_peak_fraction=a)


def kernel_text(eff: Efficiency, kernel: str) -> str:
    name = {"native": f"the {eff.generation} generation's calibrated kernel",
            "te": "Transformer Engine's DotProductAttention (Megatron-Core, NeMo)",
            "fa2": "FlashAttention-2 (flash-attn 2, PyTorch SDPA's flash backend)"}[kernel]
    return f"flash kernel {kernel}: {name}, at {fraction(eff, kernel):.0%} of the dense peak forward and backward"
