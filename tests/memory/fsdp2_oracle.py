"""Test support: FSDPMemTracker's peak of a real FSDP2 training step on each of ``world`` gloo ranks of this CPU.

``run_fsdp2(world, cases)`` starts the ranks (``torch.multiprocessing`` spawn, one process group for all cases),
builds the same tiny transformers model on each, wraps it as the runtime does (``trainmath.runtime.fsdp
.shard_model``: ``fully_shard`` per decoder layer, an fp32 router in a bf16 model as its own unit, then the root;
``reshard_after_forward=True``) and runs two steps of ``out = model(ids, labels=ids); out.loss.backward();
opt.step(); opt.zero_grad()`` (for-loop AdamW) under ``FSDPMemTracker``, ``reset_mod_stats()`` before the
second. Returns, per case and rank, the peak by kind (FSDPMemTracker's names), the total just after the root's
pre-forward (``root_gathered``), the module buffers' bytes and the units wrapped on their own.

A case is ``(model_type, config keys, precision, experts)``: precision ``fp32`` or ``bf16`` (the model built in
that dtype, as ``from_config(dtype=...)`` keeps some routers fp32); experts ``grouped`` (``grouped_mm``) or None.
"""

from __future__ import annotations

import contextlib
import gc
import json
import os
import socket
import tempfile

B, S = 2, 16


def config(model_type: str, extra: dict):
    import transformers

    return transformers.AutoConfig.for_model(model_type, **extra)


def _step_peak(case, mesh) -> dict:
    import torch
    import transformers
    from torch.distributed._tools.fsdp2_mem_tracker import FSDPMemTracker

    from trainmath.runtime.fsdp import shard_model
    from trainmath.runtime.train.model import decoder_layers

    model_type, extra, precision, experts = case
    cfg = config(model_type, extra)
    kw = {"attn_implementation": "sdpa"}
    if experts:
        kw["experts_implementation"] = "grouped_mm" if experts == "grouped" else "eager"
    torch.manual_seed(0)
    dtype = torch.bfloat16 if precision == "bf16" else torch.float32
    model = transformers.AutoModelForCausalLM.from_config(cfg, dtype=dtype, **kw).train()
    own = shard_model(model, decoder_layers(model), mesh=mesh, reshard_after_forward=True)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, foreach=False)
    ids0 = torch.randint(0, cfg.vocab_size, (B, S), generator=torch.Generator().manual_seed(1))

    def step():
        gc.collect()  # the cycles of the previous case's and step's graphs freed now, not at a random moment inside
        ids = ids0.clone()  # one tensor for both, as ``trainmath.verify.simulate`` and the calculator's batch
        out = model(input_ids=ids, labels=ids, use_cache=False)
        out.loss.backward()
        opt.step()
        opt.zero_grad()
        return out.loss.item()

    mt = FSDPMemTracker(model, opt)
    with mt:
        step()
        mt.reset_mod_stats()
        loss = step()
        peak = mt.get_tracker_snapshot("peak")[torch.device("cpu")]
        from torch.distributed._tools.fsdp2_mem_tracker import _FSDPModState

        # the root's copy-out done: its all-gather output kept beside its unsharded parameters
        root = mt.memory_tracking[model].snapshots[_FSDPModState.AFT_PRE_FW][-1][torch.device("cpu")]["Total"]
    res = {str(getattr(k, "value", k)): v for k, v in peak.items()}
    res["root_gathered"] = root
    res["buffers"] = sum(b.untyped_storage().nbytes() for b in model.buffers())
    res["own_units"] = [type(m).__name__ for m in own]
    res["loss"] = loss
    return res


def _worker(rank, world, port, cases, out_dir):
    import torch
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    torch.set_num_threads(1)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        mesh = init_device_mesh("cpu", (world,))
        res = [_step_peak(tuple(c), mesh) for c in cases]
        with open(os.path.join(out_dir, f"{rank}.json"), "w") as f:
            json.dump(res, f)
    finally:
        dist.destroy_process_group()


def _free_port() -> int:
    with contextlib.closing(socket.socket()) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_fsdp2(world: int, cases) -> list[list[dict]]:
    """Per case, per rank: the peak of a real FSDP2 step (module docstring)."""
    import torch.multiprocessing as mp

    with tempfile.TemporaryDirectory() as d:
        mp.start_processes(_worker, args=(world, _free_port(), [list(c) for c in cases], d), nprocs=world,
                           join=True, start_method="spawn")
        per_rank = []
        for r in range(world):
            with open(os.path.join(d, f"{r}.json")) as f:
                per_rank.append(json.load(f))
    return [[per_rank[r][i] for r in range(world)] for i in range(len(cases))]
