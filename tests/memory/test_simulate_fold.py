"""``--simulate-layers``, ``--precision mixed-bf16`` and the progress of ``--simulate``.

Oracles: the full simulation (transformers' own code on fake tensors under MemTracker) for the fold, to the byte;
the calculator's ``--device cpu`` timeline for mixed-bf16 (one device: Megatron-LM's master-weight loop,
``trainmath.verify.mixed``; FSDP2: ``MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=fp32)``), to the byte
where the peak is the loss's backward or the one-device optimizer step, as the other simulate tests.
"""

from __future__ import annotations

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

from trainmath.families import spec_from_config  # noqa: E402
from trainmath.layout import ParallelLayout  # noqa: E402
from trainmath.memory.training import TrainingSetup, training_memory  # noqa: E402

QWEN3_06B_WIDTH = dict(model_type="qwen3", hidden_size=1024, intermediate_size=3072, num_attention_heads=16,
                       num_key_value_heads=8, head_dim=128, max_position_embeddings=40960, rope_theta=1000000,
                       rms_norm_eps=1e-6, tie_word_embeddings=True, bos_token_id=0, eos_token_id=0,
                       num_hidden_layers=8)
"""Qwen3-0.6B's widths (its config.json in the catalog) with 8 layers."""


@pytest.mark.parametrize("vocab, setup, layout", [
    (151936, TrainingSetup(micro_batch=1, seq=1024, device="cpu"), ParallelLayout()),  # the defaults: mixed-bf16
    (512, TrainingSetup(micro_batch=1, seq=512, precision="bf16", recompute="full", device="cpu"), ParallelLayout()),
    (512, TrainingSetup(micro_batch=1, seq=256, optimizer_impl="forloop", device="cpu"), ParallelLayout(dp=4, zero=3)),
], ids=["mixed-bf16", "bf16-full-recompute", "fsdp2-mixed-bf16"])
def test_fold_equals_the_full_simulation(vocab, setup, layout):
    """4 and 5 layers folded to 8 give the 8-layer simulation's peak, kinds and buffers exactly."""
    from trainmath.verify.fold import FoldPlan, simulate_folded
    from trainmath.verify.pattern import Pattern
    from trainmath.verify.simulate import simulate

    config = {**QWEN3_06B_WIDTH, "vocab_size": vocab}
    full = simulate(config, setup, layout)
    plan = FoldPlan(4, 8, Pattern(("full_attention + mlp",) * 8, prefix=0, period=1, repeats=8))
    folded = simulate_folded(config, setup, layout, moe=False, plan=plan)
    assert (folded.peak_bytes, folded.by_kind, folded.buffers_bytes) == (full.peak_bytes, full.by_kind,
                                                                         full.buffers_bytes)
    assert "4 and 5 of 8" in folded.folded  # (the segment named may differ where two steps tie at the peak)


BASE = dict(model_type="qwen3", vocab_size=1024, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256, head_dim=16)


@pytest.mark.parametrize("b, s, impl, layout, event", [
    (2, 64, "foreach", ParallelLayout(), "backward: loss"),
    (1, 8, "foreach", ParallelLayout(), "optimizer step"),
    (2, 64, "forloop", ParallelLayout(dp=2, zero=3), "backward: loss"),
])
def test_mixed_bf16_equals_the_timeline(b, s, impl, layout, event):
    """The calculator's mixed-bf16 timeline equals the simulated step at its peak; at the one-device optimizer step
    the bf16 gradients are gone (Megatron frees each as it copies it to fp32)."""
    from trainmath.verify.simulate import simulate

    setup = TrainingSetup(micro_batch=b, seq=s, precision="mixed-bf16", optimizer_impl=impl, device="cpu")
    r = training_memory(spec_from_config(BASE, name="tiny", source="test"), setup, layout)
    sim = simulate(BASE, setup, layout)
    assert r.stages[0].phase == event
    assert sim.peak_bytes - sim.buffers_bytes == r.peak_bytes


@pytest.mark.parametrize("keep", ["loss", "output"])
def test_fsdp2_loss_loop_frees_the_logits(keep):
    """FSDP2 rank 0 under FSDPMemTracker with ``loss = model(...).loss``: the logits die after the forward in the
    simulation as in the timeline (the StarCoder2-like event test of test_memtracker_oracle, both loops): equal
    but for the 4-byte scalar that test names, and the two loops differ by one bf16 (b, s, V) logits tensor."""
    from trainmath.verify.simulate import simulate

    config = {"model_type": "starcoder2", "vocab_size": 128, "hidden_size": 256, "intermediate_size": 1024,
              "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
              "max_position_embeddings": 256, "attention_dropout": 0.1, "residual_dropout": 0.1,
              "embedding_dropout": 0.0, "use_bias": True, "tie_word_embeddings": False, "bos_token_id": 0,
              "eos_token_id": 0}
    spec = spec_from_config(config, name="tiny", source="test")
    setup = TrainingSetup(loop_keeps=keep, micro_batch=1, seq=64, precision="bf16", optimizer_impl="forloop",
                          device="cpu")
    layout = ParallelLayout(dp=4, zero=3)
    r = training_memory(spec, setup, layout)
    sim = simulate(config, setup, layout)
    assert sim.peak_bytes - sim.buffers_bytes - r.peak_bytes == 4
    assert r.peak_bytes == {"output": 8_156_308, "loss": 8_156_308 - 1 * 64 * 128 * 2}[keep]


def test_cli_progress_estimate_and_fold(capsys, tmp_path):
    """The default precision runs; progress per layer and the estimate go to stderr, the JSON to stdout; bad
    --simulate-layers is one line, exit 2."""
    import json

    from trainmath.cli import main

    path = str(tmp_path / "config.json")
    with open(path, "w") as f:
        json.dump({**BASE, "num_hidden_layers": 10}, f)
    assert main(["memory", path, "--micro-batch", "2", "--seq", "64", "--simulate", "--simulate-layers", "4",
                 "--json"]) == 0
    out, err = capsys.readouterr()
    d = json.loads(out)["simulation"]
    assert d["difference_bytes"] == 0 and d["layers"] == 10 and "4 and 5 of 10" in d["folded"]
    assert "estimated" in err and "step 2/2 backward layer 1/5" in err and "step 2/2 forward layer 4/4" in err
    for argv, message in [(["--simulate-layers", "4"], "--simulate-layers needs --simulate"),
                          (["--simulate", "--simulate-layers", "3"], "--simulate-layers must be at least 4")]:
        assert main(["memory", path, "--micro-batch", "2", "--seq", "64", *argv]) == 2
        err = capsys.readouterr().err
        assert message in err and err.count("\n") == 1
