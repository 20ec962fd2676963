"""Megatron-Core's selective recompute by module (``--recompute-granularity selective --recompute-modules``):
which of the ``megatron`` profile's saved tensors (``memory.megatron.layer_terms`` names) each module's
recompute drops. Megatron-Core (``megatron/core/transformer/transformer_config.py``, ``recompute_modules``;
the modules wrap their outputs in ``CheckpointWithoutOutput`` or ``tensor_parallel.checkpoint``) recomputes:

- ``core_attn``: the core attention (the default): its own tensors (flash's logsumexp, or the unfused s²
  softmax, its dropout mask and output); its q, k and v inputs stay saved by the projections' outputs.
- ``mla_up_proj``: MLA's up-projections and RoPE: their outputs, the core attention's q, k and v, are freed after
  the core attention's forward and recomputed from the (saved) latents before its backward.
- ``layernorm``: the input and pre-MLP norms: their outputs (the inputs of ``linear_qkv``, ``linear_fc1`` and
  the router) are freed and recomputed from the norm inputs, which stay saved.
- ``moe_act``: the routed experts' activation: its output (the experts' ``linear_fc2`` input) is freed and
  recomputed from fc1's output.
- ``mlp``: a dense MLP layer as a whole from its input (the norm's output, kept): fc1's output and the
  activation's output are dropped.
- ``shared_experts``: the shared expert as a whole: its fc1 and activation outputs dropped.
- ``moe``: the MoE layer as a whole from its input (the norm's output): router logits, permuted rows, experts,
  unpermute and shared expert dropped.

What a module drops its layer's backward holds again while it runs: the largest layer's dropped tensors are the
recompute transient. Derived from the code, not measured.
"""

from __future__ import annotations

from trainmath.errors import TrainmathError

RECOMPUTE_MODULES = ("core_attn", "mla_up_proj", "layernorm", "moe_act", "mlp", "shared_experts", "moe")


def check_modules(modules) -> None:
    """Refuse a module Megatron-Core does not name (one line)."""
    bad = [m for m in modules if m not in RECOMPUTE_MODULES]
    if bad:
        raise TrainmathError(f"recompute modules {bad} are not Megatron-Core's: one of {', '.join(RECOMPUTE_MODULES)}")


def drops(name: str, modules: tuple[str, ...], *, mla: bool) -> bool:
    """Whether the recompute of ``modules`` drops the saved tensor ``name`` of a layer (``mla``: the layer's
    attention is MLA, whose q, k, v are the up-projections' outputs). The core attention's own tensors are
    ``layer_terms``' second list and follow ``core_attn`` alone."""
    if "mla_up_proj" in modules and mla and name in ("core attention: q", "core attention: k", "core attention: v"):
        return True
    if "layernorm" in modules and name in ("linear_qkv: input", "linear_fc1: input", "router: input"):
        return True
    if "moe_act" in modules and name.startswith("experts: ") and "output (linear_fc2 input)" in name:
        return True
    if "mlp" in modules and name.startswith("mlp: ") and ("linear_fc1 output" in name or "(linear_fc2 input)" in name):
        return True
    if "shared_experts" in modules and name.startswith("shared expert: "):
        return True
    return "moe" in modules and name.startswith(("router: logits", "experts: ", "unpermute: ", "shared expert: "))
