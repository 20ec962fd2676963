"""Fine-tune step time: ``trainmath estimate --peft`` against published LoRA / QLoRA throughputs.

Each run of tests/perf/published_peft.json (source, setup and assumptions there) is estimated with its argv and
printed beside its published tokens/s. Out of sample: the efficiency curves are per GPU generation, fitted to
pretraining runs, and nothing here is fitted. Usage: ``python benchmarks/peft_speed.py`` (a few seconds, CPU).
"""

from __future__ import annotations

import json
import pathlib
import sys

ROOT = pathlib.Path(__file__).resolve().parents[1]
RUNS = ROOT / "tests" / "perf" / "published_peft.json"


def predict(run: dict, **changes: str) -> dict:
    """The estimate of one run (``trainmath estimate --json``'s object); ``changes``: flags replaced
    (``recompute="none"``)."""
    import contextlib
    import io

    from trainmath.cli import main

    argv = list(run["argv"])
    for flag, value in changes.items():
        argv[argv.index("--" + flag.replace("_", "-")) + 1] = value
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        code = main(["estimate", run["model"], "--gpu", run["gpu"], *argv, "--json"])
    if code != 0:
        raise SystemExit(f"{run['id']}: estimate failed ({code})")
    return json.loads(out.getvalue())


def main() -> int:
    runs = json.loads(RUNS.read_text())["runs"]
    print(f"{'run':<36} {'published':>10} {'predicted':>10} {'pred/pub':>9} {'MFU':>6} {'peak GiB':>9} "
          f"{'no recompute':>13} {'pred/pub':>9}")
    for run in runs:
        est, bare = predict(run), predict(run, recompute="none")
        got, alt = est[run["metric"]], bare[run["metric"]]
        print(f"{run['id']:<36} {run['published']:>10,.0f} {got:>10,.0f} {got / run['published']:>9.3f} "
              f"{100 * est['mfu']:>5.1f}% {est['peak_bytes'] / 2**30:>9.2f} {alt:>13,.0f} "
              f"{alt / run['published']:>9.3f}")
    print("metric: tokens/s of the whole job; MFU over the fine-tune's executed FLOPs (flops --peft); peak: memory "
          "--peft (hf profile), not the publisher's; 'no recompute': the same run with --recompute none (the source "
          "states compile, batch and packing, not checkpointing)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
