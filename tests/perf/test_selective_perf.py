"""``--recompute selective`` in the step-time model: the hf profile times torchtitan's op-level policy (the GEMMs
``count_flops(recompute="selective")`` counts, flagged per GEMM in ``LayerGemms.selective``), the megatron profile
Korthikanti et al.'s attention core; HFU counts each profile's own; the planner's memory lower bound stays sound."""

import pytest

from trainmath.flops import count_flops
from trainmath.hardware import gpu
from trainmath.layout import ParallelLayout
from trainmath.memory.training import TrainingSetup, training_memory
from trainmath.perf.job import Job
from trainmath.perf.step import estimate
from trainmath.plan.bounds import memory_lower_bound
from trainmath.sources import load_spec

H100 = gpu("h100")


@pytest.mark.parametrize("model", ["Qwen/Qwen3-8B", "microsoft/Phi-3.5-mini-instruct", "Qwen/Qwen3-30B-A3B",
                                   "deepseek-ai/DeepSeek-V2-Lite", "Qwen/Qwen3-Next-80B-A3B-Thinking"])
def test_selective_flags_are_the_recompute_count(model):
    spec = load_spec(model)
    r = count_flops(spec, batch=1, seq=2048, recompute="selective")
    flagged = sum(len(lt.layers) * sum(g.flops for g, run in zip(lt.gemms, lt.selective) if run)
                  for lt in r.layer_types)
    assert flagged == r.recomputed.value > 0
    assert all(len(lt.selective) == len(lt.gemms) for lt in r.layer_types)


def _est(spec, recompute, profile, **kw):
    job = Job(micro_batch=1, seq=4096, global_batch=64, recompute=recompute, profile=profile)
    return estimate(spec, ParallelLayout(dp=8, zero=1, **kw), job, H100, memory=False)


def test_hf_selective_step_time_and_hfu():
    spec = load_spec("Qwen/Qwen3-8B")
    e = {(r, p): _est(spec, r, p) for r in ("none", "selective", "full") for p in ("megatron", "hf")}
    assert e["none", "hf"].step_time_s == e["none", "megatron"].step_time_s
    # op-level SAC recomputes k, o, up and every memory-bound op: more than the attention core, less than a layer
    assert e["selective", "megatron"].step_time_s < e["selective", "hf"].step_time_s < e["full", "hf"].step_time_s
    seqs = 64
    rec = count_flops(spec, batch=1, seq=4096, recompute="selective")
    assert e["selective", "hf"].hardware_flops == rec.training_flops * seqs
    plain = count_flops(spec, batch=1, seq=4096)
    assert e["selective", "megatron"].hardware_flops == (plain.training_flops
                                                         + plain.forward.flat()["attention_core"]) * seqs


@pytest.mark.parametrize("tp", [1, 2])
def test_memory_lower_bound_sound_for_hf_selective(tp):
    spec = load_spec("Qwen/Qwen3-8B")
    layout = ParallelLayout(dp=8 // tp, tp=tp, zero=1)
    job = Job(micro_batch=2, seq=4096, global_batch=64, recompute="selective", profile="hf")
    setup = TrainingSetup(micro_batch=2, seq=4096, precision=job.precision, recompute="selective", profile="hf",
                          micro_batches=job.micro_batches(layout.dp))
    assert memory_lower_bound(spec, layout, job) <= training_memory(spec, setup, layout).peak_bytes
