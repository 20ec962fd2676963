"""The classic architectures of the first article of Jiang Yi's blog series: LayerNorm (2d) and a plain GELU MLP
with biases.

- gpt2: learned position embeddings (n_positions·d), Conv1D layers stored (in, out), fused c_attn of width 3d,
  MLP d_ff = n_inner or 4d, everything biased, tied lm_head.
- falcon: fused query_key_value whose width depends on the attention variant (MHA 3d; multi-query d + 2·h_d;
  the "new decoder architecture" of Falcon-40B/180B (h + 2·h_kv)·h_d), parallel attention/MLP with one or two
  LayerNorms, MLP d_ff = ffn_hidden_size or 4d, biases when ``bias``.
"""

from __future__ import annotations

from trainmath.model import blocks
from trainmath.model.config import ConfigView
from trainmath.model.families.common import head
from trainmath.model.families.dense import _arch
from trainmath.model.spec import AttentionDims, Block, LayerSpec, ModelSpec, TensorSpec

FAMILIES = ("gpt2", "falcon")


def _conv1d(name: str, d_in: int, d_out: int, component: str, shard: str) -> tuple[TensorSpec, ...]:
    """GPT-2's Conv1D: weight stored (in, out), bias (out)."""
    return (TensorSpec(name=f"{name}.weight", shape=(d_in, d_out), component=component, shard=shard,
                       transposed=True),
            TensorSpec(name=f"{name}.bias", shape=(d_out,), component=component, kind="bias",
                       shard="column" if shard == "column" else "replicated"))


def _gpt2(cfg: ConfigView, name: str) -> ModelSpec:
    d, vocab, n = cfg.int("n_embd"), cfg.int("vocab_size"), cfg.int("n_layer")
    h, n_pos = cfg.int("n_head"), cfg.int("n_positions")
    cfg.require(d % h == 0, f"n_embd ({d}) must be divisible by n_head ({h})")
    d_ff = cfg.opt_int("n_inner") or 4 * d
    attn = Block(kind="attention", tensors=_conv1d("attn.c_attn", d, 3 * d, "attention", "column")
                 + _conv1d("attn.c_proj", d, d, "attention", "row"),
                 dims=AttentionDims(heads=h, kv_heads=h, head_dim=d // h, v_head_dim=d // h))
    mlp = blocks.dense_mlp_block(_conv1d("mlp.c_fc", d, d_ff, "mlp_dense", "column")
                                 + _conv1d("mlp.c_proj", d_ff, d, "mlp_dense", "row"), d=d, d_ff=d_ff, gated=False)
    norms = blocks.norm_block(("ln_1", d), ("ln_2", d), bias=True)
    layer = LayerSpec(label="full_attention + mlp", blocks=(attn, mlp, norms))
    tied = cfg.bool("tie_word_embeddings")
    cfg.check()
    pre = (TensorSpec(name="transformer.wte.weight", shape=(vocab, d), component="embed_tokens", kind="embedding",
                      shard="vocab"),
           TensorSpec(name="transformer.wpe.weight", shape=(n_pos, d), component="pos_embed", kind="embedding"))
    return ModelSpec(
        name=name, model_type="gpt2", architecture=_arch(cfg), vocab_size=vocab, hidden_size=d,
        max_position_embeddings=n_pos, layer_prefix="transformer.h.{i}.", pre=pre, layers=(layer,) * n,
        post=head(vocab, d, tied, final_norm="transformer.ln_f", norm_bias=True), tie_word_embeddings=tied,
        symbols=dict(N=n, V=vocab, d=d, d_ff=d_ff, h=h, h_kv=h, h_d=d // h),
    )


def _falcon(cfg: ConfigView, name: str) -> ModelSpec:
    d, vocab, n = cfg.int("hidden_size"), cfg.int("vocab_size"), cfg.int("num_hidden_layers")
    h = cfg.int("num_attention_heads")
    cfg.require(d % h == 0, f"hidden_size ({d}) must be divisible by num_attention_heads ({h})")
    hd = d // h
    new_arch = cfg.bool("new_decoder_architecture")
    if new_arch or not cfg.bool("multi_query"):
        hkv = cfg.opt_int("num_kv_heads") or h
    else:
        hkv = 1
    cfg.require(h % hkv == 0, f"num_kv_heads ({hkv}) must divide num_attention_heads ({h})")
    bias = cfg.bool("bias")
    qkv_out = (h + 2 * hkv) * hd if new_arch else (d + 2 * hd if hkv == 1 else 3 * d)
    attn = Block(kind="attention",
                 tensors=blocks.linear("self_attention.query_key_value", qkv_out, d, "attention", "column", bias=bias)
                 + blocks.linear("self_attention.dense", d, d, "attention", "row", bias=bias),
                 dims=AttentionDims(heads=h, kv_heads=hkv, head_dim=hd, v_head_dim=hd))
    d_ff = cfg.opt_int("ffn_hidden_size") or 4 * d
    mlp = blocks.dense_mlp_block(blocks.plain_mlp(d=d, d_ff=d_ff, bias=bias, names=("dense_h_to_4h", "dense_4h_to_h")),
                                 d=d, d_ff=d_ff, gated=False)
    n_ln = cfg.opt_int("num_ln_in_parallel_attn") or (2 if new_arch else 1)
    if not cfg.bool("parallel_attn") and not new_arch:
        norm_names = ("input_layernorm", "post_attention_layernorm")
    elif new_arch and n_ln == 2:
        norm_names = ("ln_attn", "ln_mlp")
    else:
        norm_names = ("input_layernorm",)
    norms = blocks.norm_block(*((nm, d) for nm in norm_names), bias=True)
    layer = LayerSpec(label="full_attention + mlp", blocks=(attn, mlp, norms))
    tied = cfg.bool("tie_word_embeddings")
    cfg.check()
    pre = (TensorSpec(name="transformer.word_embeddings.weight", shape=(vocab, d), component="embed_tokens",
                      kind="embedding", shard="vocab"),)
    return ModelSpec(
        name=name, model_type="falcon", architecture=_arch(cfg), vocab_size=vocab, hidden_size=d,
        max_position_embeddings=cfg.int("max_position_embeddings"), layer_prefix="transformer.h.{i}.", pre=pre,
        layers=(layer,) * n, post=head(vocab, d, tied, final_norm="transformer.ln_f", norm_bias=True),
        tie_word_embeddings=tied, symbols=dict(N=n, V=vocab, d=d, d_ff=d_ff, h=h, h_kv=hkv, h_d=hd),
    )


def build(cfg: ConfigView, name: str) -> ModelSpec:
    return _gpt2(cfg, name) if cfg.model_type == "gpt2" else _falcon(cfg, name)
