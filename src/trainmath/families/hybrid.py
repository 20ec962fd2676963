"""Hybrid families whose layers are not all attention: qwen3_next (Gated DeltaNet + gated full attention, MoE)
and nemotron_h (Mamba-2, attention, MLP and MoE layers in a pattern).

Jiang Yi's blog series (first article, "Extension"): for a hybrid model, count each layer type separately and add
them up.
The layer pattern is read as transformers reads it: Qwen3-Next's ``layer_types`` (default: full attention every
``full_attention_interval``-th layer), Nemotron-H's ``layers_block_type`` or ``hybrid_override_pattern``
(M = Mamba-2, * = attention, - = MLP, E = MoE).

The op lists (derived from the code, checked by ``tests/activations``):

Qwen3-Next (``Qwen3NextDecoderLayer``): (1 + w) RMSNorms; the mixer is a Gated DeltaNet (``scans.gated_deltanet``)
or gated full attention (q_proj emits query and gate, per-head q/k norms, partial rotary ending in ``torch.cat``:
``attention_ext.sdpa_attention`` with ``project_gate``); then a Qwen2-MoE-style sparse block (softmax router, routed
experts, sigmoid-gated shared expert, ``moe.moe_block``) or a gated MLP.

Nemotron-H (``NemotronHBlock``): each layer is one Nemotron RMSNorm and one mixer: Mamba-2 (``scans.mamba2``),
attention without rotary (SDPA), a relu² MLP, or a MoE with DeepSeek-V3's sigmoid router (fp32 linear, group
selection, renormalised top-k) over non-gated relu² experts (eager loop) plus a relu² shared expert.
``moe_latent_size`` raises. Neither family's eager attention is modelled, nor Nemotron-H's grouped_mm expert
path (Qwen3-Next's is the standard one, ``experts.grouped_experts``).
"""

from __future__ import annotations

from trainmath.errors import TrainmathError
from trainmath.families.base import FamilyDef
from trainmath.families.common import (
    architecture,
    embeddings,
    head,
    head_dim,
    int_list,
    kv_heads,
    layer_parts,
    layer_types,
    residual,
)
from trainmath.families.moe import QWEN_MOE_LORA, check_experts_path, ffn, moe_block
from trainmath.model import blocks
from trainmath.model.config import MAX_LAYERS, ConfigView, show
from trainmath.model.spec import (
    Block,
    LayerSpec,
    LinearAttentionDims,
    MambaDims,
    ModelSpec,
    MoEDims,
    TensorSpec,
)
from trainmath.ops.context import Ctx
from trainmath.ops.ir import Program
from trainmath.ops.kernels.attention import find, gqa_attention
from trainmath.ops.kernels.attention_ext import sdpa_attention
from trainmath.ops.kernels.mlp import plain_mlp
from trainmath.ops.kernels.norms import norm
from trainmath.ops.kernels.scans import gated_deltanet, mamba2
from trainmath.ops.style import Style


def _qwen3_next(cfg: ConfigView, name: str) -> ModelSpec:
    d, vocab, n = cfg.int("hidden_size"), cfg.int("vocab_size"), cfg.int("num_hidden_layers")
    h = cfg.int("num_attention_heads")
    hkv, hd = kv_heads(cfg, h), head_dim(cfg, d, h)
    bias = cfg.bool("attention_bias")
    # Gated attention (Qwen3-Next): q_proj emits the query and an output gate, 2·h·h_d wide.
    full = blocks.attention(d=d, heads=h, kv_heads=hkv, head_dim=hd, q_bias=bias, kv_bias=bias, o_bias=bias,
                            qk_norm="head")
    q = full.tensors[0]
    gated_q = TensorSpec(name=q.name, shape=(2 * q.shape[0], d), component="attention", shard="column")
    q_bias = (TensorSpec(name=full.tensors[1].name, shape=(2 * q.shape[0],), component="attention", kind="bias",
                         shard="column"),) if bias else ()
    full = Block(kind="attention", tensors=(gated_q, *q_bias, *full.tensors[1 + len(q_bias):]), dims=full.dims)
    gdn = blocks.linear_attention_gdn(d=d, dims=LinearAttentionDims(
        key_heads=cfg.int("linear_num_key_heads"), value_heads=cfg.int("linear_num_value_heads"),
        key_head_dim=cfg.int("linear_key_head_dim"), value_head_dim=cfg.int("linear_value_head_dim"),
        conv_kernel=cfg.int("linear_conv_kernel_dim")))
    n_exp, k, f = cfg.int("num_experts", minimum=0), cfg.int("num_experts_per_tok"), cfg.int("moe_intermediate_size")
    cfg.require(k <= max(n_exp, 1), f"num_experts_per_tok ({k}) must not exceed num_experts ({n_exp})")
    f_shared = cfg.int("shared_expert_intermediate_size", minimum=0)
    # transformers always builds the shared expert and its gate, even at width 0
    shared = (blocks.gated_mlp(d=d, d_ff=f_shared, prefix="mlp.shared_expert", component="shared_experts")
              + blocks.linear("mlp.shared_expert_gate", 1, d, "shared_experts", "replicated"))
    moe = blocks.moe_block(
        d=d, dims=MoEDims(experts=n_exp, top_k=k, expert_intermediate=f, shared_intermediate=f_shared),
        expert_tensors=blocks.gated_mlp(d=d, d_ff=f, prefix="mlp.experts.{e}", component="experts", experts=n_exp),
        router=blocks.linear("mlp.gate", n_exp, d, "router", "replicated"), shared=shared)
    d_ff = cfg.int("intermediate_size")
    dense = blocks.dense_mlp_block(blocks.gated_mlp(d=d, d_ff=d_ff), d=d, d_ff=d_ff, gated=True)
    norms = blocks.norm_block(("input_layernorm", d), ("post_attention_layernorm", d))
    interval = cfg.int("full_attention_interval", 4)
    types = layer_types(cfg, n, ["linear_attention" if (i + 1) % interval else "full_attention" for i in range(n)],
                        ("full_attention", "linear_attention"))
    only = int_list(cfg, "mlp_only_layers", n, []) or []
    step = cfg.int("decoder_sparse_step")
    cache: dict[tuple[str, bool], LayerSpec] = {}
    layers = []
    for i, t in enumerate(types):
        sparse = i not in only and n_exp > 0 and (i + 1) % step == 0
        if (t, sparse) not in cache:
            mixer = gdn if t == "linear_attention" else full
            cache[(t, sparse)] = LayerSpec(label=f"{t} + {'moe' if sparse else 'mlp'}",
                                           blocks=(mixer, moe if sparse else dense, norms))
        layers.append(cache[(t, sparse)])
    tied = cfg.bool("tie_word_embeddings")
    cfg.check()
    return ModelSpec(
        name=name, model_type="qwen3_next", architecture=architecture(cfg), vocab_size=vocab, hidden_size=d,
        max_position_embeddings=cfg.int("max_position_embeddings"), layer_prefix="model.layers.{i}.",
        pre=embeddings(vocab, d), layers=tuple(layers), post=head(vocab, d, tied), tie_word_embeddings=tied,
        notes=("qwen3_next: the checkpoint's multi-token-prediction tensors (mtp.*) are not modelled",),
        symbols=dict(N=n, V=vocab, d=d, h=h, h_kv=hkv, h_d=hd, n=n_exp, k=k, d_ff=f),
    )


_PATTERN = {"M": "linear_attention", "E": "moe", "*": "full_attention", "-": "mlp"}
_LEGACY = {"mamba": "linear_attention", "attention": "full_attention"}


def _nemotron_types(cfg: ConfigView) -> list[str]:
    given = cfg.data.get("layers_block_type") or cfg.data.get("layer_types")
    if given is not None and not (isinstance(given, list) and all(isinstance(t, str) for t in given)):
        cfg.invalid.append(f"layers_block_type must be a list of layer type names, got {show(given)}")
        return ["linear_attention"]
    if given is None and isinstance(cfg.data.get("hybrid_override_pattern"), str):
        pattern = cfg.data["hybrid_override_pattern"]
        bad = sorted(set(pattern) - set(_PATTERN))
        if bad:
            cfg.invalid.append(f"hybrid_override_pattern has unknown symbols {bad}; known: M * - E")
        return [_PATTERN[c] for c in pattern if c in _PATTERN]
    if given is None:
        return ["linear_attention", "moe", "full_attention", "mlp"]  # NemotronHConfig's default
    types = [_LEGACY.get(t, t) for t in given]
    bad = sorted(set(types) - set(_PATTERN.values()))
    if bad:
        cfg.invalid.append(f"layers_block_type has unknown types {bad}; known: {sorted(_PATTERN.values())}")
    return types


def _nemotron_h(cfg: ConfigView, name: str) -> ModelSpec:
    d, vocab = cfg.int("hidden_size"), cfg.int("vocab_size")
    types = _nemotron_types(cfg)
    cfg.require(len(types) > 0, "the layer pattern is empty")
    cfg.require(len(types) <= MAX_LAYERS, f"the layer pattern has {len(types):,} layers; at most {MAX_LAYERS:,}")
    types = types[:MAX_LAYERS]
    h = cfg.int("num_attention_heads")
    hkv, hd = kv_heads(cfg, h), cfg.int("head_dim")
    use_bias, mlp_bias = cfg.bool("use_bias"), cfg.bool("mlp_bias")
    heads, hdim = cfg.int("mamba_num_heads"), cfg.int("mamba_head_dim")
    groups = cfg.int("n_groups")
    cfg.require(heads % groups == 0, f"n_groups ({groups}) must divide mamba_num_heads ({heads})")
    mamba = blocks.mamba2(d=d, dims=MambaDims(heads=heads, head_dim=hdim, state_size=cfg.int("ssm_state_size"),
                                              groups=groups, conv_kernel=cfg.int("conv_kernel"),
                                              intermediate=heads * hdim,
                                              chunk_size=cfg.int("chunk_size", cfg.int("mamba_chunk_size", 128))),
                          conv_bias=cfg.bool("use_conv_bias"), proj_bias=use_bias)
    attn = blocks.attention(d=d, heads=h, kv_heads=hkv, head_dim=hd, prefix="mixer")
    d_ff = cfg.int("intermediate_size")
    mlp = blocks.dense_mlp_block(blocks.plain_mlp(d=d, d_ff=d_ff, prefix="mixer", bias=mlp_bias,
                                                  names=("up_proj", "down_proj")), d=d, d_ff=d_ff, gated=False)
    blocks_by_type = {"linear_attention": mamba, "full_attention": attn, "mlp": mlp}
    k = 1
    if "moe" in types:
        n_exp, k, f = cfg.int("n_routed_experts"), cfg.int("num_experts_per_tok"), cfg.int("moe_intermediate_size")
        cfg.require(k <= n_exp, f"num_experts_per_tok ({k}) must not exceed n_routed_experts ({n_exp})")
        latent = cfg.opt_int("moe_latent_size")
        width = latent or d
        experts = (  # non-gated experts, stored per expert: up (f, width), down (width, f)
            blocks.linear("mixer.experts.{e}.up_proj", f, width, "experts", "column", experts=n_exp)
            + blocks.linear("mixer.experts.{e}.down_proj", width, f, "experts", "row", experts=n_exp))
        f_sh = cfg.int("moe_shared_expert_intermediate_size", minimum=0)
        shared = blocks.plain_mlp(d=d, d_ff=f_sh, prefix="mixer.shared_experts", bias=mlp_bias,
                                  names=("up_proj", "down_proj"), component="shared_experts") if f_sh else ()
        if latent:
            shared += (blocks.linear("mixer.fc1_latent_proj", latent, d, "experts", "replicated", bias=mlp_bias)
                       + blocks.linear("mixer.fc2_latent_proj", d, latent, "experts", "replicated", bias=mlp_bias))
        blocks_by_type["moe"] = blocks.moe_block(
            d=d, dims=MoEDims(experts=n_exp, top_k=k, expert_intermediate=f, shared_intermediate=f_sh, gated=False),
            expert_tensors=experts, router=blocks.linear("mixer.gate", n_exp, d, "router", "replicated"),
            shared=shared)
    norm = blocks.norm_block(("norm", d))
    by_type = {t: LayerSpec(label=t if t != "linear_attention" else "mamba", blocks=(blocks_by_type[t], norm))
               for t in dict.fromkeys(types) if t in blocks_by_type}
    notes = ["nemotron_h: checkpoint names use NVIDIA's 'backbone.' prefix (transformers renames it 'model.')"]
    tied = False  # NemotronHForCausalLM declares no tied weights: lm_head is its own tensor
    if cfg.bool("tie_word_embeddings"):
        notes.append("nemotron_h: tie_word_embeddings is set, but transformers never ties lm_head for this family")
    cfg.check()
    return ModelSpec(
        name=name, model_type="nemotron_h", architecture=architecture(cfg), vocab_size=vocab, hidden_size=d,
        max_position_embeddings=cfg.int("max_position_embeddings"), layer_prefix="backbone.layers.{i}.",
        pre=embeddings(vocab, d, "backbone.embeddings.weight"), layers=tuple(by_type[t] for t in types),
        post=head(vocab, d, tied, final_norm="backbone.norm_f"), tie_word_embeddings=tied,
        notes=tuple(notes),
        symbols=dict(N=len(types), V=vocab, d=d, h=h, h_kv=hkv, h_d=hd, d_ff=d_ff),
    )


def qwen3_next_layer(prog: Program, ctx: Ctx, layer: LayerSpec, style: Style) -> None:
    if ctx.eager:
        raise TrainmathError("qwen3_next: the eager profile is not modelled; use profile='hf' (SDPA)")
    mixer, block, norms = layer_parts(layer)
    if mixer is None or mixer.kind not in ("attention", "linear_attention") or block is None:
        raise TrainmathError(f"qwen3_next layer {layer.label!r} has blocks {[bl.kind for bl in layer.blocks]}")
    if isinstance(block.dims, MoEDims):
        check_experts_path(ctx, style, "qwen3_next")
    x = residual(ctx, "layer.input")
    h = norm(prog, ctx, style.norm, "input_layernorm", x, find(norms, "input_layernorm"))
    if mixer.kind == "linear_attention":
        gated_deltanet(prog, ctx, mixer, h)
    else:
        sdpa_attention(prog, ctx, mixer, h, rotary=style.rotary, qk_norm=style.qk_norm_kind or style.norm,
                       project_gate=True)
    h = norm(prog, ctx, style.norm, "post_attention_layernorm", residual(ctx, "attention.residual"),
             find(norms, "post_attention_layernorm"))
    ffn(prog, ctx, block, h, style)


def nemotron_h_layer(prog: Program, ctx: Ctx, layer: LayerSpec, style: Style) -> None:
    if ctx.eager:
        raise TrainmathError("nemotron_h: the eager profile is not modelled; use profile='hf' (SDPA)")
    mixer = next(bl for bl in layer.blocks if bl.kind != "norm")
    norms = next((bl for bl in layer.blocks if bl.kind == "norm"), None)
    x = residual(ctx, "layer.input")
    h = norm(prog, ctx, style.norm, "norm", x, find(norms, "norm.weight") if norms else None)
    if mixer.kind == "mamba":
        mamba2(prog, ctx, mixer, h)
    elif mixer.kind == "attention":
        gqa_attention(prog, ctx, mixer, h, rotary=style.rotary, prefix="mixer")
    elif mixer.kind == "mlp":
        plain_mlp(prog, ctx, mixer, h, width=mixer.dims.intermediate, up="up_proj", down="down_proj",
                  prefix="mixer", act=style.act)
    elif mixer.kind == "moe":
        latent = any("latent" in t.name for t in mixer.tensors)
        if latent:
            ctx.unmodelled("nemotron_h with moe_latent_size is not yet modelled (use --profile megatron)")
        check_experts_path(ctx, style, "nemotron_h")
        moe_block(prog, ctx, mixer, h, style, latent=latent)
    else:
        raise TrainmathError(f"nemotron_h layer {layer.label!r} has an unknown mixer {mixer.kind!r}")


QWEN3_NEXT = FamilyDef(model_type="qwen3_next", build=_qwen3_next, layer=qwen3_next_layer,
                       style=Style(norm="gemma", rotary="rotate_half_cat",
                                   config_defaults=(("partial_rotary_factor", 0.25),)),
                       lora_moe_conversion=QWEN_MOE_LORA)
NEMOTRON_H = FamilyDef(model_type="nemotron_h", build=_nemotron_h, layer=nemotron_h_layer,
                       style=Style(norm="nemotron", act="relu2", rotary="none", positions="none",
                                   router="sigmoid_noaux", router_fp32=True, experts_grouped=False),
                       lora_mamba=True)
