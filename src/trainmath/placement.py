"""What each rank holds: every parameter tensor of a pipeline stage with its shape on one rank.

Counting (``trainmath.params``) never reads a parallel degree; this module is the one place that does. Each
``TensorSpec`` carries a sharding hint, and a rank of a (tp, pp, ep) layout holds:

- ``column``: the output features split tp ways (weight axis 0, or axis 1 for a transposed Conv1D / fused
  expert weight stored (in, out)); 1-D column tensors (biases, OLMo 2's full q/k norm) split on their only axis;
- ``row``: the input features split tp ways (axis 1, or axis 0 when transposed);
- ``vocab``: the vocabulary rows split tp ways under a vocabulary-parallel layout (Megatron's
  ``VocabParallelEmbedding`` and parallel LM head, always on in Megatron; ``--vocab-parallel`` with the hf
  profile), else whole: ``parallelize_module`` on transformers' decoder layers leaves the embedding and the head
  replicated;
- ``head``: per-head tensors (sinks, A_log, dt_bias, per-head norms) split on axis 0;
- ``replicated``: whole on every rank (norms, routers, row-parallel biases).

A split is ``ceil_div(size, tp)`` rows: exact when tp divides the size (layout validation guarantees it for heads;
Megatron pads the vocabulary to a multiple of 128·tp, which is not modelled — ceil_div is the unpadded figure).

Routed experts are split ep ways (experts/ep whole experts per rank, each still split by tp: expert TP = TP, or
whole when ep is drawn across the tensor-parallel ranks, ``ParallelLayout.expert_tp`` = 1).

**Stage split rule** (pipeline parallel): layers are cut into pp contiguous stages as ``numpy.array_split`` does —
every stage gets ⌊L/pp⌋ layers and the first L mod pp stages one more (Megatron requires L % pp == 0 by default;
this rule agrees with it then). Stage 0 also holds the embeddings (token and position), the last stage the final
norm and lm_head. A tied lm_head costs nothing when pp == 1; when pp > 1 the last stage keeps its own copy of the
word embeddings as the head (Megatron's ``shared_embedding``, kept equal by an all-reduce of their gradients).
"""

from __future__ import annotations

from dataclasses import dataclass

from trainmath.arith import ceil_div, numel
from trainmath.layout import ParallelLayout
from trainmath.model.spec import ModelSpec, TensorSpec


def stage_layers(num_layers: int, pp: int, first: int | None = None, last: int | None = None) -> tuple[range, ...]:
    """The layer indices of each pipeline stage: contiguous, the first L mod pp stages one layer longer. With
    ``first`` / ``last`` (Megatron-LM's ``--decoder-first-pipeline-num-layers`` /
    ``--decoder-last-pipeline-num-layers``), those stages hold that many layers and the stages between share
    the rest, again the first ones one longer where it does not divide (Megatron requires it to divide;
    ``trainmath.perf.job.split_problems`` says so)."""
    if pp > 1 and (first is not None or last is not None):
        ends = [n for n in (first, last) if n is not None]
        inner = stage_layers(num_layers - sum(ends), pp - len(ends)) if pp > len(ends) else ()
        sizes = ([first] if first is not None else []) + [len(r) for r in inner] + ([last] if last is not None
                                                                                      else [])
        out, start = [], 0
        for n in sizes:
            out.append(range(start, start + n))
            start += n
        return tuple(out)
    base, extra = divmod(num_layers, pp)
    out, start = [], 0
    for s in range(pp):
        n = base + (1 if s < extra else 0)
        out.append(range(start, start + n))
        start += n
    return tuple(out)


def tp_axis(t: TensorSpec) -> int | None:
    """The axis of a tensor (as stored, one copy) that tensor parallelism splits, or None when replicated."""
    if t.shard == "replicated":
        return None
    if len(t.shape) == 1 or t.shard in ("vocab", "head"):
        return 0
    if t.shard == "column":
        return 1 if t.transposed else 0
    if t.shard == "row":
        return 0 if t.transposed else len(t.shape) - 1
    raise ValueError(f"unknown shard hint {t.shard!r} on {t.name}")


def tp_shape(t: TensorSpec, tp: int) -> tuple[int, ...]:
    """One copy's shape on a tensor-parallel rank."""
    axis = tp_axis(t)
    if axis is None or tp == 1:
        return t.shape
    return tuple(ceil_div(s, tp) if i == axis else s for i, s in enumerate(t.shape))


@dataclass(frozen=True, kw_only=True)
class RankTensor:
    """A parameter tensor as one rank holds it: ``copies`` separate tensors of ``shape`` each."""

    name: str
    """Checkpoint name (layer index filled in; ``{e}`` left for per-expert tensors)."""
    shape: tuple[int, ...]
    copies: int
    """Separate tensors of this shape on the rank: experts/ep for per-expert tensors, else 1."""
    expert: bool
    """A routed expert's tensor: ZeRO shards it over the expert data-parallel group."""
    unit: str
    """The module it belongs to for ZeRO-3 gathering: ``embed``, ``layer.<i>`` or ``head``."""
    spec: TensorSpec

    @property
    def numel(self) -> int:
        """Elements of one copy."""
        return numel(self.shape)

    @property
    def params(self) -> int:
        return self.numel * self.copies


@dataclass(frozen=True, kw_only=True)
class Placement:
    """The parameters one rank of a pipeline stage holds (before ZeRO sharding)."""

    stage: int
    layers: range
    tensors: tuple[RankTensor, ...]

    @property
    def params(self) -> int:
        return sum(t.params for t in self.tensors)

    @property
    def expert_params(self) -> int:
        return sum(t.params for t in self.tensors if t.expert)

    @property
    def dense_params(self) -> int:
        return self.params - self.expert_params

    def unit_params(self) -> dict[str, int]:
        """Params per module (``embed``, ``layer.<i>``, ``head``), in order: what ZeRO-3 gathers at once."""
        out: dict[str, int] = {}
        for t in self.tensors:
            out[t.unit] = out.get(t.unit, 0) + t.params
        return out


def _rank_tensor(t: TensorSpec, name: str, unit: str, layout: ParallelLayout, vocab_parallel: bool) -> RankTensor:
    split = layout.expert_tp if t.experts else layout.tp  # routed experts: whole under expert TP 1
    shape = t.shape if t.shard == "vocab" and not vocab_parallel else tp_shape(t, split)
    if not t.experts:
        return RankTensor(name=name, shape=shape, copies=1, expert=False, unit=unit, spec=t)
    local = ceil_div(t.experts, layout.ep)
    if "{e}" in t.name:  # one tensor per expert
        return RankTensor(name=name, shape=shape, copies=local, expert=True, unit=unit, spec=t)
    return RankTensor(name=name, shape=(local, *shape), copies=1, expert=True, unit=unit, spec=t)  # fused


def place(spec: ModelSpec, layout: ParallelLayout, stage: int = 0, *, vocab_parallel: bool = True) -> Placement:
    """The tensors one (tp, ep) rank of pipeline ``stage`` holds. Ranks of a stage hold equal amounts.
    ``vocab_parallel``: whether ``vocab`` tensors (embeddings, LM head) are split tp ways: Megatron's rule (the
    default, used by the megatron profile and ``trainmath.perf``); the hf profile passes
    ``layout.vocab_parallel`` (``parallelize_module`` leaves them whole unless asked)."""
    stages = stage_layers(spec.num_layers, layout.pp, *layout.stage_split)
    if not 0 <= stage < len(stages):
        raise ValueError(f"stage {stage} out of range for pp={layout.pp}")
    layers = stages[stage]
    out: list[RankTensor] = []
    last = stage == layout.pp - 1
    if stage == 0:
        out += [_rank_tensor(t, t.name, "embed", layout, vocab_parallel) for t in spec.pre if not t.tied]
    for i in layers:
        prefix = spec.layer_prefix.format(i=i)
        out += [_rank_tensor(t, prefix + t.name, f"layer.{i}", layout, vocab_parallel) for t in spec.layers[i].tensors
                if not t.tied]
    if last:
        for t in spec.post:
            if t.tied and layout.pp == 1:
                continue  # the same storage as embed_tokens on this rank
            out.append(_rank_tensor(t, t.name, "head", layout, vocab_parallel))
    return Placement(stage=stage, layers=layers, tensors=tuple(out))


def params_per_rank(spec: ModelSpec, layout: ParallelLayout) -> list[int]:
    """Parameters held by one rank of each pipeline stage, before ZeRO sharding."""
    return [place(spec, layout, s).params for s in range(layout.pp)]
