"""Memory switches of the training recipes the published runs state, beyond the layout and the recompute mode:
Megatron-Core's CPU activation offloading, Megatron's FP8 parameters, the FP8 weight copies a sharded (ZeRO-3 /
FSDP) rank holds, and a JAX remat policy's saved names. Each is one function with its source; ``training``
applies them to one stage's terms.
"""

from __future__ import annotations

from trainmath.arith import ceil_div
from trainmath.errors import TrainmathError
from trainmath.layout import ParallelLayout
from trainmath.placement import Placement


def offload_problems(offload_layers: int, recompute_saves: tuple[str, ...], profile: str, recompute: str
                     ) -> list[str]:
    """Every reason the switches cannot apply, each naming its value (empty when they can)."""
    bad = []
    if not isinstance(offload_layers, int) or offload_layers < 0:
        bad.append(f"offload layers must be a non-negative integer, got {offload_layers!r}")
    elif offload_layers and profile != "megatron":
        bad.append(f"offload layers ({offload_layers}) is Megatron-Core's --cpu-offloading-num-layers: modelled "
                   f"under the megatron profile, got --profile {profile}")
    if recompute_saves and (profile != "megatron" or recompute != "full"):
        bad.append(f"recompute saves ({', '.join(recompute_saves)}) name what a full-recompute layer keeps beside "
                   f"its input: modelled under the megatron profile with recompute full, got {profile}, "
                   f"{recompute}")
    return bad


def offloaded_layers(layers: tuple[int, ...] | list[int], offload_layers: int) -> tuple[int, ...]:
    """The rank's layers whose saved activations live on the host: the first ``offload_layers`` of them.
    Megatron-Core (``--cpu-offloading-num-layers``, ``megatron/core/transformer/transformer_block.py``) wraps each
    layer's forward in Transformer Engine's ``get_cpu_offload_context`` (``transformer_engine/pytorch/
    cpu_offload.py``), which copies the saved tensors of the first N layers to pinned host memory as each
    layer's forward ends and brings them back, one layer ahead, for its backward. It requires N below the
    rank's layer count; refused here likewise."""
    if offload_layers >= len(layers) and offload_layers:
        raise TrainmathError(f"offload layers ({offload_layers}) must be below the rank's layer count "
                             f"({len(layers)}): Megatron-Core keeps at least one layer's activations on the GPU")
    return tuple(layers[:offload_layers])


def apply_offload(saved: dict[int, int], recomputed: dict[int, int], off: tuple[int, ...]
                  ) -> tuple[dict[int, int], dict[int, int]]:
    """(saved, recomputed) with the offloaded layers' saved bytes moved off the GPU: each saves 0 between its
    forward and its backward, and its backward holds what it saved again (the reload) beside what its
    recompute holds. The copy out during the forward is not an event (the layer's tensors leave as the next
    layer's forward runs); the double buffer of the reload is the one reloaded layer."""
    saved, recomputed = dict(saved), dict(recomputed)
    for i in off:
        recomputed[i] = recomputed.get(i, 0) + saved[i]
        saved[i] = 0
    return saved, recomputed


def _linear_params(placement: Placement, layout: ParallelLayout, sharded: bool) -> int:
    """Linear-weight elements on this rank: its tensor/expert shard, and under ZeRO-3 its data-parallel shard
    (experts over ``expert_zero_degree``, the rest over ``zero_degree``)."""
    out = 0
    for t in placement.tensors:
        if t.spec.kind != "linear":
            continue
        degree = (layout.expert_zero_degree if t.expert else layout.zero_degree) if sharded else 1
        out += ceil_div(t.params, degree)
    return out


def fsdp_weight_copies_bytes(placement: Placement, layout: ParallelLayout, copy_bytes: int) -> int:
    """Transformer Engine's FP8 weight copies (``copy_bytes`` per element: the FP8 weight and its transpose) of a
    ZeRO-3 / FSDP rank: of its shard only. Under full sharding a linear weight exists whole only while its unit
    is gathered (``zero3_gather_bytes``), so its FP8 cast is made per gathered unit; Megatron-FSDP with
    ``fp8_param_gather`` keeps the shards themselves in FP8 and gathers FP8. The per-unit cast is a transient
    of the gathered unit, not counted. Derived from the code paths, not measured."""
    return _linear_params(placement, layout, sharded=True) * copy_bytes


def fp8_param_bytes_saved(placement: Placement, layout: ParallelLayout) -> tuple[int, int]:
    """(weight bytes, copy bytes) ``fp8_param_gather`` saves on this rank: Megatron's ``--fp8-param-gather``
    (Megatron-Bridge's FP8 mixed-precision recipes set ``fp8_param_gather=True``) makes each linear weight a
    Transformer Engine FP8 tensor (1 byte) in place of the bf16 parameter beside TE's FP8 cache of it: each
    linear element holds 1 byte less as a weight and 1 byte less as a copy (the FP8 copy is the parameter; its
    transpose stays). The fp32 master weights of the distributed optimizer are unchanged. Sharded like the
    weights (ZeRO-3: the rank's shard)."""
    n = _linear_params(placement, layout, sharded=layout.zero >= 3 and layout.zero_degree > 1)
    return n, n


CROSS_ENTROPY_FUSIONS = ("none", "te", "flash-attn")


def fused_cross_entropy(head, head_saved: int, fusion: str) -> tuple[int, int, int, int]:
    """(head saved, logits alive at the loss beside it, fp32 logits, cross-entropy gradient) bytes of a fused
    cross-entropy kernel, from ``head`` (the head's ``saved.HeadActivations``) and what the plain loss saves. Both
    kernels compute in fp32 inside Triton and save the 16-bit logits themselves with per-token statistics (left
    out: a few fp32 values per token), so there are no fp32 log-probabilities and no fp32 upcast; the logits are
    saved through the loss's and the head's backward, counted once, as saved, with the 4-byte loss beside them.

    - ``te``: Megatron-Core's ``cross_entropy_loss_fusion=True`` with ``cross_entropy_fusion_impl="te"`` (as
      Megatron-Bridge's recipes set them): Transformer Engine's ``parallel_cross_entropy``
      (``transformer_engine/pytorch/cross_entropy.py``, ``CrossEntropyFunction``: ``ctx.save_for_backward(_input,
      target, m_d_X_y)``) writes the gradient into the logits' storage: no gradient tensor of its own.
    - ``flash-attn``: flash-attn's ``CrossEntropyLoss`` (``flash_attn/losses/cross_entropy.py``, default
      ``inplace_backward=False``; LLM Foundry's ``loss_fn: fused_crossentropy``): its backward makes
      ``dlogits = torch.empty_like(logits)`` (``flash_attn/ops/triton/cross_entropy.py``): one 16-bit (T, V)
      gradient."""
    lsm = sum(n.value for n in head.saved if n.name == "log_softmax_fp32")
    grad = head.logits_bytes if fusion == "flash-attn" else 0
    return head_saved - lsm + head.logits_bytes, 4, 0, grad
