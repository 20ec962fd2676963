"""``trainmath memory MODEL``: training memory per GPU, a breakdown that sums to the peak."""

from __future__ import annotations

import argparse
import json

from trainmath.cli.args import integer

PRECISIONS = ("fp32", "amp-bf16", "bf16", "mixed-bf16", "fp8")
OPTIMIZERS = ("sgd", "sgd-momentum", "adam", "adamw", "adam-amsgrad", "adafactor", "adam8bit", "adamw8bit", "lion")


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "memory",
        help="training memory per GPU: weights, grads, optimizer states, activations, transients",
        description="Peak training memory of one GPU (what torch.cuda.max_memory_allocated reports for a step) "
                    "with a breakdown that sums to it. MODEL is a config.json path, a directory, a catalog name "
                    "or a Hub repo id.",
    )
    p.add_argument("model", metavar="MODEL")
    p.add_argument("--micro-batch", type=integer, required=True, help="sequences per micro-batch per DP rank")
    p.add_argument("--seq", type=integer, required=True, help="tokens per sequence")
    p.add_argument("--precision", choices=PRECISIONS, default="mixed-bf16")
    p.add_argument("--optimizer", choices=OPTIMIZERS, default="adamw")
    p.add_argument("--optimizer-impl", choices=("foreach", "fused"), default="foreach",
                   help="torch optimizer implementation (fused keeps the step scalars on the GPU)")
    p.add_argument("--recompute", choices=("none", "selective", "full"), default="none")
    p.add_argument("--attention", choices=("sdpa", "eager"), default="sdpa")
    p.add_argument("--profile", choices=("hf", "megatron"), default="hf",
                   help="what the model code saves for backward: transformers or Megatron-Core")
    p.add_argument("--zero", type=integer, default=0, help="ZeRO stage 0-3 over data parallel")
    p.add_argument("--dp", type=integer, default=1)
    p.add_argument("--tp", type=integer, default=1)
    p.add_argument("--pp", type=integer, default=1)
    p.add_argument("--cp", type=integer, default=1)
    p.add_argument("--ep", type=integer, default=1)
    p.add_argument("--sp", action="store_true", help="Megatron sequence parallelism (with tp > 1)")
    p.add_argument("--world-size", type=integer, default=None, help="GPUs; checked to equal dp·tp·pp·cp")
    p.add_argument("--micro-batches", type=integer, default=None,
                   help="micro-batches per step (gradient accumulation); default: at least pp")
    p.add_argument("--json", action="store_true", help="print one JSON object with exact integers")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from trainmath.layout import ParallelLayout
    from trainmath.memory.training import TrainingSetup, training_memory
    from trainmath.sources import load_spec

    setup = TrainingSetup(micro_batch=args.micro_batch, seq=args.seq, precision=args.precision,
                          optimizer=args.optimizer, optimizer_impl=args.optimizer_impl, recompute=args.recompute,
                          attention=args.attention, profile=args.profile, micro_batches=args.micro_batches)
    layout = ParallelLayout(dp=args.dp, tp=args.tp, pp=args.pp, cp=args.cp, ep=args.ep, sp=args.sp,
                            zero=args.zero, world_size=args.world_size)
    # check the cheap things before reading the model
    from trainmath.errors import TrainmathError
    from trainmath.layout import layout_problems
    from trainmath.memory.training import check_setup

    bad = check_setup(setup) + layout_problems(layout)
    if bad:
        raise TrainmathError("; ".join(bad))
    spec = load_spec(args.model)
    report = training_memory(spec, setup, layout)
    if args.json:
        print(json.dumps(report.to_dict(), indent=1))
        return 0
    print(render(report))
    return 0


def render(report) -> str:
    from trainmath.render import human_bytes, table

    s, lay = report.setup, report.layout
    peak = report.peak_bytes
    lines = [f"{report.model}: training memory per GPU",
             f"  micro-batch {s.micro_batch} × seq {s.seq}, {s.precision}, {s.optimizer} ({s.optimizer_impl}), "
             f"recompute {s.recompute}, attention {s.attention}, profile {s.profile}",
             f"  {lay.describe()}  ({lay.ranks} GPUs)", ""]
    rows = []
    for node in report.breakdown.children:
        share = f"{100 * node.value / peak:.1f}%" if peak else "-"
        rows.append([node.name, f"{node.value:,}", human_bytes(node.value), share, node.note])
        if node.name == "activations_bytes" and len(node.children) > 1:
            for c in node.children:
                rows.append([f"  {c.name}", f"{c.value:,}", human_bytes(c.value), "", ""])
    rows.append(["peak_bytes", f"{peak:,}", human_bytes(peak), "100.0%", report.breakdown.note])
    lines.append(table(["term", "bytes", "GiB (2**30)", "share", ""], rows, align="lrrrl"))
    if len(report.stages) > 1:
        lines.append("")
        srows = [[m.stage, f"{m.layers.start}-{m.layers.stop - 1}", m.in_flight, m.phase,
                  f"{m.breakdown.value:,}", human_bytes(m.breakdown.value)] for m in report.stages]
        lines.append(table(["stage", "layers", "in flight", "peak phase", "peak bytes", "GiB"], srows))
    lines.append("")
    lines.append("outside peak_bytes (not tensors; measured at run time): CUDA context, allocator cached-free memory")
    lines.extend(f"convention: {c}" for c in report.conventions)
    return "\n".join(lines)
