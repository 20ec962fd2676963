"""The served page: a form generated from the CLI's own flag definitions (so its names, choices and defaults
are the command line's), result panels, and a small script that posts the form on every change and shows the
answer (numbers, the memory table, the charts' SVG, or the one-line error)."""

from __future__ import annotations

from html import escape

from trainmath.report.html import CSS

SCRIPT = r"""
const form = document.getElementById('setup'), err = document.getElementById('error');
let timer = null, seq = 0;
const fmt = n => n.toLocaleString('en-US');
const gib = n => (n / 2 ** 30).toFixed(2) + ' GiB';
function set(id, text) { document.getElementById(id).textContent = text; }
async function update() {
  const mine = ++seq;
  const body = new URLSearchParams(new FormData(form));
  const res = await fetch('/api/calc', {method: 'POST', body});
  const out = await res.json();
  if (mine !== seq) return;  // a newer request is on its way
  document.body.classList.toggle('stale', !out.ok);
  err.textContent = out.ok ? '' : out.error;
  if (!out.ok) return;
  const s = out.summary;
  set('model-name', s.model);
  set('total-params', fmt(s.total_params)); set('activated-params', fmt(s.activated_params));
  document.getElementById('peft-card').hidden = !s.peft;
  set('trainable-params', s.peft ? fmt(s.peft.trainable_params) : '');
  set('peft-note', s.peft ? s.peft.memory_note : '');
  const peak = document.getElementById('peak-bytes');
  peak.dataset.bytes = s.peak_bytes; peak.textContent = fmt(s.peak_bytes) + ' bytes (' + gib(s.peak_bytes) + ')';
  set('peak-phase', s.peak_phase); set('layout', s.layout);
  const v = document.getElementById('verdict');
  v.className = 'verdict ' + (s.fit ? (s.fit.fits ? 'fits' : 'nofit') : '');
  v.textContent = s.fit ? (s.fit.fits ? 'fits' : 'does not fit') + ' on ' + s.fit.gpu + ', margin ' +
    gib(s.fit.margin_bytes) + ' (' + s.fit.fit_rule + ')' +
    (s.fit.host_bytes !== undefined ? '; host RAM ' + gib(s.fit.host_bytes) + ' per node ' +
     (s.fit.host_fits ? 'fits' : 'does NOT fit') + ' (' + s.fit.host_fit_rule + ')' : '')
    : 'pick a GPU for the fit verdict';
  const kv = document.getElementById('kv-bytes');
  kv.dataset.bytes = s.kv_cache_bytes;
  kv.textContent = fmt(s.kv_cache_bytes) + ' bytes (' + gib(s.kv_cache_bytes) + ')';
  set('serving-fit', s.serving_fit ? (s.serving_fit.fits ? 'fits' : 'does not fit') + '; largest batch ' +
    fmt(s.serving_fit.max_batch) : '');
  const sp = s.serving_speed, spe = document.getElementById('serving-speed');
  spe.dataset.tpot = sp ? sp.tpot_s : ''; spe.dataset.ttft = sp ? sp.ttft_s : '';
  set('serving-speed', sp ? 'TTFT ' + (sp.ttft_s * 1e3).toFixed(2) + ' ms (' + sp.ttft_bound + '-bound), TPOT ' +
    (sp.tpot_s * 1e3).toFixed(3) + ' ms (' + sp.tpot_bound + '-bound), ' + sp.output_tokens_per_s.toFixed(1) +
    ' output tokens/s' : '');
  const rows = out.memory_rows.map(r => '<tr>' + r.map(c => '<td>' + c + '</td>').join('') + '</tr>');
  document.getElementById('memory-rows').innerHTML = rows.join('');
  for (const [k, svg] of Object.entries(out.charts)) document.getElementById('slot-' + k).innerHTML = svg;
  document.getElementById('plan').hidden = !out.plan_html;
  document.getElementById('slot-plan').innerHTML = out.plan_html;
}
function later() {
  clearTimeout(timer);
  timer = setTimeout(() => update().catch(e => err.textContent = String(e)), 150);
}
form.addEventListener('input', later);
form.addEventListener('change', later);
const drop = document.getElementById('drop'), file = document.getElementById('config-file');
async function take(f) {
  if (!f) return;
  if (f.size > 1048576) { err.textContent = 'trainmath: error: config.json larger than 1 MiB'; return; }
  form.elements.config.value = await f.text(); form.elements.config_name.value = f.name;
  set('drop-name', 'using ' + f.name + ' (clear to go back to the catalog)'); later();
}
file.addEventListener('change', () => take(file.files[0]));
drop.addEventListener('dragover', e => { e.preventDefault(); drop.classList.add('over'); });
drop.addEventListener('dragleave', () => drop.classList.remove('over'));
drop.addEventListener('drop', e => {
  e.preventDefault(); drop.classList.remove('over'); take(e.dataTransfer.files[0]);
});
document.getElementById('clear').addEventListener('click', () => {
  form.elements.config.value = ''; form.elements.config_name.value = ''; file.value = '';
  set('drop-name', ''); later();
});
later();
"""

PAGE_CSS = """
form { display: grid; grid-template-columns: repeat(auto-fill, minmax(170px, 1fr)); gap: 6px 14px;
       border: 1px solid var(--line); border-radius: 6px; padding: 12px; }
label { display: flex; flex-direction: column; font-size: 12px; color: var(--mute); }
label.check { flex-direction: row; align-items: center; gap: 6px; }
input, select { font: inherit; color: var(--ink); padding: 2px 4px; }
#drop { grid-column: 1 / -1; border: 2px dashed var(--line); border-radius: 6px; padding: 8px; color: var(--mute); }
#drop.over { border-color: #0072B2; }
#report-link { grid-column: span 2; justify-self: start; }
#error { color: var(--bad); font-weight: 600; min-height: 1.4em; white-space: pre-wrap; }
body.stale .results { opacity: 0.45; }
.slot svg.chart { max-width: 720px; }
"""


def _control(action) -> str:
    name = action.option_strings[0][2:]
    help_ = escape(action.help or "")
    if action.nargs == 0:
        return f'<label class="check" title="{help_}"><input type="checkbox" name="{name}"> {name}</label>'
    if action.choices:
        opts = "".join(f'<option{" selected" if c == action.default else ""}>{escape(str(c))}</option>'
                       for c in action.choices)
        if action.default is None:  # a flag left out (--peft, --lora-dtype): the field sends nothing
            opts = '<option value="" selected>default</option>' + opts
        return f'<label title="{help_}">{name}<select name="{name}">{opts}</select></label>'
    if name == "gpu":
        from trainmath.hardware import all_gpus

        first = all_gpus()[0].name  # preselected so the fit verdict shows at once; "none" is one click away
        opts = '<option value="">none</option>' + "".join(
            f'<option value="{escape(g.name)}"{" selected" if g.name == first else ""}>{escape(g.name)}</option>'
            for g in all_gpus())
        return f'<label title="{help_}">gpu<select name="gpu">{opts}</select></label>'
    kind = ' type="number" min="1"' if action.type is int else ""
    value = "" if action.default is None else escape(str(action.default))
    hint = {"context": "= seq", "micro-batches": "≥ pp", "gpus": "no planner",
            "global-batch": "= micro-batch × gpus"}.get(name, "")
    hint = f' placeholder="{hint}"' if hint else ""
    return f'<label title="{help_}">{name}<input name="{name}"{kind} value="{value}"{hint}></label>'


def page(default_model: str = "Qwen/Qwen3-8B") -> str:
    from trainmath.serve.flags import parser
    from trainmath.sources import catalog_index

    models = "".join(f'<option{" selected" if m == default_model else ""}>{escape(m)}</option>'
                     for m in catalog_index())
    defaults = {"micro-batch": "1", "seq": "4096"}
    controls = []
    for a in parser()._actions:
        if not a.option_strings:
            continue
        html = _control(a)
        name = a.option_strings[0][2:]
        if name in defaults:
            html = html.replace('value=""', f'value="{defaults[name]}"')
        controls.append(html)
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><meta name="viewport" content="width=device-width, initial-scale=1">
<link rel="icon" href="data:,"><title>trainmath calculator</title><style>{CSS}{PAGE_CSS}</style></head><body>
<h1>trainmath calculator</h1>
<p class="sub">Exact parameters, training memory per GPU and KV cache from a config.json — the same core as the
<code>trainmath</code> command line; every field is one of its flags.</p>
<form id="setup" method="post" action="/report" target="_blank">
<label>model<select name="model" id="model">{models}</select></label>
{"".join(controls)}
<div id="drop">drop a config.json here or <input type="file" id="config-file" accept=".json,application/json">
<button type="button" id="clear">clear</button> <span id="drop-name"></span></div>
<textarea name="config" hidden></textarea><input type="hidden" name="config_name">
<button type="submit" id="report-link">open the full report (HTML) ↗</button>
</form>
<p id="error" role="alert"></p>
<div class="results">
<h2 id="model-name"></h2>
<div class="cards">
<div class="card"><b id="total-params">…</b><span>parameters</span></div>
<div class="card"><b id="activated-params">…</b><span>activated per token</span></div>
<div class="card" id="peft-card" hidden><b id="trainable-params">…</b><span>trainable (adapters)</span></div>
<div class="card"><b id="peak-bytes" data-bytes="">…</b>
<span>peak memory per GPU, at <i id="peak-phase"></i></span></div>
<div class="card"><b id="kv-bytes" data-bytes="">…</b><span>KV cache (serving)</span></div>
</div>
<p>layout <code id="layout"></code> — <span id="verdict" class="verdict"></span> ·
serving: <span id="serving-fit"></span> · <span id="serving-speed" data-tpot="" data-ttft=""></span></p>
<p class="sub" id="peft-note"></p>
<h2>Training memory per GPU</h2>
<table><thead><tr><th>term</th><th>bytes</th><th>GiB</th><th>share</th></tr></thead>
<tbody id="memory-rows"></tbody></table>
<div class="slot" id="slot-memory"></div>
<h2>Memory through the step</h2><div class="slot" id="slot-timeline"></div>
<h2>Where the parameters live</h2><div class="slot" id="slot-params"></div>
<h2>Serving memory</h2><div class="slot" id="slot-serving"></div>
<section id="plan" hidden><h2>Planner</h2><div class="slot" id="slot-plan"></div></section>
<p class="sub">GiB = 2**30 bytes; peak = torch.cuda.max_memory_allocated of one step (live tensors; no CUDA
context). Conventions are listed in the full report.</p>
</div>
<script>{SCRIPT}</script>
</body></html>
"""
