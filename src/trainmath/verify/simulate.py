"""A second opinion from the real code: one training step of the user's config, at full width, on fake tensors.

``simulate`` builds the transformers model inside ``torch._subclasses.fake_tensor.FakeTensorMode`` (tensors with
shapes and dtypes but no storage, so a 8B model costs no memory), runs the same step the calculator models —
``out = model(ids, labels=ids); out.loss.backward(); opt.step(); opt.zero_grad()`` — twice under
``torch.distributed._tools.mem_tracker.MemTracker`` (``reset_mod_stats()`` before the measured one) and returns
the peak of every kind of tensor MemTracker tracks. It runs on the CPU: compare it with ``device="cpu"``.

With ``--zero 3 --dp W`` it simulates rank 0 of an FSDP2 run (``fully_shard`` per decoder layer and at the root,
``reshard_after_forward=True``) over a fake process group of W ranks (``dist.init_process_group("fake")``, the
device mesh made outside the fake mode) under ``FSDPMemTracker``. With ``--tp N`` (``--sp``, ``--vocab-parallel``)
it simulates rank 0 of a tensor-parallel run over a fake process group of N ranks: the model built inside the
fake mode and split by ``trainmath.runtime.tensor_parallel.apply_tp`` (torchtitan's plans on transformers'
decoder layers), the loss under ``loss_parallel()`` when vocabulary-parallel, under ``MemTracker``.

One deviation from an eager run, and why: transformers treats fake tensors as tracing, so it cannot check the
position ids for packed sequences and builds an explicit attention mask (then SDPA repeats K/V for GQA). An eager
run of an unpacked batch finds no packing and runs SDPA with ``is_causal``; ``find_packed_sequence_indices`` is
patched to say so for the duration of the step (the tests check the fake step against a real one, op for op).
A second, for TP and FSDP2 (both step DTensors): DTensor infers each op's global output shape by running it on fake
tensors of the ambient fake mode (``_sharding_prop.detect_fake_mode() or FakeTensorMode()``), cached per op and
arguments. In a real run that
is a private mode whose tensors MemTracker does not count; under the simulation's own fake mode they would be
counted, and AdamW's bias corrections change every step, so each step's optimizer ops miss the cache and add
global-shape transients (86,016 bytes more at the optimizer step of the tiny tp = 2 test model; under FSDP2 the
for-loop AdamW's first step, whose states are made lazily on DTensor shards, rose 655,232 B above the second on
the tiny dp = 2 Qwen3 of ``tests/memory/test_fsdp2_first_step.py``).
``detect_fake_mode`` is patched for the duration of the step so that the propagation gets a private mode, as it
does in a real run.

Routed experts run transformers' own code: the eager loop under a routing the result states (``routing``), an
amp-bf16 ``grouped_mm`` in fp32 as the CUDA and CPU kernels run it (``trainmath.verify.fake_experts`` says what is
added to the fake mode and why).

torch and transformers are imported inside the functions: the calculator never needs them.
"""

from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass, field

from trainmath.errors import TrainmathError
from trainmath.layout import ParallelLayout
from trainmath.memory.training import TrainingSetup
from trainmath.verify.fake_experts import grouped_mm_rule, routing_standin
from trainmath.verify.mixed import MasterWeights
from trainmath.verify.segments import Segments, segment_text
from trainmath.vocabulary import TRAIN_PRECISIONS

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
    saved_bytes: int | None = None
    """What the first step's forward saved for backward (distinct non-parameter storages still held when it ends,
    ``saved_counter``): the calculator's activations plus the saved part of the logits. None under FSDP2 and
    with recompute."""
    routing: tuple[str, ...] = ()
    """The routing the eager expert loop ran with (``fake_experts.routing_standin``), in words; empty without
    eager experts."""
    loop: str = ""
    """How the step was run, in words (the precision's loop: ``LOOPS``)."""
    peak_segment: str = ""
    """Where the peak fell: step, phase, the layer's position class and the innermost module
    (``segments.Segments``)."""
    folded: str = ""
    """With ``--simulate-layers``: which layer counts were simulated and how the rest was folded in."""
    layers: int = 0
    """Decoder layers of the model simulated (all of them unless ``--simulate-layers``)."""
    segments: dict = field(default_factory=dict, compare=False, repr=False)
    """Segment → (peak bytes, MemTracker's kinds then): ``segments.Segments.peaks``."""
    layer_seconds: float = 0.0
    """Wall seconds spent inside decoder layers (the rest of ``seconds`` is the model build, the head, the loss
    and the optimizer)."""

    def to_dict(self) -> dict:
        return {"peak_bytes": self.peak_bytes, "by_kind": self.by_kind, "buffers_bytes": self.buffers_bytes,
                "saved_bytes": self.saved_bytes, "seconds": round(self.seconds, 2), "routing": list(self.routing),
                "loop": self.loop, "peak_segment": self.peak_segment, "folded": self.folded,
                "layers": self.layers}


LOOPS = {
    "fp32": "fp32 weights, grads and optimizer states",
    "amp-bf16": "fp32 weights under torch.autocast(bf16)",
    "bf16": "a bf16 model (weights, grads and optimizer states bf16)",
    "mixed-bf16": "a bf16 model with fp32 master weights in the optimizer, as Megatron-LM's "
                  "Float16OptimizerWithFloat16Params: each bf16 gradient copied to fp32 and freed before the step, "
                  "the masters copied back after it (trainmath.verify.mixed)",
    "mixed-bf16 fsdp2": "FSDP2's MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=fp32) over fp32 parameters, as "
                        "trainmath train runs it: the fp32 shards are the master weights",
}
"""The loop each precision runs (``Simulation.loop``)."""


def saved_counter(model):
    """``(pack, total)``: a ``saved_tensors_hooks`` pack hook, and the bytes of the distinct non-parameter
    storages it saw that are still alive (call after the forward). The method of
    ``tests/activations/test_hf_oracle.py::_measure``; storages are told apart by their ``StorageImpl`` (fake
    tensors have no data pointers), a DTensor by its local tensor's, a collective in flight by its buffer's."""
    import gc
    import weakref

    from torch.distributed._functional_collectives import AsyncCollectiveTensor
    from torch.distributed.tensor import DTensor

    def storage(t):
        while isinstance(t, (DTensor, AsyncCollectiveTensor)):
            t = t._local_tensor if isinstance(t, DTensor) else t.elem
        return t.untyped_storage()

    params = {storage(p)._cdata for p in model.parameters()}
    seen: dict[int, list] = {}

    def pack(t):
        st = storage(t)
        if st._cdata not in params:
            seen.setdefault(st._cdata, []).append((weakref.ref(t), st.nbytes()))
        return t

    def total() -> int:
        gc.collect()
        return sum(max((n for r, n in refs if r() is not None), default=0) for refs in seen.values())

    return pack, total


def check_simulable(setup: TrainingSetup, layout: ParallelLayout) -> None:
    """One ``TrainmathError`` for what the simulation cannot run."""
    bad = []
    if setup.precision not in TRAIN_PRECISIONS:  # the precisions trainmath train runs
        bad.append(f"--precision {setup.precision} (simulate {', '.join(TRAIN_PRECISIONS)})")
    if setup.optimizer not in OPTIMIZERS:
        bad.append(f"--optimizer {setup.optimizer} (simulate one of {', '.join(OPTIMIZERS)})")
    if setup.profile != "hf":
        bad.append("--profile megatron (the simulation runs transformers' code: --profile hf)")
    fsdp = layout.zero == 3 and layout.dp > 1 and layout.ranks == layout.dp
    tp = layout.tp > 1 and layout.ranks == layout.tp and not layout.zero and layout.ep == 1
    if not fsdp and not tp and (layout.ranks != 1 or layout.zero or layout.sp or layout.vocab_parallel):
        bad.append(f"layout {layout.describe()} (--simulate runs one device, one rank of FSDP2 with --zero 3 "
                   f"and --dp only, or one rank of --tp N with --sp / --vocab-parallel)")
    if (fsdp or tp) and setup.optimizer_impl != "forloop":
        bad.append(f"{'--zero 3' if fsdp else '--tp'} with --optimizer-impl {setup.optimizer_impl} (foreach and "
                   f"fused AdamW misbehave on fake DTensor shards: pass --optimizer-impl forloop)")
    if tp and setup.recompute == "full":
        bad.append("--tp with --recompute full (transformers' checkpointing of DTensor layers is not simulated)")
    if setup.offload != "none" or (setup.micro_batches or 1) > 1 or setup.grad_lifetime == "accumulate":
        bad.append("--offload / --micro-batches / --grad-lifetime accumulate (one plain step only)")
    if setup.precision == "mixed-bf16" and tp:
        bad.append("--tp with --precision mixed-bf16 (the tensor-parallel simulation has no master weights)")
    if setup.precision == "mixed-bf16" and not fsdp and setup.grad_lifetime == "zero":
        bad.append("--precision mixed-bf16 with --grad-lifetime zero on one device (the master-weight loop frees "
                   "each bf16 gradient as it copies it)")
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
             moe: bool = False, layers: int | None = None, progress=None, position=None) -> Simulation:
    """MemTracker's peak of one step of ``config`` on fake CPU tensors (``moe``: the model has routed experts,
    run by ``setup.experts``'s path; ``layers``: build only that many decoder layers; ``progress``: called with
    a line per decoder layer entered, ``segments.Segments``; ``position``: the layers' position classes there)."""
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
    tp = layout.tp > 1
    cfg = hf_config(config)
    cfg = cfg.get_text_config()  # a multimodal wrapper (Llama-4): its text model, as the calculator reads it
    if layers is not None:
        cfg.num_hidden_layers = layers
        if isinstance(getattr(cfg, "layer_types", None), list):
            cfg.layer_types = cfg.layer_types[:layers]
    if tp:
        from trainmath.runtime.tensor_parallel import apply_tp, check_tp, loss_context

        check_tp(cfg, layout.tp)
    if fsdp or tp:
        import torch.distributed as dist
        from torch.distributed._tools.fsdp2_mem_tracker import FSDPMemTracker
        from torch.distributed.device_mesh import init_device_mesh
        from torch.testing._internal.distributed.fake_pg import FakeStore

        if dist.is_initialized():
            raise TrainmathError(f"--simulate {'--zero 3' if fsdp else '--tp'} needs its own process group; "
                                 f"torch.distributed is already initialised in this process")
        dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=layout.ranks)
    kw = {"attn_implementation": setup.attention}
    if moe:
        kw["experts_implementation"] = "grouped_mm" if setup.experts == "grouped" else "eager"
    mixed = setup.precision == "mixed-bf16"
    dtype = torch.bfloat16 if setup.precision == "bf16" or (mixed and not fsdp) else torch.float32
    opt_kw = {"forloop": {"foreach": False}, "foreach": {"foreach": True}, "fused": {"fused": True}}[
        setup.optimizer_impl]
    start = time.perf_counter()
    saved = masking.find_packed_sequence_indices
    masking.find_packed_sequence_indices = lambda position_ids: None  # an unpacked batch (module docstring)
    if fsdp or tp:
        import torch.distributed.tensor._sharding_prop as prop

        detect = prop.detect_fake_mode
        prop.detect_fake_mode = lambda *a: None  # as in a real run (module docstring)
    try:
        mesh = init_device_mesh("cpu", (layout.ranks,)) if fsdp or tp else None  # outside the fake mode
        with FakeTensorMode() as mode:
            model = transformers.AutoModelForCausalLM.from_config(cfg, dtype=dtype, **kw)
            model.train()
            decoder = list(model.model.layers if hasattr(model, "model") else model.transformer.h)
            if setup.recompute == "full":
                model.gradient_checkpointing_enable()
            elif setup.recompute == "selective":  # torchtitan's op-level policy (trainmath.runtime.checkpointing)
                from trainmath.runtime.checkpointing import apply_selective

                apply_selective(model)
            if fsdp:  # the runtime's wrapping: an fp32 router in a bf16 model is its own unit (runtime.fsdp)
                from torch.distributed.fsdp import MixedPrecisionPolicy

                from trainmath.runtime.fsdp import shard_model

                mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32) if mixed else \
                    MixedPrecisionPolicy()
                shard_model(model, list(decoder), mesh=mesh, reshard_after_forward=True, mp_policy=mp)
            if tp:
                apply_tp(model, mesh, sp=layout.sp, vocab_parallel=layout.vocab_parallel)
            loss_ctx = (lambda: loss_context(layout.vocab_parallel)) if tp else contextlib.nullcontext
            masters = MasterWeights(model) if mixed and not fsdp else None
            params = masters.main_params if masters else model.parameters()
            if setup.optimizer in ("adam", "adamw"):
                opt = getattr(torch.optim, "AdamW" if setup.optimizer == "adamw" else "Adam")(params, lr=1e-4,
                                                                                              **opt_kw)
            else:
                opt = torch.optim.SGD(params, lr=1e-4, momentum=0.9 if setup.optimizer == "sgd-momentum" else 0,
                                      **opt_kw)
            amp = setup.precision == "amp-bf16"

            pack, saved_total = saved_counter(model)
            held = []

            def step(count: bool = False) -> None:
                ids = torch.randint(0, cfg.vocab_size, (setup.micro_batch, setup.seq))
                hooks = torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t) if count else \
                    contextlib.nullcontext()
                inside = setup.backward_in_autocast
                with loss_ctx():
                    with torch.autocast("cpu", dtype=torch.bfloat16) if amp else contextlib.nullcontext():
                        with hooks:
                            out = model(input_ids=ids, labels=ids, use_cache=False)
                        if count:
                            held.append(saved_total())
                        loss = out.loss
                        if setup.loop_keeps == "loss":  # loss = model(...).loss: the output dies here
                            del out
                        if inside:  # backward() inside the autocast context: its cache lives on
                            loss.backward()
                    if not inside:
                        loss.backward()
                if masters:  # Megatron's Float16OptimizerWithFloat16Params.step (trainmath.verify.mixed)
                    masters.copy_model_grads_to_main_grads()
                opt.step()
                if masters:
                    masters.copy_main_params_to_model_params()
                    masters.zero_grad(set_to_none=setup.grad_lifetime == "set_to_none")
                opt.zero_grad(set_to_none=setup.grad_lifetime == "set_to_none")

            if fsdp:
                mt = FSDPMemTracker(model, opt)
            else:
                mt = MemTracker()
                mt.track_external(model, *([masters.module] if masters else []), opt)
            names = dict(model.named_modules())
            segments = Segments({f"{type(model).__name__}.{n}": i for i, n in enumerate(
                n for n, m in names.items() for d in decoder if m is d)}, progress=progress, position=position)
            segments.install(mt)
            routing: list[str] = []
            with mt, routing_standin(mode, model, routing), grouped_mm_rule():
                # the warm-up step counts what it saves (not under FSDP2, whose unsharded weights are not the
                # module's parameters, nor with checkpointing, whose own hooks take the layers' tensors)
                segments.step = 1
                step(count=not fsdp and setup.recompute == "none")
                mt.reset_mod_stats()
                segments.step = 2
                step()
                peak = mt.get_tracker_snapshot("peak")
            buffers = sum(b.untyped_storage().nbytes() for b in model.buffers())
    finally:
        masking.find_packed_sequence_indices = saved
        if fsdp or tp:
            prop.detect_fake_mode = detect
        if fsdp or tp:
            dist.destroy_process_group()
            from trainmath.runtime import dtensor_state

            dtensor_state.forget()  # its meshes were rank 0's (runtime.dtensor_state)
    snap = next(iter(peak.values()))
    kinds = {str(getattr(k, "value", k)): v for k, v in snap.items() if str(getattr(k, "value", k)) != "Total"}
    at = max(segments.peaks, key=lambda k: segments.peaks[k][0])
    return Simulation(peak_bytes=snap["Total"], by_kind=kinds, buffers_bytes=buffers,
                      saved_bytes=held[0] if held else None, routing=tuple(routing),
                      seconds=time.perf_counter() - start,
                      loop=LOOPS["mixed-bf16 fsdp2" if mixed and fsdp else setup.precision],
                      peak_segment=segment_text(at), layers=len(decoder), segments=dict(segments.peaks),
                      layer_seconds=segments.layer_s)

