"""The vocabulary of one step's timeline: the ``Kind`` of a moment, the ``Live`` terms at it, an ``Event`` (both),
the ``StepInputs`` of one stage, and ``Walk``, what a ZeRO implementation adds to the timeline
(``timeline.step_timeline`` walks the step; ``timeline.Buckets``, ``flat_zero.Flat`` and ``fsdp2.FSDP2`` walk
their buffers along)."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field, fields

from trainmath.tree import Node


class Kind(enum.Enum):
    """A moment of the step; the value is its printed name (``{i}``: the layer index)."""

    STEP_START = "step start"
    ROOT_ALL_GATHER = "forward: root all-gather"
    FORWARD_ALL_GATHER = "forward layer {i} all-gather"
    FORWARD_LAYER = "forward layer {i}"
    FORWARD_LOSS = "forward: loss"
    BACKWARD_LOSS = "backward: loss"
    BACKWARD_HEAD = "backward: head"
    BACKWARD_ALL_GATHER = "backward layer {i} all-gather"
    BACKWARD_RECOMPUTE = "backward layer {i} recompute"
    BACKWARD_LAYER = "backward layer {i}"
    BACKWARD_ATTENTION = "backward layer {i} attention"
    BACKWARD_INPUT_NORM = "backward layer {i} input norm"
    BACKWARD_LAYER_DONE = "backward layer {i} done"
    LAYER_REDUCE_SCATTER = "backward layer {i} reduce-scatter"
    BACKWARD_EMBEDDING = "backward: embedding"
    ROOT_REDUCE_SCATTER = "backward: root reduce-scatter"
    GRADIENT_PACK = "gradient pack"
    GRADIENT_REDUCE_SCATTER = "gradient reduce-scatter"
    OPTIMIZER_STEP = "optimizer step"
    PARAMETER_ALL_GATHER = "parameter all-gather"
    ZERO_GRAD = "zero_grad"

    @property
    def in_forward(self) -> bool:
        return self.value.startswith("forward")


@dataclass(frozen=True, kw_only=True)
class Persistent:
    """Bytes live the whole step."""

    weights_bytes: int = 0
    master_weights_bytes: int = 0
    optimizer_states_bytes: int = 0
    framework_overhead_bytes: int = 0
    """The data-parallel wrapper's buffers (DDP's buckets, DeepSpeed's reduce bucket)."""


@dataclass(frozen=True, kw_only=True)
class Live:
    """Every term live at one moment, bytes; ``activations_bytes`` is a tree whose value is its bytes. The field
    order is the breakdown's (``TERMS``)."""

    weights_bytes: int = 0
    gradients_bytes: int = 0
    master_weights_bytes: int = 0
    optimizer_states_bytes: int = 0
    activations_bytes: Node = field(default_factory=lambda: Node.of("activations_bytes", [], "bytes"))
    logits_bytes: int = 0
    logits_fp32_bytes: int = 0
    cross_entropy_grad_bytes: int = 0
    activation_grads_bytes: int = 0
    weight_copies_bytes: int = 0
    zero3_gather_bytes: int = 0
    zero3_grad_reduce_bytes: int = 0
    optimizer_step_temporaries_bytes: int = 0
    optimizer_fp32_grads_bytes: int = 0
    framework_overhead_bytes: int = 0

    def terms(self) -> tuple[Node, ...]:
        """Every term as a node, in ``TERMS`` order."""
        return tuple(v if isinstance(v, Node) else Node(name=f.name, value=v, unit="bytes")
                     for f in fields(self) for v in (getattr(self, f.name),))

    @property
    def bytes(self) -> int:
        """The sum of ``terms()``' values, in the same order, without building the nodes."""
        total = 0
        for name in TERMS:
            v = getattr(self, name)
            total += v.value if isinstance(v, Node) else v
        return total


TERMS = tuple(f.name for f in fields(Live))
"""Every field of a breakdown, in order; the same names a runtime measurement uses."""


@dataclass(frozen=True, kw_only=True)
class Event:
    """One moment of the step and what is live then."""

    kind: Kind
    layer: int | None = None
    """The layer the moment belongs to (kinds named ``... layer {i} ...``)."""
    live: Live

    @property
    def name(self) -> str:
        return self.kind.value.format(i=self.layer)

    @property
    def bytes(self) -> int:
        return self.live.bytes


@dataclass(frozen=True, kw_only=True)
class Moment:
    """What the step holds at one moment whatever the ZeRO implementation: the activations, the loss's and the
    backward's buffers, the optimizer's temporaries (bytes). A ``Walk`` adds its gradients and collectives."""

    kind: Kind
    layer: int | None = None
    acts: Node
    logits: int = 0
    up: int = 0
    """The logits' fp32 upcast."""
    ce: int = 0
    """Cross-entropy's backward gradients."""
    hidden: int = 0
    """Gradients of activations (the hidden states', a layer's backward transient)."""
    copies: int = 0
    temps: int = 0
    fp32g: int = 0


@dataclass(frozen=True, kw_only=True)
class StepInputs:
    """Everything the timeline of one stage needs but the ZeRO implementation, computed by
    ``training.stage_memory``."""

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
    persistent: Persistent
    grads_persist: bool
    """Gradients allocated from the start of the step (``zero``, ``accumulate``, DDP bucket views)."""
    optimizer_temporaries: int
    fp32_grad_copies: int
    grads_freed_by_copy: bool = False
    """The fp32 copies replace the model's gradients at the optimizer step: Megatron-LM's
    ``Float16OptimizerWithFloat16Params._copy_model_grads_to_main_grads`` sets ``model_param.grad = None`` after
    each copy (one rank without ZeRO, gradients made in this step: ``set_to_none``, one micro-batch, no bucket
    views; ``trainmath.verify.mixed``)."""
    positions: int = 0
    """Bytes of the model's int64 position ids, alive through the forward (counted beside FSDP2's forward
    all-gathers)."""
    autocast_cache: dict = field(default_factory=dict)
    """unit → bytes of its linear weights' bf16 casts when ``backward()`` runs inside ``torch.autocast``
    (``TrainingSetup.backward_in_autocast``), else empty. autocast caches the cast of every leaf fp32 weight that
    requires grad until the outermost context exits, so the forward's casts outlive the tensors that saved them
    and last to the end of backward; a checkpointed layer's recompute finds them cached. They are counted where
    nothing else holds them: after the unit's backward, and under recompute through the whole backward but the
    recomputing layer's (its recompute transient holds the same storage)."""
    casts_saved: bool = True
    """The forward's saved tensors hold the layers' casts (no recompute) until each layer's backward."""
    recompute_peaks: dict = field(default_factory=dict)
    """layer index → (bytes of its saved storages not yet recomputed, forward intermediates, gradients made
    before the recompute) at its recompute's peak, a moment before ``backward layer {i}`` with the same buffers
    (``memory.peft_recompute``; empty: not modelled, as in full training)."""


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


class Walk:
    """A ZeRO implementation's walk along one step (one per ``step_timeline`` call): each hook gets the moment
    the step is at and returns its events, adding the gradients it holds, its gathered and reducing buffers and
    the events of its own collectives. ``pos`` is the layer's position on the stage."""

    loop_note = "held by the training loop until the step returns"
    """The note on the input batch after backward."""

    def __init__(self, inp: StepInputs):
        self.inp = inp

    def loop_acts(self) -> Node:
        """The activations after backward: the input batch the loop holds (first stage)."""
        inp = self.inp
        batch = [Node(name="input batch", value=inp.batch, unit="bytes", note=self.loop_note)] \
            if inp.first and inp.batch else []
        return Node.of("activations_bytes", batch, "bytes")

    def event(self, m: Moment, *, gradients: int, gather: int = 0, reduce: int = 0, buffers: int = 0) -> Event:
        """``m`` with this implementation's terms: ``buffers`` add to the framework overhead."""
        p = self.inp.persistent
        return Event(kind=m.kind, layer=m.layer, live=Live(
            weights_bytes=p.weights_bytes, gradients_bytes=gradients, master_weights_bytes=p.master_weights_bytes,
            optimizer_states_bytes=p.optimizer_states_bytes, activations_bytes=m.acts, logits_bytes=m.logits,
            logits_fp32_bytes=m.up, cross_entropy_grad_bytes=m.ce, activation_grads_bytes=m.hidden,
            weight_copies_bytes=m.copies, zero3_gather_bytes=gather, zero3_grad_reduce_bytes=reduce,
            optimizer_step_temporaries_bytes=m.temps, optimizer_fp32_grads_bytes=m.fp32g,
            framework_overhead_bytes=p.framework_overhead_bytes + buffers))

    def start(self, m: Moment) -> list[Event]:
        raise NotImplementedError

    def forward(self, pos: int, m: Moment) -> list[Event]:
        """Layer ``pos``'s forward (``m``: its saved tensors kept)."""
        raise NotImplementedError

    def loss(self, fwd: Moment, bwd: Moment) -> list[Event]:
        raise NotImplementedError

    def head(self, m: Moment) -> list[Event]:
        raise NotImplementedError

    def backward(self, pos: int, m: Moment) -> list[Event]:
        """Layer ``pos``'s backward, its saved tensors (or recomputed ones) still alive."""
        raise NotImplementedError

    def backward_done(self, pos: int, m: Moment) -> list[Event]:
        """Layer ``pos``'s backward done: its saved tensors freed."""
        raise NotImplementedError

    def embedding(self, m: Moment, loop: Node) -> list[Event]:
        """The embedding's backward (first stage); ``loop``: what the loop holds when backward is over."""
        raise NotImplementedError

    def end(self, m: Moment) -> list[Event]:
        """From the end of backward to ``zero_grad`` (``m``: the loop's batch and output)."""
        raise NotImplementedError
