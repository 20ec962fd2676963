"""DeepSeek-V3's decode step, term by term against hand-derived figures: the MLA latent cache read and written,
the absorbed-form attention FLOPs, the routed experts a step touches, and the attention-data-parallel layout
(tp 1 over 8 GPUs: 8 attention replicas, EP 8) against attention TP 8 (the latent replicated on every rank).

Config (deepseek-ai/DeepSeek-V3 config.json): 61 layers (3 dense, 58 MoE), 128 heads, kv_lora_rank d_c = 512,
qk_rope_head_dim d_R = 64, 256 routed experts of moe_intermediate_size 2048 on hidden 7168, 8 per token."""

from __future__ import annotations

import pytest

from trainmath.hardware import gpu
from trainmath.infer import InferenceSetup, WeightFormat
from trainmath.infer.speed import FLOOR, Part, attention_flops, step, touched_fraction
from trainmath.sources import load_spec

LAYERS, MOE_LAYERS, HEADS, D_C, D_R = 61, 58, 128, 512, 64
EXPERT_BF16_BYTES = 3 * 7168 * 2048 * 2  # gate, up, down of one routed expert, bf16


@pytest.fixture(scope="module")
def spec():
    return load_spec("deepseek-ai/DeepSeek-V3")


def _dp(batch: int) -> InferenceSetup:
    return InferenceSetup(batch=batch, context=1001, tp=1, ep=8, gpus=8, weights=WeightFormat(dtype="bf16"))


def test_latent_cache_read_and_written_per_attention_replica(spec):
    """8 sequences over 8 replicas: one per rank reads 1000 tokens of latent + rotary key and writes one, bf16."""
    s = step(spec, _dp(8), gpu("h200"), (Part(n=8, t=1, c=1000),), FLOOR)
    assert s.cache_bytes == (1000 + 1) * (D_C + D_R) * 2 * LAYERS == 70_342_272


def test_attention_tp_replicates_the_latent(spec):
    """Attention TP 8 instead: every rank holds all 8 sequences' latent (it has no head axis to split)."""
    tp8 = InferenceSetup(batch=8, context=1001, tp=8, ep=8, gpus=8, weights=WeightFormat(dtype="bf16"))
    s = step(spec, tp8, gpu("h200"), (Part(n=8, t=1, c=1000),), FLOOR)
    assert s.cache_bytes == 8 * 70_342_272


def test_absorbed_attention_flops(spec):
    """Per decode token and layer over c + 1 = 1001 positions: scores against the latent and rotary key,
    2·h·1001·(d_c + d_R), and values of d_c, 2·h·1001·d_c (DeepSeek-V2 §2.1.2, the absorbed form)."""
    per_token = 2 * HEADS * 1001 * (D_C + D_R + D_C) * LAYERS
    assert attention_flops(spec, Part(n=8, t=1, c=1000)) == 8 * per_token == 136_057_585_664


@pytest.mark.parametrize(("few", "many"), [(1, 8), (8, 64), (64, 1024)])
def test_routed_experts_touched(spec, few, many):
    """Each rank holds 32 of the 256 experts in 58 MoE layers; a step of T tokens reads the share
    1 − (1 − 8/256)^T of them (the dense weights do not change with T)."""
    h = gpu("h200")
    a = step(spec, _dp(few), h, (Part(n=few, t=1, c=1000),), FLOOR).weight_bytes
    b = step(spec, _dp(many), h, (Part(n=many, t=1, c=1000),), FLOOR).weight_bytes
    experts_per_rank = 32 * MOE_LAYERS * EXPERT_BF16_BYTES
    share = (1 - (1 - 8 / 256) ** many) - (1 - (1 - 8 / 256) ** few)
    assert b - a == pytest.approx(experts_per_rank * share, rel=1e-9)
    assert touched_fraction(256, 8, 1) == pytest.approx(8 / 256)
