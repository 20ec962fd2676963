"""The parameter-share plot: written whole, one bar per model; bad output paths are one line."""

import pytest

pytest.importorskip("matplotlib")

from trainmath.cli import main  # noqa: E402


def test_plot_writes_png(tmp_path, capsys):
    out = tmp_path / "shares.png"
    assert main(["plot", "Qwen/Qwen3-0.6B", "qwen3-235b-a22b", "-o", str(out)]) == 0
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert not list(tmp_path.glob("*.part"))


@pytest.mark.parametrize("name", ["shares.txt", "missing-dir/shares.png"])
def test_plot_bad_output(tmp_path, capsys, name):
    assert main(["plot", "Qwen/Qwen3-0.6B", "-o", str(tmp_path / name)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("trainmath: error:")


def test_plot_bad_model_writes_nothing(tmp_path, capsys):
    out = tmp_path / "x.png"
    assert main(["plot", "Qwen/Qwen3-0.6B", "no-such-model", "-o", str(out)]) == 2
    assert not out.exists()
