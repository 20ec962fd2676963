"""The published runs of ``published_runs_more.json``: each sourced, loadable, on a preset GPU, with a layout that
multiplies to its GPU count and a batch that its micro-batch, gradient accumulation and dp reproduce.

These runs check the step-time model (``python benchmarks/plan_oracles.py --more`` prints the errors); no tolerance
is asserted on them here, because the model does not yet price FP8 GEMMs, MoE dispatch or FSDP overlap.
"""

import re

import pytest
from published_more import DATA, RUNS, gpus, spec, try_predict

from trainmath.hardware import presets
from trainmath.layout import ParallelLayout
from trainmath.params import count_params
from trainmath.perf import Job

METRICS = ("tokens_per_s_per_gpu", "step_time_s", "tflops_per_gpu", "hardware_tflops_per_gpu")
LOCATION = re.compile(r"@[0-9a-f]{40}\b|^https://")  # a repository file at a commit, or a page's address


def test_enough_runs_and_sources():
    assert len(RUNS) >= 100
    assert len({r["id"] for r in RUNS}) == len(RUNS)
    papers = {r["paper"] for r in RUNS}
    assert papers == set(DATA["sources"]), "every source is listed in 'sources' and used"
    assert len(papers) >= 8


def test_at_least_eight_independent_publishers():
    """Several documents of one publisher (NVIDIA's NeMo, Megatron-Bridge and DGX Cloud pages) count once."""
    publishers = DATA["publishers"]
    assert set(publishers) == set(DATA["sources"])
    assert len(set(publishers.values())) >= 8
    priced = {publishers[r["paper"]] for r in RUNS if try_predict(r)[0] is not None}
    assert len(priced) >= 8, "each publisher has at least one run the model prices"


def test_rows_left_out_say_why_and_are_not_in_runs():
    """Transcribed rows on a GPU without a preset are kept in 'not_priced' with their reason, not dropped."""
    names = {g.name for g in presets().gpus}
    ids = {r["id"] for r in RUNS}
    for r in DATA["not_priced"]:
        assert r["paper"] in DATA["sources"] and r["reason"] and r["published"] > 0
        assert LOCATION.search(r["location"]), r["location"]
        assert r["gpu"] not in names and r["id"] not in ids


def test_coverage_of_what_the_model_must_learn():
    assert {r["precision"] for r in RUNS} == {"bf16", "fp8"}
    assert any(r["moe"] for r in RUNS) and any(not r["moe"] for r in RUNS)
    assert sum(bool(r.get("fsdp")) for r in RUNS) >= 20
    assert {r["gpu"] for r in RUNS} >= {"H100-SXM-80GB", "B200-180GB", "GB200"}


def test_about_documents_every_field():
    fields = set().union(*(r.keys() for r in RUNS))
    for name in fields - {"id", "paper", "source", "gpu", "catalog", "model", "layout", "job", "metric",
                          "published", "assumptions"}:
        assert f"'{name}'" in DATA["_about"], name


@pytest.mark.parametrize("run", RUNS, ids=[r["id"] for r in RUNS])
def test_run_is_sourced_and_well_formed(run):
    assert run["source"] and run["convention"] and run["assumptions"]
    assert LOCATION.search(run["location"]), run["location"]
    assert run["gpu"] in {g.name for g in presets().gpus}
    assert ("catalog" in run) != ("model" in run)
    assert run["metric"] in METRICS and run["published"] > 0
    assert run["precision"] in ("bf16", "fp8") and run["job"]["precision"] == (
        "fp8" if run["precision"] == "fp8" else "mixed-bf16")
    layout = ParallelLayout(**run["layout"])
    job = Job(**run["job"])
    assert layout.ranks == gpus(run)
    params = count_params(spec(run["id"]))
    assert run["moe"] == (params.activated_params < params.total_params)
    if run.get("fsdp"):
        assert layout.zero in (2, 3)
    dp = layout.dp
    if "grad_accum" in run and "inconsistent" not in run:
        assert job.global_batch == job.micro_batch * run["grad_accum"] * dp, "GBS = MBS x GA x dp"
    else:
        assert job.global_batch % (job.micro_batch * dp) == 0


@pytest.mark.parametrize("run", [r for r in RUNS if "published_params" in r], ids=lambda r: r["id"])
def test_inline_configs_reproduce_the_published_parameter_count(run):
    """LLM Foundry prints each benchmark model's NumParams: the GPT-2-shaped config must count the same to 0.5%."""
    assert count_params(spec(run["id"])).total_params == pytest.approx(run["published_params"], rel=0.005)


def test_only_flagged_rows_contradict_themselves():
    flagged = [r["id"] for r in RUNS if "inconsistent" in r]
    assert flagged == ["megatron-bridge-26.02-h100-qwen3-30b-a3b-fp8-cs-16gpus",
                       "megatron-bridge-25.11-h100-gpt-oss-120b-bf16-64gpus"]
    r = RUNS[[x["id"] for x in RUNS].index(flagged[1])]
    assert r["job"]["global_batch"] != r["job"]["micro_batch"] * r["grad_accum"] * r["layout"]["dp"]
    # the other: its TFLOP/s over its tokens/s is twice the FLOPs per token of the same model's other rows
    per_token = {x["id"]: x["published_tflops"] * 1e12 / x["published"] for x in RUNS
                 if x.get("catalog") == "Qwen/Qwen3-30B-A3B" and "published_tflops" in x}
    suspect = per_token.pop(flagged[0])
    assert all(suspect / v == pytest.approx(2, rel=0.02) for v in per_token.values())
    assert [x["id"] for x in RUNS if x.get("throughput_suspect")] == flagged[:1]


def test_throughput_and_step_time_agree_where_both_are_published():
    """DGX Cloud Benchmarking prints both: tokens/s = seq x GBS / step time (to its rounding of the step time)."""
    for r in RUNS:
        if "published_tokens_per_s" in r and r["metric"] == "step_time_s":
            derived = r["job"]["seq"] * r["job"]["global_batch"] / r["published"]
            assert derived == pytest.approx(r["published_tokens_per_s"], rel=0.01), r["id"]


def test_llm_foundry_mfu_matches_its_stated_formula():
    """The README's MFU: (6N + 12·L·d·s) per token x tokens/s/GPU over 989 TFLOP/s (H100 BF16 dense)."""
    for r in RUNS:
        if r["paper"] != "llm-foundry-benchmarks":
            continue
        m, s = r["model"], r["job"]["seq"]
        flops = 6 * r["published_params"] + 12 * m["n_layer"] * m["n_embd"] * s
        mfu = 100 * flops * r["published"] / 989e12
        assert mfu == pytest.approx(r["published_mfu"], rel=0.02), r["id"]


def test_the_current_model_prices_most_runs():
    priced = [r for r in RUNS if try_predict(r)[0] is not None]
    assert len(priced) >= 0.9 * len(RUNS)
