"""Checkpoints with torch.distributed.checkpoint: model, optimizer, data position and RNG, all or nothing.

Layout: ``DIR/step-000004/`` holds DCP's files (one per rank + ``.metadata``) and ``trainmath.json`` (step, samples
consumed, world size, strategy, RNG state). Every rank writes into ``DIR/step-000004.tmp``; after a barrier rank 0
writes ``trainmath.json`` and renames the folder. A killed run leaves at most a ``.tmp`` folder, which resume
ignores: the last complete checkpoint stays loadable.
"""

from __future__ import annotations

import base64
import json
import os
import shutil

import torch
import torch.distributed as dist

from trainmath.errors import TrainmathError

META = "trainmath.json"


def _name(step: int) -> str:
    return f"step-{step:06d}"


def save(directory: str, step: int, strategy, meta: dict, group) -> str:
    import torch.distributed.checkpoint as dcp

    final = os.path.join(directory, _name(step))
    tmp = final + ".tmp"
    if dist.get_rank(group) == 0:
        os.makedirs(directory, exist_ok=True)
        shutil.rmtree(tmp, ignore_errors=True)
    dist.barrier(group)
    dcp.save(strategy.state_dict(), checkpoint_id=tmp, process_group=group)
    dist.barrier(group)
    if dist.get_rank(group) == 0:
        rng = base64.b64encode(torch.get_rng_state().numpy().tobytes()).decode()
        with open(os.path.join(tmp, META), "w") as f:
            json.dump({**meta, "step": step, "rng_state": rng}, f)
        shutil.rmtree(final, ignore_errors=True)
        os.rename(tmp, final)
    dist.barrier(group)
    return final


def latest(directory: str) -> str | None:
    """The newest complete checkpoint folder (one with ``trainmath.json``), or None."""
    if not os.path.isdir(directory):
        return None
    done = sorted(d for d in os.listdir(directory) if d.startswith("step-") and not d.endswith(".tmp")
                  and os.path.isfile(os.path.join(directory, d, META)))
    return os.path.join(directory, done[-1]) if done else None


def load(directory: str, strategy, cfg, world_size: int, group) -> dict:
    """Load the newest complete checkpoint into ``strategy``; return its metadata."""
    import torch.distributed.checkpoint as dcp

    path = latest(directory)
    if path is None:
        raise TrainmathError(f"--resume: no complete checkpoint in {directory!r}")
    with open(os.path.join(path, META)) as f:
        meta = json.load(f)
    for key in ("strategy", "impl", "precision", "optimizer"):
        if meta.get(key) != getattr(cfg, key):
            raise TrainmathError(f"--resume: the checkpoint in {path} was written with --{key.replace('_', '-')} "
                                 f"{meta.get(key)}, not {getattr(cfg, key)}")
    if cfg.strategy == "zero1" and cfg.impl == "torch" and meta["world_size"] != world_size:
        raise TrainmathError(f"--resume: ZeroRedundancyOptimizer keeps each rank's own partition; the checkpoint "
                             f"has {meta['world_size']} ranks, this run {world_size} (use --impl trainmath to change "
                             f"the number of ranks)")
    state = strategy.state_dict()
    dcp.load(state, checkpoint_id=path, process_group=group)
    strategy.load_state_dict(state)
    rng = torch.frombuffer(bytearray(base64.b64decode(meta["rng_state"])), dtype=torch.uint8)
    torch.set_rng_state(rng)
    return meta
