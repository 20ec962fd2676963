"""Compute time of one micro-batch on one rank: the FLOPs ledger's GEMMs at a shape-dependent efficiency.

Every forward GEMM of ``trainmath.flops`` (per layer type, and the LM head) is cut as the layout cuts it and timed
by :func:`gemm_time_s`:

- linear layers: tokens (m) divided by cp; the larger of k and n divided by tp (column-parallel splits the
  output, row-parallel the input, Megatron-LM; Shoeybi et al. 2019 §3) — routers are replicated over tp;
- routed experts: each rank runs its experts/ep experts on the tokens routed to them from the ep group — the
  same FLOPs as without EP (balanced routing), m = tokens·top_k·ep / experts per expert GEMM;
- attention cores, ``attention="flash"``: a flash kernel, causal blocks skipped (the ledger's ``causal="half"``
  count), heads split by tp, queries by cp, at the generation's ``attention_peak_fraction``; the backward executes
  2.5× the forward's FLOPs (FlashAttention-2, Dao 2023 §3.1: five matmuls against two, the scores recomputed).
  ``attention="eager"`` (Megatron-LM before flash attention: batched GEMMs + fused softmax + dropout): the two
  GEMMs as executed (all s², ``gemm_time_s``) plus the score tensors' HBM traffic, ``EAGER_SCORE_BYTES`` per
  score element forward and twice that backward;
- memory-bound work (norms, activation functions, residual adds, dropout): ``elementwise_bytes_per_token_per_
  hidden`` bytes per token and hidden unit per layer forward, twice that backward, at ``hbm_fraction`` of the
  bandwidth, split by tp only under sequence parallelism (Korthikanti et al. 2022 §4.2.2: without it, those ops
  are replicated on every tensor-parallel rank).

A GEMM's backward is two GEMMs of its forward's shape (input and weight gradients). Recomputation repeats the
forward of what it recomputes: ``full`` every layer (GEMMs, attention and memory-bound ops), ``selective`` the
attention core (Korthikanti et al. 2022 §5) with the ``megatron`` profile, torchtitan's op-level policy with
``hf`` (the GEMMs it does not cache, ``count_flops(recompute="selective")``, and the memory-bound ops).
"""

from __future__ import annotations

from dataclasses import dataclass

from trainmath.errors import TrainmathError
from trainmath.flops import count_flops
from trainmath.hardware import GPU, Efficiency
from trainmath.layout import ParallelLayout
from trainmath.model.spec import ModelSpec
from trainmath.perf import moe as moe_terms

FLASH_BACKWARD_FACTOR = 2.5
"""FlashAttention-2 backward / forward executed FLOPs (Dao 2023, §3.1.2: 5 matmuls vs 2)."""

EAGER_SCORE_BYTES = 11
"""HBM bytes per attention-score element in an eager forward at 16-bit (derived from the kernels Korthikanti et
al. 2022 §4.1 list): Q·Kᵀ writes the scores (2), the fused scale-mask-softmax reads them and writes the
probabilities (2 + 2), dropout reads those and writes its output and 1-byte mask (2 + 2 + 1)."""

FP8_GEMMS = ("none", "linears", "linears+head")
"""Which GEMMs run in FP8 under Transformer Engine's recipe: ``linears`` the decoder layers' weighted GEMMs
(fprop, dgrad, wgrad), ``linears+head`` those and the LM head; attention cores and norms stay in BF16."""

FP8_SHARED_INPUTS = (frozenset({"q_proj", "k_proj", "v_proj"}), frozenset({"gate_proj", "up_proj", "w1", "w3"}))
"""Linears that read one input, cast once (Megatron-Core fuses them: ``linear_qkv``, ``linear_fc1``), when they
follow each other in the ledger; any other linear casts its own input."""

FP8_CAST_TRANSPOSE_BYTES = 4
"""HBM bytes per element of one FP8 cast as Transformer Engine runs it on Hopper (its fused cast-transpose,
which also takes the tensor's amax in the same pass): read the 16-bit tensor (2), write the FP8 copy (1) and
its FP8 transpose (1) — the FP8 GEMM takes only the TN layout, so wgrad and dgrad read the transposes. Cast
once per micro-batch: each FP8 linear's input (forward; one for q, k, v and one for gate, up, Megatron's fused
linear_qkv / linear_fc1) and its output gradient (backward); once per step: each weight (TE caches the FP8
weights after the first micro-batch, ``is_first_microbatch``). The amax-history and scale update (a few
values per tensor) is not timed."""


def gemm_time_s(m: float, k: float, n: float, count: int, flops: float, gpu: GPU, eff: Efficiency,
                dtype: str = "bf16", element_bytes: int = 2, out_bytes: int | None = None) -> float:
    """Seconds for ``count`` GEMMs (m, k) @ (k, n) doing ``flops`` in total.

    Roofline (Williams, Waterman & Patterson, CACM 52(4), 2009): the slower of compute at the shape's efficiency
    ``gemm_peak_fraction · Π u(d)``, u(d) = d / (d + gemm_half_dim), and streaming the operands
    (``element_bytes`` each) and result (``out_bytes``, default ``element_bytes``) through HBM at
    ``hbm_fraction`` of its bandwidth. An FP8 GEMM is the same curve at the FP8 peak with 1-byte operands and a
    16-bit result: its ridge point doubles, so a GEMM near it gains less than the datasheet's 2×.
    """
    if flops <= 0:
        return 0.0
    h = eff.gemm_half_dim
    shape = (m / (m + h)) * (k / (k + h)) * (n / (n + h))
    compute = flops / (gpu.peak_flops_per_s(dtype) * eff.gemm_peak_fraction * shape)
    out = element_bytes if out_bytes is None else out_bytes
    memory = count * ((m * k + k * n) * element_bytes + m * n * out) / (gpu.hbm_bytes_per_s * eff.hbm_fraction)
    return max(compute, memory)


@dataclass(frozen=True, kw_only=True)
class LayerTime:
    """Seconds of one layer (or the LM head) for one micro-batch on one rank."""

    forward_s: float
    backward_s: float
    recompute_s: float
    attention_forward_s: float
    """The attention core's share of ``forward_s`` (what context-parallel exchange can hide behind)."""
    fp8_cast_bytes: float = 0.0
    """HBM bytes of the FP8 casts of one micro-batch (forward, backward and recompute; ``fp8_cast_bytes``)."""
    fp8_cast_s: float = 0.0
    """Those bytes at ``hbm_fraction`` of the bandwidth (not in forward_s/backward_s)."""
    fp8_weight_cast_bytes: float = 0.0
    """HBM bytes of casting this layer's linear weights to FP8 once per step (``FP8_WEIGHT_CAST_BYTES``)."""
    fp8_gemm_s: float = 0.0
    """Forward seconds of the GEMMs run in FP8 (their share of ``forward_s``)."""
    moe_forward_s: float = 0.0
    """An MoE layer's expert part of ``forward_s``: the routed experts' grouped GEMMs and the token permutations
    (the ``mlp`` node of Megatron-Core's combined 1F1B schedule, ``perf.step``); 0 for other layers."""
    moe_backward_s: float = 0.0
    """The same part of ``backward_s`` (dgrad and wgrad of the expert GEMMs, the permutations again)."""


_CACHES: dict[int, tuple[ModelSpec, dict]] = {}


def spec_cache(spec: ModelSpec) -> dict:
    """A memo dict for ``spec``, found by identity: hashing a whole ModelSpec costs more than the arithmetic it
    would save (a 126-layer spec hashes every tensor), and the planner asks about one spec thousands of times."""
    entry = _CACHES.get(id(spec))
    if entry is None or entry[0] is not spec:
        if len(_CACHES) > 32:
            _CACHES.clear()
        entry = _CACHES[id(spec)] = (spec, {})
    return entry[1]


def memo(spec: ModelSpec, key: tuple, make):
    cache = spec_cache(spec)
    if key not in cache:
        cache[key] = make()
    return cache[key]


def _ledger(spec: ModelSpec, micro_batch: int, seq: int, causal: str):
    return memo(spec, ("ledger", micro_batch, seq, causal),
                lambda: count_flops(spec, batch=micro_batch, seq=seq, causal=causal))


@dataclass(frozen=True)
class GemmParts:
    """Forward seconds of a GEMM list on one rank, and the HBM bytes of its FP8 casts."""

    dense: float
    attention: float
    fp8_s: float = 0.0
    cast_forward_bytes: float = 0.0
    cast_backward_bytes: float = 0.0
    weight_cast_bytes: float = 0.0


def fp8_speedup(m: float, k: float, n: float, gpu: GPU, eff: Efficiency, out_bytes: int = 2) -> float:
    """BF16 time / FP8 time of one (m, k) @ (k, n) GEMM on ``gpu``: 2× (the datasheet ratio) where both are
    compute-bound, less where the FP8 GEMM meets the HBM roofline."""
    flops = 2 * m * k * n
    return (gemm_time_s(m, k, n, 1, flops, gpu, eff, "bf16", 2)
            / gemm_time_s(m, k, n, 1, flops, gpu, eff, "fp8", 1, out_bytes))


def _gemm_parts(gemms, layout: ParallelLayout, experts: int, gpu: GPU, eff: Efficiency, dtype: str, c: int,
                attention: str = "flash", fp8: bool = False, imbalance: float = 1.0) -> GemmParts:
    tp, cp, ep = layout.tp, layout.cp, layout.ep
    dense = attn = fp8_s = cast_f = cast_b = cast_w = 0.0
    last_input = None
    for g in gemms:
        if g.component == "attention_core":
            last_input = None
        if g.component == "attention_core" and attention == "flash":
            attn += g.flops / (tp * cp) / (gpu.peak_flops_per_s(dtype) * eff.attention_peak_fraction)
            continue
        if g.component == "attention_core":  # eager: (count/tp) batched GEMMs of queries s/cp
            attn += gemm_time_s(g.m / cp, g.k, g.n, g.count // tp, g.flops / (tp * cp), gpu, eff, dtype, c)
            if g.name.endswith("scores"):
                scores = g.count / tp * g.m / cp * g.n
                attn += scores * EAGER_SCORE_BYTES / (gpu.hbm_bytes_per_s * eff.hbm_fraction)
            continue
        split_tp = 1 if g.component == "router" else tp
        m = g.m / cp
        if g.component == "experts" and experts:  # expert TP 1: each rank routes its 1/tp of the sequence
            split_tp = layout.expert_tp
            m = g.m * ep / experts / cp / (tp // split_tp)
        k, n = (g.k / split_tp, g.n) if g.k >= g.n else (g.k, g.n / split_tp)
        count = g.count if g.component != "experts" else max(1, experts // ep)
        flops = g.flops / ((tp if g.component == "experts" and experts else split_tp) * cp)
        routed = g.component == "experts" and experts
        if fp8 and g.weighted:
            t = (moe_terms.expert_gemm_time_s(m, k, n, count, flops, gpu, eff, "fp8", 1, c, imbalance) if routed
                 else gemm_time_s(m, k, n, count, flops, gpu, eff, "fp8", 1, c))
            fp8_s += t
            dense += t
            leaf = g.name.rsplit(".", 1)[-1]
            group = next((i for i, names in enumerate(FP8_SHARED_INPUTS) if leaf in names), None)
            key = None if group is None else (group, g.component, m, k, count)
            busy = imbalance if routed else 1.0
            if key is None or key != last_input:
                cast_f += FP8_CAST_TRANSPOSE_BYTES * count * m * k * busy
            last_input = key
            cast_b += FP8_CAST_TRANSPOSE_BYTES * count * m * n * busy
            cast_w += FP8_CAST_TRANSPOSE_BYTES * count * k * n
            continue
        last_input = None
        dense += (moe_terms.expert_gemm_time_s(m, k, n, count, flops, gpu, eff, dtype, c, imbalance=imbalance)
                  if routed else gemm_time_s(m, k, n, count, flops, gpu, eff, dtype, c))
    return GemmParts(dense, attn, fp8_s, cast_f, cast_b, cast_w)


def layer_times(spec: ModelSpec, *, micro_batch: int, seq: int, layout: ParallelLayout, gpu: GPU,
                eff: Efficiency, recompute: str, dtype: str = "bf16", compute_bytes: int = 2,
                attention: str = "flash", profile: str = "megatron",
                fp8: str = "none", moe_imbalance: float = 1.0) -> tuple[dict[int, LayerTime], LayerTime]:
    """(layer index → its time, the LM head's time) for one micro-batch of ``micro_batch`` × ``seq`` tokens.
    ``profile`` names whose selective recompute is timed: ``megatron`` Korthikanti et al.'s (the attention core),
    ``hf`` torchtitan's op-level policy (the GEMMs it recomputes, ``LayerGemms.selective``, and every
    memory-bound op, none being in its save list). ``fp8`` (``FP8_GEMMS``) names the GEMMs run in FP8 at the
    FP8 peak, with their casts (``FP8_CAST_TRANSPOSE_BYTES``). ``moe_imbalance``: the busiest EP rank's routed
    tokens / the mean (``trainmath.perf.moe``); MoE layers also pay their permutations and router there."""
    if fp8 not in FP8_GEMMS:
        raise TrainmathError(f"fp8 GEMMs must be one of {', '.join(FP8_GEMMS)}, got {fp8!r}")
    key = ("layers", micro_batch, seq, layout.tp, layout.cp, layout.ep, layout.expert_tp, layout.sp, gpu, eff,
           recompute, dtype,
           compute_bytes, attention, profile, fp8, moe_imbalance)
    return memo(spec, key, lambda: _layer_times(spec, micro_batch, seq, layout, gpu, eff, recompute, dtype,
                                                compute_bytes, attention, profile, fp8, moe_imbalance))


def _cast_s(nbytes: float, gpu: GPU, eff: Efficiency) -> float:
    return nbytes / (gpu.hbm_bytes_per_s * eff.hbm_fraction)


def _layer_times(spec, micro_batch, seq, layout, gpu, eff, recompute, dtype, compute_bytes, attention,
                 profile="megatron", fp8="none", imbalance=1.0):
    ledger = _ledger(spec, micro_batch, seq, "half" if attention == "flash" else "executed")
    tokens = micro_batch * seq / layout.cp
    elem_split = layout.tp if layout.sp else 1
    elem_fwd = (eff.elementwise_bytes_per_token_per_hidden * tokens * spec.hidden_size / elem_split
                / (gpu.hbm_bytes_per_s * eff.hbm_fraction))
    lin8 = fp8 != "none"
    per_layer: dict[int, LayerTime] = {}
    for lt in ledger.layer_types:
        block = next((b for b in spec.layers[lt.layers[0]].blocks if b.kind == "moe"), None)
        experts = block.dims.experts if block else 0
        p = _gemm_parts(lt.gemms, layout, experts, gpu, eff, dtype, compute_bytes, attention, lin8, imbalance)
        dense, attn = p.dense, p.attention
        if block:  # permutations and router: memory-bound, forward and again backward
            routed_tokens = tokens / (layout.tp // layout.expert_tp)  # expert TP 1: this rank's 1/tp
            elem = moe_terms.dispatch_memory_s(moe_terms.dispatch_bytes(
                routed_tokens, block.dims.top_k, spec.hidden_size, experts, compute_bytes, imbalance), gpu, eff)
            routed = _gemm_parts([g for g in lt.gemms if g.component == "experts"], layout, experts, gpu, eff,
                                 dtype, compute_bytes, attention, lin8, imbalance).dense
            clamp_f, clamp_b = (moe_terms.clamp_bytes(routed_tokens, block.dims.top_k,
                                                      block.dims.expert_intermediate // layout.expert_tp,
                                                      compute_bytes, imbalance)
                                if block.dims.activation_clamp else (0.0, 0.0))
            elem_f = elem + moe_terms.dispatch_memory_s(clamp_f, gpu, eff)
            elem_b = elem + moe_terms.dispatch_memory_s(clamp_b, gpu, eff)
        else:
            elem_f = elem_b = routed = 0.0
        fwd = dense + attn + elem_fwd + elem_f
        bwd = 2 * dense + (FLASH_BACKWARD_FACTOR if attention == "flash" else 2) * attn + 2 * elem_fwd + elem_b
        rec = {"none": 0.0, "selective": attn, "full": fwd}[recompute]
        rec_cast = p.cast_forward_bytes if recompute == "full" else 0.0
        if recompute == "selective" and profile == "hf":
            if not lt.selective:
                raise TrainmathError(f"--recompute selective with the hf profile times torchtitan's op-level "
                                     f"policy over the op lists; {spec.name} ({spec.model_type}) has none: use "
                                     f"--profile megatron")
            again = [g for g, run in zip(lt.gemms, lt.selective) if run]
            sel = _gemm_parts(again, layout, experts, gpu, eff, dtype, compute_bytes, attention, lin8, imbalance)
            rec = sel.dense + sel.attention + elem_fwd
            rec_cast = sel.cast_forward_bytes
        cast = p.cast_forward_bytes + p.cast_backward_bytes + rec_cast
        t = LayerTime(forward_s=fwd, backward_s=bwd, recompute_s=rec, attention_forward_s=attn,
                      fp8_cast_bytes=cast, fp8_cast_s=_cast_s(cast, gpu, eff),
                      fp8_weight_cast_bytes=p.weight_cast_bytes, fp8_gemm_s=p.fp8_s,
                      moe_forward_s=routed + elem_f, moe_backward_s=2 * routed + elem_b)
        for i in lt.layers:
            per_layer[i] = t
    h = _gemm_parts(ledger.head, layout, 0, gpu, eff, dtype, compute_bytes, fp8=fp8 == "linears+head")
    cast = h.cast_forward_bytes + h.cast_backward_bytes
    head = LayerTime(forward_s=h.dense, backward_s=2 * h.dense, recompute_s=0.0, attention_forward_s=0.0,
                     fp8_cast_bytes=cast, fp8_cast_s=_cast_s(cast, gpu, eff),
                     fp8_weight_cast_bytes=h.weight_cast_bytes, fp8_gemm_s=h.fp8_s)
    return per_layer, head
