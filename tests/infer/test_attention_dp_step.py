"""The routed experts as their own kernel class, and the busiest replica under attention data parallelism.

Oracles: routed-expert FLOPs per token from the configs by hand (2 · k · 3 · hidden · moe_intermediate per MoE
layer); a prompt under attention DP 8 keeps its non-expert FLOPs on one rank while its routed-expert FLOPs spread
over the 8; an even batch gives the even split; the step time adds the classes' maxima (a pinned example)."""

from __future__ import annotations

import pytest

from trainmath.hardware import gpu
from trainmath.infer import InferenceSetup, WeightFormat
from trainmath.infer.speed import FLOOR, Part, Step, busiest_rank_flops, new_token_flops, routed_flops_per_token, step
from trainmath.sources import load_spec

DSV3_ROUTED = 2 * 8 * 3 * 7168 * 2048 * 58  # top-8 of 256 experts, hidden 7168, moe_intermediate 2048, 58 MoE layers
MIXTRAL_ROUTED = 2 * 2 * 3 * 4096 * 14336 * 32  # top-2 of 8, hidden 4096, intermediate 14336, 32 layers


@pytest.fixture(scope="module")
def dsv3():
    return load_spec("deepseek-ai/DeepSeek-V3")


def _dp(batch: int) -> InferenceSetup:
    return InferenceSetup(batch=batch, context=2048, tp=1, ep=8, gpus=8, weights=WeightFormat(dtype="fp8"))


@pytest.mark.parametrize(("model", "expected"), [("deepseek-ai/DeepSeek-V3", DSV3_ROUTED),
                                                 ("mistralai/Mixtral-8x7B-v0.1", MIXTRAL_ROUTED),
                                                 ("meta-llama/Llama-3.1-8B", 0)])
def test_routed_flops_per_token(model, expected):
    assert routed_flops_per_token(load_spec(model)) == expected


def test_one_prompt_stays_on_its_replica(dsv3):
    """One 1024-token prompt under attention DP 8: the rank holding it runs all of its attention, dense and
    shared-expert FLOPs; only the routed experts' 1024 · DSV3_ROUTED FLOPs are split 8 ways."""
    p = Part(n=1, t=1024, c=0)
    total = new_token_flops(dsv3, p)
    flops, _, expert = busiest_rank_flops(dsv3, _dp(1), (p,))
    assert expert == 1024 * DSV3_ROUTED / 8
    assert flops == pytest.approx(total - 1024 * DSV3_ROUTED + 1024 * DSV3_ROUTED / 8, rel=1e-12)
    assert flops > 4 * total / 8  # 0.52 of the prompt on one rank, not the even split (1/8)


def test_an_even_batch_is_the_even_split(dsv3):
    """128 decoding sequences on 8 replicas: 16 each, every FLOP divided by the 8 ranks."""
    p = Part(n=128, t=1, c=2000)
    flops, _, expert = busiest_rank_flops(dsv3, _dp(128), (p,))
    assert flops == pytest.approx(new_token_flops(dsv3, p) / 8, rel=1e-12)
    assert expert == 128 * DSV3_ROUTED / 8


def test_tensor_parallel_splits_everything():
    spec = load_spec("mistralai/Mixtral-8x7B-v0.1")
    setup = InferenceSetup(batch=1, context=256, tp=2, weights=WeightFormat(dtype="fp8"))
    p = Part(n=1, t=128, c=0)
    flops, _, expert = busiest_rank_flops(spec, setup, (p,))
    assert flops == pytest.approx(new_token_flops(spec, p) / 2, rel=1e-12)
    assert expert == 128 * MIXTRAL_ROUTED / 2


def test_step_adds_the_maxima_of_each_kernel_class():
    """Other GEMMs compute-bound (9 > 1), experts memory-bound (9 > 1): 9 + 9, where one max over all GEMMs
    (10 against 10) would overlap them; + attention max(0, 0) + communication 1 + overhead 0.5."""
    s = Step(flops=0, bytes=0, weight_bytes=0, cache_bytes=0, comm_bytes=0, compute_s=10.0, memory_s=10.0,
             comm_s=1.0, overhead_s=0.5, expert_compute_s=1.0, expert_memory_s=9.0)
    assert s.time_s == 9.0 + 9.0 + 1.0 + 0.5


def test_dense_model_has_no_expert_class():
    spec = load_spec("meta-llama/Llama-3.1-8B")
    s = step(spec, InferenceSetup(batch=4, context=600), gpu("h100"), (Part(n=4, t=1, c=512),), FLOOR)
    assert s.expert_compute_s == 0 and s.expert_memory_s == 0


def test_a_prefilling_replica_slows_the_deepseek_step(dsv3):
    """The steady state's step of 1024 decodes with one 512-token prompt beside them, attention DP 8 on H200 at
    efficiency 1: the prompt's own projections (compute-bound on its rank) now add to the routed experts'
    weight streaming instead of hiding under it."""
    parts = (Part(n=1024, t=1, c=2048), Part(n=1, t=512, c=0))
    s = step(dsv3, _dp(1024), gpu("h200"), parts, FLOOR)
    other_compute = s.compute_s - s.attention_compute_s - s.expert_compute_s
    other_memory = s.memory_s - s.cache_memory_s - s.expert_memory_s
    assert other_compute > other_memory  # the prompt's replica is compute-bound in its own GEMMs
    assert s.expert_memory_s > s.expert_compute_s  # the experts stream their weights
    assert s.time_s > max(s.compute_s - s.attention_compute_s, s.memory_s - s.cache_memory_s) + s.comm_s
