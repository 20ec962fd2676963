"""The FSDP2 fine-tune's peak: what the runtime's gloo ranks are compared with (``verify.peft.FSDP2_GLOO``).

Oracle: FSDPMemTracker over a fake process group (``verify.peft_fsdp``) on the runtime's own shrunk model, where no
collective is late (deterministic), against ``training_memory`` on the CPU timeline the verify fields use. The gloo
ranks measured the same peaks to the bytes of the loop's loss (``docs/benchmarks.md``); their comparison, at full
training's ``fsdp2_gloo`` tolerance, is ``test_peft_train.test_verify_fields_exact``."""

from __future__ import annotations

from dataclasses import replace

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
pytest.importorskip("peft")

from tests.train.runs import config  # noqa: E402
from trainmath.adapters import PeftJob  # noqa: E402
from trainmath.layout import ParallelLayout  # noqa: E402
from trainmath.memory.peft import PeftRun  # noqa: E402
from trainmath.memory.training import training_memory  # noqa: E402
from trainmath.runtime.train.model import model_spec, shrunk_config  # noqa: E402
from trainmath.verify.peft_fsdp import peft_fsdp_step_peak  # noqa: E402
from trainmath.verify.train import training_setup  # noqa: E402

TIGHT = 0.01
"""The CPU timeline against the deterministic fake-group peak: within 1%. What stays is a LoRA Linear's forward
sum (``result + lora_B(lora_A(x)) * scaling``: the base output, the scaled branch and their sum beside the
residual), an op-level transient the timeline does not make an event; it is the peak only where the MLP's
down projection is adapted (all-linear)."""


def _isolated(fn, *args, **kwargs):
    """``fn`` in a fresh spawned process: a fake process group and its device mesh leave torch.distributed state
    behind in the process that made them (the gloo ranks this suite later forks inherit it, and DCP's global plan
    then sees one rank's chunks), so the simulation runs where that state dies with it."""
    import concurrent.futures
    import multiprocessing

    with concurrent.futures.ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as pool:
        return pool.submit(fn, *args, **kwargs).result()


def _both(targets, recompute):
    job = PeftJob(method="lora", rank=4, targets=targets if isinstance(targets, str) else tuple(targets))
    cfg = config(measure=True, strategy="zero3", peft=job, recompute=recompute)
    name, conf = shrunk_config(cfg.model, cfg.overrides)
    spec = model_spec(name, conf)
    setup = replace(training_setup(cfg, 2), peft=PeftRun(job=job))
    predicted = training_memory(spec, setup, ParallelLayout(dp=2, zero=cfg.zero))
    keys = {k: v for k, v in conf.items() if k not in ("architectures", "model_type", "transformers_version")}
    hf = transformers.AutoConfig.for_model(conf["model_type"], **keys)
    measured = _isolated(peft_fsdp_step_peak, hf, world=2, micro_batch=cfg.micro_batch_for(2), seq=cfg.seq,
                         precision="fp32", targets=targets, rank=4, recompute=recompute)
    return predicted, measured


@pytest.mark.parametrize("recompute", ["none", "full"])
def test_frozen_mlp_backward_peak_exact(recompute):
    """q_proj,v_proj: the peak is inside layer 1's frozen MLP backward (``memory.peft_backward``: the gradient of
    the down projection's input and ``mul``'s two, 3·c·T·f, nothing freed); exact but for the model's buffers
    (rotary inv_freq, which the calculator does not count)."""
    r, m = _both(["q_proj", "v_proj"], recompute)
    assert r.stages[0].phase == "backward layer 1"
    assert m["peak_bytes"] - m["buffers_bytes"] == r.peak_bytes + 4


@pytest.mark.parametrize("recompute", ["none", "full"])
def test_all_linear_within_the_tight_tolerance(recompute):
    r, m = _both("all-linear", recompute)
    gap = m["peak_bytes"] - m["buffers_bytes"] - r.peak_bytes
    assert 0 <= gap <= TIGHT * r.peak_bytes
