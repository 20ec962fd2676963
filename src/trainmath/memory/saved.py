"""What one micro-batch saves for backward on one rank, as typed results the step timeline reads by field.

``SavedActivations`` (``activations.activation_bytes``, ``megatron.activations_megatron``) holds the decoder
layers by type, what stays saved for the whole forward and backward (the embedding's tensors, the rotary tables,
the checkpoints' mask arguments) and the recompute transient; ``HeadActivations`` (``activations.logits_bytes``)
the final norm, LM head and loss. The per-tensor leaves are ``Node`` trees, and ``tree()`` renders the whole
result as the breakdown the tests and benchmarks print (its totals are sums).
"""

from __future__ import annotations

from dataclasses import dataclass

from trainmath.tree import Node, scaled


@dataclass(frozen=True, kw_only=True)
class LayerGroup:
    """The rank's layers of one type, and what one of them saves."""

    label: str
    layers: tuple[int, ...]
    """Indices of the rank's layers of this type, in order."""
    one: Node
    """One layer's saved tensors (its value: bytes per layer)."""

    @property
    def bytes_each(self) -> int:
        return self.one.value

    def tree(self) -> Node:
        n = len(self.layers)
        return scaled(self.one, n, f"{self.label} × {n}",
                      f"layers {self.layers[0]}..{self.layers[-1]}, {self.one.value} bytes each")


@dataclass(frozen=True, kw_only=True)
class SavedActivations:
    """Bytes one micro-batch saves for backward on one rank, outside the head (``HeadActivations``)."""

    profile: str
    recompute: str
    groups: tuple[LayerGroup, ...]
    embedding: Node | None = None
    """What the embedding saves (the first stage only)."""
    rotary: Node | None = None
    """The rotary cos/sin tables, computed once and shared by the layers."""
    masks: Node | None = None
    """The attention masks the checkpointed layers receive as arguments (under recompute)."""
    recompute_transient: Node | None = None
    """What one layer's backward saves again while it is recomputed (full: the largest layer's tensors;
    selective: what the recompute saves beside the cache and the layer input)."""
    keeps_layer_input: bool = False
    """Some layer's op list saves its input (the residual stream entering it) itself: under full recompute that
    storage is the checkpoint, not an extra tensor."""
    weight_casts: bool = False
    """Autocast's compute-dtype weight casts are among the saved tensors (not a separate term of the step)."""
    attention_kernels: frozenset[str] = frozenset()
    """The kernels of the layers' attention ops (``Op.kernel``: ``sdpa``, ``eager``, ``sdpa_math`` ...)."""
    note: str = ""

    @property
    def resident(self) -> tuple[Node, ...]:
        """Saved for the whole forward and backward, whatever layer runs: embedding, rotary tables, masks."""
        return tuple(n for n in (self.embedding, self.rotary, self.masks) if n is not None)

    def per_layer(self) -> dict[int, int]:
        """Layer index → the bytes it saves, for the rank's layers."""
        return {i: g.bytes_each for g in self.groups for i in g.layers}

    @property
    def recompute_transient_bytes(self) -> int:
        return 0 if self.recompute_transient is None else self.recompute_transient.value

    @property
    def total_bytes(self) -> int:
        return self.tree().value

    def tree(self) -> Node:
        """The result as a breakdown: ``layers`` (per type, × its layers), the resident parts, the transient."""
        kids = [Node.of("layers", [g.tree() for g in self.groups], "bytes"), *self.resident]
        if self.recompute_transient is not None:
            kids.append(self.recompute_transient)
        return Node.of(f"activations ({self.profile}, recompute={self.recompute})", kids, "bytes", note=self.note)


@dataclass(frozen=True, kw_only=True)
class HeadActivations:
    """The final norm, LM head and loss of the last stage for one micro-batch on one rank."""

    saved: tuple[Node, ...]
    """Each saved storage (the final norm's, the head's input and weight cast, the log-probabilities, labels)."""
    logits_bytes: int
    """The logits the model's output holds (not saved for backward)."""
    logits_fp32_bytes: int
    """Their fp32 upcast in the loss (0 when the logits are fp32 already): the transient peak of the loss."""
    labels_bytes: int
    """Of ``saved``: the labels, their pad column and ``total_weight`` (what ``nll_loss_backward`` frees)."""
    alive: tuple[Node, ...] = ()
    """``logits_bytes`` and ``logits_fp32_bytes`` as rendered leaves."""
    note: str = ""

    @property
    def saved_bytes(self) -> int:
        return sum(n.value for n in self.saved)

    @property
    def total_bytes(self) -> int:
        return self.saved_bytes + self.logits_bytes + self.logits_fp32_bytes

    def tree(self) -> Node:
        return Node.of("logits and loss", [Node.of("saved", self.saved, "bytes"),
                                           Node.of("not saved", self.alive, "bytes")], "bytes", note=self.note)
