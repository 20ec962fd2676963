"""How a training job is laid out over GPUs: data, tensor, pipeline, context and expert parallel degrees, and
the ZeRO stage.

The world is ``dp · tp · pp · cp`` ranks (Megatron-Core's ``RankGenerator`` order tp-cp-ep-dp-pp). Expert
parallelism does not multiply the world: the ``ep`` ranks holding different experts are drawn from the
data-parallel × context-parallel ranks of one tensor-parallel slice, so ``ep`` divides ``dp · cp`` and each
routed expert is still split ``tp`` ways (Megatron-Core's default ``expert_tensor_parallel_size = tp``). When
``ep`` does not divide ``dp · cp`` but divides ``tp · dp · cp``, the experts are laid out as Megatron-Core's "MoE
parallel folding" with expert TP 1 (``expert_tp``): EP drawn across the tensor-parallel ranks too, each routed
expert whole (Megatron-Bridge's Qwen3-235B H100 recipe: ep 32 on tp 2 · dp 16). Expert parameters are then
replicated over ``tp · dp · cp / (ep · expert_tp)`` ranks (the *expert data-parallel* group), which is what ZeRO
shards them over.

Validation follows Megatron-Core's rules: tp divides the attention heads and the KV heads (Megatron requires
``num_query_groups % tp == 0``; vLLM-style KV-head replication is not modelled), pp ≤ layers, ep divides the
routed experts. ``validate_layout`` raises one ``TrainmathError`` that lists every problem with its values.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from trainmath.arith import ceil_div
from trainmath.errors import TrainmathError
from trainmath.model.spec import AttentionDims, LinearAttentionDims, MambaDims, MLADims, ModelSpec, MoEDims


@dataclass(frozen=True, kw_only=True)
class ParallelLayout:
    """Parallel degrees of one training job (all ≥ 1) and the ZeRO stage."""

    dp: int = 1
    """Data-parallel degree (replicas of the model, before ZeRO sharding)."""
    tp: int = 1
    """Tensor-parallel degree (Megatron column/row splitting within a layer)."""
    pp: int = 1
    """Pipeline-parallel degree (layers split into this many stages)."""
    cp: int = 1
    """Context-parallel degree (the sequence split across ranks for attention; weights replicated)."""
    ep: int = 1
    """Expert-parallel degree (routed experts split across ranks of the dp·cp group)."""
    sp: bool = False
    """Megatron sequence parallelism: activations outside attention/MLP split by tp (needs tp > 1)."""
    vocab_parallel: bool = False
    """A vocabulary-sharded embedding, LM head and loss over the tp ranks (Megatron's ``VocabParallelEmbedding``,
    parallel head and ``vocab_parallel_cross_entropy``; torchtitan's ``RowwiseParallel`` embedding,
    ``ColwiseParallel`` head and ``loss_parallel()``; needs tp > 1). Off: ``parallelize_module`` on the decoder
    layers only, so embedding, head and loss are whole on every rank (the hf profile). The megatron profile and
    the step model (``trainmath.perf``) always shard the vocabulary, as Megatron does."""
    zero: int = 0
    """ZeRO stage 0-3 over the data-parallel group: 1 shards optimizer states and master weights, 2 also
    gradients, 3 also weights (Rajbhandari et al. 2020, §5)."""
    world_size: int | None = None
    """The number of GPUs, when given: must equal dp·tp·pp·cp."""
    first_stage_layers: int | None = None
    """Decoder layers on the first pipeline stage (Megatron-LM's ``--decoder-first-pipeline-num-layers``);
    None: the even split. The other stages share the rest evenly (``trainmath.placement.stage_layers``)."""
    last_stage_layers: int | None = None
    """Decoder layers on the last pipeline stage (Megatron-LM's ``--decoder-last-pipeline-num-layers``)."""

    @property
    def stage_split(self) -> tuple[int | None, int | None]:
        """(first_stage_layers, last_stage_layers): what a pipeline split reads besides pp."""
        return (self.first_stage_layers, self.last_stage_layers)

    @property
    def ranks(self) -> int:
        """dp·tp·pp·cp: the GPUs this layout needs."""
        return self.dp * self.tp * self.pp * self.cp

    @property
    def zero_degree(self) -> int:
        """Ranks that ZeRO shards dense (non-expert) state over: dp·cp (Megatron's distributed optimizer shards
        over the data-parallel group with context parallel folded in)."""
        return self.dp * self.cp

    @property
    def expert_tp(self) -> int:
        """Tensor-parallel split of each routed expert: tp when ep divides dp·cp (Megatron-Core's default), 1 when
        ep is drawn across the tensor-parallel ranks too (MoE parallel folding with expert TP 1)."""
        return self.tp if (self.dp * self.cp) % self.ep == 0 else 1

    @property
    def expert_zero_degree(self) -> int:
        """Ranks that ZeRO shards routed-expert state over: the expert data-parallel group,
        tp·dp·cp / (ep · expert_tp) (dp·cp / ep when expert TP = TP)."""
        return max(1, self.tp * self.dp * self.cp // (self.ep * self.expert_tp))

    def describe(self) -> str:
        return (f"dp={self.dp} tp={self.tp} pp={self.pp} cp={self.cp} ep={self.ep} sp={self.sp} "
                f"zero={self.zero}" + (" vocab_parallel=True" if self.vocab_parallel else "")
                + (f" first_stage_layers={self.first_stage_layers}" if self.first_stage_layers is not None else "")
                + (f" last_stage_layers={self.last_stage_layers}" if self.last_stage_layers is not None else ""))


def _divisors(n: int, flag: str) -> str:
    """The CLI fix: the values of ``flag`` that divide ``n`` (at most 8 listed)."""
    ds = [d for d in range(1, min(n, 4096) + 1) if n % d == 0]
    return f"; pass {flag} " + ", ".join(str(d) for d in ds[:8]) + (" ..." if len(ds) > 8 else "")


def layout_problems(layout: ParallelLayout, spec: ModelSpec | None = None) -> list[str]:
    """Every reason ``layout`` is impossible (for ``spec`` when given), each quoting the values; empty if fine."""
    bad: list[str] = []
    for name in ("dp", "tp", "pp", "cp", "ep"):
        v = getattr(layout, name)
        if not isinstance(v, int) or v < 1:
            bad.append(f"{name} must be a positive integer, got {v!r}")
    if layout.zero not in (0, 1, 2, 3):
        bad.append(f"zero stage must be 0, 1, 2 or 3, got {layout.zero!r}")
    if bad:  # the products below need positive integers
        return bad
    if layout.world_size is not None and layout.world_size != layout.ranks:
        bad.append(f"world size ({layout.world_size}) must equal dp·tp·pp·cp = {layout.dp}·{layout.tp}·"
                   f"{layout.pp}·{layout.cp} = {layout.ranks}")
    if layout.sp and layout.tp == 1:
        bad.append("--sp needs --tp 2 or more (sequence parallelism splits the sequence over the tensor-parallel "
                   "ranks); pass --tp N with --sp, or drop --sp")
    if layout.vocab_parallel and layout.tp == 1:
        bad.append("--vocab-parallel needs --tp 2 or more (the vocabulary is sharded over the tensor-parallel "
                   "ranks); pass --tp N with --vocab-parallel, or drop --vocab-parallel")
    if (layout.dp * layout.cp) % layout.ep and (layout.tp * layout.dp * layout.cp) % layout.ep:
        bad.append(f"ep ({layout.ep}) must divide dp·cp ({layout.dp}·{layout.cp} = {layout.dp * layout.cp}): "
                   f"expert-parallel ranks are drawn from the data/context-parallel group (or, with expert TP 1, "
                   f"tp·dp·cp = {layout.tp * layout.dp * layout.cp})")
    if spec is None:
        return bad
    if layout.pp > spec.num_layers:
        bad.append(f"pp ({layout.pp}) must not exceed the number of layers ({spec.num_layers}); pass --pp "
                   f"{spec.num_layers} or less")
    tp = layout.tp
    seen: set[str] = set()

    def need(cond: bool, msg: str) -> None:
        if not cond and msg not in seen:
            seen.add(msg)
            bad.append(msg)

    experts = set()
    tp_counts: list[int] = []  # the head counts tp must divide: one list of valid degrees for all of them
    n_before = len(bad)
    for layer in spec.layers:
        for b in layer.blocks:
            d = b.dims
            if isinstance(d, AttentionDims):
                tp_counts += [d.heads, d.kv_heads]
                need(d.heads % tp == 0, f"tp ({tp}) must divide attention heads ({d.heads})")
                need(d.kv_heads % tp == 0, f"tp ({tp}) must divide KV heads ({d.kv_heads}): a column-wise "
                                           f"k_proj/v_proj would give a rank part of a KV head (parallelize_module "
                                           f"and Megatron do not replicate KV heads)")
            elif isinstance(d, MLADims):
                tp_counts.append(d.heads)
                need(d.heads % tp == 0, f"tp ({tp}) must divide attention heads ({d.heads})")
            elif isinstance(d, LinearAttentionDims):
                tp_counts += [d.key_heads, d.value_heads]
                need(d.key_heads % tp == 0, f"tp ({tp}) must divide linear-attention key heads ({d.key_heads})")
                need(d.value_heads % tp == 0,
                     f"tp ({tp}) must divide linear-attention value heads ({d.value_heads})")
            elif isinstance(d, MambaDims):
                tp_counts += [d.heads, d.groups]
                need(d.heads % tp == 0, f"tp ({tp}) must divide Mamba heads ({d.heads})")
                need(d.groups % tp == 0, f"tp ({tp}) must divide Mamba groups ({d.groups})")
            elif isinstance(d, MoEDims):
                experts.add(d.experts)
    if tp_counts and any(n % tp for n in tp_counts) and len(bad) > n_before:
        bad[-1] += _divisors(math.gcd(*tp_counts), "--tp")
    for n in sorted(experts):
        need(n % layout.ep == 0, f"ep ({layout.ep}) must divide the routed experts ({n})" + _divisors(n, "--ep"))
    if layout.ep > 1 and not experts:
        bad.append(f"ep ({layout.ep}) > 1 but {spec.name} has no routed experts")
    return bad


def validate_layout(layout: ParallelLayout, spec: ModelSpec | None = None) -> ParallelLayout:
    """``layout`` unchanged, or one ``TrainmathError`` naming every problem with its values."""
    bad = layout_problems(layout, spec)
    if bad:
        where = f" for {spec.name}" if spec is not None else ""
        raise TrainmathError(f"impossible layout ({layout.describe()}){where}: " + "; ".join(bad))
    return layout


def zero_shard_shape(shape: tuple[int, ...], degree: int) -> tuple[int, ...]:
    """A tensor's shape on one of ``degree`` ZeRO ranks: dim 0 split with ceil_div (FSDP2's ``Shard(0)``)."""
    if degree == 1 or not shape:
        return shape
    return (ceil_div(shape[0], degree), *shape[1:])
