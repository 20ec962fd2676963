"""Data-parallel strategies behind one interface: torch's (DDP, ZeroRedundancyOptimizer, FSDP2) and ours.

A strategy owns the wrapped model and the optimizer. The loop calls, per step: ``sync(last)`` around each
micro-step's forward+backward, ``after_backward()``, ``step()``, ``zero_grad()``. Measurement reads
``weights()``, ``gradients()`` and ``optimizer_state()``; checkpoints read ``state_dict()`` and write back with
``load_state_dict()``.

| strategy | ``--impl torch``                                   | ``--impl trainmath`` |
|----------|----------------------------------------------------|----------------------|
| ddp      | ``DistributedDataParallel``                        | –                    |
| zero1    | DDP + ``ZeroRedundancyOptimizer``                  | ``zero1.Zero1``      |
| zero2    | FSDP2 ``fully_shard`` per layer + root, ``reshard_after_forward=False`` | ``zero2.Zero2`` |
| zero3    | FSDP2 ``fully_shard`` per layer + root, ``reshard_after_forward=True``  | ``zero3.Zero3`` |
"""

from __future__ import annotations

import contextlib

import torch
import torch.distributed as dist

from trainmath.errors import TrainmathError
from trainmath.runtime.train.config import TrainConfig
from trainmath.runtime.train.flat import Comm
from trainmath.runtime.train.model import decoder_layers
from trainmath.runtime.train.optim import init_state, make_optimizer, optimizer_class


def _state_tensors(opt: torch.optim.Optimizer) -> list[torch.Tensor]:
    """Every optimizer state tensor but the 0-dim ``step`` counters (CPU scalars on a GPU: the calculator counts
    device memory)."""
    return [v for s in opt.state.values() for v in s.values() if isinstance(v, torch.Tensor) and v.dim() > 0]


def _is_moe(model) -> bool:
    conf = model.config.to_dict()
    return any(conf.get(k) for k in ("num_experts", "num_local_experts", "n_routed_experts"))


class _BucketCounter:
    """Counts the bytes of DDP's gradient all-reduces (each bucket's buffer), through torch's own
    ``allreduce_hook`` registered as DDP's communication hook (same arithmetic as the built-in one)."""

    def __init__(self, ddp, group):
        from collections import Counter

        from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook

        self.bytes: Counter = Counter()

        def hook(state, bucket):
            buf = bucket.buffer()
            self.bytes["all_reduce"] += buf.numel() * buf.element_size()
            return allreduce_hook(state, bucket)

        ddp.register_comm_hook(group, hook)


def _options(cfg: TrainConfig, *, loading: bool = False):
    """DCP's state-dict options: a fine-tune checkpoints its adapters only (as peft's ``save_pretrained``), the
    frozen base being rebuilt from the run's random seed (and, for QLoRA, quantized again) on resume."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions

    frozen = cfg.peft.enabled
    return StateDictOptions(ignore_frozen_params=frozen, strict=not (frozen and loading))


class TorchDDP:
    """DDP (and ZeRO-1 = DDP + ZeroRedundancyOptimizer): gradients all-reduced in buckets during backward."""

    def __init__(self, model, cfg: TrainConfig, group, device):
        from torch.nn.parallel import DistributedDataParallel as DDP

        self.stage = cfg.zero
        self.cfg = cfg
        # MoE: an experts implementation that skips experts without tokens leaves them without a gradient, which
        # DDP must then look for (a graph walk per step; transformers' eager path gives them zeros)
        self.model = DDP(model, process_group=group, device_ids=None if device.type == "cpu" else [device],
                         find_unused_parameters=_is_moe(model))
        self.comm = _BucketCounter(self.model, group)
        params = [p for p in model.parameters() if p.requires_grad]
        if cfg.strategy == "zero1":
            from torch.distributed.optim import ZeroRedundancyOptimizer

            cls, kwargs = optimizer_class(cfg.optimizer, cfg.optimizer_impl)
            self.optimizer = ZeroRedundancyOptimizer(params, optimizer_class=cls, process_group=group, lr=cfg.lr,
                                                     **kwargs)
            self.local_optimizer = self.optimizer.optim
        else:
            self.optimizer = self.local_optimizer = make_optimizer(params, cfg.optimizer, cfg.optimizer_impl, cfg.lr)
        self.params = params

    def sync(self, last: bool):
        return contextlib.nullcontext() if last else self.model.no_sync()

    def after_backward(self) -> None:
        pass

    def step(self) -> None:
        self.optimizer.step()

    def zero_grad(self) -> None:
        self.optimizer.zero_grad(set_to_none=True)

    def weights(self):
        return self.params

    def gradients(self):
        return [p.grad for p in self.params if p.grad is not None]

    def optimizer_state(self):
        return _state_tensors(self.local_optimizer)

    def state_dict(self) -> dict:
        from torch.distributed.checkpoint.state_dict import get_model_state_dict, get_optimizer_state_dict

        if self.stage == 1:  # ZeroRedundancyOptimizer is not supported by get_state_dict: keep each rank's part
            init_state(self.local_optimizer, self.cfg.optimizer)
            return {"model": get_model_state_dict(self.model, options=_options(self.cfg)),
                    f"optim_rank{dist.get_rank()}": self.local_optimizer.state_dict()}
        init_state(self.optimizer, self.cfg.optimizer)
        return {"model": get_model_state_dict(self.model, options=_options(self.cfg)),
                "optim": get_optimizer_state_dict(self.model, self.optimizer, options=_options(self.cfg))}

    def load_state_dict(self, state: dict) -> None:
        from torch.distributed.checkpoint.state_dict import set_model_state_dict, set_optimizer_state_dict

        set_model_state_dict(self.model, state["model"], options=_options(self.cfg, loading=True))
        if self.stage == 1:
            self.local_optimizer.load_state_dict(state[f"optim_rank{dist.get_rank()}"])
        else:
            set_optimizer_state_dict(self.model, self.optimizer, state["optim"],
                                     options=_options(self.cfg, loading=True))


class TorchFSDP(TorchDDP):
    """FSDP2: ``fully_shard`` on every decoder layer, then on the root; ZeRO-2 keeps parameters unsharded between
    forward and backward (``reshard_after_forward=False``), ZeRO-3 reshards them after each layer's forward."""

    def __init__(self, model, cfg: TrainConfig, group, device):
        from torch.distributed.device_mesh import DeviceMesh
        from torch.distributed.fsdp import MixedPrecisionPolicy

        from trainmath.runtime.fsdp import shard_model

        self.stage, self.cfg = cfg.zero, cfg
        mesh = DeviceMesh.from_group(group, device.type)
        mp = MixedPrecisionPolicy()
        if cfg.precision == "mixed-bf16":
            mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
        kw = {"mesh": mesh, "reshard_after_forward": cfg.zero == 3, "mp_policy": mp}
        shard_model(model, decoder_layers(model), **kw)  # an odd-dtype submodule is its own unit (runtime.fsdp)
        self.model = model
        self.params = [p for p in model.parameters() if p.requires_grad]
        self.optimizer = self.local_optimizer = make_optimizer(self.params, cfg.optimizer, cfg.optimizer_impl,
                                                               cfg.lr)

    def sync(self, last: bool):
        return contextlib.nullcontext()  # reduce-scatter every micro-step; FSDP2 accumulates into sharded grads

    def weights(self):
        return [p.to_local() for p in self.params]

    def gradients(self):
        return [p.grad.to_local() for p in self.params if p.grad is not None]

    def state_dict(self) -> dict:
        from torch.distributed.checkpoint.state_dict import get_model_state_dict, get_optimizer_state_dict

        init_state(self.optimizer, self.cfg.optimizer)
        return {"model": get_model_state_dict(self.model, options=_options(self.cfg)),
                "optim": get_optimizer_state_dict(self.model, self.optimizer, options=_options(self.cfg))}


class Ours:
    """Our ZeRO-1/2/3 (``zero1``, ``zero2``, ``zero3``): flat shards, our collectives, explicit group."""

    def __init__(self, model, cfg: TrainConfig, group, device):
        from torch.distributed.device_mesh import DeviceMesh

        from trainmath.runtime.train.zero1 import Zero1
        from trainmath.runtime.train.zero2 import Zero2
        from trainmath.runtime.train.zero3 import Zero3

        self.cfg = cfg
        self.comm = Comm(group, cfg.comm)
        self.mesh = DeviceMesh.from_group(group, device.type)

        def make(params):
            return make_optimizer(params, cfg.optimizer, cfg.optimizer_impl, cfg.lr)

        if cfg.zero == 1:
            self.impl = Zero1(model, self.comm, make)
        else:
            cls = Zero2 if cfg.zero == 2 else Zero3
            self.impl = cls(model, decoder_layers(model), self.comm, make)
        self.model, self.optimizer, self.stage = model, self.impl.optimizer, cfg.zero

    def sync(self, last: bool):
        return contextlib.nullcontext()

    def after_backward(self) -> None:
        self.impl.after_backward()

    def step(self) -> None:
        self.impl.step()

    def zero_grad(self) -> None:
        self.impl.zero_grad()

    def weights(self):
        return self.impl.weights()

    def gradients(self):
        return self.impl.gradients()

    def optimizer_state(self):
        return _state_tensors(self.optimizer)

    def extra_tensors(self):
        """Our shards and gradient shards, which MemTracker must be told about (created before the step)."""
        return [*self.impl.gradients(), *(s for _, s in self.impl.units())]

    def state_dict(self) -> dict:
        """Parameters (ZeRO-3: the shards as DTensors; else the replicated full tensors) and, per parameter, each
        optimizer state as a DTensor whose local part is a view into our flat state: DCP loads in place and
        reshards across world sizes."""
        init_state(self.optimizer, self.cfg.optimizer)
        model: dict = {}
        optim: dict = {}
        for layout, shard in self.impl.units():
            if self.stage == 3:
                model.update(layout.dtensors(shard, self.mesh))
            else:
                model.update({n: p.data for n, p in zip(layout.names, layout.params)})
            for key, value in self.optimizer.state[shard].items():
                if key == "step":
                    optim.update({f"{n}.step": value for n in layout.names})
                else:
                    optim.update({f"{n}.{key}": t for n, t in layout.dtensors(value, self.mesh).items()})
        return {"model": model, "optim": optim}

    def load_state_dict(self, state: dict) -> None:
        pass  # every entry of state_dict() is a view of our own tensors: DCP has loaded them in place


def build_strategy(model, cfg: TrainConfig, group, device):
    if cfg.impl == "trainmath":
        if cfg.strategy == "ddp":
            raise TrainmathError("--strategy ddp has --impl torch only")
        return Ours(model, cfg, group, device)
    if cfg.strategy in ("ddp", "zero1"):
        return TorchDDP(model, cfg, group, device)
    return TorchFSDP(model, cfg, group, device)
