"""The op list: what one block computes, as ordered ops over named tensors with their sharding rules.

A family emits, per decoder layer, a list of ``Op`` (``trainmath.families``); every quantity that depends on
what is computed is a fold over that list: the bytes autograd saves for backward and the autocast weight copies
(``trainmath.ops.fold``), the GEMM FLOPs (``trainmath.ops.flops``), the inference cache (``trainmath.ops.cache``),
and what one rank of a parallel layout holds of each. Model code is single-device: a
``Tensor`` carries full sizes, and each axis names the rule (``Axis.shard``) by which a layout divides it; only
``Degrees.split`` reads a parallel degree.

Storage identity is what makes the saved bytes exact: two ops that save the same ``Tensor`` object keep one
storage (q, k and v saving the norm's output), and a view (``Tensor.base``) keeps its base's whole storage alive
(a slice of a fused projection). ``Tensor`` therefore compares by identity.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from trainmath.arith import ceil_div
from trainmath.errors import TrainmathError
from trainmath.model.spec import TensorSpec

SHARDS = ("seq", "seq_sp", "tp", "vocab", "expert")
"""How a parallel layout divides an axis (None: whole on every rank):

- ``seq``: positions of the sequence inside a tensor-parallel region: ÷cp (context parallelism keeps s/cp queries);
  also a flattened axis of rows per token (the routed rows T·k, ``Ctx.token_rows``): a rank routes its own tokens;
- ``seq_sp``: positions outside it (norms, residual stream, dropout): ÷cp, and ÷tp with sequence parallelism
  (Korthikanti et al. 2022 §4.2.2);
- ``tp``: heads or the features a column-parallel Linear produces (its row-parallel partner reads them): ÷tp;
- ``vocab``: the vocabulary of a vocabulary-parallel embedding, head and loss: ÷tp when ``vocab_parallel``;
- ``expert``: the routed experts a rank holds (an expert-count axis: their weights, autocast copies, per-expert
  tensors): ÷ep. Not the routed token rows: expert-parallel ranks are drawn from data parallelism
  (``ParallelLayout``: dp·cp), each brings its own tokens, and under balanced routing each receives as many rows
  for its n/ep experts as it routes (the row axes keep their ``seq`` rule, ÷cp only).
"""


@dataclass(frozen=True, kw_only=True, slots=True)
class Degrees:
    """The parallel degrees that divide a rank's tensors (1 everywhere: the single device)."""

    tp: int = 1
    sp: bool = False
    """Sequence parallelism over the tensor-parallel group (needs tp > 1)."""
    cp: int = 1
    ep: int = 1
    vocab_parallel: bool = False
    """Embedding, LM head and loss sharded over the vocabulary across the tensor-parallel group."""

    def split(self, shard: str | None) -> int:
        """How many ways an axis with this sharding rule is divided."""
        if shard is None:
            return 1
        if shard == "seq":
            return self.cp
        if shard == "seq_sp":
            return self.cp * (self.tp if self.sp else 1)
        if shard == "tp":
            return self.tp
        if shard == "vocab":
            return self.tp if self.vocab_parallel else 1
        if shard == "expert":
            return self.ep
        raise TrainmathError(f"unknown sharding rule {shard!r} (one of {', '.join(SHARDS)})")

    @property
    def single(self) -> bool:
        return self == Degrees()


SINGLE = Degrees()


@dataclass(frozen=True, slots=True)
class Axis:
    """One axis of a tensor: its full (single-device) size and the rule that divides it."""

    size: int
    shard: str | None = None

    def on(self, deg: Degrees) -> int:
        """The axis' size on one rank (``ceil_div``: an uneven split rounds up, as the largest rank holds)."""
        return ceil_div(self.size, deg.split(self.shard))


@dataclass(frozen=True, kw_only=True, eq=False, slots=True)
class Tensor:
    """A tensor of the forward pass. Compares by identity: one object is one storage."""

    name: str
    axes: tuple[Axis, ...]
    dtype_bytes: int
    base: Tensor | None = None
    """The tensor this one is a view of: saving the view keeps the base's storage."""
    count: int = 1
    """Equal tensors of this shape that share the name (one per chunk, per use, per expert hit)."""
    kind: str = "activation"
    """``activation``; ``weight_copy`` (an autocast cast of a parameter, kept for backward); ``gathered`` (the
    sequence all-gather entering a tensor-parallel region: a view of its input unless the sequence is split);
    for a tensor an op leaves in the inference cache (``Op.cache``), its store (``ops.cache.CACHE_KINDS``)."""
    note: str = ""

    def storage_on(self, deg: Degrees = SINGLE) -> Tensor:
        """The tensor that owns this one's storage on a rank of ``deg``: itself unless a view; a ``gathered``
        tensor (``kernels.linear.gather_seq``) is its own storage only when sequence parallelism split its input."""
        t = self
        while t.base is not None:
            if t.kind == "gathered" and deg.sp and deg.tp > 1:
                return t
            t = t.base
        return t

    def numel(self, deg: Degrees = SINGLE) -> int:
        n = self.count
        for a in self.axes:
            n *= a.on(deg)
        return n

    def nbytes(self, deg: Degrees = SINGLE) -> int:
        """Bytes of this tensor (all ``count`` copies) on one rank."""
        return self.dtype_bytes * self.numel(deg)

    def view(self, name: str, *axes: Axis, note: str = "") -> Tensor:
        """A view of this tensor (a slice, split, chunk or reshape that copies nothing)."""
        return Tensor(name=name, axes=tuple(axes), dtype_bytes=self.dtype_bytes, base=self, note=note)


def tensor(name: str, axes, dtype_bytes: int, note: str = "", count: int = 1) -> Tensor:
    """A new tensor (its own storage) of ``axes`` and dtype: what every kernel's outputs and saved copies are."""
    return Tensor(name=name, axes=tuple(axes), dtype_bytes=dtype_bytes, note=note, count=count)


@dataclass(frozen=True, kw_only=True, eq=False, slots=True)
class Op:
    """One operation of the forward pass, as the model code runs it."""

    kind: str
    """``linear``, ``norm``, ``act``, ``mul``, ``rotary``, ``attention``, ``router``, ``experts``, ``conv``,
    ``scan``, ``embedding``, ``loss``, ``cast``, ``index`` ..."""
    name: str
    """Module path of the op (``self_attn.q_proj``) or a name for a functional op (``sdpa``)."""
    inputs: tuple[Tensor, ...] = ()
    outputs: tuple[Tensor, ...] = ()
    saved: tuple[Tensor, ...] = ()
    """What autograd keeps for this op's backward (storages counted once across ops)."""
    kernel: str = ""
    """The implementation where it changes what is kept: ``sdpa``, ``eager``, ``sdpa_math``, ``grouped_mm``,
    ``eager_loop``, ``all_tokens`` (every expert over every token) ..."""
    weight: TensorSpec | None = None
    """The parameter a ``linear`` multiplies by (its FLOPs and, under autocast, its cast); a ``conv``'s kernel."""
    window: int | None = None
    """An ``attention`` op's sliding window or attention chunk (None: full causal attention)."""
    chunk: int | None = None
    """A chunked ``scan``'s chunk length (its sequence axes are padded to whole chunks)."""
    cache: tuple[Tensor, ...] = ()
    """What the inference cache holds of this op after a prefill of the op list's tokens (``ops.cache``)."""
    note: str = ""


@dataclass(kw_only=True)
class Program:
    """An op list under construction (``emit`` appends; families build one per layer)."""

    ops: list[Op] = field(default_factory=list)

    def emit(self, kind: str, name: str, *, inputs=(), outputs=(), saved=(), kernel: str = "",
             weight: TensorSpec | None = None, window: int | None = None, chunk: int | None = None, cache=(),
             note: str = "") -> Op:
        op = Op(kind=kind, name=name, inputs=tuple(inputs), outputs=tuple(outputs), saved=tuple(saved),
                kernel=kernel, weight=weight, window=window, chunk=chunk, cache=tuple(cache), note=note)
        self.ops.append(op)
        return op
