"""Oracle: ``training_memory(..., peft=...)`` against MemTracker's peak of a real LoRA step of transformers' code
wrapped by peft (``trainmath.verify.peft_sim``: ``loss = model(...).loss``, AdamW foreach over the adapters,
set_to_none), on small CPU models. Exact where the peak is the loss and layer 0 needs no input gradient; with
``enable_input_require_grads`` (and so with gradient checkpointing) the step holds one more (T, d) transient at the
loss than the timeline has: within 1% here (0.2% at full width, ``benchmarks/peft_memory.py``)."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
pytest.importorskip("peft")

from trainmath.adapters import PeftJob  # noqa: E402
from trainmath.families import spec_from_config  # noqa: E402
from trainmath.memory.peft import PeftRun  # noqa: E402
from trainmath.memory.training import TrainingSetup, training_memory  # noqa: E402
from trainmath.verify.peft_sim import peft_step_peak  # noqa: E402

BASE = dict(vocab_size=1024, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, max_position_embeddings=256, head_dim=16)
B, S = 2, 64


def _both(model_type, precision, targets, recompute="none", input_grads=None):
    cfg = transformers.AutoConfig.for_model(model_type, **BASE)
    m = peft_step_peak(cfg, micro_batch=B, seq=S, precision=precision, targets=targets, rank=4, recompute=recompute,
                       input_grads=input_grads)
    spec = spec_from_config(cfg.to_dict(), name="tiny", source="test")
    run = PeftRun(job=PeftJob(method="lora", rank=4, targets=targets if isinstance(targets, str) else tuple(targets)),
                  input_grads=input_grads)
    r = training_memory(spec, TrainingSetup(micro_batch=B, seq=S, precision=precision, device="cpu",
                                            recompute=recompute, loop_keeps="loss", peft=run))
    return m, r


@pytest.mark.parametrize("model_type,precision,targets", [
    ("llama", "bf16", ["q_proj", "v_proj"]), ("llama", "amp-bf16", "all-linear"), ("qwen3", "fp32", "all-linear"),
    ("qwen2", "bf16", "all-linear"), ("olmo2", "bf16", ["q_proj", "v_proj"]),
])
def test_loss_peak_exact(model_type, precision, targets):
    m, r = _both(model_type, precision, targets)
    assert r.stages[0].phase == "backward: loss"
    assert m["peak_bytes"] - m["buffers_bytes"] == r.peak_bytes
    assert m["trainable_params"] * 4 * 2 <= r.breakdown.child("optimizer_states_bytes").value


@pytest.mark.parametrize("model_type,precision,recompute", [("llama", "bf16", "full"), ("qwen3", "fp32", "full"),
                                                             ("llama", "bf16", "none")])
def test_input_grads_within_2_percent(model_type, precision, recompute):
    m, r = _both(model_type, precision, "all-linear", recompute=recompute, input_grads=True)
    measured = m["peak_bytes"] - m["buffers_bytes"]
    assert 0 <= measured - r.peak_bytes <= 0.02 * measured
