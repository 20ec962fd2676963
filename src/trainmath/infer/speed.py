"""Serving speed of one instance: the time of one forward step as the largest of three bounds, and the TTFT, TPOT
and throughput of a fixed batch. Pure: no torch, no I/O beyond the GPU presets.

A step runs ``parts``: groups of ``n`` sequences each adding ``t`` new tokens after ``c`` cached ones (a prefill is
t = I, c = 0; a decode step t = 1, c = the context so far). On one rank of the instance:

- **compute**: FLOPs / (peak · compute efficiency). The FLOPs are the op lists' forward fold (``flops.model``) of
  the new tokens only: Σ n · [F(c + t) − F(c)] with F(s) the forward FLOPs of one sequence of s tokens under the
  causal ``half`` convention (the pairs a causal flash kernel computes), minus the LM head of all but the last new
  token of each sequence (engines compute logits only where a token is sampled); divided evenly over the ranks
  (tensor parallel splits every GEMM, attention data parallel the batch, expert parallel the experts: balanced
  routing assumed); MLA decode in the absorbed form (``absorbed_extra``). The peak is the dense tensor-core
  peak of the kernel format, from the preset's native formats (``hardware/serving.json``): fp8 weights run fp8
  GEMMs where fp8 is native (W8A8), nvfp4/mxfp4 weights fp4 GEMMs where fp4 is native (Blackwell), every other
  case the bf16 peak (4-bit weights are dequantised inside W4A16 kernels, Marlin-style: their gain is in bytes,
  not FLOPs);
- **memory**: bytes read and written / (HBM bandwidth · memory efficiency): the rank's weights in their serving
  format (``infer.weights``) — routed experts only for the share the step's tokens touch, E·[1 − (1 − k/E)^T]
  of E experts for T tokens routing to k each (uniform routing), the input embedding table not at all (one row
  per token), a tied one once as the LM head — plus the cache each sequence reads (``infer.kv``: the cache after
  c tokens, capped windows and constant recurrent states included) and the cache the new tokens write;
- **communication**: under tensor parallelism 2 all-reduces per layer of the step's hidden states (bf16), a ring
  of p ranks taking 2(p − 1)/p · bytes / link + 2(p − 1)·α; under expert parallelism 2 all-to-alls per MoE layer
  (dispatch and combine) of each rank's tokens × k × hidden, (ep − 1)/ep of it leaving the rank.

- **overhead**: a fixed time per forward step (kernel launches or CUDA-graph replay, scheduling, sampling) plus
  one per decoder layer per step, constants of the GPU generation (``hardware/serving.json``); it dominates
  batch-1 decode of small models.

The compute and memory bounds are taken per kernel class, because the kernels of a step run one after the other:
the routed-expert GEMMs (their FLOPs against the expert weights the step touches), the other GEMMs (attention
projections, dense MLPs, shared experts, LM head against their weights) and the attention cores (score and
value FLOPs, at the bf16 peak unless the cache is fp8 on a GPU that runs fp8, against the cache they stream). An
MLA decode at a large batch is compute-bound in attention (the absorbed form shares the latent across heads)
while its MoE GEMMs are memory-bound; a replica prefilling a prompt under attention data parallelism is
compute-bound in its own projections while the routed experts stay memory-bound; one max over the whole step
would overlap them.

step = ‖other GEMM compute, other weight bytes‖ + ‖expert compute, expert bytes touched‖
       + ‖attention compute, cache bytes‖ + communication + overhead,

‖c, m‖ = (c^p + m^p)^(1/p) with p = ``overlap_norm`` (``hardware/serving.json``, global): a kernel's math and its
memory traffic overlap imperfectly, most visibly near the ridge, where the two are about equal (a batch-1 prefill
of 128 tokens of a 7B model on A100); far from the ridge the norm is the larger of the two. The floor is the
roofline itself: efficiency 1, p = ∞ (the larger), no overhead. The compute and memory efficiencies and the two
overheads are per GPU generation, fitted by ``benchmarks/serving_calibrate.py`` to published serving runs and
stored in ``hardware/serving.json``; the link efficiency is the generation's ``link_fraction`` (``gpus.json``).
"""

from __future__ import annotations

import functools
import json
import math
from dataclasses import dataclass, replace
from functools import lru_cache
from importlib import resources

from trainmath.errors import TrainmathError
from trainmath.hardware import GPU, presets
from trainmath.infer.memory import InferenceSetup
from trainmath.model.spec import ModelSpec

ACT_BYTES = 2
"""Hidden states on the wire and in activations: bf16."""


@lru_cache(maxsize=1)
def serving_data() -> dict:
    """``hardware/serving.json``: per-generation serving constants and per-preset native formats."""
    return json.loads(resources.files("trainmath.hardware").joinpath("serving.json").read_text(encoding="utf-8"))


@dataclass(frozen=True, kw_only=True, slots=True)
class Efficiency:
    """Achieved fractions of peak and fixed overheads the prediction uses (1 and 0: the physical floor)."""

    compute: float
    memory: float
    link: float
    step_s: float = 0.0
    """Fixed time of every forward step (launches, scheduler, sampling)."""
    layer_s: float = 0.0
    """Fixed time per decoder layer per step."""
    overlap: float = math.inf
    """p of the p-norm that joins a kernel class's compute and memory times (``combine``); ∞: the larger."""

    @classmethod
    def of(cls, gpu: GPU) -> Efficiency:
        e = presets().efficiency(gpu)
        g = serving_data()["generations"].get(gpu.generation)
        if g is None:
            return cls(compute=e.gemm_peak_fraction, memory=e.hbm_fraction, link=e.link_fraction)
        return cls(compute=g["prefill_compute_fraction"], memory=g["decode_memory_fraction"], link=e.link_fraction,
                   step_s=g["step_overhead_s"], layer_s=g["layer_overhead_s"], overlap=overlap_norm())

    def overhead_s(self, layers: int) -> float:
        """Fixed time of one forward step of a model of ``layers`` decoder layers: step_s + layers · layer_s."""
        return self.step_s + layers * self.layer_s


FLOOR = Efficiency(compute=1.0, memory=1.0, link=1.0)


def overlap_norm() -> float:
    """The global ``overlap_norm`` of ``hardware/serving.json`` (chosen there by leave-one-source-out error)."""
    return float(serving_data()["overlap_norm"]["p"])


def combine(compute_s: float, memory_s: float, p: float) -> float:
    """Time of a kernel class doing ``compute_s`` of math and ``memory_s`` of memory traffic: (c^p + m^p)^(1/p),
    the larger of the two when p is infinite (the roofline)."""
    if math.isinf(p):
        return max(compute_s, memory_s)
    return (compute_s ** p + memory_s ** p) ** (1 / p)


@dataclass(frozen=True, kw_only=True, slots=True)
class Part:
    """``n`` sequences each adding ``t`` new tokens after ``c`` cached ones."""

    n: int
    t: int
    c: int


@dataclass(frozen=True, kw_only=True, slots=True)
class Step:
    """One forward step on one rank: its work and the time of each bound (seconds)."""

    flops: float
    """FLOPs on one rank."""
    bytes: float
    """Bytes read and written on one rank (weights touched, cache read, cache written)."""
    weight_bytes: float
    cache_bytes: float
    comm_bytes: float
    compute_s: float
    """GEMM and attention compute together."""
    memory_s: float
    """Weight and cache streaming together."""
    comm_s: float
    overhead_s: float = 0.0
    """Fixed per-step and per-layer time (``Efficiency.overhead_s``)."""
    attention_compute_s: float = 0.0
    """The attention cores' share of ``compute_s``."""
    cache_memory_s: float = 0.0
    """The cache's share of ``memory_s``."""
    expert_compute_s: float = 0.0
    """The routed-expert GEMMs' share of ``compute_s``."""
    expert_memory_s: float = 0.0
    """The routed-expert weights' share of ``memory_s``."""
    overlap: float = math.inf
    """p of ``combine`` (``Efficiency.overlap``)."""

    @property
    def time_s(self) -> float:
        p = self.overlap
        other = combine(self.compute_s - self.attention_compute_s - self.expert_compute_s,
                        self.memory_s - self.cache_memory_s - self.expert_memory_s, p)
        return (other + combine(self.expert_compute_s, self.expert_memory_s, p)
                + combine(self.attention_compute_s, self.cache_memory_s, p) + self.comm_s + self.overhead_s)

    @property
    def bound(self) -> str:
        if self.overhead_s > max(self.compute_s, self.memory_s, self.comm_s):
            return "overhead"
        if self.comm_s > max(self.compute_s, self.memory_s):
            return "communication"
        return "compute" if self.compute_s >= self.memory_s else "memory"

    def to_dict(self) -> dict:
        return {"time_s": self.time_s, "bound": self.bound, "compute_s": self.compute_s, "memory_s": self.memory_s,
                "communication_s": self.comm_s, "overhead_s": self.overhead_s,
                "attention_compute_s": self.attention_compute_s, "cache_memory_s": self.cache_memory_s,
                "expert_compute_s": self.expert_compute_s, "expert_memory_s": self.expert_memory_s,
                "flops_per_rank": self.flops,
                "bytes_per_rank": self.bytes,
                "weight_bytes_per_rank": self.weight_bytes, "cache_bytes_per_rank": self.cache_bytes,
                "comm_bytes_per_rank": self.comm_bytes}


_SPECS: dict[int, tuple[ModelSpec, dict]] = {}
"""Per model spec (by identity), what the step functions computed for it."""


def per_spec(fn):
    """Memoise ``fn(spec, *args)`` by the spec's identity and the (small, hashable) other arguments. A ModelSpec
    is a deep frozen tree whose hash walks every layer and tensor; ``functools.lru_cache`` keyed on it hashed it
    at every call, which was most of ``infer-plan``'s time (thousands of steps). The entry holds the spec
    itself, so its id cannot be reused while the entry lives; at most 32 specs and 65,536 results per spec are
    kept."""

    @functools.wraps(fn)
    def memoised(spec: ModelSpec, *args):
        hit = _SPECS.get(id(spec))
        if hit is None or hit[0] is not spec:
            if len(_SPECS) >= 32:
                _SPECS.clear()
            hit = _SPECS[id(spec)] = (spec, {})
        key = (fn.__name__, *args)
        memo = hit[1]
        if key not in memo:
            if len(memo) >= 1 << 16:  # a long-lived server pricing many layouts: start afresh
                memo.clear()
            memo[key] = fn(spec, *args)
        return memo[key]

    return memoised


@per_spec
def _forward(spec: ModelSpec, seq: int) -> tuple[int, int]:
    """(forward FLOPs of one sequence of ``seq`` tokens, LM-head FLOPs per token) under causal ``half``."""
    from trainmath.flops.model import count_flops

    r = count_flops(spec, batch=1, seq=seq, causal="half")
    return r.forward.value, sum(g.flops for g in r.head) // seq


def new_token_flops(spec: ModelSpec, part: Part) -> int:
    """Forward FLOPs of ``part``'s new tokens on the whole instance (logits of the last new token only); a decode
    token (t = 1) of an MLA layer in the absorbed form (``absorbed_extra``)."""
    total, head = _forward(spec, part.c + part.t)
    before = _forward(spec, part.c)[0] if part.c else 0
    extra = absorbed_extra(spec, part.c + 1) if part.t == 1 else 0
    return part.n * (total - before - head * (part.t - 1) + extra)


def attention_flops(spec: ModelSpec, part: Part) -> int:
    """The attention cores' share of ``new_token_flops``: the total less the linear FLOPs, which do not depend on
    the context: n · [t · (L − head) + head], L = 2·F(c=0) − F(c=1) the linear FLOPs of one token (F(c) a decode
    token's FLOPs after c cached ones: its attention grows by one pair per cached token)."""
    one = 2 * new_token_flops(spec, Part(n=1, t=1, c=0)) - new_token_flops(spec, Part(n=1, t=1, c=1))
    head = _forward(spec, 1)[1]
    return max(new_token_flops(spec, part) - part.n * (part.t * (one - head) + head), 0)


@per_spec
def _mla_layers(spec: ModelSpec) -> tuple[tuple[int, int, int, int], ...]:
    """(heads, kv_lora_rank, qk_nope_head_dim, v_head_dim) of every MLA layer."""
    return tuple((b.dims.heads, b.dims.kv_lora_rank, b.dims.qk_nope_head_dim, b.dims.v_head_dim)
                 for layer, idx in spec.layer_groups() for b in layer.blocks if b.kind == "mla" for _ in idx)


def absorbed_extra(spec: ModelSpec, pairs: int) -> int:
    """FLOPs a decode token of MLA's absorbed form (DeepSeek-V2 §2.1.2, W_UK folded into the query and W_UV into
    the output, as vLLM and SGLang decode) adds to the op list's per-head form, over ``pairs`` cached positions:
    scores against the latent and rotary key (d_c + d_R per head instead of d_nope + d_R) and values of d_c
    instead of d_v, i.e. 2·h·pairs·(2·d_c − d_nope − d_v) per layer; the absorbed projections cost what
    kv_b_proj costs per token, so they cancel."""
    return sum(2 * h * pairs * (2 * c - nope - v) for h, c, nope, v in _mla_layers(spec))


@per_spec
def _moe(spec: ModelSpec) -> tuple[int, int, int]:
    """(routed experts E, experts per token k, MoE layers); (0, 0, 0) for a dense model."""
    from trainmath.ops.emit import layer_top_k

    experts = k = layers = 0
    for layer, idx in spec.layer_groups():
        e = max((t.experts for t in layer.tensors), default=0)
        if e:
            experts, k, layers = e, layer_top_k(layer) or 1, layers + len(idx)
    return experts, k, layers


def touched_fraction(experts: int, k: int, tokens: int) -> float:
    """Expected share of E experts that T tokens, each routed uniformly to k of them, touch: 1 − (1 − k/E)^T."""
    return 1.0 - (1.0 - k / experts) ** tokens if experts else 1.0


def _weights(spec: ModelSpec, setup: InferenceSetup) -> tuple[int, int]:
    """(weight bytes one rank reads per step besides routed experts, routed-expert bytes on the rank)."""
    return _weight_parts(spec, setup.weights, setup.tp, setup.ep, setup.ranks)


@per_spec
def _weight_parts(spec: ModelSpec, fmt, tp: int, ep: int, gpus: int) -> tuple[int, int]:
    from trainmath.infer.weights import weights_tree

    tree = weights_tree(spec, fmt=fmt, tp=tp, ep=ep, gpus=gpus)
    parts = {c.name: c.value for c in tree.children}
    experts = parts.pop("experts", 0)
    if "lm_head" in parts:  # untied: the input table is looked up, one row per token
        parts.pop("embed_tokens", None)
    return sum(parts.values()), experts


def _cache(spec: ModelSpec, setup: InferenceSetup, n: int, c: int) -> int:
    if c <= 0 or n <= 0:
        return 0
    return _cache_bytes(spec, setup.cache, setup.tp, n, c)


@per_spec
def _cache_bytes(spec: ModelSpec, fmt, tp: int, n: int, c: int) -> int:
    from trainmath.infer.kv import cache_tree

    return cache_tree(spec, batch=n, context=c, fmt=fmt, tp=tp).value


def native_formats(gpu: GPU) -> tuple[tuple[str, ...], float | None]:
    """(GEMM formats ``gpu``'s tensor cores run natively, its dense fp4 peak or None): ``hardware/serving.json``,
    else bf16 and, where the preset has an fp8 peak, fp8."""
    n = serving_data()["native_formats"].get(gpu.name)
    if n is None:
        return ("bf16", "fp16") + (("fp8",) if gpu.fp8_flops_per_s else ()), None
    return tuple(n["formats"]), n["fp4_flops_per_s"]


def compute_peak(gpu: GPU, weights_dtype: str) -> tuple[float, str]:
    """Dense peak of the GEMMs for ``weights_dtype`` on ``gpu`` and the kernel format that runs them."""
    native, fp4_peak = native_formats(gpu)
    if weights_dtype == "fp8" and gpu.fp8_flops_per_s and "fp8" in native:
        return float(gpu.fp8_flops_per_s), "fp8 (W8A8)"
    if weights_dtype in ("nvfp4", "mxfp4") and weights_dtype in native and fp4_peak:
        return float(fp4_peak), f"fp4 ({weights_dtype} W4A4, native)"
    if weights_dtype in ("int4", "mxfp4", "nvfp4"):
        return float(gpu.bf16_flops_per_s), f"bf16 ({weights_dtype} dequantised in a W4A16 kernel)"
    return float(gpu.bf16_flops_per_s), "bf16"


@per_spec
def routed_flops_per_token(spec: ModelSpec) -> int:
    """Forward FLOPs of the routed experts per token: 2 · k · (one expert's weights) summed over the MoE layers
    (2·m·k·n per expert GEMM, k experts per token); 0 for a dense model."""
    from trainmath.ops.emit import layer_top_k

    total = 0
    for layer, idx in spec.layer_groups():
        per_expert = sum(math.prod(t.shape) for t in layer.tensors if t.experts)
        if per_expert:
            total += 2 * (layer_top_k(layer) or 1) * per_expert * len(idx)
    return total


def busiest_rank_flops(spec: ModelSpec, setup: InferenceSetup,
                       parts: tuple[Part, ...]) -> tuple[float, float, float]:
    """(FLOPs, attention-core FLOPs, routed-expert FLOPs) of the busiest rank of one step.

    The routed experts' FLOPs are spread over every rank (expert parallelism, balanced routing assumed). The rest
    (attention, dense MLPs, shared experts, LM head) runs where each sequence lives: under tensor parallelism
    split over ``tp`` ranks; under attention data parallelism (``replicas`` > 1) a sequence sits on one replica,
    so the busiest replica holds ⌈n / replicas⌉ of each part's n sequences — as its cache does. A rank cannot run
    ahead of the busiest one: every MoE layer's all-to-all waits for all ranks (TensorRT-LLM's and SGLang's
    attention-DP layout, DeepSeek-V3 §3.4). With n divisible by the replicas this is the even split."""
    routed = routed_flops_per_token(spec)
    spread = other = attn = 0.0
    for p in parts:
        total, core = new_token_flops(spec, p), attention_flops(spec, p)
        expert = p.n * p.t * routed
        share = -(-p.n // setup.replicas) / p.n
        spread += expert
        other += share * (total - expert)
        attn += share * core
    return spread / setup.ranks + other / setup.tp, attn / setup.tp, spread / setup.ranks


def _allreduce_s(size: float, p: int, gpu: GPU, eff: Efficiency) -> float:
    return 2 * (p - 1) / p * size / (gpu.interconnect_bytes_per_s * eff.link) + 2 * (p - 1) * gpu.intra_node_latency_s


def step(spec: ModelSpec, setup: InferenceSetup, gpu: GPU, parts: tuple[Part, ...], eff: Efficiency) -> Step:
    """One forward step of ``parts`` on one rank of ``setup`` (module docstring)."""
    parts = tuple(p for p in parts if p.n > 0 and p.t > 0)
    if not parts:
        raise TrainmathError("a step needs at least one sequence with a new token")
    ranks, replicas = setup.ranks, setup.replicas
    tokens = sum(p.n * p.t for p in parts)
    flops, attn, expert_flops = busiest_rank_flops(spec, setup, parts)
    peak, _ = compute_peak(gpu, setup.weights.dtype)
    attn_peak = compute_peak(gpu, "fp8" if setup.cache.kv_dtype == "fp8" else "bf16")[0]
    dense, expert_bytes = _weights(spec, setup)
    experts, k, moe_layers = _moe(spec)
    touched_bytes = expert_bytes * touched_fraction(experts, k, tokens)
    weight_bytes = dense + touched_bytes
    cache_bytes = 0
    for p in parts:
        n = -(-p.n // replicas)  # the sequences one attention replica holds
        cache_bytes += _cache(spec, setup, n, p.c) + (_cache(spec, setup, n, p.c + p.t) - _cache(spec, setup, n, p.c))
    comm_bytes = 0.0
    comm_s = 0.0
    if setup.tp > 1:
        size = -(-tokens // replicas) * spec.hidden_size * ACT_BYTES
        comm_bytes += 2 * spec.num_layers * size
        comm_s += 2 * spec.num_layers * _allreduce_s(size, setup.tp, gpu, eff)
    if setup.ep > 1 and moe_layers:
        size = tokens / ranks * k * spec.hidden_size * ACT_BYTES * (setup.ep - 1) / setup.ep
        comm_bytes += 2 * moe_layers * size
        comm_s += 2 * moe_layers * (size / (gpu.interconnect_bytes_per_s * eff.link)
                                    + (setup.ep - 1) * gpu.intra_node_latency_s)
    total = weight_bytes + cache_bytes
    return Step(flops=flops, bytes=total, weight_bytes=weight_bytes, cache_bytes=cache_bytes, comm_bytes=comm_bytes,
                compute_s=((flops - attn) / peak + attn / attn_peak) / eff.compute,
                memory_s=total / (gpu.hbm_bytes_per_s * eff.memory), comm_s=comm_s,
                overhead_s=eff.overhead_s(spec.num_layers), attention_compute_s=attn / (attn_peak * eff.compute),
                cache_memory_s=cache_bytes / (gpu.hbm_bytes_per_s * eff.memory),
                expert_compute_s=expert_flops / (peak * eff.compute),
                expert_memory_s=touched_bytes / (gpu.hbm_bytes_per_s * eff.memory), overlap=eff.overlap)


def decode_samples(start: int, steps: int, most: int = 17) -> list[int]:
    """Contexts at which to evaluate ``steps`` decode steps starting at context ``start``: every one when few,
    else ``most`` evenly spaced (each bound is linear in the context between window saturations, so the mean of
    the max is the mean of the samples to well under a percent)."""
    if steps <= most:
        return [start + i for i in range(steps)]
    return [start + round(i * (steps - 1) / (most - 1)) for i in range(most)]


@dataclass(frozen=True, kw_only=True, slots=True)
class FixedBatch:
    """A batch of B prompts of I tokens prefilled together, then O − 1 decode steps."""

    batch: int
    input: int
    output: int
    prefill: Step
    decode: Step
    """The decode step at the mean context (bounds shown in the text; tpot_s is the mean over all steps)."""
    tpot_s: float
    prefill_floor: Step
    decode_floor: Step
    tpot_floor_s: float
    kernel_format: str

    @property
    def ttft_s(self) -> float:
        return self.prefill.time_s

    @property
    def e2e_s(self) -> float:
        return self.ttft_s + (self.output - 1) * self.tpot_s

    @property
    def output_tokens_per_s(self) -> float:
        return self.batch * self.output / self.e2e_s

    @property
    def prefill_tokens_per_s(self) -> float:
        return self.batch * self.input / self.ttft_s

    def to_dict(self) -> dict:
        floor_e2e = self.prefill_floor.time_s + (self.output - 1) * self.tpot_floor_s
        return {"batch": self.batch, "input": self.input, "output": self.output, "ttft_s": self.ttft_s,
                "tpot_s": self.tpot_s, "e2e_s": self.e2e_s, "output_tokens_per_s": self.output_tokens_per_s,
                "prefill_tokens_per_s": self.prefill_tokens_per_s, "ttft_bound": self.prefill.bound,
                "tpot_bound": self.decode.bound, "kernel_format": self.kernel_format,
                "prefill_step": self.prefill.to_dict(), "decode_step": self.decode.to_dict(),
                "floor": {"ttft_s": self.prefill_floor.time_s, "tpot_s": self.tpot_floor_s, "e2e_s": floor_e2e,
                          "output_tokens_per_s": self.batch * self.output / floor_e2e}}


def mean_decode(spec: ModelSpec, setup: InferenceSetup, gpu: GPU, batch: int, start: int, steps: int,
                eff: Efficiency) -> tuple[float, Step]:
    """(mean step time of ``steps`` decode steps of ``batch`` sequences from context ``start``, the middle step)."""
    if steps <= 0:
        return 0.0, step(spec, setup, gpu, (Part(n=batch, t=1, c=start),), eff)
    samples = [step(spec, setup, gpu, (Part(n=batch, t=1, c=c),), eff) for c in decode_samples(start, steps)]
    return sum(s.time_s for s in samples) / len(samples), samples[len(samples) // 2]


def fixed_batch(spec: ModelSpec, setup: InferenceSetup, gpu: GPU, *, input: int, output: int,
                eff: Efficiency | None = None) -> FixedBatch:
    """TTFT, TPOT and throughput of ``setup.batch`` prompts of ``input`` tokens generating ``output`` each."""
    if input < 1 or output < 1:
        raise TrainmathError(f"--input ({input}) and --output ({output}) must be positive")
    eff = eff or Efficiency.of(gpu)
    b = setup.batch
    prefill = step(spec, setup, gpu, (Part(n=b, t=input, c=0),), eff)
    pf = step(spec, setup, gpu, (Part(n=b, t=input, c=0),), FLOOR)
    tpot, mid = mean_decode(spec, setup, gpu, b, input, output - 1, eff)
    tpot_floor, mid_floor = mean_decode(spec, setup, gpu, b, input, output - 1, FLOOR)
    return FixedBatch(batch=b, input=input, output=output, prefill=prefill, decode=mid, tpot_s=tpot or mid.time_s,
                      prefill_floor=pf, decode_floor=mid_floor, tpot_floor_s=tpot_floor or mid_floor.time_s,
                      kernel_format=compute_peak(gpu, setup.weights.dtype)[1])


def with_batch(setup: InferenceSetup, batch: int) -> InferenceSetup:
    return replace(setup, batch=batch)
