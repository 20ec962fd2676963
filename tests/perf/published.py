"""Load the published runs of ``published_runs.json`` as (spec, layout, job, gpu) and predict each.

Shared by the tests (tests/perf/test_published.py) and benchmarks/plan_oracles.py, which prints the table.
"""

from __future__ import annotations

import json
import pathlib
from functools import lru_cache

from trainmath.families import spec_from_config
from trainmath.hardware import Hardware, presets
from trainmath.layout import ParallelLayout
from trainmath.perf import Job, estimate
from trainmath.sources import load_spec

RUNS = json.loads((pathlib.Path(__file__).with_name("published_runs.json")).read_text())["runs"]


@lru_cache(maxsize=None)
def _spec(run_id: str):
    run = next(r for r in RUNS if r["id"] == run_id)
    if "catalog" in run:
        return load_spec(run["catalog"])
    return spec_from_config(dict(run["model"]), name=run["id"], source=run["source"])


def predict(run: dict, hardware: Hardware | None = None) -> float:
    """The model's figure for ``run``'s metric (no memory model: the papers' runs did fit)."""
    hw = hardware or presets()
    est = estimate(_spec(run["id"]), ParallelLayout(**run["layout"]), Job(**run["job"]), hw.gpu(run["gpu"]),
                   hardware=hw, memory=False)
    return getattr(est, run["metric"])
