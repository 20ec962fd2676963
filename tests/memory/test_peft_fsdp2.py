"""Oracle: ``training_memory(..., peft=..., ParallelLayout(dp=W, zero=3))`` against FSDPMemTracker's peak of rank 0
of a real FSDP2 LoRA step (ZeRO-3, and ZeRO-2's ``reshard_after_forward=False``) over a fake process group
(``trainmath.verify.peft_fsdp``: peft applied before ``fully_shard``, for-loop AdamW over the adapters), on small
CPU models with real tensors.

Exact where the peak is the loss (the sharded base and adapters, the root's and the last layer's gathered buffers,
the adapters' sharded states). Where the peak is a layer's forward all-gather, the gathered buffers, the shards
and the states are exact by kind; the total sits under the measured one by one (T, d) tensor at most beside the
hidden states (with layer 0 frozen at its input, the model's ``inputs_embeds`` is kept by nothing the timeline
counts)."""

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

BASE = dict(vocab_size=1024, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, max_position_embeddings=256, head_dim=16)


def _both(precision, targets, world, *, b=2, s=64, recompute="none", input_grads=None, zero=3, **extra):
    cfg = transformers.AutoConfig.for_model("llama", **{**BASE, **extra})
    m = peft_fsdp_step_peak(cfg, world=world, micro_batch=b, seq=s, precision=precision, targets=targets, rank=4,
                            recompute=recompute, input_grads=input_grads, reshard=zero == 3)
    spec = spec_from_config(cfg.to_dict(), name="tiny", source="test")
    run = PeftRun(job=PeftJob(method="lora", rank=4, targets=targets if isinstance(targets, str) else tuple(targets)),
                  input_grads=input_grads)
    setup = TrainingSetup(micro_batch=b, seq=s, precision=precision, device="cpu", recompute=recompute,
                          loop_keeps="loss", optimizer_impl="forloop", zero_impl="fsdp2", peft=run)
    return m, training_memory(spec, setup, ParallelLayout(dp=world, zero=zero))


def _kinds(m, r):
    k, parts = m["by_kind"], {c.name: c.value for c in r.breakdown.children}
    assert parts["weights_bytes"] == k["Sharded Param"]
    assert parts["optimizer_states_bytes"] == k["OptState"]
    assert parts["zero3_gather_bytes"] == k["Unsharded Param"] + k["All Gather"]


@pytest.mark.parametrize("precision,targets,world", [("bf16", ["q_proj", "v_proj"], 4), ("fp32", "all-linear", 4),
                                                     ("bf16", "all-linear", 3)])
def test_loss_peak_exact(precision, targets, world):
    m, r = _both(precision, targets, world)
    assert r.stages[0].phase == "backward: loss"
    assert m["peak_bytes"] - m["buffers_bytes"] == r.peak_bytes
    _kinds(m, r)


@pytest.mark.parametrize("precision,targets,world,recompute", [
    ("bf16", "all-linear", 2, "none"), ("fp32", ["q_proj", "v_proj"], 3, "none"), ("bf16", "all-linear", 3, "full"),
])
def test_forward_all_gather_peak(precision, targets, world, recompute):
    """A wide MLP and a short sequence: the peak is layer 1's forward all-gather (its and layer 0's flat buffers,
    its unsharded parameters, the root's)."""
    b, s = 1, 16
    m, r = _both(precision, targets, world, b=b, s=s, recompute=recompute, intermediate_size=2048)
    assert r.stages[0].phase == "forward layer 1 all-gather"
    _kinds(m, r)
    gap = m["peak_bytes"] - m["buffers_bytes"] - r.peak_bytes
    assert 0 <= gap <= b * s * BASE["hidden_size"] * (2 if precision == "bf16" else 4)


@pytest.mark.parametrize("extra,b,s", [({}, 2, 64), ({"intermediate_size": 2048}, 1, 16)])
def test_fsdp2_zero2(extra, b, s):
    """``--zero 2 --zero-impl fsdp2`` (``reshard_after_forward=False``): each layer stays gathered from its forward
    to its backward; exact at the loss, one (T, d) tensor under at layer 1's forward all-gather."""
    m, r = _both("bf16", "all-linear", 4, b=b, s=s, zero=2, **extra)
    _kinds(m, r)
    gap = m["peak_bytes"] - m["buffers_bytes"] - r.peak_bytes
    assert gap == (0 if not extra else b * s * BASE["hidden_size"] * 2)


def test_sharding_lowers_the_peak():
    """Property with a pinned pair: the rank's peak falls from 2 to 4 ranks, and the adapters' states by the
    rows each rank holds."""
    cfg = spec_from_config(transformers.AutoConfig.for_model("llama", **BASE).to_dict(), name="tiny", source="t")
    run = PeftRun(job=PeftJob(method="lora", rank=4, targets="all-linear"))
    setup = TrainingSetup(micro_batch=2, seq=64, precision="bf16", device="cpu", optimizer_impl="forloop", peft=run)
    two, four = (training_memory(cfg, setup, ParallelLayout(dp=w, zero=3)) for w in (2, 4))
    assert four.peak_bytes < two.peak_bytes
    assert four.breakdown.child("weights_bytes").value < two.breakdown.child("weights_bytes").value
