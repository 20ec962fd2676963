"""Serving charts as data: TPOT and output throughput against the batch, prediction and floor, the roofline knee
marked. Pure (``charts.LineChart`` objects; ``mpl`` and ``svg`` draw them)."""

from __future__ import annotations

from dataclasses import replace

from trainmath.plot.charts import Line, LineChart
from trainmath.plot.palette import colour


def knee_batch(spec, setup, gpu, *, context: int, most: int = 1 << 16) -> int | None:
    """The smallest batch whose decode step at ``context`` is compute-bound at the floor (None: not up to
    ``most``); the ridge point of the roofline, about peak / bandwidth × bytes per weight / 2 for a dense model."""
    from trainmath.infer.speed import FLOOR, Part, step

    def compute_bound(b: int) -> bool:
        s = step(spec, replace(setup, batch=b), gpu, (Part(n=b, t=1, c=context),), FLOOR)
        return s.compute_s >= s.memory_s

    if not compute_bound(most):
        return None
    lo, hi = 0, most  # lo memory-bound (or 0), hi compute-bound
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if compute_bound(mid) else (mid, hi)
    return hi


def latency_charts(spec, setup, gpu, *, input: int, output: int, batches: tuple[int, ...]) -> list[LineChart]:
    from trainmath.infer.speed import fixed_batch

    rows = [fixed_batch(spec, replace(setup, batch=b), gpu, input=input, output=output) for b in batches]
    xs = tuple(float(b) for b in batches)
    knee = knee_batch(spec, setup, gpu, context=input + output // 2)
    name = spec.name.split("/")[-1]
    where = f"{name} on {gpu.name}, tp {setup.tp}, {setup.weights.dtype} weights, {input:,} in / {output:,} out"
    tpot = LineChart(
        title=f"TPOT against batch: {where}", xlabel="batch", ylabel="TPOT (ms)", xlog2=True,
        lines=(Line(name="predicted", colour=colour("predicted"), xs=xs, ys=tuple(r.tpot_s * 1e3 for r in rows)),
               Line(name="floor (efficiency 1)", colour=colour("floor"), xs=xs, dashed=True,
                    ys=tuple(r.tpot_floor_s * 1e3 for r in rows))),
        marks=((float(knee), _at(batches, rows, knee, lambda r: r.tpot_floor_s * 1e3), f"knee: batch {knee}"),)
        if knee and batches[0] <= knee <= batches[-1] else (),
        notes=(f"roofline knee (decode compute = memory at the floor): batch {knee}" if knee else
               "no knee up to batch 65,536",))
    thr = LineChart(
        title=f"Output throughput against batch: {where}", xlabel="batch", ylabel="output tokens/s", xlog2=True,
        lines=(Line(name="predicted", colour=colour("predicted"), xs=xs,
                    ys=tuple(r.output_tokens_per_s for r in rows)),),
        notes=("B x O / (TTFT + (O - 1) x TPOT)",))
    return [tpot, thr]


def _at(batches, rows, b, fn) -> float:
    """``fn`` of the row at the batch nearest ``b`` (the mark sits on the line)."""
    i = min(range(len(batches)), key=lambda j: abs(batches[j] - b))
    return fn(rows[i])
