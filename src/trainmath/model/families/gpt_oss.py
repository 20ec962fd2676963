"""gpt-oss: GQA with biases and learned attention sinks, alternating sliding/full attention, MoE whose experts
and router carry biases (OpenAI 2025 model card §2).

Experts are stored fused, as transformers and the bf16 checkpoints hold them: gate_up (n, d, 2·f) with bias
(n, 2·f), down (n, f, d) with bias (n, d). The published checkpoints store them MXFP4-quantised
(``*_blocks`` + ``*_scales``); ``check-checkpoint`` reports that as quantised storage.
"""

from __future__ import annotations

from trainmath.model import blocks
from trainmath.model.config import ConfigView
from trainmath.model.families.common import embeddings, head, head_dim, kv_heads, layer_types, window_for
from trainmath.model.families.dense import _arch
from trainmath.model.spec import LayerSpec, ModelSpec, MoEDims, TensorSpec


def build(cfg: ConfigView, name: str) -> ModelSpec:
    d, vocab, n = cfg.int("hidden_size"), cfg.int("vocab_size"), cfg.int("num_hidden_layers")
    h = cfg.int("num_attention_heads")
    hkv, hd = kv_heads(cfg, h), head_dim(cfg, d, h)
    tied = cfg.bool("tie_word_embeddings")
    bias = cfg.bool("attention_bias")
    n_exp, k, f = cfg.int("num_local_experts"), cfg.int("num_experts_per_tok"), cfg.int("intermediate_size")
    cfg.require(k <= n_exp, f"num_experts_per_tok ({k}) must not exceed num_local_experts ({n_exp})")
    experts = (
        TensorSpec(name="mlp.experts.gate_up_proj", shape=(d, 2 * f), component="experts", shard="column",
                   experts=n_exp, transposed=True),
        TensorSpec(name="mlp.experts.gate_up_proj_bias", shape=(2 * f,), component="experts", kind="bias",
                   shard="column", experts=n_exp),
        TensorSpec(name="mlp.experts.down_proj", shape=(f, d), component="experts", shard="row", experts=n_exp,
                   transposed=True),
        TensorSpec(name="mlp.experts.down_proj_bias", shape=(d,), component="experts", kind="bias",
                   shard="replicated", experts=n_exp),
    )
    router = blocks.linear("mlp.router", n_exp, d, "router", "replicated", bias=True, bias_shard="replicated")
    moe = blocks.moe_block(d=d, dims=MoEDims(experts=n_exp, top_k=k, expert_intermediate=f, shared_intermediate=0),
                           expert_tensors=experts, router=router)
    norms = blocks.norm_block(("input_layernorm", d), ("post_attention_layernorm", d))
    window = cfg.window()
    types = layer_types(cfg, n, ["sliding_attention" if (i + 1) % 2 else "full_attention" for i in range(n)],
                        ("full_attention", "sliding_attention"))
    by_type = {}
    for t in dict.fromkeys(types):
        attn = blocks.attention(d=d, heads=h, kv_heads=hkv, head_dim=hd, q_bias=bias, kv_bias=bias, o_bias=bias,
                                sinks=True, sliding_window=window_for(t, window if isinstance(window, int) else None))
        by_type[t] = LayerSpec(label=f"{t} + moe", blocks=(attn, moe, norms))
    cfg.check()
    return ModelSpec(
        name=name, model_type="gpt_oss", architecture=_arch(cfg), vocab_size=vocab, hidden_size=d,
        max_position_embeddings=cfg.int("max_position_embeddings"), layer_prefix="model.layers.{i}.",
        pre=embeddings(vocab, d), layers=tuple(by_type[t] for t in types), post=head(vocab, d, tied),
        tie_word_embeddings=tied,
        symbols=dict(N=n, V=vocab, d=d, h=h, h_kv=hkv, h_d=hd, n=n_exp, k=k, d_ff=f),
    )
