"""``trainmath infer-plan MODEL --gpu G --qps Q --input I --output O --ttft-slo S --tpot-slo S``: the serving
deployments that meet both SLOs, fewest GPUs first; exit 1 with the closest one when none does."""

from __future__ import annotations

import argparse
import json

from trainmath.args import add_strict, count, number
from trainmath.cli.infer_speed import MAX_TOKENS


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "infer-plan",
        help="serving SLO sizing: TP x EP x replicas x concurrency meeting TTFT and TPOT at a request rate",
        description="Ranks serving deployments (tensor / expert parallel layout, replicas, requests in flight per "
                    "replica) that meet both SLOs at QPS requests/s, by Little's law over the continuous-batching "
                    "model of `trainmath infer --concurrency`, within vLLM's KV capacity. Exit 1 when none meets, "
                    "with the closest deployment.",
    )
    p.add_argument("model", metavar="MODEL", help="config.json path, directory, catalog name or Hub id")
    p.add_argument("--gpu", required=True, help="GPU preset")
    p.add_argument("--qps", type=number(0, 1e7, exclusive_minimum=True, unit="requests/s"), required=True)
    p.add_argument("--input", type=count(1, MAX_TOKENS, what="a token count"), required=True)
    p.add_argument("--output", type=count(1, MAX_TOKENS, what="a token count"), required=True)
    p.add_argument("--ttft-slo", type=number(0, 3600, exclusive_minimum=True, unit="seconds"), required=True)
    p.add_argument("--tpot-slo", type=number(0, 60, exclusive_minimum=True, unit="seconds"), required=True)
    p.add_argument("--gpus-max", type=count(1, 4096, what="a GPU count"), default=64,
                   help="largest instance to consider (default 64)")
    p.add_argument("--price-per-gpu-hour", type=number(0, 1e4, unit="$/GPU-hour"), default=None)
    p.add_argument("--dtype", default="auto", help="weights (default: the checkpoint's shipped format)")
    p.add_argument("--kv-dtype", default="bf16", help="K/V cache format (default bf16)")
    p.add_argument("--kv-heads", choices=("kv-heads", "model-code"), default="kv-heads",
                   help="heads the K/V cache stores: kv-heads (default: the config's K/V heads, as vLLM allocates "
                        "it) or model-code (as the model's transformers code caches them)")
    p.add_argument("--max-num-batched-tokens", type=count(1, MAX_TOKENS, what="a token count"), default=8192)
    p.add_argument("--top", type=count(1, 100), default=5)
    p.add_argument("--json", action="store_true")
    add_strict(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from trainmath.args import positions_warning
    from trainmath.hardware import gpu as find_gpu
    from trainmath.infer import CacheFormat, InferenceSetup, WeightFormat
    from trainmath.infer.batching import EngineMemory
    from trainmath.infer.dtypes import KV_DTYPES, dtype_name, shipped_format
    from trainmath.infer.plan import plan
    from trainmath.sources import load_spec

    spec = load_spec(args.model, strict=args.strict)
    warning = positions_warning(spec, args.input + args.output, "--input + --output")
    gpu = find_gpu(args.gpu)
    if args.dtype.strip().lower() == "auto":
        weights = shipped_format(spec.options.get("quantization_config"), source=spec.name)
    else:
        weights = WeightFormat(dtype=dtype_name(args.dtype, what="weight dtype"))
    setup = InferenceSetup(batch=1, context=args.input + args.output, weights=weights,
                           cache=CacheFormat(kv_dtype=dtype_name(args.kv_dtype, KV_DTYPES, "kv dtype"),
                                             kv_heads=args.kv_heads))
    engine = EngineMemory(max_num_batched_tokens=args.max_num_batched_tokens)
    found, closest = plan(spec, setup, gpu, qps=args.qps, input=args.input, output=args.output,
                          ttft_slo=args.ttft_slo, tpot_slo=args.tpot_slo, gpus_max=args.gpus_max, engine=engine,
                          top=args.top)
    price = args.price_per_gpu_hour
    if args.json:
        print(json.dumps({"model": spec.name, "gpu": gpu.name, "qps": args.qps, "input": args.input,
                          "output": args.output, "ttft_slo_s": args.ttft_slo, "tpot_slo_s": args.tpot_slo,
                          "kv_heads": args.kv_heads,
                          "deployments": [d.to_dict(price, args.qps) for d in found],
                          "closest": closest.to_dict(price, args.qps) if closest else None,
                          "warnings": [warning] if warning else []}, indent=1))
        return 0 if found else 1
    head = (f"{spec.name} on {gpu.name}: {args.qps:g} requests/s of {args.input:,} in / {args.output:,} out, "
            f"TTFT <= {args.ttft_slo:g} s, TPOT <= {args.tpot_slo * 1e3:g} ms, weights {weights.dtype}, "
            f"kv {setup.cache.kv_dtype}")
    print(head)
    print("")
    if not found:
        if closest is None:
            print("nothing meets: no layout up to --gpus-max holds the weights and one request's cache")
        else:
            print("nothing meets both SLOs; closest: " + _line(closest, price, args.qps))
        if warning:
            print(f"warning: {warning}")
        return 1
    for i, d in enumerate(found, 1):
        print(f"{i}. " + _line(d, price, args.qps))
    print("")
    print("convention: Little's law (in flight = throughput x e2e); concurrency per instance is the largest meeting "
          "both SLOs within vLLM's KV capacity (gpu_memory_utilization 0.9, 16-token blocks) and max_num_seqs 256 "
          f"per attention replica; chunked prefill budget {args.max_num_batched_tokens:,} tokens; "
          f"engine stores KV heads as: {args.kv_heads}")
    if warning:
        print(f"warning: {warning}")
    return 0


def _line(d, price, qps) -> str:
    cost = f", ${d.cost_per_million_output_tokens(price, qps):,.3f} per 1M output tokens" if price is not None else ""
    return (f"{d.gpus} GPUs = {d.replicas} x (tp {d.tp}, ep {d.ep}, {d.instance_gpus} GPU(s)) at {d.concurrency} "
            f"in flight each: TTFT {d.state.ttft_s:.3f} s, TPOT {d.state.tpot_s * 1e3:.1f} ms, "
            f"{d.requests_per_s:.2f} requests/s per instance; binding: {d.binding}{cost}")
