"""The setup flags shared by ``plot memory``, ``report`` and ``serve`` — one definition, so the web page
validates a value exactly as the command line does and shows the same one-line message.

Standard library and the pure core only (imported at CLI start-up).
"""

from __future__ import annotations

import argparse

from trainmath.args import add_mem_util, byte_size, integer
from trainmath.errors import TrainmathError
from trainmath.infer.dtypes import KV_DTYPES, WEIGHT_DTYPES
from trainmath.vocabulary import (
    ATTENTION,
    MEMORY_ATTENTION,
    MEMORY_ATTENTION_HELP,
    OFFLOAD,
    OPTIMIZERS,
    PROFILES,
    RECIPES,
    RECOMPUTE,
    attention_as,
)

# The choices are the calculator's own tables (pure Python, no heavy import); the serving formats are
# `trainmath infer`'s (WEIGHT_DTYPES, KV_DTYPES from trainmath.infer.dtypes).
PRECISIONS = tuple(RECIPES)


class RaisingParser(argparse.ArgumentParser):
    """An ArgumentParser whose errors are a ``TrainmathError`` (the page shows the line; nothing exits)."""

    def error(self, message: str):
        raise TrainmathError(message)


def add_training_flags(p: argparse.ArgumentParser, *, required: bool = True) -> None:
    """``trainmath memory``'s flags: the step (micro-batch, sequence, precision, optimizer, recompute, ...) and
    the parallel layout, with the same names, choices and defaults."""
    g = p.add_argument_group("training step (as trainmath memory)")
    g.add_argument("--micro-batch", type=integer, required=required, default=None if required else 1,
                   help="sequences per micro-batch per DP rank")
    g.add_argument("--seq", type=integer, required=required, default=None if required else 4096,
                   help="tokens per sequence")
    g.add_argument("--precision", choices=PRECISIONS, default="mixed-bf16")
    g.add_argument("--optimizer", choices=OPTIMIZERS, default="adamw")
    g.add_argument("--optimizer-impl", choices=("foreach", "fused"), default="foreach")
    g.add_argument("--recompute", choices=RECOMPUTE, default="none")
    g.add_argument("--attention", choices=ATTENTION, default="sdpa", help=MEMORY_ATTENTION_HELP)
    g.add_argument("--profile", choices=PROFILES, default="hf")
    g.add_argument("--micro-batches", type=integer, default=None, help="micro-batches per step (default: at least pp)")
    g.add_argument("--offload", choices=OFFLOAD, default="none",
                   help="ZeRO-Offload: optimizer states and step on the CPU; params (with --zero 3): also the "
                        "parameter shards (adds the host RAM per node)")
    lay = p.add_argument_group("parallel layout")
    lay.add_argument("--zero", type=integer, default=0, help="ZeRO stage 0-3 over data parallel")
    for name in ("dp", "tp", "pp", "cp", "ep"):
        lay.add_argument(f"--{name}", type=integer, default=1)
    lay.add_argument("--sp", action="store_true", help="Megatron sequence parallelism (with tp > 1)")
    p.add_argument("--gpu", default=None, help="GPU preset to fit against (h100, h200, a100, b200, ...)")
    add_mem_util(p)
    p.add_argument("--host-memory", type=byte_size, default=None, metavar="BYTES",
                   help="host RAM per node for the verdict with --offload (e.g. 2TiB; default 2 TiB, a DGX H100's)")


def add_serving_flags(p: argparse.ArgumentParser) -> None:
    """The serving setup of the report's KV-cache section (a subset of ``trainmath infer``)."""
    g = p.add_argument_group("serving (as trainmath infer)")
    g.add_argument("--serve-batch", type=integer, default=1, help="sequences in the KV cache (default 1)")
    g.add_argument("--context", type=integer, default=None, help="tokens per sequence held (default: --seq)")
    g.add_argument("--weights-dtype", choices=WEIGHT_DTYPES, default="bf16", help="serving weights (default bf16)")
    g.add_argument("--kv-dtype", choices=KV_DTYPES, default="bf16", help="K/V cache format (default bf16)")
    g.add_argument("--serve-output", type=integer, default=128,
                   help="with --gpu: tokens generated per request for the serving speed, after a prompt of "
                        "--context tokens (default 128)")


def add_plan_flags(p: argparse.ArgumentParser) -> None:
    """The planner's job size (``trainmath plan``'s --gpus and --global-batch): with --gpu, the report and the page
    add the planner's best layouts on that many GPUs."""
    g = p.add_argument_group("planner (as trainmath plan)")
    g.add_argument("--gpus", type=integer, default=None,
                   help="with --gpu: add the planner's best layouts on this many GPUs (as trainmath plan)")
    g.add_argument("--global-batch", type=integer, default=None,
                   help="sequences per step for the planner (default: micro-batch × GPUs)")


def plan_from_args(args: argparse.Namespace, spec, setup, gpu):
    """The planner's best layouts for the parsed flags (``PlanResult``), or None when --gpus is not given."""
    if args.gpus is None:
        return None
    from trainmath.adapters import peft_from_args
    from trainmath.report.gather import plan_for

    return plan_for(spec, setup, gpus=args.gpus, gpu=gpu, global_batch=args.global_batch,
                    mem_util_percent=args.mem_util, peft=peft_from_args(args))


def training_from_args(args: argparse.Namespace):
    """(TrainingSetup, ParallelLayout, GPU or None) from parsed flags; every problem in one error."""
    from trainmath.layout import ParallelLayout, layout_problems
    from trainmath.memory.training import TrainingSetup, check_setup

    setup = TrainingSetup(micro_batch=args.micro_batch, seq=args.seq, precision=args.precision,
                          optimizer=args.optimizer, optimizer_impl=args.optimizer_impl, recompute=args.recompute,
                          attention=attention_as(args.attention, MEMORY_ATTENTION), profile=args.profile,
                          micro_batches=args.micro_batches,
                          offload=getattr(args, "offload", "none"))
    layout = ParallelLayout(dp=args.dp, tp=args.tp, pp=args.pp, cp=args.cp, ep=args.ep, sp=args.sp, zero=args.zero)
    bad = check_setup(setup) + layout_problems(layout)
    if bad:
        raise TrainmathError("; ".join(bad))
    gpu = None
    if args.gpu:
        from trainmath.hardware import gpu as find_gpu

        gpu = find_gpu(args.gpu)
    return setup, layout, gpu


def serving_from_args(args: argparse.Namespace):
    """The ``InferenceSetup`` of the serving flags (context defaults to the training sequence length)."""
    from trainmath.infer import CacheFormat, InferenceSetup, WeightFormat

    context = args.context if args.context is not None else args.seq
    for name, v in (("serve-batch", args.serve_batch), ("context", context)):
        if not isinstance(v, int) or v < 1:
            raise TrainmathError(f"{name} must be a positive integer, got {v!r}")
    return InferenceSetup(batch=args.serve_batch, context=context, tp=args.tp,
                          weights=WeightFormat(dtype=args.weights_dtype), cache=CacheFormat(kv_dtype=args.kv_dtype))
