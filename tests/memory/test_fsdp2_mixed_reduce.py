"""FSDP2 mixed-bf16 (``MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=fp32)``) at the root's reduce-scatter.

Oracle: the simulation (transformers' own code on fake tensors under FSDPMemTracker, rank 0 of a fake process
group), its peak in the segment of the root's post-backward (step 2), against the calculator's timeline, whose peak
is that event: ``foreach_reduce``'s reduce-scatter moment (the fp32 input beside the fp32 flat output, the bf16
gradients freed but for the embedding's, ``fsdp2.reduce_scatter_moment``). Equal but for the 4-byte loss scalar
the other FSDP2 simulate tests name.
"""

from __future__ import annotations

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

from trainmath.families import spec_from_config  # noqa: E402
from trainmath.layout import ParallelLayout  # noqa: E402
from trainmath.memory.training import TrainingSetup, training_memory  # noqa: E402

DIMS = dict(vocab_size=1024, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, max_position_embeddings=256, head_dim=16, tie_word_embeddings=False)


@pytest.mark.parametrize("family", ["qwen3", "llama"])
def test_root_reduce_scatter_equals_the_simulation(family):
    from trainmath.verify.simulate import simulate

    config = {"model_type": family, **DIMS}
    setup = TrainingSetup(micro_batch=1, seq=8, precision="mixed-bf16", optimizer_impl="forloop", device="cpu")
    layout = ParallelLayout(dp=2, zero=3)
    r = training_memory(spec_from_config(config, name="tiny", source="test"), setup, layout)
    sim = simulate(config, setup, layout)
    assert r.stages[0].phase == "backward: root reduce-scatter"
    at_root = sim.segments[(2, "backward", "after bottom 0", "Global")][0]
    assert at_root - sim.buffers_bytes - r.peak_bytes == 4
    # the gap before: one bf16 vocabulary × hidden gradient beside the fp32 input and output
    assert sim.segments[(2, "backward", "after bottom 0", "Global")][1]["Unsharded Grad"] == 1024 * 64 * 2


def test_tied_root_reduce_scatter_keeps_only_the_norm_gradient():
    """Tied (the lookup's gradient summed into the head's): no vocabulary × hidden gradient outlives the clear; the
    simulation holds the final norm's bf16 gradient (hidden × 2 = 128 B) the timeline does not, and the scalar."""
    from trainmath.verify.simulate import simulate

    config = {"model_type": "qwen3", **DIMS, "tie_word_embeddings": True}
    setup = TrainingSetup(micro_batch=1, seq=8, precision="mixed-bf16", optimizer_impl="forloop", device="cpu")
    layout = ParallelLayout(dp=2, zero=3)
    r = training_memory(spec_from_config(config, name="tiny", source="test"), setup, layout)
    sim = simulate(config, setup, layout)
    ev = next(e for e in r.stages[0].timeline if e.kind.value == "backward: root reduce-scatter")
    at_root, kinds = sim.segments[(2, "backward", "after bottom 0", "Global")]
    assert at_root - sim.buffers_bytes - ev.bytes == 64 * 2 + 4
    assert kinds["Unsharded Grad"] == 64 * 2
