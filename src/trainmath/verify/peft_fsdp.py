"""FSDPMemTracker's peak of one LoRA step of transformers' real code, wrapped by peft and then sharded by FSDP2, on
one rank of a fake process group (``dist.init_process_group("fake")``), on the CPU: real tensors of a small config,
or fake tensors (``FakeTensorMode``) at full width.

The wrapping: ``peft.get_peft_model`` first (the base frozen, fp32 adapters beside it), then the runtime's
``fully_shard`` on every decoder layer and on the root (``trainmath.runtime.fsdp.shard_model``,
``reshard_after_forward=True``): each layer's unit holds its frozen weights and its adapters; FSDP2 asks one
original dtype of a unit's *trainable* parameters only (``FSDPParamGroup._init_mp_dtypes``), so a bf16 base with
fp32 adapters is one unit. The loop is ``verify.peft_sim``'s (``loss = model(...).loss``, ``backward``, ``step``,
``zero_grad``), with for-loop AdamW over the adapters (foreach and fused AdamW misbehave on fake DTensor shards),
two steps, the second measured. On fake tensors peft's ``.to(device)`` of a new adapter is a no-op while wrapping
(``verify.peft_sim``), and the batch is told unpacked (``peft_sim.unpacked``); FSDPMemTracker hooks only the FSDP
modules' states, so the base is frozen before it starts.
"""

from __future__ import annotations

import contextlib

from trainmath.errors import TrainmathError


def peft_fsdp_step_peak(cfg, *, world: int, micro_batch: int, seq: int, precision: str, targets, rank: int,
                        recompute: str = "none", input_grads: bool | None = None, fake: bool = False,
                        rank_id: int = 0, reshard: bool = True) -> dict:
    """{"peak_bytes", "buffers_bytes", "trainable_params", "by_kind"} of rank ``rank_id``'s measured step;
    ``reshard``: ``reshard_after_forward`` (False: FSDP2's ZeRO-2, ``--zero 2 --zero-impl fsdp2``)."""
    try:
        import peft
        import torch
        import torch.distributed as dist
        import transformers
        from torch._subclasses.fake_tensor import FakeTensorMode
        from torch.distributed._tools.fsdp2_mem_tracker import FSDPMemTracker
        from torch.distributed.device_mesh import init_device_mesh
        from torch.testing._internal.distributed.fake_pg import FakeStore
    except ImportError as e:
        raise TrainmathError(f"the peft FSDP2 simulation needs torch, transformers and peft ({e.name} is missing)") \
            from None
    from trainmath.runtime import dtensor_state
    from trainmath.runtime.fsdp import shard_model
    from trainmath.runtime.train.model import decoder_layers
    from trainmath.verify.peft_sim import _no_swap, release, tracked_steps, unpacked

    if precision not in ("fp32", "bf16"):
        raise TrainmathError(f"precision {precision!r}: the peft FSDP2 simulation runs fp32 or bf16")
    if dist.is_initialized():
        raise TrainmathError("the peft FSDP2 simulation needs its own process group; torch.distributed is already "
                             "initialised in this process")
    dist.init_process_group("fake", store=FakeStore(), rank=rank_id, world_size=world)
    restore = lambda: None  # noqa: E731
    try:
        mesh = init_device_mesh("cpu", (world,))  # outside the fake mode
        with FakeTensorMode() if fake else contextlib.nullcontext(), unpacked(fake):
            torch.manual_seed(0)
            dtype = torch.bfloat16 if precision == "bf16" else torch.float32
            model = transformers.AutoModelForCausalLM.from_config(cfg, dtype=dtype, attn_implementation="sdpa")
            model.train()
            conf = peft.LoraConfig(r=rank, lora_alpha=2 * rank, target_modules=targets)
            restore = _no_swap() if fake else restore
            pm = peft.get_peft_model(model, conf)
            restore()
            if recompute == "full":
                pm.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
            leaves: list = []  # each step's embedding-output leaf, released after it (peft_sim.release)
            if input_grads if input_grads is not None else recompute == "full":
                pm.enable_input_require_grads()
                pm.get_input_embeddings().register_forward_hook(lambda m, i, out: leaves.append(out))
            shard_model(model, decoder_layers(model), mesh=mesh, reshard_after_forward=reshard)
            trainable = [p for p in pm.parameters() if p.requires_grad]
            opt = torch.optim.AdamW(trainable, lr=1e-4, foreach=False)

            def step() -> None:
                ids = torch.randint(0, cfg.vocab_size, (micro_batch, seq))
                loss = pm(input_ids=ids, labels=ids, use_cache=False).loss
                loss.backward()
                opt.step()
                opt.zero_grad(set_to_none=True)
                release(leaves)

            result = tracked_steps(FSDPMemTracker(model, opt), step, model, trainable)
    finally:
        restore()
        dist.destroy_process_group()
        dtensor_state.forget()  # its meshes were rank 0's (runtime.dtensor_state)
    return result
