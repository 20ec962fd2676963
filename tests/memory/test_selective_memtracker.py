"""Oracle: ``training_memory(..., recompute="selective", device="cpu")`` against MemTracker's peak of a real
training step under ``apply_selective`` (torchtitan's op-level policy), and ``--simulate`` against the same step.

``test_memtracker_oracle.measure`` builds the model; here ``from_config`` is wrapped so the model it returns runs
its decoder layers under ``apply_selective``. Regimes and tolerances as in ``test_memtracker_oracle``: exact where
the peak is the loss, within 1% inside a layer's backward (op-level transients inside one layer's backward are not
events of the timeline).
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

import tests.memory.test_memtracker_oracle as mto  # noqa: E402
from trainmath.runtime.checkpointing import apply_selective  # noqa: E402


@pytest.fixture
def selective(monkeypatch):
    real = transformers.AutoModelForCausalLM.from_config

    def build(*a, **k):
        return apply_selective(real(*a, **k))

    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_config", build)


@pytest.mark.parametrize("model_type, precision", [("qwen3", "fp32"), ("qwen3", "amp-bf16"), ("llama", "bf16"),
                                                   ("qwen2", "amp-bf16")])
def test_loss_peak_exact(selective, model_type, precision):
    measured, buffers, r = mto.measure(model_type, precision=precision, vocab=1024, b=2, s=64,
                                       recompute="selective")
    assert r.stages[0].phase == "backward: loss"
    assert measured - buffers == r.peak_bytes


@pytest.mark.parametrize("precision, bound", [("fp32", 0.01), ("bf16", 0.01), ("amp-bf16", 0.02)])
def test_layer_backward_peak_within_bound(selective, precision, bound):
    """Small vocabulary: the peak is inside a layer's backward, where the timeline holds the layer's kept bytes,
    all its recompute saved and the MLP's backward transient at once. Measured: fp32 and bf16 within 1% as with
    full recompute; amp-bf16 1.6% above MemTracker (not analysed op by op: the bound is 2%, the issue's target)."""
    measured, buffers, r = mto.measure("qwen3", precision=precision, vocab=128, b=2, s=64, recompute="selective",
                                       impl="forloop")
    assert r.stages[0].phase.startswith("backward layer")
    assert abs(r.peak_bytes / (measured - buffers) - 1) < bound


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_fake_simulation_equals_real_step(selective, precision):
    from trainmath.verify.simulate import simulate

    measured, buffers, r = mto.measure("qwen3", precision=precision, vocab=1024, b=2, s=64, recompute="selective")
    sim = simulate({"model_type": "qwen3", "vocab_size": 1024, **mto.BASE}, r.setup)
    assert sim.peak_bytes - sim.buffers_bytes == measured - buffers
