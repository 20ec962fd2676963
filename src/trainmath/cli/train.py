"""``trainmath train MODEL ...``: train transformers' model of a (shrunk) config with DDP or ZeRO-1/2/3.

Top level imports only the standard library; torch and transformers are imported inside the command, before the
ranks are forked (so each rank starts in ~0.1 s). Under torchrun (its RANK/WORLD_SIZE/LOCAL_RANK/MASTER_* set)
this process is one rank and ``--nproc`` is ignored.
"""

from __future__ import annotations

import argparse
import os
import sys
import threading

from trainmath.errors import TrainmathError

SHRINK = ("layers", "hidden", "intermediate", "heads", "kv_heads", "vocab", "experts")


def add_train_args(p: argparse.ArgumentParser) -> None:
    from trainmath.args import count, host, number, port
    from trainmath.runtime.train import config as c

    p.add_argument("model", help="catalog name, config.json, or a directory holding one")
    for key in SHRINK:
        p.add_argument(f"--{key.replace('_', '-')}", type=count(), dest=key, help=f"set the config's {key} (shrink it)")
    p.add_argument("--nproc", "--nproc-per-node", dest="nproc", type=count(1, 64), default=1,
                   help="ranks on this node (default 1)")
    p.add_argument("--nnodes", type=count(1, 1024), default=1, help="launchers (nodes) in the job; default 1")
    p.add_argument("--node-rank", type=count(0, 1023), default=0, help="this launcher's node index (default 0)")
    p.add_argument("--master-addr", type=host, default="127.0.0.1", help="address of node 0 (default 127.0.0.1)")
    p.add_argument("--master-port", type=port, default=0, help="rendezvous port; 0 picks a free one (default 0)")
    p.add_argument("--backend", choices=("gloo", "nccl"), default="gloo", help="gloo (CPU) or nccl (one GPU per rank)")
    p.add_argument("--timeout", type=number(0, 86400, exclusive_minimum=True, unit="seconds"), default=60.0,
                   help="seconds a collective may wait before the job fails naming the rank at fault (default 60)")
    p.add_argument("--strategy", choices=c.STRATEGIES, default="ddp", help="data parallelism (default ddp)")
    p.add_argument("--impl", choices=c.IMPLS, default="torch",
                   help="torch's DDP/ZeroRedundancyOptimizer/FSDP2, or our ZeRO from the ring collectives")
    p.add_argument("--comm", choices=c.COMMS, default="ring",
                   help="collectives of --impl trainmath: our ring or torch's (default ring)")
    p.add_argument("--precision", choices=c.PRECISIONS, default="fp32", help="default fp32")
    p.add_argument("--optimizer", choices=c.OPTIMIZERS, default="adamw", help="default adamw")
    p.add_argument("--optimizer-impl", choices=c.OPTIMIZER_IMPLS, default="torch",
                   help="torch.optim or ours, written from the update rules (default torch)")
    p.add_argument("--recompute", choices=c.RECOMPUTE, default="none",
                   help="activation recompute (default none): selective = torchtitan's op-level policy (mm/SDPA "
                        "outputs cached, every second mm recomputed), full = transformers' checkpointing of every "
                        "layer")
    p.add_argument("--micro-batch", type=count(), default=1, help="sequences per rank per micro-step (default 1)")
    p.add_argument("--global-batch", type=count(),
                   help="sequences per step; the world size × grad-accum must divide it (overrides --micro-batch)")
    p.add_argument("--seq", type=count(), default=32, help="tokens per sequence (default 32)")
    p.add_argument("--steps", type=count(), default=4, help="optimizer steps (default 4)")
    p.add_argument("--grad-accum", type=count(), default=1, help="micro-steps per optimizer step (default 1)")
    p.add_argument("--lr", type=number(0, 1e3, exclusive_minimum=True), default=1e-3,
                   help="learning rate (default 1e-3)")
    p.add_argument("--seed", type=count(0, 2**63 - 1), default=0, metavar="N",
                   help="random seed of the weights and the synthetic data (default 0)")
    p.add_argument("--data", default="synthetic", help="'synthetic' (default) or a text file (bytes are tokens)")
    p.add_argument("--checkpoint-dir", help="save torch.distributed.checkpoint checkpoints here")
    p.add_argument("--checkpoint-every", type=count(0), default=0, help="save every K steps (default: after the last)")
    p.add_argument("--resume", action="store_true",
                   help="continue from the newest complete checkpoint in --checkpoint-dir (from step 0 when "
                        "there is none yet, so a job can be restarted with the same command)")
    p.add_argument("--stop-after", type=count(), help="stop after this step, as if interrupted")
    p.add_argument("--gpu", help="GPU preset for MFU on CUDA (trainmath infer --gpu names; default: from the "
                                 "device name). MFU = the calculator's model FLOPs (no recompute) / step time / "
                                 "dense BF16 peak")
    p.add_argument("--json", action="store_true", help="one JSON object per step")
    p.add_argument("--keep-logs", action="store_true", help="on failure, keep each rank's log and print its folder")
    from trainmath.adapters import add_peft_args

    add_peft_args(p)


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "train", help="train a transformers model with DDP or ZeRO-1/2/3 (torch's or ours), checkpoint, resume",
        description="Train transformers' implementation of MODEL's config (shrunk by --layers, --hidden, ...; random "
                    "weights) on N ranks: DDP, ZeRO-1/2/3 from torch (ZeroRedundancyOptimizer, FSDP2) or from our "
                    "ring collectives. Prints loss, step time and tokens/s per step.")
    add_train_args(p)
    p.set_defaults(func=run)


def config_from_args(args, world_size: int):
    from trainmath.adapters import peft_from_args
    from trainmath.runtime.train.config import TrainConfig, validate

    overrides = {k: getattr(args, k) for k in SHRINK if getattr(args, k) is not None}
    cfg = TrainConfig.of(model=args.model, overrides=overrides, strategy=args.strategy, impl=args.impl, comm=args.comm,
                      precision=args.precision, optimizer=args.optimizer, optimizer_impl=args.optimizer_impl,
                      recompute=args.recompute, micro_batch=args.micro_batch, global_batch=args.global_batch,
                      seq=args.seq, steps=args.steps, grad_accum=args.grad_accum, lr=args.lr, seed=args.seed,
                      data=args.data, checkpoint_dir=args.checkpoint_dir, checkpoint_every=args.checkpoint_every,
                      resume=args.resume, stop_after=args.stop_after, gpu=args.gpu,
                      measure=getattr(args, "measure", False), peft=peft_from_args(args))
    return validate(cfg, world_size)


def under_torchrun() -> bool:
    """True in a process torchrun started (it sets these; our own launcher never runs the CLI in a rank)."""
    return all(k in os.environ for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"))


def run_training(args) -> tuple[dict, dict]:
    """Train; return (rank 0's result, {rank: result} of this node)."""
    from trainmath.runtime.launch import JobSpec

    if under_torchrun():
        world = int(os.environ["WORLD_SIZE"])
        cfg = config_from_args(args, world)
        _check_model(cfg, world, int(os.environ.get("LOCAL_WORLD_SIZE", "1")), args.backend)
        results = {int(os.environ["RANK"]): _torchrun_rank(cfg, args)}
        return results, results
    spec = JobSpec(nproc_per_node=args.nproc, nnodes=args.nnodes, node_rank=args.node_rank, backend=args.backend,
                   master_addr=args.master_addr, master_port=args.master_port, timeout_s=args.timeout)
    cfg = config_from_args(args, spec.world_size)
    _check_model(cfg, spec.world_size, spec.nproc_per_node, args.backend)
    from trainmath.runtime.launch import launch
    from trainmath.runtime.train.loop import prepare, rank_entry

    prepare(cfg)  # imports before the fork, so no rank pays for them

    # Rank 0's live lines come back through a pipe and are printed here, as they arrive (the ranks' own stdout
    # goes to their log files).
    read_fd, write_fd = os.pipe()
    relay = threading.Thread(target=_relay, args=(read_fd,), daemon=True)
    relay.start()
    try:
        results = launch(spec, rank_entry, cfg, write_fd if spec.node_rank == 0 else None, args.json,
                         keep_logs=args.keep_logs)
    finally:
        os.close(write_fd)
        relay.join(timeout=5)
    return results, results


def _relay(read_fd: int) -> None:
    with os.fdopen(read_fd, "r", buffering=1) as lines:
        for line in lines:
            sys.stdout.write(line)
            sys.stdout.flush()


def _check_model(cfg, world_size: int, local_ranks: int, backend: str) -> None:
    """Resolve the config and check that the calculator's peak fits, before any rank starts: a bad model name or
    a model that cannot fit is one line."""
    from trainmath.runtime.train.model import model_spec, shrunk_config
    from trainmath.verify.train import predict

    name, conf = shrunk_config(cfg.model, cfg.overrides)
    spec = model_spec(name, conf)
    if cfg.peft.enabled:  # the targets, the rank against each layer's width, a base already quantized: one line
        from trainmath.adapters import adapter_report

        fused = [m.name for m, _ in adapter_report(spec, cfg.peft, 0).modules if m.parameter]
        if fused:
            raise TrainmathError(f"--lora-targets: {', '.join(fused)} are routed-expert/router parameters, which "
                                 f"peft adapts through target_parameters; trainmath train adapts Linear modules "
                                 f"only: name attention or dense-MLP modules")
    # the full-training peak, an upper bound of a fine-tune's (whose frozen base has no gradients or states)
    peak = predict(spec, cfg, world_size, cuda=backend == "nccl")["peak_bytes"]
    if backend == "nccl":
        import torch

        have = torch.cuda.get_device_properties(0).total_memory if torch.cuda.is_available() else 0
        need, where = peak, "one GPU"
    else:
        have = _available_ram_bytes()
        need, where = peak * local_ranks, f"{local_ranks} CPU rank(s) on this machine"
    if have and need > have:
        raise TrainmathError(f"{name} does not fit: the calculator's peak is {peak / 2**30:,.1f} GiB per rank, "
                             f"{need / 2**30:,.1f} GiB for {where}, which has {have / 2**30:,.1f} GiB available "
                             f"(shrink it with --layers/--hidden/..., or use more ranks and a higher ZeRO stage)")


def _available_ram_bytes() -> int:
    """Linux's MemAvailable (free + reclaimable cache), else free pages; 0 when unknown (no check)."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return 0


def _torchrun_rank(cfg, args) -> dict:
    import datetime

    import torch
    import torch.distributed as dist

    from trainmath.runtime.train.loop import train_rank

    local = int(os.environ["LOCAL_RANK"])
    device = torch.device("cuda", local) if args.backend == "nccl" else torch.device("cpu")
    if args.backend == "nccl":
        torch.cuda.set_device(device)
    dist.init_process_group(args.backend, timeout=datetime.timedelta(seconds=args.timeout))
    try:
        return train_rank(cfg, rank=dist.get_rank(), world_size=dist.get_world_size(), group=dist.group.WORLD,
                          device=device, as_json=args.json)
    finally:
        dist.destroy_process_group()


def run(args) -> int:
    results, _ = run_training(args)
    if not results:
        raise TrainmathError("no rank returned a result")
    first = results[min(results)]
    if not args.json and first["records"] and min(results) == 0:
        r = first["records"][-1]
        print(f"trained {first['model']}: {len(first['records'])} step(s), last loss {r['loss']:.6f}")
    return 0
