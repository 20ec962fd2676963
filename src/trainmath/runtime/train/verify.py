"""The calculator's prediction for a training run, and its comparison with what the ranks measured.

Prediction: ``trainmath.memory.training_memory`` with the run's setup and layout (dp = world size, ZeRO stage of
the strategy; tensors counted at their exact size, ``granularity=1``, on CPU where no caching allocator rounds them
up; the CUDA allocator's 512-byte blocks on GPUs), and ``trainmath.flops.count_flops`` for one rank's micro-steps.
Pure Python: no torch here.

Fields and their tolerances (relative error |measured − predicted| / predicted):

- ``weights_bytes``, ``gradients_bytes``, ``optimizer_states_bytes``, ``master_weights_bytes``: 0, on every rank.
  The calculator shards each tensor on dim 0 (``ceil_div`` rows, padded), as FSDP2 and our ZeRO do.
  ``ZeroRedundancyOptimizer`` instead gives whole parameters to ranks (greedy by size), so its per-rank optimizer
  states are compared as the sum over ranks with the calculator's unsharded (ZeRO-0) optimizer states, exactly.
  FSDP2 pads the sharded parameters and gradients but creates optimizer states like the unpadded local shard, so
  only rank 0 (which holds full ⌈d/n⌉-row chunks) matches exactly; on the other ranks the calculator's figure is an
  upper bound.
- ``gemm_flops``: 0 — FLOPs per rank and step of every matmul but the attention core (projections, MLP, LM head;
  forward, backward, recompute); FlopCounterMode counts the same matmuls.
- ``attention_core_flops``: ``ATTENTION_TOLERANCE`` — the attention kernels (QKᵀ and PV). The calculator counts
  their backward as 2× forward (four GEMMs); torch's SDPA formula for flash attention, whose backward recomputes
  QKᵀ, counts 2.5× (five), so the measured figure is 7/6 of the predicted one without recompute.
- ``peak_bytes``: ``PEAK_TOLERANCE`` (the measured peak of the step; see ``docs/benchmarks.md`` for what the
  differences are).
"""

from __future__ import annotations

from dataclasses import dataclass

from trainmath.layout import ParallelLayout
from trainmath.runtime.train.config import CALCULATOR_OPTIMIZER, TrainConfig

ATTENTION_TOLERANCE = 0.2
"""Flash attention's recomputed QKᵀ in backward: 3.5/3 − 1 ≈ 0.17 (see the module docstring)."""

PEAK_TOLERANCE = 0.25
"""Relative tolerance of the measured peak: the calculator models CUDA's step (logits path, DDP buckets, FSDP's
prefetch buffers as upper bounds); on CPU MemTracker sees the same tensors, but gloo's buffers and torch's CPU
kernels' temporaries differ."""

STATE_FIELDS = ("weights_bytes", "gradients_bytes", "master_weights_bytes", "optimizer_states_bytes")


@dataclass(frozen=True, kw_only=True)
class Field:
    name: str
    predicted: float
    measured: float
    tolerance: float
    note: str = ""
    upper_bound: bool = False
    """The prediction is an upper bound here: ok when measured ≤ predicted (``tolerance`` unused)."""

    @property
    def rel_error(self) -> float:
        if self.predicted == 0:
            return 0.0 if self.measured == 0 else float("inf")
        return abs(self.measured - self.predicted) / self.predicted

    @property
    def ok(self) -> bool:
        if self.upper_bound:
            return self.measured <= self.predicted
        return self.rel_error <= self.tolerance + 1e-12

    def to_dict(self) -> dict:
        return {"name": self.name, "predicted": self.predicted, "measured": self.measured,
                "rel_error": self.rel_error, "tolerance": self.tolerance, "ok": self.ok, "note": self.note,
                "upper_bound": self.upper_bound}


def predict(spec, cfg: TrainConfig, world_size: int, *, cuda: bool = False) -> dict:
    """The calculator's figures for one rank of the run."""
    from trainmath.flops import count_flops
    from trainmath.memory.training import TrainingSetup, training_memory

    batch = cfg.micro_batch_for(world_size)
    setup = TrainingSetup(micro_batch=batch, seq=cfg.seq, precision=cfg.precision,
                          optimizer=CALCULATOR_OPTIMIZER[cfg.optimizer], optimizer_impl="foreach",
                          recompute=cfg.recompute, micro_batches=cfg.grad_accum, granularity=512 if cuda else 1)
    report = training_memory(spec, setup, ParallelLayout(dp=world_size, zero=cfg.zero))
    # Model states as they stand at the optimizer step, where all of them exist (with zero_grad's set_to_none
    # the gradients are absent at a peak in the forward); the peak is the timeline's maximum.
    at_step = report.stages[report.stage].at("optimizer step")
    flat = {c.name: c.value for c in at_step.children}
    unsharded = training_memory(spec, setup, ParallelLayout(dp=world_size, zero=0))
    whole_states = next(c.value for c in unsharded.breakdown.children if c.name == "optimizer_states_bytes")
    # count_flops' "selective" is Korthikanti's (the attention core again); the runtime's is torchtitan's op-level
    # policy: SDPA cached, every second mm (and each biased linear) recomputed (ops.selective)
    flops = count_flops(spec, batch=batch * cfg.grad_accum, seq=cfg.seq,
                        recompute="none" if cfg.recompute == "selective" else cfg.recompute)
    core = sum(part.flat()["attention_core"] for part in (flops.forward, flops.backward, flops.recomputed))
    gemm = flops.training_flops - core
    if cfg.recompute == "selective":
        from trainmath.ops.selective import selective_recompute_flops

        gemm += selective_recompute_flops(spec, batch=batch * cfg.grad_accum, seq=cfg.seq)
    return {**{k: flat[k] for k in STATE_FIELDS}, "peak_bytes": report.peak_bytes,
            "gemm_flops": gemm, "attention_core_flops": core,
            "optimizer_states_bytes_unsharded": whole_states, "breakdown": flat,
            "conventions": list(report.conventions)}


def compare(predicted: dict, measured: dict[int, dict], cfg: TrainConfig) -> list[Field]:
    """Fields of every rank (``measured``: rank → that rank's measurement) against the prediction."""
    fields: list[Field] = []
    ranks = sorted(measured)
    zero_redundancy = cfg.strategy == "zero1" and cfg.impl == "torch"
    for name in STATE_FIELDS:
        if name == "optimizer_states_bytes" and zero_redundancy:
            total = sum(measured[r].get(name, 0) for r in ranks)
            fields.append(Field(name=f"{name} (sum over ranks)", predicted=predicted[f"{name}_unsharded"],
                                measured=total, tolerance=0.0,
                                note="ZeroRedundancyOptimizer gives whole parameters to ranks: their states sum to "
                                     "the unsharded (ZeRO-0) states"))
            continue
        fsdp_states = name == "optimizer_states_bytes" and cfg.impl == "torch" and cfg.zero >= 2
        for r in ranks:
            bound = fsdp_states and r > 0
            fields.append(Field(name=f"{name} (rank {r})", predicted=predicted[name],
                                measured=measured[r].get(name, 0), tolerance=0.0, upper_bound=bound,
                                note="FSDP2's optimizer states follow the unpadded local shard" if bound else ""))
    for r in ranks:
        m = measured[r]
        fields.append(Field(name=f"gemm_flops (rank {r})", predicted=predicted["gemm_flops"],
                            measured=m["training_flops"] - m["attention_core_flops"], tolerance=0.0,
                            note="every matmul but the attention core, FlopCounterMode"))
        fields.append(Field(name=f"attention_core_flops (rank {r})", predicted=predicted["attention_core_flops"],
                            measured=m["attention_core_flops"], tolerance=ATTENTION_TOLERANCE,
                            note="flash backward recomputes QKᵀ (2.5× forward; the calculator counts 2×)"))
    for r in ranks:
        fields.append(Field(name=f"peak_bytes (rank {r})", predicted=predicted["peak_bytes"],
                            measured=measured[r]["peak_bytes"], tolerance=PEAK_TOLERANCE,
                            note="MemTracker (CPU)" if not measured[r].get("cuda") else "max_memory_allocated"))
    return fields
