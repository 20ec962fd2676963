"""FLOPs per GEMM equal FlopCounterMode's count exactly (==), forward and forward + backward, on tiny models."""

import pytest

from trainmath.families import spec_from_config
from trainmath.flops import count_flops
from trainmath.tree import check_sums

from .oracle import build_model, measured_flops, tiny_config

MOE = dict(num_local_experts=4, num_experts_per_tok=2)
QWEN_MOE = dict(num_experts=8, num_experts_per_tok=2, moe_intermediate_size=32, decoder_sparse_step=1)
MLA = dict(n_routed_experts=4, num_experts_per_tok=2, moe_intermediate_size=32, n_shared_experts=1,
           first_k_dense_replace=1, n_group=1, topk_group=1, kv_lora_rank=32, qk_rope_head_dim=8,
           qk_nope_head_dim=16, v_head_dim=24, num_key_value_heads=4)

CASES = {
    "llama": ("meta-llama/Llama-3.1-8B", {}),
    "llama-biases": ("meta-llama/Llama-3.1-8B", dict(attention_bias=True, mlp_bias=True)),
    "mistral": ("mistralai/Mistral-7B-v0.3", {}),
    "qwen2-qkv-bias": ("Qwen/Qwen2.5-7B", {}),
    "qwen3-tied": ("Qwen/Qwen3-0.6B", dict(head_dim=32, tie_word_embeddings=True)),
    "qwen3-untied": ("Qwen/Qwen3-8B", dict(head_dim=32, tie_word_embeddings=False)),
    "olmo2": ("allenai/OLMo-2-1124-7B", {}),
    "gemma2-window": ("google/gemma-2-9b", dict(head_dim=16, sliding_window=4)),
    "gemma3-window": ("google/gemma-3-1b-it", dict(head_dim=16, sliding_window=4, num_hidden_layers=3)),
    "phi3-fused": ("microsoft/Phi-3.5-mini-instruct", {}),
    "cohere": ("CohereForAI/aya-23-8B", {}),
    "starcoder2-biases": ("bigcode/starcoder2-7b", dict(use_bias=True)),
    "gpt2": ("openai-community/gpt2", dict(n_embd=64, n_layer=2, n_head=4, n_positions=64, n_inner=None)),
    "falcon-7b": ("tiiuae/falcon-7b", dict(num_kv_heads=1, ffn_hidden_size=None)),
    "falcon-180b-new-arch": ("tiiuae/falcon-180B", dict(num_kv_heads=2, ffn_hidden_size=None)),
    "kimi_k2-mla": ("moonshotai/Kimi-K2-Instruct", dict(MLA, q_lora_rank=24)),
    "mixtral": ("mistralai/Mixtral-8x7B-v0.1", MOE),
    "qwen2_moe-shared": ("Qwen/Qwen1.5-MoE-A2.7B", dict(QWEN_MOE, shared_expert_intermediate_size=48)),
    "qwen3_moe": ("Qwen/Qwen3-30B-A3B", dict(QWEN_MOE, head_dim=16, mlp_only_layers=[1])),
    "deepseek_v3-mla": ("deepseek-ai/DeepSeek-V3", dict(MLA, q_lora_rank=24)),
    "deepseek_v2-mla-no-q-lora": ("deepseek-ai/DeepSeek-V2-Lite", dict(MLA, q_lora_rank=None)),
    "glm4_moe": ("zai-org/GLM-4.5", dict(n_routed_experts=4, num_experts_per_tok=2, moe_intermediate_size=32,
                                          n_shared_experts=1, first_k_dense_replace=1, n_group=1, topk_group=1,
                                          head_dim=16)),
    "gpt_oss-sinks": ("openai/gpt-oss-20b", dict(MOE, head_dim=16, sliding_window=4)),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_forward_and_backward_equal_flop_counter(case):
    repo, overrides = CASES[case]
    cfg = tiny_config(repo, **overrides)
    batch, seq = 2, 7
    report = count_flops(spec_from_config(cfg, name=case, source=case), batch=batch, seq=seq)
    fwd, fwd_bwd = measured_flops(build_model(cfg), batch=batch, seq=seq)
    assert report.forward.value == fwd
    assert report.forward.value + report.backward.value == fwd_bwd
    assert check_sums(report.training) == []
