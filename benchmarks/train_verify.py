"""Calculator vs measurement for `trainmath train` runs: every strategy × implementation, and precision and
recompute variants, on CPU ranks (gloo) or one GPU per rank (nccl).

    python benchmarks/train_verify.py [--nproc 2] [--backend gloo] [--model qwen3-0.6b] [--shrink 2,64,128,4,2,256]
                                      [--micro-batch 2] [--seq 64] [--steps 4]

Per run: the fields outside tolerance, the peak of step 2 predicted vs measured, and tokens/s (median over steps
3.., a figure, not a target: on shared CPU cores it varies several-fold between repeats).
"""

from __future__ import annotations

import argparse
import statistics
import time

from trainmath.runtime.launch import JobSpec, launch
from trainmath.runtime.train.config import TrainConfig, validate
from trainmath.runtime.train.loop import prepare, rank_entry
from trainmath.runtime.train.model import model_spec, shrunk_config
from trainmath.verify.train import compare, predict

RUNS = [
    {"strategy": "ddp", "impl": "torch"},
    {"strategy": "zero1", "impl": "torch"},
    {"strategy": "zero2", "impl": "torch"},
    {"strategy": "zero3", "impl": "torch"},
    {"strategy": "zero1", "impl": "trainmath"},
    {"strategy": "zero2", "impl": "trainmath"},
    {"strategy": "zero3", "impl": "trainmath"},
    {"strategy": "zero3", "impl": "trainmath", "comm": "torch"},
    {"strategy": "ddp", "impl": "torch", "precision": "bf16"},
    {"strategy": "ddp", "impl": "torch", "precision": "amp-bf16"},
    {"strategy": "zero3", "impl": "trainmath", "precision": "bf16"},
    {"strategy": "zero3", "impl": "torch", "precision": "mixed-bf16"},
    {"strategy": "ddp", "impl": "torch", "recompute": "full"},
    {"strategy": "zero3", "impl": "trainmath", "recompute": "full"},
    {"strategy": "zero3", "impl": "torch", "recompute": "full"},
    {"strategy": "zero2", "impl": "trainmath", "optimizer": "momentum", "optimizer_impl": "trainmath"},
    {"strategy": "ddp", "impl": "torch", "grad_accum": 2},
]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--nproc", type=int, default=2)
    ap.add_argument("--backend", default="gloo")
    ap.add_argument("--model", default="qwen3-0.6b")
    ap.add_argument("--shrink", default="2,64,128,4,2,256", help="layers,hidden,intermediate,heads,kv_heads,vocab")
    ap.add_argument("--micro-batch", type=int, default=2)
    ap.add_argument("--seq", type=int, default=64)
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--fsdp", action="store_true", help="only torch's FSDP2 runs (strategy zero2/zero3, impl torch)")
    ap.add_argument("--detail", action="store_true", help="also print every field outside its tolerance")
    a = ap.parse_args()
    keys = ("layers", "hidden", "intermediate", "heads", "kv_heads", "vocab")
    overrides = dict(zip(keys, map(int, a.shrink.split(",")))) if a.shrink else {}
    print(f"{a.model} {overrides}, {a.nproc} rank(s), {a.backend}, micro-batch {a.micro_batch}, seq {a.seq}, "
          f"adamw unless stated; step 2 measured; peak: MemTracker on CPU, max_memory_allocated on CUDA")
    print(f"{'run':<52} {'fields ok':>9} {'peak pred':>11} {'peak meas':>11} {'err':>6} {'tok/s':>8}  outside")
    for run in RUNS:
        if a.fsdp and not (run["impl"] == "torch" and run["strategy"] in ("zero2", "zero3")):
            continue
        cfg = validate(TrainConfig.of(model=a.model, overrides=overrides, micro_batch=a.micro_batch, seq=a.seq,
                                   steps=a.steps, measure=True, **run), a.nproc)
        prepare(cfg)
        t = time.time()
        res = launch(JobSpec(nproc_per_node=a.nproc, backend=a.backend, timeout_s=120), rank_entry, cfg, None, False)
        name, conf = shrunk_config(cfg.model, cfg.overrides)
        pred = predict(model_spec(name, conf), cfg, a.nproc, cuda=a.backend == "nccl")
        fields = compare(pred, {r: v["measured"] for r, v in res.items()}, cfg)
        peak = next(f for f in fields if f.name == "peak_bytes (rank 0)")
        rate = statistics.median(r["tokens_per_s"] for r in res[0]["records"][2:] or res[0]["records"])
        bad = sorted({f.name.split(" (")[0] for f in fields if not f.ok})
        label = " ".join(f"{k}={v}" for k, v in run.items())
        print(f"{label:<52} {sum(f.ok for f in fields):>4}/{len(fields):<4} {peak.predicted:>11,.0f} "
              f"{peak.measured:>11,.0f} {peak.rel_error:>6.3f} {rate:>8.0f}  {', '.join(bad) or '-'}"
              f"  ({time.time() - t:.1f} s)")
        for f in fields if a.detail else ():
            if not f.ok or f.name.startswith("peak"):
                print(f"    {f.name}: predicted {f.predicted:,.0f} measured {f.measured:,.0f}")


if __name__ == "__main__":
    main()
