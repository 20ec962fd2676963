"""What one training step runs, everything but the parallel layout: the calculator's training configuration
(a run of ``trainmath train`` holds one: ``runtime.train.config.TrainConfig.step``, which ``verify.train.predict``
reads; the words both use are ``trainmath.vocabulary``'s)."""

from __future__ import annotations

from dataclasses import dataclass

from trainmath.memory import states as st


@dataclass(frozen=True, kw_only=True)
class TrainingSetup:
    """What one training step runs (everything but the parallel layout)."""

    micro_batch: int
    """Sequences per micro-batch on one data-parallel rank."""
    seq: int
    """Tokens per sequence."""
    precision: str = "mixed-bf16"
    optimizer: str = "adamw"
    optimizer_impl: str = "foreach"
    """``forloop`` (``foreach=False``), ``foreach`` (torch's default on CUDA) or ``fused``."""
    recompute: str = "none"
    attention: str = "sdpa"
    profile: str = "hf"
    """Activation profile: what the model code saves (``hf`` transformers, ``megatron`` Megatron-Core)."""
    micro_batches: int | None = None
    """Micro-batches per step (gradient accumulation); None means at least pp (1F1B fills the pipeline)."""
    granularity: int = st.ALLOC_GRANULARITY
    """The CUDA caching allocator's block size; ``device="cpu"`` uses 1 (the CPU allocator does not round)."""
    grad_lifetime: str = "set_to_none"
    """When gradients exist (``vocabulary.GRAD_LIFETIMES``): ``set_to_none`` (torch's ``zero_grad`` default: none
    at the start of the step), ``zero`` (``zero_grad(set_to_none=False)``), ``accumulate`` (gradient accumulation:
    allocated for the whole step)."""
    bucket_view: bool = False
    """DDP's ``gradient_as_bucket_view`` (ZeRO-0 with dp·cp > 1): gradients are views of the buckets."""
    device: str = "cuda"
    """``cuda``: what ``torch.cuda.max_memory_allocated`` reports (512-byte blocks; non-fused optimizers keep
    their step scalars on the CPU); ``cpu``: what CPU kernels allocate (no rounding; every tensor on the one
    device)."""
    experts: str = "grouped"
    """Routed experts as transformers runs them: ``grouped`` (``grouped_mm``, the default of transformers 5) or
    ``eager`` (the per-expert loop, which saves more)."""
    loop_keeps: str = "loss"
    """What the training loop keeps of the model's output through backward (``vocabulary.LOOP_KEEPS``): ``loss``
    (``loss = model(...).loss``, what most loops do: the HF Trainer's ``compute_loss``, torchtitan's ``del pred``,
    Lightning, ``trainmath train``: the logits are freed when the forward returns) or ``output``
    (``out = model(...)``: the logits until the step returns)."""
    backward_in_autocast: bool = False
    """The loop calls ``backward()`` inside the ``torch.autocast`` context (amp-bf16): autocast's cache keeps every
    bf16 weight cast the forward made until the context exits, through the whole backward
    (``step.StepInputs.autocast_cache``); False: ``backward()`` after the context exits, as HF Trainer does."""
    zero_impl: str = "deepspeed"
    """Whose ZeRO-1/2 buffers (``vocabulary.ZERO_IMPLS``): ``deepspeed`` (one reduce bucket of min(5e8, Ψ)
    elements for the whole step) or ``trainmath`` (``trainmath train --impl trainmath``: flat padded buffers
    at the reduce and the all-gather only; ``flat_zero``). ZeRO-3: FSDP2 (``deepspeed``) or ours (the unit
    that runs gathered, no prefetch; gradients as ZeRO-2's). ``megatron``: Megatron-Core's DDP and distributed
    optimizer (``megatron/core/distributed/param_and_grad_buffer.py``): the gradients live in one contiguous
    buffer that is reduced (ZeRO-0) or reduce-scattered (ZeRO-1/2) in place, so no bucket beside them; ZeRO-3 as
    ``deepspeed``'s. ZeRO-0 ignores the others."""
    peft: object = None
    """A LoRA / QLoRA fine-tune (``memory.peft.PeftRun``), or None: full training."""
    offload: str = "none"
    """ZeRO-Offload (Ren et al. 2021): ``optimizer`` keeps optimizer states, master weights and the optimizer
    step on the CPU; ``params`` (ZeRO-3 only) also keeps the parameter shards there, gathered to the GPU per
    module."""
    recompute_saves: tuple[str, ...] = ()
    """With ``recompute="full"`` under the megatron profile: the layer's tensors (``memory.megatron`` names) kept
    beside its checkpointed input, as a JAX ``save_only_these_names`` remat policy keeps them."""
    recompute_modules: tuple[str, ...] = ()
    """With ``recompute="selective"`` under the megatron profile: Megatron-Core's ``--recompute-modules``
    (``memory.megatron_recompute``); empty: ``core_attn`` (Megatron-Core's default)."""
    cross_entropy_fusion: str = "none"
    """A fused cross-entropy kernel (megatron profile): ``te`` (Transformer Engine's, the gradient in place) or
    ``flash-attn`` (flash-attn's, a 16-bit gradient): no fp32 logits (``memory.recipe_options.fused_cross_entropy``);
    ``none``: the profile's own loss."""
    offload_layers: int = 0
    """Megatron-Core's ``--cpu-offloading-num-layers`` (megatron profile): the first that many layers of the rank
    keep their saved activations in host memory; each is reloaded for its backward (``memory.recipe_options``)."""
    fp8_param_gather: bool = False
    """``fp8_param_gather`` (``precision="fp8"``): the linear weights are FP8 tensors, not bf16 beside an FP8
    cache (``memory.recipe_options.fp8_param_bytes_saved``)."""
