"""Serving speed on this machine's CPU: `trainmath infer --device cpu` against transformers' `generate()` with a
static KV cache, on small Llama-shaped models built from a config (random weights: speed does not depend on them).

    python benchmarks/serving_cpu.py [--quick] [--json OUT]

For each case (batch, input, output): TTFT measured as the time of `generate(max_new_tokens=1)`, TPOT as
(time of `generate(max_new_tokens=O)` − TTFT) / (O − 1), both the best of a few runs; predicted by
`trainmath infer CONFIG --device cpu --dtype fp32 --kv-dtype fp32 --batch B --input I --output O --json`, whose
CPU FLOP/s and bandwidth come from its own microbenchmark (trainmath.runtime.cpu_rates); both sides use one
thread, so other jobs on the machine stall them less. Prints measured,
predicted and their ratio. The cases cover prefill vs decode, batch scaling and context scaling.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

MODELS = {
    # name: config overrides of a LlamaConfig (fp32 on CPU)
    "llama-128M": dict(hidden_size=1024, intermediate_size=4096, num_hidden_layers=8, num_attention_heads=16,
                       num_key_value_heads=4, vocab_size=8192, max_position_embeddings=4096),
    "llama-30M": dict(hidden_size=512, intermediate_size=2048, num_hidden_layers=6, num_attention_heads=8,
                      num_key_value_heads=8, vocab_size=8192, max_position_embeddings=4096),
}
CASES = [  # (batch, input, output)
    (1, 128, 33), (4, 128, 33), (16, 128, 33),  # batch scaling
    (1, 1024, 33),  # context scaling (prefill and decode)
]
QUICK = [(1, 128, 17), (8, 128, 17)]


def build(name: str, where: str):
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(**MODELS[name], torch_dtype="float32", tie_word_embeddings=False)
    path = os.path.join(where, name)
    os.makedirs(path, exist_ok=True)
    cfg.save_pretrained(path)
    torch.manual_seed(0)
    return LlamaForCausalLM(cfg).eval(), os.path.join(path, "config.json")


def measure(model, batch: int, inp: int, out: int, repeats: int = 3) -> tuple[float, float]:
    import torch

    ids = torch.randint(0, model.config.vocab_size, (batch, inp))

    def run(n: int) -> float:
        best = float("inf")
        for _ in range(repeats):
            t = time.perf_counter()
            with torch.no_grad():
                model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=n, min_new_tokens=n,
                               do_sample=False, cache_implementation="static", pad_token_id=0)
            best = min(best, time.perf_counter() - t)
        return best

    ttft = run(1)
    total = run(out)
    return ttft, (total - ttft) / (out - 1)


def predict(config: str, batch: int, inp: int, out: int) -> dict:
    cmd = [sys.executable, "-m", "trainmath", "infer", config, "--device", "cpu", "--dtype", "fp32", "--kv-dtype",
           "fp32", "--batch", str(batch), "--input", str(inp), "--output", str(out), "--json"]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}  # the same single thread as the measurement
    return json.loads(subprocess.run(cmd, check=True, capture_output=True, text=True, env=env).stdout)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="one small model, two cases")
    ap.add_argument("--json", help="write the rows here")
    a = ap.parse_args()
    import torch

    torch.set_num_threads(1)  # one thread: no barrier stalls when other jobs share the cores
    rows = []
    with tempfile.TemporaryDirectory() as where:
        for name in (["llama-30M"] if a.quick else list(MODELS)):
            model, config = build(name, where)
            for batch, inp, out in (QUICK if a.quick else CASES):
                ttft, tpot = measure(model, batch, inp, out)
                p = predict(config, batch, inp, out)
                rows.append({"model": name, "batch": batch, "input": inp, "output": out, "ttft_s": ttft,
                             "tpot_s": tpot, "pred_ttft_s": p["ttft_s"], "pred_tpot_s": p["tpot_s"],
                             "ttft_bound": p["ttft_bound"], "tpot_bound": p["tpot_bound"],
                             "cpu_flops_per_s": p["device_flops_per_s"], "cpu_bytes_per_s": p["device_bytes_per_s"]})
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads; CPU measured by the command: "
          f"{rows[0]['cpu_flops_per_s'] / 1e9:.1f} GFLOP/s fp32 matmul, {rows[0]['cpu_bytes_per_s'] / 1e9:.2f} GB/s")
    print(f"{'model':<11} {'B':>3} {'I':>5} {'O':>3} | {'TTFT meas':>10} {'pred':>9} {'ratio':>6} {'bound':>8} | "
          f"{'TPOT meas':>10} {'pred':>9} {'ratio':>6} {'bound':>8}")
    for r in rows:
        print(f"{r['model']:<11} {r['batch']:>3} {r['input']:>5} {r['output']:>3} | {r['ttft_s'] * 1e3:>8.1f}ms "
              f"{r['pred_ttft_s'] * 1e3:>7.1f}ms {r['pred_ttft_s'] / r['ttft_s']:>6.2f} {r['ttft_bound']:>8} | "
              f"{r['tpot_s'] * 1e3:>8.1f}ms {r['pred_tpot_s'] * 1e3:>7.1f}ms {r['pred_tpot_s'] / r['tpot_s']:>6.2f} "
              f"{r['tpot_bound']:>8}")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(rows, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
