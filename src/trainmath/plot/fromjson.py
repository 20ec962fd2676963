"""Charts of results saved as JSON: ``comm bench --json`` rows, a step's memory timeline, the planner's
candidates. Pure: the caller reads the file; a document of the wrong shape is one ``TrainmathError`` naming the
field that is missing.

Shapes read:
- comm: a list of rows ``{op, impl, nproc, size_bytes, busbw_bytes_per_s, predicted_time_s, ...}``;
- timeline: a list of ``{event, bytes}``, or an object with that list under ``timeline`` and optionally
  ``peak_event``, ``fits``, ``margin_bytes``, ``model``;
- plan: ``{"layouts": [{step_time_s, peak_bytes, fits, breakdown: {name: s}, degrees..., ...}], "rejected":
  {reason: count}}``, ranked best first, as ``trainmath plan --json`` prints it; with ``--explain`` also
  ``"rejected_list": [{..., reason, peak_bytes, step_time_s}]``, whose rows with both figures (estimated, then
  rejected by the memory model) are drawn as candidates that do not fit.
"""

from __future__ import annotations

import math

from trainmath.comm.busbw import busbw_factor
from trainmath.errors import TrainmathError
from trainmath.plot.charts import BarChart, Line, LineChart, Points, ScatterChart, Stack, gib
from trainmath.plot.palette import colour

PHASES = ("forward", "loss", "backward", "optimizer", "zero_grad")
DEGREES = ("dp", "tp", "pp", "cp", "ep", "zero", "recompute", "micro_batch", "virtual_stages")


def _number(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and 0 <= v <= 2**80


def _count(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and 0 <= v <= 2**80


def _text(v) -> bool:
    return isinstance(v, str) and len(v) <= 1000


def _numbers(v) -> bool:
    return isinstance(v, dict) and all(_text(k) and _number(x) for k, x in v.items())


RULES = {"event": (_text, "a string"), "bytes": (_count, "an integer of bytes >= 0"),
         "op": (_text, "a string"), "impl": (_text, "a string"), "backend": (_text, "a string"),
         "nproc": (lambda v: _count(v) and v >= 1, "an integer >= 1"),
         "size_bytes": (lambda v: _count(v) and v >= 1, "an integer of bytes >= 1"),
         "busbw_bytes_per_s": (_number, "a finite number >= 0"), "predicted_time_s": (_number, "a finite number >= 0"),
         "step_time_s": (lambda v: _number(v) and v > 0, "a finite number > 0"),
         "peak_bytes": (_count, "an integer of bytes >= 0"), "fits": (lambda v: isinstance(v, bool), "true or false"),
         "mfu": (_number, "a finite number >= 0"), "breakdown": (_numbers, "an object of name → seconds"),
         "degrees": (lambda v: isinstance(v, dict), "an object"), "margin_bytes": (
             lambda v: isinstance(v, int) and not isinstance(v, bool) and abs(v) <= 2**80, "an integer of bytes"),
         "peak_event": (_text, "a string"), "model": (lambda v: v is None or _text(v), "a string")}
"""Each field these charts read → (rule, what is allowed): a file of the right shape with a number where a name
belongs, or text where bytes belong, is one error naming the entry and the field."""


def _show(v) -> str:
    text = repr(v)
    return text if len(text) <= 40 else text[:37] + "..."


def _need(row: dict, keys: tuple[str, ...], what: str) -> None:
    if not isinstance(row, dict):
        raise TrainmathError(f"{what}: expected an object, got {type(row).__name__}")
    missing = [k for k in keys if k not in row]
    if missing:
        raise TrainmathError(f"{what} lacks {', '.join(missing)}")
    for k, (ok, allowed) in RULES.items():
        if k in row and not ok(row[k]):
            raise TrainmathError(f"{what}: {k} must be {allowed}, got {_show(row[k])}")


# -------------------------------------------------------------------------------------------------- comm

def comm_chart(rows: list) -> LineChart:
    """Bus bandwidth (GB/s, 1e9) against message size, measured (solid) and the α–β model's prediction (dashed,
    busbw = factor · size / predicted time), one colour per implementation, one line pair per (op, impl, ranks)."""
    if not isinstance(rows, list) or not rows:
        raise TrainmathError("comm results: expected the non-empty list `trainmath comm bench --json` prints")
    series: dict[tuple, list] = {}
    for i, r in enumerate(rows):
        _need(r, ("op", "impl", "nproc", "size_bytes", "busbw_bytes_per_s", "predicted_time_s"), f"comm row {i}")
        series.setdefault((r["op"], r["impl"], r["nproc"]), []).append(r)
    lines = []
    for (op, impl, n), rs in series.items():
        rs = sorted(rs, key=lambda r: r["size_bytes"])
        xs = tuple(float(r["size_bytes"]) for r in rs)
        factor = float(busbw_factor(op, n))
        label = f"{op} {impl} ({n} ranks)"
        lines.append(Line(name=f"{label} measured", colour=colour(impl), xs=xs,
                          ys=tuple(r["busbw_bytes_per_s"] / 1e9 for r in rs)))
        lines.append(Line(name=f"{label} predicted", colour=colour(impl), xs=xs, dashed=True, markers=False,
                          ys=tuple(factor * r["size_bytes"] / r["predicted_time_s"] / 1e9 if r["predicted_time_s"]
                                   else 0.0 for r in rs)))
    backends = sorted({r.get("backend", "?") for r in rows})
    return LineChart(title="Bus bandwidth vs message size", xlabel="message size (bytes, log scale)",
                     ylabel="bus bandwidth (GB/s, 1e9 bytes/s)", lines=tuple(lines), xlog2=True,
                     notes=(f"backend {', '.join(backends)}; busbw = algbw × nccl-tests factor (all_reduce "
                            f"2(n-1)/n); predicted: α–β model of trainmath.comm",))


# ---------------------------------------------------------------------------------------------- timeline

def phase_of(event: str) -> str:
    """The step phase an event name belongs to (first of PHASES it mentions; 'head'/'logits' count as loss)."""
    low = event.lower()
    for p in ("zero_grad", "optimizer", "backward", "forward"):
        if p in low:
            return p
    if any(w in low for w in ("loss", "logits", "head", "cross_entropy")):
        return "loss"
    return "other"


def timeline_chart(doc) -> LineChart:
    """Live bytes through one training step (GiB), phases shaded, the peak marked; with ``margin_bytes`` the
    GPU's capacity (peak + margin) as a line."""
    events = doc.get("timeline") if isinstance(doc, dict) else doc
    if not isinstance(events, list) or not events:
        raise TrainmathError("timeline: expected a non-empty list of {event, bytes} (or an object with it "
                             "under 'timeline')")
    for i, e in enumerate(events):
        _need(e, ("event", "bytes"), f"timeline entry {i}")
    xs = tuple(float(i) for i in range(len(events)))
    ys = tuple(gib(e["bytes"]) for e in events)
    bands, start = [], 0
    for i in range(1, len(events) + 1):
        if i == len(events) or phase_of(events[i]["event"]) != phase_of(events[start]["event"]):
            bands.append((start - 0.5, i - 0.5, phase_of(events[start]["event"])))
            start = i
    meta = doc if isinstance(doc, dict) else {}
    if meta:
        _need(meta, (), "timeline")
    peak_i = max(range(len(events)), key=lambda i: events[i]["bytes"])
    name = meta.get("peak_event", events[peak_i]["event"])
    marks = ((float(peak_i), ys[peak_i], f"peak {ys[peak_i]:.2f} GiB at {name}"),)
    hline, notes = None, []
    if "margin_bytes" in meta:
        cap = events[peak_i]["bytes"] + meta["margin_bytes"]
        hline = (f"GPU capacity {gib(cap):.1f} GiB", gib(cap))
        notes.append(f"{'fits' if meta.get('fits', cap >= events[peak_i]['bytes']) else 'does NOT fit'}: "
                     f"margin {gib(meta['margin_bytes']):+.2f} GiB")
    step = max(1, len(events) // 8)
    xticks = tuple((float(i), events[i]["event"]) for i in range(0, len(events), step))
    title = "Memory through one training step" + (f": {meta['model']}" if meta.get("model") else "")
    return LineChart(title=title, xlabel="event (in step order)", ylabel="live memory (GiB, 2**30 bytes)",
                     lines=(Line(name="live bytes", colour="#000000", xs=xs, ys=ys, markers=len(events) <= 60,
                                 labels=tuple(str(e["event"]) for e in events)),),
                     hline=hline, marks=marks, bands=tuple(bands), xticks=xticks,
                     notes=tuple(notes) + ("live tensors only, as torch.cuda.memory_allocated; GiB = 2**30",))


# -------------------------------------------------------------------------------------------------- plan

def layout_label(row: dict) -> str:
    """'dp=8 tp=2 zero=1 ...' from a plan row's ``degrees`` object, or from its degree keys."""
    deg = row.get("degrees") if isinstance(row.get("degrees"), dict) else row
    return " ".join(f"{k}={deg[k]}" for k in DEGREES if k in deg and deg[k] not in (None, 1, "none")) or "dp=1"


def plan_charts(doc, *, top: int = 5) -> tuple[ScatterChart, BarChart]:
    """The planner's candidates (memory per GPU against step time; the best ``top`` highlighted and labelled)
    and the step-time breakdown of those winners as stacked horizontal bars."""
    if not isinstance(doc, dict) or not isinstance(doc.get("layouts"), list):
        raise TrainmathError("plan: expected the object `trainmath plan --json` prints, with a 'layouts' list")
    rows = doc["layouts"]
    for i, r in enumerate(rows):
        _need(r, ("step_time_s", "peak_bytes", "fits"), f"plan layout {i}")
    if not rows:
        raise TrainmathError("plan: no layouts to draw (every candidate was rejected)")
    win = rows[:top]
    rest = rows[top:]
    groups = [Points(name=f"best {len(win)} (ranked by step time)", colour=colour("winner"), size=60,
                     xs=tuple(r["step_time_s"] for r in win), ys=tuple(gib(r["peak_bytes"]) for r in win),
                     labels=tuple(f"#{i + 1}" for i in range(len(win))))]
    over = [r for r in doc.get("rejected_list") or () if isinstance(r, dict)
            and RULES["step_time_s"][0](r.get("step_time_s")) and _count(r.get("peak_bytes"))]
    for name, keep in (("fits", True), ("does not fit", False)):
        sel = [r for r in rest if bool(r["fits"]) is keep] + ([] if keep else over)
        if sel:
            groups.append(Points(name=f"other candidates: {name}", colour=colour(name),
                                 xs=tuple(r["step_time_s"] for r in sel), ys=tuple(gib(r["peak_bytes"]) for r in sel)))
    rejected = doc.get("rejected") or {}
    if not isinstance(rejected, dict) or not all(_text(k) and _count(n) for k, n in rejected.items()):
        raise TrainmathError("plan: 'rejected' must be an object of reason → count")
    notes = tuple(f"rejected: {n} × {why}" for why, n in rejected.items())
    scatter = ScatterChart(title="Planner: candidate layouts", xlabel="step time (s)",
                           ylabel="peak memory per GPU (GiB, 2**30 bytes)", groups=tuple(groups), notes=notes)
    names: list[str] = []
    for r in win:
        for k in (r.get("breakdown") or {}):
            if k not in names:
                names.append(k)
    stacks = tuple(Stack(name=k, colour=colour(k), values=tuple(float((r.get("breakdown") or {}).get(k, 0.0))
                                                                for r in win),
                         labels=tuple("" for _ in win)) for k in names)
    bars = BarChart(title="Step time of the best layouts", ylabel="step time (s)",
                    bars=tuple(f"#{i + 1} {layout_label(r)}" for i, r in enumerate(win)), stacks=stacks,
                    totals=tuple(f"{r['step_time_s']:.3g} s" + (f", MFU {100 * r['mfu']:.0f}%" if "mfu" in r else "")
                                 for r in win), horizontal=True)
    return scatter, bars
