"""Training memory per GPU: a typed breakdown whose sum is ``peak_bytes``.

``peak_bytes`` is what ``torch.cuda.max_memory_allocated`` would report for one training step: live tensors only.
The CUDA context and the allocator's cached-but-free memory are not tensors; they are reported outside it
(``outside_peak``, left ``None``: a runtime measurement fills them).

The step has two candidate peaks, computed for every pipeline stage; the larger is the stage's peak and the
largest stage is the GPU's peak (per-stage figures are reported too):

- ``backward_start`` — model states + activations of every micro-batch in flight + logits + the loss's transient
  buffers + low-precision weight copies + ZeRO-3 gather buffers + framework buffers. Activations peak here: the
  forward is complete and backward has not yet freed anything.
- ``optimizer_step`` — model states + optimizer temporaries + fp32 gradient copies + framework buffers
  (activations are freed).

Terms not live in the peak phase appear with 0 so that every breakdown has the same field names.

Conventions (stated in the output): gradients are counted live for the whole step (Megatron's and DeepSpeed's
contiguous gradient buffers, or gradient accumulation; torch with ``zero_grad(set_to_none=True)`` and one
micro-batch frees them between steps, so a measured peak can be lower by up to ``gradients_bytes``). 1F1B
pipeline schedule: stage s holds activations of min(pp − s, micro_batches) micro-batches (Narayanan et al. 2021,
§2.2: the first stage holds pp).
"""

from __future__ import annotations

from dataclasses import dataclass

from trainmath.arith import ceil_div
from trainmath.errors import TrainmathError
from trainmath.layout import ParallelLayout, validate_layout
from trainmath.memory import states as st
from trainmath.memory.optimizers import check_optimizer
from trainmath.memory.precision import Precision, get_precision
from trainmath.model.spec import ModelSpec
from trainmath.placement import Placement, place
from trainmath.tree import Node

RECOMPUTE = ("none", "selective", "full")
ATTENTION = ("sdpa", "eager")
PROFILES = ("hf", "megatron")

TERMS = (
    "weights_bytes", "gradients_bytes", "master_weights_bytes", "optimizer_states_bytes",
    "activations_bytes", "logits_bytes", "logits_fp32_bytes", "cross_entropy_grad_bytes", "weight_copies_bytes",
    "zero3_gather_bytes", "zero3_grad_reduce_bytes",
    "optimizer_step_temporaries_bytes", "optimizer_fp32_grads_bytes", "framework_overhead_bytes",
)
"""Every field of a breakdown, in order; the same names a runtime measurement uses."""

DEEPSPEED_REDUCE_BUCKET_ELEMENTS = 500_000_000
"""DeepSpeed's ``zero_optimization.reduce_bucket_size`` default (elements)."""


@dataclass(frozen=True, kw_only=True)
class TrainingSetup:
    """What one training step runs (everything but the parallel layout)."""

    micro_batch: int
    """Sequences per micro-batch on one data-parallel rank."""
    seq: int
    """Tokens per sequence."""
    precision: str = "mixed-bf16"
    optimizer: str = "adamw"
    optimizer_impl: str = "foreach"
    """``foreach`` (torch's default on CUDA) or ``fused``."""
    recompute: str = "none"
    attention: str = "sdpa"
    profile: str = "hf"
    """Activation profile: what the model code saves (``hf`` transformers, ``megatron`` Megatron-Core)."""
    micro_batches: int | None = None
    """Micro-batches per step (gradient accumulation); None means at least pp (1F1B fills the pipeline)."""
    granularity: int = st.ALLOC_GRANULARITY


@dataclass(frozen=True, kw_only=True)
class StageMemory:
    stage: int
    layers: range
    in_flight: int
    """Micro-batches whose activations this stage holds at once (1F1B)."""
    phase: str
    """``backward_start`` or ``optimizer_step``: where this stage peaks."""
    phases: dict
    """phase → its total bytes."""
    breakdown: Node
    """What is live at this stage's peak."""
    by_phase: dict
    """phase → what is live then (the same terms; ``breakdown`` is the larger)."""


@dataclass(frozen=True, kw_only=True)
class MemoryReport:
    model: str
    setup: TrainingSetup
    layout: ParallelLayout
    peak_bytes: int
    stage: int
    """The pipeline stage whose rank peaks highest (reported in ``breakdown``)."""
    breakdown: Node
    stages: tuple[StageMemory, ...]
    outside_peak: dict
    conventions: tuple[str, ...]

    def to_dict(self) -> dict:
        s, lay = self.setup, self.layout
        return {
            "model": self.model,
            "setup": {"micro_batch": s.micro_batch, "seq": s.seq, "precision": s.precision,
                      "optimizer": s.optimizer, "optimizer_impl": s.optimizer_impl, "recompute": s.recompute,
                      "attention": s.attention, "profile": s.profile, "micro_batches": s.micro_batches},
            "layout": {"dp": lay.dp, "tp": lay.tp, "pp": lay.pp, "cp": lay.cp, "ep": lay.ep, "sp": lay.sp,
                       "zero": lay.zero, "world_size": lay.ranks},
            "peak_bytes": self.peak_bytes,
            "peak_stage": self.stage,
            "phase": self.stages[self.stage].phase,
            "breakdown": self.breakdown.flat(),
            "breakdown_tree": self.breakdown.to_dict(),
            "breakdown_by_phase": {p: t.flat() for p, t in self.stages[self.stage].by_phase.items()},
            "stages": [{"stage": m.stage, "layers": [m.layers.start, m.layers.stop], "in_flight": m.in_flight,
                        "phase": m.phase, "peak_bytes": m.breakdown.value, "phases": m.phases}
                       for m in self.stages],
            "outside_peak": self.outside_peak,
            "conventions": list(self.conventions),
        }


def _call(fn, *args, **kwargs):
    """Call ``fn`` with the keyword arguments it accepts (the activation model's optional knobs)."""
    import inspect

    params = inspect.signature(fn).parameters
    if any(p.kind is p.VAR_KEYWORD for p in params.values()):
        return fn(*args, **kwargs)
    return fn(*args, **{k: v for k, v in kwargs.items() if k in params})


def _mentions(node: Node, word: str) -> bool:
    return any(word in n.name for _, n in node.walk())


def _scaled(node: Node, k: int, name: str | None = None, note: str = "") -> Node:
    kids = tuple(_scaled(c, k) for c in node.children)
    return Node(name=name or node.name, value=node.value * k, unit=node.unit, children=kids,
                note=note or node.note)


def check_setup(setup: TrainingSetup) -> list[str]:
    bad = []
    if not isinstance(setup.micro_batch, int) or setup.micro_batch < 1:
        bad.append(f"micro-batch must be a positive integer, got {setup.micro_batch!r}")
    if not isinstance(setup.seq, int) or setup.seq < 1:
        bad.append(f"seq must be a positive integer, got {setup.seq!r}")
    if setup.micro_batches is not None and setup.micro_batches < 1:
        bad.append(f"micro-batches must be a positive integer, got {setup.micro_batches!r}")
    for field, allowed in (("recompute", RECOMPUTE), ("attention", ATTENTION), ("profile", PROFILES)):
        if getattr(setup, field) not in allowed:
            bad.append(f"{field} must be one of {', '.join(allowed)}, got {getattr(setup, field)!r}")
    return bad


def loss_transients(spec: ModelSpec, setup: TrainingSetup, layout: ParallelLayout) -> tuple[int, int]:
    """(logits_fp32_bytes, cross_entropy_grad_bytes) on the last stage at the start of backward. T = b · s/cp
    tokens, V' = ceil_div(|V|, tp) vocabulary entries per rank.

    - ``hf``: transformers' ``ForCausalLMLoss`` does ``logits.float()`` then ``F.cross_entropy``; log_softmax
      saves its fp32 output (4·T·V'). In backward, ``nll_loss_backward`` makes the fp32 gradient of the
      log-probabilities and ``log_softmax_backward`` the fp32 gradient of the logits, both live at once
      (2 · 4·T·V').
    - ``megatron``: ``vocab_parallel_cross_entropy(logits.float())`` keeps the fp32 softmax (4·T·V') and writes
      the gradient into it in place; only the cast of that gradient back to the compute dtype is new
      (c·T·V' when c < 4, else 0).
    Derived from the code; the compute-dtype logits themselves are ``logits_bytes`` (activation model)."""
    tokens = setup.micro_batch * ceil_div(setup.seq, layout.cp)
    tv = tokens * ceil_div(spec.vocab_size, layout.tp)
    c = get_precision(setup.precision).compute_bytes
    if setup.profile == "megatron":
        return 4 * tv, (c * tv if c < 4 else 0)
    return 4 * tv, 2 * 4 * tv


def weight_copies_bytes(placement: Placement, prec: Precision, in_flight: int) -> int:
    """Low-precision copies of linear weights live during forward+backward: autocast's bf16 casts are saved by
    every micro-batch's matmuls (× micro-batches in flight); Transformer Engine caches its fp8 weight and
    transpose once per step. Embedding lookups are not cast (autocast runs them in fp32)."""
    if not prec.weight_copy_bytes:
        return 0
    linear = sum(t.params for t in placement.tensors if t.spec.kind == "linear")
    return linear * prec.weight_copy_bytes * (in_flight if prec.name == "amp-bf16" else 1)


def zero3_buffers(placement: Placement, layout: ParallelLayout, prec: Precision) -> tuple[int, int]:
    """(gather_bytes, grad_reduce_bytes) of ZeRO-3 / FSDP: the all-gathered parameters of the largest module and
    of the next one prefetched (FSDP's default one-module forward/backward prefetch, DeepSpeed's
    ``stage3_prefetch_bucket_size``): 2 × largest module in the weight dtype, an upper bound; and the unsharded
    gradients of the largest module before its reduce-scatter, in the gradient dtype. Tensors ZeRO does not shard
    (degree 1) are resident already and add nothing."""
    if layout.zero < 3:
        return 0, 0
    units: dict[str, int] = {}
    for t in placement.tensors:
        degree = layout.expert_zero_degree if t.expert else layout.zero_degree
        if degree > 1:
            units[t.unit] = units.get(t.unit, 0) + t.params
    largest = max(units.values(), default=0)
    return 2 * largest * prec.weight_bytes, largest * prec.grad_bytes


def framework_overhead(placement: Placement, layout: ParallelLayout, prec: Precision, grads_bytes: int) -> int:
    """Communication buffers of the data-parallel wrapper:
    ZeRO-0 with dp·cp > 1 is torch DDP, whose buckets copy every gradient (``gradient_as_bucket_view=False``, the
    default; torch's DDP docs: the view "saves memory equal to the total gradients size");
    ZeRO-1/2 is DeepSpeed, whose reduce bucket holds up to ``reduce_bucket_size`` = 5e8 elements in the gradient
    dtype; ZeRO-3's buffers are counted in ``zero3_*``."""
    if layout.zero_degree == 1:
        return 0
    if layout.zero == 0:
        return grads_bytes
    if layout.zero in (1, 2):
        return min(DEEPSPEED_REDUCE_BUCKET_ELEMENTS, placement.params) * prec.grad_bytes
    return 0


def _activation_model(activation_model):
    if activation_model is not None:
        return activation_model
    try:
        from trainmath.memory import activations
    except ModuleNotFoundError as e:  # pragma: no cover - until the activation model lands
        raise TrainmathError("the activation model (trainmath.memory.activations) is not available") from e
    if not (hasattr(activations, "activation_bytes") and hasattr(activations, "logits_bytes")):
        raise TrainmathError("the activation model (trainmath.memory.activations) has no activation_bytes / "
                             "logits_bytes yet")
    return activations


def stage_memory(spec: ModelSpec, setup: TrainingSetup, layout: ParallelLayout, stage: int,
                 activation_model=None) -> StageMemory:
    """The peak of one rank of pipeline ``stage`` and what is live then."""
    am = _activation_model(activation_model)
    prec = get_precision(setup.precision)
    pl = place(spec, layout, stage)
    last = stage == layout.pp - 1
    in_flight = layout.pp - stage
    if setup.micro_batches is not None:
        in_flight = min(in_flight, setup.micro_batches)
    ms = st.model_states(pl, layout, prec, setup.optimizer, impl=setup.optimizer_impl,
                         granularity=setup.granularity)
    # The activation model's "eager" profile is transformers with attn_implementation="eager" (s² scores saved).
    profile = "eager" if setup.attention == "eager" and setup.profile == "hf" else setup.profile
    act = _call(am.activation_bytes, spec, micro_batch=setup.micro_batch, seq=setup.seq, profile=profile,
                recompute=setup.recompute, attention=setup.attention, compute_dtype_bytes=prec.compute_bytes,
                param_dtype_bytes=prec.weight_bytes, tp=layout.tp, sp=layout.sp, cp=layout.cp, pp=1,
                layers=list(pl.layers))
    copies = weight_copies_bytes(pl, prec, in_flight)
    if copies and prec.name == "amp-bf16" and _mentions(act, "weight"):  # (the LM head's cast is in logits)
        copies = 0  # the activation model already counts autocast's weight casts as saved tensors
    act = _scaled(act, in_flight, "activations_bytes",
                  note=f"{in_flight} micro-batch(es) in flight × {act.value:,} bytes")
    if last:
        logits = _call(am.logits_bytes, spec, setup.micro_batch, setup.seq, profile=profile,
                       param_dtype_bytes=prec.weight_bytes,
                       compute_dtype_bytes=prec.compute_bytes, tp=layout.tp, sp=layout.sp, cp=layout.cp)
        logits = _scaled(logits, 1, "logits_bytes")
        up, ce = loss_transients(spec, setup, layout)
        # The activation model's logits tree may already hold the fp32 log-probabilities and, as a transient, the
        # fp32 upcast (freed before backward starts): count only what backward adds beyond them.
        if _mentions(logits, "log_softmax"):
            up = 0
        ce = max(0, ce - sum(n.value for _, n in logits.walk() if not n.children and "logits_fp32" in n.name))
    else:
        logits, up, ce = Node(name="logits_bytes", value=0, unit="bytes", note="not on this stage"), 0, 0
    gather, reduce = zero3_buffers(pl, layout, prec)
    overhead = framework_overhead(pl, layout, prec, ms.gradients_bytes)
    persistent = {"weights_bytes": ms.weights_bytes, "gradients_bytes": ms.gradients_bytes,
                  "master_weights_bytes": ms.master_weights_bytes,
                  "optimizer_states_bytes": ms.optimizer_states_bytes, "framework_overhead_bytes": overhead}
    backward = {"activations_bytes": act, "logits_bytes": logits, "logits_fp32_bytes": up,
                "cross_entropy_grad_bytes": ce, "weight_copies_bytes": copies,
                "zero3_gather_bytes": gather, "zero3_grad_reduce_bytes": reduce}
    step = {"optimizer_step_temporaries_bytes": st.optimizer_temporaries_bytes(pl, layout, prec, setup.optimizer,
                                                                               impl=setup.optimizer_impl),
            "optimizer_fp32_grads_bytes": st.fp32_grad_copies_bytes(pl, layout, prec)}

    def val(v) -> int:
        return v.value if isinstance(v, Node) else v

    base = sum(persistent.values())
    phases = {"backward_start": base + sum(val(v) for v in backward.values()),
              "optimizer_step": base + sum(step.values())}
    phase = max(phases, key=lambda p: (phases[p], p == "backward_start"))
    trees = {p: _phase_tree(p, stage, persistent, backward if p == "backward_start" else step)
             for p in phases}
    return StageMemory(stage=stage, layers=pl.layers, in_flight=in_flight, phase=phase, phases=phases,
                       breakdown=trees[phase], by_phase=trees)


def _phase_tree(phase: str, stage: int, persistent: dict, live: dict) -> Node:
    """Every term of ``TERMS`` as live in ``phase`` (0, with a note, when not live then)."""
    kids = []
    for name in TERMS:
        v = persistent.get(name, live.get(name))
        if v is None:
            kids.append(Node(name=name, value=0, unit="bytes", note=f"not live in {phase}"))
        elif isinstance(v, Node):
            kids.append(v)
        else:
            kids.append(Node(name=name, value=v, unit="bytes"))
    return Node.of("peak_bytes", kids, "bytes", note=f"stage {stage}, {phase}")


def training_memory(spec: ModelSpec, setup: TrainingSetup, layout: ParallelLayout = ParallelLayout(), *,
                    activation_model=None) -> MemoryReport:
    """Peak training memory of the busiest GPU, with a breakdown that sums to it. Raises one ``TrainmathError``
    listing every problem of the setup and layout."""
    bad = check_setup(setup)
    get_precision(setup.precision)
    check_optimizer(setup.optimizer, setup.optimizer_impl)
    if bad:
        raise TrainmathError("invalid training setup: " + "; ".join(bad))
    validate_layout(layout, spec)
    stages = tuple(stage_memory(spec, setup, layout, s, activation_model) for s in range(layout.pp))
    top = max(stages, key=lambda m: (m.breakdown.value, -m.stage))
    prec = get_precision(setup.precision)
    conventions = (
        f"precision {prec.name}: {prec.description}",
        f"optimizer {setup.optimizer} ({setup.optimizer_impl}); ZeRO-{layout.zero} over dp·cp = "
        f"{layout.zero_degree} ranks (experts over {layout.expert_zero_degree})",
        "gradients counted live for the whole step (contiguous gradient buffers / accumulation)",
        "1F1B pipeline: stage s holds min(pp - s, micro-batches) micro-batches of activations",
        f"every tensor rounded up to the allocator's {setup.granularity}-byte blocks",
        "peak_bytes = torch.cuda.max_memory_allocated of a step; CUDA context and cached-free memory are outside",
    )
    return MemoryReport(model=spec.name, setup=setup, layout=layout, peak_bytes=top.breakdown.value,
                        stage=top.stage, breakdown=top.breakdown, stages=stages,
                        outside_peak={"cuda_context_bytes": None, "allocator_cached_free_bytes": None},
                        conventions=conventions)
