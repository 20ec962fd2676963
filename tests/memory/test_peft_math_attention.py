"""Oracle: a LoRA step of a small real StarCoder2 (LayerNorm with bias, plain GELU MLP, dropouts: SDPA on the CPU
takes the math fallback) against MemTracker / FSDPMemTracker, at sizes where the math attention's s² tensors
dominate (small vocabulary, long sequence).

- Under FSDP2 with recompute the peak is the last layer's attention backward (``fsdp2.MixerBackward`` over the
  peft op list: the adapters' gradients of the modules after it, the math kernel's backward buffers); without the
  moment the timeline was 4·b·h·s² and more under.
- On one device (the ``timeline.Buckets`` walk) the same moment, with the adapters' gradients of the modules after
  the attention: at s = 512 the last layer's attention backward is the peak with recompute and without; without
  the moment the timeline was 14.1% (full) and 7.3% (none) under.
- With a sliding window at most s, transformers builds an explicit bool (1, 1, s, s) mask
  (``masking_utils._ignore_causal_mask_sdpa``) that the checkpoints hold to the end of backward
  (``ops.selective.mask_arguments``); without it the timeline was s² bytes under.
- On one device without input gradients, the dropout on the frozen embedding's output keeps no noise
  (``memory.peft.frozen_embedding``); counting it put the timeline one (T, d) tensor over.
- In a layer's recompute, a LoRA Linear's input stays in its frame until the branch's sum returns
  (``memory.peft_recompute``): at c_proj's LoRA sum the GELU output (T, f) is alive; without it the timeline
  was under."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
pytest.importorskip("peft")

from trainmath.adapters import PeftJob  # noqa: E402
from trainmath.families import spec_from_config  # noqa: E402
from trainmath.layout import ParallelLayout  # noqa: E402
from trainmath.memory.peft import PeftRun  # noqa: E402
from trainmath.memory.training import TrainingSetup, training_memory  # noqa: E402
from trainmath.verify.peft_fsdp import peft_fsdp_step_peak  # noqa: E402
from trainmath.verify.peft_sim import peft_step_peak  # noqa: E402

CFG = dict(vocab_size=128, hidden_size=64, intermediate_size=256, num_hidden_layers=2, num_attention_heads=4,
           num_key_value_heads=2, max_position_embeddings=1024, use_bias=True, attention_dropout=0.1,
           residual_dropout=0.1, embedding_dropout=0.1, sliding_window=None)


def _both(s, world, recompute, **extra):
    cfg = transformers.AutoConfig.for_model("starcoder2", **{**CFG, **extra})
    kw = dict(micro_batch=1, seq=s, precision="bf16", targets="all-linear", rank=4, recompute=recompute)
    m = peft_fsdp_step_peak(cfg, world=world, **kw) if world > 1 else peft_step_peak(cfg, **kw)
    spec = spec_from_config(cfg.to_dict(), name="tiny", source="test")
    setup = TrainingSetup(micro_batch=1, seq=s, precision="bf16", device="cpu", recompute=recompute, loop_keeps="loss",
                          optimizer_impl="forloop" if world > 1 else "foreach",
                          peft=PeftRun(job=PeftJob(method="lora", rank=4, targets="all-linear")))
    r = training_memory(spec, setup, ParallelLayout(dp=world, zero=3) if world > 1 else ParallelLayout())
    return m["peak_bytes"] - m["buffers_bytes"], r


@pytest.mark.parametrize("window", [None, 512])
def test_fsdp2_attention_backward_peak(window):
    measured, r = _both(512, 2, "full", sliding_window=window)
    assert r.stages[0].phase == "backward layer 1 attention"
    assert measured - r.peak_bytes == 4  # the loss's gradient (ones_like), which no event counts


@pytest.mark.parametrize("recompute", ["none", "full"])
def test_one_device_attention_backward_peak(recompute):
    measured, r = _both(512, 1, recompute)
    assert r.stages[0].phase == "backward layer 1 attention"
    assert measured - r.peak_bytes == 4  # the loss's gradient (ones_like), which no event counts


VOCAB = {"none": 4096, "full": 128}
"""A vocabulary large enough that the loss is the step's peak without recompute, small enough that the recompute
is with it."""


@pytest.mark.parametrize("recompute,phase", [("none", "backward: loss"), ("full", "backward layer 0 recompute")])
def test_one_device_embedding_dropout_and_lora_frame(recompute, phase):
    measured, r = _both(128, 1, recompute, hidden_size=256, intermediate_size=1024, vocab_size=VOCAB[recompute])
    assert r.stages[0].phase == phase
    # at the recompute the loss's 4-byte gradient (ones_like) is the one storage no event counts
    assert measured - r.peak_bytes == (4 if recompute == "full" else 0)
