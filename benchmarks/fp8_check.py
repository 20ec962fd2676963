"""FP8 step time vs published FP8 runs on H100, and the modelled end-to-end FP8 / BF16 speed-up.

    python benchmarks/fp8_check.py

Each run is a published Megatron/NeMo FP8 pre-training benchmark on DGX-H100 (sources below, transcribed with the
search tool); ``--precision fp8`` is Transformer Engine's recipe (``trainmath.perf.compute``). The hopper
efficiency curve is the one fitted to the BF16 runs (gpus.json 'generations'); nothing is fitted here. The
publisher's table has no BF16 row at the same layout, so the BF16 column is the model's, not a measurement.
"""

from __future__ import annotations

import json
import pathlib
import sys

from trainmath.hardware import gpu
from trainmath.layout import ParallelLayout
from trainmath.perf import Job, estimate
from trainmath.sources import load_spec

NEMO = "NVIDIA/NeMo docs/source/performance/performance_summary.md@070a0bb168d405d653b9734c0017cf5078e77c0d"
BRIDGE = "NVIDIA-NeMo/Megatron-Bridge docs/performance-summary.md@00b7660be0254ac6f95f44164ddd0c3e9cc798ed"
RUNS = (  # model, gpus, global batch, micro-batch, seq, tp, pp, cp, vp, zero, tokens/s/GPU published, source
    ("meta-llama/Llama-3.1-70B", 64, 128, 1, 8192, 4, 4, 2, 5, 1, 1533,
     f"{NEMO}, Pretraining (NeMo 24.07, DGX-H100, FP8) row LLAMA3-70B"),
    ("meta-llama/Llama-3.1-405B", 1024, 512, 1, 8192, 8, 8, 2, 8, 1, 292,
     f"{BRIDGE}, 25.11 NeMo Container, System: DGX-H100, row LLAMA3.1_405B (FP8-CS)"),
    ("meta-llama/Llama-3.1-8B", 8, 128, 1, 8192, 1, 1, 1, 1, 3, 14451,
     f"{BRIDGE}, 25.11 NeMo Container, System: DGX-H100, row LLAMA3_8B (FP8-CS, FSDP 1)"),
)


def main() -> None:
    h100 = gpu("h100")
    print(f"{'model':28s} {'layout':24s} {'published':>9s} {'fp8':>9s} {'ratio':>6s} {'bf16':>9s} {'fp8/bf16':>8s}")
    for name, n, gb, mb, seq, tp, pp, cp, vp, zero, published, _ in RUNS:
        spec = load_spec(name)
        lay = ParallelLayout(dp=n // (tp * pp * cp), tp=tp, pp=pp, cp=cp, sp=tp > 1, zero=zero)
        rates = {}
        for prec in ("fp8", "mixed-bf16"):
            job = Job(global_batch=gb, seq=seq, micro_batch=mb, virtual_stages=vp, precision=prec,
                      uneven_stages=True)
            rates[prec] = estimate(spec, lay, job, h100, memory=False).tokens_per_s / n
        desc = f"tp{tp} pp{pp} cp{cp} vp{vp} zero{zero}"
        print(f"{name.split('/')[-1]:28s} {desc:24s} {published:9,d} {rates['fp8']:9,.0f} "
              f"{rates['fp8'] / published:6.3f} {rates['mixed-bf16']:9,.0f} {rates['fp8'] / rates['mixed-bf16']:8.2f}")
    print("tokens/s per GPU; sources:")
    for r in RUNS:
        print(f"  {r[0]}: {r[-1]}")
    pairs()


def pairs() -> None:
    here = pathlib.Path(__file__).resolve().parents[1] / "tests" / "perf"
    sys.path.insert(0, str(here))
    from published_more import predict

    data = json.loads((here / "published_runs_more.json").read_text())
    runs = {r["id"]: r for r in (data["runs"] if isinstance(data, dict) else data)}

    def rest(r):
        return r["layout"], {k: v for k, v in r["job"].items() if k != "precision"}

    print()
    print(f"{'BF16/FP8 pair (published_runs_more.json)':48s} {'published':>9s} {'model':>6s} {'ratio':>6s}")
    for rid, bf in runs.items():
        f8 = runs.get(rid.replace("-bf16-", "-fp8-")) if "-bf16-" in rid else None
        if f8 is None or rest(bf) != rest(f8):
            continue
        step = bf["metric"] == "step_time_s"  # a time: the gain is bf16 / fp8
        pub = bf["published"] / f8["published"] if step else f8["published"] / bf["published"]
        mod = predict(bf) / predict(f8) if step else predict(f8) / predict(bf)
        print(f"{rid.replace('-bf16', ''):48s} {pub:9.3f} {mod:6.3f} {mod / pub:6.3f}")
    print("gain = FP8 throughput / BF16 throughput at the same layout; ratio = modelled / published gain")


if __name__ == "__main__":
    main()
