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
- ``clamp``: the experts' activation clamp priced as Megatron-Core runs it (``CLAMP_HALF_COPIES``), which the
  model does not price; ``refit``: the same with the per-expert constant refitted per generation as
  ``benchmarks/moe_fit.py`` fits it (the refitted constants and every MoE row's error are printed below the table);
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

CLAMP_HALF_COPIES = (8, 10)
"""(forward, backward) copies of one half of the routed experts' fc1 output (routed rows · f elements) that the
clamp of gpt-oss's activation moves as Megatron-Core runs it: ``weighted_bias_quick_geglu_impl`` clamps in eager
PyTorch before its fused kernel, ``x_glu, x_linear = input.chunk(2, -1)``, ``torch.cat((x_glu.clamp(min=None,
max=clamp_value), x_linear.clamp(min=-clamp_value, max=clamp_value)), -1)`` (NVIDIA/Megatron-LM
``megatron/core/fusions/fused_bias_geglu.py``@1fb2a0cab0f1d042d12dca011b5015d21f7308fd), with the
``activation_func_clamp_value`` 7.0 and ``bias_activation_fusion=True`` of Megatron-Bridge's ``GPTOSSProvider``
(``src/megatron/bridge/models/gpt_oss/gpt_oss_provider.py``@12bc34a8ee308a638d4bfd29401085944d4a468e). Derived:
forward, each clamp reads and writes its half (2 + 2), the cat reads both and writes the joined tensor (2 + 2);
backward, the cat's gradient goes out as views (0), each clamp's backward reads its gradient and its saved input and
writes the gradient (3 + 3), the chunk's backward joins the two halves' gradients (2 + 2). The second clamp of the
recipes' ``moe_act`` recompute is left out, as the model leaves out the rest of that recompute."""


def clamp_s(run: dict, est) -> float:
    """Seconds the activation clamp adds to ``run``'s step: per MoE layer of the busiest stage and micro-batch,
    forward and backward, at ``hbm_fraction`` of the HBM bandwidth, plus its share of the pipeline bubble."""
    from trainmath.sources import catalog_entry

    if catalog_entry(run["catalog"]).config.get("swiglu_limit") is None:
        return 0.0
    hw = presets()
    gpu, eff = run_gpu(run, hw), hw.efficiency(run_gpu(run, hw))
    s, lay, job = spec(run["id"]), est.layout, est.job
    block = next(b for x in s.layers for b in x.blocks if b.kind == "moe")
    rows = job.micro_batch * job.seq / lay.cp / (lay.tp // lay.expert_tp) * block.dims.top_k * job.moe_imbalance
    half = rows * block.dims.expert_intermediate / lay.expert_tp * 2
    per_layer = sum(CLAMP_HALF_COPIES) * half / (gpu.hbm_bytes_per_s * eff.hbm_fraction)
    busiest = max(range(len(est.stage_times_s)), key=lambda i: est.stage_times_s[i])
    per_mb = per_layer * est.stage_layers[busiest]  # every gpt-oss layer is an MoE layer
    return per_mb * (est.micro_batches + (lay.pp - 1) / job.virtual_stages)


def refit_with_clamp() -> tuple[dict, dict[str, float], dict[str, float]]:
    """(per generation: the per-expert constant refitted with the clamp priced; each MoE row's speed so; each MoE
    row's speed with the clamp priced at the code's constants), the fit as ``benchmarks/moe_fit.py`` runs it."""
    sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
    import moe_fit

    from trainmath.perf import moe

    data = moe_fit.rows()
    for r in data:
        if r["id"] in IDS:
            run = next(x for x in RUNS if x["id"] == r["id"])
            r["step"] += clamp_s(run, estimate_run(run)[0])
    fits = {g: moe_fit.fit([r for r in data if r["gen"] == g]) for g in sorted({r["gen"] for r in data})}
    refit = {r["id"]: r["published_step"] / (r["step"] + fits[r["gen"]] * r["units"]) for r in data}
    code = {r["id"]: r["published_step"] / (r["step"] + moe.OVERHEAD.get(r["gen"], 0.0) * r["units"]) for r in data}
    return fits, refit, code


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
    clamp = published_step / (est.step_time_s + clamp_s(run, est))
    compute = est.breakdown["forward"] + est.breakdown["backward"]
    need = (published_step - (est.step_time_s - compute)) / compute
    tokens = run["job"]["global_batch"] * run["job"]["seq"] / gpus(run)
    eager = copy.deepcopy(run)
    eager["job"]["attention"] = "eager"
    mem = memory_check(eager, hw)
    return {"id": run["id"], "as_is": as_is, "window": window, "half": half, "both": both, "clamp": clamp,
            "need": need,
            "us_per_token": 1e6 * published_step / tokens, "unfused_gib": mem["peak_gib"],
            "usable_gib": mem["usable_gib"], "unfused_fits": mem["fits"]}


def main() -> None:
    import statistics

    fits, refit, code = refit_with_clamp()
    print(f"{'run':56s} {'as is':>6s} {'window':>6s} {'attn/2':>6s} {'both':>6s} {'clamp':>6s} {'refit':>6s} "
          f"{'need':>5s} {'µs/tok':>6s} {'unfused GiB / usable':>20s}")
    for rid in IDS:
        r = row(next(x for x in RUNS if x["id"] == rid))
        print(f"{rid[:56]:56s} {r['as_is']:6.3f} {r['window']:6.3f} {r['half']:6.3f} {r['both']:6.3f} "
              f"{r['clamp']:6.3f} {refit[rid]:6.3f} {r['need']:5.2f} {r['us_per_token']:6.1f} "
              f"{r['unfused_gib']:9.1f} / {r['usable_gib']:.1f}")
    print("per-expert constant refitted with the clamp priced: "
          + ", ".join(f"{g} {1e3 * e:.3f} ms" for g, e in fits.items()))
    for name, speeds in (("clamp at the code's constants", code), ("clamp + refit", refit)):
        errs = [abs(v - 1) for v in speeds.values()]
        print(f"MoE rows, {name}: median |speed - 1| {100 * statistics.median(errs):.1f}%, "
              f"{sum(e <= 0.15 for e in errs)} of {len(errs)} within 15%")
    for rid in code:
        if abs(refit[rid] - code[rid]) > 0.005 and rid not in IDS:
            print(f"  moved by the refit: {rid[:60]:60s} {code[rid]:.3f} -> {refit[rid]:.3f}")


if __name__ == "__main__":
    main()
