"""The published runs' stated layouts through the memory model: the fit verdict (they all ran) and the predicted
peak against the memory the sources report (torchtitan's Memory(GiB): torch.cuda max reserved; FlagPerf's mem
column: device memory used), ``python benchmarks/plan_oracles.py --memory``, docs/benchmarks.md.

The fit count is a floor of what the model reaches today, not the target (every layout judged to fit): each
layout still judged not to fit must have its reason on record (``published_more.MEMORY_MISSES``)."""

import math
import statistics

from published_more import RUNS, memory_check, memory_miss_reason

from trainmath.errors import TrainmathError

REPORTED = [r for r in RUNS if "published_memory_gib" in r]


def test_runs_that_report_memory_say_what_it_counts():
    assert len(REPORTED) == 26
    assert {r["paper"] for r in REPORTED} == {"torchtitan-perf", "flagperf"}
    for r in REPORTED:
        assert 0 < r["published_memory_gib"] <= r.get("gpu_memory_gib", 80), r["id"]
        assert "GiB" in r["memory_convention"]
        assert "GiB" in r["memory_convention_reads"] and "reserve" in r["memory_convention_reads"], r["id"]


def _judged():
    out = []
    for r in RUNS:
        try:
            out.append((r, memory_check(r)))
        except TrainmathError:  # the one layout the model refuses (docs/benchmarks.md, "not priced")
            continue
    return out


def test_stated_layouts_judged_to_fit_and_every_miss_explained():
    judged = _judged()
    assert len(judged) == 230
    fit = sum(v["fits"] for _, v in judged)
    assert fit == 229  # of 230; every one ran, so each "does not fit" is a memory-model miss
    for r, v in judged:
        # a layout the model says does not fit is over the fit rule's usable bytes, and one that fits is under them
        assert v["fits"] == (v["peak_gib"] <= v["usable_gib"])
        if not v["fits"]:
            assert memory_miss_reason(r["id"]), r["id"]  # what the model lacks, on record
    # the sources with no miss left: MaxText (save_qkv_proj), torchtitan (hf profile), the Megatron dense rows, NeMo's
    # Blackwell page (its 70B FSDP row: NeMo's perf scripts' fused loss and FP8 parameters)
    fitting = {r["paper"] for r, v in judged} - {r["paper"] for r, v in judged if not v["fits"]}
    assert {"maxtext-dgxc", "torchtitan-perf", "flagperf", "internlm-train-performance", "llm-foundry-benchmarks",
            "dgxc-benchmarking", "nemo-perf-24.07", "megatron-moe-modelzoo", "nemo-perf-blackwell"} <= fitting


def test_predicted_peak_is_under_the_reported_memory():
    """Both sources report more than the allocator's allocated peak (torchtitan: max reserved; FlagPerf: device
    memory used, CUDA context included), so the predicted max-allocated peak must not exceed them; every row is
    within 0.68-0.98 of it, torchtitan's within 0.80-0.96 (its 405B pipeline rows with FSDP2 on each stage:
    ``memory/fsdp2_pipeline.py``)."""
    ratios = {r["id"]: memory_check(r)["peak_gib"] / r["published_memory_gib"] for r in REPORTED}
    assert all(x <= 1.0 for x in ratios.values()), ratios
    logs = [abs(math.log(x)) for x in ratios.values()]
    assert statistics.median(logs) <= 0.20
    assert all(0.65 <= x <= 1.0 for x in ratios.values()), ratios
    titan = [x for k, x in ratios.items() if k.startswith("torchtitan-")]
    assert len(titan) == 18 and all(0.80 <= x <= 1.0 for x in titan), titan
    flagperf_70b = [x for k, x in ratios.items() if k.startswith("flagperf-h800")]
    assert all(0.9 <= x <= 1.0 for x in flagperf_70b)  # Megatron TP/PP rows: within 10% under what the GPU showed


def test_every_recorded_recipe_switch_names_its_source():
    """A memory switch on a run's job (the fit depends on it) is named in its assumptions as ``job.<field>``, beside
    a stored file's commit: a switch without its source is an invented one."""
    import re

    switches = ("fp8_param_gather", "offload_layers", "cross_entropy_fusion", "recompute_modules", "recompute_saves")
    recorded = 0
    for r in RUNS:
        for field in switches:
            if r["job"].get(field):
                recorded += 1
                assert f"job.{field}" in r["assumptions"], (r["id"], field)
                assert re.search(r"@?[0-9a-f]{40}", r["assumptions"]), r["id"]
    assert recorded == 156  # switches on record (published_runs_more.json)


def test_fsdp2_pipeline_stage_holds_its_units_unsharded_and_fp32_gradients():
    """torchtitan's 405B pipeline rows (FSDP 8 on each of 8 stages): torchtitan does not reshard after forward
    under PP and the pipeline stage runs every micro-batch's backward without gradient sync, so FSDP2 keeps each
    unit's gradients unsharded, upcast to the fp32 reduce dtype (memory/fsdp2_pipeline.py). At the first stage's
    peak the rank holds its stage's unsharded bf16 parameters and twice their bytes in fp32 gradients; without
    the mechanism the peak was 22.9 GiB of the 82.5 reported (0.28)."""
    from published_more import job_fields, spec

    from trainmath.layout import ParallelLayout
    from trainmath.memory.training import TrainingSetup, training_memory
    from trainmath.perf.job import Job
    from trainmath.perf.step import memory_recompute

    run = next(r for r in RUNS if r["id"] == "torchtitan-h100-405b-table5-1f1b")
    job = Job(**job_fields(run), uneven_stages=True)
    lay = ParallelLayout(**run["layout"])
    assert job.micro_batch == 4  # torchtitan's default: as many micro-batches as stages (8), of the local batch 32
    setup = TrainingSetup(micro_batch=job.micro_batch, seq=job.seq, precision=job.precision, optimizer=job.optimizer,
                          recompute=memory_recompute(job), profile=job.profile,
                          micro_batches=job.global_batch // (job.micro_batch * lay.dp))
    first = training_memory(spec(run["id"]), setup, lay).stages[0]
    terms = {c.name: c.value for c in first.breakdown.children}
    # 16 layers of 405B's 3.19e9 parameters over tp 8, and the embedding's vocabulary shard: 6.6e9 per rank
    assert 12.0 * 2**30 < terms["zero3_gather_bytes"] < 12.8 * 2**30  # bf16, unsharded
    assert abs(terms["gradients_bytes"] - 2 * terms["zero3_gather_bytes"]) < 0.01 * terms["gradients_bytes"]  # fp32
    assert 0.80 <= memory_check(run)["peak_gib"] / run["published_memory_gib"] <= 1.0
