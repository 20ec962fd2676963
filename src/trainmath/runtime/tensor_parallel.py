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

Families: llama, mistral, qwen2 (q/k/v biases are sharded with their weights by ``ColwiseParallel``), qwen3 (per
head ``q_norm``/``k_norm``: ``SequenceParallel(sequence_dim=2, use_local_output=True)``, torchtitan's qwen3 note
"QK norms: shard on head dim (dim=2) — independent of SP": the norm's replicated weight sees the rank's own heads,
so its gradient is reduced over the ranks). MoE: the shared expert of qwen2_moe is column/row split like a dense
MLP; routed experts are NOT split (left replicated: tensor-parallel routed experts are a different plan,
torchtitan's ``apply_moe_ep_tp``) — ``apply_tp`` refuses MoE models rather than half-split them.

transformers 5's attention needs no patching for local heads: it reshapes with ``view(*input_shape, -1,
head_dim)`` and repeats K/V by ``num_key_value_groups = heads // kv_heads``, a ratio TP keeps; ``num_heads`` is
not read. Column-wise outputs are therefore handed on as local tensors (``use_local_output=True``).
"""

from __future__ import annotations

from trainmath.errors import TrainmathError

FAMILIES = ("llama", "mistral", "qwen2", "qwen3")
"""model_types whose decoder layers ``apply_tp`` splits (same module names: q/k/v/o_proj, gate/up/down_proj)."""


def check_tp(config, tp: int) -> None:
    """One ``TrainmathError`` if ``config`` (a transformers config) cannot be split ``tp`` ways here."""
    bad = []
    if config.model_type not in FAMILIES:
        bad.append(f"model_type {config.model_type!r} (tensor parallelism is applied to {', '.join(FAMILIES)})")
    heads, kv = config.num_attention_heads, config.num_key_value_heads
    if heads % tp or kv % tp:
        bad.append(f"--tp {tp} must divide the attention heads ({heads}) and KV heads ({kv})")
    if bad:
        raise TrainmathError("cannot apply tensor parallelism: " + "; ".join(bad))


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
        plan = {
            "self_attn.q_proj": ColwiseParallel(),
            "self_attn.k_proj": ColwiseParallel(),
            "self_attn.v_proj": ColwiseParallel(),
            "self_attn.o_proj": RowwiseParallel(output_layouts=seq, use_local_output=False) if sp
            else RowwiseParallel(),
            "mlp.gate_proj": ColwiseParallel(),
            "mlp.up_proj": ColwiseParallel(),
            "mlp.down_proj": RowwiseParallel(output_layouts=seq, use_local_output=False) if sp
            else RowwiseParallel(),
        }
        if getattr(layer.self_attn, "q_norm", None) is not None:  # qwen3: per-head norms on the rank's heads
            # (batch, seq, heads / tp, head_dim): the heads are dim 2
            plan["self_attn.q_norm"] = SequenceParallel(sequence_dim=2, use_local_output=True)
            plan["self_attn.k_norm"] = SequenceParallel(sequence_dim=2, use_local_output=True)
        if sp:
            plan.update({
                "input_layernorm": SequenceParallel(),
                "post_attention_layernorm": SequenceParallel(),
                # transformers calls self_attn(hidden_states=...) by keyword, mlp(hidden_states) by position
                "self_attn": PrepareModuleInput(input_kwarg_layouts={"hidden_states": seq},
                                                desired_input_kwarg_layouts={"hidden_states": Replicate()},
                                                use_local_output=True),
                "mlp": PrepareModuleInput(input_layouts=(seq,), desired_input_layouts=(Replicate(),),
                                          use_local_output=True),
            })
        parallelize_module(layer, mesh, plan)
    if tied and vocab_parallel:
        model.lm_head.weight = body.embed_tokens.weight
    return model


def loss_context(vocab_parallel: bool):
    """The context the forward with labels runs in: ``loss_parallel()`` for vocabulary-sharded logits (the
    cross-entropy reduces over the vocabulary shards without gathering them), else nothing."""
    import contextlib

    from torch.distributed.tensor.parallel import loss_parallel

    return loss_parallel() if vocab_parallel else contextlib.nullcontext()
