"""The report page: one HTML string with inline CSS (print rules included) and inline SVG charts.

Pure: ``page(data)`` returns text; the CLI writes it atomically. Nothing is fetched when the page is viewed (no
script, no external font, stylesheet or image), so it can be mailed or archived as one file.
"""

from __future__ import annotations

from html import escape

from trainmath import __version__
from trainmath.plot.charts import peak_phase
from trainmath.plot.svg import chart_svg
from trainmath.render import human_bytes, human_count
from trainmath.report.gather import ReportData, charts
from trainmath.report.peft import section as peft_section

CSS = """
:root { --ink: #1b1b1b; --mute: #555; --line: #ddd; --ok: #0a7d32; --bad: #b00020; }
* { box-sizing: border-box; }
body { font: 14px/1.45 system-ui, -apple-system, "Segoe UI", Roboto, sans-serif; color: var(--ink);
       max-width: 1040px; margin: 0 auto; padding: 24px; }
h1 { font-size: 22px; margin: 0 0 4px; }
h2 { font-size: 17px; margin: 26px 0 8px; border-bottom: 1px solid var(--line); }
.sub { color: var(--mute); margin: 0 0 12px; }
table { border-collapse: collapse; margin: 6px 0 10px; }
th, td { padding: 3px 10px; border-bottom: 1px solid var(--line); text-align: right; vertical-align: top; }
th:first-child, td:first-child { text-align: left; } td.note { text-align: left; color: var(--mute); font-size: 12px; }
tr.total td { font-weight: 600; border-top: 2px solid #999; }
.verdict { font-weight: 600; padding: 2px 8px; border-radius: 4px; }
.fits { color: var(--ok); background: #e8f5ec; } .nofit { color: var(--bad); background: #fde8ec; }
svg.chart { width: 100%; max-width: 760px; height: auto; display: block; margin: 8px 0 4px; }
.cards { display: flex; flex-wrap: wrap; gap: 10px; margin: 10px 0; }
.card { border: 1px solid var(--line); border-radius: 6px; padding: 8px 12px; min-width: 180px; }
.card b { display: block; font-size: 18px; } .card span { color: var(--mute); font-size: 12px; }
ul.conv { color: var(--mute); font-size: 12.5px; padding-left: 18px; }
code { font-size: 12.5px; }
@media print {
  body { max-width: none; padding: 0; font-size: 11px; }
  section { break-inside: avoid; page-break-inside: avoid; }
  svg.chart { max-width: 16cm; }
  a { color: inherit; text-decoration: none; }
}
"""


def _table(headers: list[str], rows: list[list[str]], total: list[str] | None = None, cls: str = "") -> str:
    head = "".join(f"<th>{escape(h)}</th>" for h in headers)
    body = "".join("<tr>" + "".join(f"<td>{c}</td>" for c in r) + "</tr>" for r in rows)
    if total:
        body += '<tr class="total">' + "".join(f"<td>{c}</td>" for c in total) + "</tr>"
    return f'<table class="{cls}"><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>'


def _pct(v: int, t: int) -> str:
    return f"{100 * v / t:.1f}%" if t else "–"


def _b(n: int) -> str:
    return f"{n:,}"


def verdict_html(fit: dict | None) -> str:
    if fit is None:
        return '<span class="verdict">no GPU given (--gpu)</span>'
    cls, word = ("fits", "fits") if fit["fits"] else ("nofit", "does not fit")
    if not fit["fits"] and fit.get("gpu_fits"):
        word = "host RAM exceeded: does not fit"
    host = ""
    if "host_bytes" in fit:
        host = (f'; host RAM {human_bytes(fit["host_bytes"])} per node '
                f'{"fits" if fit["host_fits"] else "does NOT fit"} <span class="rule">'
                f'({escape(fit["host_fit_rule"])})</span>')
    return (f'<span class="verdict {cls}" id="verdict">{word} on {escape(fit["gpu"])}</span> '
            f'margin {human_bytes(fit["margin_bytes"])} of {human_bytes(fit["usable_bytes"])} usable '
            f'<span class="rule">({escape(fit["fit_rule"])})</span>{host}')


def params_section(d: ReportData) -> str:
    p = d.params
    act = p.activated.flat()
    rows = [[escape(c.name), _b(c.value), _pct(c.value, p.total_params), _b(act.get(c.name, 0)), escape(c.note)]
            for c in p.components.children if c.value]
    return ('<section id="params"><h2>Parameters</h2>'
            + _table(["component", "parameters", "share", "activated per token", ""], rows,
                     ["total", _b(p.total_params), "100%", _b(p.activated_params), ""])
            + f"<p>non-embedding: {_b(p.non_embedding_params)}</p></section>")


def flops_section(d: ReportData) -> str:
    f, c = d.flops, d.closed
    rows = [[n, _b(x.value), _b(x.value // f.batch), f"{x.value / f.tokens:,.1f}"]
            for n, x in (("forward", f.forward), ("backward", f.backward), ("recompute", f.recomputed))]
    ratio = (f.forward.value + f.backward.value) / c.training_flops if c.training_flops else float("nan")
    return (f'<section id="flops"><h2>FLOPs of one micro-batch</h2>'
            f'<p class="sub">{f.batch} × {f.seq:,} = {f.tokens:,} tokens, the whole model (not divided by TP/PP), '
            f'recompute {escape(f.recompute)}, attention products {escape(f.causal)}</p>'
            + _table(["", "per micro-batch", "per sequence", "per token"], rows,
                     ["training", _b(f.training.value), _b(f.training.value // f.batch),
                      f"{f.training.value / f.tokens:,.1f}"])
            + f"<p>closed form 6N + attention: N = {_b(c.matmul_params)} → {c.training_flops:,.0f}; "
              f"forward + backward / closed form = {ratio:.4f}</p></section>")


def memory_section(d: ReportData, svg: str, timeline_svg: str = "") -> str:
    m = d.memory
    peak = m.peak_bytes
    rows = [[escape(n.name), _b(n.value), human_bytes(n.value), _pct(n.value, peak), escape(n.note)]
            for n in m.breakdown.children if n.value]
    s = m.setup
    stages = ""
    if len(m.stages) > 1:
        stages = _table(["stage", "layers", "in flight", "peak phase", "peak bytes"],
                        [[str(x.stage), f"{x.layers.start}–{x.layers.stop - 1}", str(x.in_flight), x.phase,
                          _b(x.breakdown.value)] for x in m.stages])
    return (f'<section id="memory"><h2>Training memory per GPU</h2>'
            f'<p class="sub">micro-batch {s.micro_batch} × seq {s.seq:,}, {escape(s.precision)}, '
            f'{escape(s.optimizer)} ({escape(s.optimizer_impl)}), recompute {escape(s.recompute)}, attention '
            f'{escape(s.attention)}, profile {escape(s.profile)}</p>'
            f'<p>peak <b id="peak-bytes" data-bytes="{peak}">{_b(peak)} bytes ({human_bytes(peak)})</b> at '
            f'{escape(peak_phase(m))} — {verdict_html(d.fit)}</p>'
            + (f'<p>host RAM per node (--offload {escape(s.offload)}) <b id="host-bytes" '
               f'data-bytes="{d.host.host_bytes}">{_b(d.host.host_bytes)} bytes ({human_bytes(d.host.host_bytes)})'
               f'</b>: {d.host.ranks_per_node} ranks × {human_bytes(d.host.per_rank.value)}</p>'
               if d.host is not None else "")
            + _table(["term", "bytes", "GiB", "share", ""], rows, ["peak_bytes", _b(peak), human_bytes(peak),
                                                                   "100%", ""])
            + stages + svg
            + (f'<h3>Through the step</h3><p class="sub">live bytes at every event of the step (of the peak '
               f'stage), as <code>trainmath memory --timeline --json</code></p>{timeline_svg}' if timeline_svg else "")
            + "</section>")


def serving_section(d: ReportData, svg: str) -> str:
    r = d.serving
    s = r.setup
    rows = [[escape(f"weights/{c.name}"), _b(c.value), human_bytes(c.value)] for c in r.weights.children if c.value]
    rows += [[escape(f"kv_cache/{c.name}"), _b(c.value), human_bytes(c.value)] for c in r.kv_cache.children
             if c.value]
    fit = ""
    if r.fit is not None:
        f = r.fit
        from trainmath.render import context_text

        ctx = escape(context_text(f))
        fit = (f'<p><span class="verdict {"fits" if f.fits else "nofit"}">'
               f'{"fits" if f.fits else "does not fit"}</span> on {escape(f.gpu)} at {f.mem_util_percent}% '
               f'({human_bytes(f.usable_bytes)} usable); largest batch at context {s.context:,}: {f.max_batch:,}; '
               f'largest context at batch {s.batch}: {ctx}</p>')
    return (f'<section id="serving"><h2>Serving: weights and KV cache</h2>'
            f'<p class="sub">batch {s.batch} × context {s.context:,}, weights {escape(s.weights.dtype)}, '
            f'kv {escape(s.cache.kv_dtype)}, tp {s.tp} (per rank)</p>'
            + _table(["memory", "bytes", "GiB"], rows, ["total", _b(r.total_bytes), human_bytes(r.total_bytes)])
            + f'<p>KV cache <b id="kv-bytes" data-bytes="{r.kv_cache_bytes}">{_b(r.kv_cache_bytes)} bytes</b>; '
              f'{_b(r.kv_bytes_per_token)} bytes per token of context</p>' + fit + speed_html(d.speed) + svg
            + "</section>")


def speed_html(f) -> str:
    """The serving speed paragraph (``trainmath infer --input --output``), empty without a GPU."""
    if f is None:
        return ""
    return (f'<h3>Serving speed</h3><p class="sub">batch {f.batch}, prompt {f.input:,} tokens, {f.output:,} '
            f'generated; step = |other GEMM compute, other weight bytes| + |expert compute, '
            f'expert bytes touched| + |attention compute, cache bytes| + communication + overhead, '
            f'|c, m| = (c<sup>p</sup> + m<sup>p</sup>)<sup>1/p</sup> with p = {f.prefill.overlap:g}, as '
            f'<code>trainmath infer --input --output</code></p>'
            + _table(["", "predicted", "floor (efficiency 1)", "bound"], [
                ["TTFT", f"{f.ttft_s * 1e3:,.2f} ms", f"{f.prefill_floor.time_s * 1e3:,.2f} ms", f.prefill.bound],
                ["TPOT", f"{f.tpot_s * 1e3:,.3f} ms", f"{f.tpot_floor_s * 1e3:,.3f} ms", f.decode.bound],
                ["output tokens/s", f"{f.output_tokens_per_s:,.1f}", "", ""]])
            + f'<p id="serving-speed" data-tpot="{f.tpot_s!r}" data-ttft="{f.ttft_s!r}"></p>')


def layout_section(d: ReportData) -> str:
    lay = d.memory.layout
    rows = [[k, str(getattr(lay, k))] for k in ("dp", "tp", "pp", "cp", "ep", "sp", "zero")]
    return (f'<section id="layout"><h2>Layout</h2><p>{escape(lay.describe())} on {lay.ranks} GPUs'
            f'{" (" + escape(d.gpu.name) + ")" if d.gpu else ""}</p>' + _table(["degree", "value"], rows)
            + plan_html(d.plan) + "</section>")


def plan_html(result) -> str:
    """The planner's best layouts for the job (``trainmath plan``), or what is closest when nothing fits."""
    if result is None:
        return ""
    space = (escape(result.search) if result.search else
             "DP×TP×PP×CP×EP, ZeRO, recompute, micro-batch, virtual stages")
    head = (f'<h3>Planner: best layouts on {result.gpus} × {escape(result.gpu)}</h3><p>{result.candidates:,} '
            f'candidates searched ({space}), ranked by step time, as <code>trainmath plan</code>; memory per GPU '
            f'of its own model ({"/".join(result.fit_profiles)} profile).</p>')
    if not result.layouts:
        return head + (f'<p id="plan-none">no layout fits in {human_bytes(result.usable_bytes)} per GPU; the closest '
                       f'needs {human_bytes(result.closest[0].peak_bytes) if result.closest else "?"}.</p>')
    rows = [[str(i), escape(e.layout.describe()), str(e.job.micro_batch), str(e.job.virtual_stages), e.job.recompute,
             f"{e.step_time_s:.3f}", f"{100 * e.mfu:.1f}%", human_bytes(e.peak_bytes)]
            for i, e in enumerate(result.layouts, 1)]
    return head + _table(["#", "layout", "micro-batch", "virtual stages", "recompute", "step s", "MFU",
                          "memory per GPU"], rows, cls="plan")


def conventions(d: ReportData) -> list[str]:
    out = ["bytes: GiB = 2**30, GB = 1e9; counts: K/M/B = 1e3/1e6/1e9; all figures are exact integers before "
           "rounding for display"]
    from trainmath.adapters import CONVENTIONS as PEFT_CONVENTIONS

    peft = PEFT_CONVENTIONS if d.adapters is not None else ()
    for group in (d.params.conventions, peft, d.flops.conventions, d.memory.conventions, d.serving.conventions):
        out.extend(c for c in group if c not in out)
    return out


def page(d: ReportData) -> str:
    """The whole report as one HTML document."""
    svgs = {name: chart_svg(c, chart_id=f"chart-{name}") for name, c in charts(d).items()}
    p = d.params
    cards = "".join(f'<div class="card"><b>{v}</b><span>{escape(k)}</span></div>' for k, v in (
        ("parameters", human_count(p.total_params)), ("activated per token", human_count(p.activated_params)),
        *((("trainable (adapters)", human_count(d.adapters.trainable_params)),) if d.adapters else ()),
        ("peak memory per GPU", human_bytes(d.memory.peak_bytes)),
        ("training FLOPs per token", f"{d.flops.training.value / d.flops.tokens / 1e9:,.2f} G"),
        ("KV cache", human_bytes(d.serving.kv_cache_bytes))))
    conv = "".join(f"<li>{escape(c)}</li>" for c in conventions(d))
    title = f"trainmath report: {d.spec.name}"
    return (f'<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
            f'<meta name="viewport" content="width=device-width, initial-scale=1">'
            f"<link rel='icon' href='data:,'><title>{escape(title)}</title><style>{CSS}</style></head><body>"
            f"<h1>{escape(d.spec.name)}</h1><p class='sub'>{escape(d.spec.model_type)}, {d.spec.num_layers} layers · "
            f"trainmath {__version__} · the figures of Jiang Yi's blog series on distributed training, exact</p>"
            f'<div class="cards">{cards}</div>'
            f'<section id="shares"><h2>Where the parameters live</h2>{svgs["params"]}</section>'
            + params_section(d) + peft_section(d.adapters, d.peft_note) + flops_section(d)
            + memory_section(d, svgs["memory"], svgs["timeline"])
            + layout_section(d) + serving_section(d, svgs["serving"])
            + f'<section id="conventions"><h2>Conventions</h2><ul class="conv">{conv}</ul></section>'
            "</body></html>\n")
