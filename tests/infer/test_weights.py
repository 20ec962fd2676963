"""Weight bytes: 16-bit equals the real model's parameter bytes; quantised formats follow the stated scale
conventions exactly; tensor-parallel shards add back up to the whole."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from trainmath.errors import TrainmathError
from trainmath.infer import WeightFormat, weights_tree
from trainmath.infer.dtypes import quantised_weight_bytes, scale_count
from trainmath.infer.weights import validate_tp
from trainmath.params import count_params
from trainmath.sources import load_spec
from trainmath.tree import check_sums

MODELS = ["Qwen/Qwen3-8B", "meta-llama/Llama-3.1-70B", "deepseek-ai/DeepSeek-V3", "Qwen/Qwen3-Next-80B-A3B-Thinking",
          "nvidia/Nemotron-H-56B-Base-8K", "openai/gpt-oss-20b", "google/gemma-3-1b-it", "openai-community/gpt2"]


@pytest.mark.parametrize("model", MODELS)
@pytest.mark.parametrize("dtype,bytes_per", [("bf16", 2), ("fp32", 4)])
def test_float_weights_are_params_times_bytes(model, dtype, bytes_per):
    spec = load_spec(model)
    tree = weights_tree(spec, fmt=WeightFormat(dtype=dtype), tp=1)
    assert tree.value == count_params(spec).total_params * bytes_per
    assert check_sums(tree) == []


def test_float_weights_equal_real_tiny_model_parameter_bytes():
    """transformers builds the model in bf16 except DeepSeek-V3's and Nemotron-H's router weights, which it keeps
    in float32; our convention keeps routers at bf16, so those differ by 2 bytes per router parameter."""
    torch = pytest.importorskip("torch")
    from transformers import AutoConfig, AutoModelForCausalLM

    from trainmath.families import spec_from_config

    from .test_cache_oracle import tiny_config

    for mt in ("qwen3_next", "deepseek_v3", "nemotron_h"):
        cfg = tiny_config(mt)
        data = dict(cfg)
        with torch.device("meta"):
            model = AutoModelForCausalLM.from_config(AutoConfig.for_model(data.pop("model_type"), **data),
                                                     dtype=torch.bfloat16)
        real = sum(p.numel() * p.element_size() for p in model.parameters())
        fp32 = {n: p.numel() for n, p in model.named_parameters() if p.dtype == torch.float32}
        assert all(n.endswith("gate.weight") for n in fp32), fp32
        real -= 2 * sum(fp32.values())
        assert weights_tree(spec_from_config(cfg, name=mt, source="t"), fmt=WeightFormat(), tp=1).value == real


def test_quantised_linear_pinned():
    # int4, group 128, fp16 scales: 4096x4096 -> 8 MiB of nibbles + 4096*32 scales of 2 bytes
    assert quantised_weight_bytes(4096, 4096, WeightFormat(dtype="int4")) == (8_388_608, 262_144)
    # with packed 4-bit zero points: + 4096*32/2 bytes
    assert quantised_weight_bytes(4096, 4096, WeightFormat(dtype="int4", zero_point=True)) == (8_388_608, 327_680)
    # int8 per output row, fp32 scales
    assert quantised_weight_bytes(11008, 4096, WeightFormat(dtype="int8")) == (45_088_768, 44_032)
    # fp8 128x128 blocks: DeepSeek-V3 q_b_proj (24576, 1536) has weight_scale_inv (192, 12) in float32
    assert scale_count(24576, 1536, WeightFormat(dtype="fp8")) == 192 * 12
    assert quantised_weight_bytes(24576, 1536, WeightFormat(dtype="fp8")) == (37_748_736, 192 * 12 * 4)
    # a ragged edge rounds the groups up: kv_a_proj_with_mqa (576, 7168) -> scales (5, 56)
    assert scale_count(576, 7168, WeightFormat(dtype="fp8")) == 5 * 56


def test_int4_keeps_embeddings_head_and_router_at_bf16():
    spec = load_spec("Qwen/Qwen3-30B-A3B")
    bf16 = weights_tree(spec, fmt=WeightFormat(), tp=1).flat()
    int4 = weights_tree(spec, fmt=WeightFormat(dtype="int4"), tp=1)
    for kept in ("embed_tokens", "lm_head", "router", "norms"):
        assert int4.child(kept).value == bf16[kept]
    experts = int4.child("experts")
    assert experts.child("data").value * 4 == bf16["experts"]  # 4 bits vs 16
    # expert_intermediate 768, hidden 2048: per expert gate/up (768, 2048) and down (2048, 768), 128 experts x 48 layers
    scales = 48 * 128 * (2 * 768 * (2048 // 128) + 2048 * (768 // 128)) * 2
    assert experts.child("scales").value == scales


@settings(max_examples=25, deadline=None)
@given(model=st.sampled_from(["Qwen/Qwen3-8B", "meta-llama/Llama-3.1-70B", "mistralai/Mixtral-8x7B-v0.1",
                              "deepseek-ai/DeepSeek-V2-Lite"]),
       tp=st.sampled_from([1, 2, 4, 8]), dtype=st.sampled_from(["bf16", "int8"]))
def test_tp_shards_add_up_to_the_whole_plus_replicated(model, tp, dtype):
    """tp x (rank bytes) = whole + (tp - 1) x replicated tensors, when tp divides every split (int8 per-row scales
    split with their rows)."""
    from trainmath.infer.weights import tensor_rank_bytes
    from trainmath.placement import tp_axis

    spec = load_spec(model)
    fmt = WeightFormat(dtype=dtype)
    whole = weights_tree(spec, fmt=fmt, tp=1).value
    per_rank = weights_tree(spec, fmt=fmt, tp=tp).value
    replicated = 0
    for t in spec.pre + spec.post:
        if not t.tied and tp_axis(t) is None:
            replicated += sum(tensor_rank_bytes(t, None, fmt, 1))
    for layer, idx in spec.layer_groups():
        for b in layer.blocks:
            for t in b.tensors:
                row_scales = dtype == "int8" and t.shard == "row" and t.kind == "linear"
                if tp_axis(t) is None:
                    replicated += sum(tensor_rank_bytes(t, b, fmt, 1)) * len(idx)
                elif row_scales and t.component not in ("lm_head", "embed_tokens", "router"):
                    replicated += tensor_rank_bytes(t, b, fmt, 1)[1] * len(idx)  # per-row scales of a row split
    assert tp * per_rank == whole + (tp - 1) * replicated


def test_kv_heads_fewer_than_tp_are_replicated():
    spec = load_spec("meta-llama/Llama-3.1-70B")  # 64 heads, 8 KV heads, head_dim 128, hidden 8192, 80 layers
    attn16 = weights_tree(spec, fmt=WeightFormat(), tp=16).child("attention").value
    # per rank: q 4 heads, k and v 1 head each (replicated twice), o 4 heads; 2 bytes each
    assert attn16 == 80 * 2 * 8192 * 128 * (4 + 1 + 1 + 4)


@pytest.mark.parametrize("model,tp,needle", [
    ("meta-llama/Llama-3.1-8B", 3, "num_attention_heads (32)"),
    ("Qwen/Qwen3-14B", 5, "num_key_value_heads (8)"),
    ("nvidia/Nemotron-H-56B-Base-8K", 16, "n_groups (8)"),
])
def test_tp_that_does_not_divide_names_the_values(model, tp, needle):
    with pytest.raises(TrainmathError, match=r"tensor parallel size %d must divide .*" % tp) as e:
        validate_tp(load_spec(model), tp)
    assert needle in str(e.value)
