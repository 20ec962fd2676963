"""Configs with changed hyperparameters, generated here, in every family: our ledger still equals transformers'.

Each family starts from a catalog config and draws new sizes and switches (biases, q/k norms, tying, expert
counts, sparse-layer placement, layer patterns) from a seeded generator, so nothing about the catalog's numbers
is memorised by the ledger.
"""

import random

import pytest

from trainmath.families import spec_from_config
from trainmath.params import count_params
from trainmath.sources import catalog_entry

from .reference import meta_model, reference_counts

BASE = {
    "llama": "meta-llama/Llama-3.1-8B", "mistral": "mistralai/Mistral-7B-v0.3", "qwen2": "Qwen/Qwen2.5-7B",
    "qwen3": "Qwen/Qwen3-8B", "olmo2": "allenai/OLMo-2-1124-7B", "gemma2": "google/gemma-2-9b",
    "gemma3_text": "google/gemma-3-1b-it", "phi3": "microsoft/Phi-3.5-mini-instruct", "cohere": "CohereForAI/aya-23-8B",
    "starcoder2": "bigcode/starcoder2-7b", "mixtral": "mistralai/Mixtral-8x7B-v0.1",
    "qwen2_moe": "Qwen/Qwen1.5-MoE-A2.7B", "qwen3_moe": "Qwen/Qwen3-30B-A3B",
    "llama4": "meta-llama/Llama-4-Scout-17B-16E-Instruct", "deepseek_v2": "deepseek-ai/DeepSeek-V2-Lite",
    "deepseek_v3": "deepseek-ai/DeepSeek-V3", "kimi_k2": "moonshotai/Kimi-K2-Instruct", "glm4_moe": "zai-org/GLM-4.5",
    "gpt_oss": "openai/gpt-oss-20b", "qwen3_next": "Qwen/Qwen3-Next-80B-A3B-Thinking",
    "nemotron_h": "nvidia/Nemotron-H-56B-Base-8K", "gpt2": "openai-community/gpt2", "falcon": "tiiuae/falcon-180B",
}

# Switches each family's transformers code reads (a missing key falls back to the config class default).
SWITCHES = {
    "llama": ["attention_bias", "mlp_bias"], "qwen3": ["attention_bias"], "olmo2": ["attention_bias"],
    "gemma2": ["attention_bias"], "gemma3_text": ["attention_bias"], "cohere": ["attention_bias", "use_qk_norm"],
    "starcoder2": ["use_bias"], "qwen2_moe": ["qkv_bias"], "qwen3_moe": ["attention_bias"],
    "glm4_moe": ["attention_bias", "use_qk_norm"], "gpt_oss": ["attention_bias"], "qwen3_next": ["attention_bias"],
    "deepseek_v2": ["attention_bias"], "deepseek_v3": ["attention_bias"], "nemotron_h": ["mlp_bias", "use_conv_bias"],
    "falcon": ["bias", "parallel_attn", "multi_query", "new_decoder_architecture"],
}


def mutate(model_type: str, rng: random.Random) -> dict:
    cfg = {k: v for k, v in catalog_entry(BASE[model_type]).config.items() if not k.startswith("_")}
    text = cfg["text_config"] if model_type == "llama4" else cfg
    heads = rng.choice([2, 4, 8])
    kv = rng.choice([h for h in (1, 2, 4, 8) if heads % h == 0])
    head_dim = rng.choice([8, 16, 32])
    hidden = rng.choice([32, 64, 96, 128]) if model_type not in ("gpt2", "falcon") else heads * head_dim
    layers = rng.randint(2, 6)
    sizes = dict(hidden_size=hidden, num_hidden_layers=layers, num_attention_heads=heads, num_key_value_heads=kv,
                 intermediate_size=rng.choice([48, 64, 160]), vocab_size=rng.choice([97, 128, 1000]),
                 tie_word_embeddings=rng.random() < 0.5)
    if "head_dim" in text or model_type in ("gemma2", "gemma3_text", "qwen3", "qwen3_moe", "qwen3_next",
                                             "glm4_moe", "gpt_oss", "nemotron_h"):
        sizes["head_dim"] = head_dim
    else:
        sizes["hidden_size"] = heads * head_dim
    text.update(sizes)
    text.pop("layer_types", None)
    text.pop("rope_scaling", None), text.pop("rope_parameters", None)  # Phi-3's factors are sized per head_dim
    for key in ("pad_token_id", "bos_token_id", "eos_token_id"):  # ids of the original vocabulary
        cfg.pop(key, None), text.pop(key, None)
    text["pad_token_id"] = 0  # some classes default to an id past the new, smaller vocabulary (Phi-3: 32000)
    for key in SWITCHES.get(model_type, []):
        text[key] = rng.random() < 0.5
    experts = rng.choice([4, 8, 16])
    top_k = rng.randint(1, min(4, experts))
    if model_type in ("mixtral", "llama4", "gpt_oss"):
        text.update(num_local_experts=experts, num_experts_per_tok=top_k)
    if model_type == "llama4":
        text.update(intermediate_size_mlp=rng.choice([64, 96]), interleave_moe_layer_step=rng.choice([1, 2]))
        text.pop("moe_layers", None), text.pop("no_rope_layers", None)
    if model_type in ("qwen2_moe", "qwen3_moe", "qwen3_next"):
        text.update(num_experts=experts, num_experts_per_tok=top_k, moe_intermediate_size=rng.choice([16, 32]),
                    decoder_sparse_step=rng.choice([1, 2]),
                    mlp_only_layers=sorted(rng.sample(range(layers), rng.randint(0, 1))))
        if model_type != "qwen3_moe":
            text["shared_expert_intermediate_size"] = rng.choice([0, 24]) if model_type == "qwen2_moe" else 24
    if model_type == "qwen3_next":
        text.update(linear_num_key_heads=2, linear_num_value_heads=rng.choice([2, 4]), linear_key_head_dim=8,
                    linear_value_head_dim=rng.choice([8, 16]), full_attention_interval=rng.choice([2, 3]))
    if model_type in ("deepseek_v2", "deepseek_v3", "kimi_k2", "glm4_moe"):
        text.update(n_routed_experts=experts, num_experts_per_tok=top_k, moe_intermediate_size=rng.choice([16, 32]),
                    n_shared_experts=rng.choice([0, 1, 2]), first_k_dense_replace=rng.randint(0, layers),
                    n_group=1, topk_group=1)
        if model_type != "glm4_moe":
            text.update(kv_lora_rank=rng.choice([16, 32]), qk_rope_head_dim=8, qk_nope_head_dim=rng.choice([8, 16]),
                        v_head_dim=rng.choice([8, 16]), q_lora_rank=rng.choice([None, 24]),
                        num_key_value_heads=heads)
    if model_type == "nemotron_h":
        pattern = "".join(rng.choice("M*-E") for _ in range(layers))
        text.pop("layers_block_type", None)
        text.update(hybrid_override_pattern=pattern, mamba_num_heads=4, mamba_head_dim=8, n_groups=rng.choice([1, 2]),
                    ssm_state_size=8, n_routed_experts=experts, num_experts_per_tok=top_k,
                    moe_intermediate_size=16, moe_shared_expert_intermediate_size=rng.choice([8, 16]))
    if model_type == "gpt2":
        cfg.update(n_embd=hidden, n_layer=layers, n_head=heads, n_positions=rng.choice([64, 128]),
                   n_inner=rng.choice([None, 48]))
    if model_type == "falcon":
        text.update(num_kv_heads=kv, ffn_hidden_size=rng.choice([None, 48]))
    return cfg


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("model_type", sorted(BASE))
def test_mutated_config_matches_transformers(model_type, seed):
    cfg = mutate(model_type, random.Random(f"{model_type}-{seed}"))
    report = count_params(spec_from_config(cfg, name=model_type, source=model_type))
    total, comps, activated = reference_counts(meta_model(cfg))
    assert report.total_params == total
    assert report.activated_params == activated
    assert {k: v for k, v in report.components.flat().items() if v} == {k: v for k, v in comps.items() if v}


def test_families_cover_every_supported_model_type():
    from trainmath.families import supported_model_types

    assert set(supported_model_types()) - {"llama4_text"} == set(BASE)
