"""Charts as data: what each picture shows, in display units, gathered from the calculator's results.

Pure (no matplotlib, no I/O): ``mpl`` draws these with matplotlib for ``trainmath plot``; ``svg`` draws the same
objects as inline SVG for the report and the web page, so both show the same numbers in the same colours
(``palette``). Bytes are shown in GiB (2**30) and bandwidth in GB/s (1e9 bytes/s); every chart says which.
"""

from __future__ import annotations

from dataclasses import dataclass

from trainmath.errors import TrainmathError
from trainmath.plot.palette import colour
from trainmath.render import human_count

GIB = 2**30

PARAM_GROUPS = (
    ("Embedding", ("embed_tokens", "pos_embed", "lm_head")),
    ("Attention", ("attention", "linear_attention", "mamba")),
    ("FFN", ("mlp_dense",)),
    ("MoE", ("experts", "shared_experts", "router")),
    ("Others", ("norms",)),
)
"""The blog series' four groups (Embedding, Attention, FFN or MoE, Others) over the ledger's components; a
component not named here counts as Others. Linear attention and Mamba mixers count as Attention."""

MEMORY_GROUPS = (
    ("weights", ("weights_bytes",)),
    ("gradients", ("gradients_bytes",)),
    ("master weights", ("master_weights_bytes",)),
    ("optimizer states", ("optimizer_states_bytes",)),
    ("activations", ("activations_bytes",)),
    ("logits and loss", ("logits_bytes", "logits_fp32_bytes", "cross_entropy_grad_bytes")),
    ("weight copies and ZeRO-3 buffers", ("weight_copies_bytes", "zero3_gather_bytes", "zero3_grad_reduce_bytes")),
    ("optimizer step temporaries", ("optimizer_step_temporaries_bytes", "optimizer_fp32_grads_bytes")),
    ("framework buffers", ("framework_overhead_bytes",)),
)
"""Training-memory terms grouped for a chart; a term not named here (a newer breakdown) shows as "other"."""


@dataclass(frozen=True, kw_only=True)
class Stack:
    """One legend entry of a stacked bar chart: its value on every bar (display units) and the text inside."""

    name: str
    colour: str
    values: tuple[float, ...]
    labels: tuple[str, ...]


@dataclass(frozen=True, kw_only=True)
class BarChart:
    title: str
    ylabel: str
    bars: tuple[str, ...]
    stacks: tuple[Stack, ...]
    totals: tuple[str, ...]
    """Text above each bar."""
    ymax: float | None = None
    hline: tuple[str, float] | None = None
    """(label, value): a horizontal line such as a GPU's capacity."""
    notes: tuple[str, ...] = ()
    horizontal: bool = False


@dataclass(frozen=True, kw_only=True)
class Line:
    name: str
    colour: str
    xs: tuple[float, ...]
    ys: tuple[float, ...]
    dashed: bool = False
    markers: bool = True
    labels: tuple[str, ...] = ()
    """A name per point (the timeline's event names): hover text of the SVG points."""


@dataclass(frozen=True, kw_only=True)
class LineChart:
    title: str
    xlabel: str
    ylabel: str
    lines: tuple[Line, ...]
    xlog2: bool = False
    hline: tuple[str, float] | None = None
    marks: tuple[tuple[float, float, str], ...] = ()
    """(x, y, text) points to annotate (the peak)."""
    bands: tuple[tuple[float, float, str], ...] = ()
    """(x0, x1, phase name): shaded spans, coloured by phase."""
    xticks: tuple[tuple[float, str], ...] = ()
    notes: tuple[str, ...] = ()


@dataclass(frozen=True, kw_only=True)
class Points:
    name: str
    colour: str
    xs: tuple[float, ...]
    ys: tuple[float, ...]
    labels: tuple[str, ...] = ()
    size: float = 30


@dataclass(frozen=True, kw_only=True)
class ScatterChart:
    title: str
    xlabel: str
    ylabel: str
    groups: tuple[Points, ...]
    hline: tuple[str, float] | None = None
    notes: tuple[str, ...] = ()


def gib(n: float) -> float:
    return n / GIB


def peak_phase(report) -> str:
    """Where a ``MemoryReport`` peaks: its ``peak_event`` when it has a timeline, else its peak stage's phase."""
    event = getattr(report, "peak_event", None)
    return event if event else report.stages[report.stage].phase


# ------------------------------------------------------------------------------------------------ parameters

def param_groups(node) -> dict[str, int]:
    """Group name → exact parameter count, from a ``ParamReport``'s ``components`` or ``activated`` tree."""
    out = {g: 0 for g, _ in PARAM_GROUPS}
    where = {c: g for g, comps in PARAM_GROUPS for c in comps}
    for c in node.children:
        out[where.get(c.name, "Others")] += c.value
    return out


def params_chart(reports, *, activated: bool = False) -> BarChart:
    """One stacked bar per model of the groups' shares of its total parameters; with ``activated``, a second bar
    per model with the shares of the parameters activated per token (the blog series' MoE charts). Each segment
    is labelled with its count (B = 1e9)."""
    if not reports:
        raise TrainmathError("give at least one model")
    columns = []  # (bar label, groups, total)
    for r in reports:
        short = r.model.split("/")[-1]
        columns.append((short + (" total" if activated else ""), param_groups(r.components), r.total_params))
        if activated:
            columns.append((short + " activated", param_groups(r.activated), r.activated_params))
    stacks = []
    for name, _ in PARAM_GROUPS:
        counts = [g[name] for _, g, _ in columns]
        if not any(counts):
            continue
        shares = tuple(100 * c / t if t else 0.0 for c, (_, _, t) in zip(counts, columns))
        labels = tuple(f"{human_count(c)} ({s:.0f}%)" if c else "" for c, s in zip(counts, shares))
        stacks.append(Stack(name=name, colour=colour(name.lower()), values=shares, labels=labels))
    return BarChart(
        title="Where the parameters live" + (": total vs activated per token" if activated else ""),
        ylabel="share of the parameters (%)", bars=tuple(c[0] for c in columns), stacks=tuple(stacks),
        totals=tuple(human_count(t) for _, _, t in columns), ymax=100.0,
        notes=("counts exact (B = 1e9); a tied lm_head adds 0; Embedding = embed_tokens + pos_embed + untied "
               "lm_head; Attention includes linear-attention / Mamba mixers and q/k norms; MoE = routed + shared "
               "experts + router",))


# ------------------------------------------------------------------------------------------- training memory

def memory_groups(flat: dict[str, int]) -> dict[str, int]:
    """Group name → bytes, from a breakdown's ``flat()`` (term → bytes); unknown terms go to "other"."""
    out = {g: 0 for g, _ in MEMORY_GROUPS}
    out["other"] = 0
    where = {t: g for g, terms in MEMORY_GROUPS for t in terms}
    for term, value in flat.items():
        out[where.get(term, "other")] += value
    return out


def memory_chart(variants, *, title: str, gpu=None) -> BarChart:
    """Stacked bars of per-GPU training memory, one per (label, MemoryReport or error text) variant; a variant
    that cannot be built is named in the notes with its reason. ``gpu``: a ``GPU`` preset, drawn as a line."""
    ok = [(label, r) for label, r in variants if not isinstance(r, str)]
    if not ok:
        raise TrainmathError("; ".join(f"{label}: {r}" for label, r in variants))
    groups = [(label, memory_groups(r.breakdown.flat()), r.peak_bytes) for label, r in ok]
    stacks = []
    for name in [g for g, _ in MEMORY_GROUPS] + ["other"]:
        values = tuple(gib(g[name]) for _, g, _ in groups)
        if not any(values):
            continue
        stacks.append(Stack(name=name, colour=colour(name), values=values,
                            labels=tuple(f"{v:.1f}" if v else "" for v in values)))
    notes = [f"{label}: not shown ({r.split(':')[0][:100]})" for label, r in variants if isinstance(r, str)]
    hline = None
    if gpu is not None:
        hline = (f"{gpu.name}: {gib(gpu.memory_bytes):.0f} GiB", gib(gpu.memory_bytes))
        for label, _, peak in groups:
            verdict = "fits" if peak <= gpu.memory_bytes else "does NOT fit"
            notes.append(f"{label}: {verdict} ({gib(gpu.memory_bytes - peak):+.2f} GiB margin)")
    notes.append("peak of torch.cuda.max_memory_allocated for one step: live tensors only (no CUDA context or "
                 "cached-free memory); GiB = 2**30 bytes")
    return BarChart(title=title, ylabel="memory per GPU (GiB, 2**30 bytes)",
                    bars=tuple(f"{label}\npeak: {peak_phase(r)}" for label, r in ok),
                    stacks=tuple(stacks), totals=tuple(f"{gib(p):.2f} GiB" for _, _, p in groups), hline=hline,
                    notes=tuple(notes))


def serving_chart(report) -> BarChart:
    """One stacked bar of serving memory on one TP rank (weights, KV cache, workspace) against the GPU."""
    parts = [("weights", report.weights_bytes), ("kv cache", report.kv_cache_bytes),
             ("workspace", report.setup.workspace_bytes)]
    stacks = tuple(Stack(name=n, colour=colour(n), values=(gib(v),), labels=(f"{gib(v):.2f}",))
                   for n, v in parts if v)
    s = report.setup
    hline, notes = None, []
    if report.fit is not None:
        f = report.fit
        hline = (f"{f.gpu} × {f.mem_util_percent}%: {gib(f.usable_bytes):.1f} GiB", gib(f.usable_bytes))
        notes.append(f"{'fits' if f.fits else 'does NOT fit'}; largest batch at this context {f.max_batch:,}")
    return BarChart(title=f"Serving memory: batch {s.batch} × context {s.context:,}",
                    ylabel="memory per GPU (GiB, 2**30 bytes)",
                    bars=(f"weights {s.weights.dtype}, kv {s.cache.kv_dtype}",),
                    stacks=stacks, totals=(f"{gib(report.total_bytes):.2f} GiB",), hline=hline, notes=tuple(notes))
