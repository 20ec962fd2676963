"""Mixture-of-experts families built like Llama: mixtral, qwen2_moe, qwen3_moe, llama4 (text model).

MoE layer (Jiang Yi's blog series, first article): router d·n + n routed experts of 3·d·d_ff_e each (+ shared experts);
activated per token: router + k routed experts + shared experts. Which layers are sparse is read from the
config exactly as transformers decides it: ``decoder_sparse_step`` and ``mlp_only_layers`` (Qwen),
``moe_layers`` / ``interleave_moe_layer_step`` (Llama 4), every layer (Mixtral).
"""

from __future__ import annotations

from trainmath.model import blocks
from trainmath.model.config import ConfigView
from trainmath.model.families.common import embeddings, head, head_dim, int_list, kv_heads, layer_types, window_for
from trainmath.model.families.dense import _arch
from trainmath.model.spec import LayerSpec, ModelSpec, MoEDims, TensorSpec

FAMILIES = ("mixtral", "qwen2_moe", "qwen3_moe", "llama4_text")


def _is_sparse(cfg: ConfigView, mt: str, i: int, n_experts: int) -> bool:
    if mt == "mixtral":
        return True
    if mt == "llama4_text":
        moe_layers = int_list(cfg, "moe_layers", cfg.int("num_hidden_layers"))
        if moe_layers is None:
            step = cfg.int("interleave_moe_layer_step")
            moe_layers = range(step - 1, cfg.int("num_hidden_layers"), step)
        return i in moe_layers
    only = int_list(cfg, "mlp_only_layers", cfg.int("num_hidden_layers"), []) or []
    step = cfg.int("decoder_sparse_step")
    return i not in only and n_experts > 0 and (i + 1) % step == 0


def moe_layer_block(cfg: ConfigView, mt: str, d: int) -> blocks.Block:
    """The sparse feed-forward of one layer, with checkpoint names as each family publishes them."""
    if mt == "mixtral":
        n, k, f = cfg.int("num_local_experts"), cfg.int("num_experts_per_tok"), cfg.int("intermediate_size")
        cfg.require(k <= n, f"num_experts_per_tok ({k}) must not exceed num_local_experts ({n})")
        experts = blocks.gated_mlp(d=d, d_ff=f, prefix="block_sparse_moe.experts.{e}", names=("w1", "w3", "w2"),
                                   component="experts", experts=n)
        router = blocks.linear("block_sparse_moe.gate", n, d, "router", "replicated")
        return blocks.moe_block(d=d, dims=MoEDims(experts=n, top_k=k, expert_intermediate=f, shared_intermediate=0),
                                expert_tensors=experts, router=router)
    if mt == "llama4_text":
        n, k, f = cfg.int("num_local_experts"), cfg.int("num_experts_per_tok"), cfg.int("intermediate_size")
        cfg.require(k <= n, f"num_experts_per_tok ({k}) must not exceed num_local_experts ({n})")
        # Published Llama 4 checkpoints store the experts fused: gate_up (n, d, 2f) and down (n, f, d).
        experts = (
            TensorSpec(name="feed_forward.experts.gate_up_proj", shape=(d, 2 * f), component="experts",
                       shard="column", experts=n, transposed=True),
            TensorSpec(name="feed_forward.experts.down_proj", shape=(f, d), component="experts", shard="row",
                       experts=n, transposed=True),
        )
        router = blocks.linear("feed_forward.router", n, d, "router", "replicated")
        shared = blocks.gated_mlp(d=d, d_ff=f, prefix="feed_forward.shared_expert", component="shared_experts")
        return blocks.moe_block(d=d, dims=MoEDims(experts=n, top_k=k, expert_intermediate=f, shared_intermediate=f),
                                expert_tensors=experts, router=router, shared=shared)
    # qwen2_moe, qwen3_moe
    n, k, f = cfg.int("num_experts"), cfg.int("num_experts_per_tok"), cfg.int("moe_intermediate_size")
    cfg.require(k <= n, f"num_experts_per_tok ({k}) must not exceed num_experts ({n})")
    experts = blocks.gated_mlp(d=d, d_ff=f, prefix="mlp.experts.{e}", component="experts", experts=n)
    router = blocks.linear("mlp.gate", n, d, "router", "replicated")
    shared: tuple[TensorSpec, ...] = ()
    f_shared = 0
    if mt == "qwen2_moe":
        # transformers always builds the shared expert and its gate, even at width 0
        f_shared = cfg.int("shared_expert_intermediate_size", minimum=0)
        shared = blocks.gated_mlp(d=d, d_ff=f_shared, prefix="mlp.shared_expert", component="shared_experts")
        shared += blocks.linear("mlp.shared_expert_gate", 1, d, "shared_experts", "replicated")
    return blocks.moe_block(d=d, dims=MoEDims(experts=n, top_k=k, expert_intermediate=f,
                                              shared_intermediate=f_shared),
                            expert_tensors=experts, router=router, shared=shared)


def build(cfg: ConfigView, name: str) -> ModelSpec:
    mt = cfg.model_type
    d, vocab, n = cfg.int("hidden_size"), cfg.int("vocab_size"), cfg.int("num_hidden_layers")
    h = cfg.int("num_attention_heads")
    hkv, hd = kv_heads(cfg, h), head_dim(cfg, d, h)
    tied = cfg.bool("tie_word_embeddings")
    if mt == "qwen2_moe":
        bias = dict(q_bias=cfg.bool("qkv_bias"), kv_bias=cfg.bool("qkv_bias"))
    elif mt == "mixtral":
        bias = {}
    else:
        bias = dict(q_bias=cfg.bool("attention_bias"), kv_bias=cfg.bool("attention_bias"),
                    o_bias=cfg.bool("attention_bias"))
    qk_norm = "head" if mt == "qwen3_moe" else None  # Llama 4's QK norm is a weightless L2 norm
    ffn_prefix = "feed_forward" if mt == "llama4_text" else "mlp"
    dense_ff = cfg.int("intermediate_size_mlp" if mt == "llama4_text" else "intermediate_size")
    dense = blocks.dense_mlp_block(blocks.gated_mlp(d=d, d_ff=dense_ff, prefix=ffn_prefix), d=d, d_ff=dense_ff,
                                   gated=True)
    sparse = moe_layer_block(cfg, mt, d)
    norms = blocks.norm_block(("input_layernorm", d), ("post_attention_layernorm", d))
    if mt == "llama4_text":
        # Llama4TextConfig: layers that use RoPE (no_rope_layers[i] == 1, all but every no_rope_layer_interval-th)
        # attend within chunks of attention_chunk_size; the others are full attention.
        window = cfg.window("attention_chunk_size")
        interval = cfg.int("no_rope_layer_interval")
        rope = (int_list(cfg, "no_rope_layers", 1) or [int((i + 1) % interval != 0) for i in range(n)])[:n]
        default = ["chunked_attention" if r and window is not None else "full_attention" for r in rope]
    else:
        # Qwen reads the window only with use_sliding_window (transformers writes sliding_window 0 when it is off)
        use_sw = cfg.bool("use_sliding_window", False) if mt != "mixtral" else cfg.window() is not None
        window = cfg.window() if use_sw else None
        default = (["sliding_attention"] * n if use_sw and window is not None else ["full_attention"] * n)
    types = layer_types(cfg, n, default, ("full_attention", "sliding_attention", "chunked_attention"))
    n_experts = sparse.dims.experts
    cache: dict[tuple[str, bool], LayerSpec] = {}
    layers = []
    for i, t in enumerate(types):
        is_sparse = _is_sparse(cfg, mt, i, n_experts)
        key = (t, is_sparse)
        if key not in cache:
            attn = blocks.attention(d=d, heads=h, kv_heads=hkv, head_dim=hd, qk_norm=qk_norm,
                                    sliding_window=window_for(t, window if isinstance(window, int) else None),
                                    **bias)
            cache[key] = LayerSpec(label=f"{t} + {'moe' if is_sparse else 'mlp'}",
                                   blocks=(attn, sparse if is_sparse else dense, norms))
        layers.append(cache[key])
    prefix = "model."
    notes: tuple[str, ...] = ()
    if "ForConditionalGeneration" in _arch(cfg):
        prefix = "language_model.model."  # the multimodal checkpoint nests the text model
    symbols = dict(N=n, V=vocab, d=d, h=h, h_kv=hkv, h_d=hd, n=n_experts, k=sparse.dims.top_k,
                   d_ff=sparse.dims.expert_intermediate)
    cfg.check()
    post = head(vocab, d, tied, final_norm=prefix + "norm",
                name=("language_model.lm_head.weight" if prefix != "model." else "lm_head.weight"))
    return ModelSpec(
        name=name, model_type=mt, architecture=_arch(cfg), vocab_size=vocab, hidden_size=d,
        max_position_embeddings=cfg.int("max_position_embeddings"), layer_prefix=prefix + "layers.{i}.",
        pre=embeddings(vocab, d, prefix + "embed_tokens.weight"), layers=tuple(layers), post=post,
        tie_word_embeddings=tied, notes=notes, symbols=symbols,
    )
