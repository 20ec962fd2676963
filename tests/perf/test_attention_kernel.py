"""Flash kernels (trainmath.perf.attention): each kernel's share of peak, its effect on the step, its fit."""

import pathlib
import sys

import pytest

from trainmath.hardware import presets
from trainmath.layout import ParallelLayout
from trainmath.perf import Job, attention, estimate
from trainmath.perf.job import job_problems
from trainmath.sources import load_spec

ROOT = pathlib.Path(__file__).resolve().parents[2]
HW = presets()
LLAMA8B = load_spec("meta-llama/Llama-3.1-8B")


def test_each_kernel_reads_its_own_table_and_falls_back_to_the_native_share():
    hopper, ampere = HW.generations["hopper"], HW.generations["ampere"]
    assert attention.fraction(hopper, "native") == hopper.attention_peak_fraction
    assert attention.fraction(hopper, "fa2") == attention.FA2_PEAK_FRACTION["hopper"]
    assert attention.fraction(hopper, "te") == attention.TE_PEAK_FRACTION["hopper"]
    # FlashAttention-2 is Ampere's own kernel: no separate share there
    assert attention.fraction(ampere, "fa2") == ampere.attention_peak_fraction
    assert attention.kernel_efficiency(ampere, "fa2") is ampere
    # on Hopper the kernel not written for it is the slowest (Shah et al. 2024: FA2 at 35% of H100)
    assert attention.fraction(hopper, "fa2") < attention.fraction(hopper, "te")


@pytest.mark.parametrize("seq", [8192, 65536])
def test_the_attention_seconds_scale_as_one_over_the_kernel_share(seq):
    lay = ParallelLayout(dp=8, zero=1)
    gpu = HW.gpu("h100")
    steps = {k: estimate(LLAMA8B, lay, Job(global_batch=8, seq=seq, flash_kernel=k), gpu, memory=False)
             for k in attention.KERNELS}
    eff = HW.generations["hopper"]
    attn = {k: eff.attention_peak_fraction / attention.fraction(eff, k) for k in attention.KERNELS}
    # everything but attention is the same, so step(k) − step(native) = attention_native · (ratio − 1)
    base = steps["native"].step_time_s
    a_native = (steps["fa2"].step_time_s - base) / (attn["fa2"] - 1)
    assert steps["te"].step_time_s - base == pytest.approx(a_native * (attn["te"] - 1), rel=1e-6)
    assert 0 < a_native < base
    assert any("flash kernel fa2" in c for c in steps["fa2"].conventions)


def test_an_unknown_kernel_is_one_problem_naming_the_choices():
    bad = job_problems(LLAMA8B, ParallelLayout(dp=8), Job(global_batch=8, seq=4096, flash_kernel="fa4"))
    assert bad == ["flash kernel must be one of native, te, fa2, got 'fa4'"]
    assert job_problems(LLAMA8B, ParallelLayout(dp=8), Job(global_batch=8, seq=4096, attention="eager",
                                                           flash_kernel="fa4")) == []


def test_the_shares_in_the_code_are_the_fit_scripts_answer():
    sys.path.insert(0, str(ROOT / "benchmarks"))
    sys.path.insert(0, str(ROOT / "tests" / "perf"))
    import attention_fit

    rows = attention_fit.rows()
    shares = attention_fit.fitted(rows)
    assert shares == {("hopper", "fa2"): attention.FA2_PEAK_FRACTION["hopper"],
                      ("hopper", "te"): attention.TE_PEAK_FRACTION["hopper"]}
    # the FlashAttention-2 share generalises across its two sources: fitted on either, the other within 7%
    for src in ("llm-foundry-benchmarks", "torchtitan-perf"):
        held = [r for r in rows if r["source"] == src]
        left = attention_fit.fitted(rows, src)[("hopper", "fa2")]
        errs = sorted(abs(r["speeds"][left] - 1) for r in held)
        assert errs[len(errs) // 2] <= 0.07



def test_cli_flash_kernel_prices_the_kernel_and_refuses_an_unknown_one():
    import json
    import subprocess

    def step(kernel: str) -> float:
        out = subprocess.run([sys.executable, "-m", "trainmath", "estimate", "meta-llama/Llama-3.1-8B", "--gpus", "8",
                              "--gpu", "h100", "--seq", "32768", "--global-batch", "8", "--flash-kernel", kernel,
                              "--json"], capture_output=True, text=True, check=True)
        return json.loads(out.stdout)["step_time_s"]

    lay, gpu = ParallelLayout(dp=8, zero=1), HW.gpu("h100")
    for k in ("native", "fa2"):
        api = estimate(LLAMA8B, lay, Job(global_batch=8, seq=32768, flash_kernel=k), gpu)
        assert step(k) == pytest.approx(api.step_time_s, rel=1e-9)
    bad = subprocess.run([sys.executable, "-m", "trainmath", "estimate", "meta-llama/Llama-3.1-8B", "--gpus", "8",
                          "--gpu", "h100", "--seq", "4096", "--global-batch", "8", "--flash-kernel", "fa4"],
                         capture_output=True, text=True)
    assert bad.returncode == 2 and bad.stdout == ""
    assert bad.stderr.startswith("trainmath: error:") and "Traceback" not in bad.stderr
