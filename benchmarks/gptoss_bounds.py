"""The gpt-oss-120b rows of tests/perf/published_runs_more.json against the attention mechanisms gpt-oss runs
differently, each priced at its most pessimistic, and the compute each row would need.

    python benchmarks/gptoss_bounds.py

Columns (speed = predicted / published throughput; above 1: the model is too fast):

- ``as is``: the model;
- ``window``: the sliding-window layers (gpt-oss's 128-token window on every second layer) priced as full causal
  layers, as if the kernel computed every tile below the diagonal and masked the ones outside the window;
- ``attn/2``: Transformer Engine's attention at half the share of the dense peak it is priced at (head_dim 64,
  learnable softmax in cuDNN's kernel: no published figure for either);
- ``both``: the two together;
- ``no clamp``: the model without the experts' activation clamp (``trainmath.perf.moe.CLAMP_HALF_COPIES``, which
  ``as is`` prices): what the clamp moved;
- ``need``: the factor on the model's forward + backward compute that would meet the published step with
  everything else as priced (the all-to-all, the per-expert cost, the bubble, the syncs);
- ``µs/tok``: the published step per token per GPU;
- ``unfused``: the peak memory of the stated layout with an unfused attention core (the s × s probabilities saved),
  in GiB, against the usable bytes: Transformer Engine's ``UnfusedDotProductAttention`` is the only other backend
  that takes ``softmax_type="learnable"`` (``get_attention_backend``: FlashAttention is disabled for it).
"""

from __future__ import annotations

import copy
import pathlib
import sys
from contextlib import contextmanager
from dataclasses import replace

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "tests" / "perf"))

from published_more import RUNS, estimate_run, gpus, job_fields, memory_check, run_gpu, spec, speed  # noqa: E402

from trainmath.hardware import presets  # noqa: E402
from trainmath.layout import ParallelLayout  # noqa: E402
from trainmath.perf import Job, estimate  # noqa: E402
from trainmath.perf import attention as pa  # noqa: E402

IDS = [r["id"] for r in RUNS if "gpt-oss" in r["id"]]

def per_generation_fit() -> dict:
    """Per generation: the per-local-expert constant ``benchmarks/moe_fit.py`` fits on the model as it is (the
    clamp priced), to set beside ``trainmath.perf.moe.OVERHEAD``."""
    sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
    import moe_fit

    data = moe_fit.rows()
    return {g: moe_fit.fit([r for r in data if r["gen"] == g]) for g in sorted({r["gen"] for r in data})}


def unclamped(s):
    """``s`` with its experts' activation clamp off (``MoEDims.activation_clamp``)."""
    def block(b):
        if b.kind == "moe":
            return replace(b, dims=replace(b.dims, activation_clamp=False))
        return b

    return replace(s, layers=tuple(replace(lay, blocks=tuple(block(b) for b in lay.blocks)) for lay in s.layers))


def full_windows(s):
    """``s`` with every sliding-window attention block made full causal (the same FLOPs as the full layers)."""
    def block(b):
        if b.kind == "attention" and getattr(b.dims, "sliding_window", None):
            return replace(b, dims=replace(b.dims, sliding_window=None))
        return b

    return replace(s, layers=tuple(replace(lay, blocks=tuple(block(b) for b in lay.blocks)) for lay in s.layers))


@contextmanager
def attention_share(scale: float, generation: str, base: float):
    """Transformer Engine's attention share on ``generation`` at ``scale`` × ``base`` for the block's duration."""
    saved = dict(pa.TE_PEAK_FRACTION)
    pa.TE_PEAK_FRACTION[generation] = base * scale
    try:
        yield
    finally:
        pa.TE_PEAK_FRACTION.clear()
        pa.TE_PEAK_FRACTION.update(saved)


def priced(run: dict, model=None):
    hw = presets()
    return estimate(model or spec(run["id"]), ParallelLayout(**run["layout"]), Job(**job_fields(run)),
                    run_gpu(run, hw), hardware=hw, memory=False)


def row(run: dict) -> dict:
    hw = presets()
    gpu = hw.gpu(run["gpu"])
    est, _ = estimate_run(run, hw)
    as_is = speed(run, est)
    window = speed(run, priced(run, full_windows(spec(run["id"]))))
    te = pa.fraction(hw.efficiency(gpu), "te")
    with attention_share(0.5, gpu.generation, te):
        half = speed(run, priced(run))
        both = speed(run, priced(run, full_windows(spec(run["id"]))))
    published_step = est.step_time_s * as_is
    no_clamp = speed(run, priced(run, unclamped(spec(run["id"]))))
    compute = est.breakdown["forward"] + est.breakdown["backward"]
    need = (published_step - (est.step_time_s - compute)) / compute
    tokens = run["job"]["global_batch"] * run["job"]["seq"] / gpus(run)
    eager = copy.deepcopy(run)
    eager["job"]["attention"] = "eager"
    mem = memory_check(eager, hw)
    return {"id": run["id"], "as_is": as_is, "window": window, "half": half, "both": both, "no_clamp": no_clamp,
            "need": need,
            "us_per_token": 1e6 * published_step / tokens, "unfused_gib": mem["peak_gib"],
            "usable_gib": mem["usable_gib"], "unfused_fits": mem["fits"]}


def main() -> None:
    print(f"{'run':56s} {'as is':>6s} {'window':>6s} {'attn/2':>6s} {'both':>6s} {'no clamp':>8s} "
          f"{'need':>5s} {'µs/tok':>6s} {'unfused GiB / usable':>20s}")
    for rid in IDS:
        r = row(next(x for x in RUNS if x["id"] == rid))
        print(f"{rid[:56]:56s} {r['as_is']:6.3f} {r['window']:6.3f} {r['half']:6.3f} {r['both']:6.3f} "
              f"{r['no_clamp']:8.3f} {r['need']:5.2f} {r['us_per_token']:6.1f} "
              f"{r['unfused_gib']:9.1f} / {r['usable_gib']:.1f}")
    from trainmath.perf import moe

    fits = per_generation_fit()
    print("per-expert constant moe_fit.py fits on the model (clamp priced): "
          + ", ".join(f"{g} {1e3 * e:.3f} ms (code {1e3 * moe.OVERHEAD[g]:.3f})" for g, e in fits.items()))


if __name__ == "__main__":
    main()
