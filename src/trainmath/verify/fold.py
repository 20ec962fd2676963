"""``--simulate-layers N``: simulate N and N+1 decoder layers, fold in the rest; and the time estimate.

**The fold.** In a model of L identical decoder layers, the bytes live at a given moment of the step are a sum of
per-layer terms (saved tensors, gradients, weights, states) and terms that do not depend on L, so the peak of each
segment of the step (``segments.Segments``: step, phase, the layer's position class, the innermost module) is
affine in L: ``peak_L = peak_N + (L - N)·(peak_{N+1} - peak_N)``. A segment inside (or just after) an interior
layer i is also affine in i at fixed L (each layer further on holds one layer's bytes more or less), so its
largest value over the interior lies at an end of the interior, the layers at position 1 and L − 2, which are
simulated as themselves (``bottom 1``, ``top 1``); the first and last layers, which FSDP2's prefetch makes
different, are too. The full step's peak is the largest of the extrapolated segments. Needs N ≥ 4 so that
both ends are distinct in both runs, and layers of one type (the config's layers identical in the parameter
ledger); the test compares it with the full simulation on a real-width model, to the byte.

**The estimate.** A simulation's time is linear in the layer count once MemTracker's per-module peak updates
are left out (``segments``): a 2-layer calibration run of the same width gives the seconds inside layers per
layer and the rest (model build, embedding, head, loss, optimizer); the estimate is rest + L·per-layer. It is
an estimate: the machine's load changes while it runs.

torch is imported inside the functions (through ``simulate``): the calculator never needs it.
"""

from __future__ import annotations

from dataclasses import replace

from trainmath.errors import TrainmathError

MIN_LAYERS = 4
"""The least ``--simulate-layers``: two layers at each end (module docstring)."""
CALIBRATION_LAYERS = 2


def check_foldable(spec, n: int) -> None:
    """One ``TrainmathError`` when ``--simulate-layers n`` cannot fold ``spec``."""
    groups = spec.layer_groups()
    if n < MIN_LAYERS:
        raise TrainmathError(f"--simulate-layers must be at least {MIN_LAYERS} (the first two and the last two "
                             f"layers are simulated as themselves), got {n}")
    if len(groups) > 1:
        kinds = ", ".join(f"{layer.label} ×{len(idx)}" for layer, idx in groups)
        raise TrainmathError(f"--simulate-layers folds layers of one type; {spec.name} has {len(groups)} ({kinds}): "
                             f"run --simulate without it")


def fold(small, large, n: int, layers: int) -> tuple[int, dict, str]:
    """(peak bytes, MemTracker's kinds at it, the segment) of ``layers`` layers from the segment peaks of runs with
    ``n`` (``small``) and ``n + 1`` (``large``) layers (``Simulation.segments``; module docstring)."""
    keep = {k for k in small if "interior" not in k[2]}
    other = {k for k in large if "interior" not in k[2]}
    if keep != other:
        odd = sorted(map(str, keep ^ other))[:3]
        raise TrainmathError(f"--simulate-layers: the {n}- and {n + 1}-layer steps have different segments "
                             f"({'; '.join(odd)}); run --simulate without it")
    best = None
    for k in keep:
        (a, ka), (b, kb) = small[k], large[k]
        v = a + (layers - n) * (b - a)
        if best is None or v > best[0]:
            kinds = {name: ka.get(name, 0) + (layers - n) * (kb.get(name, 0) - ka.get(name, 0))
                     for name in sorted(set(ka) | set(kb))}
            best = (v, kinds, k)
    return best


def simulate_folded(config: dict, setup, layout, *, moe: bool, n: int, layers: int, progress=None):
    """The ``Simulation`` of ``layers`` layers from runs of ``n`` and ``n + 1`` (module docstring)."""
    from trainmath.verify.segments import segment_text
    from trainmath.verify.simulate import simulate

    small = simulate(config, setup, layout, moe=moe, layers=n, progress=progress)
    large = simulate(config, setup, layout, moe=moe, layers=n + 1, progress=progress)
    peak, kinds, at = fold(small.segments, large.segments, n, layers)
    extra = layers - n

    def grow(a, b):
        return None if a is None or b is None else a + extra * (b - a)

    return replace(large, peak_bytes=peak, by_kind={k: v for k, v in kinds.items() if k != "Total"},
                   buffers_bytes=grow(small.buffers_bytes, large.buffers_bytes),
                   saved_bytes=grow(small.saved_bytes, large.saved_bytes), seconds=small.seconds + large.seconds,
                   peak_segment=segment_text(at), layers=layers, segments={},
                   folded=f"simulated {n} and {n + 1} of {layers} identical layers; each segment's peak extrapolated "
                          f"linearly to {layers} (exact for identical layers: trainmath.verify.fold)")


def estimate_seconds(config: dict, setup, layout, *, moe: bool, runs: list[int]) -> tuple[float, float, float]:
    """(estimated seconds of simulations of ``runs`` layers, seconds per layer, the rest per run), from a
    ``CALIBRATION_LAYERS``-layer run (module docstring)."""
    from trainmath.verify.simulate import simulate

    cal = simulate(config, setup, layout, moe=moe, layers=CALIBRATION_LAYERS)
    per_layer = cal.layer_seconds / CALIBRATION_LAYERS
    rest = max(0.0, cal.seconds - cal.layer_seconds)
    return sum(rest + r * per_layer for r in runs), per_layer, rest
