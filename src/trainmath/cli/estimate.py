"""``trainmath estimate MODEL --gpus N --gpu NAME --seq S --global-batch G``: the step time of one layout, its
breakdown, MFU/HFU, memory per GPU with a fit verdict, and the cost of a token budget."""

from __future__ import annotations

import argparse
import json

from trainmath.args import add_mem_util, byte_size, count, number, tokens
from trainmath.vocabulary import ATTENTION, OFFLOAD, OPTIMIZERS, RECIPES, RECOMPUTE, STEP_ATTENTION, attention_as

# The choices are the calculator's own tables (pure Python, no heavy import).
PRECISIONS = tuple(RECIPES)


JOB_REQUIRED = ("gpus", "gpu", "seq", "global_batch")
"""The job arguments without a default (``plot plan`` takes them optionally and checks them itself)."""


def add_job_arguments(p: argparse.ArgumentParser, *, model: bool = True, required: bool = True,
                      printing: bool = True, gpus_auto: bool = False, offload_auto: bool = False) -> None:
    """The arguments ``estimate``, ``plan`` and ``plot plan`` share (``plot plan`` names its own positional and
    makes the job optional, since it also reads a PLAN.json)."""
    if model:
        p.add_argument("model", metavar="MODEL")
    if gpus_auto:  # plan: a count, or auto (how many GPUs: with --deadline or --budget)
        p.add_argument("--gpus", type=_gpus_or_auto, default=None,
                       help="GPUs in the job, or auto: the fewest that meet --deadline, or the count whose layout is "
                            "fastest within --budget (default auto when either is given)")
    else:
        p.add_argument("--gpus", type=count(), required=required, help="GPUs in the job")
    p.add_argument("--gpu", required=required, help="GPU preset (case-insensitive, e.g. h100, a100-80gb, mi300x)")
    p.add_argument("--seq", type=count(), required=required, help="tokens per sequence")
    p.add_argument("--global-batch", type=count(), required=required, help="sequences per optimizer step, all DP ranks")
    p.add_argument("--gpus-per-node", type=count(), default=None,
                   help="GPUs per node (NVLink domain); default: the preset's reference node")
    p.add_argument("--hardware", metavar="FILE", default=None,
                   help="JSON file of extra GPUs / efficiency curves with the fields of hardware/gpus.json")
    p.add_argument("--precision", choices=PRECISIONS, default="mixed-bf16",
                   help="training precision recipe (default mixed-bf16); fp8 = Transformer Engine's: the decoder's "
                        "linear layers (fprop, dgrad, wgrad) in FP8 with their casts, attention and the LM head BF16")
    p.add_argument("--fp8-head", action="store_true",
                   help="with --precision fp8: run the LM head's GEMMs in FP8 too")
    p.add_argument("--optimizer", choices=OPTIMIZERS, default="adamw")
    p.add_argument("--dtype", choices=("bf16", "fp8"), default="bf16",
                   help="tensor-core format of the GEMMs (under --precision fp8, the recipe decides) and MFU's "
                        "denominator peak (default bf16)")
    p.add_argument("--attention", choices=ATTENTION, default="flash",
                   help="attention kernel: flash (default) or eager (materialised s×s scores); sdpa is read as flash")
    p.add_argument("--flash-kernel", choices=("native", "te", "fa2"), default="native",
                   help="flash kernel and its fitted share of peak: native (the GPU generation's, default), te "
                        "(Transformer Engine: Megatron-Core, NeMo) or fa2 (FlashAttention-2: flash-attn 2, PyTorch "
                        "SDPA; below native on Hopper)")
    p.add_argument("--mfu-causal", choices=("executed", "half"), default="executed",
                   help="attention FLOPs in MFU/HFU: executed (all s², Megatron-LM/PaLM, default) or half")
    p.add_argument("--profile", choices=("megatron", "hf"), default=None,
                   help="activation profile of the memory model: megatron (default; any layout) or hf "
                        "(transformers' saved tensors per rank: plain --tp keeps embedding, head and loss whole; "
                        "the default and the only one with --peft)")
    p.add_argument("--moe-imbalance", type=number(1, 1000), default=1.0,
                   help="MoE load imbalance: tokens routed to the busiest expert-parallel rank / the mean (default 1: "
                        "balanced; with a capacity factor and token dropping, at most that factor)")
    add_mem_util(p)
    add_offload_arguments(p, auto=offload_auto)
    from trainmath.cli.peft_job import add_arguments as add_peft_arguments

    add_peft_arguments(p)  # --peft lora|qlora: the fine-tune's step (perf.peft)
    if printing:  # what is printed; a chart has no use for these
        p.add_argument("--tokens", type=tokens, default=None,
                       help="token budget (1T, 300B, ...): time, GPU-hours and cost")
        p.add_argument("--price-per-gpu-hour", type=number(0, 1e6), default=None,
                       help="price of one GPU-hour, for --tokens")
        p.add_argument("--json", action="store_true", help="print one JSON object")


def add_offload_arguments(p: argparse.ArgumentParser, *, auto: bool = False) -> None:
    """--offload, --host-memory and --host-bandwidth (``perf.offload``; docs/offload.md)."""
    choices = OFFLOAD + (("auto",) if auto else ())
    p.add_argument("--offload", choices=choices, default="none",
                   help="DeepSpeed offload, timed (PCIe copies, DeepSpeedCPUAdam on the host) and fitted on the GPU "
                        "and the host: optimizer (ZeRO-Offload, ZeRO 1-3) or params (ZeRO-3, also the parameter "
                        "shards); with --peft, optimizer over ZeRO 1-2, the adapters alone"
                   + ("; auto: also search none, optimizer and params" if auto else ""))
    p.add_argument("--host-memory", type=byte_size, default=None, metavar="BYTES",
                   help="host RAM per node for the host fit with --offload (e.g. 2TiB, 512GB; default 2 TiB, a DGX "
                        "H100's)")
    p.add_argument("--host-bandwidth", type=number(0, 1e5, exclusive_minimum=True), default=None, metavar="GB/s",
                   help="achieved host DRAM rate of the CPU optimizer step per node, GB/s (default: fitted to a "
                        "published DeepSpeedCPUAdam step, docs/offload.md)")


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "estimate",
        help="step time, MFU/HFU and memory of one training layout on a GPU cluster; GPU-hours of a token budget",
        description="Step time of one training layout (compute at the GPU generation's efficiency, each exposed "
                    "collective, pipeline bubble, optimizer step), tokens/s, TFLOP/s per GPU, MFU and HFU, memory "
                    "per GPU with a fit verdict, and with --tokens the time, GPU-hours and cost of a budget. "
                    "With --peft lora|qlora, the fine-tune's step: frozen base fprop + dgrad, the adapters' GEMMs, "
                    "QLoRA's dequantisation, MFU over the fine-tune's executed FLOPs (one device, DDP, ZeRO-1/2).",
    )
    add_job_arguments(p)
    p.add_argument("--tp", type=count(), default=1)
    p.add_argument("--pp", type=count(), default=1)
    p.add_argument("--cp", type=count(), default=1)
    p.add_argument("--ep", type=count(), default=1)
    p.add_argument("--dp", type=count(), default=None, help="default: GPUs / (tp·pp·cp)")
    p.add_argument("--zero", type=int, default=1, choices=(0, 1, 2, 3), help="ZeRO stage (default 1)")
    p.add_argument("--sp", action="store_true", help="Megatron sequence parallelism (with tp > 1)")
    p.add_argument("--recompute", choices=RECOMPUTE, default="none",
                   help="activation recompute (default none): selective = torchtitan's op-level policy with the hf "
                        "profile (every 2nd mm and SDPA cached), Korthikanti et al.'s with --profile megatron"
                        "; timed and counted in HFU the same way; full = every decoder layer")
    p.add_argument("--micro-batch", type=count(), default=1, help="sequences per micro-batch (default 1)")
    p.add_argument("--virtual-stages", type=count(), default=1, help="interleaved 1F1B chunks per pipeline rank")
    p.add_argument("--uneven-stages", action="store_true",
                   help="allow pp·virtual-stages not dividing the layers (stages differ by one layer)")
    p.add_argument("--decoder-first-pipeline-num-layers", type=int, default=None, metavar="N",
                   help="decoder layers on the first pipeline stage, as Megatron-LM's flag (the stages between "
                        "share the rest evenly)")
    p.add_argument("--decoder-last-pipeline-num-layers", type=int, default=None, metavar="N",
                   help="decoder layers on the last pipeline stage, as Megatron-LM's flag")
    p.set_defaults(func=run)


def _gpus_or_auto(text: str):
    if text.strip().lower() == "auto":
        return "auto"
    try:
        return count()(text)
    except argparse.ArgumentTypeError:
        raise argparse.ArgumentTypeError(f"must be a positive integer (at most 2**40) or auto, got "
                                         f"{text[:40]!r}") from None


def load(args: argparse.Namespace):
    """(spec, GPU, Hardware, Job, token budget) from the shared arguments; bad values raise TrainmathError."""
    from trainmath.args import positions_warning
    from trainmath.errors import TrainmathError
    from trainmath.hardware import presets, read_hardware_file
    from trainmath.perf import Job
    from trainmath.perf.tokens import parse_tokens
    from trainmath.sources import load_spec

    bad = [f"--{k.replace('_', '-')} must be a positive integer, got {getattr(args, k)}"
           for k in ("gpus", "seq", "global_batch") if isinstance(getattr(args, k), int) and getattr(args, k) < 1]
    if args.gpus_per_node is not None and args.gpus_per_node < 1:
        bad.append(f"--gpus-per-node must be a positive integer, got {args.gpus_per_node}")
    price, budget = getattr(args, "price_per_gpu_hour", None), getattr(args, "tokens", None)
    if price is not None and (price < 0 or budget is None):
        bad.append("--price-per-gpu-hour needs --tokens and a price >= 0")
    if bad:
        raise TrainmathError("; ".join(bad))
    budget_tokens = parse_tokens(budget) if isinstance(budget, str) else budget
    hw = read_hardware_file(args.hardware) if args.hardware else presets()
    gpu = hw.gpu(args.gpu)
    if args.gpus_per_node and args.gpus_per_node != gpu.gpus_per_node:
        from dataclasses import replace

        gpu = replace(gpu, gpus_per_node=args.gpus_per_node)
    spec = load_spec(args.model)
    positions_warning(spec, args.seq, "--seq")  # learned positions: an error, as in flops and memory
    job = Job(global_batch=args.global_batch, seq=args.seq, precision=args.precision, optimizer=args.optimizer,
              dtype=args.dtype, attention=attention_as(args.attention, STEP_ATTENTION), mfu_causal=args.mfu_causal,
              mem_util_percent=args.mem_util, flash_kernel=getattr(args, "flash_kernel", "native"),
              profile=args.profile, fp8_head=getattr(args, "fp8_head", False),
              moe_imbalance=getattr(args, "moe_imbalance", 1.0),
              micro_batch=getattr(args, "micro_batch", 1), recompute=getattr(args, "recompute", "none"),
              virtual_stages=getattr(args, "virtual_stages", 1), uneven_stages=getattr(args, "uneven_stages", False))
    job = _with_offload(job, args)
    from trainmath.cli.peft_job import with_peft

    job = with_peft(spec, job, args)
    gpu.peak_flops_per_s(args.dtype)  # an error now if the chip has no such format
    if job.precision == "fp8" and gpu.fp8_flops_per_s is None:
        raise TrainmathError(f"--precision fp8 needs FP8 tensor cores; {gpu.name} has none: use mixed-bf16")
    elif job.fp8_head:
        raise TrainmathError("--fp8-head needs --precision fp8")
    return spec, gpu, hw, job, budget_tokens


def _with_offload(job, args):
    """``job`` with the offload flags (``auto`` leaves it ``none``: the planner searches the modes)."""
    from dataclasses import replace

    from trainmath.errors import TrainmathError
    from trainmath.memory.host import HOST_MEMORY_BYTES, check_host_memory

    offload = getattr(args, "offload", "none")
    host, rate = getattr(args, "host_memory", None), getattr(args, "host_bandwidth", None)
    if offload == "none" and (host is not None or rate is not None):
        raise TrainmathError("--host-memory and --host-bandwidth need --offload (optimizer or params)")
    return replace(job, offload="none" if offload == "auto" else offload,
                   host_memory_bytes=check_host_memory(HOST_MEMORY_BYTES if host is None else host),
                   host_bytes_per_s=None if rate is None else rate * 1e9)


def run(args: argparse.Namespace) -> int:
    from trainmath.errors import TrainmathError
    from trainmath.layout import ParallelLayout
    from trainmath.perf import estimate

    for k in ("tp", "pp", "cp", "ep", "micro_batch", "virtual_stages"):
        if getattr(args, k) < 1:
            raise TrainmathError(f"--{k.replace('_', '-')} must be a positive integer, got {getattr(args, k)}")
    inner = args.tp * args.pp * args.cp
    if args.dp is None and args.gpus % inner:
        raise TrainmathError(f"tp·pp·cp = {args.tp}·{args.pp}·{args.cp} = {inner} must divide the GPU count "
                             f"({args.gpus})")
    dp = args.dp if args.dp is not None else args.gpus // inner
    spec, gpu, hw, job, tokens = load(args)
    layout = ParallelLayout(dp=dp, tp=args.tp, pp=args.pp, cp=args.cp, ep=args.ep, sp=args.sp, zero=args.zero,
                            world_size=args.gpus, first_stage_layers=args.decoder_first_pipeline_num_layers,
                            last_stage_layers=args.decoder_last_pipeline_num_layers)
    est = estimate(spec, layout, job, gpu, hardware=hw)
    budget = est.budget(tokens, args.price_per_gpu_hour) if tokens else None
    if args.json:
        out = est.to_dict()
        if budget:
            out["budget"] = budget
        print(json.dumps(out, indent=1))
    else:
        print(render(est, budget))
    return 0


def render(est, budget: dict | None = None) -> str:
    from trainmath.render import human_bytes, human_flops, table

    lay, job = est.layout, est.job
    lines = [f"{est.model} on {est.gpus} × {est.gpu}: {lay.describe()}, micro-batch {job.micro_batch} × "
             f"{est.micro_batches} per step, {job.virtual_stages} virtual stage(s), recompute {job.recompute}",
             "", summary_line(est), ""]
    if est.peft is not None:
        from trainmath.cli.peft_job import lines as peft_lines

        lines += peft_lines(est)
    rows = [[k, f"{v:.4f}", f"{100 * v / est.step_time_s:.1f}%"] for k, v in est.breakdown.items() if v > 0]
    rows.append(["step", f"{est.step_time_s:.4f}", "100.0%"])
    lines.append(table(["step breakdown", "seconds", "share"], rows))
    lines.append("")
    if len(est.stage_times_s) > 1:
        slow = max(est.stage_times_s)
        lines.append("pipeline stages (layers: compute s per micro-batch): " + ", ".join(
            f"{n}: {t:.4f}" + ("*" if t == slow else "") for n, t in zip(est.stage_layers, est.stage_times_s))
            + "   (* the slowest: it sets the pace and the bubble)")
        lines.append("")
    crow = [[c.name, c.op, f"{c.group}({c.group_size})", c.link, human_bytes(c.size_bytes, "MiB"), f"{c.count:,}",
             human_bytes(c.bytes_per_step, "GB"), f"{c.time_s:.4f}", f"{c.exposed_s:.4f}"]
            for c in est.comm if c.group_size > 1 and c.count]
    if crow:
        lines.append(table(["communication", "op", "group", "link", "size", "per step", "bytes/step", "seconds",
                            "exposed"], crow, align="lllrrrrrr"))
        lines.append("")
    if est.peak_bytes is not None:
        from trainmath.usable import rule_text, usable_bytes

        usable = usable_bytes(est.memory_bytes, job.mem_util_percent)
        verdict = "fits" if est.fits else f"does NOT fit ({human_bytes(est.peak_bytes - usable)} over)"
        lines.append(f"memory per GPU: peak {human_bytes(est.peak_bytes)} of {human_bytes(est.memory_bytes)} "
                     f"({human_bytes(usable)} usable): {verdict}")
        lines.append(rule_text(est.memory_bytes, job.mem_util_percent))
    if est.offload is not None:
        lines += offload_lines(est)
    if budget:
        cost = f", cost {budget['cost']:,.0f} at {budget['price_per_gpu_hour']:g}/GPU-hour" if "cost" in budget else ""
        lines.append(f"budget {budget['tokens']:,} tokens: {budget['steps']:,.0f} steps, {budget['days']:,.2f} days, "
                     f"{budget['gpu_hours']:,.0f} GPU-hours, {budget['training_flops']:.3e} model FLOPs "
                     f"({human_flops(budget['training_flops'])}){cost}")
    lines.append("")
    lines += [f"convention: {c}" for c in est.conventions]
    lines.append("units: GiB = 2**30 bytes, GB = 1e9 bytes, TFLOP/s = 1e12 FLOP/s")
    return "\n".join(lines)


def offload_lines(est) -> list[str]:
    """The offload terms (bytes, rates, seconds) and, when known, the host RAM verdict."""
    from trainmath.render import human_bytes

    o = est.offload
    lines = [f"offload {o['offload']}: per rank {o['shard_params']:,} parameters offloaded; gradients to host "
             f"{human_bytes(o['grad_d2h_bytes'], 'GB')} in {o['grad_d2h_s']:.4f} s, "
             + (f"updated params to GPU {human_bytes(o['update_h2d_bytes'], 'GB')} in {o['update_h2d_s']:.4f} s"
                if o["offload"] == "optimizer" else
                f"param fetches to GPU {human_bytes(o['param_h2d_bytes'], 'GB')} in {o['param_h2d_s']:.4f} s")
             + f" (PCIe {o['pcie_bytes_per_s'] / 1e9:.1f} GB/s achieved per direction)",
             f"CPU optimizer step: {human_bytes(o['cpu_step_bytes_per_node'], 'GB')} of host DRAM traffic per node "
             f"({o['ranks_per_node']} rank{'s' if o['ranks_per_node'] > 1 else ''}) at "
             f"{o['host_bytes_per_s'] / 1e9:.1f} GB/s = {o['cpu_step_s']:.4f} s"]
    if "host_bytes" in o:
        verdict = ("fits" if o["host_fits"] else
                   f"does NOT fit: the host RAM is exceeded ({human_bytes(-o['host_margin_bytes'])} over)")
        lines.append(f"host RAM per node: {o['host_bytes']:,} bytes ({human_bytes(o['host_bytes'])}) of "
                     f"--host-memory {o['host_memory_bytes']:,} bytes ({human_bytes(o['host_memory_bytes'])}): "
                     f"{verdict}")
    return lines


def summary_line(est) -> str:
    return (f"step {est.step_time_s:.3f} s   {est.tokens_per_s:,.0f} tokens/s   {est.tflops_per_gpu:.1f} TFLOP/s "
            f"per GPU (model; {est.hardware_tflops_per_gpu:.1f} hardware)   MFU {100 * est.mfu:.1f}%   "
            f"HFU {100 * est.hfu:.1f}%")
