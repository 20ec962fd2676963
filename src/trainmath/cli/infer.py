"""``trainmath infer MODEL --batch B --context C``: weights, KV cache and total memory for serving, and what fits."""

from __future__ import annotations

import argparse
import json

from trainmath.args import (
    add_mem_util,
    add_strict,
    byte_size,
    config_json,
    config_lines,
    integer,
    positions_warning,
)
from trainmath.cli.infer_speed import add_speed_arguments, kv_heads_of, run_speed, speed_requested


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "infer",
        help="inference memory and speed: weights (bf16/fp8/int8/int4/mxfp4/nvfp4), KV cache, what fits a GPU, TTFT "
             "and TPOT",
        description="Memory to serve a model, per GPU: weights in a serving format (by default the one the "
                    "checkpoint ships in, from its quantization_config), the cache after a prefill of CONTEXT "
                    "tokens for BATCH sequences (K/V, MLA latent, sliding windows, linear-attention and Mamba "
                    "states), and with --gpu the free memory, the largest batch / context that fit, and when it "
                    "does not fit what would. Conventions are printed with the result.",
    )
    p.add_argument("model", metavar="MODEL", help="config.json path, directory, catalog name or Hub id")
    p.add_argument("--batch", type=integer, default=None, help="sequences in the cache")
    p.add_argument("--context", type=integer, default=None,
                   help="tokens per sequence held (prompt + generated); not needed with --input/--output")
    p.add_argument("--dtype", default="auto",
                   help="weights: auto (default: the format the checkpoint ships in, read from its "
                        "quantization_config; bf16 without one), fp32, bf16, fp16, fp8, int8, int4, mxfp4, nvfp4")
    p.add_argument("--kv-dtype", default="bf16", help="K/V cache: fp32, bf16, fp16, fp8, int8 (default bf16)")
    p.add_argument("--tp", type=integer, default=None,
                   help="tensor-parallel degree of attention and dense weights (default: --gpus); figures are per rank")
    p.add_argument("--ep", type=integer, default=1,
                   help="expert-parallel degree: routed experts split over EP ranks (default 1)")
    p.add_argument("--gpus", type=integer, default=None,
                   help="GPUs of one serving instance (default: --tp); GPUS/TP attention replicas share the batch")
    p.add_argument("--gpu", help="GPU preset (h100, h200, a100, a100-40gb, b200, l40s, 4090, mi300x)")
    add_mem_util(p)
    p.add_argument("--workspace", type=byte_size, default=0, metavar="BYTES",
                   help="activation workspace per rank added to the total, e.g. 2GiB (default 0)")
    q = p.add_argument_group("quantisation conventions")
    q.add_argument("--group-size", type=integer, default=128, help="int4 group / fp8 block size (default 128)")
    q.add_argument("--scale-dtype", default=None,
                   help="scale format (default: int8 fp32 per row, int4 fp16 per group, fp8 fp32 per block)")
    q.add_argument("--zero-point", action="store_true", help="int4: add a packed 4-bit zero point per group")
    q.add_argument("--keep-dtype", default="bf16",
                   help="format of tensors left unquantised: embeddings, lm_head, routers, norms (default bf16)")
    c = p.add_argument_group("cache conventions")
    c.add_argument("--mla-cache", choices=("latent", "expanded"), default="latent",
                   help="MLA: cache the latent (default, as transformers 5 and vLLM) or per-head K/V")
    c.add_argument("--sliding-tokens", choices=("window-1", "window"), default="window-1",
                   help="tokens a sliding layer keeps (default window-1, as transformers' DynamicCache)")
    c.add_argument("--conv-tokens", choices=("kernel", "kernel-1"), default="kernel",
                   help="columns of a conv state (default kernel, as transformers)")
    c.add_argument("--kv-heads", choices=("model-code", "kv-heads"), default=None,
                   help="heads the K/V cache stores: model-code (as the model's transformers code caches them) or "
                        "kv-heads (the config's K/V heads, as TensorRT-LLM and vLLM allocate it); default: model-code, "
                        "kv-heads with --engine vllm or trtllm. They differ for Falcon's new decoder architecture")
    c.add_argument("--state-dtype", default="fp32", help="recurrent/SSM state format (default fp32)")
    c.add_argument("--conv-dtype", default="bf16", help="conv state format (default bf16)")
    p.add_argument("--json", action="store_true", help="print one JSON object with exact integers")
    add_speed_arguments(p)
    add_strict(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from dataclasses import replace

    from trainmath.infer import CacheFormat, InferenceSetup, WeightFormat, infer_memory
    from trainmath.infer.dtypes import KV_DTYPES, dtype_name, shipped_format
    from trainmath.sources import load_spec

    floats = ("fp32", "bf16", "fp16")
    from trainmath.errors import TrainmathError

    speed = speed_requested(args)
    if not speed and (args.batch is None or args.context is None):
        raise TrainmathError("infer needs --batch and --context (or --input and --output for serving speed)")
    spec = load_spec(args.model, strict=args.strict)
    if speed:
        args.context = (args.input or 0) + (args.output or 0) or 1
    warning = None if speed else positions_warning(spec, args.context, "--context")
    keep = dtype_name(args.keep_dtype, floats)
    scale = dtype_name(args.scale_dtype, (*floats, "e8m0"), "scale dtype") if args.scale_dtype else None
    if args.dtype.strip().lower() == "auto":
        weights = replace(shipped_format(spec.options.get("quantization_config"), source=spec.name),
                          keep_dtype=keep, scale_dtype=scale, zero_point=args.zero_point)
    else:
        weights = WeightFormat(dtype=dtype_name(args.dtype, what="weight dtype"), keep_dtype=keep,
                               group_size=args.group_size, zero_point=args.zero_point, scale_dtype=scale)
    tp = args.tp if args.tp is not None else (args.gpus if args.gpus and args.ep == 1 else 1)
    setup = InferenceSetup(
        batch=args.batch if args.batch is not None else (args.concurrency or 1), context=args.context, tp=tp,
        ep=args.ep, gpus=args.gpus, workspace_bytes=args.workspace,
        weights=weights,
        cache=CacheFormat(
            kv_dtype=dtype_name(args.kv_dtype, KV_DTYPES, "kv dtype"), mla_cache=args.mla_cache,
            sliding_tokens=args.sliding_tokens, conv_tokens=args.conv_tokens, kv_heads=kv_heads_of(args),
            state_dtype=dtype_name(args.state_dtype, floats, "state dtype"),
            conv_dtype=dtype_name(args.conv_dtype, floats, "conv dtype")),
    )
    if speed:
        return run_speed(args, spec, setup)
    gpu = None
    if args.gpu:
        from trainmath.hardware import gpu as find_gpu

        gpu = find_gpu(args.gpu)
    report = infer_memory(spec, setup, gpu=gpu, mem_util_percent=args.mem_util)
    if args.json:
        out = report.to_dict()
        out["config"] = config_json(spec)
        out["warnings"] = [warning] if warning else []
        print(json.dumps(out, indent=1))
    else:
        print(render(report))
        for line in config_lines(spec) + ([f"warning: {warning}"] if warning else []):
            print(line)
    return 0


def render(report) -> str:
    from trainmath.render import context_text, human_bytes, table

    s = report.setup
    per = f"per GPU of {s.ranks}: tp={s.tp}, ep={s.ep}" if s.ranks > 1 else "one device"
    lines = [f"{report.model}: batch {s.batch} x context {s.context:,}, weights {s.weights.dtype}, "
             f"kv {s.cache.kv_dtype} ({per})", ""]
    rows = []
    for comp in report.weights.children:
        rows.append([f"weights/{comp.name}", f"{comp.value:,}", human_bytes(comp.value), comp.note])
        for part in comp.children:
            rows.append([f"  {part.name}", f"{part.value:,}", human_bytes(part.value), ""])
    for group in report.kv_cache.children:
        rows.append([f"kv_cache/{group.name}", f"{group.value:,}", human_bytes(group.value), group.note])
        for part in group.children:
            rows.append([f"  {part.name}", f"{part.value:,}", human_bytes(part.value), ""])
    if s.workspace_bytes:
        rows.append(["workspace", f"{s.workspace_bytes:,}", human_bytes(s.workspace_bytes), "given"])
    lines.append(table(["memory", "bytes", "GiB", ""], rows, align="lrrl"))
    lines.append("")
    for label, value in (("weights_bytes", report.weights_bytes), ("kv_cache_bytes", report.kv_cache_bytes),
                         ("total_bytes", report.total_bytes)):
        lines.append(f"{label:<16}{value:>22,}  ({human_bytes(value)}, {human_bytes(value, 'GB')})")
    lines.append(f"kv cache per token (full-attention/MLA layers, per sequence): {report.kv_bytes_per_token:,} bytes")
    f = report.fit
    if f is not None:
        lines.append("")
        lines.append(f"{f.gpu}: {human_bytes(f.memory_bytes)} x {f.mem_util_percent}% - CUDA context = "
                     f"{f.usable_bytes:,} bytes usable; free {f.free_bytes:,} bytes ({human_bytes(f.free_bytes)})")
        if f.fits:
            lines.append(f"fits: {human_bytes(f.free_bytes)} to spare per GPU")
        elif not f.weights_fit:
            lines.append(f"does not fit: the weights alone ({human_bytes(report.weights_bytes)}"
                         + (f" + workspace {human_bytes(s.workspace_bytes)}" if s.workspace_bytes else "")
                         + f") exceed the usable {human_bytes(f.usable_bytes)}, so no batch fits")
        else:
            lines.append(f"does not fit: weights {human_bytes(report.weights_bytes)} + cache "
                         f"{human_bytes(report.kv_cache_bytes)} exceed the usable {human_bytes(f.usable_bytes)} by "
                         f"{human_bytes(-f.free_bytes)}")
        if not f.fits:
            none = "none of --dtype, --kv-dtype, more GPUs (up to 1024) or a smaller batch"
            lines.append("would fit with: " + ("; ".join(f.levers) if f.levers else none))
        lines.append(f"largest batch at context {s.context:,}: {f.max_batch:,}"
                     + ("" if f.weights_fit else " (the weights do not fit)"))
        lines.append(f"largest context at batch {s.batch}: {context_text(f)}")
    lines.append("")
    lines.append("conventions: " + "; ".join(report.conventions))
    return "\n".join(lines)
