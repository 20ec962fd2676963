"""LoRA with DeepSpeed ZeRO-Offload (``--peft lora --offload optimizer``): only the trainable (adapter) parameters
move to the host, against DeepSpeed's own estimator given the trainable count and torch.optim's real states of
a small peft model.

DeepSpeed's estimators count 16 bytes per parameter on the host with ZeRO-Offload (fp32 master 4 + fp32
gradients 4 + Adam's two states 8) times ``additional_buffer_factor`` (1.5); given a model whole
(``estimate_zero2_model_states_mem_needs_all_live``, ``model_to_params``) they count every parameter, frozen or
not, while the engine offloads only the optimizer's parameters (``stage_1_and_2.py``: ``bit16_groups`` keeps
``is_optimized_parameter``, the requires_grad ones), so a fine-tune is given the trainable count.
"""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
from deepspeed.runtime.zero.stage_1_and_2 import estimate_zero2_model_states_mem_needs

from trainmath.adapters import PeftJob
from trainmath.cli import main
from trainmath.layout import ParallelLayout
from trainmath.memory import host as hm
from trainmath.memory.peft import PeftRun
from trainmath.memory.training import TrainingSetup, training_memory
from trainmath.params import count_params
from trainmath.sources import load_spec

LLAMA = "meta-llama/Llama-3.1-8B"
TRAINABLE = 41_943_040
"""Llama-3.1-8B, r=16 all-linear: peft's get_nb_trainable_parameters (``test_peft_cli``)."""
SHARED = ("master_weights_bytes", "fp32_gradients_bytes", "optimizer_states_bytes")
ARGS = ("memory", LLAMA, "--micro-batch", "1", "--seq", "4096", "--precision", "bf16", "--peft", "lora",
        "--lora-rank", "16", "--lora-targets", "all-linear", "--zero", "2", "--json")


def _json(capsys, *argv):
    code = main([*ARGS, *argv])
    out = capsys.readouterr()
    assert code == 0, out.err
    return json.loads(out.out)


@pytest.fixture(scope="module")
def llama():
    return load_spec(LLAMA)


def _setup(optimizer="adamw", micro_batches=None, dtype="fp32"):
    run = PeftRun(job=PeftJob(method="lora", rank=16, targets="all-linear", dtype=dtype))
    return TrainingSetup(micro_batch=1, seq=4096, precision="bf16", optimizer=optimizer, offload="optimizer",
                         micro_batches=micro_batches, peft=run)


@pytest.mark.parametrize("gpus", [1, 2, 4])
def test_host_equals_deepspeed_estimator_on_the_trainable_count(llama, gpus):
    """ZeRO-2 + offload_optimizer on one node: DeepSpeed's trainable · 16 · 1.5 (4 GPUs or fewer), and ours,
    master + fp32 gradients + Adam states over the node, is trainable · 16."""
    h = hm.job_host_memory(llama, _setup(), ParallelLayout(dp=gpus, zero=2))
    ours = h.ranks_per_node * sum(h.per_rank.child(t).value for t in SHARED)
    cpu_mem, _ = estimate_zero2_model_states_mem_needs(TRAINABLE, num_gpus_per_node=gpus, cpu_offload=True)
    assert ours == 16 * TRAINABLE and ours * 3 // 2 == cpu_mem
    # the whole model handed to DeepSpeed's estimator: every frozen parameter counted, ~190x the adapters' figure
    whole, _ = estimate_zero2_model_states_mem_needs(count_params(llama).total_params + TRAINABLE,
                                                     num_gpus_per_node=gpus, cpu_offload=True)
    assert whole > 190 * cpu_mem


def test_every_host_term_pinned(llama):
    """One rank of 8: S = trainable / 8; the bit16 copy and the staging buffer in the adapters' dtype (fp32 by
    default, bf16 as DeepSpeed's bf16 config casts them); the staging buffer holds the largest adapter, down_proj's
    lora_A (16 x 14336); gradient accumulation adds the accumulated gradients."""
    s = TRAINABLE // 8
    h = hm.job_host_memory(llama, _setup(), ParallelLayout(dp=8, zero=2))
    assert h.per_rank.flat() == {"master_weights_bytes": 4 * s, "fp32_gradients_bytes": 4 * s,
                                 "optimizer_states_bytes": 8 * s, "bit16_params_bytes": 4 * s,
                                 "bit16_gradients_bytes": 0, "grad_staging_bytes": 4 * 16 * 14336,
                                 "grad_accumulation_bytes": 0, "optimizer_step_temporaries_bytes": 0}
    assert h.host_bytes == 8 * h.per_rank.value
    bf16 = hm.job_host_memory(llama, _setup(micro_batches=4, dtype="bf16"), ParallelLayout(dp=8, zero=2))
    assert bf16.per_rank.child("bit16_params_bytes").value == 2 * s
    assert bf16.per_rank.child("grad_accumulation_bytes").value == 2 * s
    assert bf16.per_rank.child("grad_staging_bytes").value == 2 * 16 * 14336


def test_gpu_timeline_loses_the_adapters_states(capsys):
    """The same job without and with --offload optimizer: every event holds the adapters' two fp32 Adam states
    (8 · trainable) less, the optimizer step also its foreach temporaries (one fp32 tensor per adapter)."""
    on, off = _json(capsys), _json(capsys, "--offload", "optimizer")
    assert on["breakdown"]["optimizer_states_bytes"] == 8 * TRAINABLE
    assert off["breakdown"]["optimizer_states_bytes"] == 0
    diff = {a["event"]: a["bytes"] - b["bytes"] for a, b in zip(on["timeline"], off["timeline"], strict=True)}
    assert diff.pop("optimizer step") == 12 * TRAINABLE
    assert set(diff.values()) == {8 * TRAINABLE}
    assert off["host_bytes"] == hm.job_host_memory(load_spec(LLAMA), _setup(), ParallelLayout(zero=2)).host_bytes
    assert "host_bytes" not in on


def test_verdict_checks_the_host(capsys):
    d = _json(capsys, "--offload", "optimizer", "--recompute", "full", "--gpu", "4090", "--host-memory", "512MiB")
    assert d["gpu_fits"] and not d["host_fits"] and not d["fits"]
    assert d["host_margin_bytes"] == 512 * 2**20 - d["host_bytes"]


def test_offload_lever_of_a_fine_tune_is_built(capsys):
    """A fine-tune that does not fit lists --offload optimizer as a built lever (before, it could not be built)."""
    d = _json(capsys, "--gpu", "4090")
    levers = {lv["lever"]: lv for lv in d["levers"]}
    assert levers["--offload optimizer"]["peak_bytes"] is not None


@pytest.mark.parametrize("argv,needle", [
    (("--offload", "params", "--zero", "3", "--dp", "8"), "ZeRO-Infinity"),
    (("--offload", "optimizer", "--zero", "3", "--dp", "8"), "CPUOffloadPolicy"),
    (("--offload", "optimizer", "--zero", "2", "--dp", "8", "--zero-impl", "fsdp2"), "CPUOffloadPolicy"),
    (("--offload", "optimizer", "--optimizer", "adamw8bit", "--paged-optimizer"), "no device states"),
])
def test_bad_input_one_line(capsys, argv, needle):
    code = main(["memory", LLAMA, "--micro-batch", "1", "--seq", "512", "--peft", "lora", *argv])
    out = capsys.readouterr()
    assert code == 2 and out.out == ""
    assert out.err.count("\n") == 1 and out.err.startswith("trainmath: error:") and needle in out.err


# ---- torch.optim's real states on a small peft model ----

@pytest.mark.parametrize(("optimizer", "torch_name"), [("adamw", "AdamW"), ("sgd-momentum", "SGD")])
def test_host_terms_equal_torch_optim_on_a_peft_model(optimizer, torch_name):
    """A 2-layer Llama in bf16 through transformers and peft (r=4, all-linear; fp32 adapters): the host holds
    an fp32 copy of each trainable parameter, its fp32 gradient, and the states torch.optim allocates for them
    after one real step; the frozen base has no gradient and no state."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    peft = pytest.importorskip("peft")
    from trainmath.families import spec_from_config

    cfg = transformers.LlamaConfig(hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
                                   num_key_value_heads=2, vocab_size=128, max_position_embeddings=64)
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(cfg).to(torch.bfloat16)
    model = peft.get_peft_model(model, peft.LoraConfig(r=4, lora_alpha=8, target_modules="all-linear"))
    trainable = [p for p in model.parameters() if p.requires_grad]
    opt = getattr(torch.optim, torch_name)(trainable, lr=1e-3, **({"momentum": 0.9} if torch_name == "SGD" else {}))
    ids = torch.randint(0, 128, (2, 16))
    model(input_ids=ids, labels=ids).loss.backward()
    opt.step()
    states = sum(v.nbytes for s in opt.state.values() for k, v in s.items() if torch.is_tensor(v) and k != "step")
    assert all(p.grad is None for p in model.parameters() if not p.requires_grad)

    spec = spec_from_config(cfg.to_dict(), name="tiny", source="test")
    run = PeftRun(job=PeftJob(method="lora", rank=4, targets="all-linear"))
    setup = TrainingSetup(micro_batch=2, seq=16, precision="bf16", optimizer=optimizer, offload="optimizer",
                          device="cpu", peft=run)
    h = hm.job_host_memory(spec, setup, ParallelLayout()).per_rank.flat()
    n = sum(p.numel() for p in trainable)
    assert h["master_weights_bytes"] == sum(p.detach().float().nbytes for p in trainable) == 4 * n
    assert h["fp32_gradients_bytes"] == sum(p.grad.float().nbytes for p in trainable)
    assert h["optimizer_states_bytes"] == states  # AdamW: exp_avg + exp_avg_sq; SGD: momentum_buffer
    assert h["bit16_params_bytes"] == sum(p.nbytes for p in trainable)  # the adapters' own dtype (fp32)
    assert h["grad_staging_bytes"] == max(p.nbytes for p in trainable)
    gpu = training_memory(spec, setup, ParallelLayout()).breakdown.flat()
    assert gpu["optimizer_states_bytes"] == gpu["master_weights_bytes"] == 0


# ---- estimate: the offloaded fine-tune's step ----

def _estimate(capsys, *argv):
    code = main(["estimate", LLAMA, "--gpu", "h100", "--gpus", "1", "--micro-batch", "1", "--seq", "4096",
                 "--global-batch", "8", "--precision", "bf16", "--peft", "lora", "--lora-rank", "16",
                 "--lora-targets", "all-linear", "--zero", "2", "--json", *argv])
    out = capsys.readouterr()
    assert code == 0, out.err
    return json.loads(out.out)


def test_estimate_times_the_adapters_offload(capsys, llama):
    """The CPU step and the PCIe copies run over the trainable parameters only (fp32 adapters: 4 bytes each, 8
    micro-batches each copying its gradients under ZeRO-2); the GPU optimizer step is gone; the host RAM is
    the memory command's for the same 8 micro-batches (their accumulated gradients included)."""
    on, off = _estimate(capsys), _estimate(capsys, "--offload", "optimizer")
    assert on["breakdown"]["optimizer_step"] > 0 and "offload" not in on
    o = off["offload"]
    assert off["breakdown"]["optimizer_step"] == 0 and off["breakdown"]["cpu_optimizer_step"] > 0
    assert o["shard_params"] == TRAINABLE
    assert o["grad_d2h_bytes"] == 4 * TRAINABLE * 8 and o["update_h2d_bytes"] == 4 * TRAINABLE
    assert o["host_bytes"] == hm.job_host_memory(llama, _setup(micro_batches=8), ParallelLayout(zero=2)).host_bytes
    assert o["host_bytes"] == TRAINABLE * (16 + 4 + 4) + 4 * 16 * 14336  # + bit16 copy + accumulation + staging


@pytest.mark.parametrize("argv,needle", [
    (("--offload", "params", "--zero", "3", "--gpus", "8"), "ZeRO-Infinity"),
    (("--offload", "optimizer", "--zero", "3", "--gpus", "8"), "CPUOffloadPolicy"),
])
def test_estimate_bad_input_one_line(capsys, argv, needle):
    code = main(["estimate", LLAMA, "--gpu", "h100", "--micro-batch", "1", "--seq", "4096", "--global-batch", "8",
                 "--peft", "lora", "--precision", "bf16", *argv])
    out = capsys.readouterr()
    assert code == 2 and out.out == ""
    assert out.err.count("\n") == 1 and needle in out.err


def test_plan_with_offload_prices_the_host(capsys, llama):
    """plan --peft lora --offload optimizer: ZeRO-3 layouts rejected with the reason; each layout found carries
    the host RAM of its adapters' partition (8 ranks per node, the adapters over dp = 8)."""
    assert main(["plan", LLAMA, "--gpus", "8", "--gpu", "h100", "--seq", "2048", "--global-batch", "16", "--peft",
                 "lora", "--lora-rank", "16", "--lora-targets", "all-linear", "--offload", "optimizer", "--json",
                 "--top", "2"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert any("CPUOffloadPolicy" in r for r in doc["rejected"])
    for d in doc["layouts"]:
        assert d["zero"] in (1, 2) and d["dp"] == 8
        setup = _setup(micro_batches=16 // (8 * d["micro_batch"]))
        assert d["offload"]["host_bytes"] == hm.job_host_memory(llama, setup, ParallelLayout(dp=8, zero=d["zero"])
                                                                ).host_bytes


def test_report_page_states_the_adapters_host_ram(llama):
    """``report``'s gather: the fine-tune with --offload optimizer carries the adapters' host RAM."""
    from trainmath.report.gather import gather

    setup = TrainingSetup(micro_batch=1, seq=4096, precision="bf16", offload="optimizer")
    job = PeftJob(method="lora", rank=16, targets="all-linear")
    data = gather(llama, setup, ParallelLayout(zero=2), peft=job)
    assert data.host.host_bytes == hm.job_host_memory(llama, _setup(), ParallelLayout(zero=2)).host_bytes
    assert data.memory.peak_bytes < training_memory(llama, replace(_setup(), offload="none"),
                                                    ParallelLayout(zero=2)).peak_bytes
