"""How many GPUs (``plan --deadline`` / ``--budget`` / ``--gpus auto``): each answer checked against plans run
at the answer and at the candidate count just below (or above) it."""

import json

import pytest

from trainmath.cli import main
from trainmath.hardware import gpu
from trainmath.perf import Job
from trainmath.perf.step import _flops_per_sequence
from trainmath.plan import plan
from trainmath.plan.sizing import candidate_counts, lower_bound_gpus, parse_duration, size
from trainmath.sources import load_spec

SPEC = load_spec("Qwen/Qwen3-8B")
H100 = gpu("h100")
JOB = Job(global_batch=256, seq=4096)
TOKENS = 100 * 10**9


def _best(n):
    r = plan(SPEC, gpus=n, gpu=H100, job=JOB, top=1)
    return r.layouts[0].budget(TOKENS, 2.0) if r.layouts else None


def test_lower_bound_is_the_dense_peak_rounded_to_a_node():
    deadline = 2 * 86400
    n = lower_bound_gpus(SPEC, JOB, H100, TOKENS, deadline)
    flops = _flops_per_sequence(SPEC, JOB.seq, "half", "none") * TOKENS / JOB.seq
    peak = H100.peak_flops_per_s("bf16")
    assert n % 8 == 0 and n * peak * deadline >= flops > (n - 8) * peak * deadline


def test_candidate_counts_are_node_multiples_the_degrees_can_make():
    counts = candidate_counts(SPEC, JOB, 8, 8)
    # 24 = dp 8 · pp 3 (36 layers); 40 and 56 need a factor 5 or 7, which no divisor of the 36 layers, the
    # 4096 tokens (cp: powers of 2), the node (tp) or the global batch 256 (dp) has
    assert counts[:6] == [8, 16, 24, 32, 48, 64]
    assert all(n % 8 == 0 for n in counts) and 4096 in counts and 40 not in counts and 56 not in counts


def test_deadline_answer_is_the_fewest():
    deadline = 3 * 86400
    s = size(SPEC, gpu=H100, job=JOB, tokens=TOKENS, deadline_s=deadline)
    assert s.gpus is not None and s.result.layouts
    assert _best(s.gpus)["time_s"] <= deadline
    counts = candidate_counts(SPEC, JOB, 8, s.search_from)
    below = [n for n in counts if n < s.gpus]
    if below:  # the candidate just below misses the deadline (or fits nothing)
        b = _best(below[-1])
        assert b is None or b["time_s"] > deadline


def test_budget_answer_is_the_fastest_within_it():
    budget = 60_000.0
    s = size(SPEC, gpu=H100, job=JOB, tokens=TOKENS, budget=budget, price_per_gpu_hour=2.0)
    assert s.gpus is not None
    assert _best(s.gpus)["cost"] <= budget
    above = [n for n in candidate_counts(SPEC, JOB, 8, 8) if n > s.gpus]
    b = _best(above[0])
    assert b is None or b["cost"] > budget


def test_cli_json_and_unreachable_goal(capsys):
    assert main(["plan", "Qwen/Qwen3-8B", "--gpu", "h100", "--seq", "4096", "--global-batch", "256", "--tokens",
                 "100B", "--deadline", "3d", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["sizing"]["gpus"] == out["layouts"][0]["gpus"] and out["layouts"][0]["fits"]
    # one hour for 15T tokens is beyond the 131,072 GPUs searched
    assert main(["plan", "Qwen/Qwen3-8B", "--gpu", "h100", "--seq", "4096", "--global-batch", "256", "--tokens",
                 "15T", "--deadline", "1h"]) == 1
    assert "no GPU count up to 131,072 meets the goal" in capsys.readouterr().out


@pytest.mark.parametrize("flags,message", [
    (["--tokens", "1T", "--deadline", "0"], "--deadline must be a positive duration"),
    (["--tokens", "1T", "--deadline=-3d"], "--deadline must be a positive duration"),
    (["--tokens", "1T", "--deadline", "nan"], "--deadline must be a positive duration"),
    (["--tokens", "1T", "--deadline", "inf"], "--deadline must be a positive duration"),
    (["--tokens", "1T", "--gpus", "auto"], "--gpus auto needs --deadline"),
    (["--deadline", "30d"], "need --tokens"),
    (["--tokens", "1T", "--budget", "100"], "--budget needs --price-per-gpu-hour"),
    (["--tokens", "1T", "--budget", "nan", "--price-per-gpu-hour", "2"], "argument --budget: must be a finite number"),
    (["--tokens", "1T", "--budget", "0", "--price-per-gpu-hour", "2"], "--budget must be a positive finite"),
    (["--tokens", "1T", "--deadline", "30d", "--gpus", "64"], "pass --gpus auto"),
    ([], "--gpus is required"),
])
def test_bad_sizing_input_is_one_line(flags, message, capsys):
    argv = ["plan", "Qwen/Qwen3-8B", "--gpu", "h100", "--seq", "4096", "--global-batch", "256", *flags]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("trainmath: error:") and message in err[0]


def test_parse_duration():
    assert parse_duration("30d") == 30 * 86400 and parse_duration("12h") == 43200 and parse_duration("90m") == 5400
    assert parse_duration("2w") == 14 * 86400 and parse_duration("3600") == 3600
