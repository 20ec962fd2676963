"""Tensor parallelism on transformers' own decoder layers, as ``torch.distributed.tensor.parallel`` applies it.

``apply_tp(model, mesh, sp=..., vocab_parallel=...)`` calls ``parallelize_module`` on a transformers causal LM
(``model.model.layers``, ``model.model.embed_tokens``, ``model.lm_head``) with the plans torchtitan uses for its
own Llama 3 and Qwen 3 (``torchtitan/models/llama3/infra/parallelize.py`` and
``torchtitan/models/qwen3/infra/parallelize.py``, ``apply_tp`` / ``apply_non_moe_tp``), adapted to the names and
calling conventions of transformers' modules:

- **plain TP** (``sp=False``): ``q_proj``/``k_proj``/``v_proj``/``gate_proj``/``up_proj`` ``ColwiseParallel()``,
  ``o_proj``/``down_proj`` ``RowwiseParallel()`` (all-reduce, replicated output); embeddings, ``lm_head`` and
  every norm replicated (plain tensors, untouched). Megatron's ``f``/``g`` pair per block (Shoeybi et al. 2019,
  §3): the block's input is whole on every rank, its output all-reduced.
- **SP** (``sp=True``, torchtitan's ``layer_plan``): ``input_layernorm``/``post_attention_layernorm`` and the
  final ``norm`` ``SequenceParallel()``; ``self_attn`` and ``mlp`` ``PrepareModuleInput`` from ``Shard(1)`` to
  ``Replicate()`` (the all-gather, Korthikanti et al. 2022 §4.2.2 ``g``); ``o_proj``/``down_proj``
  ``RowwiseParallel(output_layouts=Shard(1))`` (the reduce-scatter ``ḡ``). The residual stream between blocks is a
  DTensor sharded on the sequence (torchtitan hands local tensors to its own norms; transformers' model reads the
  sequence length off ``inputs_embeds.shape[1]`` for its positions and mask, so here the stream stays a DTensor,
  whose ``shape`` is global: ``use_local_output=False`` on the embedding and the row-wise outputs).
- **vocab parallel** (``vocab_parallel=True``): ``embed_tokens`` ``RowwiseParallel(input_layouts=Replicate(),
  output_layouts=Shard(1) if sp else Replicate())`` (a vocabulary-sharded table; masked lookup then
  reduce-scatter or all-reduce), ``lm_head`` ``ColwiseParallel(input_layouts=Shard(1) if sp else Replicate(),
  output_layouts=Shard(-1), use_local_output=False)``: logits stay vocabulary-sharded, and the loss must run under
  ``torch.distributed.tensor.parallel.loss_parallel()`` (``loss_context``), as torchtitan runs it. Tied weights
  are re-tied after parallelisation (torchtitan's qwen3 ``parallelize_qwen3``: "Enable weight tying after applying
  parallelisms").

Families (those with a ``TPPlan`` in ``trainmath.families``, the same definition the calculator reads; the plan of
a layer is built from the modules it has and the family's plan, ``_layer_plan``): llama, mistral,
qwen2 (q/k/v biases are sharded with their weights by ``ColwiseParallel``), qwen3 and qwen3_moe (per head
``q_norm``/``k_norm``: ``SequenceParallel(sequence_dim=2, use_local_output=True)``, torchtitan's qwen3 note "QK
norms: shard on head dim (dim=2) — independent of SP": the norm's replicated weight sees the rank's own heads, so
its gradient is a ``Partial`` DTensor that the optimizer's update reduces), gemma3_text (the same on (b, h, s, h_d),
``sequence_dim=1``; four sandwich norms), olmo2 (q/k norms over the whole projection: ``feature_sharded_norm``),
starcoder2 (``c_fc``/``c_proj``, LayerNorms with bias), cohere (one norm feeding attention and MLP; not with
``use_qk_norm``), phi3 (fused ``qkv_proj``/``gate_up_proj``: ``interleave_fused``). Routed experts (qwen3_moe):
``split_experts``, every expert at f/tp of its width, the router replicated. GPT-2 (``Conv1D``) and Falcon (fused
``query_key_value`` laid out per architecture) are refused.

transformers 5's attention needs no patching for local heads: it reshapes with ``view(*input_shape, -1,
head_dim)`` and repeats K/V by ``num_key_value_groups = heads // kv_heads``, a ratio TP keeps; ``num_heads`` is
not read. Column-wise outputs are therefore handed on as local tensors (``use_local_output=True``).
"""

from __future__ import annotations

from trainmath import families
from trainmath.errors import TrainmathError

FAMILIES = families.tp_measured_families()
"""model_types whose decoder layers ``apply_tp`` splits (``FamilyDef.tp``; module names below)."""

COLWISE = ("q_proj", "k_proj", "v_proj", "gate_proj", "up_proj", "c_fc", "qkv_proj", "gate_up_proj")
"""Linears split on their output features (``ColwiseParallel``): StarCoder2's MLP is ``c_fc`` → ``c_proj``."""
ROWWISE = ("o_proj", "down_proj", "c_proj")
"""Linears split on their input features (``RowwiseParallel``)."""
STREAM_NORMS = ("input_layernorm", "post_attention_layernorm", "pre_feedforward_layernorm",
                "post_feedforward_layernorm")
"""Norms on the residual stream (``SequenceParallel`` under SP; whole otherwise). Gemma-3's post-norms and
OLMo-2's read a row-wise output, reduce-scattered under SP, so they too see the rank's sequence slice."""


def check_tp(config, tp: int) -> None:
    """One ``TrainmathError`` if ``config`` (a transformers config) cannot be split ``tp`` ways here."""
    bad = []
    fam = families.get(config.model_type)
    plan = fam.tp if fam is not None else None
    if plan is None:
        bad.append(f"model_type {config.model_type!r} (tensor parallelism is applied to "
                   f"{', '.join(families.tp_measured_families())})")
    elif plan.refuses(config):
        bad.append(f"{config.model_type} with {plan.refused_with} ({plan.refused_why})")
    heads, kv = config.num_attention_heads, config.num_key_value_heads
    if heads % tp or kv % tp:
        bad.append(f"--tp {tp} must divide the attention heads ({heads}) and KV heads ({kv})")
    if bad:
        raise TrainmathError("cannot apply tensor parallelism: " + "; ".join(bad))


def feature_sharded_norm():
    """A ``ParallelStyle`` for a norm over the features of a column-wise output (OLMo-2's q/k norms): its weight
    is split like the projection (``Shard(0)``), its input is the rank's local features made a ``Shard(-1)``
    DTensor, and DTensor runs the norm itself: the mean of squares over the split features is a partial sum that
    it all-reduces (a (b, s, 1) tensor) before the rsqrt, so the result equals the single device's. The output is
    the rank's features again, as a local tensor, for the module's own head reshape."""
    import torch
    from torch.distributed.tensor import DTensor, Shard, distribute_module, distribute_tensor
    from torch.distributed.tensor.parallel.style import ParallelStyle

    class FeatureShardedNorm(ParallelStyle):
        def _apply(self, module, mesh):
            def partition(name, mod, mesh):
                for n, p in list(mod.named_parameters(recurse=False)):
                    mod.register_parameter(n, torch.nn.Parameter(distribute_tensor(p, mesh, [Shard(0)])))

            def inputs(mod, args, mesh):
                return tuple(DTensor.from_local(x, mesh, [Shard(x.ndim - 1)], run_check=False) for x in args)

            return distribute_module(module, mesh, partition, inputs, lambda mod, out, mesh: out.to_local())

    return FeatureShardedNorm()


def _tp_functions():
    """Megatron's ``f`` and ``g`` (Shoeybi et al. 2019, §3, Fig. 3) as autograd functions over a process group:
    ``f`` is the identity forward and all-reduces the gradient backward; ``g`` all-reduces forward and passes the
    gradient through. They keep nothing for backward."""
    import torch
    import torch.distributed as dist

    class CopyToRegion(torch.autograd.Function):  # f
        @staticmethod
        def forward(ctx, x, group):
            ctx.group = group
            return x.view_as(x)

        @staticmethod
        def backward(ctx, grad):
            grad = grad.contiguous()
            dist.all_reduce(grad, group=ctx.group)
            return grad, None

    class ReduceFromRegion(torch.autograd.Function):  # g
        @staticmethod
        def forward(ctx, x, group):
            x = x.clone()
            dist.all_reduce(x, group=group)
            return x

        @staticmethod
        def backward(ctx, grad):
            return grad, None

    return CopyToRegion, ReduceFromRegion


def split_experts(experts, mesh) -> None:
    """Tensor-parallel routed experts (torchtitan's ``TensorParallel`` style for its ``GroupedExperts``, with
    ``expert_tensor_parallel = tp``; Megatron-Core's default): every rank keeps every expert at f/tp of its width,
    ``gate_up_proj`` (n, 2f, d) → (n, 2f/tp, d) as the rank's gate rows then its up rows (transformers fuses gate
    and up and ``chunk``s the output, so a contiguous slice of the fused weight would give one rank all the gates),
    ``down_proj`` (n, d, f) → (n, d, f/tp). Plain local parameters (each rank owns its slice, as Megatron stores
    them); the routed rows, the routing weights and the experts' input are whole on every rank (``f`` before,
    so their gradients are all-reduced), the output is a partial sum that ``g`` all-reduces."""
    import torch

    CopyToRegion, ReduceFromRegion = _tp_functions()
    rank, tp, group = mesh.get_local_rank(), mesh.size(), mesh.get_group()
    f = experts.intermediate_dim
    mine = slice(rank * f // tp, (rank + 1) * f // tp)
    gate, up = experts.gate_up_proj.detach().chunk(2, dim=1)
    experts.gate_up_proj = torch.nn.Parameter(torch.cat([gate[:, mine], up[:, mine]], dim=1).contiguous())
    experts.down_proj = torch.nn.Parameter(experts.down_proj.detach()[:, :, mine].contiguous())
    experts.intermediate_dim = f // tp

    def enter(module, args):  # (hidden_states, top_k_index, top_k_weights)
        x, idx, w = args
        return CopyToRegion.apply(x, group), idx, CopyToRegion.apply(w, group)

    experts.register_forward_pre_hook(enter)
    experts.register_forward_hook(lambda module, args, out: ReduceFromRegion.apply(out, group))


def interleave_fused(layer, config, tp: int) -> None:
    """Phi-3's fused ``qkv_proj`` ([q; k; v] rows) and ``gate_up_proj`` ([gate; up]) made splittable by one
    ``ColwiseParallel``: their rows are permuted to [q_0; k_0; v_0; q_1; k_1; v_1; ...] (and [gate_0; up_0;
    gate_1; ...]), so rank r's contiguous slice is its own heads of q, k and v (its columns of gate and up), as
    Megatron-Core lays out its fused QKV per head group. The attention module slices its output at
    ``config.num_attention_heads · head_dim`` and ``num_key_value_heads · head_dim``: it gets a copy of the config
    with the rank's head counts (torchtitan's models read their local heads the same way, ``n_local_heads``).
    The model computes what it computed before (the permutation moves rows, not values)."""
    import copy

    import torch

    def permute(linear, parts):
        idx, start = [[] for _ in range(tp)], 0
        for n in parts:
            for r in range(tp):
                idx[r].extend(range(start + r * n // tp, start + (r + 1) * n // tp))
            start += n
        order = torch.tensor([i for rank in idx for i in rank])
        with torch.no_grad():
            linear.weight.copy_(linear.weight[order])

    attn, mlp = layer.self_attn, layer.mlp
    h, kv, hd = config.num_attention_heads, config.num_key_value_heads, attn.head_dim
    permute(attn.qkv_proj, [h * hd, kv * hd, kv * hd])
    permute(mlp.gate_up_proj, [mlp.gate_up_proj.out_features // 2] * 2)
    attn.config = copy.copy(attn.config)
    attn.config.num_attention_heads = h // tp
    attn.num_key_value_heads = kv // tp


def _layer_plan(layer, model_type: str, *, sp: bool) -> dict:
    """The ``parallelize_module`` plan of one decoder layer (module docstring), from the modules it has."""
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        PrepareModuleInput,
        PrepareModuleInputOutput,
        RowwiseParallel,
        SequenceParallel,
    )

    seq = Shard(1)
    plan = {}
    for block in ("self_attn", "mlp"):
        for name in COLWISE + ROWWISE:
            if hasattr(getattr(layer, block), name):
                plan[f"{block}.{name}"] = ColwiseParallel() if name in COLWISE else (
                    RowwiseParallel(output_layouts=seq, use_local_output=False) if sp else RowwiseParallel())
    attn = layer.self_attn
    tp_plan = families.get(model_type).tp  # per-head q/k norms (their weight h_d replicated, run on the rank's
    # heads) read (b, s, h, h_d) before the transpose (Qwen3) or (b, h, s, h_d) after it (Gemma-3)
    if getattr(attn, "q_norm", None) is not None and tp_plan.head_norm_dim is not None:
        for n in ("q_norm", "k_norm"):  # on the rank's heads
            plan[f"self_attn.{n}"] = SequenceParallel(sequence_dim=tp_plan.head_norm_dim, use_local_output=True)
    if getattr(attn, "q_norm", None) is not None and tp_plan.feature_norms:
        for n in ("q_norm", "k_norm"):
            plan[f"self_attn.{n}"] = feature_sharded_norm()
        # q_proj/k_proj hand the norms their local features (use_local_output=True, the default)
    if sp and hasattr(layer.mlp, "experts"):  # the MoE block's output is whole on every rank (``g``): cut it
        plan["mlp"] = PrepareModuleInputOutput(input_layouts=(seq,), desired_input_layouts=(Replicate(),),
                                               use_local_input=True, output_layouts=(Replicate(),),
                                               desired_output_layouts=(seq,), use_local_output=False)
    if sp:
        for n in STREAM_NORMS:
            if hasattr(layer, n):
                plan[n] = SequenceParallel()
        # transformers calls self_attn(hidden_states=...) by keyword, mlp(hidden_states) by position
        plan["self_attn"] = PrepareModuleInput(input_kwarg_layouts={"hidden_states": seq},
                                               desired_input_kwarg_layouts={"hidden_states": Replicate()},
                                               use_local_output=True)
        plan.setdefault("mlp", PrepareModuleInput(input_layouts=(seq,), desired_input_layouts=(Replicate(),),
                                                  use_local_output=True))
    return plan


def apply_tp(model, mesh, *, sp: bool, vocab_parallel: bool):
    """``model`` (a transformers causal LM) with its decoder layers split over the 1-D ``mesh`` (module
    docstring); returns the same module, parallelised in place."""
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        PrepareModuleInput,
        PrepareModuleOutput,
        RowwiseParallel,
        SequenceParallel,
        parallelize_module,
    )

    check_tp(model.config, mesh.size())
    body = model.model
    tied = model.lm_head.weight is body.embed_tokens.weight
    seq = Shard(1)
    if vocab_parallel:
        root = {"model.embed_tokens": RowwiseParallel(input_layouts=Replicate(),
                                                      output_layouts=seq if sp else Replicate(),
                                                      use_local_output=not sp),
                "lm_head": ColwiseParallel(input_layouts=seq if sp else Replicate(), output_layouts=Shard(-1),
                                           use_local_output=False)}
    elif sp:  # replicated table and head; the stream is cut on the sequence after the lookup (a local chunk)
        root = {"model.embed_tokens": PrepareModuleOutput(output_layouts=Replicate(), desired_output_layouts=seq,
                                                          use_local_output=False),
                "lm_head": PrepareModuleInput(input_layouts=seq, desired_input_layouts=Replicate(),
                                              use_local_output=True)}
    else:
        root = {}
    if sp:
        root["model.norm"] = SequenceParallel()
    if root:
        parallelize_module(model, mesh, root)
    for layer in body.layers:
        if hasattr(layer.self_attn, "qkv_proj"):
            interleave_fused(layer, model.config, mesh.size())
        parallelize_module(layer, mesh, _layer_plan(layer, model.config.model_type, sp=sp))
        if hasattr(layer.mlp, "experts"):
            split_experts(layer.mlp.experts, mesh)
    if tied and vocab_parallel:
        model.lm_head.weight = body.embed_tokens.weight
    return model


def loss_context(vocab_parallel: bool):
    """The context the forward with labels runs in: ``loss_parallel()`` for vocabulary-sharded logits (the
    cross-entropy reduces over the vocabulary shards without gathering them), else nothing."""
    import contextlib

    from torch.distributed.tensor.parallel import loss_parallel

    return loss_parallel() if vocab_parallel else contextlib.nullcontext()
