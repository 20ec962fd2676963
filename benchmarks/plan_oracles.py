"""Predicted vs published: every run of tests/perf/published_runs.json through the step-time model.

    python benchmarks/plan_oracles.py
    python benchmarks/plan_oracles.py --more     # the runs of tests/perf/published_runs_more.json (not calibrated)
    python benchmarks/plan_oracles.py --memory   # their stated layouts through the memory model: fit, peak

Columns: the run, its GPU, the figure the paper reports (its own FLOP convention: Megatron-LM's Eq. 3 counts
recompute, Llama 3's TFLOPs/GPU 6N + causal attention; Korthikanti et al. report seconds), the prediction, and
predicted / published. The efficiency curves are per GPU generation (gpus.json 'generations',
benchmarks/plan_calibrate.py), never per run.

With ``--more`` the per-source table also prints the leave-one-source-out error: the constants fitted on these
runs (the FSDP overhead, ``benchmarks/fsdp_fit.py``; the MoE dispatcher overhead, ``benchmarks/moe_fit.py``; the
ampere curve, whose fit runs include the single-node A100 rows, ``benchmarks/plan_calibrate.py``) are refitted
per generation without the source's runs, and the source is predicted with them. The other generation curves
are fitted on published_runs.json, none of which is in --more, so they are out-of-sample for every row already.
"""

from __future__ import annotations

import argparse
import pathlib
import statistics
import sys
from dataclasses import replace

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "tests" / "perf"))

from published import RUNS, predict  # noqa: E402

UNIT = {"step_time_s": "s/step", "tflops_per_gpu": "TFLOP/s/GPU (model)",
        "hardware_tflops_per_gpu": "TFLOP/s/GPU (with recompute)"}


MORE_UNIT = {"step_time_s": "s/step", "tflops_per_gpu": "TFLOP/s", "hardware_tflops_per_gpu": "HW TFLOP/s",
             "tokens_per_s_per_gpu": "tok/s/GPU"}


def speed_ratio(run: dict, predicted: float) -> float:
    """Predicted / published speed: tokens/s and TFLOP/s as they are, step time inverted (above 1: too fast)."""
    return run["published"] / predicted if run["metric"] == "step_time_s" else predicted / run["published"]


def _source_errors(runs: list[dict]) -> list[float]:
    from published_more import try_predict

    out = []
    for r in runs:
        p, _ = try_predict(r)
        if p is not None:
            out.append(abs(speed_ratio(r, p) - 1))
    return out


def leave_one_source_out(runs: list[dict]) -> dict[str, list[float]]:
    """Per source: its runs' |speed − 1| with the flash kernels' attention shares, then the FSDP and MoE
    overheads refitted per generation on the other sources only (a generation left with no runs to fit gets no
    overhead; a kernel left with no runs, the generation's native share). Generations whose constant in the code
    is zero stay zero (the code chose not to use their fit)."""
    sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
    import attention_fit
    import fsdp_fit
    import moe_fit
    import plan_calibrate

    from trainmath.hardware import presets
    from trainmath.perf import fsdp, moe

    attention_rows = attention_fit.rows()
    saved_f, saved_m = dict(fsdp.OVERHEAD), dict(moe.OVERHEAD)
    saved_a = {k: dict(t) for k, t in attention_fit.TABLES.items()}
    hw = presets()
    saved_g = dict(hw.generations)
    curves = ("ampere", "blackwell")  # the generation curves fitted on rows of this file
    curve_sources = {g: {r["paper"] for r in plan_calibrate.fit_runs(g, hw)} for g in curves}
    # a curve left with no runs without the source: the values gpus.json set before its fit (hopper's)
    prior = {"blackwell": replace(saved_g["hopper"], generation="blackwell", how="hopper's (left-out prior)")}
    out: dict[str, list[float]] = {}
    try:
        for src in sorted({r["paper"] for r in runs}):
            hw.generations.update(saved_g)
            attention_fit.apply(attention_fit.fitted(attention_rows, src))
            fsdp.OVERHEAD.update(saved_f)
            moe.OVERHEAD.update(saved_m)
            fsdp_rows, moe_rows = fsdp_fit.rows(), moe_fit.rows()
            for g in curves:  # a curve refitted without this source's rows
                if src in curve_sources[g]:
                    rest = plan_calibrate.fit_runs(g, hw, exclude_source=src)
                    hw.generations[g] = plan_calibrate.fit(g, rest, hw)[1] if rest else prior[g]
            for gen, const in saved_f.items():
                rest = [r for r in fsdp_rows if r["gen"] == gen and r["source"] != src]
                fsdp.OVERHEAD[gen] = fsdp_fit.fit(rest) if rest and any(const) else (0.0, 0.0)
            for gen, const in saved_m.items():
                rest = [r for r in moe_rows if r["gen"] == gen and r["source"] != src and not r["suspect"]]
                moe.OVERHEAD[gen] = moe_fit.fit(rest) if rest and const else 0.0
            out[src] = _source_errors([r for r in runs if r["paper"] == src])
    finally:
        hw.generations.update(saved_g)
        for k, t in attention_fit.TABLES.items():
            t.clear()
            t.update(saved_a[k])
        fsdp.OVERHEAD.clear()
        fsdp.OVERHEAD.update(saved_f)
        moe.OVERHEAD.clear()
        moe.OVERHEAD.update(saved_m)
    return out


def more() -> None:
    """Every run of published_runs_more.json through the current model; per-source median |error| and share within
    15%. Runs the model refuses are listed as not priced, with its reason."""
    from published_more import RUNS as MORE
    from published_more import try_predict

    print(f"{'run':64s} {'GPU':14s} {'prec':4s} {'metric':9s} {'published':>10s} {'predicted':>10s} {'speed':>6s}")
    errors: dict[str, list[float]] = {}
    groups: dict[str, list[float]] = {}
    skipped: list[tuple[str, str]] = []
    for r in MORE:
        p, why = try_predict(r)
        if p is None:
            skipped.append((r["id"], why))
            continue
        ratio = speed_ratio(r, p)
        errors.setdefault(r["paper"], []).append(abs(ratio - 1))
        kind = ("moe" if r["moe"] else "dense") + ("+fsdp" if r.get("fsdp") else "")
        groups.setdefault(f"{r['precision']} {kind}", []).append(abs(ratio - 1))
        metric = MORE_UNIT[r["metric"]]
        print(f"{r['id']:64s} {r['gpu']:14s} {r['precision']:4s} {metric:9s} {r['published']:10.2f} {p:10.2f} "
              f"{ratio:6.3f}")
    print("\nspeed = predicted / published throughput (step times inverted); error = |speed - 1|")
    loso = leave_one_source_out(MORE)
    loso["all"] = [e for v in loso.values() for e in v]
    print(f"{'source':26s} {'priced':>6s} {'median |err|':>12s} {'within 15%':>10s} {'LOSO median':>11s} "
          f"{'LOSO 15%':>8s}")
    rows = list(errors.items()) + [("all", [e for v in errors.values() for e in v])]
    for name, errs in rows + [("-- " + k, v) for k, v in sorted(groups.items())]:
        within = sum(e <= 0.15 for e in errs) / len(errs)
        held = loso.get(name)
        tail = (f" {100 * statistics.median(held):10.1f}% {100 * sum(e <= 0.15 for e in held) / len(held):7.0f}%"
                if held else "")
        print(f"{name:26s} {len(errs):6d} {100 * statistics.median(errs):11.1f}% {100 * within:9.0f}%{tail}")
    print("LOSO: the flash-kernel shares, the FSDP and MoE overheads, the ampere and blackwell curves refitted without"
          " the source;"
          " groups: in-sample")
    for run_id, why in skipped:
        print(f"not priced: {run_id}: {why}")


def memory() -> None:
    """Every run of published_runs_more.json at its stated layout through the memory model: the predicted peak
    (the job's profile: megatron unless the run says), the fit verdict under the one fit rule, and the memory the
    source reports (each source's convention: what its figure counts, in which unit). Each layout judged not to
    fit is listed with what the model lacks (``published_more.MEMORY_MISSES``)."""
    from published_more import RUNS as MORE
    from published_more import memory_check, memory_miss_reason

    from trainmath.errors import TrainmathError

    print(f"{'run':64s} {'GPU GiB':>7s} {'usable':>7s} {'peak':>7s} {'fits':>5s} {'published':>9s} {'ratio':>6s}")
    fit = judged = 0
    ratios: dict[str, list[float]] = {}
    conventions: dict[str, str] = {}
    misses = []
    for r in MORE:
        try:
            m = memory_check(r)
        except TrainmathError as exc:
            print(f"{r['id']:64s} not priced: {exc}")
            continue
        judged += 1
        fit += bool(m["fits"])
        if not m["fits"]:
            misses.append((r["id"], m["peak_gib"] - m["usable_gib"]))
        pub = m["published_gib"]
        tail = f"{pub:9.1f} {m['peak_gib'] / pub:6.2f}" if pub else ""
        if pub:
            ratios.setdefault(r["paper"], []).append(m["peak_gib"] / pub)
            conventions[r["paper"]] = r.get("memory_convention_reads", "not stated")
        print(f"{r['id']:64s} {m['memory_gib']:7.0f} {m['usable_gib']:7.1f} {m['peak_gib']:7.1f} "
              f"{'yes' if m['fits'] else 'NO':>5s} {tail}")
    every = [x for v in ratios.values() for x in v]
    print(f"\n{fit} of {judged} stated layouts judged to fit (they all ran); {len(every)} runs report memory: "
          f"predicted peak / published median {statistics.median(every):.2f}, range {min(every):.2f}-"
          f"{max(every):.2f}")
    print("\npredicted peak (max allocated) / the reported memory, per source, and what the source's figure counts:")
    for src, xs in ratios.items():
        print(f"  {src:18s} {len(xs):3d} runs  median {statistics.median(xs):.2f}  range {min(xs):.2f}-{max(xs):.2f}"
              f"  reads: {conventions[src]}")
    print("\nlayouts judged not to fit, GiB over the usable bytes, and what the memory model lacks:")
    for run_id, over in misses:
        print(f"  {run_id:64s} {over:5.1f}  {memory_miss_reason(run_id) or 'NO REASON ON RECORD'}")


def main() -> None:
    args = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    args.add_argument("--more", action="store_true", help="the runs of tests/perf/published_runs_more.json")
    args.add_argument("--memory", action="store_true", help="those runs' layouts through the memory model")
    parsed = args.parse_args()
    if parsed.memory:
        memory()
        return
    if parsed.more:
        more()
        return
    print(f"{'run':36s} {'GPU':14s} {'metric':30s} {'published':>9s} {'predicted':>9s} {'ratio':>6s}")
    worst, fitted = 0.0, 0
    for r in RUNS:
        p = predict(r)
        ratio = p / r["published"]
        if not r.get("holdout"):
            worst, fitted = max(worst, abs(ratio - 1)), fitted + 1
        mark = "  (holdout)" if r.get("holdout") else ""
        print(f"{r['id']:36s} {r['gpu']:14s} {UNIT[r['metric']]:30s} {r['published']:9.2f} {p:9.2f} {ratio:6.3f}{mark}")
    print(f"worst |predicted / published - 1| = {100 * worst:.1f}% over the {fitted} calibration runs")


if __name__ == "__main__":
    main()
