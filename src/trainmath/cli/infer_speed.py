"""The speed mode of ``trainmath infer``: ``--input I --output O`` with ``--batch B`` (a fixed batch) or
``--concurrency C`` (continuous batching), on ``--gpu G`` (or ``--device cpu``, measured by a microbenchmark)."""

from __future__ import annotations

import argparse
import json

from trainmath.args import count, number

MAX_TOKENS = 1 << 24
"""16M tokens: longer prompts or outputs than any model serves are refused as absurd."""
MAX_SEQS = 1 << 20
ENGINES = ("transformers", "vllm", "trtllm")


def kv_heads_of(args: argparse.Namespace) -> str:
    """``--kv-heads``, else the ``--engine``'s: the model code's heads for transformers (and no engine), the
    config's K/V heads for vLLM and TensorRT-LLM (``infer.kv.CacheFormat.kv_heads``)."""
    if getattr(args, "kv_heads", None):
        return args.kv_heads
    return "kv-heads" if getattr(args, "engine", None) in ("vllm", "trtllm") else "model-code"


def add_speed_arguments(p: argparse.ArgumentParser) -> None:
    s = p.add_argument_group("serving speed (with --input and --output)")
    s.add_argument("--input", type=count(1, MAX_TOKENS, what="a token count"), default=None,
                   help="prompt tokens per request: with --output, predicts TTFT, TPOT and throughput")
    s.add_argument("--output", type=count(1, MAX_TOKENS, what="a token count"), default=None,
                   help="generated tokens per request")
    s.add_argument("--concurrency", type=count(1, MAX_SEQS, what="a request count"), default=None,
                   help="instead of --batch: requests in flight under continuous batching "
                        "(as `vllm bench serve --max-concurrency C` measures)")
    s.add_argument("--max-num-batched-tokens", type=count(1, MAX_TOKENS, what="a token count"), default=8192,
                   help="chunked-prefill token budget per step (default 8192, vLLM V1's default)")
    s.add_argument("--engine", choices=ENGINES, default=None,
                   help="the engine whose conventions apply: transformers (default: the model code's cache), vllm "
                        "(K/V heads as the config names them, and the KV capacity as vLLM computes it: "
                        "gpu_memory_utilization 0.9, 16-token blocks) or trtllm (K/V heads as the config names them; "
                        "no capacity model)")
    s.add_argument("--gpu-memory-utilization", type=number(0, 1, exclusive_minimum=True), default=0.9,
                   help="--engine vllm: vLLM's gpu_memory_utilization (default 0.9, vLLM's default)")
    s.add_argument("--device", choices=("cpu",), default=None,
                   help="predict for this machine's CPU: its FLOP/s and bandwidth measured by a microbenchmark")


def speed_requested(args: argparse.Namespace) -> bool:
    return any(getattr(args, k, None) is not None for k in ("input", "output", "concurrency", "device"))


def run_speed(args: argparse.Namespace, spec, setup) -> int:
    """Print the speed of ``setup`` (batch and format already resolved by ``cli.infer``)."""
    from trainmath.errors import TrainmathError
    from trainmath.infer.batching import EngineMemory, steady_state, vllm_capacity
    from trainmath.infer.speed import fixed_batch

    if args.input is None or args.output is None:
        raise TrainmathError("serving speed needs both --input and --output")
    if (args.batch is None) == (args.concurrency is None):
        raise TrainmathError("give one of --batch (a fixed batch) or --concurrency (continuous batching)")
    if args.batch is not None and not 1 <= args.batch <= MAX_SEQS:
        raise TrainmathError(f"--batch must be in 1..{MAX_SEQS:,} sequences for serving speed, got {args.batch:,}")
    if args.gpu is None and args.device is None:
        raise TrainmathError("serving speed needs --gpu G (or --device cpu)")
    from trainmath.args import positions_warning

    warning = positions_warning(spec, args.input + args.output, "--input + --output")
    if args.device == "cpu":
        from trainmath.runtime.cpu_rates import measured_cpu

        gpu, eff = measured_cpu()
    else:
        from trainmath.hardware import gpu as find_gpu
        from trainmath.infer.speed import Efficiency

        gpu = find_gpu(args.gpu)
        eff = Efficiency.of(gpu)
    engine = EngineMemory(gpu_memory_utilization=args.gpu_memory_utilization,
                          max_num_batched_tokens=args.max_num_batched_tokens)
    cap = None
    if args.engine == "vllm":
        cap = vllm_capacity(spec, setup, gpu, request_tokens=args.input + args.output, engine=engine)
    if args.concurrency is not None:
        r = steady_state(spec, setup, gpu, concurrency=args.concurrency, input=args.input, output=args.output,
                         budget=args.max_num_batched_tokens, capacity=cap.max_concurrency if cap else None, eff=eff)
    else:
        r = fixed_batch(spec, setup, gpu, input=args.input, output=args.output, eff=eff)
    conventions = [
        *([f"cpu measured: fp32 matmul {gpu.bf16_flops_per_s / 1e9:,.1f} GFLOP/s (reported as its peak), read "
           f"bandwidth {gpu.hbm_bytes_per_s / 1e9:,.2f} GB/s"] if args.device == "cpu" else []),
        f"{gpu.name}: peak bf16 {gpu.bf16_flops_per_s / 1e12:.1f} TFLOP/s, HBM {gpu.hbm_bytes_per_s / 1e12:.2f} TB/s; "
        f"efficiency compute {eff.compute}, memory {eff.memory}, link {eff.link}; overhead "
        f"{eff.step_s * 1e3:g} ms per step + {eff.layer_s * 1e6:g} us per layer (hardware/serving.json)",
        "FLOPs: the op lists' forward fold of the new tokens (causal half), logits only where sampled; routed "
        "experts divided evenly over the ranks (balanced routing), the rest over tp on the busiest attention "
        "replica; step = |GEMM compute, weight bytes| + |routed-expert compute, expert bytes touched| + "
        "|attention compute, cache bytes| + communication + overhead, |c, m| = (c^p + m^p)^(1/p) with p = "
        f"{eff.overlap:g} (hardware/serving.json overlap_norm; inf: the larger); the floor takes the larger",
        "memory: weights touched (routed experts E*[1-(1-k/E)^T]) + cache read + cache written, per rank",
        f"engine: {args.engine or 'transformers'}",
        *setup.cache.conventions(),
    ]
    if args.concurrency is not None:
        conventions.append("continuous batching: chunked prefill, max_num_batched_tokens "
                           f"{args.max_num_batched_tokens:,} (vLLM V1 default 8192; 2048 in older releases), "
                           "decodes scheduled first")
    if cap is not None:
        conventions += cap.conventions()
    if args.json:
        out = {"model": spec.name, "gpu": gpu.name, "device_flops_per_s": gpu.bf16_flops_per_s,
               "device_bytes_per_s": gpu.hbm_bytes_per_s, "tp": setup.tp, "ep": setup.ep, "gpus": setup.ranks,
               "dtype": setup.weights.dtype, "kv_dtype": setup.cache.kv_dtype, **r.to_dict(),
               "vllm": cap.to_dict() if cap else None, "conventions": conventions,
               "warnings": [warning] if warning else []}
        print(json.dumps(out, indent=1))
        return 0
    print(render(spec, setup, gpu, r, cap, args))
    for line in conventions:
        print(f"convention: {line}")
    if warning:
        print(f"warning: {warning}")
    return 0


def _ms(s: float) -> str:
    return f"{s * 1e3:,.2f} ms" if s < 10 else f"{s:,.2f} s"


def _bounds(st) -> str:
    return (f"compute {_ms(st.compute_s)}, memory {_ms(st.memory_s)}, communication {_ms(st.comm_s)}, "
            f"overhead {_ms(st.overhead_s)} -> {st.bound}-bound")


def render(spec, setup, gpu, r, cap, args) -> str:
    per = f"tp {setup.tp}, ep {setup.ep}, {setup.ranks} GPU(s)"
    who = f"batch {r.batch}" if args.concurrency is None else f"concurrency {r.concurrency}"
    lines = [f"{spec.name} on {gpu.name} ({per}): {who}, {args.input:,} in / {args.output:,} out, weights "
             f"{setup.weights.dtype}, kv {setup.cache.kv_dtype}", ""]
    if args.concurrency is None:
        lines += [f"ttft_s  {r.ttft_s:.4g}  (floor {r.prefill_floor.time_s:.4g}): prefill {_bounds(r.prefill)}",
                  f"tpot_s  {r.tpot_s:.4g}  (floor {r.tpot_floor_s:.4g}): decode at mean context {_bounds(r.decode)}",
                  f"e2e_s   {r.e2e_s:.4g}  = TTFT + (O-1) x TPOT",
                  f"output_tokens_per_s   {r.output_tokens_per_s:,.1f}  (B x O / e2e)",
                  f"prefill_tokens_per_s  {r.prefill_tokens_per_s:,.1f}",
                  f"kernel format: {r.kernel_format}"]
    else:
        lines += [f"steady state: {r.running} running ({r.concurrency - r.running} queued), {r.decoding:.1f} decoding "
                  f"and {r.prefill_tokens:,.0f} prefill tokens per step, {r.prefill_steps} prefill chunk(s) per prompt",
                  f"ttft_s  {r.ttft_s:.4g}", f"tpot_s  {r.tpot_s:.4g}  (floor {r.floor.time_s:.4g}): {_bounds(r.step)}",
                  f"e2e_s   {r.e2e_s:.4g}", f"output_tokens_per_s   {r.output_tokens_per_s:,.1f}"]
    if cap is not None:
        lines.append("")
        lines.append(f"vLLM: KV cache {cap.available_bytes / 2**30:,.2f} GiB available per GPU; {cap.log_line()}")
        n = r.batch if args.concurrency is None else r.concurrency
        if n > cap.max_concurrency:
            lines.append(f"{n} requests exceed it: about {n - int(cap.max_concurrency)} queue until others finish")
    return "\n".join(lines)
