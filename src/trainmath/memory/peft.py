"""One step of a LoRA / QLoRA fine-tune on the timeline: the terms that differ from full training.

``stage_memory`` builds the full-training ``StepInputs``; ``peft_inputs`` replaces what peft changes:

- weights: the frozen base in its dtype, or for QLoRA each quantised Linear as bitsandbytes stores it
  (``qlora.nf4_storage``: packed uint8, absmax per block of 64, double-quantised absmax, the code tables; every
  part its own tensor), plus the adapters in ``--lora-dtype``;
- gradients, optimizer states and the optimizer step's temporaries: the adapters only (the base needs no grad);
  a paged 8-bit optimizer (bitsandbytes' ``PagedAdamW8bit``) keeps its states in CUDA managed memory, outside
  torch's allocator (``paged_optimizer_states_bytes``, not in ``peak_bytes``);
- activations: each layer's op list rewritten by ``ops.lora.lora_layer`` (a frozen Linear saves nothing for its
  weight; the LoRA branch saves its input and its r-wide middle), and the head's by ``ops.lora.frozen_head``
  (the LM head keeps no input); the frozen embedding saves no ids (the loop still holds the batch);
- QLoRA's dequantised weight: ``bnb.matmul_4bit`` dequantises each 4-bit weight to the compute dtype inside the
  Linear (forward, and again for the input gradient) and frees it after the product: the largest one is a
  transient of every forward and backward event.
- a math-SDPA attention's backward (``mixer_terms``, on every layout): a moment inside its layer's backward with
  the adapters' gradients of the modules after it made.

Modelled: one device and DDP (ZeRO-0), ZeRO-1/2 (DeepSpeed: the adapters' states and the reduce bucket over the
trainable parameters), and FSDP2 (``--zero 3``, or ``--zero 2 --zero-impl fsdp2``: ``memory.peft_fsdp2``, every
parameter sharded and gathered, the adapters alone reduced; LoRA only, bitsandbytes' 4-bit weights are not
shardable). ``--offload optimizer`` over ZeRO-0/1/2 is DeepSpeed ZeRO-Offload: the adapters' master weights,
optimizer states and step leave the GPU, and ``memory.host.peft_host_memory`` sizes the host buffers over the
trainable parameters alone; parameter offload and offload under FSDP2 are refused. Dense and
MoE MLPs (the routed experts and router frozen; targeting them, peft's ``target_parameters``, is refused).
``--recompute selective``: torchtitan's op-level policy folded over the peft op list (``ops.selective``, the
adapters' lora_A and lora_B counted among the layer's mms). Tensor parallelism is refused with peft's reason
(``check``); pipeline, context and expert parallelism in one line.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from trainmath import families
from trainmath.adapters import ADAPTER_DTYPES, PeftJob, adapter_report, select
from trainmath.arith import ceil_div
from trainmath.errors import TrainmathError
from trainmath.memory import peft_backward, peft_fsdp2
from trainmath.memory import states as st
from trainmath.memory.optimizers import state_tensors, step_temporary_bytes
from trainmath.memory.step import Persistent
from trainmath.ops.fold import saved_storages
from trainmath.ops.lora import LoraRun, frozen_head, lora_layer
from trainmath.qlora import nf4_storage
from trainmath.tree import Node

PAGED = ("adam8bit", "adamw8bit")
"""Optimizers bitsandbytes ships paged variants of (``PagedAdam8bit``, ``PagedAdamW8bit``)."""
QLORA_PRECISIONS = ("bf16",)


@dataclass(frozen=True, kw_only=True)
class PeftRun:
    """The fine-tuning job and how the loop runs it."""

    job: PeftJob
    dropout: float = 0.0
    """peft's ``lora_dropout``."""
    input_grads: bool | None = None
    """``enable_input_require_grads()``: the embedding's output requires grad, so layer 0 computes and saves for
    its input's gradient. None: on with recompute (peft does it for gradient checkpointing), else off."""
    paged: bool = False
    """The optimizer's states in CUDA managed memory (bitsandbytes' paged optimizers)."""

    def input_grad(self, recompute: str) -> bool:
        return recompute != "none" if self.input_grads is None else self.input_grads


def check(spec, setup, layout, run: PeftRun) -> None:
    """One-line refusals of what is not a peft run or not modelled."""
    job = run.job
    if layout.tp > 1:  # torch 2.13 style.py ColwiseParallel/RowwiseParallel._apply; peft 0.21 tuners/lora/tp_layer.py
        raise TrainmathError("--peft with --tp is not modelled: peft's tensor-parallel LoRA is Megatron-core's "
                             "(LoraParallelLinear over ColumnParallelLinear/RowParallelLinear), and torch's "
                             "parallelize_module, the runtime's TP plan, shards only nn.Linear and nn.Embedding, not "
                             "peft's lora.Linear (one device, DDP, ZeRO-1/2 and FSDP2 are modelled)")
    if layout.pp > 1 or layout.cp > 1 or layout.ep > 1:
        raise TrainmathError("--peft with --pp/--cp/--ep is not modelled (one device, DDP, ZeRO-1/2 and FSDP2 are)")
    if fsdp_stage(setup, layout) and run.job.method == "qlora":
        raise TrainmathError("--peft qlora with FSDP2 (--zero 3, or --zero 2 --zero-impl fsdp2) is not modelled: "
                             "bitsandbytes' Params4bit is not a tensor fully_shard can shard; use --zero 0-2")
    if setup.profile != "hf":
        raise TrainmathError("--peft is modelled with the hf activation profile (transformers' saved tensors)")
    if setup.offload == "params":  # deepspeed 0.19.8 runtime/zero/stage3.py, partition_parameters.py
        raise TrainmathError("--peft with --offload params is not modelled: ZeRO-Infinity's zero.Init partitions "
                             "and offloads the frozen base too, per parameter outside the optimizer's flat fp32 "
                             "groups (which hold the adapters alone), and the peft GPU timeline has no DeepSpeed "
                             "ZeRO-3; use --offload optimizer with --zero 0-2")
    if setup.offload == "optimizer" and fsdp_stage(setup, layout):
        raise TrainmathError("--peft with --offload optimizer is modelled with DeepSpeed ZeRO-Offload over --zero "
                             "0-2: peft's --zero 3 (and --zero-impl fsdp2) is FSDP2, whose CPUOffloadPolicy "
                             "(parameters, gradients and states together) is not modelled")
    if setup.offload != "none" and run.paged:
        raise TrainmathError("--paged-optimizer with --offload: the optimizer runs on the CPU (DeepSpeed's), "
                             "there are no device states to page")
    if setup.recompute == "selective" and fsdp_stage(setup, layout):
        raise TrainmathError("--peft with --recompute selective is modelled on one device, DDP and ZeRO-1/2 (measured "
                             "against MemTracker on one device); under FSDP2 (--zero 3) use --recompute none or full")
    if setup.zero_impl == "trainmath" or setup.backward_in_autocast:
        raise TrainmathError("--peft with --zero-impl trainmath or --backward-in-autocast is not modelled")
    if spec.family.layer is None:
        raise TrainmathError(f"--peft memory needs {spec.model_type}'s op list (families: "
                             f"{', '.join(families.modelled())})")
    if any(b.kind in ("mamba", "linear_attention", "mla") for ly in spec.layers for b in ly.blocks):
        raise TrainmathError(f"--peft memory is modelled for attention layers with dense or MoE MLPs; {spec.name} "
                             f"has MLA, Mamba or linear-attention blocks")
    params = [m.name for m in select(spec, job) if m.parameter]
    if params:
        raise TrainmathError(f"--peft memory with routed-expert or router targets ({', '.join(params)}: bare "
                             f"Parameters peft adapts through target_parameters, whose ParamWrapper adds B·A to the "
                             f"whole weight in every forward) is not modelled; target the attention and dense "
                             f"Linears (e.g. --lora-targets q_proj,k_proj,v_proj,o_proj)")
    if job.method == "qlora" and setup.precision not in QLORA_PRECISIONS:
        raise TrainmathError(f"--peft qlora runs a bf16 model over its 4-bit weights (bnb_4bit_compute_dtype "
                             f"bf16): pass --precision bf16, not {setup.precision}")
    if not 0 <= run.dropout < 1:
        raise TrainmathError(f"--lora-dropout {run.dropout}: must be in [0, 1)")
    if run.paged and setup.optimizer not in PAGED:
        raise TrainmathError(f"--paged-optimizer needs --optimizer {' or '.join(PAGED)} (bitsandbytes' paged "
                             f"8-bit optimizers), got {setup.optimizer}")
    if setup.attention != "sdpa" and spec.family.style.attention != "eager":
        raise TrainmathError("--peft memory is modelled with --attention sdpa")


def fsdp_stage(setup, layout) -> bool:
    """The layout runs as FSDP2 (``memory.training``'s rule): ZeRO-3, or ZeRO-2 with ``--zero-impl fsdp2``."""
    return layout.zero_degree > 1 and (layout.zero >= 3 or (layout.zero == 2 and setup.zero_impl == "fsdp2"))


def mixer_terms(spec, setup, layout, prec, gran: int, by_layer: dict) -> dict:
    """layer index → ``fsdp2.MixerBackward`` of its peft op list (``by_layer``: ``layer_ops``), for the layers whose
    attention runs the math SDPA kernel (the op list's ``sdpa_math``, full training's rule): its backward holds
    the adapters' gradients of the modules after it (the frozen weights make none), on this rank as the walk
    holds them (full size but under DeepSpeed's ZeRO-2, whose shard ``adapter_states`` counts)."""
    from trainmath.memory.fsdp2 import mixer_backward

    run: PeftRun = setup.peft
    ab = ADAPTER_DTYPES[run.job.dtype]
    deg = layout.zero_degree if layout.zero == 2 and layout.zero_degree > 1 and not fsdp_stage(setup, layout) else 1
    adapters = adapter_modules(spec, run.job)
    out = {}
    for i, (_, ops, _) in by_layer.items():
        mine = adapters.get(f"layer.{i}", {})
        mix = mixer_backward(ops, [], param_bytes=ab, granularity=gran, grads_after=lambda modules, mine=mine: ceil_div(
            sum(st.alloc_bytes(a * b * ab, gran) for m, v in mine.items() if m in modules for a, b in v), deg))
        if mix:
            out[i] = mix
    return out


def buckets_terms(spec, setup, layout, pl, prec, gran: int) -> dict:
    """``mixer_terms`` of the rank's layers for the one-device, DDP and ZeRO-1/2 walk (``timeline.Buckets``)."""
    return mixer_terms(spec, setup, layout, prec, gran, layer_ops(spec, setup, prec, setup.peft, pl.layers))


def fsdp_terms(spec, setup, layout, pl, prec, gran: int) -> tuple[dict, dict, dict]:
    """(FSDP2's units, layer index → ``fsdp2.MixerBackward``, layer index → ``fsdp2.NormBackward``) of the
    fine-tune (``memory.peft_fsdp2``), read from each layer's peft op list: a math-SDPA attention's backward
    (``mixer_terms``: the adapters' gradients full size under FSDP2); the input norm's backward runs only where the
    layer's input needs a gradient."""
    from trainmath.memory.fsdp2 import norm_backward

    run: PeftRun = setup.peft
    ab = ADAPTER_DTYPES[run.job.dtype]
    by_layer = layer_ops(spec, setup, prec, run, pl.layers)
    norms = {}
    for i, (_, ops, input_grad) in by_layer.items():
        norm = norm_backward(ops) if input_grad else None
        if norm:
            norms[i] = norm
    return (peft_fsdp2.units(layout, pl, prec, adapter_shapes(spec, run.job), ab, granularity=gran),
            mixer_terms(spec, setup, layout, prec, gran, by_layer), norms)


def quantised(spec, t) -> bool:
    """A base tensor bitsandbytes stores in 4 bits: every ``nn.Linear`` but the output embedding (transformers'
    ``get_keys_to_not_convert``); routed experts (3-d Parameters) and bare router weights stay in bf16."""
    s = t.spec
    return (s.kind == "linear" and t.unit.startswith("layer.") and not s.experts
            and (s.component != "router" or spec.family.linear_router))


def base_weight_bytes(spec, pl, prec, method: str, gran: int) -> int:
    """The frozen base on this rank: its dtype, or NF4 storage (each part a tensor) for QLoRA's Linears."""
    total = 0
    for t in pl.tensors:
        if method == "qlora" and quantised(spec, t):
            parts = nf4_storage(t.numel)
            one = sum(st.alloc_bytes(v, gran) for k, v in parts.items() if k != "total")
        else:
            one = st.alloc_bytes(t.numel * prec.weight_bytes, gran)
        total += one * t.copies
    return total


def adapter_modules(spec, job: PeftJob) -> dict[str, dict[str, list[tuple[int, int]]]]:
    """unit ``layer.<i>`` → adapted module (layer-relative name) → its (lora_A, lora_B) weight shapes."""
    out: dict[str, dict] = {}
    mods = {m.name for m in select(spec, job)}
    for i, layer in enumerate(spec.layers):
        for t in layer.tensors:
            name = t.name.removesuffix(".weight")
            if t.kind == "linear" and name in mods and not t.experts:
                o, n = reversed(t.shape) if t.transposed else t.shape
                out.setdefault(f"layer.{i}", {})[name] = [(job.rank, n), (o, job.rank)]
    return out


def adapter_shapes(spec, job: PeftJob) -> dict[str, list[tuple[int, int]]]:
    """unit ``layer.<i>`` → the adapters' (lora_A, lora_B) weight shapes in that layer."""
    return {u: [s for v in mods.values() for s in v] for u, mods in adapter_modules(spec, job).items()}


def largest_dequant(spec, pl, prec, gran: int) -> int:
    """The largest 4-bit weight dequantised to the compute dtype (one at a time inside ``matmul_4bit``)."""
    return max((st.alloc_bytes(t.numel * prec.compute_bytes, gran) for t in pl.tensors if quantised(spec, t)),
               default=0)


def _job(spec, setup, prec):
    from trainmath.ops.program import EmitJob

    return EmitJob(batch=setup.micro_batch, seq=setup.seq, precision=prec, attention=setup.attention,
                   experts=setup.experts, device=setup.device)  # training passes its path


def _bytes(ops) -> int:
    return sum(s.nbytes() for _, s in saved_storages(ops))


def layer_ops(spec, setup, prec, run: PeftRun, layers) -> dict[int, tuple[list, list, bool]]:
    """layer index → (its op list in full training, under peft, whether its input requires grad)."""
    from trainmath.ops.program import context, layer_program

    job = _job(spec, setup, prec)
    ctx = context(spec, job)
    targets = frozenset(m.name for m in select(spec, run.job))
    out = {}
    for i in layers:
        prog = layer_program(spec, job, spec.layers[i], ctx)
        lr = LoraRun(targets=targets, rank=run.job.rank, adapter_bytes=ADAPTER_DTYPES[run.job.dtype],
                     dropout=run.dropout, input_grad=i > 0 or run.input_grad(setup.recompute), device=setup.device)
        out[i] = (prog.ops, lora_layer(prog.ops, lr, autocast=ctx.p.autocast, compute=ctx.p.compute_bytes),
                  lr.input_grad)
    return out


def layer_saved(spec, setup, prec, run: PeftRun, layers) -> dict[int, tuple[int, int]]:
    """layer index → (saved bytes in full training, saved bytes under peft), folded from its op list."""
    return {i: (_bytes(full), _bytes(mine)) for i, (full, mine, _) in layer_ops(spec, setup, prec, run, layers).items()}


def frozen_embedding(node: Node) -> Node:
    """The embedding's saved tensors (``ops.model.embedding_ops``) when its output needs no gradient (no
    ``enable_input_require_grads``): a dropout on it (``embedding.dropout``) keeps no noise; the ids stay (the loop
    holds the batch)."""
    kept = [c for c in node.children if not c.name.startswith("embedding.dropout.")]
    return Node.of(node.name, kept, node.unit, note=node.note)


def head_saved_delta(spec, setup, prec) -> int:
    """Bytes the frozen final norm and LM head do not save (their inputs, kept in full training for the
    weights' gradients)."""
    from trainmath.ops.program import head_program

    ops = head_program(spec, _job(spec, setup, prec))[0].ops
    return _bytes(ops) - _bytes(frozen_head(ops))


def adapter_states(spec, setup, layout, prec, run: PeftRun, gran: int, bucket: int = 0) -> dict:
    """Adapter weights, gradients per unit, master weights, optimizer states (device / paged) and step
    temporaries on one rank; ZeRO-1/2 shard the states over ``layout.zero_degree`` ranks. ``bucket``: DeepSpeed's
    reduce bucket in elements as full training sizes it (min(reduce_bucket_size, the rank's parameters)), which
    holds min(that, the trainable parameters) in the adapters' dtype."""
    shapes = adapter_shapes(spec, run.job)
    ab = ADAPTER_DTYPES[run.job.dtype]
    weights = sum(st.alloc_bytes(a * b * ab, gran) for v in shapes.values() for a, b in v)
    grads = {u: sum(st.alloc_bytes(a * b * ab, gran) for a, b in v) for u, v in shapes.items()}
    flat = [s for v in shapes.values() for s in v]
    deg = layout.zero_degree if layout.zero >= 1 else 1
    held = [(ceil_div(a * b, deg),) for a, b in flat]  # a flat ZeRO shard of each adapter
    master_bytes = 4 if prec.master_bytes and ab < 4 else 0
    state_bytes = max(ab, master_bytes)
    master = sum(st.alloc_bytes(n * master_bytes, gran) for (n,) in held) if master_bytes else 0
    states = 0
    for s in held:
        for t in state_tensors(setup.optimizer, s, state_bytes=state_bytes, impl=setup.optimizer_impl):
            if t.on_device or setup.device == "cpu":
                states += st.alloc_bytes(t.nbytes, gran)
    temps = step_temporary_bytes(setup.optimizer, held, state_bytes=state_bytes, impl=setup.optimizer_impl)
    if layout.zero in (1, 2) and layout.zero_degree > 1:
        trainable = sum(a * b for a, b in flat)
        grads = {u: ceil_div(g, deg) for u, g in grads.items()} if layout.zero == 2 else grads
        overhead = min(bucket, trainable) * ab
    else:
        overhead = sum(grads.values()) if layout.zero_degree > 1 else 0  # DDP's buckets copy every gradient
    return {"weights": weights, "grads": grads, "master": master, "states": 0 if run.paged else states,
            "paged": states if run.paged else 0, "temps": temps, "overhead": overhead}


def peft_inputs(spec, setup, layout, pl, prec, gran: int, inp, copies: int):
    """``inp`` (full training's ``StepInputs``) with the terms a peft run changes (see the module docstring)."""
    run: PeftRun = setup.peft
    check(spec, setup, layout, run)
    layers = list(inp.layers)
    by_layer = layer_ops(spec, setup, prec, run, layers)
    folded = {i: (_bytes(full), _bytes(mine)) for i, (full, mine, _) in by_layer.items()}
    saved, recomputed = dict(inp.saved), dict(inp.recomputed)
    if setup.recompute == "selective":  # torchtitan's op-level policy over the peft op list (ops.selective)
        from trainmath.ops.selective import selective_layer

        sel = {i: selective_layer(spec.layers[i].label, mine, spec.layers[i]) for i, (_, mine, _) in by_layer.items()}
        saved = {i: kept.value for i, (kept, _) in sel.items()}
        top = max(fresh.value for _, fresh in sel.values())
        recomputed = {i: top for i in sel}
    for i, (full, mine) in folded.items():
        if setup.recompute == "selective":
            continue
        if setup.recompute == "full":
            recomputed[i] = max(0, recomputed[i] - (full - mine))
        else:
            saved[i] = max(0, saved[i] - (full - mine))
    # a frozen embedding saves no ids, but the loop holds the batch through the step: the resident ids stay.
    # enable_input_require_grads() makes the embedding's output a leaf that requires grad: the graph's
    # AccumulateGrad node holds it to the end of backward. Under full recompute that storage is layer 0's
    # checkpointed input, already counted among the checkpoints.
    resident = list(inp.resident)
    if inp.first and not run.input_grad(setup.recompute):
        resident = [frozen_embedding(n) if n.name == "embedding" else n for n in resident]
    if inp.first and run.input_grad(setup.recompute) and setup.recompute == "none":
        tokens = setup.micro_batch * setup.seq
        resident.append(Node(name="embedding output (leaf requiring grad)", unit="bytes",
                             value=st.alloc_bytes(tokens * spec.hidden_size * prec.weight_bytes, gran),
                             note="enable_input_require_grads(): held by autograd's AccumulateGrad node"))
    bucket = inp.persistent.framework_overhead_bytes // prec.grad_bytes if layout.zero in (1, 2) else 0
    ad = adapter_states(spec, setup, layout, prec, run, gran, bucket)
    weights = base_weight_bytes(spec, pl, prec, run.job.method, gran) + ad["weights"]
    if fsdp_stage(setup, layout):  # every parameter a dim-0 shard; FSDP2's buffers are events of its walk
        sh = peft_fsdp2.sharded_states(setup, layout, pl, prec, adapter_shapes(spec, run.job),
                                       ADAPTER_DTYPES[run.job.dtype], granularity=gran)
        weights, ad = sh["weights"], {**ad, "master": 0, "states": sh["states"], "temps": sh["temps"], "overhead": 0}
    if setup.offload == "optimizer":  # ZeRO-Offload: the adapters' master, states and step on the host
        ad = {**ad, "master": 0, "states": 0, "temps": 0}
    transient = largest_dequant(spec, pl, prec, gran) if run.job.method == "qlora" else 0
    units = {u: ad["grads"].get(u, 0) for u in inp.unit_grads}
    peaks = {}
    if setup.recompute == "full":
        from trainmath.memory.peft_recompute import recompute_peak

        for i, (_, mine, _) in by_layer.items():
            r = recompute_peak(mine, granularity=gran)
            peaks[i] = (r.not_yet, r.transient, r.grads)
    head = head_saved_delta(spec, setup, prec) if inp.last else 0
    return replace(
        inp, saved=saved, recomputed=recomputed, resident=resident,
        other_micro_batches=0 if not inp.other_micro_batches else inp.other_micro_batches,
        head_saved=max(0, inp.head_saved - head), unit_grads=units, tied_grad=0,
        persistent=Persistent(weights_bytes=weights, master_weights_bytes=ad["master"],
                              optimizer_states_bytes=ad["states"], framework_overhead_bytes=ad["overhead"]),
        optimizer_temporaries=ad["temps"], fp32_grad_copies=0, weight_copies=copies + transient,
        ffn_transient=peft_backward.ffn_transients(spec, setup, layout, prec, gran, by_layer),
        recompute_peaks=peaks)


def peft_summary(spec, setup, layout, pl, prec, gran: int) -> dict:
    """Figures the output states beside the peak: trainable parameters, the paged states, QLoRA's parts."""
    run: PeftRun = setup.peft
    rep = adapter_report(spec, run.job, base_params=sum(t.params for t in pl.tensors))
    ad = adapter_states(spec, setup, layout, prec, run, gran)
    base = base_weight_bytes(spec, pl, prec, run.job.method, gran)
    if fsdp_stage(setup, layout):  # the rank's shards
        sh = peft_fsdp2.sharded_states(setup, layout, pl, prec, adapter_shapes(spec, run.job),
                                       ADAPTER_DTYPES[run.job.dtype], granularity=gran)
        base, ad = sh["base"], {**ad, "weights": sh["adapters"]}
    return {"trainable_params": rep.trainable_params, "adapter_params": rep.adapter_params,
            "base_weight_bytes": base, "adapter_weight_bytes": ad["weights"],
            "paged_optimizer_states_bytes": ad["paged"],
            "qlora_dequant_transient_bytes": largest_dequant(spec, pl, prec, gran) if run.job.method == "qlora"
            else 0, "input_grads": run.input_grad(setup.recompute), "lora_dropout": run.dropout}


def report_summary(spec, setup, layout) -> dict:
    """``peft_summary`` for the first stage's placement (the CLI's ``peft`` figures)."""
    from trainmath.placement import place
    from trainmath.vocabulary import get_precision

    gran = 1 if setup.device == "cpu" else setup.granularity
    return peft_summary(spec, setup, layout, place(spec, layout, 0, vocab_parallel=False),
                        get_precision(setup.precision), gran)


def conventions(spec, setup) -> tuple[str, ...]:
    run: PeftRun = setup.peft
    j = run.job
    return (
        f"peft {j.method}: base frozen in " + ("NF4 (bitsandbytes Params4bit: packed uint8, absmax per 64, "
                                               "double-quantised absmax, code tables; lm_head, embeddings, norms "
                                               "bf16; prepare_model_for_kbit_training's fp32 upcast not applied)"
                                               if j.method == "qlora" else "its dtype")
        + f"; adapters r={j.rank} in {j.dtype}, with their gradients and optimizer states only",
        "frozen Linears save nothing for their weights; each LoRA branch saves its input (cast to the adapter "
        "dtype) and its r-wide middle" + (f", and its dropout mask (p={run.dropout})" if run.dropout else "")
        + "; the frozen embedding and LM head keep no inputs",
        "layer 0 " + ("computes its input's gradient (enable_input_require_grads)" if run.input_grad(setup.recompute)
                      else "starts without gradients (frozen embedding, no enable_input_require_grads)"),
        "paged optimizer: states in CUDA managed memory, outside torch's allocator and peak_bytes" if run.paged
        else "optimizer states on the device",
    ) + (("QLoRA: the largest weight dequantised to bf16 is a transient in every forward and backward event",)
         if j.method == "qlora" else ())
