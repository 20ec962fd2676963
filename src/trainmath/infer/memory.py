"""Inference memory on one rank: weights + cache (+ an explicit workspace), and what fits a GPU.

An instance runs on ``gpus`` ranks (default ``tp``): dense and attention weights split over ``tp`` ranks and
replicated ``gpus / tp`` times (attention data parallel, each replica holding ``⌈batch / replicas⌉`` sequences of
the cache), routed experts split over ``ep`` ranks (``trainmath.infer.weights``). Every figure is per rank.

total = weights (serving format, TP shard) + cache after a prefill of ``context`` tokens for ``batch`` sequences
+ ``workspace_bytes`` (activations and scratch of the forward pass: an explicit input, 0 by default, because it
depends on the engine's chunked-prefill and CUDA-graph settings, not on the model).

Fitting a GPU: the one fit rule of every command (``trainmath.usable``): usable = ⌊memory_bytes ·
mem_util_percent / 100⌋ − the CUDA context (``--mem-util 90`` is vLLM's ``gpu_memory_utilization`` default);
free = usable − total. The largest
batch at the given context is exact because the cache is linear in the batch: ⌊(usable − weights − workspace) /
cache(batch=1)⌋. The largest context at the given batch is an exact integer search over the monotone cache size
(unbounded when no layer's cache grows with the context: only sliding-window and recurrent layers).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from trainmath.errors import TrainmathError
from trainmath.hardware import GPU
from trainmath.infer.dtypes import WeightFormat
from trainmath.infer.kv import CacheFormat, cache_tree, grows_with_context, kv_bytes_per_token
from trainmath.infer.weights import validate_tp, weights_tree
from trainmath.model.spec import ModelSpec
from trainmath.tree import Node
from trainmath.usable import MEM_UTIL_PERCENT, check_mem_util, rule_text, usable_bytes


@dataclass(frozen=True, kw_only=True, slots=True)
class InferenceSetup:
    batch: int
    """Sequences held in the cache at once."""
    context: int
    """Tokens per sequence held after the prefill (prompt + generated so far)."""
    weights: WeightFormat = field(default_factory=WeightFormat)
    cache: CacheFormat = field(default_factory=CacheFormat)
    tp: int = 1
    """Tensor-parallel degree of attention and dense weights: every figure is per rank."""
    workspace_bytes: int = 0
    """Activation workspace and scratch per rank, added to the total as given."""
    ep: int = 1
    """Expert-parallel degree: routed experts split over ``ep`` ranks (must divide ``gpus``)."""
    gpus: int | None = None
    """GPUs of one serving instance; None means ``tp``. ``gpus / tp`` attention replicas share the batch."""

    def __post_init__(self) -> None:
        bad = [f"{k} ({v})" for k, v in (("batch", self.batch), ("context", self.context), ("tp", self.tp),
                                         ("ep", self.ep), ("gpus", self.ranks)) if v <= 0]
        if bad:
            raise TrainmathError(f"{' and '.join(bad)} must be positive")
        if self.workspace_bytes < 0:
            raise TrainmathError(f"workspace bytes must not be negative, got {self.workspace_bytes}")
        for flag, degree in (("--tp", self.tp), ("--ep", self.ep)):
            if self.ranks % degree:
                raise TrainmathError(f"{flag} {degree} must divide --gpus {self.ranks}")

    @property
    def ranks(self) -> int:
        """GPUs of the instance."""
        return self.tp if self.gpus is None else self.gpus

    @property
    def replicas(self) -> int:
        """Attention replicas: ranks / tp, each with its share of the batch."""
        return self.ranks // self.tp

    @property
    def batch_per_rank(self) -> int:
        """Sequences whose cache one rank holds: ⌈batch / replicas⌉."""
        return -(-self.batch // self.replicas)


@dataclass(frozen=True, kw_only=True, slots=True)
class Fit:
    """How a setup fits one GPU (per rank)."""

    gpu: str
    memory_bytes: int
    mem_util_percent: int
    usable_bytes: int
    free_bytes: int
    """usable − total; negative when the setup does not fit."""
    max_batch: int
    """Largest batch at the given context that fits (0: not even one sequence)."""
    max_context: int | None
    """Largest context at the given batch that fits (0: none; None: unbounded, no cache grows with context)."""
    max_position_embeddings: int
    weights_fit: bool = True
    """Whether the weights (and workspace) alone fit the usable memory."""
    levers: tuple[str, ...] = ()
    """When the setup does not fit: changes that would make it fit, each checked by recomputing."""

    @property
    def fits(self) -> bool:
        return self.free_bytes >= 0

    @property
    def usable_context(self) -> int:
        """The largest context the model can serve at the batch: what the memory holds (``max_context``), capped
        at ``max_position_embeddings`` (positions past it are outside what the model was configured for)."""
        if self.max_context is None:
            return self.max_position_embeddings
        return min(self.max_context, self.max_position_embeddings)

    def to_dict(self) -> dict:
        return {"gpu": self.gpu, "memory_bytes": self.memory_bytes, "mem_util_percent": self.mem_util_percent,
                "usable_bytes": self.usable_bytes, "free_bytes": self.free_bytes, "fits": self.fits,
                "max_batch": self.max_batch, "max_context": self.max_context,
                "max_context_exceeds_max_position_embeddings":
                    None if self.max_context is None else self.max_context > self.max_position_embeddings,
                "usable_context": self.usable_context, "max_position_embeddings": self.max_position_embeddings,
                "weights_fit": self.weights_fit, "levers": list(self.levers)}


@dataclass(frozen=True, kw_only=True, slots=True)
class InferenceReport:
    model: str
    setup: InferenceSetup
    weights: Node
    kv_cache: Node
    total: Node
    kv_bytes_per_token: int
    """Cache bytes each further token adds per sequence once sliding windows are full (full attention + MLA)."""
    fit: Fit | None
    conventions: tuple[str, ...]

    @property
    def weights_bytes(self) -> int:
        return self.weights.value

    @property
    def kv_cache_bytes(self) -> int:
        return self.kv_cache.value

    @property
    def total_bytes(self) -> int:
        return self.total.value

    def to_dict(self) -> dict:
        s = self.setup
        return {
            "model": self.model, "batch": s.batch, "context": s.context, "tp": s.tp, "ep": s.ep, "gpus": s.ranks,
            "batch_per_rank": s.batch_per_rank,
            "dtype": s.weights.dtype, "kv_dtype": s.cache.kv_dtype,
            "weights_bytes": self.weights_bytes, "kv_cache_bytes": self.kv_cache_bytes,
            "workspace_bytes": s.workspace_bytes, "total_bytes": self.total_bytes,
            "kv_cache_bytes_per_token": self.kv_bytes_per_token,
            "kv_cache_bytes_per_sequence": self.kv_cache_bytes // s.batch,
            "weights": self.weights.to_dict(), "kv_cache": self.kv_cache.to_dict(),
            "fit": self.fit.to_dict() if self.fit else None,
            "per": "rank" if s.ranks > 1 else "device",
            "conventions": list(self.conventions),
        }


def _cache(spec: ModelSpec, setup: InferenceSetup, *, batch: int, context: int) -> Node:
    return cache_tree(spec, batch=batch, context=context, fmt=setup.cache, tp=setup.tp)


def max_batch(spec: ModelSpec, setup: InferenceSetup, *, room_bytes: int) -> int:
    """Largest batch of the instance whose cache at ``setup.context`` fits in ``room_bytes`` on each rank (cache
    is linear in the batch; each of the ``replicas`` attention replicas holds its share)."""
    per_seq = _cache(spec, setup, batch=1, context=setup.context).value
    if room_bytes < 0:
        return 0
    return (room_bytes // per_seq) * setup.replicas if per_seq else 1 << 62


def max_context(spec: ModelSpec, setup: InferenceSetup, *, room_bytes: int) -> int | None:
    """Largest context whose cache at ``setup.batch`` fits in ``room_bytes``: exact search over a cache size that
    never decreases with the context. None when no layer's cache grows with the context."""
    def size(c: int) -> int:
        return _cache(spec, setup, batch=setup.batch_per_rank, context=c).value

    if room_bytes < 0 or size(1) > room_bytes:
        return 0
    if not grows_with_context(spec, setup.cache):
        return None
    lo, hi = 1, 2
    while size(hi) <= room_bytes:  # size(lo) fits, size(hi) does not
        lo, hi = hi, hi * 2
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if size(mid) <= room_bytes else (lo, mid)
    return lo


def has_routed_experts(spec: ModelSpec) -> bool:
    return any(t.experts for layer in spec.layers for t in layer.tensors)


def _weights(spec: ModelSpec, setup: InferenceSetup) -> Node:
    return weights_tree(spec, fmt=setup.weights, tp=setup.tp, ep=setup.ep, gpus=setup.ranks)


def _levers(spec: ModelSpec, setup: InferenceSetup, usable: int) -> tuple[str, ...]:
    """Changes that make ``setup`` fit ``usable`` bytes per rank, each checked by recomputing: a smaller weight
    format, a smaller KV format, more GPUs (tensor parallel, or expert parallel for MoE), a smaller batch."""
    from dataclasses import replace

    def total(**changes) -> int | None:
        """Bytes per rank of ``setup`` with ``changes``, or None when that setup cannot be built."""
        try:
            s = replace(setup, **changes)
            validate_tp(spec, s.tp)
            return (_weights(spec, s).value + _cache(spec, s, batch=s.batch_per_rank, context=s.context).value
                    + s.workspace_bytes)
        except TrainmathError:
            return None

    def fitting(t: int | None) -> bool:
        return t is not None and t <= usable

    out = []
    if setup.weights.dtype not in ("int4", "mxfp4", "nvfp4"):
        for dtype in ("fp8", "mxfp4", "int4") if has_routed_experts(spec) else ("fp8", "int4"):
            t = total(weights=replace(setup.weights, dtype=dtype, skip_modules=(), source="given"))
            if dtype != setup.weights.dtype and fitting(t):
                out.append(f"--dtype {dtype} ({t:,} bytes per rank)")
                break
    if setup.cache.kv_dtype not in ("fp8", "int8") and fitting(t := total(cache=replace(setup.cache, kv_dtype="fp8"))):
        out.append(f"--kv-dtype fp8 ({t:,} bytes per rank)")
    for n in (setup.ranks * 2**k for k in range(1, 11)):
        tries = [(f"--gpus {n} --tp {n}", total(tp=n, gpus=n, ep=1))]
        if has_routed_experts(spec):
            tries.append((f"--gpus {n} --tp {setup.tp} --ep {n}", total(gpus=n, ep=n)))
        found = [f"{flags} ({t:,} bytes per rank)" for flags, t in tries if fitting(t)]
        if found:
            out.extend(found)
            break
    if setup.batch > 1 and fitting(total(batch=1)):
        room = usable - _weights(spec, setup).value - setup.workspace_bytes
        out.append(f"--batch {min(max_batch(spec, setup, room_bytes=room), setup.batch - 1)}")
    return tuple(out)


def infer_memory(spec: ModelSpec, setup: InferenceSetup, *, gpu: GPU | None = None,
                 mem_util_percent: int = MEM_UTIL_PERCENT) -> InferenceReport:
    """Weights, cache and total bytes on one rank, and how they fit ``gpu`` when given."""
    validate_tp(spec, setup.tp)
    if setup.ep > 1 and not has_routed_experts(spec):
        raise TrainmathError(f"--ep {setup.ep}: {spec.name} has no routed experts to split")
    check_mem_util(mem_util_percent)
    weights = _weights(spec, setup)
    cache = _cache(spec, setup, batch=setup.batch_per_rank, context=setup.context)
    parts = [weights, cache]
    if setup.workspace_bytes:
        parts.append(Node(name="workspace", value=setup.workspace_bytes, unit="bytes"))
    total = Node.of("total", parts, "bytes")
    fit = None
    if gpu is not None:
        usable = usable_bytes(gpu.memory_bytes, mem_util_percent)
        room = usable - weights.value - setup.workspace_bytes
        fits = usable >= total.value
        fit = Fit(gpu=gpu.name, memory_bytes=gpu.memory_bytes, mem_util_percent=mem_util_percent,
                  usable_bytes=usable, free_bytes=usable - total.value,
                  max_batch=max_batch(spec, setup, room_bytes=room),
                  max_context=max_context(spec, setup, room_bytes=room),
                  max_position_embeddings=spec.max_position_embeddings, weights_fit=room >= 0,
                  levers=() if fits else _levers(spec, setup, usable))
    layout = (f"per rank of {setup.ranks} GPUs: tp {setup.tp}, ep {setup.ep}, {setup.replicas} attention "
              f"replica(s) of {setup.batch_per_rank} sequence(s) each") if setup.ranks > 1 else "one device"
    conventions = (
        layout,
        setup.weights.convention(),
        *setup.cache.conventions(),
        f"workspace: {setup.workspace_bytes:,} bytes given (activations are not estimated here)",
        *((rule_text(gpu.memory_bytes, mem_util_percent),) if gpu else ()),
    )
    return InferenceReport(model=spec.name, setup=setup, weights=weights, kv_cache=cache, total=total,
                           kv_bytes_per_token=kv_bytes_per_token(spec, fmt=setup.cache, tp=setup.tp), fit=fit,
                           conventions=conventions)
