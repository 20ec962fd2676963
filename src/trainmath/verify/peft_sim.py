"""MemTracker's peak of one LoRA step of transformers' real modeling code wrapped by peft, on the CPU: real tensors
of a small config, or fake tensors (``FakeTensorMode``, the model built inside the mode) at full width.

The loop: ``loss = model(input_ids=ids, labels=ids).loss`` (the logits die when the forward returns, as the HF
Trainer's), ``loss.backward()``, ``opt.step()``, ``opt.zero_grad()`` (set_to_none) with torch's AdamW (``foreach``)
over the trainable parameters; ``amp-bf16`` runs the forward under ``torch.autocast("cpu", bf16)`` and backward
after it exits; ``bf16`` casts the base to bf16 before peft wraps it (adapters fp32:
``autocast_adapter_dtype=True``). ``recompute`` full is transformers' ``gradient_checkpointing_enable``
(non-reentrant), selective ``runtime.checkpointing.apply_selective`` (torchtitan's op-level policy) on the peft
model; either turns ``enable_input_require_grads`` on unless ``input_grads`` says. Two steps; the second is measured
(``reset_mod_stats`` between them). On fake tensors the batch is told unpacked (``unpacked``) and fp32
``grouped_mm`` runs as the CPU kernel does (``fake_experts.grouped_mm_rule``), as ``verify.simulate`` does. Two
facts make fake tensors work: a fake parameter cannot be swapped, so peft's ``.to(device)`` of a new adapter is made
a no-op while wrapping; and MemTracker hooks every parameter's gradient, so the model is registered before peft
freezes the base. On fake tensors transformers' masking would take its tracing path (an explicit causal mask, K/V
repeated for SDPA): ``unpacked`` keeps it on the path real tensors take. Each step's embedding-output leaf is
released after the step (``release``): MemTracker's hooks would keep it alive.
"""

from __future__ import annotations

import contextlib

from trainmath.errors import TrainmathError


def _no_swap():
    """peft moves each new adapter to its base weight's device (``module.to(weight.device)``); on fake tensors that
    swaps a fake parameter, which torch refuses. Everything is on the CPU already: a ``Module.to`` whose only
    argument is a device is made a no-op while peft wraps the model. Returns the restoring function."""
    import torch

    saved = torch.nn.Module.to

    def to(self, *args, **kwargs):
        if len(args) == 1 and not kwargs and isinstance(args[0], torch.device | str):
            return self
        return saved(self, *args, **kwargs)

    import peft.tuners.tuners_utils as tu

    move = tu.BaseTunerLayer._move_adapter_to_device_of_base_layer
    torch.nn.Module.to = to
    # its move also casts each new adapter to the base's dtype, which autocast_adapter_dtype=True undoes for a
    # bf16 base (fp32 adapters, as they are created): skip the round trip
    tu.BaseTunerLayer._move_adapter_to_device_of_base_layer = lambda self, *a, **k: None

    def restore():
        torch.nn.Module.to = saved
        tu.BaseTunerLayer._move_adapter_to_device_of_base_layer = move

    return restore


@contextlib.contextmanager
def unpacked(fake: bool):
    """On fake tensors transformers cannot check the position ids for packed sequences and builds an explicit
    attention mask (then SDPA repeats K/V for GQA); an eager run of an unpacked batch finds no packing and runs
    SDPA with ``is_causal``. ``find_packed_sequence_indices`` says so while the model runs, as in
    ``verify.simulate``."""
    if not fake:
        yield
        return
    import transformers.masking_utils as masking

    saved = masking.find_packed_sequence_indices
    masking.find_packed_sequence_indices = lambda position_ids: None
    try:
        yield
    finally:
        masking.find_packed_sequence_indices = saved


def release(leaves: list) -> None:
    """Drop the step's embedding outputs that ``enable_input_require_grads`` made leaves requiring grad, with the
    gradient hooks MemTracker's module tracker put on them. ``register_multi_grad_hook`` keeps each hooked tensor's
    grad accumulator in the hook's closure, and a leaf's accumulator holds the leaf: a cycle through C++ that
    Python's collector does not see, so without this each step's leaf and its ``.grad`` outlive the step (one
    (T, d) pair more at the next step's peak than the training loop holds without the tracker)."""
    import torch

    for t in leaves:
        t.grad = None
        t.data = torch.empty(0, dtype=t.dtype)
    leaves.clear()


def tracked_steps(mt, step, model, trainable) -> dict:
    """Two steps under the tracker ``mt``, the second measured: its peak, by kind, with the module buffers and the
    trainable parameter count."""
    with mt:
        step()
        mt.reset_mod_stats()
        step()
        peak = mt.get_tracker_snapshot("peak")
    snap = next(iter(peak.values()))
    kinds = {str(getattr(k, "value", k)): v for k, v in snap.items() if str(getattr(k, "value", k)) != "Total"}
    return {"peak_bytes": snap["Total"], "buffers_bytes": sum(b.untyped_storage().nbytes() for b in model.buffers()),
            "by_kind": kinds, "trainable_params": sum(p.numel() for p in trainable)}


def peft_step_peak(cfg, *, micro_batch: int, seq: int, precision: str, targets, rank: int, recompute: str = "none",
                   input_grads: bool | None = None, fake: bool = False, dropout: float = 0.0) -> dict:
    """{"peak_bytes", "buffers_bytes", "trainable_params"} of the measured step (module docstring)."""
    try:
        import peft
        import torch
        import transformers
        from torch._subclasses.fake_tensor import FakeTensorMode
        from torch.distributed._tools.mem_tracker import MemTracker
    except ImportError as e:
        raise TrainmathError(f"the peft simulation needs torch, transformers and peft ({e.name} is missing)") from None
    if precision not in ("fp32", "bf16", "amp-bf16"):
        raise TrainmathError(f"precision {precision!r}: the peft simulation runs fp32, bf16 or amp-bf16")
    mode = FakeTensorMode() if fake else contextlib.nullcontext()
    restore = lambda: None  # noqa: E731
    try:
        from trainmath.verify.fake_experts import grouped_mm_rule

        with mode, unpacked(fake), grouped_mm_rule() if fake else contextlib.nullcontext():
            torch.manual_seed(0)
            dtype = torch.bfloat16 if precision == "bf16" else torch.float32
            model = transformers.AutoModelForCausalLM.from_config(cfg, dtype=dtype, attn_implementation="sdpa")
            model.train()
            mt = MemTracker()
            # MemTracker installs a gradient hook on every parameter of a module it enters, which torch refuses on
            # a frozen one: install them now, while every weight still requires grad
            mt._track_module_params_and_buffers(model, install_grad_hooks=True)
            conf = peft.LoraConfig(r=rank, lora_alpha=2 * rank, target_modules=targets, lora_dropout=dropout)
            restore = _no_swap() if fake else restore
            model = peft.get_peft_model(model, conf)
            restore()
            if recompute == "full":
                model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
            elif recompute == "selective":  # torchtitan's op-level policy on every decoder layer
                from trainmath.runtime.checkpointing import apply_selective

                apply_selective(model)
            leaves: list = []
            if input_grads if input_grads is not None else recompute != "none":
                model.enable_input_require_grads()
                model.get_input_embeddings().register_forward_hook(lambda m, i, out: leaves.append(out))
            trainable = [p for p in model.parameters() if p.requires_grad]
            opt = torch.optim.AdamW(trainable, lr=1e-4, foreach=True)
            mt.track_external(model, opt)

            def step() -> None:
                ids = torch.randint(0, cfg.vocab_size, (micro_batch, seq))
                with torch.autocast("cpu", dtype=torch.bfloat16, enabled=precision == "amp-bf16"):
                    loss = model(input_ids=ids, labels=ids, use_cache=False).loss
                loss.backward()
                opt.step()
                opt.zero_grad(set_to_none=True)
                release(leaves)

            result = tracked_steps(mt, step, model, trainable)
    finally:
        restore()
    return result
