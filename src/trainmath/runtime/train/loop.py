"""One rank's training loop: build, (resume,) train, (checkpoint,) report. The same under our launcher and torchrun.

Per step every rank runs ``grad_accum`` micro-steps of forward + backward (loss / grad_accum), then the strategy's
step. The reported loss is the mean over the step's sequences: each rank's mean, averaged over ranks by an
all-reduce (equal sequence counts per rank make the two the same), so every rank reports the same number.
"""

from __future__ import annotations

import contextlib
import json
import os
import time

import torch
import torch.distributed as dist

from trainmath.runtime.train import checkpoint
from trainmath.runtime.train.config import TrainConfig, job_label
from trainmath.runtime.train.data import TokenSource
from trainmath.runtime.train.measure import StepProbe, state_bytes
from trainmath.runtime.train.model import build_model, model_spec, shrunk_config
from trainmath.runtime.train.strategies import build_strategy


def _autocast(cfg: TrainConfig, device: torch.device):
    if cfg.precision == "amp-bf16":
        return torch.autocast(device.type, dtype=torch.bfloat16)
    return contextlib.nullcontext()


def _mfu_inputs(cfg: TrainConfig, spec, batch: int, device: torch.device) -> tuple[int, float | None, str]:
    """(model FLOPs per rank and step, the GPU's peak FLOP/s or None, its name). Model FLOPs are the calculator's
    without recompute (PaLM's MFU, Chowdhery et al. 2022, App. B: recomputed work is not useful work); the peak is
    the preset's dense BF16 figure, whatever the precision."""
    from trainmath.flops import count_flops
    from trainmath.hardware import all_gpus, gpu

    flops = count_flops(spec, batch=batch * cfg.grad_accum, seq=cfg.seq, recompute="none").training_flops
    if device.type != "cuda":
        return flops, None, ""
    if cfg.gpu:
        g = gpu(cfg.gpu)
        return flops, g.bf16_flops_per_s, g.name
    words = torch.cuda.get_device_name(device).lower().replace("-", " ").split()
    for g in all_gpus():
        if any(a.split("-")[0] in words for a in g.aliases):
            return flops, g.bf16_flops_per_s, g.name
    return flops, None, ""


def _emit(out_fd: int | None, record: dict, as_json: bool) -> None:
    """Rank 0's live output, written straight to the launcher's terminal (``out_fd``) or stdout."""
    if as_json:
        line = json.dumps(record) + "\n"
    else:
        line = (f"step {record['step']:>4}  loss {record['loss']:.6f}  {record['step_time_s'] * 1e3:8.1f} ms  "
                f"{record['tokens_per_s']:10.0f} tok/s")
        if "tflops_per_s" in record:
            mfu = f"  MFU {record['mfu']:.1%} of {record['gpu']} bf16" if record["mfu"] is not None else ""
            line += f"  {record['tflops_per_s']:.1f} TFLOP/s per GPU{mfu}"
        line += "\n"
    if out_fd is None:
        print(line, end="", flush=True)
    else:
        os.write(out_fd, line.encode())


def train_rank(cfg: TrainConfig, *, rank: int, world_size: int, group, device: torch.device,
               out_fd: int | None = None, as_json: bool = False) -> dict:
    """Train on this rank; return ``{"records": [...], "measured": {...}}`` (losses are the same on every rank)."""
    name, conf = shrunk_config(cfg.model, cfg.overrides)
    model_flops, peak_flops, gpu_name = _mfu_inputs(cfg, model_spec(name, conf), cfg.micro_batch_for(world_size),
                                                    device)
    model = build_model(conf, seed=cfg.seed, recompute=cfg.recompute)
    if cfg.precision == "bf16":
        model = model.to(torch.bfloat16)
    model = model.to(device)
    counts = {}
    if cfg.peft.enabled:  # peft freezes the base: only the adapters train
        from trainmath.runtime.train.peft import apply_peft, peft_counts

        model = apply_peft(model, cfg.peft, device)
        counts = peft_counts(model)
    model.train()
    strategy = build_strategy(model, cfg, group, device)
    data = TokenSource(cfg.data, vocab=conf["vocab_size"], seq=cfg.seq, seed=cfg.seed)
    batch, accum = cfg.micro_batch_for(world_size), cfg.grad_accum
    meta = {"strategy": cfg.strategy, "impl": cfg.impl, "precision": cfg.precision, "optimizer": cfg.optimizer,
            "world_size": world_size, "peft": job_label(cfg.peft)}
    start = samples = 0  # steps done, and sequences consumed: the data position
    if cfg.resume and checkpoint.latest(cfg.checkpoint_dir) is not None:
        meta_in = checkpoint.load(cfg.checkpoint_dir, strategy, cfg, world_size, group)
        start, samples = meta_in["step"], meta_in["samples"]
    last = cfg.steps if cfg.stop_after is None else min(cfg.steps, cfg.stop_after)
    measure_at = min(start + 1, last - 1) if cfg.measure else None  # the 2nd step: optimizer states exist
    # FLOPs in another step (the counter's module hooks keep recomputed layers alive: measure.py): the next one,
    # else the first (counted in the first step, DDP's second loss changed in its last bits; a later step's not)
    flops_at = measure_at
    if measure_at is not None:
        flops_at = measure_at + 1 if measure_at + 1 < last else max(start, measure_at - 1)
    records, measured = [], dict(counts)
    for step in range(start, last):
        probe = StepProbe(strategy, device, fsdp=cfg.impl == "torch" and cfg.zero >= 2, memory=step == measure_at,
                          flops=step == flops_at) if step in (measure_at, flops_at) else contextlib.nullcontext()
        comm = getattr(strategy, "comm", None)
        comm_before = dict(comm.bytes) if comm is not None else {}
        if device.type == "cuda":
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        with probe:
            loss_sum = torch.zeros((), dtype=torch.float64, device=device)
            for micro in range(accum):
                x = data.micro_batch(samples, micro, rank=rank, world_size=world_size, batch=batch).to(device)
                with strategy.sync(micro == accum - 1), _autocast(cfg, device):
                    loss = strategy.model(input_ids=x, labels=x).loss
                (loss / accum).backward()
                loss_sum += loss.detach().double() / accum
                if step == measure_at and micro < accum - 1:
                    probe.micro_step_done()
            if step == measure_at:  # gradients as backward leaves them (our ZeRO-1 drops them at its reduce)
                measured.update(state_bytes(strategy))
            strategy.after_backward()
            strategy.step()
            strategy.zero_grad()
        dist.all_reduce(loss_sum, group=group)
        if device.type == "cuda":
            torch.cuda.synchronize()
        dt = time.perf_counter() - t0
        tokens = batch * accum * world_size * cfg.seq
        samples += batch * accum * world_size
        record = {"step": step + 1, "loss": loss_sum.item() / world_size, "step_time_s": dt,
                  "tokens_per_s": tokens / dt, "tokens": tokens}
        if device.type == "cuda":  # per rank: the calculator's model FLOPs over the measured step time
            record["tflops_per_s"] = model_flops / dt / 1e12
            record["mfu"] = model_flops / dt / peak_flops if peak_flops else None
            record["gpu"] = gpu_name
        if step == flops_at:
            measured.update({"training_flops": probe.flops, "attention_core_flops": probe.attention_flops})
        if step == measure_at:
            measured.update({"peak_bytes": probe.peak_bytes, "peak_breakdown": probe.breakdown,
                             "cuda": device.type == "cuda"})
            if comm is not None:
                measured["collective_bytes"] = {k: v - comm_before.get(k, 0) for k, v in comm.bytes.items()}
        records.append(record)
        if rank == 0:
            _emit(out_fd, record, as_json)
        done = step + 1
        if cfg.checkpoint_dir and ((cfg.checkpoint_every and done % cfg.checkpoint_every == 0) or done == last):
            checkpoint.save(cfg.checkpoint_dir, done, strategy, {**meta, "samples": samples}, group)
    every = None
    if cfg.measure:  # every rank's measurement on every rank (under torchrun each process reports alone)
        every = [None] * world_size
        dist.all_gather_object(every, measured, group=group)
    dist.barrier(group)  # a rank leaving while another still talks to it aborts gloo at exit
    return {"records": records, "measured": measured, "measured_by_rank": every, "model": name, "config": conf,
            "rank": rank}


def prepare(cfg: TrainConfig) -> None:
    """Import, in the launcher before it forks, everything a rank will import (transformers' modeling module of
    the model, FSDP, DCP, the trackers): ~3-5 s that each forked rank would otherwise pay again."""
    import torch.distributed.checkpoint  # noqa: F401
    import torch.distributed.checkpoint.state_dict  # noqa: F401
    import torch.distributed.fsdp  # noqa: F401
    import torch.distributed.optim  # noqa: F401
    import torch.nn.parallel  # noqa: F401
    import torch.utils.flop_counter  # noqa: F401
    from torch.distributed._tools import fsdp2_mem_tracker, mem_tracker  # noqa: F401

    _, conf = shrunk_config(cfg.model, cfg.overrides)
    with torch.device("meta"):
        build_model(conf, seed=cfg.seed, recompute="none")
    if cfg.peft.enabled:
        from trainmath.runtime.train.peft import import_peft

        import_peft(cfg.peft)


def rank_entry(ctx, cfg: TrainConfig, out_fd: int | None, as_json: bool) -> dict:
    """What the launcher runs on each rank (``trainmath.runtime.launch.launch``)."""
    return train_rank(cfg, rank=ctx.rank, world_size=ctx.world_size, group=ctx.group, device=ctx.device,
                      out_fd=out_fd, as_json=as_json)
