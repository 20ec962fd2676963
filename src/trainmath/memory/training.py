"""Training memory per GPU: the peak of one step's timeline, with a typed breakdown whose sum is ``peak_bytes``.

``peak_bytes`` is what ``torch.cuda.max_memory_allocated`` would report for one training step (``device="cuda"``;
``device="cpu"``: what CPU kernels allocate, as ``MemTracker`` counts it on the CPU): live tensors only. The CUDA
context and the allocator's cached-but-free memory are not tensors; they are reported outside it
(``outside_peak``, left ``None``: a runtime measurement fills them).

The step is a timeline of events (``timeline.step_timeline``: forward layer by layer, loss, backward layer by
layer, optimizer step, zero_grad), computed for every pipeline stage; a stage's peak is its largest event and the
GPU's peak is the largest stage's (per-stage figures are reported too). Gradient lifetime is an explicit
convention (``TrainingSetup.grad_lifetime``), stated in the output with the others. 1F1B pipeline schedule:
stage s holds activations of min(pp − s, micro_batches) micro-batches (Narayanan et al. 2021, §2.2: the first
stage holds pp).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from trainmath import families
from trainmath.arith import ceil_div
from trainmath.comm.flat import flat_units
from trainmath.errors import TrainmathError
from trainmath.layout import ParallelLayout, validate_layout
from trainmath.memory import activations, fsdp2, fsdp2_pipeline
from trainmath.memory import flat_zero as fz
from trainmath.memory import recipe_options as ro
from trainmath.memory import states as st
from trainmath.memory import timeline as tl
from trainmath.memory.optimizers import check_optimizer, step_temporary_bytes
from trainmath.memory.setup import TrainingSetup
from trainmath.memory.step import TERMS as TERMS  # the breakdown's fields
from trainmath.memory.step import Event, Persistent, StepInputs
from trainmath.memory.terms import framework_overhead, loss_parallel_bytes, loss_transients, weight_copies_bytes
from trainmath.model.spec import MLPDims, ModelSpec, MoEDims
from trainmath.ops.kernels.experts import routed_weights
from trainmath.placement import Placement, place
from trainmath.tree import Node
from trainmath.vocabulary import (
    DEVICES,
    EXPERTS,
    GRAD_LIFETIMES,
    LOOP_KEEPS,
    MEMORY_ATTENTION,
    OFFLOAD,
    PROFILES,
    RECOMPUTE,
    ZERO_IMPLS,
    get_precision,
)

PROFILE_TEXT = {
    "hf": "transformers' modeling code, every saved tensor as autograd keeps it (the default of memory, report and "
          "the web page, which describe a transformers step; estimate and plan default to megatron)",
    "megatron": "Megatron-Core's saved tensors (memory/megatron.py; the default of estimate and plan, whose layouts "
                "are Megatron-Core's; plan also requires the hf profile's peak to fit)",
}
"""Each activation profile and why a command defaults to it (printed with every result)."""

GRAD_LIFETIME_TEXT = {
    "set_to_none": "zero_grad(set_to_none=True), torch's default: no gradient when the step starts, each layer's "
                   "appear in its backward, all live at the optimizer step (micro-batches > 1 or pp > 1 keep them "
                   "for the whole step)",
    "zero": "zero_grad(set_to_none=False): gradients allocated for the whole step",
    "accumulate": "gradient accumulation: gradients allocated for the whole step",
}
OFFLOAD_TEXT = {
    "none": "every state on the GPU",
    "optimizer": "ZeRO-Offload: optimizer states, master weights and the optimizer step on the CPU",
    "params": "ZeRO-3 parameter offload: also the parameter shards on the CPU, gathered to the GPU per module",
}

@dataclass(frozen=True, kw_only=True)
class StageMemory:
    stage: int
    layers: range
    in_flight: int
    """Micro-batches whose activations this stage holds at once (1F1B)."""
    phase: str
    """The event of the timeline where this stage peaks."""
    timeline: tuple
    """The step's events (``step.Event``), in order."""
    breakdown: Node
    """What is live at this stage's peak."""

    def at(self, event: str) -> Node:
        """The breakdown at ``event`` (the same terms as ``breakdown``)."""
        for e in self.timeline:
            if e.name == event:
                return _event_tree(e, self.stage)
        raise KeyError(event)


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
                      "attention": s.attention, "profile": s.profile, "micro_batches": s.micro_batches,
                      "grad_lifetime": s.grad_lifetime, "bucket_view": s.bucket_view, "device": s.device,
                      "loop_keeps": s.loop_keeps, "backward_in_autocast": s.backward_in_autocast,
                      "zero_impl": s.zero_impl,
                      "offload": s.offload, "experts": s.experts},
            "layout": {"dp": lay.dp, "tp": lay.tp, "pp": lay.pp, "cp": lay.cp, "ep": lay.ep, "sp": lay.sp,
                       "vocab_parallel": lay.vocab_parallel, "zero": lay.zero, "world_size": lay.ranks},
            "peak_bytes": self.peak_bytes,
            "peak_stage": self.stage,
            "phase": self.stages[self.stage].phase,
            "peak_event": self.stages[self.stage].phase,
            "timeline": [{"event": e.name, "bytes": e.bytes} for e in self.stages[self.stage].timeline],
            "breakdown": self.breakdown.flat(),
            "breakdown_tree": self.breakdown.to_dict(),
            "stages": [{"stage": m.stage, "layers": [m.layers.start, m.layers.stop], "in_flight": m.in_flight,
                        "phase": m.phase, "peak_bytes": m.breakdown.value}
                       for m in self.stages],
            "outside_peak": self.outside_peak,
            "conventions": list(self.conventions),
        }


def check_setup(setup: TrainingSetup) -> list[str]:
    bad = []
    if not isinstance(setup.micro_batch, int) or setup.micro_batch < 1:
        bad.append(f"micro-batch must be a positive integer, got {setup.micro_batch!r}")
    if not isinstance(setup.seq, int) or setup.seq < 1:
        bad.append(f"seq must be a positive integer, got {setup.seq!r}")
    if setup.micro_batches is not None and setup.micro_batches < 1:
        bad.append(f"micro-batches must be a positive integer, got {setup.micro_batches!r}")
    for field, allowed in (("recompute", RECOMPUTE), ("attention", MEMORY_ATTENTION), ("profile", PROFILES),
                           ("grad_lifetime", GRAD_LIFETIMES), ("loop_keeps", LOOP_KEEPS),
                           ("device", DEVICES), ("offload", OFFLOAD), ("zero_impl", ZERO_IMPLS),
                           ("experts", EXPERTS)):
        if getattr(setup, field) not in allowed:
            bad.append(f"{field} must be one of {', '.join(allowed)}, got {getattr(setup, field)!r}")
    if setup.cross_entropy_fusion not in ro.CROSS_ENTROPY_FUSIONS:
        bad.append(f"cross entropy fusion must be one of {', '.join(ro.CROSS_ENTROPY_FUSIONS)}, got "
                   f"{setup.cross_entropy_fusion!r}")
    elif setup.cross_entropy_fusion != "none" and setup.profile != "megatron":
        bad.append(f"cross entropy fusion {setup.cross_entropy_fusion} is modelled under the megatron profile, got "
                   f"--profile {setup.profile}")
    bad += ro.offload_problems(setup.offload_layers, setup.recompute_saves, setup.profile, setup.recompute)
    if setup.fp8_param_gather and setup.precision != "fp8":
        bad.append(f"fp8 param gather keeps the linear weights in FP8: needs --precision fp8, got {setup.precision}")
    if setup.backward_in_autocast and (setup.precision != "amp-bf16" or (setup.micro_batches or 1) > 1):
        bad.append("--backward-in-autocast is modelled with --precision amp-bf16 and one micro-batch (the cache of "
                   "autocast's weight casts)")
    return bad


def _autocast_cache(pl: Placement, gran: int) -> dict:
    """unit → bytes of the bf16 casts autocast's cache holds of its linear weights on this rank (each cast one
    tensor, rounded to the allocator's blocks); embeddings are looked up in fp32, not cast."""
    out: dict = {}
    for t in pl.tensors:
        if t.spec.kind == "linear":
            out[t.unit] = out.get(t.unit, 0) + ceil_div(2 * t.params, gran) * gran
    return out


def experts_path(spec: ModelSpec, setup: TrainingSetup) -> str:
    """The expert path modelled: ``setup.experts``, except the families whose grouped path is not modelled
    (``Style.experts_grouped``), which get their eager loop (the conventions say so)."""
    return "eager" if setup.experts == "grouped" and not spec.family.row.experts_grouped else setup.experts


def vocab_sharded(setup: TrainingSetup, layout: ParallelLayout) -> bool:
    """Whether embedding, LM head and loss are split over the vocabulary on a tensor-parallel rank: always under
    the megatron profile (Megatron's ``VocabParallelEmbedding``); with the hf profile only with
    ``--vocab-parallel`` (plain ``--tp`` is ``parallelize_module`` on the decoder layers: head and loss whole)."""
    return layout.tp > 1 and (layout.vocab_parallel or setup.profile == "megatron")


def layout_text(setup: TrainingSetup, layout: ParallelLayout, model_type: str = "",
                options: dict | None = None) -> str:
    """The convention line that says what each degree means here (whether ``model_type``'s TP fold is measured:
    ``FamilyDef.tp``)."""
    fam = families.get(model_type)
    if layout.tp == 1 and layout.cp == 1 and layout.ep == 1:
        return f"layout {layout.describe()}: no tensor, context or expert parallelism; per-rank figures"
    if setup.profile == "megatron":
        return (f"layout {layout.describe()}: Megatron-Core (Korthikanti et al. 2022 Table 2; vocabulary-parallel "
                f"embedding, head and loss whenever tp > 1)")
    parts = []
    if layout.tp > 1:
        parts.append(f"tp {layout.tp}: parallelize_module on the decoder layers (column-wise q/k/v/gate/up, row-wise "
                     f"o/down; heads and MLP width / tp)"
                     + (", sequence parallelism (norms and residual stream cut on the sequence; each column-wise "
                        "Linear saves its all-gathered input)" if layout.sp else ", norms and residual stream whole")
                     + (", vocabulary-parallel embedding, head and loss (V/tp per rank)" if layout.vocab_parallel
                        else ", embedding, LM head and loss whole on every rank")
                     + (f"; {model_type}: measured equal on gloo ranks (the plan is trainmath.runtime.tensor_parallel"
                        f".apply_tp)" if fam is not None and fam.tp_measured(options) else
                        f"; {model_type or 'this family'}: derived from the op lists' axes, not measured (measured: "
                        f"{', '.join(families.tp_measured_families())})"))
    if layout.cp > 1:
        parts.append(f"cp {layout.cp}: s/cp positions per rank (and T/cp·k routed rows); ring attention keeps the "
                     f"rank's query, its local K/V chunk, output and logsumexp (K/V rotation buffers are transients, "
                     f"not counted)")
    if layout.ep > 1:
        parts.append(f"ep {layout.ep} (ranks of dp·cp): routed experts / ep per rank; each rank still computes the "
                     f"routed rows of its own tokens (its own micro-batch, balanced routing assumed; all-to-all "
                     f"buffers not counted)")
    return f"layout {layout.describe()}: " + "; ".join(parts)


def _fsdp2_mixer(spec: ModelSpec, setup: TrainingSetup, layout: ParallelLayout, pl, prec,
                 gran: int) -> tuple[dict, dict]:
    """layer index → ``fsdp2.MixerBackward``, and layer index → ``fsdp2.NormBackward``, of its op list (the hf
    profile, one rank of data parallelism only: tp = cp = ep = 1), for the layers with one."""
    if setup.profile != "hf" or layout.tp > 1 or layout.cp > 1 or layout.ep > 1 \
            or spec.family.layer is None:
        return {}, {}
    from trainmath.ops.program import EmitJob, context, layer_program

    job = EmitJob(batch=setup.micro_batch, seq=setup.seq, precision=prec, attention=setup.attention,
                  experts=experts_path(spec, setup), device=setup.device)
    ctx = context(spec, job)
    out, norms = {}, {}
    for i in pl.layers:
        prog = layer_program(spec, job, spec.layers[i], ctx)
        mix = fsdp2.mixer_backward(prog.ops, [t for t in pl.tensors if t.unit == f"layer.{i}"],
                                   param_bytes=prec.weight_bytes, granularity=gran)
        if mix:
            out[i] = mix
        norm = fsdp2.norm_backward(prog.ops)
        if norm:
            norms[i] = norm
    return out, norms


_STATES_CACHE: dict = {}
_STATES_CACHE_SIZE = 512


def _placed_states(spec: ModelSpec, layout: ParallelLayout, stage: int, vocab: bool, prec, setup: TrainingSetup,
                   gran: int):
    """(placement, model states) of one stage: the same for every activation profile and micro-batch, so the
    planner's checks of one layout under two profiles place and count its states once. Keyed by the spec object
    itself (held in the value, so its id is not reused while cached)."""
    key = (id(spec), layout, stage, vocab, prec.name, setup.optimizer, setup.optimizer_impl, gran, setup.device)
    hit = _STATES_CACHE.get(key)
    if hit is not None and hit[0] is spec:
        return hit[1], hit[2]
    pl = place(spec, layout, stage, vocab_parallel=vocab)
    ms = st.model_states(pl, layout, prec, setup.optimizer, impl=setup.optimizer_impl, granularity=gran,
                         device=setup.device)
    if len(_STATES_CACHE) >= _STATES_CACHE_SIZE:
        _STATES_CACHE.clear()
    _STATES_CACHE[key] = (spec, pl, ms)
    return pl, ms


def stage_memory(spec: ModelSpec, setup: TrainingSetup, layout: ParallelLayout, stage: int,
                 activation_model=None) -> StageMemory:
    """The timeline of one rank of pipeline ``stage``, its peak event and what is live then. ``activation_model``:
    a module with ``activation_bytes`` and ``logits_bytes`` of ``memory.activations``' signatures, returning
    ``memory.saved``'s typed results (default ``memory.activations``; the memory tests pass a stand-in)."""
    am = activation_model or activations
    prec = get_precision(setup.precision)
    gran = 1 if setup.device == "cpu" else setup.granularity
    vocab = vocab_sharded(setup, layout)
    pl, ms = _placed_states(spec, layout, stage, vocab, prec, setup, gran)
    first, last = stage == 0, stage == layout.pp - 1
    in_flight = layout.pp - stage
    if setup.micro_batches is not None:
        in_flight = min(in_flight, setup.micro_batches)
    # The activation model's "eager" profile is transformers with attn_implementation="eager" (s² scores saved).
    profile = "eager" if setup.attention == "eager" and setup.profile == "hf" else setup.profile
    kw = dict(micro_batch=setup.micro_batch, seq=setup.seq, profile=profile, attention=setup.attention,
              compute_dtype_bytes=prec.compute_bytes, param_dtype_bytes=prec.weight_bytes, tp=layout.tp,
              sp=layout.sp, cp=layout.cp, pp=1, layers=list(pl.layers), experts=experts_path(spec, setup),
              ep=layout.ep, vocab_parallel=layout.vocab_parallel, device=setup.device)
    if setup.precision == "fp8" and setup.profile == "megatron":  # TE saves FP8 linear inputs (memory/te_fp8.py)
        kw["fp8_linear_inputs"] = True
    if setup.profile == "megatron" and layout.expert_tp != layout.tp:  # MoE parallel folding: expert TP 1
        kw["expert_tp"] = layout.expert_tp
    if setup.recompute_saves:  # a remat policy's saved names (megatron profile, full recompute)
        kw["recompute_saves"] = tuple(setup.recompute_saves)
    if setup.recompute_modules:  # Megatron-Core's --recompute-modules (megatron profile, selective)
        kw["recompute_modules"] = tuple(setup.recompute_modules)
    act = am.activation_bytes(spec, recompute=setup.recompute, **kw)
    saved, resident = act.per_layer(), list(act.resident)
    if setup.recompute in ("full", "selective") and setup.profile == "hf" and spec.family.checkpoint_position_ids:
        # torch.utils.checkpoint keeps every argument of the layer: also the (1, s) int64 position ids
        resident = [*resident, Node(name="position_ids (checkpoint argument)", value=8 * ceil_div(setup.seq, layout.cp),
                                    unit="bytes")]
    recomputed = {i: 0 for i in pl.layers}
    if setup.recompute == "full":
        plain = {k: v for k, v in kw.items() if k not in ("recompute_saves", "recompute_modules")}
        none = am.activation_bytes(spec, recompute="none", **plain)
        full = none.per_layer()
        # An fp32 residual stream: the recomputed norm's fp32 input is the checkpointed layer input itself.
        dup = saved if prec.weight_bytes == 4 and none.keeps_layer_input else {}
        recomputed = {i: full[i] - dup.get(i, 0) for i in pl.layers}
    elif setup.recompute == "selective":
        # what the recompute saves again in the layer's backward (hf: beside the cache and the layer input;
        # megatron: the core attention's own tensors; activations.activation_bytes)
        recomputed = {i: act.recompute_transient_bytes for i in pl.layers}
    if setup.offload_layers:  # Megatron-Core's CPU activation offloading (memory/recipe_options.py)
        saved, recomputed = ro.apply_offload(saved, recomputed, ro.offloaded_layers(pl.layers, setup.offload_layers))
    copies = weight_copies_bytes(pl, prec, in_flight)
    if copies and prec.name == "fp8" and layout.zero >= 3 and layout.zero_degree > 1:
        copies = ro.fsdp_weight_copies_bytes(pl, layout, prec.weight_copy_bytes)  # the shard's FP8 copies only
    if copies and prec.name == "amp-bf16" and act.weight_casts:  # (the LM head's cast is in logits)
        copies = 0  # the activation model already counts autocast's weight casts as saved tensors
    head_saved = logits = up = ce = loss_freed = 0
    if last:
        head = am.logits_bytes(spec, setup.micro_batch, setup.seq, param_dtype_bytes=prec.weight_bytes,
                               compute_dtype_bytes=prec.compute_bytes, tp=layout.tp, sp=layout.sp, cp=layout.cp,
                               vocab_parallel=vocab)
        head_saved, up = head.saved_bytes, head.logits_fp32_bytes
        logits = head.logits_bytes + 4  # the fp32 loss scalar, held with the logits by the output
        loss_freed = head.labels_bytes - 4
        _, ce = loss_transients(spec, setup, layout)
        if prec.compute_bytes == 4 and setup.profile == "hf":
            up = 0  # logits.float() of fp32 logits is the same tensor
        extra = loss_parallel_bytes(spec, setup, layout)  # loss_parallel()'s third fp32 buffer, both directions
        up, ce = up + extra, ce + extra
        if setup.cross_entropy_fusion != "none":  # a fused cross entropy: no fp32 logits (memory/recipe_options.py)
            head_saved, logits, up, ce = ro.fused_cross_entropy(head, head_saved, setup.cross_entropy_fusion)
    tokens = setup.micro_batch * ceil_div(setup.seq, layout.cp)
    residual = prec.compute_bytes if setup.profile == "megatron" else prec.weight_bytes
    grads, gathered, full_grads = tl.unit_bytes(pl, layout, prec, granularity=gran)
    ffn = {}
    # the eager loop's full-size expert gradients, measured on one device; under ZeRO-3 (FSDP2's unsharded
    # parameters and its own gradient handling) the simulation holds less than this term: not applied there yet
    slices = experts_path(spec, setup) == "eager" and spec.family.row.expert_slices \
        and layout.zero < 3
    for i in pl.layers:
        mlp = [b.dims for b in spec.layers[i].blocks if isinstance(b.dims, MLPDims)]
        ffn[i] = tl.ffn_backward_transient(tokens=tokens, hidden=spec.hidden_size, intermediate=mlp[-1].intermediate,
                                           gated=mlp[-1].gated, compute_bytes=prec.compute_bytes,
                                           grad_bytes=prec.grad_bytes, granularity=gran, tp=layout.tp) if mlp else 0
        moe = [b for b in spec.layers[i].blocks if isinstance(b.dims, MoEDims)]
        if moe and slices:
            first, down = routed_weights(moe[0])
            per_rank = layout.ep * layout.tp
            ffn[i] = max(ffn[i], tl.eager_experts_backward_transient(
                first_bytes=ceil_div(sum(t.numel * t.experts for t in first), per_rank) * prec.grad_bytes,
                down_bytes=ceil_div(down.numel * down.experts, per_rank) * prec.grad_bytes, granularity=gran))
    persist = setup.grad_lifetime != "set_to_none" or (setup.micro_batches or 1) > 1 or in_flight > 1
    ddp = layout.zero == 0 and layout.zero_degree > 1
    if ddp and setup.bucket_view:
        persist = True  # the gradients are views of DDP's buckets, allocated once
    weights, master, states = ms.weights_bytes, ms.master_weights_bytes, ms.optimizer_states_bytes
    router = _fp32_router_states(spec, pl, layout, prec, setup, gran)
    weights, states = weights + router[0], states + router[1]
    temps = st.optimizer_temporaries_bytes(pl, layout, prec, setup.optimizer, impl=setup.optimizer_impl)
    fp32g = st.fp32_grad_copies_bytes(pl, layout, prec)
    if setup.offload in ("optimizer", "params"):
        master = states = temps = fp32g = 0  # on the CPU, and so is the step
    if setup.offload == "params":
        weights = 0  # the shards live on the CPU; FSDP gathers each module to the GPU (zero3_gather_bytes)
    overhead = framework_overhead(pl, layout, prec, sum(grads.values()) if not setup.bucket_view else 0)
    if setup.zero_impl == "megatron":  # Megatron-Core reduces in its contiguous gradient buffer (memory/setup.py),
        overhead, persist = 0, True  # allocated once, for the whole step
    flat: dict = {}
    if setup.zero_impl == "trainmath" and layout.zero and layout.zero_degree > 1:
        flat = flat_units(pl, layout, prec, min(layout.zero, 2))
        overhead = 0  # no bucket: the buffers are events of the timeline
        temps = step_temporary_bytes(setup.optimizer, [(u.shard_numel,) for u in flat.values()],
                                     state_bytes=prec.state_bytes, impl=setup.optimizer_impl)
        if layout.zero >= 2:
            persist = False  # each micro-step reduces its full gradients; the shards live all step (flat_zero)
            full_grads = {}  # counted as gradients until each unit's reduce (FSDP2's zero3_grad_reduce_bytes)
    fsdp = {}
    fsdp_stage = layout.zero >= 3 or (layout.zero == 2 and setup.zero_impl == "fsdp2")
    if fsdp_stage and layout.zero_degree > 1 and not flat and setup.offload == "none":
        # FSDP2's mixed precision (MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=fp32)) over fp32 parameters:
        # the sharded fp32 parameters are the master weights and the optimizer's, gradients reduce into fp32 shards
        mp = prec.master_bytes > 0
        fsdp = fsdp2.units(pl, layout, prec, granularity=gran, fp32_router=fp32_router(spec, prec),
                           reduce_bytes=prec.master_bytes or None, shard_bytes=prec.master_bytes or None)
        overhead = 0  # no DeepSpeed bucket: FSDP2's buffers are events of its timeline
        if mp:
            weights, master, fp32g = master, 0, 0
        elif layout.zero == 2:  # FSDP2 reshards after backward: between steps a rank holds its weight shards
            weights = st.model_states(pl, replace(layout, zero=3), prec, setup.optimizer, impl=setup.optimizer_impl,
                                      granularity=gran, device=setup.device).weights_bytes \
                + _fp32_router_states(spec, pl, replace(layout, zero=3), prec, setup, gran)[0]
    mixer, norms = _fsdp2_mixer(spec, setup, layout, pl, prec, gran) if fsdp else ({}, {})
    if setup.fp8_param_gather:  # FP8 linear weights: no bf16 copy beside TE's FP8 one (memory/recipe_options.py)
        w_saved, c_saved = ro.fp8_param_bytes_saved(pl, layout)
        copies = max(0, copies - c_saved)
        weights = weights if fsdp else weights - w_saved  # (FSDP's weights between units are its fp32 shards)
    persistent = Persistent(weights_bytes=weights, master_weights_bytes=master, optimizer_states_bytes=states,
                            framework_overhead_bytes=overhead)
    if setup.backward_in_autocast and (layout.pp > 1 or fsdp or flat):
        raise TrainmathError("--backward-in-autocast is modelled on one pipeline stage without ZeRO-3 or "
                             "--zero-impl trainmath (the cache of autocast's weight casts)")
    inp = StepInputs(
        layers=tuple(pl.layers), first=first, last=last, saved=saved, recomputed=recomputed, resident=resident,
        # another micro-batch in flight keeps what this one keeps at the end of its forward (under full recompute
        # its checkpoints, not the one-layer recompute transient)
        other_micro_batches=(in_flight - 1) * (sum(saved.values()) + sum(n.value for n in resident)),
        head_saved=head_saved, loss_freed=max(0, loss_freed),
        logits=logits, output_held=logits if setup.loop_keeps == "output" else (4 if last else 0), batch=8 * tokens,
        logits_fp32=up,
        cross_entropy_grads=ce, hidden_grad=tl.hidden_grad_bytes(tokens, spec.hidden_size, residual, layout.tp,
                                                                  layout.sp),
        ffn_transient=ffn, weight_copies=copies, unit_grads=grads, unit_gathered=gathered, unit_full_grads=full_grads,
        tied_head=layout.pp == 1 and any(t.tied for t in spec.post), tied_grad=_tied_grad(spec, pl, layout, prec, gran),
        persistent=persistent, grads_persist=persist,
        optimizer_temporaries=temps, fp32_grad_copies=fp32g,
        grads_freed_by_copy=bool(fp32g) and (layout.zero == 0 or layout.zero_degree == 1) and not persist,
        positions=8 * ceil_div(setup.seq, layout.cp) if setup.profile == "hf" else 0,
        autocast_cache=_autocast_cache(pl, gran) if setup.backward_in_autocast else {},
        casts_saved=setup.recompute == "none")
    if setup.peft is not None:  # the terms a frozen base with adapters changes (memory/peft.py)
        from trainmath.memory import peft

        psetup = replace(setup, experts=experts_path(spec, setup))  # the op lists' expert path, as full training's
        inp = peft.peft_inputs(spec, psetup, layout, pl, prec, gran, inp, copies)
        if fsdp:  # FSDP2 gathers the frozen base and reduces the adapters alone (memory/peft_fsdp2.py)
            fsdp, mixer, norms = peft.fsdp_terms(spec, psetup, layout, pl, prec, gran)
        elif not flat:  # the math attention's backward moment, as under FSDP2
            mixer = peft.buckets_terms(spec, psetup, layout, pl, prec, gran)
    # a pipeline stage's FSDP2 units: unsharded all step, gradients accumulated unsharded (memory/fsdp2_pipeline.py)
    impl = fsdp2_pipeline.PipelinedFSDP2 if layout.pp > 1 and layout.zero >= 3 else fsdp2.FSDP2
    zero = impl(fsdp, reshard=layout.zero >= 3, mixer=mixer, norm=norms) if fsdp else \
        fz.Flat(flat, layout.zero) if flat else tl.Buckets(mixer=mixer)
    events = tl.step_timeline(inp, zero)
    peak = max(events, key=lambda e: e.bytes)  # the first event at the maximum
    return StageMemory(stage=stage, layers=pl.layers, in_flight=in_flight, phase=peak.name, timeline=events,
                       breakdown=_event_tree(peak, stage))


def fp32_router(spec: ModelSpec, prec) -> bool:
    """transformers keeps the family's router weight fp32 (``Style.router_fp32``: DeepSeek-V2/V3, GLM-4.5) and
    the model's weights are lower precision (bf16, no fp32 master copy)."""
    style = spec.family.style
    return bool(style and style.router_fp32) and prec.weight_bytes < 4 and not prec.master_bytes


def _fp32_router_states(spec: ModelSpec, pl, layout: ParallelLayout, prec, setup: TrainingSetup,
                        gran: int) -> tuple[int, int]:
    """(weight bytes, optimizer-state bytes) an fp32 router weight adds over its count at the model's precision
    (its optimizer states are ``zeros_like`` an fp32 tensor). Measured: FSDPMemTracker's sharded parameters and
    states of DeepSeek-V3 in bf16 (``tests/memory/test_fsdp2_oracle.py``)."""
    if not fp32_router(spec, prec):
        return 0, 0
    from trainmath.placement import Placement

    routers = Placement(stage=pl.stage, layers=pl.layers, tensors=tuple(
        t for t in pl.tensors if t.spec.component == "router" and t.spec.kind == "linear"))
    lo, hi = (st.model_states(routers, layout, p, setup.optimizer, impl=setup.optimizer_impl, granularity=gran,
                              device=setup.device) for p in (prec, get_precision("fp32")))
    return hi.weights_bytes - lo.weights_bytes, hi.optimizer_states_bytes - lo.optimizer_states_bytes


def _dropout_text(spec: ModelSpec, setup: TrainingSetup) -> tuple[str, ...]:
    """The convention line for a config that trains with dropout (hf profile), else nothing."""
    from trainmath.ops.context import DROPOUT_KEYS, Family

    fam = Family.from_config(spec.options, spec.family.config_defaults)
    probs = [f"{k.removesuffix('_dropout')} {getattr(fam, k)}" for k in DROPOUT_KEYS if getattr(fam, k)]
    if not probs or setup.profile != "hf":
        return ()
    how = ("each keeps its bool mask (native_dropout)" if setup.device == "cuda" else
           "each keeps its noise in the input's dtype, and SDPA with dropout runs the fp32 math fallback")
    return (f"dropout in training from the config ({', '.join(probs)}): {how}",)


def _tied_grad(spec: ModelSpec, pl, layout: ParallelLayout, prec, gran: int) -> int:
    """Gradient bytes of the tied embedding weight on this rank (the embedding tensor of the tied head's shape),
    0 when nothing is tied on one stage, or under ZeRO-3 (FSDP2 reduces the root unit at once)."""
    shapes = {t.shape for t in spec.post if t.tied}
    if not shapes or layout.pp > 1 or (layout.zero >= 3 and layout.zero_degree > 1):
        return 0
    return sum(tl.tensor_grad_bytes(t, layout, prec, granularity=gran) for t in pl.tensors
               if t.unit == "embed" and t.spec.shape in shapes)


def _event_tree(event: Event, stage: int) -> Node:
    """Every term of ``TERMS`` as live at ``event``."""
    return Node.of("peak_bytes", list(event.live.terms()), "bytes", note=f"stage {stage}, {event.name}")


def training_memory(spec: ModelSpec, setup: TrainingSetup, layout: ParallelLayout = ParallelLayout(), *,
                    activation_model=None) -> MemoryReport:
    """Peak training memory of the busiest GPU, with a breakdown that sums to it. Raises one ``TrainmathError``
    listing every problem of the setup and layout."""
    bad = check_setup(setup)
    get_precision(setup.precision)
    check_optimizer(setup.optimizer, setup.optimizer_impl)
    if bad:
        raise TrainmathError("invalid training setup: " + "; ".join(bad))
    if isinstance(layout.cp, int) and layout.cp > 1 and setup.seq % layout.cp:
        raise TrainmathError(f"--seq ({setup.seq}) must be a multiple of --cp ({layout.cp}): context parallelism "
                             f"gives every rank an equal slice of the sequence; pass --seq "
                             f"{setup.seq - setup.seq % layout.cp or layout.cp}")
    if setup.offload == "params" and layout.zero != 3:
        raise TrainmathError(f"--offload params needs --zero 3 (parameter offload moves ZeRO-3's parameter "
                             f"shards to the CPU), got --zero {layout.zero}")
    validate_layout(layout, spec)
    stages = tuple(stage_memory(spec, setup, layout, s, activation_model) for s in range(layout.pp))
    top = max(stages, key=lambda m: (m.breakdown.value, -m.stage))
    prec = get_precision(setup.precision)
    conventions = (
        f"activation profile {setup.profile}: " + PROFILE_TEXT[setup.profile],
        f"precision {prec.name}: {prec.description}",
        f"optimizer {setup.optimizer} ({setup.optimizer_impl}); ZeRO-{layout.zero} over dp·cp = "
        f"{layout.zero_degree} ranks (experts over {layout.expert_zero_degree})"
        + ("" if layout.zero not in (1, 2) else
           "; FSDP2 with reshard_after_forward=False (memory/fsdp2.py)"
           if setup.zero_impl == "fsdp2" and layout.zero == 2 else
           "; trainmath's flat padded buffers at the reduce and the all-gather only"
           if setup.zero_impl == "trainmath" else
           "; Megatron-Core's distributed optimizer: gradients reduce-scattered in their contiguous buffer, no bucket"
           if setup.zero_impl == "megatron" else
           "; DeepSpeed's reduce bucket (min(5e8, params) elements) for the whole step")
        + ("" if layout.zero != 3 else
           "; ZeRO-3 as FSDP2 runs it (memory/fsdp2.py)" if setup.zero_impl != "trainmath" else
           "; trainmath's ZeRO-3: the running unit gathered, no prefetch"),
        f"gradient lifetime {setup.grad_lifetime}: " + GRAD_LIFETIME_TEXT[setup.grad_lifetime]
        + ("; DDP gradient_as_bucket_view: gradients are views of the buckets" if setup.bucket_view else ""),
        "the loop keeps " + ("the model output (out = model(...)): the logits live until the step returns "
                             "(--loop-keeps loss: the logits freed after the forward, as most loops do)"
                             if setup.loop_keeps == "output" else
                             "the loss only (loss = model(...).loss): the logits are freed after the forward "
                             "(--loop-keeps output: out = model(...) keeps them through backward)")
        + ("; backward() inside torch.autocast: its cache holds the forward's bf16 weight casts to the end of "
           "backward" if setup.backward_in_autocast else
           "; backward() after torch.autocast exits" if setup.precision == "amp-bf16" else ""),
        layout_text(setup, layout, spec.model_type, spec.options),
        "1F1B pipeline: stage s holds min(pp - s, micro-batches) micro-batches of activations",
        f"peak_bytes is the largest event of the step's timeline (here: {top.phase!r} on stage {top.stage}); "
        "op-level transients inside one layer's forward or backward are not events",
        (f"every tensor rounded up to the CUDA allocator's {setup.granularity}-byte blocks; "
         "peak_bytes = torch.cuda.max_memory_allocated of a step; CUDA context and cached-free memory are outside")
        if setup.device == "cuda" else
        "device cpu: what CPU kernels allocate (no rounding; optimizer step scalars on the device), as MemTracker "
        "counts a CPU step",
        f"offload {setup.offload}: " + OFFLOAD_TEXT[setup.offload],
        f"routed experts {setup.experts}: " + ("transformers' grouped_mm path (its default)"
                                               if setup.experts == "grouped" else "the eager per-expert loop")
        + ("" if experts_path(spec, setup) == setup.experts else
           f"; {spec.model_type}'s grouped path is not modelled: its eager loop is counted (where both are "
           f"modelled, the eager loop saves more)"),
    ) + _dropout_text(spec, setup)
    if setup.peft is not None:
        from trainmath.memory import peft

        conventions += peft.conventions(spec, setup)
    return MemoryReport(model=spec.name, setup=setup, layout=layout, peak_bytes=top.breakdown.value,
                        stage=top.stage, breakdown=top.breakdown, stages=stages,
                        outside_peak={"cuda_context_bytes": None, "allocator_cached_free_bytes": None},
                        conventions=conventions)
