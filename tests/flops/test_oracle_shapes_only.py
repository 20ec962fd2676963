"""Configs whose saved bytes the hf profile does not model still count their FLOPs from their op lists (emitted
for shapes only, ``Ctx.shapes_only``): forward and forward + backward equal FlopCounterMode on transformers' code,
with no note of a fallback, while ``trainmath memory``'s fold still refuses them in one line."""

import pytest

from trainmath.errors import TrainmathError
from trainmath.families import spec_from_config
from trainmath.flops import count_flops
from trainmath.memory.activations import activation_bytes

from .oracle import build_model, measured_flops, tiny_config

MLA_EQUAL = ("deepseek-ai/DeepSeek-V3", dict(
    n_routed_experts=4, num_experts_per_tok=2, moe_intermediate_size=32, n_shared_experts=1, first_k_dense_replace=1,
    n_group=1, topk_group=1, kv_lora_rank=16, q_lora_rank=None, qk_rope_head_dim=8, qk_nope_head_dim=16,
    v_head_dim=24, num_key_value_heads=4))
FALCON_BIAS = ("tiiuae/falcon-7b", dict(num_kv_heads=1, ffn_hidden_size=None, bias=True))
NEMOTRON_LATENT = ("nvidia/Nemotron-H-56B-Base-8K", dict(
    hybrid_override_pattern="M*E", num_hidden_layers=3, mamba_num_heads=4, mamba_head_dim=8, n_groups=2,
    ssm_state_size=8, head_dim=16, chunk_size=64, n_routed_experts=4, num_experts_per_tok=2,
    moe_intermediate_size=32, moe_shared_expert_intermediate_size=48, moe_latent_size=24, n_group=1, topk_group=1))

CASES = {"mla-equal-head-dims": (MLA_EQUAL, "equal q/k and v head dims"),
         "falcon-biases": (FALCON_BIAS, "Falcon with bias=True"),
         "nemotron_h-latent-moe": (NEMOTRON_LATENT, "moe_latent_size")}


@pytest.mark.parametrize("case", sorted(CASES))
def test_flops_of_configs_whose_saved_bytes_are_not_modelled(case):
    (repo, overrides), refusal = CASES[case]
    cfg = tiny_config(repo, **overrides)
    spec = spec_from_config(cfg, name=case, source=case)
    with pytest.raises(TrainmathError, match=refusal):
        activation_bytes(spec, micro_batch=2, seq=7)
    report = count_flops(spec, batch=2, seq=7)
    assert not [n for n in report.notes if "spec" in n]
    fwd, fwd_bwd = measured_flops(build_model(cfg), batch=2, seq=7)
    assert report.forward.value == fwd
    if case.startswith("nemotron"):  # FlopCounterMode counts a depthwise conv's backward (C + 1)× its forward
        conv = [(g.flops, g.count, len(lt.layers)) for lt in report.layer_types for g in lt.gemms
                if g.name.endswith("conv1d")]
        assert conv
        assert report.forward.value + report.backward.value + sum(f * (c - 1) * n for f, c, n in conv) == fwd_bwd
    else:
        assert report.forward.value + report.backward.value == fwd_bwd
