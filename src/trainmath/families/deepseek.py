"""DeepSeek-style MoE families: deepseek_v2, deepseek_v3 (and kimi_k2, its architecture), glm4_moe.

- MLA attention for DeepSeek (with or without q LoRA: ``q_lora_rank: null`` in V2-Lite); GQA with biases and
  q/k norms for GLM-4.5.
- The first ``first_k_dense_replace`` layers are dense (d_ff = ``intermediate_size``); the rest are MoE with
  ``n_routed_experts`` of width ``moe_intermediate_size`` and ``n_shared_experts`` shared experts fused into
  one MLP of width n_shared·moe_intermediate_size, as transformers builds them.
- Not counted, reported separately: the router's ``e_score_correction_bias`` (a buffer in transformers, a
  tensor in the checkpoint) and the ``num_nextn_predict_layers`` multi-token-prediction layers (DeepSeek-V3
  §2.2), which checkpoints carry but transformers does not build.
"""

from __future__ import annotations

from trainmath.families.base import FamilyDef
from trainmath.families.common import (
    architecture,
    embeddings,
    head,
    head_dim,
    kv_heads,
)
from trainmath.families.moe import QWEN_MOE_LORA, moe_layer
from trainmath.model import blocks
from trainmath.model.config import ConfigView
from trainmath.model.spec import ExtraTensors, LayerSpec, MLADims, ModelSpec, MoEDims, TensorSpec
from trainmath.ops.style import Style


def _mixer(cfg: ConfigView, mt: str, d: int) -> blocks.Block:
    h = cfg.int("num_attention_heads")
    if mt == "glm4_moe":
        hkv = kv_heads(cfg, h)
        bias = cfg.bool("attention_bias")
        return blocks.attention(d=d, heads=h, kv_heads=hkv, head_dim=head_dim(cfg, d, h), q_bias=bias,
                                kv_bias=bias, qk_norm="head" if cfg.bool("use_qk_norm") else None)
    dims = MLADims(heads=h, q_lora_rank=cfg.opt_int("q_lora_rank"), kv_lora_rank=cfg.int("kv_lora_rank"),
                   qk_nope_head_dim=cfg.int("qk_nope_head_dim"), qk_rope_head_dim=cfg.int("qk_rope_head_dim"),
                   v_head_dim=cfg.int("v_head_dim"))
    return blocks.mla(d=d, dims=dims, bias=cfg.bool("attention_bias"))


def _moe(cfg: ConfigView, d: int) -> blocks.Block:
    n, k = cfg.int("n_routed_experts"), cfg.int("num_experts_per_tok")
    cfg.require(k <= n, f"num_experts_per_tok ({k}) must not exceed n_routed_experts ({n})")
    f = cfg.int("moe_intermediate_size")
    n_shared = cfg.int("n_shared_experts", 0, minimum=0)
    experts = blocks.gated_mlp(d=d, d_ff=f, prefix="mlp.experts.{e}", component="experts", experts=n)
    router = blocks.linear("mlp.gate", n, d, "router", "replicated")
    shared = (blocks.gated_mlp(d=d, d_ff=f * n_shared, prefix="mlp.shared_experts", component="shared_experts")
              if n_shared else ())
    return blocks.moe_block(d=d, dims=MoEDims(experts=n, top_k=k, expert_intermediate=f,
                                              shared_intermediate=f * n_shared),
                            expert_tensors=experts, router=router, shared=shared)


def _has_correction_bias(cfg: ConfigView, mt: str) -> bool:
    return mt == "glm4_moe" or (mt == "deepseek_v3" and cfg.get("topk_method", "noaux_tc") == "noaux_tc")


def build(cfg: ConfigView, name: str) -> ModelSpec:
    mt = cfg.model_type
    d, vocab, n = cfg.int("hidden_size"), cfg.int("vocab_size"), cfg.int("num_hidden_layers")
    tied = cfg.bool("tie_word_embeddings")
    first_dense = cfg.int("first_k_dense_replace", 0, minimum=0)
    mixer = _mixer(cfg, mt, d)
    d_ff = cfg.int("intermediate_size")
    dense = blocks.dense_mlp_block(blocks.gated_mlp(d=d, d_ff=d_ff), d=d, d_ff=d_ff, gated=True)
    moe = _moe(cfg, d)
    norms = blocks.norm_block(("input_layernorm", d), ("post_attention_layernorm", d))
    kind = "mla" if mixer.kind == "mla" else "full_attention"
    dense_layer = LayerSpec(label=f"{kind} + mlp", blocks=(mixer, dense, norms))
    moe_layer = LayerSpec(label=f"{kind} + moe", blocks=(mixer, moe, norms))
    layers = tuple(dense_layer if i < first_dense else moe_layer for i in range(n))

    extras = []
    n_experts = moe.dims.experts
    if _has_correction_bias(cfg, mt):
        extras.append(ExtraTensors(
            label="router e_score_correction_bias",
            why="a buffer in transformers (not a parameter), stored in the checkpoint (fp32)",
            tensors=(TensorSpec(name="mlp.gate.e_score_correction_bias", shape=(n_experts,), component="router",
                                kind="param"),),
            layer_indices=tuple(range(first_dense, n))))
    mtp = cfg.int("num_nextn_predict_layers", 0, minimum=0)
    if mtp:
        # DeepSeek-V3 §2.2 multi-token prediction module: its own embedding and head (shared with the main model
        # in training, stored again in the checkpoint), two norms, a 2d→d projection and one MoE decoder layer.
        mtp_tensors = (
            embeddings(vocab, d, "embed_tokens.weight")
            + blocks.norm("enorm", d) + blocks.norm("hnorm", d)
            + blocks.linear("eh_proj", d, 2 * d, "attention", "replicated")
            + blocks.norm("shared_head.norm", d)
            + (TensorSpec(name="shared_head.head.weight", shape=(vocab, d), component="lm_head", shard="vocab"),)
            + moe_layer.tensors
            + (extras[0].tensors if extras else ()))
        extras.append(ExtraTensors(
            label=f"multi-token prediction layer{'s' if mtp > 1 else ''} ({mtp})",
            why="num_nextn_predict_layers: in the checkpoint, not built by transformers (DeepSeek-V3 §2.2)",
            tensors=mtp_tensors, layer_indices=tuple(range(n, n + mtp))))
    symbols = dict(N=n, V=vocab, d=d, h=cfg.int("num_attention_heads"), n=n_experts, k=moe.dims.top_k,
                   d_ff=moe.dims.expert_intermediate)
    if mixer.kind == "attention":
        symbols.update(h_kv=mixer.dims.kv_heads, h_d=mixer.dims.head_dim)
    cfg.check()
    return ModelSpec(
        name=name, model_type=mt, architecture=architecture(cfg), vocab_size=vocab, hidden_size=d,
        max_position_embeddings=cfg.int("max_position_embeddings"), layer_prefix="model.layers.{i}.",
        pre=embeddings(vocab, d), layers=layers, post=head(vocab, d, tied), tie_word_embeddings=tied,
        extras=tuple(extras), symbols=symbols,
    )


DEEPSEEK_V2 = FamilyDef(model_type="deepseek_v2", build=build, layer=moe_layer,
                        style=Style(positions="freqs_cis", router="softmax_greedy", router_fp32=True,
                                    config_defaults=(("norm_topk_prob", False), ("topk_method", "greedy"))),
                        lora_moe_conversion=QWEN_MOE_LORA)
DEEPSEEK_V3 = FamilyDef(model_type="deepseek_v3", build=build, layer=moe_layer,
                        style=Style(router="sigmoid_noaux", router_fp32=True), lora_moe_conversion=QWEN_MOE_LORA)
KIMI_K2 = FamilyDef(model_type="kimi_k2", build=build, config_as="deepseek_v3",
                    note="kimi_k2 is DeepSeek-V3's architecture (DeepseekV3ForCausalLM)", runs_as=DEEPSEEK_V3,
                    lora_moe_conversion=QWEN_MOE_LORA)
GLM4_MOE = FamilyDef(model_type="glm4_moe", build=build, layer=moe_layer,
                     style=Style(rotary="rotate_half_cat", router="sigmoid_noaux", router_fp32=True,
                                 config_defaults=(("partial_rotary_factor", 0.5),)),
                     lora_moe_conversion=QWEN_MOE_LORA)
