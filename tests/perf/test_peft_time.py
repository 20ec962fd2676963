"""The fine-tune's step time (``perf.peft``): its FLOPs are ``flops --peft``'s (which tests/flops/test_peft_flops.py
checks against FlopCounterMode on peft models), its decomposition sums to them and to the step, and the orderings
that must hold do: the frozen base's GEMMs cost 2/3 of full training's, LoRA is faster than full training on the
same layout, QLoRA slower than LoRA by exactly its dequantisation."""

import json

import pytest

from trainmath.adapters import PeftJob, adapter_report
from trainmath.cli import main
from trainmath.flops import count_flops
from trainmath.flops.peft import peft_flops
from trainmath.hardware import presets
from trainmath.layout import ParallelLayout
from trainmath.memory.peft import PeftRun
from trainmath.perf import Job, estimate
from trainmath.perf.compute import gemm_time_s
from trainmath.perf.peft import CLASSES, MEMORY_CLASSES
from trainmath.qlora import nf4_storage
from trainmath.sources import load_spec

HW = presets()
GPU = HW.gpu("h100")
SPEC = load_spec("meta-llama/Llama-3.1-8B")
SEQ, G = 2048, 16


def _job(method="lora", targets="all-linear", rank=16, recompute="none", mb=1, input_grads=None, **kw):
    run = PeftRun(job=PeftJob(method=method, rank=rank, targets=targets), input_grads=input_grads)
    return Job(global_batch=G, seq=SEQ, micro_batch=mb, precision="bf16", profile="hf", recompute=recompute,
               peft=run, **kw)


def _est(job, dp=1, zero=0, spec=SPEC):
    return estimate(spec, ParallelLayout(dp=dp, zero=zero, world_size=dp), job, GPU, hardware=HW, memory=False)


CASES = [("lora", "all-linear", "none", None), ("qlora", "all-linear", "full", None),
         ("lora", ("q_proj", "v_proj"), "none", None), ("lora", ("down_proj",), "full", False)]


@pytest.mark.parametrize("method,targets,recompute,ig", CASES)
def test_step_flops_are_flops_peft_and_the_decomposition_sums_to_them(method, targets, recompute, ig):
    job = _job(method, targets, recompute=recompute, mb=2, input_grads=ig)
    e = _est(job, dp=2, zero=1)
    grads = job.peft.input_grad(recompute)
    want = peft_flops(SPEC, job.peft.job, batch=G, seq=SEQ, causal=e.peft["flops_causal"], recompute=recompute,
                      input_grads=grads)
    assert e.peft["executed_flops"] == want.report.training.value
    compute = e.peft["compute"]
    assert set(compute) == set(CLASSES + MEMORY_CLASSES)
    assert sum(v["flops"] for v in compute.values()) * 2 == want.report.training.value  # per GPU × dp
    assert all(compute[c]["flops"] == 0 for c in MEMORY_CLASSES)
    assert sum(v["seconds"] for v in compute.values()) == pytest.approx(
        sum(e.breakdown[k] for k in ("forward", "backward", "recompute", "qlora_dequant")), rel=1e-12)
    assert sum(e.breakdown.values()) == pytest.approx(e.step_time_s, rel=1e-12)
    # MFU's numerator: the fine-tune's forward + backward as flops --peft counts them, attention per mfu_causal
    mfu = peft_flops(SPEC, job.peft.job, batch=G, seq=SEQ, causal=job.mfu_causal, input_grads=grads).report
    assert e.model_flops == mfu.forward.value + mfu.backward.value
    # dequantisation is per micro-batch (each reads every weight), not per token: M micro-batches of flops --peft's
    one = peft_flops(SPEC, job.peft.job, batch=2, seq=SEQ, recompute=recompute, input_grads=grads)
    assert e.peft["dequant_elements"] == e.micro_batches * one.dequant_elements
    assert (e.peft["dequant_elements"] > 0) == (method == "qlora")


def test_model_flops_equal_the_flops_command(capsys):
    """The CLI: estimate --peft's model FLOPs per step == flops --peft's per step for the global batch."""
    peft = ["--peft", "lora", "--lora-rank", "16", "--lora-targets", "all-linear"]
    assert main(["estimate", "meta-llama/Llama-3.1-8B", "--gpus", "2", "--gpu", "h100", "--seq", str(SEQ),
                 "--global-batch", str(G), "--precision", "bf16", "--json", *peft]) == 0
    est = json.loads(capsys.readouterr().out)
    assert main(["flops", "meta-llama/Llama-3.1-8B", "--batch", str(G), "--seq", str(SEQ), "--json", *peft]) == 0
    flops = json.loads(capsys.readouterr().out)
    assert est["model_flops"] == flops["training"]["per_step"]
    assert est["peft"]["trainable_params"] == flops["peft"]["trainable_params"]


def test_frozen_base_gemms_cost_two_thirds_of_full_trainings():
    """With every input needing a gradient, the frozen linears run fprop + dgrad: the full ledger's decoder GEMMs
    (count_flops, an independent path) priced once each way, 2/3 of full training's fprop + dgrad + wgrad."""
    e = _est(_job(input_grads=True))
    ledger = count_flops(SPEC, batch=1, seq=SEQ)
    fwd = sum(gemm_time_s(g.m, g.k, g.n, g.count, g.flops, GPU, HW.efficiency(GPU)) * len(lt.layers)
              for lt in ledger.layer_types for g in lt.gemms if g.component != "attention_core")
    M = e.micro_batches
    c = e.peft["compute"]
    assert c["base_fprop"]["seconds"] == pytest.approx(M * fwd, rel=1e-9)
    assert c["base_dgrad"]["seconds"] == pytest.approx(M * fwd, rel=1e-9)
    assert (c["base_fprop"]["seconds"] + c["base_dgrad"]["seconds"]) / (3 * M * fwd) == pytest.approx(2 / 3)
    # q_proj,v_proj without enable_input_require_grads: layer 0 runs no dgrad before its first adapter
    few = _est(_job(targets=("q_proj", "v_proj"), input_grads=False)).peft["compute"]
    assert few["base_dgrad"]["seconds"] < few["base_fprop"]["seconds"]


@pytest.mark.parametrize("recompute", ["none", "full"])
@pytest.mark.parametrize("dp,zero", [(1, 0), (8, 2)])
def test_lora_step_is_faster_than_full_training(recompute, dp, zero):
    lora = _est(_job(recompute=recompute), dp, zero)
    full = estimate(SPEC, ParallelLayout(dp=dp, zero=zero, world_size=dp),
                    Job(global_batch=G, seq=SEQ, precision="bf16", profile="hf", recompute=recompute), GPU,
                    hardware=HW, memory=False)
    assert lora.step_time_s < full.step_time_s
    assert lora.breakdown["backward"] < 0.75 * full.breakdown["backward"]
    assert lora.breakdown["optimizer_step"] < full.breakdown["optimizer_step"] / 50
    if dp > 1:
        sync = [c for c in lora.comm if c.name == "dp_grad_sync"]
        trainable = adapter_report(SPEC, lora.job.peft.job, 0).trainable_params
        assert sync and all(c.size_bytes == trainable * 4 for c in sync)  # fp32 adapters' gradients only


@pytest.mark.parametrize("recompute", ["none", "full"])
def test_qlora_is_slower_than_lora_by_its_dequantisation(recompute):
    lora, qlora = _est(_job("lora", recompute=recompute)), _est(_job("qlora", recompute=recompute))
    dq = qlora.breakdown["qlora_dequant"]
    assert dq > 0 and lora.breakdown["qlora_dequant"] == 0
    assert qlora.step_time_s - lora.step_time_s == pytest.approx(dq, rel=1e-9)
    # the bytes: each use reads the NF4 storage (~0.516 bytes per element) and writes bf16 (2)
    eff = HW.efficiency(GPU)
    per_element = nf4_storage(4096 * 4096)["total"] / (4096 * 4096) + 2
    elements = qlora.peft["dequant_elements"]
    assert dq == pytest.approx(elements * per_element / (GPU.hbm_bytes_per_s * eff.hbm_fraction), rel=0.01)


def test_adapters_run_at_small_gemm_efficiency():
    """r = 16 GEMMs reach far less of the peak than the base's: TFLOP/s of the adapters' forward < 1/4 of the
    frozen base's."""
    c = _est(_job()).peft["compute"]
    rate = {k: c[k]["flops"] / c[k]["seconds"] for k in ("base_fprop", "adapter_forward")}
    assert rate["adapter_forward"] < rate["base_fprop"] / 4


def test_mfu_convention_is_printed(capsys):
    assert main(["estimate", "meta-llama/Llama-3.1-8B", "--gpus", "1", "--gpu", "h100", "--seq", "2048",
                 "--global-batch", "4", "--peft", "qlora", "--precision", "bf16"]) == 0
    out = capsys.readouterr().out
    assert "MFU counts the fine-tune's executed FLOPs" in out and "compute by op class" in out
    assert "qlora_dequant" in out and "QLoRA dequantises" in out


BAD = [(["--peft", "lora", "--tp", "2"], "not with tp/pp/cp/ep > 1"),
       (["--peft", "qlora", "--precision", "bf16", "--zero", "3"], "Params4bit"),
       (["--peft", "lora", "--recompute", "selective"], "not selective"),
       (["--peft", "lora", "--profile", "megatron"], "pass --profile hf"),
       (["--peft", "lora", "--offload", "params", "--zero", "3"], "--offload params is not modelled"),
       (["--peft", "lora", "--precision", "fp8"], "fp8"),
       (["--peft", "qlora"], "pass --precision bf16"),
       (["--lora-rank", "8"], "needs --peft lora"),
       (["--peft", "lora", "--lora-targets", "c_attn"], "no such Linear module"),
       (["--peft", "lora", "--lora-rank", "0"], "the rank must be a positive integer")]


@pytest.mark.parametrize("flags,needle", BAD, ids=[" ".join(b[0]) for b in BAD])
def test_estimate_refuses_in_one_line(flags, needle, capsys):
    argv = ["estimate", "meta-llama/Llama-3.1-8B", "--gpus", "8", "--gpu", "h100", "--seq", "2048",
            "--global-batch", "16", *flags]
    capsys.readouterr()
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("trainmath: error: ") and needle in err[0]


def test_plan_searches_only_what_the_fine_tune_models(capsys):
    argv = ["plan", "meta-llama/Llama-3.1-8B", "--gpus", "8", "--gpu", "h100", "--seq", "2048", "--global-batch",
            "16", "--peft", "lora", "--lora-rank", "16", "--lora-targets", "all-linear", "--json", "--top", "3"]
    assert main(argv) == 0
    doc = json.loads(capsys.readouterr().out)
    lays = doc["layouts"]
    assert len(lays) == 3 and all(d["tp"] == d["pp"] == d["cp"] == 1 for d in lays)
    assert [d["step_time_s"] for d in lays] == sorted(d["step_time_s"] for d in lays)
    assert any("tp/pp/cp/ep" in r for r in doc["rejected"]) and not any("not modelled" in r for r in doc["rejected"])
    best = lays[0]
    assert main(["estimate", "meta-llama/Llama-3.1-8B", "--gpus", "8", "--gpu", "h100", "--seq", "2048",
                 "--global-batch", "16", "--peft", "lora", "--lora-rank", "16", "--lora-targets", "all-linear",
                 "--zero", str(best["zero"]), "--micro-batch", str(best["micro_batch"]), "--recompute",
                 best["recompute"], "--json"]) == 0
    est = json.loads(capsys.readouterr().out)
    assert est["step_time_s"] == pytest.approx(best["step_time_s"], rel=1e-12)
    assert est["peak_bytes"] == best["peak_bytes"] and est["fits"]


@pytest.mark.parametrize("flags,needle", [(["--offload", "auto"], "--offload auto is not searched with --peft"),
                                          (["--fit-profiles", "megatron"], "hf profile only")])
def test_plan_refuses_in_one_line(flags, needle, capsys):
    argv = ["plan", "meta-llama/Llama-3.1-8B", "--gpus", "8", "--gpu", "h100", "--seq", "2048", "--global-batch",
            "16", "--peft", "lora", *flags]
    capsys.readouterr()
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and needle in err[0]


def test_eager_attention_prices_the_executed_products_and_their_scores():
    """Eager attention: every s² product executed (the FLOPs of flops --peft causal=executed) and the score
    tensors' HBM traffic, so slower than flash; the decomposition still sums to the step's FLOPs."""
    flash, eager = _est(_job(recompute="full")), _est(_job(recompute="full", attention="eager"))
    assert eager.peft["flops_causal"] == "executed" and flash.peft["flops_causal"] == "half"
    want = peft_flops(SPEC, eager.job.peft.job, batch=G, seq=SEQ, causal="executed", recompute="full",
                      input_grads=True)
    assert sum(v["flops"] for v in eager.peft["compute"].values()) == want.report.training.value
    assert eager.peft["compute"]["attention_forward"]["seconds"] > flash.peft["compute"]["attention_forward"]["seconds"]
    assert eager.model_flops == flash.model_flops  # MFU's convention (mfu_causal) does not follow the kernel
