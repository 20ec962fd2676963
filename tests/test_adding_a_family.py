"""The claim of ``docs/adding-a-family.md``: a family is one module (``tests/families/llama_copy.py``, registered
here) and one config. The module is Llama under a new ``model_type``, so the oracle is Llama itself: parameters,
FLOPs, activations, training memory under TP and the TP plan on both sides must equal Llama's figures."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from types import SimpleNamespace

import pytest

from trainmath import families
from trainmath.errors import TrainmathError
from trainmath.families import spec_from_config
from trainmath.flops import count_flops
from trainmath.layout import ParallelLayout
from trainmath.memory.activations import activation_bytes
from trainmath.memory.training import TrainingSetup, layout_text, training_memory
from trainmath.params import count_params

HERE = Path(__file__).resolve().parent
CONFIG = json.loads((HERE.parent / "src" / "trainmath" / "catalog" / "Llama-3.2-1B.json").read_text())
"""The one config: a published Llama config (the catalog's), renamed."""


@pytest.fixture(scope="module")
def copy():
    """Load the family's module from its file and register it; unregister afterwards."""
    where = importlib.util.spec_from_file_location("llama_copy", HERE / "families" / "llama_copy.py")
    module = importlib.util.module_from_spec(where)
    where.loader.exec_module(module)
    fam = families.register(module.LLAMA_COPY)
    yield fam
    families.REGISTRY.pop(fam.model_type)


def _specs(fam):
    llama = spec_from_config(dict(CONFIG), name="m", source="llama")
    new = spec_from_config({**CONFIG, "model_type": fam.model_type}, name="m", source="llama_copy")
    return llama, new


def test_unknown_until_registered():
    with pytest.raises(TrainmathError, match="'llama_copy' is not supported"):
        spec_from_config({**CONFIG, "model_type": "llama_copy"}, name="m", source="t")


def test_params_and_flops_equal_llamas(copy):
    llama, new = _specs(copy)
    assert new.family is copy and new.model_type == "llama_copy"
    assert count_params(new).total_params == count_params(llama).total_params == 1_235_814_400
    for rec in ("none", "full"):
        assert repr(count_flops(new, batch=2, seq=512, recompute=rec)) == \
            repr(count_flops(llama, batch=2, seq=512, recompute=rec))


@pytest.mark.parametrize("recompute", ["none", "selective"])
def test_activations_equal_llamas(copy, recompute):
    llama, new = _specs(copy)
    kw = dict(micro_batch=1, seq=256, recompute=recompute, tp=2, sp=True)
    assert activation_bytes(new, **kw) == activation_bytes(llama, **kw)


def test_memory_and_tp_plan_equal_llamas(copy):
    llama, new = _specs(copy)
    setup, layout = TrainingSetup(micro_batch=1, seq=256, precision="bf16"), ParallelLayout(tp=2, sp=True)
    a, b = training_memory(llama, setup, layout), training_memory(new, setup, layout)
    assert a.peak_bytes == b.peak_bytes and a.breakdown == b.breakdown
    assert "llama_copy: measured equal on gloo ranks" in layout_text(setup, layout, "llama_copy")
    assert "llama_copy" in families.tp_measured_families()


def test_runtime_tp_check_reads_the_same_plan(copy):
    """The runtime's ``check_tp`` asks the registered definition (torch is imported only to apply a plan)."""
    from trainmath.runtime.tensor_parallel import check_tp

    check_tp(SimpleNamespace(model_type="llama_copy", num_attention_heads=32, num_key_value_heads=8), 2)
    with pytest.raises(TrainmathError, match="must divide"):
        check_tp(SimpleNamespace(model_type="llama_copy", num_attention_heads=32, num_key_value_heads=8), 3)
