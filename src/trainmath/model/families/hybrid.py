"""Hybrid families whose layers are not all attention: qwen3_next (Gated DeltaNet + gated full attention, MoE)
and nemotron_h (Mamba-2, attention, MLP and MoE layers in a pattern).

Jiang Yi's blog series (first article, "Extension"): for a hybrid model, count each layer type separately and add
them up.
The layer pattern is read as transformers reads it: Qwen3-Next's ``layer_types`` (default: full attention every
``full_attention_interval``-th layer), Nemotron-H's ``layers_block_type`` or ``hybrid_override_pattern``
(M = Mamba-2, * = attention, - = MLP, E = MoE).
"""

from __future__ import annotations

from trainmath.model import blocks
from trainmath.model.config import MAX_LAYERS, ConfigView, show
from trainmath.model.families.common import embeddings, head, head_dim, int_list, kv_heads, layer_types
from trainmath.model.families.dense import _arch
from trainmath.model.spec import (
    Block,
    LayerSpec,
    LinearAttentionDims,
    MambaDims,
    ModelSpec,
    MoEDims,
    TensorSpec,
)

FAMILIES = ("qwen3_next", "nemotron_h")


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
        name=name, model_type="qwen3_next", architecture=_arch(cfg), vocab_size=vocab, hidden_size=d,
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
        name=name, model_type="nemotron_h", architecture=_arch(cfg), vocab_size=vocab, hidden_size=d,
        max_position_embeddings=cfg.int("max_position_embeddings"), layer_prefix="backbone.layers.{i}.",
        pre=embeddings(vocab, d, "backbone.embeddings.weight"), layers=tuple(by_type[t] for t in types),
        post=head(vocab, d, tied, final_norm="backbone.norm_f"), tie_word_embeddings=tied,
        notes=tuple(notes),
        symbols=dict(N=len(types), V=vocab, d=d, h=h, h_kv=hkv, h_d=hd, d_ff=d_ff),
    )


def build(cfg: ConfigView, name: str) -> ModelSpec:
    return _qwen3_next(cfg, name) if cfg.model_type == "qwen3_next" else _nemotron_h(cfg, name)
