"""Tiny training runs for the tests, launched in-process (ranks forked after torch and transformers are imported:
~0.1 s each) and cached, so several tests can read one run."""

from __future__ import annotations

import functools

from trainmath.runtime.launch import JobSpec, launch
from trainmath.runtime.train.config import TrainConfig, validate
from trainmath.runtime.train.loop import prepare, rank_entry

MODEL = "Qwen/Qwen3-0.6B"
# Uneven on purpose: vocab 67 and intermediate 42 rows do not divide by 2 or 4 ranks, so ZeRO pads.
SHRINK = {"layers": 2, "hidden": 32, "intermediate": 42, "heads": 4, "kv_heads": 2, "vocab": 67}
GLOBAL_BATCH = 4
SEQ = 16
STEPS = 4

STRATEGIES = [("ddp", "torch"), ("zero1", "torch"), ("zero2", "torch"), ("zero3", "torch"),
              ("zero1", "trainmath"), ("zero2", "trainmath"), ("zero3", "trainmath")]


def config(**kw) -> TrainConfig:
    base = {"model": MODEL, "overrides": SHRINK, "global_batch": GLOBAL_BATCH, "seq": SEQ, "steps": STEPS}
    if kw.pop("moe", False):  # Mixtral's top-2 of 64 experts: 64 tokens per rank leave ~23 experts without any
        base.update(model="mistralai/Mixtral-8x7B-v0.1", overrides={**SHRINK, "experts": 64}, steps=2)
    return TrainConfig.of(**{**base, **kw})


def run(nproc: int, timeout_s: float = 60, **kw) -> dict[int, dict]:
    cfg = validate(config(**kw), nproc)
    prepare(cfg)
    return launch(JobSpec(nproc_per_node=nproc, timeout_s=timeout_s), rank_entry, cfg, None, False)


@functools.cache
def cached(nproc: int, **kw) -> dict[int, dict]:
    """A run with measurement on (step 2), shared between tests; do not mutate."""
    return run(nproc, measure=True, **kw)


def losses(results: dict[int, dict]) -> list[float]:
    return [r["loss"] for r in results[0]["records"]]
