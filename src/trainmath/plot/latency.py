"""Serving charts as data: TPOT and output throughput against the batch, prediction and floor, the roofline knee
marked. Pure (``charts.LineChart`` objects; ``mpl`` and ``svg`` draw them)."""

from __future__ import annotations

from dataclasses import replace

from trainmath.plot.charts import Line, LineChart
from trainmath.plot.palette import colour


def knee_batch(spec, setup, gpu, *, context: int) -> int:
    """The roofline's ridge batch of a decode step: where the compute of the batch equals the time to read the
    weights (both at the floor), weight bytes / bandwidth ÷ (FLOPs per token / peak), about peak / bandwidth ×
    bytes per weight / 2 for a dense model. The cache read is left out: it grows with the batch as the compute
    does, so past the knee a long context keeps the step memory-bound."""
    from trainmath.infer.speed import FLOOR, Part, step

    s = step(spec, replace(setup, batch=1), gpu, (Part(n=1, t=1, c=context),), FLOOR)
    return max(1, round(s.weight_bytes / gpu.hbm_bytes_per_s / s.compute_s))


def latency_charts(spec, setup, gpu, *, input: int, output: int, batches: tuple[int, ...]) -> list[LineChart]:
    from trainmath.infer.speed import fixed_batch

    rows = [fixed_batch(spec, replace(setup, batch=b), gpu, input=input, output=output) for b in batches]
    xs = tuple(float(b) for b in batches)
    knee = knee_batch(spec, setup, gpu, context=input + output // 2)
    name = spec.name.split("/")[-1]
    where = f"{name} on {gpu.name}, tp {setup.tp}, {setup.weights.dtype} weights, {input:,} in / {output:,} out"
    tpot = LineChart(
        title=f"TPOT against batch: {name}", xlabel="batch", ylabel="TPOT (ms)", xlog2=True,
        lines=(Line(name="predicted", colour=colour("predicted"), xs=xs, ys=tuple(r.tpot_s * 1e3 for r in rows)),
               Line(name="floor (efficiency 1)", colour=colour("floor"), xs=xs, dashed=True,
                    ys=tuple(r.tpot_floor_s * 1e3 for r in rows))),
        marks=((float(knee), _at(batches, rows, knee, lambda r: r.tpot_floor_s * 1e3), f"knee: batch {knee}"),)
        if batches[0] <= knee <= batches[-1] else (),
        notes=(where, f"roofline knee (a batch's decode FLOPs take as long as reading the weights): batch {knee}"))
    thr = LineChart(
        title=f"Output throughput: {name}", xlabel="batch", ylabel="output tokens/s", xlog2=True,
        lines=(Line(name="predicted", colour=colour("predicted"), xs=xs,
                    ys=tuple(r.output_tokens_per_s for r in rows)),),
        notes=("B x O / (TTFT + (O - 1) x TPOT)",))
    return [tpot, thr]


def _at(batches, rows, b, fn) -> float:
    """``fn`` of the row at the batch nearest ``b`` (the mark sits on the line)."""
    i = min(range(len(batches)), key=lambda j: abs(batches[j] - b))
    return fn(rows[i])
