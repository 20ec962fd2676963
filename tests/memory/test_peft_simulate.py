"""``memory --simulate --peft lora``: the fine-tune's fake-tensor step beside the ``--device cpu`` prediction
(``trainmath.verify.peft_simulate``), on one device and on rank 0 of FSDP2, and its one-line refusals."""

from __future__ import annotations

import pytest

from trainmath.adapters import PeftJob
from trainmath.errors import TrainmathError
from trainmath.layout import ParallelLayout
from trainmath.memory.peft import PeftRun
from trainmath.memory.training import TrainingSetup

TINY = dict(model_type="llama", vocab_size=1024, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256, head_dim=16)


def _setup(**kw):
    run = PeftRun(job=PeftJob(method=kw.pop("method", "lora"), rank=4, targets=("q_proj", "v_proj"),
                              dtype=kw.pop("dtype", "fp32")))
    return TrainingSetup(micro_batch=2, seq=64, device="cpu", peft=run, **{"precision": "bf16", **kw})


@pytest.mark.parametrize("layout,impl", [(ParallelLayout(), "foreach"), (ParallelLayout(dp=4, zero=3), "forloop")])
def test_simulated_peak_equals_prediction(layout, impl):
    pytest.importorskip("torch")
    pytest.importorskip("peft")
    from trainmath.families import spec_from_config
    from trainmath.verify.peft_simulate import check, peft_simulation

    setup = _setup(optimizer_impl=impl)
    check(setup, layout)
    sim = peft_simulation(TINY, spec_from_config(TINY, name="tiny", source="test"), setup, layout)
    assert sim["trainable_params"] == 2 * 4 * (64 + 64 + 64 + 32)
    assert sim["difference_bytes"] == 0 and sim["predicted_cpu_peak_event"] == "backward: loss"


@pytest.mark.parametrize("kw,layout,needle", [
    (dict(method="qlora"), ParallelLayout(), "--peft qlora"),
    (dict(dtype="bf16"), ParallelLayout(), "--lora-dtype bf16"),
    (dict(optimizer_impl="fused"), ParallelLayout(), "--optimizer-impl fused on one device"),
    (dict(precision="amp-bf16", optimizer_impl="forloop"), ParallelLayout(dp=2, zero=3), "--precision amp-bf16"),
    (dict(loop_keeps="output"), ParallelLayout(), "--loop-keeps output"),
    (dict(precision="mixed-bf16"), ParallelLayout(), "--precision mixed-bf16"),
])
def test_refusals_one_line(kw, layout, needle):
    from trainmath.verify.peft_simulate import check

    with pytest.raises(TrainmathError) as e:
        check(_setup(**kw), layout)
    assert needle in str(e.value) and "\n" not in str(e.value)
