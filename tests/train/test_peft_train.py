"""``trainmath train/verify --peft``: LoRA and QLoRA through peft on gloo ranks (DDP, ZeroRedundancyOptimizer,
FSDP2). Oracles: peft's own counts on each rank, torch's tensors (gradients and optimizer states exist for the
adapters only, sized as torch.optim allocates them), the loss of one process, and the uninterrupted run."""

import pytest

from tests.train.runs import cached, losses, run
from trainmath.adapters import PeftJob
from trainmath.runtime.train.model import model_spec, shrunk_config
from trainmath.verify.peft import compare_peft, predict_peft
from trainmath.verify.train import predict

LORA = PeftJob(method="lora", rank=4, targets=("q_proj", "v_proj"))
ALL = PeftJob(method="lora", rank=4, targets="all-linear")
QLORA = PeftJob(method="qlora", rank=4, targets="all-linear")
RUNS = [("ddp", LORA), ("zero1", ALL), ("zero2", ALL), ("zero3", LORA), ("zero3", ALL), ("ddp", QLORA),
        ("zero1", QLORA)]


def _fields(results, **kw):
    from tests.train.runs import config

    cfg = config(measure=True, **kw)
    name, conf = shrunk_config(cfg.model, cfg.overrides)
    spec = model_spec(name, conf)
    by_rank = dict(enumerate(results[0]["measured_by_rank"]))
    return compare_peft(predict_peft(spec, cfg, len(by_rank), predict(spec, cfg, len(by_rank))), by_rank, cfg), by_rank


@pytest.mark.parametrize("strategy,job", RUNS, ids=[f"{s}-{j.method}-{j.targets}" for s, j in RUNS])
def test_verify_fields_exact(strategy, job):
    fields, by_rank = _fields(cached(2, strategy=strategy, peft=job), strategy=strategy, peft=job)
    bad = [(f.name, f.predicted, f.measured) for f in fields if not f.ok]
    assert not bad
    names = {f.name.split(" (")[0] for f in fields}
    assert {"trainable_params", "adapter_params", "optimizer_states_bytes", "gradients_bytes"} <= names
    assert ("quant_state_bytes" in names) == (job.method == "qlora")


@pytest.mark.parametrize("strategy,job", [("ddp", LORA), ("ddp", QLORA)])
def test_only_the_adapters_get_gradients_and_states(strategy, job):
    """Independent of the calculator: peft's trainable count × 4 bytes (fp32 adapters) is every gradient, and
    AdamW's exp_avg and exp_avg_sq are two such tensors; the frozen base has neither."""
    results = cached(2, strategy=strategy, peft=job)
    for m in results[0]["measured_by_rank"]:
        assert m["trainable_params"] == m["adapter_params"] > 0
        assert m["gradients_bytes"] == m["weights_bytes"] == 4 * m["trainable_params"]
        assert m["optimizer_states_bytes"] == 2 * 4 * m["trainable_params"]
        assert m["frozen_weights_bytes"] > m["weights_bytes"]


@pytest.mark.parametrize("job", [LORA, ALL])
def test_ddp_and_fsdp2_give_the_loss_of_one_process(job):
    one = losses(run(1, peft=job))
    for strategy in ("ddp", "zero3"):
        got = losses(run(2, strategy=strategy, peft=job))
        assert got == pytest.approx(one, rel=1e-5, abs=1e-6)
    assert one[-1] != one[0]  # the adapters train


@pytest.mark.parametrize("strategy,job", [("ddp", LORA), ("zero3", ALL), ("ddp", QLORA)])
def test_resume_is_bitwise(tmp_path, strategy, job):
    full = losses(run(2, strategy=strategy, peft=job))
    d = str(tmp_path / "ck")
    assert losses(run(2, strategy=strategy, peft=job, checkpoint_dir=d, stop_after=2)) == full[:2]
    assert losses(run(2, strategy=strategy, peft=job, checkpoint_dir=d, resume=True)) == full[2:]


def test_fsdp2_resumes_on_one_rank_from_two(tmp_path):
    d = str(tmp_path / "ck")
    full = losses(run(1, strategy="zero3", peft=ALL))
    run(2, strategy="zero3", peft=ALL, checkpoint_dir=d, stop_after=2)
    assert losses(run(1, strategy="zero3", peft=ALL, checkpoint_dir=d, resume=True)) == pytest.approx(
        full[2:], rel=1e-5)


def test_resume_refuses_another_job(tmp_path):
    from trainmath.errors import TrainmathError

    d = str(tmp_path / "ck")
    run(2, peft=LORA, checkpoint_dir=d, stop_after=2)
    with pytest.raises(TrainmathError, match="fine-tuning job"):
        run(2, peft=ALL, checkpoint_dir=d, resume=True)


FAMILIES = [
    # GPT-2: fused c_attn and the MLP are Conv1D modules, which peft wraps as Linear ones (all-linear)
    ("ddp", {"model": "openai-community/gpt2", "overrides": {"layers": 2, "hidden": 32, "heads": 4, "vocab": 67}},
     ALL),
    # Mixtral: attention adapters beside frozen routed experts, under FSDP2
    ("zero3", {"model": "mistralai/Mixtral-8x7B-v0.1", "overrides": {"layers": 2, "hidden": 32, "intermediate": 16,
                                                                    "heads": 4, "kv_heads": 2, "vocab": 67,
                                                                    "experts": 4}, "steps": 2},
     PeftJob(method="lora", rank=4, targets=("q_proj", "k_proj", "v_proj", "o_proj"))),
]


@pytest.mark.parametrize("strategy,model,job", FAMILIES, ids=["gpt2-conv1d", "mixtral-attention"])
def test_other_families_verify_exactly(strategy, model, job):
    results = run(2, strategy=strategy, peft=job, measure=True, **model)
    fields, _ = _fields(results, strategy=strategy, peft=job, **model)
    assert fields and not [(f.name, f.predicted, f.measured) for f in fields if not f.ok]
