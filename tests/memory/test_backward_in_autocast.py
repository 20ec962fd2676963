"""``--backward-in-autocast`` and the default loop against MemTracker on fake tensors at full width.

Qwen3-8B at its own width (hidden 4096, vocabulary 151,936) with two layers, amp-bf16, under
``memory.simulate`` (transformers' real code on ``FakeTensorMode``, MemTracker's peak), with plain SGD so that
the peak falls in backward (at the embedding's backward, once every cast is cached). A loop that calls
``backward()`` inside ``torch.autocast`` keeps the forward's bf16 weight casts in autocast's cache to the end of
backward: MemTracker's peak grows by exactly what the calculator adds, 2 bytes per linear parameter (the LM head's
included)."""

from __future__ import annotations

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

from trainmath.errors import TrainmathError  # noqa: E402
from trainmath.families import spec_from_config  # noqa: E402
from trainmath.memory.training import TrainingSetup, check_setup, training_memory  # noqa: E402
from trainmath.sources import catalog_entry  # noqa: E402
from trainmath.verify.simulate import simulate  # noqa: E402

CFG = dict(catalog_entry("Qwen/Qwen3-8B").config, num_hidden_layers=2)
SPEC = spec_from_config(CFG, name="qwen3-8b-2-layers", source="test")
D, F, V, KV = 4096, 12288, 151936, 1024
LINEAR = 2 * (2 * D * D + 2 * D * KV + 3 * D * F) + V * D  # two layers' q, o, k, v, gate, up, down; the LM head


def setup(recompute: str, inside: bool) -> TrainingSetup:
    return TrainingSetup(micro_batch=1, seq=1024, precision="amp-bf16", optimizer="sgd", recompute=recompute,
                         device="cpu", backward_in_autocast=inside)


@pytest.mark.parametrize("recompute", ["full", "none"])
def test_backward_inside_autocast_adds_the_cached_casts_exactly(recompute):
    measured, predicted = {}, {}
    for inside in (False, True):
        sim = simulate(CFG, setup(recompute, inside))
        r = training_memory(SPEC, setup(recompute, inside))
        assert r.stages[0].phase == "backward: embedding"
        measured[inside], predicted[inside] = sim.peak_bytes - sim.buffers_bytes, r.peak_bytes
        # the calculator is within 0.01% of MemTracker both ways (1,056,764 bytes under recompute, 1,048,572
        # without: the same figure in both loops, so not the casts)
        assert abs(measured[inside] - predicted[inside]) < 1e-4 * measured[inside]
    assert measured[True] - measured[False] == predicted[True] - predicted[False] == 2 * LINEAR


def test_the_cache_grows_through_backward_and_is_gone_at_the_step():
    r_in = training_memory(SPEC, setup("full", True))
    r_out = training_memory(SPEC, setup("full", False))
    extra = {a.name: a.bytes - b.bytes for a, b in zip(r_in.stages[0].timeline, r_out.stages[0].timeline)}
    one_layer = 2 * (2 * D * D + 2 * D * KV + 3 * D * F)  # bytes of one layer's bf16 casts
    assert extra["forward: loss"] == 0 and extra["backward: loss"] == 2 * one_layer  # the head's cast still saved
    assert extra["backward layer 1"] == 2 * V * D + one_layer  # layer 1's own casts are its recompute's
    assert extra["backward layer 1 done"] == extra["backward: embedding"] == 2 * LINEAR
    assert extra["optimizer step"] == 0  # the context has exited
    assert any("backward() inside torch.autocast" in c for c in r_in.conventions)


def test_backward_in_autocast_needs_amp():
    bad = check_setup(TrainingSetup(micro_batch=1, seq=8, precision="bf16", backward_in_autocast=True))
    assert bad and "--backward-in-autocast" in bad[0]
    with pytest.raises(TrainmathError, match="--backward-in-autocast"):
        training_memory(SPEC, TrainingSetup(micro_batch=1, seq=8, precision="amp-bf16", backward_in_autocast=True),
                        __import__("trainmath.layout", fromlist=["ParallelLayout"]).ParallelLayout(pp=2, dp=1))
