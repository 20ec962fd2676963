"""A second opinion from the real code: one training step of the user's config, at full width, on fake tensors.

``simulate`` builds the transformers model inside ``torch._subclasses.fake_tensor.FakeTensorMode`` (tensors with
shapes and dtypes but no storage, so a 8B model costs no memory), runs the same step the calculator models —
``out = model(ids, labels=ids); out.loss.backward(); opt.step(); opt.zero_grad()`` — twice under
``torch.distributed._tools.mem_tracker.MemTracker`` (``reset_mod_stats()`` before the measured one) and returns
the peak of every kind of tensor MemTracker tracks. It runs on the CPU: compare it with ``device="cpu"``.

With ``--zero 3 --dp W`` it simulates rank 0 of an FSDP2 run (``fully_shard`` per decoder layer and at the root,
``reshard_after_forward=True``) over a fake process group of W ranks (``dist.init_process_group("fake")``, the
device mesh made outside the fake mode) under ``FSDPMemTracker``.

One deviation from an eager run, and why: transformers treats fake tensors as tracing, so it cannot check the
position ids for packed sequences and builds an explicit attention mask (then SDPA repeats K/V for GQA). An eager
run of an unpacked batch finds no packing and runs SDPA with ``is_causal``; ``find_packed_sequence_indices`` is
patched to say so for the duration of the step (the tests check the fake step against a real one, op for op).

torch and transformers are imported inside the functions: the calculator never needs them.
"""

from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass

from trainmath.errors import TrainmathError
from trainmath.layout import ParallelLayout
from trainmath.memory.training import TrainingSetup

DROP = ("quantization_config", "auto_map", "torch_dtype", "dtype", "architectures", "transformers_version")
"""Config keys that describe a checkpoint's files, not the model's shapes."""
OPTIMIZERS = ("adam", "adamw", "sgd", "sgd-momentum")


@dataclass(frozen=True, kw_only=True)
class Simulation:
    """MemTracker's peak of the measured step, by kind (its own names: Parameter, Gradient, Activation, ...)."""

    peak_bytes: int
    by_kind: dict
    buffers_bytes: int
    """Module buffers (rotary ``inv_freq``): in ``peak_bytes``, not in the calculator's prediction."""
    seconds: float

    def to_dict(self) -> dict:
        return {"peak_bytes": self.peak_bytes, "by_kind": self.by_kind, "buffers_bytes": self.buffers_bytes,
                "seconds": round(self.seconds, 2)}


def check_simulable(setup: TrainingSetup, layout: ParallelLayout) -> None:
    """One ``TrainmathError`` for what the simulation cannot run."""
    bad = []
    if setup.precision not in ("fp32", "amp-bf16", "bf16"):
        bad.append(f"--precision {setup.precision} (torch has no built-in fp32 master weights; simulate fp32, "
                   f"amp-bf16 or bf16)")
    if setup.optimizer not in OPTIMIZERS:
        bad.append(f"--optimizer {setup.optimizer} (simulate one of {', '.join(OPTIMIZERS)})")
    if setup.profile != "hf":
        bad.append("--profile megatron (the simulation runs transformers' code: --profile hf)")
    fsdp = layout.zero == 3 and layout.dp > 1 and layout.ranks == layout.dp
    if not fsdp and (layout.ranks != 1 or layout.zero):
        bad.append(f"layout {layout.describe()} (--simulate runs one device, or one rank of FSDP2 with --zero 3 "
                   f"and --dp only)")
    if fsdp and setup.optimizer_impl != "forloop":
        bad.append(f"--zero 3 with --optimizer-impl {setup.optimizer_impl} (foreach and fused AdamW misbehave on "
                   f"fake DTensor shards: pass --optimizer-impl forloop)")
    if setup.offload != "none" or (setup.micro_batches or 1) > 1 or setup.grad_lifetime == "accumulate":
        bad.append("--offload / --micro-batches / --grad-lifetime accumulate (one plain step only)")
    if bad:
        raise TrainmathError("--simulate cannot run " + "; ".join(bad))


def hf_config(config: dict):
    """A transformers config object of a Hugging Face config dict."""
    import transformers

    data = {k: v for k, v in config.items() if not k.startswith("_") and k not in DROP}
    model_type = data.pop("model_type", None)
    if not model_type:
        raise TrainmathError("the config has no model_type; --simulate needs one")
    return transformers.AutoConfig.for_model(model_type, **data)


def simulate(config: dict, setup: TrainingSetup, layout: ParallelLayout = ParallelLayout(), *,
             moe: bool = False) -> Simulation:
    """MemTracker's peak of one step of ``config`` on fake CPU tensors (``moe``: the model has routed experts,
    run by ``setup.experts``'s path)."""
    check_simulable(setup, layout)
    try:
        import torch
        import transformers
        import transformers.masking_utils as masking
        from torch._subclasses.fake_tensor import FakeTensorMode
        from torch.distributed._tools.mem_tracker import MemTracker
    except ImportError as e:
        raise TrainmathError(f"--simulate needs torch and transformers ({e.name} is missing): "
                             f"pip install 'trainmath[runtime]' transformers") from None
    fsdp = layout.zero == 3 and layout.dp > 1
    if fsdp:
        import torch.distributed as dist
        from torch.distributed._tools.fsdp2_mem_tracker import FSDPMemTracker
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import fully_shard
        from torch.testing._internal.distributed.fake_pg import FakeStore

        if dist.is_initialized():
            raise TrainmathError("--simulate --zero 3 needs its own process group; torch.distributed is already "
                                 "initialised in this process")
        dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=layout.dp)
    if moe and setup.experts == "grouped" and setup.precision != "bf16":
        raise TrainmathError(f"--simulate with --experts grouped needs --precision bf16 (torch's fake-tensor "
                             f"_grouped_mm accepts bf16 only), got --precision {setup.precision}; or pass "
                             f"--experts eager")
    cfg = hf_config(config)
    kw = {"attn_implementation": setup.attention}
    if moe:
        kw["experts_implementation"] = "grouped_mm" if setup.experts == "grouped" else "eager"
    dtype = torch.bfloat16 if setup.precision == "bf16" else torch.float32
    opt_kw = {"forloop": {"foreach": False}, "foreach": {"foreach": True}, "fused": {"fused": True}}[
        setup.optimizer_impl]
    start = time.perf_counter()
    saved = masking.find_packed_sequence_indices
    masking.find_packed_sequence_indices = lambda position_ids: None  # an unpacked batch (module docstring)
    try:
        mesh = init_device_mesh("cpu", (layout.dp,)) if fsdp else None  # outside the fake mode
        with FakeTensorMode():
            model = transformers.AutoModelForCausalLM.from_config(cfg, dtype=dtype, **kw)
            model.train()
            if setup.recompute == "full":
                model.gradient_checkpointing_enable()
            elif setup.recompute == "selective":  # torchtitan's op-level policy (trainmath.runtime.checkpointing)
                from trainmath.runtime.checkpointing import apply_selective

                apply_selective(model)
            if fsdp:
                layers = model.model.layers if hasattr(model, "model") else model.transformer.h
                for layer in layers:
                    fully_shard(layer, mesh=mesh, reshard_after_forward=True)
                fully_shard(model, mesh=mesh)
            params = model.parameters()
            if setup.optimizer in ("adam", "adamw"):
                opt = getattr(torch.optim, "AdamW" if setup.optimizer == "adamw" else "Adam")(params, lr=1e-4,
                                                                                              **opt_kw)
            else:
                opt = torch.optim.SGD(params, lr=1e-4, momentum=0.9 if setup.optimizer == "sgd-momentum" else 0,
                                      **opt_kw)
            amp = setup.precision == "amp-bf16"

            def step() -> None:
                ids = torch.randint(0, cfg.vocab_size, (setup.micro_batch, setup.seq))
                with torch.autocast("cpu", dtype=torch.bfloat16) if amp else contextlib.nullcontext():
                    out = model(input_ids=ids, labels=ids, use_cache=False)
                out.loss.backward()
                opt.step()
                opt.zero_grad(set_to_none=setup.grad_lifetime == "set_to_none")

            if fsdp:
                mt = FSDPMemTracker(model, opt)
            else:
                mt = MemTracker()
                mt.track_external(model, opt)
            with mt:
                step()
                mt.reset_mod_stats()
                step()
                peak = mt.get_tracker_snapshot("peak")
            buffers = sum(b.untyped_storage().nbytes() for b in model.buffers())
    finally:
        masking.find_packed_sequence_indices = saved
        if fsdp:
            dist.destroy_process_group()
    snap = next(iter(peak.values()))
    kinds = {str(getattr(k, "value", k)): v for k, v in snap.items() if str(getattr(k, "value", k)) != "Total"}
    return Simulation(peak_bytes=snap["Total"], by_kind=kinds, buffers_bytes=buffers,
                      seconds=time.perf_counter() - start)
