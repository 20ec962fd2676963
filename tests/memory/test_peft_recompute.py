"""Oracle: the recompute's peak of a checkpointed LoRA layer (``memory.peft_recompute``) against MemTracker on a
small real Llama whose step peaks there (small vocabulary, long sequence): the recomputed forward's frame and
LoRA sums beside the gradients made before it. Without the moment the timeline was 1,687,556 bytes under."""

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

CFG = dict(vocab_size=128, hidden_size=64, intermediate_size=256, num_hidden_layers=2, num_attention_heads=4,
           num_key_value_heads=2, max_position_embeddings=1024, head_dim=16)


def test_recompute_peak_exact():
    cfg = transformers.AutoConfig.for_model("llama", **CFG)
    m = peft_step_peak(cfg, micro_batch=2, seq=512, precision="bf16", targets="all-linear", rank=4, recompute="full")
    spec = spec_from_config(cfg.to_dict(), name="tiny", source="test")
    r = training_memory(spec, TrainingSetup(micro_batch=2, seq=512, precision="bf16", device="cpu", recompute="full",
                                            loop_keeps="loss", peft=PeftRun(job=PeftJob(method="lora", rank=4,
                                                                                        targets="all-linear"))))
    assert r.stages[0].phase == "backward layer 1 recompute"
    # the loss's 4-byte gradient (ones_like) is the only storage the timeline does not count there
    assert m["peak_bytes"] - m["buffers_bytes"] - r.peak_bytes == 4
