"""A LoRA / QLoRA run's prediction and its comparison with what the ranks measured (``trainmath verify --peft``).

The calculator's side is the adapter ledger (``trainmath.adapters``, equal to peft's counts), the optimizer's
state formulas (``memory.optimizers``), the per-tensor dim-0 sharding of FSDP2 (``memory.states``) and, for QLoRA,
bitsandbytes' 4-bit storage (``trainmath.qlora``). Pure Python: no torch here.

Fields (tolerance 0: exact integers), every rank:

- ``trainable_params``, ``adapter_params``, ``total_params``: peft's ``get_nb_trainable_parameters()`` on the
  rank's ``PeftModel`` (and the numel of its ``lora_`` parameters) against ``trainmath params --peft``.
- ``weights_bytes`` (the adapters), ``gradients_bytes``, ``optimizer_states_bytes``: the adapters only, at
  ``--lora-dtype``; under FSDP2 each adapter's shard, ``ceil_div(rows, world)`` rows (padded storage), and, as
  for full training, FSDP2's optimizer states follow the unpadded local shard (exact on rank 0, an upper bound on
  the others); ZeroRedundancyOptimizer's states summed over ranks equal the unsharded ones.
- ``collective_bytes all_reduce`` (DDP, and DDP under ZeroRedundancyOptimizer): the adapters' gradient bytes,
  once a step.
- ``frozen_weights_bytes``: the base, as full training's weights of the same layout (LoRA), or with every
  ``nn.Linear`` but the output layer as NF4's packed uint8 (QLoRA); ``quant_state_bytes``: their absmax (uint8,
  double-quantized), nested absmax, offsets and code tables (``qlora.nf4_storage``).

- ``peak_bytes``: where the calculator models the fine-tune's step (``memory.peft``, when present), within the
  run's peak tolerance (``verify.train.peak_tolerance``): 5% on DDP and ZeroRedundancyOptimizer, FSDP2's 10% on
  gloo (``FSDP2_GLOO``: the CPU run is compared with the CPU timeline, as full training's is); otherwise printed as
  measured, with the calculator's reason.
- ``gemm_flops`` (exact: every matmul but the attention core): where the calculator counts the fine-tune's FLOPs
  (``flops.peft``, when present), for LoRA without recompute; otherwise printed as measured, with the reason (QLoRA:
  bitsandbytes' 4-bit matmul is invisible to FlopCounterMode). The attention core is printed as measured
  (``predicted_flops`` says why).
"""

from __future__ import annotations

from trainmath.adapters import adapter_report, linear_modules, select
from trainmath.arith import ceil_div
from trainmath.memory.optimizers import optimizer_state_bytes
from trainmath.qlora import nf4_storage
from trainmath.runtime.train.config import TrainConfig
from trainmath.vocabulary import optimizer_name

ADAPTER_BYTES = {"fp32": 4, "bf16": 2, "fp16": 2}
MEASURED_ONLY = ("peak_bytes", "training_flops", "attention_core_flops")
"""What the run measures of a fine-tune and may not predict: the peak is compared where the calculator models
the fine-tune's step (``predicted_peak``)."""


FSDP2_GLOO = ("the FSDP2 fine-tune's peak on gloo ranks is compared with the calculator's CPU timeline (granularity "
              "1, every tensor on the CPU) at the fsdp2_gloo tolerance, as full training's: FSDPMemTracker over a "
              "fake process group of the same model gives the gloo ranks' peak to the bytes of the loop's loss, so "
              "the gloo process holds nothing the timeline should add; what stays (<1% on the tests' models) is a "
              "LoRA Linear's forward sum, an op-level transient the timeline does not make an event")
"""Why the FSDP2 peak is compared as it is."""
FSDP2_NOTE = "FSDP2 over gloo against the CPU timeline, at full training's fsdp2_gloo tolerance"


def predicted_peak(spec, cfg: TrainConfig, world_size: int, *, cuda: bool = False) -> tuple[int | None, str]:
    """(the calculator's peak of the fine-tune's step, "") where ``memory.peft`` models the run, else (None, why
    not)."""
    from dataclasses import replace

    from trainmath.errors import TrainmathError
    from trainmath.layout import ParallelLayout
    from trainmath.memory.training import training_memory
    from trainmath.verify.train import training_setup

    try:
        from trainmath.memory.peft import PeftRun
    except ImportError:
        return None, "this version of the calculator has no fine-tune step timeline"
    setup = replace(training_setup(cfg, world_size, cuda=cuda), peft=PeftRun(job=cfg.peft))
    if sharded(cfg) and any(b.kind == "moe" for ly in spec.layers for b in ly.blocks):
        return None, ("FSDP2 with frozen routed experts: their backward is not modelled (measured 11% above the "
                      "timeline on the tests' Mixtral)")
    try:
        return training_memory(spec, setup, ParallelLayout(dp=world_size, zero=cfg.zero)).peak_bytes, ""
    except TrainmathError as e:
        return None, str(e)


def predicted_flops(spec, cfg: TrainConfig, world_size: int, *, cuda: bool = False) -> tuple[dict | None, str]:
    """({gemm_flops} of one rank's step, "") where ``flops.peft`` counts the run, else (None, why not). As for
    full training, SDPA's math fallback runs the attention core as GEMMs. The attention core itself is not
    compared: SDPA's backward kernel computes the gradients of q, k and v whichever of them needs one (and torch's
    formula counts them all), while the fine-tune count keeps each operand's gradient only where it is needed, as
    eager attention's ``bmm``s run."""
    from trainmath.errors import TrainmathError
    from trainmath.verify.train import _sdpa_math

    try:
        from trainmath.flops.peft import peft_flops
    except ImportError:
        return None, "this version of the calculator has no fine-tune FLOPs"
    if cfg.recompute != "none":  # flops.peft counts Megatron's whole-layer recompute; torch's checkpoint stops early
        return None, f"--recompute {cfg.recompute}: the calculator's fine-tune recompute is Megatron's whole layer"
    if cfg.peft.method == "qlora":
        return None, ("QLoRA: bitsandbytes' 4-bit matmul is its own operator, which FlopCounterMode does not count "
                      "(the measured figure lacks the base's GEMMs)")
    batch = cfg.micro_batch_for(world_size)
    try:
        f = peft_flops(spec, cfg.peft, batch=batch * cfg.grad_accum, seq=cfg.seq).report
    except TrainmathError as e:
        return None, str(e)
    core = sum(part.flat().get("attention_core", 0) for part in (f.forward, f.backward, f.recomputed))
    gemm = f.training_flops - core
    if _sdpa_math(spec, batch, cfg.seq, cuda):
        gemm, core = gemm + core, 0
    return {"gemm_flops": gemm}, ""


def measured_only(predicted: dict, measured: dict[int, dict]) -> dict:
    """What the run measured and the prediction lacks: {field: {rank: value}}, with why not."""
    keys = [k for k in MEASURED_ONLY if not (k == "peak_bytes" and predicted.get("peak_bytes") is not None)
            and not (k == "training_flops" and predicted.get("flops") is not None)]
    out = {k: {r: m[k] for r, m in measured.items() if k in m} for k in keys}
    if "peak_bytes" in out:
        out["peak_bytes_why_not_predicted"] = predicted.get("peak_note", "")
    if "training_flops" in out:
        out["flops_why_not_predicted"] = predicted.get("flops_note", "")
    out["attention_core_flops_why_not_predicted"] = ("SDPA's backward computes every operand's gradient; the "
                                                     "fine-tune count is eager attention's, per operand needed")
    return out


def adapter_shapes(spec, cfg: TrainConfig) -> list[tuple[int, int]]:
    """Every adapter weight's shape, (rows, cols) as torch stores it: lora_A (r, in), lora_B (out, r)."""
    job = cfg.peft
    out = []
    for m in select(spec, job):
        r = job.rank * m.rank_mult
        out += [(r, m.in_features), (m.out_features, r)] * m.count
    return out


def sharded(cfg: TrainConfig) -> bool:
    """FSDP2 (``--strategy zero2|zero3 --impl torch``) shards every parameter on dim 0."""
    return cfg.zero >= 2


def predict_peft(spec, cfg: TrainConfig, world_size: int, full: dict, *, cuda: bool = False) -> dict:
    """The calculator's figures for one rank of the fine-tune; ``full`` is ``verify.train.predict`` of the same
    run as full training (its frozen base is full training's weights)."""
    from trainmath.params import count_params

    job = cfg.peft
    report = adapter_report(spec, job, count_params(spec).total_params)
    elt = ADAPTER_BYTES[job.dtype]
    shapes = adapter_shapes(spec, cfg)
    local = [(ceil_div(r, world_size), c) for r, c in shapes] if sharded(cfg) else shapes
    adapter_bytes = sum(r * c for r, c in local) * elt
    opt = optimizer_name(cfg.optimizer)
    frozen, quant = full["weights_bytes"], 0
    if job.method == "qlora":  # QLoRA runs on DDP / ZeroRedundancyOptimizer only: nothing sharded
        wbytes = 2 if cfg.precision == "bf16" else 4
        for m in linear_modules(spec).values():
            n = m.in_features * m.out_features
            parts = nf4_storage(n)
            frozen += (parts["packed"] - n * wbytes) * m.count
            quant += (parts["total"] - parts["packed"]) * m.count
    return {"trainable_params": report.trainable_params, "adapter_params": report.adapter_params,
            "total_params": report.total_params, "weights_bytes": adapter_bytes, "gradients_bytes": adapter_bytes,
            "optimizer_states_bytes": optimizer_state_bytes(opt, local, state_bytes=elt, device_only=True),
            "optimizer_states_bytes_unsharded": optimizer_state_bytes(opt, shapes, state_bytes=elt,
                                                                      device_only=True),
            "frozen_weights_bytes": frozen, "quant_state_bytes": quant, "conventions": list(full["conventions"]),
            **dict(zip(("peak_bytes", "peak_note"), predicted_peak(spec, cfg, world_size, cuda=cuda))),
            **dict(zip(("flops", "flops_note"), predicted_flops(spec, cfg, world_size, cuda=cuda))),
            # DDP's buckets (also under ZeroRedundancyOptimizer) all-reduce the adapters' gradients once a step
            "collective_bytes": {"all_reduce": adapter_bytes} if cfg.zero < 2 else None}


def compare_peft(predicted: dict, measured: dict[int, dict], cfg: TrainConfig) -> list:
    """Fields of every rank against the prediction (``verify.train.Field``)."""
    from trainmath.verify.train import Field, collective_fields

    fields = []
    ranks = sorted(measured)
    names = ["trainable_params", "adapter_params", "total_params", "weights_bytes", "gradients_bytes",
             "optimizer_states_bytes", "frozen_weights_bytes"]
    if cfg.peft.method == "qlora":
        names.append("quant_state_bytes")
    for name in names:
        if name == "optimizer_states_bytes" and cfg.strategy == "zero1":
            fields.append(Field(name=f"{name} (sum over ranks)", predicted=predicted[f"{name}_unsharded"],
                                measured=sum(measured[r].get(name, 0) for r in ranks), tolerance=0.0,
                                note="ZeroRedundancyOptimizer gives whole parameters to ranks: their states sum to "
                                     "the unsharded states"))
            continue
        for r in ranks:
            bound = name == "optimizer_states_bytes" and sharded(cfg) and r > 0
            fields.append(Field(name=f"{name} (rank {r})", predicted=predicted[name],
                                measured=measured[r].get(name, 0), tolerance=0.0, upper_bound=bound,
                                note="FSDP2's optimizer states follow the unpadded local shard" if bound else
                                "peft's get_nb_trainable_parameters()" if name in ("trainable_params", "total_params")
                                else ""))
    fields += collective_fields(predicted, measured, "DDP's gradient buckets: the adapters' gradients only")
    flops = predicted.get("flops")
    for r in ranks if flops else ():
        m = measured[r]
        fields.append(Field(name=f"gemm_flops (rank {r})", predicted=flops["gemm_flops"],
                            measured=m["training_flops"] - m["attention_core_flops"], tolerance=0.0,
                            note="every matmul but the attention core, FlopCounterMode"))
    if predicted.get("peak_bytes") is not None:
        from dataclasses import replace

        from trainmath.verify.train import peak_fields

        peaks = peak_fields(cfg, predicted["peak_bytes"], measured, ranks)
        fields += [replace(f, note=f"{f.note}; {FSDP2_NOTE}") for f in peaks] if sharded(cfg) else peaks
    return fields
