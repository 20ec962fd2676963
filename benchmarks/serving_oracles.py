"""Serving speed against published benchmark runs: `tests/infer/published_serving.json` (each record transcribed
with its exact source location), predicted by `trainmath.infer.speed` / `trainmath.infer.batching`.

    python benchmarks/serving_oracles.py [--file PATH] [--json OUT] [--residuals] [--overlap-scan]

Prints, per source and metric (ttft_s, tpot_s, output_tokens_per_s, e2e_s), the count, the median |error| and
the share within 15%, three ways (below). ``--residuals`` adds every record's signed error (stored constants and
leave-one-source-out) and the median signed error per group of a likely cause: source, GPU generation, the
regime (``prefill`` when the predicted prefill is over half the e2e time, else ``decode``), the architecture
(``moe``, ``mla``, ``dense``), the tensor-parallel degree and the fixed batch or concurrency. ``--overlap-scan``
refits everything for each p of the compute/memory overlap norm (``infer.speed.combine``) and prints both errors.

Concurrency records run the continuous-batching steady state within vLLM's KV capacity (requests past it
queue; below it a prompt waits for the prompts ahead in the prefill budget: their TTFT includes both). A record
with ``attention_dp`` (TensorRT-LLM's enable_attention_dp) is laid out as one attention replica per GPU (tp 1)
with its expert parallelism. The K/V cache holds the heads each source's engine stores (the source's ``kv_heads``:
``kv-heads``, the config's K/V heads, for TensorRT-LLM and vLLM; ``infer.kv.CacheFormat.kv_heads``). Records the
calculator cannot price are listed as skipped.

- ``stored``: the GPU generation's constants as stored in hardware/serving.json (written by
  benchmarks/serving_calibrate.py from these records: in-sample);
- ``fitted``: a compute (prefill) and a memory (decode) efficiency, a per-step and a per-layer overhead per GPU
  generation, fitted on every record (minimising the median |log(predicted / published)| by coordinate descent
  over grids from several starts, ``STARTS``), never per run or per source;
- ``leave-one-source-out``: for each source, the per-generation constants fitted on the other sources only,
  then that source predicted — the honest out-of-sample figure.

The step components are computed once per record at efficiency 1 and without overhead (compute and memory
times scale as 1 / the efficiency, the overhead adds step_s + layers · layer_s to every step; the link
efficiency stays the generation's), so the fits are cheap.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
from collections import defaultdict

METRICS = ("ttft_s", "tpot_s", "output_tokens_per_s", "e2e_s")
HERE = os.path.dirname(os.path.abspath(__file__))
DEFAULT = os.path.relpath(os.path.join(HERE, "..", "tests", "infer", "published_serving.json"))
COMPUTE_GRID = [round(0.20 + 0.05 * i, 2) for i in range(17)]  # 0.20 .. 1.00
MEMORY_GRID = [round(0.40 + 0.05 * i, 2) for i in range(13)]  # 0.40 .. 1.00
STEP_GRID = [0.0, 0.5e-3, 1e-3, 1.5e-3, 2e-3, 3e-3, 4e-3, 6e-3]  # s per forward step
LAYER_GRID = [0.0, 10e-6, 20e-6, 30e-6, 40e-6, 60e-6, 80e-6, 100e-6]  # s per layer per step
GRIDS = (COMPUTE_GRID, MEMORY_GRID, STEP_GRID, LAYER_GRID)
NEUTRAL = (0.5, 0.7, 0.0, 0.0)
"""What a generation without training records gets (no stored constant leaks in); the first start of every fit."""
STARTS = (NEUTRAL, (0.5, 0.7, 3e-3, 0.0), (0.5, 0.7, 0.0, 20e-6), (0.7, 0.5, 1e-3, 0.0), (0.3, 0.9, 0.0, 0.0),
          (0.5, 0.7, 6e-3, 0.0))
"""Starts of the coordinate descent: the median |log| objective is piecewise constant and not convex (a fixed
overhead trades against the memory fraction), so one start stalls in a local optimum; these span that trade."""


def _setup(r: dict, kv_heads: str = "model-code"):
    from trainmath.infer import CacheFormat, InferenceSetup, WeightFormat
    from trainmath.infer.dtypes import dtype_name

    n = r.get("batch") or r.get("concurrency") or 1
    # attention data parallel: the engine's --tp splits no attention weight; every rank is an attention replica
    tp = 1 if r.get("attention_dp") else r.get("tp") or 1
    return InferenceSetup(batch=n, context=r["input"] + r["output"], tp=tp, ep=r.get("ep") or 1,
                          gpus=r.get("gpus"), weights=WeightFormat(dtype=dtype_name(r.get("weights_dtype") or "bf16")),
                          cache=CacheFormat(kv_dtype=dtype_name(r.get("kv_dtype") or "bf16", what="kv dtype"),
                                            kv_heads=kv_heads))


def raw(r: dict, kv_heads: str = "model-code") -> dict:
    """The record's steps at compute and memory efficiency 1, without overhead: (other GEMM compute, other weight
    memory, communication, attention compute, cache memory, routed-expert compute, routed-expert memory) of each."""
    from dataclasses import replace

    from trainmath.hardware import gpu as find_gpu
    from trainmath.infer.batching import EngineMemory, steady_state, vllm_capacity
    from trainmath.infer.speed import Efficiency, Part, decode_samples, step
    from trainmath.sources import load_spec

    spec, gpu, setup = load_spec(r["model"]), find_gpu(r["gpu"]), _setup(r, kv_heads)
    unit = replace(Efficiency.of(gpu), compute=1.0, memory=1.0, step_s=0.0, layer_s=0.0)

    def trip(s) -> tuple[float, ...]:
        return (s.compute_s - s.attention_compute_s - s.expert_compute_s,
                s.memory_s - s.cache_memory_s - s.expert_memory_s, s.comm_s,
                s.attention_compute_s, s.cache_memory_s, s.expert_compute_s, s.expert_memory_s)

    inp, out = r["input"], r["output"]
    if r.get("batch"):
        b = r["batch"]
        pre = trip(step(spec, setup, gpu, (Part(n=b, t=inp, c=0),), unit))
        dec = [trip(step(spec, setup, gpu, (Part(n=b, t=1, c=c),), unit))
               for c in decode_samples(inp, max(out - 1, 1))]
        return {"generation": gpu.generation, "layers": spec.num_layers, "kind": "batch", "n": b,
                "arch": _arch(spec),
                "I": inp, "O": out, "prefill": pre,
                "decode": dec}
    cap = vllm_capacity(spec, setup, gpu, request_tokens=inp + out, engine=EngineMemory())
    st = steady_state(spec, setup, gpu, concurrency=r["concurrency"], input=inp, output=out, eff=unit,
                      capacity=cap.max_concurrency)
    return {"generation": gpu.generation, "layers": spec.num_layers, "kind": "concurrency", "arch": _arch(spec),
            "n": r["concurrency"], "I": inp, "O": out,
            "step": trip(st.step), "chunk": trip(st.chunk_step), "p": st.prefill_steps, "queue": st.queue_factor,
            "running": st.running, "per_step": max(1, st.chunk_tokens // inp)}


def _arch(spec) -> str:
    kinds = {b.kind for layer in spec.layers for b in layer.blocks}
    return "mla" if "mla" in kinds else "moe" if "moe" in kinds else "dense"


def prefill_wait(prompt_s: float, per_step: int, running: int, e2e_s: float) -> float:
    from trainmath.infer.batching import prefill_wait as wait

    return wait(prompt_s, per_step, running, e2e_s)


def predict(x: dict, compute: float, memory: float, step_s: float = 0.0, layer_s: float = 0.0,
            overlap: float | None = None) -> dict:
    """The record's figures at these constants; ``overlap`` is the p of ``infer.speed.combine`` (default: the
    stored ``overlap_norm``), as ``Step.time_s`` joins each kernel class's compute and memory times."""
    from trainmath.infer.speed import combine, overlap_norm

    p = overlap_norm() if overlap is None else overlap
    over = step_s + x["layers"] * layer_s

    def t(trip) -> float:
        c, m, k, ac, cm, ec, em = trip
        return (combine(c / compute, m / memory, p) + combine(ec / compute, em / memory, p)
                + combine(ac / compute, cm / memory, p) + k + over)

    if x["kind"] == "batch":
        ttft = t(x["prefill"])
        tpot = sum(t(d) for d in x["decode"]) / len(x["decode"])
    else:
        tpot = t(x["step"])
        first = 0.5 * tpot + x["p"] * t(x["chunk"])
        first += prefill_wait(x["p"] * t(x["chunk"]), x["per_step"], x["running"], first + (x["O"] - 1) * tpot)
        ttft = first + (x["queue"] - 1) * (first + (x["O"] - 1) * tpot)  # past the KV capacity requests queue
    e2e = ttft + (x["O"] - 1) * tpot
    return {"ttft_s": ttft, "tpot_s": tpot, "e2e_s": e2e, "output_tokens_per_s": x["n"] * x["O"] / e2e}


def errors(records, raws, consts) -> list[tuple[str, str, float]]:
    """(source, metric, relative error) for every published metric."""
    out = []
    for r in records:
        x = raws[r["id"]]
        p = predict(x, *consts[x["generation"]])
        for k in METRICS:
            if r.get(k):
                out.append((r["source"], k, p[k] / r[k] - 1))
    return out


def score(rs, raws, const) -> float:
    """Median |log(predicted / published)| over every published metric of ``rs``."""
    logs = []
    for r in rs:
        p = predict(raws[r["id"]], *const)
        logs += [abs(math.log(p[k] / r[k])) for k in METRICS if r.get(k)]
    return statistics.median(logs) if logs else 0.0


def descend(rs, raws, start, passes: int = 3) -> tuple[float, tuple]:
    """(score, constants) of coordinate descent over the grids from ``start``."""
    best = list(start)
    best_score = score(rs, raws, best)
    for _ in range(passes):
        for i, grid in enumerate(GRIDS):
            for v in grid:
                trial = best[:i] + [v] + best[i + 1:]
                sc = score(rs, raws, trial)
                if sc < best_score - 1e-12:
                    best, best_score = trial, sc
    return best_score, tuple(best)


def fit(records, raws, passes: int = 3, overlap: float | None = None) -> dict:
    """Per generation, the (compute, memory, step_s, layer_s) minimising the median |log(pred / published)|:
    the best of coordinate descents over the grids from each of ``STARTS`` (the first start wins ties);
    generations without records get ``NEUTRAL``. With ``overlap`` the constants carry that p of
    ``infer.speed.combine`` as a fifth, fixed element (the stored ``overlap_norm`` otherwise)."""
    extra = () if overlap is None else (overlap,)
    by_gen = defaultdict(list)
    for r in records:
        by_gen[raws[r["id"]]["generation"]].append(r)
    consts = defaultdict(lambda: NEUTRAL + extra)
    for gen, rs in by_gen.items():
        best = None
        for start in (s + extra for s in STARTS):
            trial = descend(rs, raws, start, passes)
            if best is None or trial[0] < best[0] - 1e-12:
                best = trial
        consts[gen] = best[1]
    return consts


def table(title: str, errs) -> list[str]:
    lines = [title, f"  {'source':<28} {'metric':<20} {'n':>3} {'median |err|':>13} {'within 15%':>11}"]
    groups = defaultdict(list)
    for src, k, e in errs:
        groups[(src, k)].append(abs(e))
        groups[("ALL", k)].append(abs(e))
    for (src, k), es in sorted(groups.items(), key=lambda kv: (kv[0][0] == "ALL", kv[0])):
        share = sum(e <= 0.15 for e in es) / len(es)
        lines.append(f"  {src:<28} {k:<20} {len(es):>3} {statistics.median(es) * 100:>12.1f}% {share * 100:>10.0f}%")
    return lines


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--file", default=DEFAULT, help="published records (default tests/infer/published_serving.json)")
    ap.add_argument("--json", help="write every record's prediction here")
    ap.add_argument("--overlap-scan", action="store_true",
                    help="print the in-sample and leave-one-source-out errors for each overlap norm p (slow)")
    ap.add_argument("--residuals", action="store_true",
                    help="print every record's signed error and the median signed error per group of a likely cause")
    a = ap.parse_args()
    if not os.path.exists(a.file):
        print(f"no published records at {a.file}")
        return 1
    with open(a.file) as f:
        data = json.load(f)
    records, raws, skipped, defaults = load(data)
    gens = {raws[r["id"]]["generation"] for r in records}
    print(f"{len(records)} records from {len({r['source'] for r in records})} sources ({a.file}); "
          f"{len(skipped)} skipped")
    for s in skipped:
        print(f"  skipped {s}")
    from trainmath.infer.speed import overlap_norm

    print(f"compute/memory overlap norm p = {overlap_norm():g} (hardware/serving.json overlap_norm, every generation)")
    lines = table("stored constants (hardware/serving.json, fitted in-sample by serving_calibrate.py):",
                  errors(records, raws, defaults))
    consts = fit(records, raws)
    lines += table("fitted on all sources (compute, memory, step_s, layer_s per generation: "
                   + ", ".join(f"{g} {fmt(consts[g])}" for g in sorted(gens)) + "):", errors(records, raws, consts))
    lines += table("leave-one-source-out (constants fitted on the other sources):", loso(records, raws))
    print("\n".join(lines))
    if a.residuals:
        print("\n".join(residuals(records, raws, defaults)))
    if a.overlap_scan:
        print("\n".join(overlap_scan(records, raws)))
    if a.json:
        with open(a.json, "w") as f:
            json.dump([{"id": r["id"], "published": {k: r.get(k) for k in METRICS},
                        "predicted": predict(raws[r["id"]], *consts[raws[r["id"]]["generation"]])} for r in records],
                      f, indent=1)
    return 0


def fmt(const) -> str:
    c, m, s, layer = const[:4]
    return f"({c:.2f}, {m:.2f}, {s * 1e3:.1f} ms, {layer * 1e6:.0f} us)"


def loso(records, raws, overlap: float | None = None) -> list:
    """Errors of each source predicted by constants fitted on the other sources only."""
    out = []
    for src in sorted({r["source"] for r in records}):
        train = [r for r in records if r["source"] != src]
        held = [r for r in records if r["source"] == src]
        out += errors(held, raws, fit(train, raws, overlap=overlap))
    return out


OVERLAP_SCAN = (math.inf, 6.0, 4.0, 3.0, 2.5, 2.0, 1.5)
"""The p of ``infer.speed.combine`` that ``--overlap-scan`` compares (∞: the plain roofline max)."""


def overlap_scan(records, raws) -> list[str]:
    """Median |error| in-sample (a fresh fit) and leave-one-source-out for each p of ``OVERLAP_SCAN``: how the
    stored ``overlap_norm`` was chosen (the lowest leave-one-source-out TTFT and tokens/s together)."""
    keys = ("tpot_s", "output_tokens_per_s", "ttft_s")
    lines = ["", "overlap norm p: median |error| in-sample (fresh fit) / leave-one-source-out",
             f"  {'p':>5} " + " ".join(f"{k:>27}" for k in keys)]
    for p in OVERLAP_SCAN:
        med = []
        for errs in (errors(records, raws, fit(records, raws, overlap=p)), loso(records, raws, overlap=p)):
            by = defaultdict(list)
            for _, k, e in errs:
                by[k].append(abs(e))
            med.append({k: statistics.median(v) * 100 for k, v in by.items()})
        lines.append(f"  {p:>5} " + " ".join(f"{med[0][k]:>12.1f}% / {med[1][k]:>10.1f}%" for k in keys))
    return lines


def loso_consts(records, raws) -> dict:
    """Per record id, the constants fitted on the other sources (``loso``'s fits)."""
    out = {}
    for src in sorted({r["source"] for r in records}):
        consts = fit([r for r in records if r["source"] != src], raws)
        out.update({r["id"]: consts for r in records if r["source"] == src})
    return out


def groups(r: dict, x: dict, p: dict) -> dict:
    """The record's group under each likely cause of a residual."""
    prefill = p["ttft_s"] > 0.5 * p["e2e_s"]
    n = "concurrency" if x["kind"] == "concurrency" else "batch"
    size = x["n"]
    band = "1" if size == 1 else "2-32" if size <= 32 else "33-256" if size <= 256 else ">256"
    return {"source": r["source"], "generation": x["generation"], "regime": "prefill" if prefill else "decode",
            "architecture": x["arch"], "tp": f"tp {r.get('tp') or 1}", "size": f"{n} {band}"}


def residuals(records, raws, defaults) -> list[str]:
    """Every record's signed error (stored constants, leave-one-source-out) and the median per cause group."""
    held = loso_consts(records, raws)
    lines = ["", "per record: signed error = predicted / published - 1 (stored constants; leave-one-source-out)",
             f"  {'id':<58} {'metric':<20} {'published':>11} {'stored':>8} {'loso':>8}"]
    by = defaultdict(list)
    for r in records:
        x = raws[r["id"]]
        p = predict(x, *defaults[x["generation"]])
        q = predict(x, *held[r["id"]][x["generation"]])
        for k in METRICS:
            if r.get(k):
                e, f = p[k] / r[k] - 1, q[k] / r[k] - 1
                lines.append(f"  {r['id']:<58} {k:<20} {r[k]:>11.4g} {e * 100:>+7.1f}% {f * 100:>+7.1f}%")
                metric = "ttft_s" if k == "ttft_s" else "speed"  # TPOT, tok/s and e2e move together
                fast = (e, f) if k == "output_tokens_per_s" else (r[k] / p[k] - 1, r[k] / q[k] - 1)
                for cause, g in groups(r, x, p).items():
                    by[(cause, g, metric)].append(fast)
    lines += ["", "median speed error per group: predicted speed / published speed - 1, positive = predicted too "
              "fast (ttft_s: published / predicted TTFT; speed: tpot_s, e2e_s and output_tokens_per_s together)",
              f"  {'cause':<13} {'group':<26} {'metric':<11} {'n':>3} {'stored':>8} {'loso':>8}"]
    for (cause, g, metric), es in sorted(by.items()):
        lines.append(f"  {cause:<13} {g:<26} {metric:<11} {len(es):>3} "
                     f"{statistics.median(e for e, _ in es) * 100:>+7.1f}% "
                     f"{statistics.median(f for _, f in es) * 100:>+7.1f}%")
    return lines


def load(data: dict):
    """(records priced, their raw steps by id, skipped lines, stored constants by generation)."""
    from trainmath.errors import TrainmathError
    from trainmath.hardware import gpu as find_gpu
    from trainmath.infer.speed import Efficiency

    records, raws, skipped = [], {}, []
    for r in data["records"]:
        try:
            raws[r["id"]] = raw(r, data["sources"][r["source"]].get("kv_heads", "model-code"))
            records.append(r)
        except (TrainmathError, KeyError) as e:
            skipped.append(f"{r.get('id')}: {e}")
    defaults = {}
    for r in records:
        g = find_gpu(r["gpu"])
        e = Efficiency.of(g)
        defaults[g.generation] = (e.compute, e.memory, e.step_s, e.layer_s)
    return records, raws, skipped, defaults


if __name__ == "__main__":
    sys.exit(main())
