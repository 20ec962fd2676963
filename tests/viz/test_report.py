"""`trainmath report`: one self-contained page whose numbers are the calculator's, written whole."""

import re

import pytest

from trainmath.cli import main
from trainmath.hardware import gpu
from trainmath.infer import InferenceSetup, infer_memory
from trainmath.layout import ParallelLayout
from trainmath.memory.training import TrainingSetup, training_memory
from trainmath.params import count_params
from trainmath.sources import load_spec

ARGS = ["qwen3-30b-a3b", "--micro-batch", "2", "--seq", "2048", "--dp", "8", "--ep", "8", "--zero", "3",
        "--recompute", "full", "--gpu", "h100", "--serve-batch", "4", "--context", "8192"]


@pytest.fixture(scope="module")
def html(tmp_path_factory):
    out = tmp_path_factory.mktemp("report") / "r.html"
    assert main(["report", *ARGS, "-o", str(out)]) == 0
    return out.read_text()


def _data_bytes(html: str, id_: str) -> int:
    return int(re.search(rf'id="{id_}" data-bytes="(\d+)"', html).group(1))


def test_numbers_are_the_calculators(html):
    spec = load_spec("qwen3-30b-a3b")
    mem = training_memory(spec, TrainingSetup(micro_batch=2, seq=2048, recompute="full"),
                          ParallelLayout(dp=8, ep=8, zero=3))
    assert _data_bytes(html, "peak-bytes") == mem.peak_bytes
    kv = infer_memory(spec, InferenceSetup(batch=4, context=8192)).kv_cache_bytes
    assert _data_bytes(html, "kv-bytes") == kv
    p = count_params(spec)
    assert f"{p.total_params:,}" in html and f"{p.activated_params:,}" in html
    fits = mem.peak_bytes <= gpu("h100").memory_bytes
    assert ('class="verdict fits"' if fits else 'class="verdict nofit"') in html


def test_self_contained_and_printable(html):
    assert html.count("<svg") == 4
    assert not re.search(r"""(src|href)\s*=\s*["']?(https?:)?//""", html), "fetches something when viewed"
    assert "<script" not in html and "@import" not in html and "url(" not in html
    assert "@media print" in html
    for section in ("params", "flops", "memory", "layout", "serving", "conventions"):
        assert f'<section id="{section}">' in html
    assert "GiB = 2**30" in html


@pytest.mark.parametrize("out,needle", [("r.txt", "must end in .html"), ("nodir/r.html", "does not exist")])
def test_bad_output_is_one_line(tmp_path, capsys, out, needle):
    assert main(["report", *ARGS, "-o", str(tmp_path / out)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and needle in err
    assert list(tmp_path.iterdir()) == []


def test_impossible_setup_writes_nothing(tmp_path, capsys):
    out = tmp_path / "r.html"
    assert main(["report", "qwen3-8b", "--micro-batch", "1", "--seq", "4096", "--tp", "3", "-o", str(out)]) == 2
    assert "tp (3) must divide attention heads (32)" in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []


def test_report_shows_the_planners_best_layouts(tmp_path, capsys):
    """With --gpus and --gpu the layout section lists `trainmath plan`'s best layouts, the same ones, in order."""
    import json
    from html import escape

    job = ["--gpus", "8", "--gpu", "h100", "--seq", "2048", "--global-batch", "32"]
    assert main(["plan", "qwen3-0.6b", *job, "--top", "3", "--json"]) == 0
    best = json.loads(capsys.readouterr().out)["layouts"]
    out = tmp_path / "r.html"
    assert main(["report", "qwen3-0.6b", "--micro-batch", "1", *job, "-o", str(out)]) == 0
    page = out.read_text()
    assert "Planner: best layouts on 8 × H100-SXM-80GB" in page
    table = page[page.index('class="plan"'):]
    at = [table.index(escape(f"dp={d['dp']} tp={d['tp']} pp={d['pp']} cp={d['cp']} ep={d['ep']} sp={d['sp']} "
                             f"zero={d['zero']}")) for d in best]
    assert at == sorted(at) and len(best) == 3
    assert all(f"{d['step_time_s']:.3f}" in table for d in best)


def test_report_gpus_without_gpu_is_one_line(tmp_path, capsys):
    assert main(["report", "qwen3-0.6b", "--micro-batch", "1", "--seq", "512", "--gpus", "8",
                 "-o", str(tmp_path / "r.html")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--gpus needs --gpu" in err
    assert not list(tmp_path.iterdir())


def _timeline_points(svg_html: str) -> list[tuple[str, float]]:
    from html import unescape

    chart = svg_html[svg_html.index('id="chart-timeline"'):]
    chart = chart[:chart.index("</svg>")]
    return [(unescape(label), float(y)) for y, label in re.findall(r'data-y="([^"]+)" data-label="([^"]*)"', chart)]


def test_timeline_chart_is_the_calculators(html, capsys):
    """The memory section draws `trainmath memory --timeline --json` as an inline SVG line chart: one point per
    event in step order at the calculator's bytes (data-y is GiB exactly: · 2**30 gives the integer back), the
    peak marked at its event, the H100's capacity drawn."""
    import json

    capsys.readouterr()
    assert main(["memory", *ARGS[:13], "--timeline", "--json"]) == 0
    events = json.loads(capsys.readouterr().out)
    points = _timeline_points(html)
    assert [name for name, _ in points] == [e["event"] for e in events]
    assert [y * 2**30 for _, y in points] == [e["bytes"] for e in events]
    peak = max(events, key=lambda e: e["bytes"])
    section = html[html.index('<section id="memory">'):html.index('<section id="layout">')]
    assert 'id="chart-timeline"' in section
    assert f"peak {peak['bytes'] / 2**30:.2f} GiB at {peak['event']}" in section
    assert 'class="capacity"' in section[section.index('id="chart-timeline"'):]


def test_report_with_gpus_shows_the_top_layouts_memory(tmp_path, capsys):
    """With --gpus the memory section is the planner's top layout (its layout, micro-batch, recompute, and the fit
    profile whose peak is the largest), not one GPU holding the whole model: the same peak the planner fitted."""
    import json

    job = ["--gpus", "8", "--gpu", "h100", "--seq", "2048", "--global-batch", "32"]
    assert main(["plan", "qwen3-8b", *job, "--top", "1", "--json"]) == 0
    top = json.loads(capsys.readouterr().out)["layouts"][0]
    out = tmp_path / "r.html"
    assert main(["report", "qwen3-8b", "--micro-batch", "1", *job, "-o", str(out)]) == 0
    page = out.read_text()
    memory = page[page.index('id="memory"'):page.index("</section>", page.index('id="memory"'))]
    assert f"micro-batch {top['micro_batch']} " in memory
    assert f"recompute {top['recompute']}" in memory
    assert f"{top['peak_bytes']:,}" in memory


def test_offload_host_ram_and_verdict(tmp_path):
    """--offload adds the host RAM per node (the calculator's ``host_bytes``) and the host to the verdict."""
    from trainmath.memory.host import job_host_memory

    out = tmp_path / "h.html"
    args = ["meta-llama/Llama-3.1-8B", "--micro-batch", "1", "--seq", "2048", "--dp", "8", "--zero", "3",
            "--offload", "optimizer", "--gpu", "h100"]
    assert main(["report", *args, "--host-memory", "100GiB", "-o", str(out)]) == 0
    page = out.read_text()
    host = job_host_memory(load_spec("meta-llama/Llama-3.1-8B"),
                           TrainingSetup(micro_batch=1, seq=2048, offload="optimizer"), ParallelLayout(dp=8, zero=3),
                           gpus_per_node=gpu("h100").gpus_per_node)
    assert _data_bytes(page, "host-bytes") == host.host_bytes > 100 * 2**30
    assert 'class="verdict nofit"' in page and "host RAM exceeded" in page
    assert main(["report", *args, "-o", str(out)]) == 0  # the default 2 TiB holds it
    assert 'class="verdict fits"' in out.read_text()
