"""Checkpoints with torch.distributed.checkpoint: model, optimizer, data position and RNG, all or nothing.

Layout: ``DIR/step-000004/`` holds DCP's files (one per rank + ``.metadata``) and ``trainmath.json`` (step, samples
consumed, world size, strategy, RNG state). Every rank writes into ``DIR/step-000004.tmp``; after a barrier rank 0
writes ``trainmath.json`` and renames the folder. A killed run leaves at most a ``.tmp`` folder, which resume
ignores: the last complete checkpoint stays loadable.
"""

from __future__ import annotations

import base64
import binascii
import json
import os
import shutil
import stat

import torch
import torch.distributed as dist

from trainmath.errors import TrainmathError
from trainmath.runtime.train.config import job_label

META = "trainmath.json"


def _name(step: int) -> str:
    return f"step-{step:06d}"


def save(directory: str, step: int, strategy, meta: dict, group) -> str:
    import torch.distributed.checkpoint as dcp

    final = os.path.join(directory, _name(step))
    tmp = final + ".tmp"
    rank0 = dist.get_rank(group) == 0
    if rank0:
        os.makedirs(directory, exist_ok=True)
        shutil.rmtree(tmp, ignore_errors=True)
    dist.barrier(group)
    try:  # dcp.save gathers every rank's failure, so all ranks leave here together
        dcp.save(strategy.state_dict(), checkpoint_id=tmp, process_group=group)
    except (Exception, dcp.CheckpointException) as e:  # CheckpointException is a BaseException
        dist.barrier(group)  # every rank has stopped writing before the partial folder goes
        if rank0:
            shutil.rmtree(tmp, ignore_errors=True)
        raise TrainmathError(f"cannot save the checkpoint of step {step} in {directory!r}: {_reason(e)}; the "
                             f"partial folder {os.path.basename(tmp)} was removed (the last complete checkpoint "
                             f"is kept)") from None
    dist.barrier(group)
    if rank0:
        rng = base64.b64encode(torch.get_rng_state().numpy().tobytes()).decode()
        try:
            with open(os.path.join(tmp, META), "w") as f:
                json.dump({**meta, "step": step, "rng_state": rng}, f)
                f.flush()
                os.fsync(f.fileno())
            shutil.rmtree(final, ignore_errors=True)
            os.rename(tmp, final)
        except OSError as e:
            shutil.rmtree(tmp, ignore_errors=True)
            raise TrainmathError(f"cannot save the checkpoint of step {step} in {directory!r}: {e.strerror or e}; "
                                 f"the partial folder {os.path.basename(tmp)} was removed") from None
    dist.barrier(group)
    return final


def _reason(e: BaseException) -> str:
    """The first cause of a (torch.distributed.checkpoint) failure, in a few words: the OSError's text when one
    of the ranks hit one (a full disk), else the exception's first line."""
    seen = [e]
    failures = getattr(e, "failures", None)  # CheckpointException: {rank: (exception, stack)}
    if isinstance(failures, dict):
        for f in failures.values():
            inner = f[0] if isinstance(f, tuple) and f else f
            if isinstance(inner, BaseException):
                seen.append(inner)
    for x in list(seen):
        while x.__cause__ is not None and len(seen) < 50:
            x = x.__cause__
            seen.append(x)
    for x in seen:
        if isinstance(x, OSError) and x.strerror:
            return x.strerror
    cause = seen[1] if len(seen) > 1 else e
    text = str(cause).strip()
    first = f"{type(cause).__name__}: {text.splitlines()[0]}" if text else type(cause).__name__
    return first if len(first) <= 200 else first[:200] + "..."


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
    meta = read_meta(path)
    for key in ("strategy", "impl", "precision", "optimizer"):
        if meta.get(key) != getattr(cfg, key):
            raise TrainmathError(f"--resume: the checkpoint in {path} was written with --{key.replace('_', '-')} "
                                 f"{meta.get(key)}, not {getattr(cfg, key)}")
    if meta.get("peft", "none") != job_label(cfg.peft):
        raise TrainmathError(f"--resume: the checkpoint in {path} was written for the fine-tuning job "
                             f"{meta.get('peft', 'none')!r}, not {job_label(cfg.peft)!r}")
    if cfg.strategy == "zero1" and cfg.impl == "torch" and meta["world_size"] != world_size:
        raise TrainmathError(f"--resume: ZeroRedundancyOptimizer keeps each rank's own partition; the checkpoint "
                             f"has {meta['world_size']} ranks, this run {world_size} (use --impl trainmath to change "
                             f"the number of ranks)")
    _check_files(path)
    state = strategy.state_dict()
    try:
        dcp.load(state, checkpoint_id=path, process_group=group)
        strategy.load_state_dict(state)
    except (Exception, dcp.CheckpointException) as e:  # CheckpointException is a BaseException
        raise TrainmathError(f"--resume: cannot load {path}: its .metadata or .distcp files are damaged or were "
                             f"written for another model shape ({_reason(e)})") from None
    try:
        torch.set_rng_state(torch.frombuffer(bytearray(meta["rng_state"]), dtype=torch.uint8))
    except RuntimeError as e:
        raise TrainmathError(f"--resume: {os.path.join(path, META)}: rng_state is not a torch RNG state "
                             f"({_reason(e)})") from None
    return meta


_META_TYPES = {"step": int, "samples": int, "world_size": int, "strategy": str, "impl": str, "precision": str,
               "optimizer": str, "rng_state": str}


def read_meta(path: str) -> dict:
    """``trainmath.json`` of the checkpoint folder ``path``, checked: each field present with its type, the step
    the folder's, counts not negative, the RNG state base64. ``rng_state`` comes back as bytes."""
    from trainmath.jsonfile import read_json_file

    where = os.path.join(path, META)
    meta = read_json_file(where, "--resume: checkpoint file", max_bytes=1 << 20)
    if not isinstance(meta, dict):
        raise TrainmathError(f"--resume: {where}: expected a JSON object, got {type(meta).__name__}")
    for key, kind in _META_TYPES.items():
        value = meta.get(key)
        if not isinstance(value, kind) or isinstance(value, bool):
            raise TrainmathError(f"--resume: {where}: {key} must be {'an integer' if kind is int else 'a string'}"
                                 f", got {value!r:.40}" if key in meta else f"--resume: {where}: lacks {key}")
    name = os.path.basename(path)
    if not 1 <= meta["step"] <= 2**40 or name != _name(meta["step"]):
        raise TrainmathError(f"--resume: {where}: step {meta['step']} is not this folder's ({name}); the "
                             f"checkpoint is damaged")
    if not (0 <= meta["samples"] <= 2**60 and 1 <= meta["world_size"] <= 2**20):
        raise TrainmathError(f"--resume: {where}: samples {meta['samples']} or world_size {meta['world_size']} "
                             f"is out of range")
    try:
        rng = base64.b64decode(meta["rng_state"], validate=True)
    except (binascii.Error, ValueError):
        raise TrainmathError(f"--resume: {where}: rng_state is not base64") from None
    return {**meta, "rng_state": rng}


def _check_files(path: str) -> None:
    """Every entry of the folder a regular file (a FIFO as ``.metadata`` would block the reader), ``.metadata``
    present."""
    for name in sorted(os.listdir(path)):
        if not stat.S_ISREG(os.lstat(os.path.join(path, name)).st_mode):
            raise TrainmathError(f"--resume: {os.path.join(path, name)} is not a regular file; the checkpoint is "
                                 f"damaged")
    if not os.path.isfile(os.path.join(path, ".metadata")):
        raise TrainmathError(f"--resume: {path} has no .metadata file; the checkpoint is damaged")
