"""Serving speed on one GPU (H100 / H200): static-cache torch prefill and decode at several batches and contexts,
measured beside `trainmath.infer.speed`'s prediction for the same GPU preset.

    python benchmarks/gpu_serving.py [--model meta-llama/Llama-3.1-8B] [--gpu h100] [--json OUT]
    python benchmarks/gpu_serving.py --device cpu --tiny      # a smoke run of the same code on a CPU

The model is built from its catalog config with random weights in bf16 (speed does not depend on the values),
eager attention through torch SDPA; a ``StaticCache`` of the largest context is allocated once. For each
(batch, context):

- prefill: one forward of (batch, context) tokens into an empty cache, timed with CUDA events (best of 3);
- decode: 16 single-token forwards after a prefill of ``context`` tokens, their mean (cache positions advancing).

The prediction is ``step()`` of the same parts on the preset (default efficiencies of its generation) and at
efficiency 1 (the floor). Columns: measured ms, predicted ms, ratio predicted / measured, bound.
"""

from __future__ import annotations

import argparse
import json
import sys
import time

BATCHES = (1, 8, 32, 128)
CONTEXTS = (512, 2048, 8192)


def build(model: str, tiny: bool, device: str):
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    from trainmath.sources import resolve

    if tiny:
        from transformers import LlamaConfig

        cfg = LlamaConfig(hidden_size=256, intermediate_size=1024, num_hidden_layers=2, num_attention_heads=4,
                          num_key_value_heads=2, vocab_size=1024, max_position_embeddings=4096)
    else:
        d = {k: v for k, v in resolve(model).config.items() if not k.startswith("_")}
        cfg = AutoConfig.for_model(d.pop("model_type"), **d)
    cfg._attn_implementation = "sdpa"
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    with torch.device(device):
        m = AutoModelForCausalLM.from_config(cfg, dtype=dtype).eval()
    return m, cfg


def timer(device: str):
    import torch

    def run(fn, repeats: int) -> float:
        best = float("inf")
        for _ in range(repeats):
            if device == "cuda":
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record()
                fn()
                end.record()
                torch.cuda.synchronize()
                best = min(best, start.elapsed_time(end) / 1e3)
            else:
                t = time.perf_counter()
                fn()
                best = min(best, time.perf_counter() - t)
        return best

    return run


def measure(m, cfg, batch: int, context: int, device: str, decode_steps: int = 16) -> tuple[float, float]:
    import torch
    from transformers import StaticCache

    run = timer(device)
    ids = torch.randint(0, cfg.vocab_size, (batch, context), device=device)
    cache = StaticCache(config=cfg, max_cache_len=context + decode_steps + 1)

    def prefill():
        cache.reset()
        m(input_ids=ids, past_key_values=cache, use_cache=True, logits_to_keep=1,
          cache_position=torch.arange(context, device=device))

    with torch.no_grad():
        prefill()  # warm-up
        t_prefill = run(prefill, 3)
        one = torch.randint(0, cfg.vocab_size, (batch, 1), device=device)

        def decode():
            for i in range(decode_steps):
                m(input_ids=one, past_key_values=cache, use_cache=True,
                  cache_position=torch.tensor([context + i], device=device))

        prefill()
        decode()  # warm-up
        prefill()
        t_decode = run(decode, 1) / decode_steps
    return t_prefill, t_decode


def predict(spec, gpu, batch: int, context: int, tiny_cpu: bool):
    from trainmath.infer import InferenceSetup
    from trainmath.infer.speed import FLOOR, Efficiency, Part, step

    setup = InferenceSetup(batch=batch, context=context + 1)
    eff = FLOOR if tiny_cpu else Efficiency.of(gpu)
    pre = step(spec, setup, gpu, (Part(n=batch, t=context, c=0),), eff)
    dec = step(spec, setup, gpu, (Part(n=batch, t=1, c=context + 8),), eff)
    return pre, dec, step(spec, setup, gpu, (Part(n=batch, t=1, c=context + 8),), FLOOR)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="meta-llama/Llama-3.1-8B")
    ap.add_argument("--gpu", default="h100", help="preset to predict for (h100, h200)")
    ap.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    ap.add_argument("--tiny", action="store_true", help="a 2-layer model (smoke test of the script)")
    ap.add_argument("--json", help="write the rows here")
    a = ap.parse_args()
    import torch

    from trainmath.hardware import gpu as find_gpu
    from trainmath.sources import load_spec

    if a.device == "cuda" and not torch.cuda.is_available():
        print("no CUDA device: run on a GPU machine (or --device cpu --tiny for a smoke run)")
        return 1
    m, cfg = build(a.model, a.tiny, a.device)
    if a.tiny:
        import os
        import tempfile

        where = tempfile.mkdtemp()
        cfg.save_pretrained(where)
        spec = load_spec(os.path.join(where, "config.json"))
    else:
        spec = load_spec(a.model)
    gpu = find_gpu(a.gpu)
    batches, contexts = ((1, 4), (64, 256)) if a.tiny else (BATCHES, CONTEXTS)
    name = torch.cuda.get_device_name() if a.device == "cuda" else "cpu"
    print(f"{spec.name} on {name}, predicted for {gpu.name}; torch {torch.__version__}")
    print(f"{'B':>4} {'ctx':>6} | {'prefill ms':>10} {'pred':>8} {'ratio':>6} {'bound':>8} | "
          f"{'decode ms':>9} {'pred':>8} {'floor':>8} {'ratio':>6} {'bound':>8}")
    rows = []
    for b in batches:
        for c in contexts:
            try:
                tp, td = measure(m, cfg, b, c, a.device)
            except torch.OutOfMemoryError:
                print(f"{b:>4} {c:>6} | out of memory")
                torch.cuda.empty_cache()
                continue
            pre, dec, floor = predict(spec, gpu, b, c, a.tiny and a.device == "cpu")
            rows.append({"batch": b, "context": c, "prefill_s": tp, "decode_s": td, "pred_prefill_s": pre.time_s,
                         "pred_decode_s": dec.time_s, "floor_decode_s": floor.time_s, "prefill_bound": pre.bound,
                         "decode_bound": dec.bound})
            print(f"{b:>4} {c:>6} | {tp * 1e3:>10.2f} {pre.time_s * 1e3:>8.2f} {pre.time_s / tp:>6.2f} "
                  f"{pre.bound:>8} | {td * 1e3:>9.3f} {dec.time_s * 1e3:>8.3f} {floor.time_s * 1e3:>8.3f} "
                  f"{dec.time_s / td:>6.2f} {dec.bound:>8}")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(rows, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
