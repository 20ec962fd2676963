"""Every `trainmath plot` kind renders a real PNG (size, dimensions, not blank), with a legend whose entries are
the chart's series, no two texts overlapping, and numbers equal to the calculator's."""

import json
import math

import pytest

pytest.importorskip("matplotlib")

from PIL import Image  # noqa: E402  (matplotlib depends on pillow)

import vizdata  # noqa: E402
from trainmath.cli import build_parser, main  # noqa: E402
from trainmath.plot import mpl  # noqa: E402
from trainmath.plot.charts import GIB, BarChart, params_chart  # noqa: E402
from trainmath.plot.palette import colour  # noqa: E402

MEM = ["--micro-batch", "1", "--seq", "2048"]
PLAN_JOB = ["qwen3-1.7b", "--gpus", "8", "--gpu", "rtx4090", "--seq", "4096", "--global-batch", "32", "--top", "8"]
"""A job some of whose candidates the memory model rejects after they were estimated (drawn as 'does not fit')."""


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    d = tmp_path_factory.mktemp("json")
    for name, doc in (("comm", vizdata.comm_rows()), ("timeline", vizdata.timeline()), ("plan", vizdata.plan())):
        (d / f"{name}.json").write_text(json.dumps(doc))
    return d


def kinds(files):
    return {
        "params": ["params", "qwen3-0.6b", "qwen3-8b", "qwen3-32b"],
        "params-activated": ["params", "qwen3-30b-a3b", "qwen3-235b-a22b", "--activated"],
        "legacy": ["qwen3-0.6b", "qwen3-1.7b"],
        "params-many": ["params", "qwen3-next-80b-a3b-thinking", "nemotron-h-56b-base-8k", "deepseek-v3",
                        "gpt-oss-120b", "llama-4-scout-17b-16e-instruct", "gemma-3-1b-it", "phi-4-mini-instruct",
                        "mixtral-8x22b-v0.1", "--activated"],
        "memory": ["memory", "qwen3-0.6b", *MEM, "--gpu", "h100"],
        "memory-zero": ["memory", "qwen3-0.6b", *MEM, "--dp", "8", "--compare", "zero"],
        "memory-layouts": ["memory", "qwen3-30b-a3b", *MEM, "--gpu", "h200", "--layout", "dp=8,zero=1",
                           "--layout", "dp=8,ep=8,zero=3", "--layout", "dp=16,ep=8,zero=3"],
        "comm": ["comm", str(files / "comm.json")],
        "timeline": ["timeline", str(files / "timeline.json")],
        "plan": ["plan", str(files / "plan.json")],
        "plan-model": ["plan", *PLAN_JOB],
    }


KINDS = ["params", "params-activated", "legacy", "params-many", "memory", "memory-zero", "memory-layouts", "comm",
         "timeline", "plan", "plan-model"]


def _charts(argv):
    from trainmath.cli.plot import charts

    args = build_parser("plot").parse_args(["plot", *argv, "-o", "unused.png"])
    return charts(args)


@pytest.mark.parametrize("kind", KINDS)
def test_png_is_a_real_picture(kind, files, tmp_path, capsys):
    out = tmp_path / f"{kind}.png"
    assert main(["plot", *kinds(files)[kind], "-o", str(out)]) == 0
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert out.stat().st_size > 20_000
    img = Image.open(out).convert("L")
    w, h = img.size
    assert 700 <= w <= 2200 and 500 <= h <= 800
    px = list(img.get_flattened_data() if hasattr(img, "get_flattened_data") else img.getdata())
    mean = sum(px) / len(px)
    std = math.sqrt(sum((p - mean) ** 2 for p in px) / len(px))
    assert std > 25, "blank or nearly uniform image"
    assert sum(p < 128 for p in px) / len(px) > 0.01  # ink: bars, lines, text
    assert not list(tmp_path.glob("*.part"))


def _overlap(a, b, renderer) -> bool:
    """Whether two drawn texts overlap. Two labels slanted by the same angle (tick labels) are parallel strips:
    they overlap when their anchors are closer, across the slant, than a line of text is high (their upright
    bounding boxes overlap long before the glyphs do). Otherwise: their bounding boxes."""
    ra, rb = a.get_rotation() % 180, b.get_rotation() % 180
    if ra and ra == rb:
        (xa, ya), (xb, yb) = (t.get_transform().transform(t.get_position()) for t in (a, b))
        across = abs((xb - xa) * math.sin(math.radians(ra)) - (yb - ya) * math.cos(math.radians(ra)))
        return across < a.get_fontsize() * renderer.points_to_pixels(1.0)
    return a.get_window_extent(renderer).overlaps(b.get_window_extent(renderer))


@pytest.mark.parametrize("kind", KINDS)
def test_legend_lists_the_series_and_no_text_overlaps(kind, files):
    charts = _charts(kinds(files)[kind])
    fig = mpl.figure(charts)
    try:
        for ax, c in zip(fig.axes, charts):
            legend = ax.get_legend()
            assert legend is not None
            names = {t.get_text() for t in legend.get_texts()}
            if isinstance(c, BarChart):
                assert {s.name for s in c.stacks} <= names
                if c.hline:
                    assert c.hline[0] in names
            elif hasattr(c, "lines"):
                assert {ln.name for ln in c.lines} <= names
            else:
                assert {g.name for g in c.groups} <= names
        fig.canvas.draw()
        renderer = fig.canvas.get_renderer()
        from matplotlib.text import Text

        hidden = set()  # tick labels of ticks outside the view: matplotlib keeps them but does not draw them
        for ax in fig.axes:
            for axis in (ax.xaxis, ax.yaxis):
                lo, hi = sorted(axis.get_view_interval())
                hidden |= {id(t.label1) for t in axis.get_major_ticks() if not lo <= t.get_loc() <= hi}
        texts = [t for t in fig.findobj(Text) if t.get_visible() and t.get_text().strip() and t.get_figure()
                 and id(t) not in hidden]
        for i, a in enumerate(texts):
            for b in texts[i + 1:]:
                assert not _overlap(a, b, renderer), f"{a.get_text()!r} overlaps {b.get_text()!r}"
    finally:
        import matplotlib.pyplot as plt

        plt.close(fig)


def test_params_chart_numbers_are_the_ledger():
    from trainmath.params import count_params
    from trainmath.sources import load_spec

    r = count_params(load_spec("Qwen/Qwen3-235B-A22B"))
    c = params_chart([r], activated=True)
    assert c.bars == ("Qwen3-235B-A22B total", "Qwen3-235B-A22B activated")
    for i in range(2):
        assert sum(s.values[i] for s in c.stacks) == pytest.approx(100.0)
    moe = next(s for s in c.stacks if s.name == "MoE")
    comps = r.activated.flat()
    exact = comps["experts"] + comps["shared_experts"] + comps["router"]
    assert moe.values[1] == pytest.approx(100 * exact / 22_190_763_520)
    assert c.totals == ("235.09B", "22.19B")


def test_memory_chart_totals_are_training_memory():
    from trainmath.layout import ParallelLayout
    from trainmath.memory.training import TrainingSetup, training_memory
    from trainmath.sources import load_spec

    (c,) = _charts(["memory", "qwen3-0.6b", *MEM, "--gpu", "h100"])
    spec = load_spec("qwen3-0.6b")
    assert len(c.bars) == 3  # the hf profile folds selective recompute for Qwen3 too
    for bar, r in zip(c.bars, ("none", "selective", "full")):
        peak = training_memory(spec, TrainingSetup(micro_batch=1, seq=2048, recompute=r), ParallelLayout()).peak_bytes
        i = c.bars.index(bar)
        assert bar.startswith(f"recompute {r}")
        assert sum(s.values[i] for s in c.stacks) == pytest.approx(peak / GIB, rel=1e-12)
    assert c.hline[1] == 80.0
    assert not any("selective: not shown" in n for n in c.notes)


def test_comm_predicted_busbw_is_the_model():
    from trainmath.plot.fromjson import comm_chart

    rows = vizdata.comm_rows()
    chart = comm_chart(rows)
    pred = next(ln for ln in chart.lines if ln.name == "all_reduce ring (4 ranks) predicted")
    r = next(r for r in rows if r["impl"] == "ring" and r["size_bytes"] == 2**20)
    assert pred.ys[pred.xs.index(2**20)] == pytest.approx(1.5 * 2**20 / r["predicted_time_s"] / 1e9)


def test_timeline_marks_the_peak():
    from trainmath.plot.fromjson import timeline_chart

    doc = vizdata.timeline()
    c = timeline_chart(doc)
    peak = max(e["bytes"] for e in doc["timeline"])
    assert c.marks[0][1] == peak / GIB and doc["peak_event"] in c.marks[0][2]
    assert c.hline[1] == 80.0
    assert [b[2] for b in c.bands] == ["other", "forward", "loss", "backward", "optimizer", "zero_grad"]


def test_same_component_same_colour_everywhere():
    from trainmath.plot.svg import bar_chart_svg

    (mem,) = _charts(["memory", "qwen3-0.6b", *MEM])
    (par,) = _charts(["params", "qwen3-0.6b"])
    for c in (mem, par):
        svg = bar_chart_svg(c)
        for s in c.stacks:
            assert s.colour == colour(s.name)
            assert f'fill="{s.colour}" stroke="#fff" stroke-width="0.8" data-series="{s.name}"' in svg
    fig = mpl.figure(par)
    from matplotlib.colors import to_rgba

    att = next(b for b in fig.axes[0].containers if b.get_label() == "Attention")
    assert att.patches[0].get_facecolor() == pytest.approx(to_rgba(colour("attention")))


@pytest.mark.parametrize("argv,needle", [
    (["plot", "comm", "missing.json"], "cannot read missing.json"),
    (["plot", "plan", "BAD"], "is not JSON"),
    (["plot", "plan", "qwen3-0.6b", "--gpus", "8"], "plot plan MODEL needs --gpu, --seq, --global-batch"),
    (["plot", "plan", "qwen3-0.6b", *PLAN_JOB[1:-2], "--top", "0"],
     "argument --top: must be an integer in 1..10,000, got '0'"),
    (["plot", "timeline", "EMPTY"], "timeline: expected a non-empty list"),
    (["plot", "memory", "qwen3-0.6b", "--micro-batch", "0", "--seq", "8"], "micro-batch must be a positive"),
    (["plot", "memory", "qwen3-0.6b", *MEM, "--layout", "dp=8,tq=2"], "'tq=2' is not KEY=INTEGER"),
    (["plot", "memory", "qwen3-0.6b", *MEM, "--layout", "dp=0"], "dp must be a positive integer, got 0"),
])
def test_bad_input_is_one_line(argv, needle, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "BAD").write_text("{not json")
    (tmp_path / "EMPTY").write_text("[]")
    assert main([*argv, "-o", "x.png"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and needle in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["BAD", "EMPTY"]  # no x.png, no .part


def test_output_onto_a_directory_is_one_line_and_leaves_nothing(tmp_path, capsys):
    target = tmp_path / "chart.png"
    target.mkdir()
    assert main(["plot", "params", "qwen3-0.6b", "-o", str(target)]) == 2
    assert capsys.readouterr().err.count("\n") == 1
    assert [p.name for p in tmp_path.iterdir()] == ["chart.png"] and target.is_dir()


@pytest.mark.parametrize("suffix,magic", [(".svg", b"<?xml"), (".pdf", b"%PDF-")])
def test_svg_and_pdf_by_suffix(suffix, magic, tmp_path, capsys):
    out = tmp_path / f"chart{suffix}"
    assert main(["plot", "params", "qwen3-0.6b", "-o", str(out)]) == 0
    data = out.read_bytes()
    assert data.startswith(magic) and len(data) > 5_000
    if suffix == ".svg":
        assert b"Embedding" in data and b"Where the parameters live" in data


@pytest.mark.parametrize("argv", [["plot", "params", "qwen3-0.6b"],
                                  ["report", "qwen3-0.6b", "--micro-batch", "1", "--seq", "64"]])
def test_unwritable_directory_is_one_line(argv, capsys):
    """/sys refuses new files even to root (a chmod'ed directory would not stop a root test run)."""
    import os

    if not os.path.isdir("/sys"):
        pytest.skip("needs Linux /sys")
    suffix = ".html" if argv[0] == "report" else ".png"
    assert main([*argv, "-o", f"/sys/trainmath-test{suffix}"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("trainmath: error: cannot write /sys/trainmath-test")


def _points(chart) -> dict:
    return {g.name: sorted(zip(g.xs, g.ys)) for g in chart.groups}


def test_plot_plan_reads_what_plan_json_prints_and_model_form_draws_the_same(tmp_path, capsys):
    """`plan --json --explain` → file → `plot plan FILE` draws exactly the planner's layouts (the keys the plot
    reads are the ones plan prints); `plot plan MODEL [plan flags]` runs the same planner and draws the same."""
    assert main(["plan", *PLAN_JOB, "--json", "--explain"]) == 0
    doc = json.loads(capsys.readouterr().out)
    (tmp_path / "plan.json").write_text(json.dumps(doc))
    from_file = _charts(["plan", str(tmp_path / "plan.json"), "--highlight", "3"])
    from_model = _charts(["plan", *PLAN_JOB, "--highlight", "3"])
    assert _points(from_file[0]) == _points(from_model[0])
    assert from_file[1].bars == from_model[1].bars
    pts = _points(from_file[0])
    best = [(d["step_time_s"], d["peak_bytes"] / GIB) for d in doc["layouts"]]
    assert pts["best 3 (ranked by step time)"] == sorted(best[:3])
    assert pts["other candidates: fits"] == sorted(best[3:])
    over = [(r["step_time_s"], r["peak_bytes"] / GIB) for r in doc["rejected_list"] if r["step_time_s"] is not None]
    assert over and pts["other candidates: does not fit"] == sorted(over)
    assert all(y > doc["usable_bytes"] / GIB for _, y in over)  # each really missed the memory
    bars = from_file[1]
    assert [float(sum(s.values[i] for s in bars.stacks)) for i in range(3)] == \
        pytest.approx([d["step_time_s"] for d in doc["layouts"][:3]])
