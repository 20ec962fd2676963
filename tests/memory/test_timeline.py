"""The step's timeline: every event's breakdown sums to its bytes, the peak is the largest event, gradient
lifetime moves the peak by exactly the gradients that are live then, and the CLI prints the curve."""

from __future__ import annotations

import json

import pytest

import standin
from trainmath.cli import main
from trainmath.layout import ParallelLayout
from trainmath.memory import training
from trainmath.memory.precision import get_precision
from trainmath.memory.states import model_states
from trainmath.memory.training import TrainingSetup, training_memory
from trainmath.placement import place
from trainmath.sources import load_spec
from trainmath.tree import check_sums

SPEC = load_spec("qwen3-0.6b")


@pytest.mark.parametrize("lifetime", ["set_to_none", "zero", "accumulate"])
@pytest.mark.parametrize("recompute", ["none", "full"])
def test_every_event_sums_and_peak_is_the_max(lifetime, recompute):
    r = training_memory(SPEC, TrainingSetup(micro_batch=1, seq=512, grad_lifetime=lifetime, recompute=recompute),
                        ParallelLayout(), activation_model=standin)
    m = r.stages[0]
    for e in m.timeline:
        tree = m.at(e.name)
        assert check_sums(tree) == [] and tree.value == e.bytes
    assert r.peak_bytes == max(e.bytes for e in m.timeline) == m.at(m.phase).value
    names = [e.name for e in m.timeline]
    assert names[0] == "step start" and names[-2:] == ["optimizer step", "zero_grad"]
    assert names.index("forward: loss") < names.index("backward: loss") < names.index("backward layer 27")


def test_set_to_none_has_no_gradients_at_backward_start():
    """The whole point of the option: with set_to_none the loss's backward runs with no gradient allocated;
    with accumulate every gradient is there, and the two timelines differ by exactly the gradients then."""
    a = training_memory(SPEC, TrainingSetup(micro_batch=1, seq=512), activation_model=standin).stages[0]
    b = training_memory(SPEC, TrainingSetup(micro_batch=1, seq=512, grad_lifetime="accumulate"),
                        activation_model=standin).stages[0]
    grads = b.at("step start").flat()["gradients_bytes"]
    ms = model_states(place(SPEC, ParallelLayout()), ParallelLayout(), get_precision("mixed-bf16"), "adamw")
    assert grads == ms.gradients_bytes > 2 * 596_049_920  # bf16, every tensor rounded up to 512-byte blocks
    assert a.at("backward: loss").flat()["gradients_bytes"] == 0
    for ea, eb in zip(a.timeline, b.timeline):
        assert eb.bytes - ea.bytes == grads - ea.parts["gradients_bytes"]
    # mixed-bf16: the bf16 gradients made in this step go as their fp32 copies are made (Megatron-LM's
    # Float16OptimizerWithFloat16Params); accumulated ones stay
    assert a.at("optimizer step").flat()["gradients_bytes"] == 0
    assert b.at("optimizer step").flat()["gradients_bytes"] == grads


def test_tied_head_gradient_appears_in_the_head_backward():
    m = training_memory(SPEC, TrainingSetup(micro_batch=1, seq=512, granularity=1),
                        activation_model=standin).stages[0]
    head = m.at("backward: head").flat()["gradients_bytes"]
    assert head == 2 * (151936 * 1024 + 1024)  # the tied embedding and the final norm, bf16


def test_micro_batches_keep_gradients():
    m = training_memory(SPEC, TrainingSetup(micro_batch=1, seq=512, micro_batches=4),
                        activation_model=standin).stages[0]
    assert m.at("step start").flat()["gradients_bytes"] > 0


@pytest.fixture
def _standin(monkeypatch):
    monkeypatch.setattr(training, "_activation_model", lambda am: standin)


def test_cli_timeline_json(capsys, _standin):
    assert main(["memory", "qwen3-0.6b", "--micro-batch", "1", "--seq", "256", "--timeline", "--json"]) == 0
    curve = json.loads(capsys.readouterr().out)
    assert curve[0]["event"] == "step start" and all(set(p) == {"event", "bytes"} for p in curve)
    assert main(["memory", "qwen3-0.6b", "--micro-batch", "1", "--seq", "256", "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["timeline"] == curve
    assert d["peak_bytes"] == max(p["bytes"] for p in curve) == sum(d["breakdown"].values())
    assert d["peak_event"] in {p["event"] for p in curve}
    assert any("gradient lifetime set_to_none" in c for c in d["conventions"])


def test_cli_timeline_table(capsys, _standin):
    assert main(["memory", "qwen3-0.6b", "--micro-batch", "1", "--seq", "256", "--timeline"]) == 0
    out = capsys.readouterr().out
    assert out.count("<- peak") == 1 and "backward layer 0 done" in out
