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
- ``attention_core_flops``: ``ATTENTION_TOLERANCE`` — the attention kernels (QKᵀ and PV); 0 where SDPA takes its
  math fallback (dropout on the CPU, e.g. GPT-2; fewer key than query heads without ``enable_gqa``), whose two
  matmuls are in ``gemm_flops``. The calculator counts
  their backward as 2× forward (four GEMMs); torch's SDPA formula for flash attention, whose backward recomputes
  QKᵀ, counts 2.5× (five), so the measured figure is 7/6 of the predicted one without recompute.
- ``collective_bytes``: 0 — the buffer bytes of each data-parallel collective in one step, per rank
  (``trainmath.comm.volume``): DDP's bucket all-reduces (also under torch's ZeRO-1), our ZeRO's reduce-scatters
  and all-gathers of flat padded buffers. Not compared: FSDP2's collectives and ZeroRedundancyOptimizer's
  parameter broadcasts, which the runtime does not count.
- ``peak_bytes``: ``peak_tolerance`` of the run (the measured peak of the step; ``docs/benchmarks.md``).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from trainmath.layout import ParallelLayout
from trainmath.runtime.train.config import TrainConfig

ATTENTION_TOLERANCE = 0.2
"""Flash attention's recomputed QKᵀ in backward: 3.5/3 − 1 ≈ 0.17 (see the module docstring)."""

PEAK_TOLERANCE = {"modelled": 0.05, "fsdp2_gloo": 0.10}
"""Relative tolerance of the measured peak (measured on gloo ranks, ``tests/train/test_measure.py`` and
``benchmarks/train_verify.py``): within 5% for every strategy — DDP, torch's ZeRO-1 (DDP +
ZeroRedundancyOptimizer), torch's ZeRO-2/3 (FSDP2, ``memory/fsdp2.py``) and our ZeRO-1/2/3
(``zero_impl="trainmath"``): within 0.1% on the benchmark's model, where the peak is the loss's backward, a
recomputed layer, our ZeRO-1's reduce or an FSDP2 unit's all-gather (0.6% on the tests' tinier model); up to 3%
above on that model, where our ZeRO-2/3 peak at a layer's reduce-scatter, inside its backward (its last gradient is
the input norm's: op-level transients of the layer's first ops are not events). Bytes-level rests: one ``step``
scalar per tensor where our optimizer has one per flat shard; ZeroRedundancyOptimizer's whole-parameter shares
(ranks ±0.6% apart). FSDP2 had been 1–10% below (its ZeRO-3 timeline counted no all-gather buffer beside the
unsharded parameters, nor the root's unsharded gradients through backward; its ZeRO-2 was DeepSpeed's).
``fsdp2_gloo`` (torch's FSDP2 over gloo): within 10% on any one rank. FSDP2 frees a unit's all-gather and
reduce-scatter buffers when their async work is waited on; on loaded CPU cores a rank's collective can complete a
unit late, so that rank holds one more unit's buffer at its peak (seen in CI: one rank of four 8.9% above, the
others within 0.7%; on an idle machine every rank within 0.1%). The calculator models the schedule with each
collective done when FSDP2 waits for it."""


def zero_impl(cfg: TrainConfig) -> str:
    """The calculator's ``zero_impl`` of the run: ours, torch's FSDP2 (ZeRO-2/3), or DeepSpeed's buffers, which
    torch's ZeRO-1 matches (DDP's buckets)."""
    if cfg.impl == "trainmath":
        return "trainmath"
    return "fsdp2" if cfg.zero >= 2 else "deepspeed"


def peak_tolerance(cfg: TrainConfig) -> tuple[float, str]:
    """(tolerance, its key in ``PEAK_TOLERANCE``) of the run's peak."""
    key = "fsdp2_gloo" if zero_impl(cfg) == "fsdp2" else "modelled"
    return PEAK_TOLERANCE[key], key


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


def training_setup(cfg: TrainConfig, world_size: int, *, cuda: bool = False):
    """The run's step (``TrainConfig.step``) on ``world_size`` ranks of the device it ran on, with the ZeRO buffers
    its strategy holds (see ``predict``)."""
    return replace(cfg.step, micro_batch=cfg.micro_batch_for(world_size), granularity=512 if cuda else 1,
                   device="cuda" if cuda else "cpu", zero_impl=zero_impl(cfg))


def predict(spec, cfg: TrainConfig, world_size: int, *, cuda: bool = False) -> dict:
    """The calculator's figures for one rank of the run."""
    from trainmath.flops import count_flops
    from trainmath.memory.training import training_memory

    batch = cfg.micro_batch_for(world_size)
    # The run's step as the timeline describes it: torch's optimizers forced onto (and ours written as) the
    # single-tensor path; the loop keeps only the loss (``loss = model(...).loss``); on gloo every tensor is on
    # the CPU, step scalars included; our ZeRO's flat buffers (torch's ZeRO-1 holds DDP's buckets, which is
    # DeepSpeed's bucket on models below 5e8 parameters; torch's ZeRO-2/3 is FSDP2: ``zero_impl="fsdp2"``).
    setup = training_setup(cfg, world_size, cuda=cuda)
    layout = ParallelLayout(dp=world_size, zero=cfg.zero)
    report = training_memory(spec, setup, layout)
    fsdp_or_deepspeed = "fsdp2" if setup.zero_impl == "fsdp2" else "deepspeed"
    # Model states as they stand at the optimizer step, where all of them exist (with zero_grad's set_to_none
    # the gradients are absent at a peak in the forward); the peak is the timeline's maximum. The measured
    # optimizer states leave out the 0-dim step counters (measure.py), which device "cuda" does not count; the
    # gradients are measured as backward leaves them, before our ZeRO-1 reduces them (DeepSpeed's step has them).
    states = training_memory(spec, replace(setup, device="cuda", zero_impl=fsdp_or_deepspeed), layout)
    at_step = states.stages[states.stage].at("optimizer step")
    flat = {c.name: c.value for c in at_step.children}
    unsharded = training_memory(spec, replace(setup, device="cuda", zero_impl="deepspeed"),
                                ParallelLayout(dp=world_size, zero=0))
    whole_states = next(c.value for c in unsharded.breakdown.children if c.name == "optimizer_states_bytes")
    # count_flops' "selective" is Korthikanti's (the attention core again); the runtime's is torchtitan's op-level
    # policy: SDPA cached, every second mm (and each biased linear) recomputed (ops.selective)
    flops = count_flops(spec, batch=batch * cfg.grad_accum, seq=cfg.seq,
                        recompute="none" if cfg.recompute == "selective" else cfg.recompute,
                        checkpoint="torch")  # transformers' gradient checkpointing: torch's, stopping early
    core = sum(part.flat()["attention_core"] for part in (flops.forward, flops.backward, flops.recomputed))
    gemm = flops.training_flops - core
    if _sdpa_math(spec, batch, cfg.seq, cuda):  # plain matmuls, which FlopCounterMode counts as GEMMs
        gemm, core = gemm + core, 0
    if cfg.recompute == "selective":
        from trainmath.flops.model import selective_recompute_flops

        gemm += selective_recompute_flops(spec, batch=batch * cfg.grad_accum, seq=cfg.seq)
    return {**{k: flat[k] for k in STATE_FIELDS}, "peak_bytes": report.peak_bytes,
            "collective_bytes": _collective_bytes(spec, cfg, layout),
            "gemm_flops": gemm, "attention_core_flops": core,
            "optimizer_states_bytes_unsharded": whole_states, "breakdown": flat,
            "conventions": list(report.conventions)}


def _sdpa_math(spec, batch: int, seq: int, cuda: bool) -> bool:
    """Whether the run's SDPA takes PyTorch's math fallback (``ops.kernels``: dropout on the CPU, GPT-2's
    ``attn_pdrop``; fewer key than query heads without ``enable_gqa``, Falcon-7B), read from the kernels of the op
    lists' attention: its Q·Kᵀ and P·V are ``bmm``s in the GEMM field, the attention core counts 0."""
    from trainmath.errors import TrainmathError
    from trainmath.memory.activations import activation_bytes

    try:
        act = activation_bytes(spec, micro_batch=batch, seq=seq, device="cuda" if cuda else "cpu")
    except TrainmathError:
        return False
    return "sdpa_math" in act.attention_kernels


def _collective_bytes(spec, cfg: TrainConfig, layout: ParallelLayout) -> dict | None:
    """The calculator's collective bytes per step and rank for the runs whose collectives the runtime counts."""
    from trainmath.comm.volume import dp_step_collective_bytes
    from trainmath.placement import place
    from trainmath.vocabulary import get_precision

    if cfg.impl == "torch" and cfg.zero >= 2:
        return None  # FSDP2: not counted by the runtime
    strategy = "trainmath" if cfg.impl == "trainmath" else "ddp"
    return dp_step_collective_bytes(place(spec, layout, 0), layout, get_precision(cfg.precision),
                                    strategy=strategy, micro_batches=cfg.grad_accum)


def collective_fields(predicted: dict, measured: dict[int, dict], note: str) -> list[Field]:
    """One exact field per rank and collective op: the predicted ``collective_bytes`` against the measured."""
    comm = predicted.get("collective_bytes")
    fields = []
    for r in sorted(measured) if comm else ():
        got = measured[r].get("collective_bytes", {})
        for op in sorted(set(comm) | set(got)):
            fields.append(Field(name=f"collective_bytes {op} (rank {r})", predicted=comm.get(op, 0),
                                measured=got.get(op, 0), tolerance=0.0, note=note))
    return fields


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
    fields += collective_fields(predicted, measured, "buffer bytes per step (nccl-tests' size), trainmath.comm.volume")
    return fields + peak_fields(cfg, predicted["peak_bytes"], measured, ranks)


def peak_fields(cfg: TrainConfig, predicted: int, measured: dict[int, dict], ranks) -> list[Field]:
    """Each rank's measured step peak against ``predicted``, at the run's ``peak_tolerance``."""
    tol, _ = peak_tolerance(cfg)
    return [Field(name=f"peak_bytes (rank {r})", predicted=predicted, measured=measured[r]["peak_bytes"],
                  tolerance=tol, note="MemTracker (CPU)" if not measured[r].get("cuda") else "max_memory_allocated")
            for r in ranks]
