"""``trainmath plot latency MODEL --gpu G --input I --output O``: TPOT and throughput against the batch."""

from __future__ import annotations

import argparse

from trainmath.args import add_strict, count
from trainmath.cli.infer_speed import MAX_SEQS, MAX_TOKENS


def add_latency(kinds, out) -> None:
    q = kinds.add_parser("latency", help="serving: TPOT and output throughput against the batch, knee marked",
                         description="TPOT (predicted and the efficiency-1 floor) and output tokens/s against the "
                                     "batch for one deployment, the roofline knee marked (the model of "
                                     "`trainmath infer --input --output`).")
    q.add_argument("model", metavar="MODEL")
    q.add_argument("--gpu", required=True)
    q.add_argument("--input", type=count(1, MAX_TOKENS, what="a token count"), default=1024)
    q.add_argument("--output-tokens", type=count(1, MAX_TOKENS, what="a token count"), default=256,
                   help="generated tokens per request (default 256; -o is the file)")
    q.add_argument("--tp", type=count(1, 1024), default=1)
    q.add_argument("--dtype", default="auto")
    q.add_argument("--kv-dtype", default="bf16")
    q.add_argument("--max-batch", type=count(1, MAX_SEQS), default=1024)
    add_strict(q)
    out(q)


def latency(args: argparse.Namespace):
    from trainmath.hardware import gpu as find_gpu
    from trainmath.infer import CacheFormat, InferenceSetup, WeightFormat
    from trainmath.infer.dtypes import KV_DTYPES, dtype_name, shipped_format
    from trainmath.plot.latency import latency_charts
    from trainmath.sources import load_spec

    spec = load_spec(args.model, strict=args.strict)
    if args.dtype.strip().lower() == "auto":
        weights = shipped_format(spec.options.get("quantization_config"), source=spec.name)
    else:
        weights = WeightFormat(dtype=dtype_name(args.dtype, what="weight dtype"))
    setup = InferenceSetup(batch=1, context=args.input + args.output_tokens, tp=args.tp, weights=weights,
                           cache=CacheFormat(kv_dtype=dtype_name(args.kv_dtype, KV_DTYPES, "kv dtype")))
    batches = []
    b = 1
    while b <= args.max_batch:
        batches.append(b)
        b *= 2
    return latency_charts(spec, setup, find_gpu(args.gpu), input=args.input, output=args.output_tokens,
                          batches=tuple(batches))
