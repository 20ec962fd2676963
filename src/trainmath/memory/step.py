"""The vocabulary of one step's timeline: an ``Event`` (a moment and the bytes live then), the ``StepInputs`` of
one stage, and the activations live at a moment. ``timeline`` (DDP, DeepSpeed, our flat ZeRO) and ``fsdp2`` build
their events from these."""

from __future__ import annotations

from dataclasses import dataclass, field

from trainmath.tree import Node


@dataclass(frozen=True, kw_only=True)
class Event:
    """One moment of the step and what is live then: term name → bytes, or a ``Node`` whose value is its bytes."""

    name: str
    parts: dict = field(default_factory=dict)

    @property
    def bytes(self) -> int:
        return sum(v.value if isinstance(v, Node) else v for v in self.parts.values())


@dataclass(frozen=True, kw_only=True)
class StepInputs:
    """Everything the timeline of one stage needs, computed by ``training.stage_memory``."""

    layers: tuple[int, ...]
    """Layer indices on this stage, in forward order."""
    first: bool
    last: bool
    saved: dict
    """layer index → bytes that layer keeps for backward (as the run keeps them: checkpoint inputs under
    recompute)."""
    recomputed: dict
    """layer index → bytes its recomputation saves again in backward (0 without recompute)."""
    resident: list
    """Nodes kept for the whole forward+backward on this stage (embedding indices, rotary cos/sin)."""
    other_micro_batches: int
    """Bytes of the activations of the other micro-batches in flight (1F1B), resident throughout."""
    head_saved: int
    loss_freed: int
    """Bytes of the head's saved tensors that ``nll_loss_backward`` frees before ``log_softmax_backward`` runs
    (the shifted labels and the total weight), less the loss's own gradient (``ones_like``, 4 bytes)."""
    logits: int
    """The logits and the loss: the model output."""
    output_held: int
    """What the loop holds of the output from the loss's backward to the end of the step (``LOOP_KEEPS``): the
    logits and the loss, or the loss alone."""
    batch: int
    """The input batch (int64 ids; the labels are the same tensor), held by the loop until the step returns;
    during forward and backward it is the embedding's saved input (in ``resident``)."""
    logits_fp32: int
    cross_entropy_grads: int
    hidden_grad: int
    """Bytes of one gradient of the hidden states (r·T·d on this rank)."""
    ffn_transient: dict
    """layer index → bytes its first backward op leaves beside the saved tensors (``ffn_backward_transient``)."""
    weight_copies: int
    unit_grads: dict
    """unit (``embed``, ``layer.<i>``, ``head``) → gradient bytes this rank holds for it."""
    unit_gathered: dict
    """unit → bytes of its unsharded parameters under ZeRO-3 (0 for units ZeRO does not shard, or below ZeRO-3)."""
    unit_full_grads: dict
    """unit → bytes of its unsharded gradients before the reduce-scatter (ZeRO-3), else 0."""
    tied_head: bool
    """The LM head is the embedding (tied, one stage): its gradient appears in the head's backward."""
    tied_grad: int = 0
    """Gradient bytes of the tied weight alone on this rank (0: the whole embedding unit is taken as the tied
    weight's, as under ZeRO-3)."""
    persistent: dict
    """weights, master weights, optimizer states, framework buffers: live the whole step."""
    grads_persist: bool
    """Gradients allocated from the start of the step (``zero``, ``accumulate``, DDP bucket views)."""
    optimizer_temporaries: int
    fp32_grad_copies: int
    grads_freed_by_copy: bool = False
    """The fp32 copies replace the model's gradients at the optimizer step: Megatron-LM's
    ``Float16OptimizerWithFloat16Params._copy_model_grads_to_main_grads`` sets ``model_param.grad = None`` after
    each copy (one rank without ZeRO, gradients made in this step: ``set_to_none``, one micro-batch, no bucket
    views; ``trainmath.verify.mixed``)."""
    flat: dict = field(default_factory=dict)
    """unit → ``flat_zero.FlatUnit`` under our flat-buffer ZeRO-1/2 (``zero_impl="trainmath"``), else empty."""
    flat_stage: int = 0
    """1, 2 or 3 with ``flat``: the ZeRO stage our runtime runs (see ``flat_zero``)."""
    fsdp2: dict = field(default_factory=dict)
    """``root`` / ``layer.<i>`` → ``fsdp2.Unit`` under ZeRO-3 as FSDP2 runs it (``fsdp2.step_timeline``), else
    empty."""
    fsdp2_reshard: bool = True
    """FSDP2's ``reshard_after_forward``: True for ZeRO-3, False for its ZeRO-2 (``zero_impl="fsdp2"``)."""
    positions: int = 0
    autocast_cache: dict = field(default_factory=dict)
    """unit → bytes of its linear weights' bf16 casts when ``backward()`` runs inside ``torch.autocast``
    (``TrainingSetup.backward_in_autocast``), else empty. autocast caches the cast of every leaf fp32 weight that
    requires grad until the outermost context exits, so the forward's casts outlive the tensors that saved them
    and last to the end of backward; a checkpointed layer's recompute finds them cached. They are counted where
    nothing else holds them: after the unit's backward, and under recompute through the whole backward but the
    recomputing layer's (its recompute transient holds the same storage)."""
    casts_saved: bool = True
    """The forward's saved tensors hold the layers' casts (no recompute) until each layer's backward."""
    """Bytes of the model's int64 position ids, alive through the forward (FSDP2's forward all-gathers)."""
    fsdp2_mixer: dict = field(default_factory=dict)
    """layer index → ``fsdp2.MixerBackward`` (FSDP2 only): the moment inside its backward at its attention."""
    fsdp2_norm: dict = field(default_factory=dict)
    """layer index → ``fsdp2.NormBackward`` (FSDP2 only): the moment inside its backward at its input norm."""


def acts_at(inp: StepInputs, kept: list[int], live_layer: int | None = None, less: int = 0) -> Node:
    """The activations live now: resident tensors, the saved tensors of ``kept`` layers, and a recomputed one;
    ``less``: bytes of the live layer's saved tensors its backward has freed so far (from its recomputed ones
    under recompute, else from its own)."""
    kids = list(inp.resident)
    recomputed = inp.recomputed.get(live_layer, 0) if live_layer is not None else 0
    if kept:
        kids.append(Node(name=f"layers saved ({len(kept)} of {len(inp.layers)})",
                         value=sum(inp.saved[i] for i in kept) - (0 if recomputed else less), unit="bytes",
                         note=f"layers {kept[0]}..{kept[-1]}"))
    if recomputed:
        kids.append(Node(name=f"layer {live_layer} recomputed", value=recomputed - less, unit="bytes",
                         note="its saved tensors again, while its backward runs"))
    if inp.other_micro_batches:
        kids.append(Node(name="other micro-batches in flight", value=inp.other_micro_batches, unit="bytes",
                         note="1F1B: the stage holds more than one micro-batch's activations"))
    return Node.of("activations_bytes", kids, "bytes")
