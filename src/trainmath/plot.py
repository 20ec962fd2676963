"""Where the parameters live: a stacked bar per model of its components' shares (the seed's visualisation,
first article), drawn with matplotlib (an optional extra: ``pip install "trainmath[plot]"``).

Impure edge: it writes a file. The numbers come from ``count_params``; nothing is computed here.
"""

from __future__ import annotations

from pathlib import Path

from trainmath.errors import TrainmathError
from trainmath.params import ParamReport

# The seed groups components into four bars; we keep every component but order them the same way.
ORDER = ("embed_tokens", "pos_embed", "lm_head", "attention", "linear_attention", "mamba", "mlp_dense", "experts",
         "shared_experts", "router", "norms")


def plot_components(reports: list[ParamReport], output: str | Path, *, activated: bool = False) -> Path:
    """Write a PNG/SVG/PDF (by suffix) with one stacked bar per model: each component's share of the total
    (or of the activated count), labelled with the absolute count."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise TrainmathError('plotting needs matplotlib: pip install "trainmath[plot]"') from None
    output = Path(output)
    if output.suffix.lower() not in (".png", ".svg", ".pdf"):
        raise TrainmathError(f"--output must end in .png, .svg or .pdf, got {output.name!r}")
    if output.is_dir():
        raise TrainmathError(f"--output {output} is a directory; give a file name such as {output / 'params.png'}")
    if not output.parent.is_dir():
        raise TrainmathError(f"directory {output.parent} does not exist")
    names = [r.model.split("/")[-1] for r in reports]
    fig, ax = plt.subplots(figsize=(max(6, 1.1 * len(reports) + 3), 5))
    bottoms = [0.0] * len(reports)
    for comp in ORDER:
        vals = [(r.activated if activated else r.components).child(comp).value for r in reports]
        totals = [r.activated_params if activated else r.total_params for r in reports]
        if not any(vals):
            continue
        shares = [100 * v / t for v, t in zip(vals, totals)]
        ax.bar(names, shares, bottom=bottoms, label=comp)
        bottoms = [b + s for b, s in zip(bottoms, shares)]
    ax.set_ylabel(f"share of {'activated' if activated else 'total'} parameters (%)")
    ax.set_title("Where the parameters live" + (" (activated per token)" if activated else ""))
    ax.set_ylim(0, 100)
    ax.legend(loc="center left", bbox_to_anchor=(1.0, 0.5), fontsize=8)
    ax.tick_params(axis="x", rotation=30)
    fig.tight_layout()
    _save_atomically(fig, output)
    plt.close(fig)
    return output


def _save_atomically(fig, output: Path) -> None:
    """Write to a unique temporary file beside ``output``, then rename it over ``output``: a reader sees the old
    file or the whole new one, and a failure (unwritable directory, full disk) leaves nothing behind."""
    import os
    import tempfile

    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{output.name}.", suffix=".part", dir=output.parent)
    except OSError as e:
        raise TrainmathError(f"cannot write {output}: {e.strerror or e}") from None
    try:
        with os.fdopen(fd, "wb") as f:
            fig.savefig(f, format=output.suffix[1:].lower(), dpi=120)
        os.chmod(tmp, 0o644)
        os.replace(tmp, output)
    except OSError as e:
        os.unlink(tmp)
        raise TrainmathError(f"cannot write {output}: {e.strerror or e}") from None
    except BaseException:
        os.unlink(tmp)
        raise
