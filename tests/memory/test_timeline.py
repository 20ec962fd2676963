"""The step's timeline: every event's breakdown sums to its bytes, the peak is the largest event, gradient
lifetime moves the peak by exactly the gradients that are live then, and the CLI prints the curve."""

from __future__ import annotations

import json

import pytest

import standin
from trainmath.cli import main
from trainmath.layout import ParallelLayout
from trainmath.memory import training
from trainmath.memory.states import model_states
from trainmath.memory.training import TrainingSetup, training_memory
from trainmath.placement import place
from trainmath.sources import load_spec
from trainmath.tree import check_sums
from trainmath.vocabulary import get_precision

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
        assert eb.bytes - ea.bytes == grads - ea.live.gradients_bytes
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
    monkeypatch.setattr(training, "activations", standin)


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


def _kinds(setup: TrainingSetup, layout: ParallelLayout) -> list:
    return [e.kind for e in training_memory(SPEC, setup, layout, activation_model=standin).stages[0].timeline]


@pytest.mark.parametrize("zero, impl, per_layer, tail", [
    (0, "deepspeed", ["BACKWARD_LAYER", "BACKWARD_LAYER_DONE"], ["OPTIMIZER_STEP", "ZERO_GRAD"]),
    (2, "deepspeed", ["BACKWARD_LAYER", "BACKWARD_LAYER_DONE"], ["OPTIMIZER_STEP", "ZERO_GRAD"]),
    (1, "trainmath", ["BACKWARD_LAYER", "BACKWARD_LAYER_DONE"],
     ["GRADIENT_PACK", "GRADIENT_REDUCE_SCATTER", "OPTIMIZER_STEP", "PARAMETER_ALL_GATHER", "ZERO_GRAD"]),
    (2, "trainmath", ["BACKWARD_LAYER", "BACKWARD_LAYER_DONE"],
     ["OPTIMIZER_STEP", "PARAMETER_ALL_GATHER", "ZERO_GRAD"]),
    (3, "trainmath", ["BACKWARD_LAYER", "BACKWARD_LAYER_DONE"], ["OPTIMIZER_STEP", "ZERO_GRAD"]),
    (3, "deepspeed", ["BACKWARD_ALL_GATHER", "BACKWARD_LAYER", "BACKWARD_INPUT_NORM", "BACKWARD_LAYER_DONE",
                      "LAYER_REDUCE_SCATTER"], ["ROOT_REDUCE_SCATTER", "OPTIMIZER_STEP", "ZERO_GRAD"]),
])
def test_the_zero_implementation_is_the_timelines_parameter(zero, impl, per_layer, tail):
    """One skeleton, one walk per implementation (``memory/timeline.py``): the moments every step has, in order,
    with each implementation's own collectives where the module docstrings put them; FSDP2 (ZeRO-3) all-gathers
    each layer before its forward and its backward, reduce-scatters it after, and the root around the step."""
    from trainmath.memory.step import Kind

    fsdp = zero == 3 and impl == "deepspeed"
    layers = range(SPEC.num_layers)
    forward = [k for _ in layers for k in (["FORWARD_ALL_GATHER"] if fsdp else []) + ["FORWARD_LAYER"]]
    want = (["STEP_START"] + (["ROOT_ALL_GATHER"] if fsdp else []) + forward
            + ["FORWARD_LOSS", "BACKWARD_LOSS", "BACKWARD_HEAD"] + per_layer * SPEC.num_layers
            + ["BACKWARD_EMBEDDING"] + tail)
    got = _kinds(TrainingSetup(micro_batch=1, seq=64, zero_impl=impl), ParallelLayout(dp=4, zero=zero))
    assert got == [Kind[k] for k in want]


def test_an_events_name_is_its_kind_and_layer():
    m = training_memory(SPEC, TrainingSetup(micro_batch=1, seq=64), ParallelLayout(dp=4, zero=3),
                        activation_model=standin).stages[0]
    names = [e.name for e in m.timeline]
    assert len(set(names)) == len(names)  # ``StageMemory.at`` finds each by its name
    assert names[:3] == ["step start", "forward: root all-gather", "forward layer 0 all-gather"]
    assert "backward layer 27 reduce-scatter" in names and "backward layer 0 input norm" in names
