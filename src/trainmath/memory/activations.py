"""Activation memory: the bytes a training step saves for backward, per layer type and per saved tensor.

Two profiles describe two implementations:

- ``hf`` (default): transformers 5.x modeling code with SDPA attention, ``use_cache=False``, no padding mask (SDPA
  runs ``is_causal`` and native GQA), the config's dropouts (GPT-2, StarCoder2; ``ops.kernels.dropout``, by
  ``device``). Every term is one tensor that autograd keeps, found by running the modeling code under
  ``torch.autograd.graph.saved_tensors_hooks`` and counting distinct storages (parameters excluded);
  ``tests/activations`` asserts exact equality on tiny models. ``eager`` is the same with
  ``attn_implementation="eager"`` (the s² softmax is saved).
- ``megatron``: what Megatron-Core's ``TransformerLayer`` saves (``trainmath.memory.megatron``): Korthikanti et al.
  2022, "Reducing Activation Recomputation in Large Transformer Models", Table 2 exactly for the paper's GPT layer
  (sbh(34 + 5as/h) with TP/SP/selective variants, unfused attention), and for SwiGLU, GQA, flash attention, MoE
  and MLA each saved tensor from the Megatron-LM module that saves it.

Recompute: ``none``; ``full`` is transformers' ``gradient_checkpointing_enable()`` (whole layers, measured);
``selective``: in the ``megatron`` profile Megatron-Core's ``core_attn`` recompute (Korthikanti et al. §5: drop the
core attention's own tensors, the 5as²b term, or flash's logsumexp); in
``hf``/``eager`` torchtitan's op-level selective checkpointing, which transformers lacks and
``trainmath.runtime.checkpointing.apply_selective`` applies to its decoder layers (``trainmath train`` and
``--simulate`` run it): a fold over the same op lists (``trainmath.ops.selective``), checked against the runtime
in ``tests/activations/test_selective_oracle.py``.

What is computed is described once, as op lists (``trainmath.ops``): each family's table row and layer emitter
(``trainmath.families``: one ``FamilyDef`` each; the family modules there document each family's quirks: Phi-3's fused
projections, OLMo-2's post-norms, Gemma's sandwich norms, Cohere's parallel block, GPT-2's Conv1D, Falcon's three
variants, MLA, the routers and expert paths, gpt-oss's sinks, Llama 4's all-token experts, Gated DeltaNet and Mamba-2 on
transformers' torch paths), the embedding, rotary tables and head (``ops.model``); this module folds them into the trees
below. Config switches that change what is saved but not the parameters (partial rotary, soft-capping, logit scale,
Llama 4's ``use_qk_norm`` and ``attn_temperature_tuning``) come from ``Family``, router switches from ``Router``; by
default both are read from the switches the spec carries (``ModelSpec.options``).
Other families raise a ``TrainmathError``. The oracle counts storages still held by the autograd graph when the
forward ends: nodes that cannot reach the loss (a router's group selection) free what they packed.

Precision is two numbers: ``compute_dtype_bytes`` (what matmuls produce) and ``param_dtype_bytes`` (the parameters'
dtype). 2 and 4 is bf16 autocast (fp32 master weights): the residual stream is fp32, every Linear saves its own bf16
cast of an fp32 input, and each Linear's weight is cast once per step and kept for backward ("autocast weight
copies"). 2 and 2 is a pure-bf16 model; 4 and 4 is fp32.

Symbols: b micro-batch, s sequence, T = b·s tokens, d hidden, h/h_kv heads, h_d head dim, q = h·h_d, kv = h_kv·h_d,
f MLP width, c compute bytes, r residual-stream bytes (4 under autocast), V vocabulary.
"""

from __future__ import annotations

from collections.abc import Sequence

from trainmath import families
from trainmath.arith import ceil_div
from trainmath.errors import TrainmathError
from trainmath.memory.megatron import activations_megatron, layer_terms, megatron_layer_terms  # noqa: F401
from trainmath.memory.saved import HeadActivations, LayerGroup, SavedActivations
from trainmath.model.options import DROPOUT_OPTIONS
from trainmath.model.spec import (
    ModelSpec,
)
from trainmath.ops import model as model_ops
from trainmath.ops.context import (  # noqa: F401
    DROPOUT_KEYS,
    FP32,
    INT64,
    Ctx,
    Family,
    Router,
)
from trainmath.ops.fold import layer_node, saved_leaves, saved_storages
from trainmath.ops.ir import Axis, Degrees, Tensor
from trainmath.ops.program import EmitJob, context, head_program, layer_program
from trainmath.ops.selective import LAYER_INPUT, mask_arguments, selective_layer
from trainmath.tree import Node
from trainmath.vocabulary import DEVICES, RECOMPUTE, precision_of

PROFILES = ("hf", "eager", "megatron")
SAVED_LAYER_INPUT = (LAYER_INPUT, "input_layernorm.x_fp32")
"""The saved tensors that are the layer's input itself under an fp32 residual stream (the input, or the input norm's
fp32 alias of it, ``kernels.norms``), which full recompute does not save again beside the checkpoint. Only these
names are matched: a LayerNorm's view of the input (GPT-2, Falcon) is counted as recomputed again."""
SCAN_KINDS = {"linear_attention": "Gated DeltaNet", "mamba": "Mamba-2"}
"""Sequence mixers that context parallelism cannot split (block kind: what the refusal calls it)."""


def _check(name: str, value, allowed) -> None:
    if value not in allowed:
        raise TrainmathError(f"{name} must be one of {', '.join(map(str, allowed))}, got {value!r}")


def activation_bytes(spec: ModelSpec, *, micro_batch: int, seq: int, profile: str = "hf",
                     recompute: str = "none", compute_dtype_bytes: int = 2, tp: int = 1, sp: bool = False,
                     cp: int = 1, pp: int = 1, layers: Sequence[int] | None = None,
                     param_dtype_bytes: int = 4, experts_hit: int | None = None,
                     norm_topk_prob: bool | None = None, router: Router | None = None,
                     family: Family | None = None, experts: str = "eager", ep: int = 1,
                     vocab_parallel: bool = False, device: str = "cuda", attention: str = "sdpa",
                     recompute_saves: tuple[str, ...] = (), recompute_modules: tuple[str, ...] = (),
                     fp8_linear_inputs: bool = False, expert_tp: int | None = None) -> SavedActivations:
    """Bytes saved for backward by one micro-batch on one rank (``saved.SavedActivations``): per layer type (its
    layers, one layer's saved tensors), plus ``embedding`` (what the embedding saves) and ``rotary`` (cos/sin,
    computed once, shared by all layers). The final norm and the LM head/loss path are in ``logits_bytes``.

    ``recompute="full"``: transformers' ``gradient_checkpointing_enable()`` (``use_reentrant=False`` in 5.x): each
    layer keeps only its input (r·T·d); the backward recomputes one layer at a time, reported as the separate field
    ``recompute_transient`` (the largest layer's no-recompute bytes). ``selective`` (hf, eager):
    torchtitan's op-level policy as ``trainmath.runtime.checkpointing.apply_selective`` runs it: each layer keeps
    its input and the cached mm/SDPA outputs, and its recompute saves the rest again (``ops.selective``), for
    every family of the table (each checked against it). Under either recompute the attention masks the layers
    receive as arguments are ``masks`` (``ops.selective.
    mask_arguments``). ``megatron``: Megatron-Core's layers (``activations_megatron``; ``attention``: ``sdpa`` is
    flash attention, ``eager`` the unfused core attention that saves the s² softmax, Korthikanti's Table 2).

    ``layers``: indices of the layers on this rank (default: all, or ``pp`` equal stages' first stage).
    ``experts_hit``: routed experts that received tokens (only changes the autocast weight copies; default all).
    ``norm_topk_prob``: the MoE config flag of that name (Qwen3-MoE Hub configs set it; Mixtral always
    renormalises); the spec does not carry it; default (None): transformers' default for the family (False for
    qwen2_moe and deepseek_v2, else True). ``router``: the MoE router switches (``Router.from_config``); when
    given it replaces ``norm_topk_prob``; default ``Router(norm_topk_prob=norm_topk_prob)`` (DeepSeek-V3's routing;
    DeepSeek-V2 configs need ``Router.from_config`` for ``topk_method``, worth 1·T·n bytes per MoE layer).
    ``device``: ``cuda`` or ``cpu``, where the kernels differ in what they keep (dropout: ``ops.kernels.dropout``).
    Dropout: the config's (``Family``: attention, residual, embedding) where the family's emitters apply them
    (GPT-2, StarCoder2: ``Style.dropout``); a nonzero dropout of another family is refused in one line.
    Per rank (hf/eager): ``tp``, ``sp``, ``cp``, ``ep`` (and ``vocab_parallel``, which changes nothing here: the
    embedding saves its whole ids either way) are the layout's degrees (``ops.ir.Degrees``); each layer's op list
    is folded on one rank (``ops.fold.layer_node``). The layout is the one the issue defines: ``--tp`` is
    ``parallelize_module`` on transformers' decoder layers (column-wise q/k/v/gate/up, row-wise o/down; norms,
    residual stream, embedding and head whole); ``sp`` cuts the residual stream and the norms on the sequence
    (torch's ``SequenceParallel``, the all-gathered input of a column-wise Linear is its own storage, which the
    Linear saves); ``cp`` keeps s/cp positions of every tensor, ring attention's local K/V chunk and logsumexp
    (torch's ``context_parallel``: the query, key, value, output and logsumexp SDPA saves are the rank's own;
    the rotation buffers are transients); ``ep`` divides the routed experts a rank holds (n/ep: their weights and
    autocast copies), not the routed rows: expert-parallel ranks are drawn from data parallelism, each brings its
    own micro-batch, and under balanced routing each receives T·k rows for its experts, as on one device (the
    all-to-all buffers are transients); ``cp`` also divides the routed rows (a rank routes its own T/cp tokens).
    Measured per rank on 2 gloo ranks for the families with a TP plan (``FamilyDef.tp``, ``docs/tensor-parallel.md``);
    the other families are folds of their op lists' axes. Refused in one line: ``--tp`` for fused projections that
    no plan here splits by heads (``Style.fused_projections``: GPT-2, Falcon; Phi-3's are interleaved per rank by
    ``runtime.tensor_parallel.interleave_fused`` and measured) and ``--cp`` for Gated DeltaNet / Mamba-2 layers
    (torch's ``context_parallel`` splits only SDPA; the scans carry their state along the sequence).
    """
    _check("profile", profile, PROFILES)
    _check("recompute", recompute, RECOMPUTE)
    _check("compute_dtype_bytes", compute_dtype_bytes, (2, 4))
    _check("param_dtype_bytes", param_dtype_bytes, (2, 4))
    _check("experts", experts, ("eager", "grouped"))
    _check("device", device, DEVICES)
    if micro_batch < 1 or seq < 1:
        raise TrainmathError(f"micro_batch ({micro_batch}) and seq ({seq}) must be positive")
    if param_dtype_bytes < compute_dtype_bytes:
        raise TrainmathError(f"param_dtype_bytes ({param_dtype_bytes}) below compute_dtype_bytes "
                             f"({compute_dtype_bytes}) is not a transformers training setup")
    indices = _rank_layers(spec, layers, pp)
    if recompute_saves and (profile != "megatron" or recompute != "full"):
        raise TrainmathError("recompute_saves names what a full-recompute layer keeps: megatron profile, "
                             f"recompute full only (got {profile}, {recompute})")
    if recompute_modules and (profile != "megatron" or recompute != "selective"):
        raise TrainmathError("recompute_modules are Megatron-Core's --recompute-modules: megatron profile, recompute "
                             f"selective only (got {profile}, {recompute})")
    if profile == "megatron":
        fam = family or Family.from_config(spec.options, spec.family.config_defaults)
        return activations_megatron(spec, micro_batch=micro_batch, seq=seq, recompute=recompute, tp=tp, sp=sp,
                                    cp=cp, layers=indices, compute_dtype_bytes=compute_dtype_bytes,
                                    attention=attention, attention_dropout=fam.attention_dropout,
                                    residual_dropout=fam.residual_dropout, recompute_saves=recompute_saves,
                                    recompute_modules=recompute_modules, fp8=fp8_linear_inputs,
                                    expert_tp=expert_tp)
    deg = _degrees(spec, seq, tp=tp, sp=sp, cp=cp, ep=ep, vocab_parallel=vocab_parallel)
    if profile == "eager" and cp > 1:
        raise TrainmathError(f"--attention eager with --cp {cp} is not modelled: context parallelism (torch's "
                             f"context_parallel, ring attention) runs SDPA; pass --attention sdpa or --cp 1")
    if not spec.family.modelled:
        raise TrainmathError(f"the {profile} activation profile is exact only for {', '.join(families.modelled())}; "
                             f"{spec.name} is {spec.model_type!r} (not yet modelled: use --profile megatron)")
    style = spec.family.style
    if style.rope_layers == "windowed" and not any(model_ops.windowed(spec, range(spec.num_layers))):
        raise TrainmathError(f"{spec.name}: {spec.model_type} without attention_chunk_size is not modelled (the spec "
                             f"then cannot tell RoPE from no-RoPE layers); use --profile megatron")
    defaults = spec.family.config_defaults  # the config's switches are carried by the spec
    if norm_topk_prob is None:
        norm_topk_prob = Router.from_config(spec.options, defaults).norm_topk_prob
    router = router or Router(norm_topk_prob=norm_topk_prob,
                              topk_method=Router.from_config(spec.options, defaults).topk_method)
    family = family or Family.from_config(spec.options, defaults)
    _check_dropout(spec, style, family)
    p = precision_of(compute_bytes=compute_dtype_bytes, weight_bytes=param_dtype_bytes)
    b, s, d = micro_batch, seq, spec.hidden_size
    # Style.attention: the kernel transformers picks by default (Gemma-2: eager, as SDPA cannot soft-cap)
    job = EmitJob(batch=b, seq=s, precision=p, attention="eager" if profile == "eager" else "sdpa", experts=experts,
                  experts_hit=experts_hit, router=router, family=family, degrees=deg, device=device)
    ctx = context(spec, job)
    groups = []
    largest: Node | None = None
    selective_transient: Node | None = None
    keeps_input = casts = False
    kernels: set[str] = set()
    for layer, idx in spec.layer_groups():
        mine = [i for i in idx if i in indices]
        if not mine:
            continue
        prog = layer_program(spec, job, layer, ctx)
        if deg.cp > 1 and any(op.kind == "attention" and any(t.name.endswith("mask") for t in op.saved)
                              for op in prog.ops):
            raise TrainmathError(f"--cp {cp} with {spec.name}'s explicit attention mask (layer {layer.label!r}) is "
                                 f"not modelled: torch's context_parallel runs SDPA with is_causal only (no attn_mask "
                                 f"or attn_bias); pass --cp 1")
        kept = saved_storages(prog.ops, deg)
        keeps_input = keeps_input or any(n in t.name for t, _ in kept for n in SAVED_LAYER_INPUT)
        casts = casts or any(st.kind == "weight_copy" for _, st in kept)
        kernels.update(op.kernel for op in prog.ops if op.kind == "attention")
        one = layer_node(layer.label, prog.ops, deg)
        if recompute == "selective":
            kept_node, fresh = selective_layer(layer.label, prog.ops, layer, deg)
            if selective_transient is None or fresh.value > selective_transient.value:
                selective_transient = fresh
            one = kept_node
        if largest is None or one.value > largest.value:
            largest = one
        if recompute == "full":  # torch.utils.checkpoint keeps the rank's layer input: s/cp, and /tp with --sp
            ckpt = Tensor(name="layer input (checkpoint)", axes=(*ctx.rows(), Axis(d)), dtype_bytes=p.residual_bytes)
            one = Node.of(layer.label, [Node(name=ckpt.name, value=ckpt.nbytes(deg), unit="bytes")], "bytes")
        groups.append(LayerGroup(label=layer.label, layers=tuple(mine), one=one))
    embedding = rotary_node = mask_node = transient = None
    if 0 in indices:  # the ids: whole on every tensor-parallel rank (the lookup runs before SP cuts the sequence)
        embedding = Node.of("embedding", saved_leaves(model_ops.embedding_ops(ctx, style).ops, deg), "bytes")
    rotary, note = model_ops.rotary_ops(ctx, spec, style, indices)
    if rotary.ops:
        rotary_node = Node.of("rotary", saved_leaves(rotary.ops, deg), "bytes", note=note)
    masks = mask_arguments(ctx, spec, style, indices) if recompute in ("selective", "full") else []
    if masks:  # the checkpoints hold the layers' mask arguments until each layer's backward
        mask_node = Node.of("attention mask (checkpoint argument)", [Node(name=t.name, value=t.nbytes(deg),
                                                                          unit="bytes", note=t.note)
                                                                     for t in masks], "bytes")
    if recompute == "full" and largest is not None:
        transient = Node(name="recompute transient", value=largest.value, unit="bytes", children=largest.children,
                         note="one layer's saved tensors while it is recomputed in backward")
    if recompute == "selective" and selective_transient is not None:
        transient = Node(name="recompute transient", value=selective_transient.value, unit="bytes",
                         children=selective_transient.children, note=selective_transient.note)
    where = "" if deg.single else f", per rank of {_describe(deg)}"
    return SavedActivations(profile=profile, recompute=recompute, groups=tuple(groups), embedding=embedding,
                            rotary=rotary_node, masks=mask_node, recompute_transient=transient,
                            keeps_layer_input=keeps_input, weight_casts=casts, attention_kernels=frozenset(kernels),
                            note=f"b={b}, s={s}, compute {p.compute_bytes} B, params {p.weight_bytes} B{where}")


def _check_dropout(spec: ModelSpec, style: families.Style, family: Family) -> None:
    """One ``TrainmathError`` for a nonzero training dropout that the family's emitters do not apply."""
    if style.dropout:
        return
    keys = [f"{k}={v}" for k in DROPOUT_OPTIONS if (v := spec.options.get(k))]
    keys += [f"{k}={getattr(family, k)}" for k in DROPOUT_KEYS if getattr(family, k) and k not in spec.options]
    if keys:
        raise TrainmathError(f"{spec.name}: dropout in training ({', '.join(keys)}) is modelled for "
                             f"{', '.join(families.dropout_families())} only; set it to 0 in "
                             f"the config or use --profile megatron")


def _describe(deg: Degrees) -> str:
    parts = [f"tp={deg.tp}"] + (["sp"] if deg.sp else []) + [f"cp={deg.cp}", f"ep={deg.ep}"]
    return " ".join(parts + (["vocab-parallel"] if deg.vocab_parallel else []))


def _degrees(spec: ModelSpec, seq: int, *, tp: int, sp: bool, cp: int, ep: int, vocab_parallel: bool) -> Degrees:
    """The rank's ``Degrees``, or one ``TrainmathError`` naming every value that cannot be built (as CLI flags)."""
    from trainmath.layout import ParallelLayout, layout_problems

    bad = [f"{n} must be a positive integer, got {v!r}" for n, v in (("tp", tp), ("cp", cp), ("ep", ep))
           if not isinstance(v, int) or v < 1]
    if not bad:
        # dp = ep: expert-parallel ranks are drawn from data parallelism, which this per-rank count does not see
        bad = layout_problems(ParallelLayout(dp=ep, tp=tp, cp=cp, ep=ep, sp=sp, vocab_parallel=vocab_parallel),
                              spec)
        if sp and tp > 1 and seq % tp:
            bad.append(f"--seq ({seq}) must be a multiple of --tp ({tp}) with --sp (sequence parallelism gives every "
                       f"rank an equal slice); pass --seq {seq - seq % tp or tp}")
        if seq % cp:
            bad.append(f"--seq ({seq}) must be a multiple of --cp ({cp}) (context parallelism gives every rank an "
                       f"equal slice); pass --seq {seq - seq % cp or cp}")
        fused = spec.family.row.fused_projections
        if tp > 1 and fused and spec.family.modelled:
            bad.append(f"--tp {tp} with {spec.model_type}'s fused {' and '.join(fused)} is not modelled: "
                       f"parallelize_module's column-wise split of a fused weight gives a rank a contiguous slice "
                       f"of it, not its own heads of q, k and v (or columns of gate and up); pass --tp 1, or "
                       f"--profile megatron (Megatron-Core lays its fused weights out per head group)")
        scans = sorted({b.kind for layer in spec.layers for b in layer.blocks} & set(SCAN_KINDS))
        if cp > 1 and scans:
            bad.append(f"--cp {cp} with {' and '.join(SCAN_KINDS[k] for k in scans)} layers is not modelled: torch's "
                       f"context_parallel splits only SDPA attention (ring attention), and transformers' torch scan "
                       f"carries its state along the whole sequence, so a rank cannot run its s/cp slice alone; "
                       f"pass --cp 1")
    if bad:
        raise TrainmathError(f"impossible layout for {spec.name}: " + "; ".join(bad))
    return Degrees(tp=tp, sp=sp, cp=cp, ep=ep, vocab_parallel=vocab_parallel)


def _rank_layers(spec: ModelSpec, layers: Sequence[int] | None, pp: int) -> list[int]:
    n = spec.num_layers
    if layers is not None:
        bad = [i for i in layers if not 0 <= i < n]
        if bad:
            raise TrainmathError(f"layers {bad} out of range for {n} layers")
        return sorted(set(layers))
    if pp < 1 or pp > n:
        raise TrainmathError(f"pp ({pp}) must be between 1 and the number of layers ({n})")
    return list(range(-(-n // pp)))  # the first stage, which holds the most in-flight micro-batches under 1F1B


def logits_bytes(spec: ModelSpec, micro_batch: int, seq: int, *, compute_dtype_bytes: int = 2,
                 param_dtype_bytes: int = 4, tp: int = 1, family: Family | None = None, sp: bool = False,
                 cp: int = 1, vocab_parallel: bool = True) -> HeadActivations:
    """The final norm, LM head and ``ForCausalLMLoss`` (transformers 5.x, labels given, no ``num_items``): the fold
    of ``trainmath.ops.model.head_ops`` (what each op keeps is described there), as ``saved`` (the final norm, the
    LM head's input and weight cast, Gemma-2's soft-capping tanh, the fp32 log-probabilities, labels and
    total_weight) and what is alive but not saved (the logits the output holds and, when c < 4, their fp32 upcast:
    the transient peak of the loss), typed (``saved.HeadActivations``).

    Per rank of a layout (derived from the plans, not measured; one device is the measured case):
    ``vocab_parallel`` with ``tp`` > 1 is a vocabulary-parallel head and loss (Megatron's ``ColumnParallelLinear``
    head with ``vocab_parallel_cross_entropy``; torchtitan's ``ColwiseParallel`` head with ``Shard(-1)`` logits
    under ``loss_parallel()``): each rank holds V' = ceil(V/tp) vocabulary entries (the largest rank of an uneven
    split, as DTensor's ``Shard`` cuts it; Megatron pads V to a multiple of 128·tp instead, not modelled), so every
    V term above uses V' (the head's weight cast, the log-probabilities, the logits and their fp32 upcast).
    ``vocab_parallel=False`` (``parallelize_module`` on the decoder layers only, the hf profile's plain ``--tp``):
    head and loss whole on every rank. ``sp``: the final norm is sequence-parallel (T/tp rows); the head's input is
    all-gathered back to T rows, and that gathered tensor (its cast under autocast) is what the head saves.
    ``cp``: T = b·s/cp tokens on the rank for every term.
    """
    if tp < 1 or cp < 1:
        raise TrainmathError(f"tp ({tp}) and cp ({cp}) must be at least 1")
    family = family or Family.from_config(spec.options, spec.family.config_defaults)
    p = precision_of(compute_bytes=compute_dtype_bytes, weight_bytes=param_dtype_bytes)
    deg = Degrees(tp=tp, sp=sp and tp > 1, cp=cp, vocab_parallel=vocab_parallel and tp > 1)
    prog, held = head_program(spec, EmitJob(batch=micro_batch, seq=seq, precision=p, family=family, degrees=deg))
    loss = [op for op in prog.ops if op.kind == "loss"][-1]  # nll_loss: the labels and total_weight it saves
    saved = saved_leaves(prog.ops, deg)
    alive = [Node(name=name, value=t.nbytes(deg), unit="bytes", note=note) for name, t, note in held]
    V = ceil_div(spec.vocab_size, tp) if deg.vocab_parallel else spec.vocab_size
    T = micro_batch * ceil_div(seq, cp)
    logits, *upcast = [t.nbytes(deg) for _, t, _ in held]  # the logits, then their fp32 upcast when there is one
    return HeadActivations(saved=tuple(saved), logits_bytes=logits, logits_fp32_bytes=sum(upcast),
                           labels_bytes=sum(st.nbytes(deg) for _, st in saved_storages([loss], deg)),
                           alive=tuple(alive),
                           note=f"V={V}" + (f" per rank (tp={tp}, vocabulary-parallel)" if deg.vocab_parallel
                                            else "") + f", T={T}" + (f" per rank (cp={cp})" if cp > 1 else ""))
