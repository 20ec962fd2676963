"""One job, one type: a run's step is the calculator's ``TrainingSetup`` (``TrainConfig.step``), and the prediction
reads it as it stands, changing only what depends on where the run ran (ranks, device) and its strategy."""

from __future__ import annotations

from dataclasses import fields

from trainmath.memory.setup import TrainingSetup
from trainmath.runtime.train.config import TrainConfig, validate
from trainmath.verify.train import training_setup


def test_the_step_is_the_calculators_setup():
    cfg = validate(TrainConfig.of(model="qwen3-0.6b", micro_batch=2, seq=64, precision="amp-bf16",
                                  optimizer="momentum", recompute="full", grad_accum=3, strategy="zero2",
                                  impl="trainmath"), 2)
    assert isinstance(cfg.step, TrainingSetup)
    assert (cfg.micro_batch, cfg.seq, cfg.precision, cfg.recompute, cfg.grad_accum) == (2, 64, "amp-bf16", "full", 3)
    assert cfg.optimizer == "momentum" and cfg.step.optimizer == "sgd-momentum"  # the CLI's word, the calculator's
    setup = training_setup(cfg, 2, cuda=True)
    changed = {f.name for f in fields(TrainingSetup) if getattr(setup, f.name) != getattr(cfg.step, f.name)}
    assert changed <= {"micro_batch", "granularity", "device", "zero_impl"}
    assert (setup.device, setup.granularity, setup.zero_impl) == ("cuda", 512, "trainmath")


def test_global_batch_sets_the_micro_batch_per_rank():
    cfg = validate(TrainConfig.of(model="qwen3-0.6b", global_batch=8, grad_accum=2), 2)
    assert training_setup(cfg, 2).micro_batch == 2 and cfg.step.micro_batch == 1
