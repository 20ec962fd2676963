"""Selective activation checkpointing for transformers' decoder layers: torchtitan's op-level policy.

transformers has full checkpointing only (``gradient_checkpointing_enable()``: each decoder layer keeps its inputs
and recomputes everything in backward). PyTorch has the mechanism for selective checkpointing,
``torch.utils.checkpoint.checkpoint(..., use_reentrant=False, context_fn=...)`` with
``create_selective_checkpoint_contexts(policy)``: inside the checkpointed region a ``TorchDispatchMode`` asks the
policy, op by op, whether to keep the op's output (it is then served from a cache in backward) or recompute it.

``apply_selective(model)`` runs each decoder layer's forward that way, with the policy torchtitan applies per
transformer block ("op-level selective AC", ``--activation_checkpoint.selective_ac_option op``), copied from
pytorch/torchtitan ``torchtitan/distributed/activation_checkpoint.py`` (``_apply_op_sac``, commit cfb93265) and the
op list of ``torchtitan/models/llama3/parallelize.py`` (``_op_sac_save_list``, commit ae3bea95):

- keep the outputs of the compute-intensive ops: ``aten.mm``, the SDPA kernels (flash, efficient, cuDNN, math,
  fused-overrideable), ``_c10d_functional.reduce_scatter_tensor`` and ``all_to_all_single``, ``aten.max`` (the
  absolute maximum float8 scaling needs);
- except every second ``aten.mm`` of the layer (counted per forward of each checkpointed region: the 2nd, 4th, ...
  mm is recomputed, the 1st, 3rd, ... kept) — torchtitan has no switch for this, it is always on; ``every_second_mm=
  False`` here keeps every mm (the plain op-list policy of torch's documentation);
- ``per_op_sac_force_recompute_mm_shapes_by_fqns``: an mm whose right-hand side has the shape of a matched
  ``nn.Linear``'s weight (in, out) is recomputed and not counted (here: any module with a 2-D weight, so
  transformers' routers can be named). torchtitan's default, ``["moe.router.gate"]``,
  names torchtitan's router module; no transformers module has that name, so the default here is empty (for a
  transformers MoE pass e.g. ``("mlp.gate",)``);
- a CUDA → CPU ``_to_copy`` (activation offloading) is always kept.

One addition, for the CPU: torch dispatches SDPA on the CPU to ``aten._scaled_dot_product_flash_attention_for_cpu``
(output and logsumexp), which torchtitan's GPU list lacks; it is kept like the CUDA flash kernel. SDPA's math
fallback (masks SDPA's CPU flash kernel cannot take, MLA's different q/v head dims, GQA without ``enable_gqa``) is
``CompositeImplicitAutograd``: the dispatch mode never sees ``_scaled_dot_product_attention_math`` itself, only its
``bmm``/``_softmax`` pieces, none of which the policy keeps. Likewise a biased ``nn.Linear`` dispatches to
``aten.addmm``, not ``aten.mm``: it is recomputed and does not advance the mm count.

``preserve_rng_state`` defaults to ``False`` as torchtitan's ``ActivationCheckpoint.preserve_rng_state`` does
(transformers' configs train with zero dropout; pass ``True`` for dropout that must replay the same masks).
torch is imported inside the functions.
"""

from __future__ import annotations

from functools import partial

from trainmath.errors import TrainmathError

POLICIES = ("torchtitan-op",)


def save_ops() -> frozenset:
    """The ops whose outputs the policy keeps (torchtitan's ``_op_sac_save_list`` + the CPU SDPA kernel)."""
    import torch

    aten, c10d = torch.ops.aten, torch.ops._c10d_functional
    ops = {
        aten.mm.default,
        aten._scaled_dot_product_efficient_attention.default,
        aten._scaled_dot_product_flash_attention.default,
        aten._scaled_dot_product_cudnn_attention.default,
        aten._scaled_dot_product_attention_math.default,
        aten._scaled_dot_product_fused_attention_overrideable.default,
        c10d.reduce_scatter_tensor.default,
        c10d.all_to_all_single.default,
        aten.max.default,
        aten._scaled_dot_product_flash_attention_for_cpu.default,  # ours: what SDPA runs on the CPU
    }
    return frozenset(ops)


def op_sac_policy(meta: dict, *, every_second_mm: bool = True, mm_recompute_shapes: frozenset = frozenset(),
                  ops: frozenset | None = None):
    """torchtitan's ``_custom_policy``: ``meta`` counts the region's mm calls (one fresh dict per region and pass)."""
    import torch
    from torch.utils.checkpoint import CheckpointPolicy

    ops = save_ops() if ops is None else ops
    mm = torch.ops.aten.mm.default

    def policy(ctx, func, *args, **kwargs):
        if (func == torch.ops.aten._to_copy.default and "cuda" in str(args[0].device)
                and "device" in kwargs and str(kwargs["device"]) == "cpu"):
            return CheckpointPolicy.MUST_SAVE
        key = "recompute_mm_count" if ctx.is_recompute else "forward_mm_count"
        if func == mm:
            if args[1].shape in mm_recompute_shapes:
                return CheckpointPolicy.PREFER_RECOMPUTE
            meta[key] += 1
        # keep the output of every compute op, except every second mm
        keep = func in ops and not (every_second_mm and func == mm and meta[key] % 2 == 0)
        return CheckpointPolicy.MUST_SAVE if keep else CheckpointPolicy.PREFER_RECOMPUTE

    return policy


def _context_fn(every_second_mm: bool, mm_recompute_shapes: frozenset):
    from collections import defaultdict

    import torch.utils.checkpoint as ckpt

    # looked up at call time, so a test can observe the caches the contexts hold
    return ckpt.create_selective_checkpoint_contexts(
        op_sac_policy(defaultdict(int), every_second_mm=every_second_mm, mm_recompute_shapes=mm_recompute_shapes))


def decoder_layers(model) -> list:
    """transformers' repeated blocks (``GradientCheckpointingLayer``s) of a causal LM, in order."""
    from transformers.modeling_layers import GradientCheckpointingLayer

    layers = [m for m in model.modules() if isinstance(m, GradientCheckpointingLayer)]
    if not layers:
        raise TrainmathError(f"--recompute selective: {type(model).__name__} has no transformers decoder layers "
                             f"(GradientCheckpointingLayer) to checkpoint")
    return layers


def _force_recompute_shapes(layer, fqns) -> frozenset:
    """torchtitan's ``mm_recompute_shapes``: (in, out) of every matched module's weight. torchtitan accepts
    ``nn.Linear`` only; transformers' routers (``Qwen3MoeTopKRouter``, ...) are modules with an (out, in)
    ``weight`` applied by ``F.linear``, so any module with a 2-D ``weight`` is taken."""
    shapes = set()
    for name, sub in layer.named_modules():
        if not name or not any(f in name for f in fqns):
            continue
        weight = getattr(sub, "weight", None)
        if weight is None or weight.dim() != 2:
            raise TrainmathError(f"per_op_sac_force_recompute_mm_shapes_by_fqns matched {name!r}, a "
                                 f"{type(sub).__name__} without a 2-D weight; name linear layers or routers")
        out_f, in_f = weight.shape
        shapes.add((in_f, out_f))
    return frozenset(shapes)


def apply_selective(model, policy: str = "torchtitan-op", *, every_second_mm: bool = True,
                    per_op_sac_force_recompute_mm_shapes_by_fqns: tuple = (), preserve_rng_state: bool = False):
    """Run each decoder layer's forward under selective checkpointing with ``policy``; returns ``model``.

    Uses transformers' own hook (the one ``gradient_checkpointing_enable()`` sets): each layer's
    ``_gradient_checkpointing_func`` becomes ``checkpoint(..., use_reentrant=False, context_fn=...)``, active in
    training mode with gradients enabled, outside module hooks (FSDP2's stay outside the region)."""
    import torch.utils.checkpoint as ckpt

    if policy not in POLICIES:
        raise TrainmathError(f"selective checkpointing policy {policy!r} is unknown; use one of {', '.join(POLICIES)}")
    layers = decoder_layers(model)
    fqns = tuple(per_op_sac_force_recompute_mm_shapes_by_fqns)
    shapes = [_force_recompute_shapes(layer, fqns) for layer in layers]  # every error before any change
    enable = getattr(model, "activation_checkpointing_enable", None)  # transformers >= 5.2x; the old name warns
    if enable is not None:
        enable(activation_checkpointing_kwargs={"use_reentrant": False})
    else:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    for layer, mine in zip(layers, shapes):
        layer._gradient_checkpointing_func = partial(
            ckpt.checkpoint, use_reentrant=False, preserve_rng_state=preserve_rng_state,
            context_fn=partial(_context_fn, every_second_mm, mine))
    return model
