"""``--simulate-layers N``: simulate N and N+1 decoder layers (repeats of the layer-type pattern), fold in the rest;
and the time estimate.

**The fold.** In a model of L identical decoder layers, the bytes live at a given moment of the step are a sum of
per-layer terms (saved tensors, gradients, weights, states) and terms that do not depend on L, so the peak of each
segment of the step (``segments.Segments``: step, phase, the layer's position class, the innermost module) is
affine in L: ``peak_L = peak_N + (L - N)·(peak_{N+1} - peak_N)``. A segment inside (or just after) an interior
layer i is also affine in i at fixed L (each layer further on holds one layer's bytes more or less), so its
largest value over the interior lies at an end of the interior, the layers at position 1 and L − 2, which are
simulated as themselves (``bottom 1``, ``top 1``); the first and last layers, which FSDP2's prefetch makes
different, are too. The full step's peak is the largest of the extrapolated segments. Needs N ≥ 4 so that
both ends are distinct in both runs.

**Several layer types.** The same argument holds with a repeat of the model's unit of layer types in place of a
layer (``trainmath.verify.pattern``: ``prefix · unit^R · suffix``, e.g. Gemma-2's (sliding, full) ×21, Gemma-3's
(sliding ×5, full) ×R then two sliding, DeepSeek-V3's three dense layers then MoE ×58). The bytes live at a moment
inside layer i are what i and its neighbours hold (FSDP2 prefetches one layer ahead) plus, per other layer, a
term that depends on its type and on whether it lies before or after i. The prefix and the suffix are simulated
whole; adding a repeat adds one unit's terms to every segment outside it, so each segment is affine in R; inside
interior repeat r, at a fixed place in the unit, i's neighbours are of the same types for every r and each repeat
before or after adds one unit's bytes, so the segment is affine in r and its largest value over the interior lies
at repeat 1 or R − 2, simulated as themselves (``bottom 1 +k``, ``top 1 +k``). Where the peak falls (the end of
the forward, the backward of the first layer, the loss, the optimizer step) does not matter: every segment but the
interior ones is extrapolated, and the interior ones are bounded by those. The shorter models are simulated with
N and N + 1 repeats. A model whose unit does not repeat N + 2 times, or whose fold would simulate at least as
many layers as the model has, is simulated whole, and the output says so. The tests compare every extrapolated
segment, not only the peak, with the full simulation of each multi-type family, to the byte.

**The estimate.** A simulation's time is linear in the layer count once MemTracker's per-module peak updates
are left out (``segments``): a 2-layer calibration run of the same width gives the seconds inside layers per
layer and the rest (model build, embedding, head, loss, optimizer); the estimate is rest + L·per-layer. It is
an estimate: the machine's load changes while it runs.

torch is imported inside the functions (through ``simulate``): the calculator never needs it.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from trainmath.errors import TrainmathError
from trainmath.verify.pattern import Pattern, check_shrunk, choose, layer_types

MIN_LAYERS = 4
"""The least ``--simulate-layers``: two layers (or repeats of the type pattern) at each end (module docstring)."""
CALIBRATION_LAYERS = 2


@dataclass(frozen=True)
class FoldPlan:
    """What ``--simulate-layers n`` runs: the pattern cut to ``n`` and ``n + 1`` repeats, or (``pattern`` None)
    the whole model, with the reason in ``why``."""

    n: int
    layers: int
    pattern: Pattern | None
    why: str = ""

    def runs(self) -> list[int]:
        """Layers of each simulation run."""
        if self.pattern is None:
            return [self.layers]
        return [len(self.pattern.keep(self.n)), len(self.pattern.keep(self.n + 1))]


def check_foldable(spec, n: int) -> FoldPlan:
    """What ``--simulate-layers n`` runs for ``spec`` (``FoldPlan``); one ``TrainmathError`` for a bad ``n``."""
    if n < MIN_LAYERS:
        raise TrainmathError(f"--simulate-layers must be at least {MIN_LAYERS} (the first two and the last two "
                             f"layers, or repeats of the layer-type pattern, are simulated as themselves), got {n}")
    types = layer_types(spec)
    layers = len(types)
    pattern = choose(types, n)
    counts = ", ".join(f"{layer.label} ×{len(idx)}" for layer, idx in spec.layer_groups())
    if pattern is None:
        return FoldPlan(n, layers, None, f"simulated all {layers} layers: no unit of its layer types ({counts}) "
                                         f"repeats the {n + 2} times folding {n} and {n + 1} repeats needs")
    plan = FoldPlan(n, layers, pattern)
    if sum(plan.runs()) >= layers:
        return FoldPlan(n, layers, None, f"simulated all {layers} layers: folding ({pattern.describe()}) would "
                                         f"simulate {' + '.join(map(str, plan.runs()))} layers")
    return plan


def extrapolate(small, large, n: int, repeats: int) -> dict:
    """Segment → (bytes, MemTracker's kinds) at ``repeats`` repeats (layers of one type) from the segment peaks
    of runs with ``n`` (``small``) and ``n + 1`` (``large``) (``Simulation.segments``), for every segment outside
    the interior (module docstring)."""
    keep = {k for k in small if "interior" not in k[2]}
    other = {k for k in large if "interior" not in k[2]}
    if keep != other:
        odd = sorted(map(str, keep ^ other))[:3]
        raise TrainmathError(f"--simulate-layers: the {n}- and {n + 1}-repeat steps have different segments "
                             f"({'; '.join(odd)}), so the fold would not be exact; run --simulate without it")
    out = {}
    for k in keep:
        (a, ka), (b, kb) = small[k], large[k]
        out[k] = (a + (repeats - n) * (b - a),
                  {name: ka.get(name, 0) + (repeats - n) * (kb.get(name, 0) - ka.get(name, 0))
                   for name in sorted(set(ka) | set(kb))})
    return out


def fold(small, large, n: int, repeats: int) -> tuple[int, dict, tuple]:
    """(peak bytes, MemTracker's kinds at it, the segment) at ``repeats`` repeats: the largest of
    ``extrapolate``'s segments (module docstring)."""
    segments = extrapolate(small, large, n, repeats)
    at = max(sorted(segments), key=lambda k: segments[k][0])
    return segments[at][0], segments[at][1], at


def simulate_folded(config: dict, setup, layout, *, moe: bool, plan: FoldPlan, name: str = "the model",
                    progress=None):
    """The ``Simulation`` of the whole model from runs of ``plan.n`` and ``plan.n + 1`` repeats of its layer
    pattern (module docstring)."""
    from trainmath.verify.segments import segment_text
    from trainmath.verify.simulate import simulate

    pattern, n = plan.pattern, plan.n
    sims = []
    for r in (n, n + 1):
        cut = pattern.shrunk(r)
        sims.append(simulate(check_shrunk(config, pattern, r, name), setup, layout, moe=moe, progress=progress,
                             position=cut.position))
    small, large = sims
    segments = extrapolate(small.segments, large.segments, n, pattern.repeats)
    at = max(sorted(segments), key=lambda k: segments[k][0])
    peak, kinds = segments[at]
    extra = pattern.repeats - n

    def grow(a, b):
        return None if a is None or b is None else a + extra * (b - a)

    a, b = plan.runs()
    if pattern.period == 1 and not pattern.prefix and not pattern.suffix:
        said = (f"simulated {a} and {b} of {plan.layers} identical layers; each segment's peak extrapolated "
                f"linearly to {plan.layers} (exact for identical layers: trainmath.verify.fold)")
    else:
        said = (f"simulated {a} and {b} of {plan.layers} layers, read as {pattern.describe()}: the layers kept and "
                f"the unit repeated {n} and {n + 1} times; each segment's peak extrapolated linearly to "
                f"{pattern.repeats} repeats (exact where the repeats are identical: trainmath.verify.fold)")
    return replace(large, peak_bytes=peak, by_kind={k: v for k, v in kinds.items() if k != "Total"},
                   buffers_bytes=grow(small.buffers_bytes, large.buffers_bytes),
                   saved_bytes=grow(small.saved_bytes, large.saved_bytes), seconds=small.seconds + large.seconds,
                   peak_segment=segment_text(at), layers=plan.layers, segments=segments, folded=said)


def estimate_seconds(config: dict, setup, layout, *, moe: bool, runs: list[int]) -> tuple[float, float, float]:
    """(estimated seconds of simulations of ``runs`` layers, seconds per layer, the rest per run), from a
    ``CALIBRATION_LAYERS``-layer run (module docstring)."""
    from trainmath.verify.simulate import simulate

    cal = simulate(config, setup, layout, moe=moe, layers=CALIBRATION_LAYERS)
    per_layer = cal.layer_seconds / CALIBRATION_LAYERS
    rest = max(0.0, cal.seconds - cal.layer_seconds)
    return sum(rest + r * per_layer for r in runs), per_layer, rest
