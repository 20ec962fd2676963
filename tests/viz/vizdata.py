"""Synthetic documents in the JSON shapes the plots read (comm bench rows, a memory timeline, a plan), built
from the stated shapes so the plots are tested before `memory --timeline` and `plan` exist on this branch."""

from __future__ import annotations


def comm_rows() -> list[dict]:
    rows = []
    for impl, bw in (("native", 4e9), ("ring", 2.5e9)):
        for k in range(16, 23):
            size = 2**k
            t = 20e-6 + size / bw
            rows.append({"op": "all_reduce", "impl": impl, "nproc": 4, "backend": "gloo", "dtype": "float32",
                         "size_bytes": size, "count": size // 4, "time_s": t, "algbw_bytes_per_s": size / t,
                         "busbw_bytes_per_s": 1.5 * size / t, "predicted_time_s": 25e-6 + size / (0.9 * bw)})
    return rows


def timeline(layers: int = 4, gib: int = 2**30) -> dict:
    """A step of a ``layers``-layer model: weights + states, activations growing through forward, freed in
    backward while gradients appear, the optimizer's temporaries, zero_grad."""
    events, live = [], 10 * gib
    events.append({"event": "start", "bytes": live})
    for i in range(layers):
        live += 3 * gib
        events.append({"event": f"forward/layer.{i}", "bytes": live})
    live += 4 * gib
    events.append({"event": "loss/logits_fp32", "bytes": live})
    for i in reversed(range(layers)):
        live += 1 * gib - 3 * gib
        events.append({"event": f"backward/layer.{i}", "bytes": live + gib})
    live -= 4 * gib
    events.append({"event": "optimizer/step", "bytes": live + 2 * gib})
    events.append({"event": "zero_grad", "bytes": live - layers * gib})
    peak = max(events, key=lambda e: e["bytes"])
    return {"model": "synthetic-4L", "timeline": events, "peak_event": peak["event"], "fits": True,
            "margin_bytes": 80 * gib - peak["bytes"]}


def plan(n: int = 24) -> dict:
    layouts = []
    for i in range(n):
        tp, pp = 2 ** (i % 3), 1 + i % 2
        step = 1.0 + 0.15 * i
        layouts.append({"dp": 64 // (tp * pp), "tp": tp, "pp": pp, "cp": 1, "ep": 1, "zero": i % 4,
                        "recompute": "full" if i % 2 else "none", "micro_batch": 1 + i % 2,
                        "step_time_s": step, "tokens_per_s": 1e6 / step, "tflops_per_gpu": 400 / step,
                        "mfu": 0.5 / step, "peak_bytes": (30 + 7 * ((i * 5) % 11)) * 2**30, "fits": i % 5 != 4,
                        "breakdown": {"compute": 0.7 * step, "tp_all_reduce": 0.1 * step, "dp_reduce_scatter":
                                      0.05 * step, "pipeline_bubble": 0.1 * step, "optimizer": 0.05 * step}})
    return {"layouts": layouts, "rejected": {"does not fit": 40, "tp does not divide heads": 12}}
