"""Oracle: a LoRA fine-tune of a MoE model (attention targets; the routed experts and the router frozen) against
MemTracker / FSDPMemTracker of peft on transformers' real code (``verify.peft_sim``, ``verify.peft_fsdp``), small
CPU models with real tensors, experts on transformers 5's default ``grouped_mm`` path: exact at the loss. Expert
and router targets (peft's ``target_parameters``) are refused in one line."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
pytest.importorskip("peft")

from trainmath.adapters import PeftJob  # noqa: E402
from trainmath.errors import TrainmathError  # noqa: E402
from trainmath.families import spec_from_config  # noqa: E402
from trainmath.layout import ParallelLayout  # noqa: E402
from trainmath.memory.peft import PeftRun  # noqa: E402
from trainmath.memory.training import TrainingSetup, training_memory  # noqa: E402

MOE = dict(vocab_size=1024, hidden_size=64, intermediate_size=96, moe_intermediate_size=48, num_hidden_layers=2,
           num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256, head_dim=16, num_experts=4,
           num_local_experts=4, num_experts_per_tok=2)
B, S = 2, 64
TARGETS = ("q_proj", "v_proj")


def _predict(cfg, precision, layout, targets=TARGETS):
    spec = spec_from_config(cfg.to_dict(), name="tiny", source="test")
    setup = TrainingSetup(micro_batch=B, seq=S, precision=precision, device="cpu", loop_keeps="loss",
                          optimizer_impl="forloop" if layout.zero == 3 else "foreach",
                          peft=PeftRun(job=PeftJob(method="lora", rank=4, targets=targets)))
    return training_memory(spec, setup, layout)


@pytest.mark.parametrize("model_type,precision", [("qwen3_moe", "bf16"), ("qwen3_moe", "fp32"), ("mixtral", "bf16")])
def test_one_device_exact(model_type, precision):
    from trainmath.verify.peft_sim import peft_step_peak

    cfg = transformers.AutoConfig.for_model(model_type, **MOE)
    m = peft_step_peak(cfg, micro_batch=B, seq=S, precision=precision, targets=list(TARGETS), rank=4)
    r = _predict(cfg, precision, ParallelLayout())
    assert r.stages[0].phase == "backward: loss"
    assert m["peak_bytes"] - m["buffers_bytes"] == r.peak_bytes


@pytest.mark.parametrize("model_type,world", [("qwen3_moe", 4), ("mixtral", 3)])
def test_fsdp2_exact(model_type, world):
    from trainmath.verify.peft_fsdp import peft_fsdp_step_peak

    cfg = transformers.AutoConfig.for_model(model_type, **MOE)
    m = peft_fsdp_step_peak(cfg, world=world, micro_batch=B, seq=S, precision="bf16", targets=list(TARGETS), rank=4)
    r = _predict(cfg, "bf16", ParallelLayout(dp=world, zero=3))
    assert m["peak_bytes"] - m["buffers_bytes"] == r.peak_bytes
    assert {c.name: c.value for c in r.breakdown.children}["weights_bytes"] == m["by_kind"]["Sharded Param"]


def test_expert_targets_refused():
    cfg = transformers.AutoConfig.for_model("qwen3_moe", **MOE)
    with pytest.raises(TrainmathError) as e:
        _predict(cfg, "bf16", ParallelLayout(), targets="all-linear")
    assert "target_parameters" in str(e.value) and "experts.gate_up_proj" in str(e.value)
