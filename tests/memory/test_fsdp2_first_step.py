"""FSDP2's first optimizer step with the for-loop AdamW, simulated: its lazily made states on DTensor shards hold
what the second step's do, no more.

DTensor finds each op's global output shape by running it on fake tensors of the ambient fake mode, cached per op
and arguments. In a real run that is a private mode whose tensors no tracker counts; under the simulation's own
fake mode they were counted at the first step, whose ops miss the cache, so the first optimizer step rose above
the second and above every event of the calculator's timeline (``trainmath.verify.simulate`` now gives the
propagation a private mode under FSDP2 as under TP).

Oracles: the simulation's own second step (the same states, made already) and the calculator's timeline, whose peak
the simulated step equals: exactly in fp32 (the forward's first all-gather; before, the first optimizer step was
655,232 B above the second and 4,036 B above the timeline), and but for the 4-byte scalar
``test_fsdp2_mixed_reduce`` names in mixed-bf16 (the root's reduce-scatter).
"""

from __future__ import annotations

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

from trainmath.families import spec_from_config  # noqa: E402
from trainmath.layout import ParallelLayout  # noqa: E402
from trainmath.memory.training import TrainingSetup, training_memory  # noqa: E402

DIMS = dict(model_type="qwen3", vocab_size=1024, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256, head_dim=16,
            tie_word_embeddings=False)


@pytest.mark.parametrize("precision", ["fp32", "mixed-bf16"])
def test_first_optimizer_step_holds_what_the_second_does(precision):
    from trainmath.verify.simulate import simulate

    setup = TrainingSetup(micro_batch=1, seq=8, precision=precision, optimizer_impl="forloop", device="cpu")
    layout = ParallelLayout(dp=2, zero=3)
    sim = simulate(DIMS, setup, layout)
    first = {k[2:]: v for k, v in sim.segments.items() if k[0] == 1 and k[1] == "optimizer"}
    second = {k[2:]: v for k, v in sim.segments.items() if k[0] == 2 and k[1] == "optimizer"}
    assert first == second
    r = training_memory(spec_from_config(DIMS, name="tiny", source="test"), setup, layout)
    assert (r.stages[0].phase, sim.peak_bytes - sim.buffers_bytes - r.peak_bytes) == {
        "fp32": ("forward layer 0 all-gather", 0), "mixed-bf16": ("backward: root reduce-scatter", 4)}[precision]
