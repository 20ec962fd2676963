"""The simulated step cut into segments: the peak of each, progress per layer, and where the time goes.

``Segments.install(tracker)`` replaces the tracker's per-op ``_update_peak_stats`` with one that keeps what the
simulation reads — the global peak and its snapshot, exactly as torch's own code keeps them — and adds:

- **the peak of each segment** of the step, a segment being (step, forward/backward/optimizer, the decoder layer's
  position class; outside layers, the innermost module running): ``trainmath.verify.fold`` extrapolates these;
- **progress**: one line per decoder layer entered, forward and backward, to the ``progress`` callable;
- **time per layer**: wall seconds spent inside decoder layers and outside them, for the time estimate.

What it leaves out: MemTracker's per-module peak snapshots (``memory_tracking``), which the simulation never reads.
Updating them walks every module seen so far on every op, which makes a step quadratic in the layer count (some
75% of a 24-layer Qwen3-8B simulation, measured with cProfile); without them the step is linear.

A layer's position class is its place counted from both ends: ``bottom 0``, ``bottom 1``, ``top 1``, ``top 0``,
else ``interior``; between layers a segment is named by the layer class before it (``after top 0``). In a model
of several layer types the class is the repeat's of the type pattern and the layer's place in it
(``trainmath.verify.pattern``).
FSDP2's prefetch makes the first and last layers differ from the rest (nothing to prefetch
beyond them); every other layer of a model of identical layers does the same thing at a place that moves by one
layer's bytes per layer, so two layers at each end carry everything a longer model does (``fold``).

torch is imported inside the functions: the calculator never needs it.
"""

from __future__ import annotations

import time


def position_class(i: int, count: int) -> str:
    """``bottom 0``, ``bottom 1``, ``top 1``, ``top 0`` or ``interior``: place ``i`` of ``count`` counted from both
    ends (module docstring)."""
    if i < 2:
        return f"bottom {i}"
    if count - 1 - i < 2:
        return f"top {count - 1 - i}"
    return "interior"


def segment_text(key: tuple) -> str:
    """A segment key of ``Segments.peaks`` in words."""
    step, phase, where, inner = key
    return f"step {step} {phase}, {where}" + (f" ({inner.lstrip('.')})" if inner else "")


class Segments:
    """Per-segment peaks (bytes, with MemTracker's snapshot by kind), progress and time of one simulation."""

    def __init__(self, layer_names: dict[str, int], *, progress=None, position=None):
        self.layer_names = layer_names
        """Tracker module name (``Qwen3ForCausalLM.model.layers.3``) → layer index."""
        self.layers = len(layer_names)
        self.position = position or (lambda i: position_class(i, self.layers))
        """Layer index → its position class (``pattern.Pattern.position`` for a model of several layer types)."""
        self._prefixes = {n.rsplit(".", 1)[0] + "." for n in layer_names}
        self.progress = progress
        self.step = 0
        self.peaks: dict[tuple, tuple[int, dict]] = {}
        self.layer_s = 0.0
        self.other_s = 0.0
        self._last = None
        self._clock = None
        self._in_layer = False
        self._after = "the embedding"

    def install(self, tracker) -> None:
        from torch.distributed._tools.mem_tracker import _TOTAL_KEY

        self.tracker = tracker

        def update(peak_state) -> None:  # torch's global part of _update_peak_stats, then the segments
            snap = tracker._curr_mem_snap
            total = 0
            for dev, dev_snap in snap.items():
                total += dev_snap[_TOTAL_KEY]
                if tracker._peak_mem.get(dev, 0) < dev_snap[_TOTAL_KEY]:
                    tracker._peak_mem[dev] = dev_snap[_TOTAL_KEY]
                    tracker._peak_mem_snap[dev] = dict(dev_snap)
            self.observe(total, snap)

        tracker._update_peak_stats = update

    def _layer_of(self, name: str) -> int | None:
        """The index of the decoder layer module ``name`` is or lies in (a checkpointed layer's recompute runs
        its submodules without the layer itself among the open modules)."""
        i = self.layer_names.get(name)
        if i is not None:
            return i
        for pre in self._prefixes:
            if name.startswith(pre):
                return self.layer_names.get(pre + name[len(pre):].split(".", 1)[0])
        return None

    def _where(self) -> tuple:
        """(phase, the running layer's index or None, the innermost module outside layers). In backward two
        layers can be open at once (a layer's backward hook fires once its output's gradient exists, before the
        layer above has finished): the running one is the lower."""
        mt = self.tracker
        parents = mt._mod_tracker.parents
        phase = "optimizer" if mt._in_opt else "backward" if mt._mod_tracker.is_bw else "forward"
        found = [i for i in map(self._layer_of, parents) if i is not None]
        if found:
            return phase, (max(found) if phase == "forward" else min(found)), ""
        return phase, None, max(parents, key=len) if parents else ""

    def observe(self, total: int, snap: dict) -> None:
        now = time.perf_counter()
        phase, i, inner = self._where()
        if self._clock is not None:
            if self._in_layer:
                self.layer_s += now - self._clock
            else:
                self.other_s += now - self._clock
        self._clock, self._in_layer = now, i is not None
        if i is not None and (phase, i) != self._last:
            self._last = (phase, i)
            if self.progress is not None and phase != "optimizer":
                self.progress(f"step {self.step}/2 {phase} layer {i + 1}/{self.layers}")
        elif i is None and phase == "optimizer" and self._last != (phase, None):
            self._last = (phase, None)
            if self.progress is not None:
                self.progress(f"step {self.step}/2 optimizer step")
        if i is not None:
            where = self._after = self.position(i)
        else:  # between layers: named by the layer before it (a gap after an interior layer is interior too)
            where = f"after {self._after}" if self._after != "interior" else "interior"
        key = (self.step, phase, where, inner)
        best = self.peaks.get(key)
        if best is None or best[0] < total:
            self.peaks[key] = (total, {str(getattr(k, "value", k)): v for d in snap.values() for k, v in d.items()})
