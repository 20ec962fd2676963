"""A tiny stand-in for ``trainmath.memory.activations`` with its signature and typed results, so the memory tests do
not depend on the activation model's numbers: every layer saves 10 values per token per hidden unit (÷ tp, ÷ cp)."""

from __future__ import annotations

from trainmath.memory.saved import HeadActivations, LayerGroup, SavedActivations
from trainmath.placement import ceil_div
from trainmath.tree import Node


def activation_bytes(spec, *, micro_batch, seq, profile="hf", recompute="none", compute_dtype_bytes=2,
                     tp=1, sp=False, cp=1, pp=1, layers=None, **_) -> SavedActivations:
    idx = range(spec.num_layers) if layers is None else layers
    per_layer = 10 * micro_batch * ceil_div(seq, cp) * ceil_div(spec.hidden_size, tp) * compute_dtype_bytes
    if recompute == "full":
        per_layer = micro_batch * ceil_div(seq, cp) * spec.hidden_size * compute_dtype_bytes
    groups: dict[str, list[int]] = {}
    for i in idx:
        groups.setdefault(spec.layers[i].label, []).append(i)
    return SavedActivations(profile=profile, recompute=recompute, groups=tuple(
        LayerGroup(label=k, layers=tuple(v), one=Node(name=k, value=per_layer, unit="bytes"))
        for k, v in groups.items()))


def logits_bytes(spec, micro_batch, seq, *, compute_dtype_bytes=2, tp=1, cp=1, vocab_parallel=False,
                 **_) -> HeadActivations:
    """The logits alone (÷ tp), and their fp32 upcast over the loss's vocabulary (÷ tp when it is sharded)."""
    tokens = micro_batch * ceil_div(seq, cp)
    vocab = ceil_div(spec.vocab_size, tp) if vocab_parallel and tp > 1 else spec.vocab_size
    logits = tokens * ceil_div(spec.vocab_size, tp) * compute_dtype_bytes
    alive = (Node(name="logits", value=logits, unit="bytes"), Node(name="logits_fp32", value=4 * tokens * vocab,
                                                                   unit="bytes"))
    return HeadActivations(saved=(), logits_bytes=logits, logits_fp32_bytes=4 * tokens * vocab, labels_bytes=0,
                           alive=alive)
