"""Load the runs of ``published_runs_more.json`` and predict each with the current step-time model.

Shared by tests/perf/test_published_more.py and ``benchmarks/plan_oracles.py --more``. These runs check the model,
they do not calibrate it: no tolerance is asserted on them here.
"""

from __future__ import annotations

import json
import pathlib
from functools import lru_cache

from trainmath.errors import TrainmathError
from trainmath.families import spec_from_config
from trainmath.hardware import Hardware, presets
from trainmath.layout import ParallelLayout
from trainmath.perf import Job, estimate
from trainmath.sources import load_spec

DATA = json.loads((pathlib.Path(__file__).with_name("published_runs_more.json")).read_text())
RUNS = DATA["runs"]
BY_ID = {r["id"]: r for r in RUNS}


@lru_cache(maxsize=None)
def spec(run_id: str):
    """The run's model: a catalog name or an inline config dict."""
    run = BY_ID[run_id]
    if "catalog" in run:
        return load_spec(run["catalog"])
    return spec_from_config(dict(run["model"]), name=run["id"], source=run["source"])


def gpus(run: dict) -> int:
    lay = run["layout"]
    return lay["dp"] * lay["tp"] * lay["pp"] * lay.get("cp", 1)


def job_fields(run: dict) -> dict:
    """The run's ``job`` as ``Job`` keywords (JSON lists as tuples)."""
    return {k: tuple(v) if isinstance(v, list) else v for k, v in run["job"].items()}


def estimate_run(run: dict, hardware: Hardware | None = None):
    """(the step-time estimate of ``run``, the job it priced): uneven pipeline stages where the layers do not
    divide, no memory model (the runs did fit); raises TrainmathError when the model cannot price the run."""
    hw = hardware or presets()
    job = job_fields(run)
    uneven = job.get("virtual_stages", 1) * run["layout"]["pp"]
    if len(spec(run["id"]).layers) % uneven:
        job["uneven_stages"] = True
    est = estimate(spec(run["id"]), ParallelLayout(**run["layout"]), Job(**job), run_gpu(run, hw),
                   hardware=hw, memory=False)
    return est, job


def run_gpu(run: dict, hw: Hardware):
    """The run's GPU preset with the scale-out network its source states (``network``: NICs per GPU and their
    Gb/s) where it differs from the preset's reference node."""
    from dataclasses import replace

    gpu = hw.gpu(run["gpu"])
    return replace(gpu, **run["network"]) if "network" in run else gpu


def metric(run: dict, est) -> float:
    """The estimate's figure for ``run``'s metric: tokens/s per GPU, seconds per step or TFLOP/s per GPU."""
    if run["metric"] in ("step_time_s", "tflops_per_gpu", "hardware_tflops_per_gpu"):
        return getattr(est, run["metric"])
    if run["metric"] != "tokens_per_s_per_gpu":
        raise TrainmathError(f"unknown metric {run['metric']!r}")
    return est.tokens_per_s / gpus(run)


def speed(run: dict, est) -> float:
    """Predicted / published throughput (a step time is inverted first)."""
    if run["metric"] == "step_time_s":
        return run["published"] / est.step_time_s
    return metric(run, est) / run["published"]


def predict(run: dict, hardware: Hardware | None = None) -> float:
    """The model's figure for ``run``'s metric; raises TrainmathError when the model cannot price the run."""
    return metric(run, estimate_run(run, hardware)[0])


def try_predict(run: dict) -> tuple[float | None, str]:
    """(prediction, "") or (None, the reason the model cannot price the run)."""
    try:
        return predict(run), ""
    except TrainmathError as exc:
        return None, str(exc)


def memory_check(run: dict, hardware: Hardware | None = None) -> dict:
    """The run's stated layout through the memory model (its job's profile, ``megatron`` unless it says): the
    predicted peak, the usable bytes of the fit rule on the GPUs it ran on (``gpu_memory_gib`` where the source's
    differ from the preset), the verdict, and the memory the source reports (``published_memory_gib``, or None)."""
    from dataclasses import replace

    from trainmath.usable import usable_bytes

    hw = hardware or presets()
    job = job_fields(run)
    if len(spec(run["id"]).layers) % (job.get("virtual_stages", 1) * run["layout"]["pp"]):
        job["uneven_stages"] = True
    gpu = run_gpu(run, hw)
    if "gpu_memory_gib" in run:
        gpu = replace(gpu, memory_bytes=int(run["gpu_memory_gib"] * 2**30))
    j = Job(**job)
    est = estimate(spec(run["id"]), ParallelLayout(**run["layout"]), j, gpu, hardware=hw)
    usable = usable_bytes(gpu.memory_bytes, j.mem_util_percent)
    return {"peak_gib": est.peak_bytes / 2**30, "usable_gib": usable / 2**30, "fits": est.fits,
            "memory_gib": gpu.memory_bytes / 2**30, "published_gib": run.get("published_memory_gib"),
            "profile": j.profile}


MEMORY_MISSES = {
    # run-id pattern → why the memory model judges that stated layout not to fit (it ran): what is not on record
    r"megatron-bridge-25.11-h100-gpt-oss-120b-bf16-64gpus":
        "29.3 GiB over (39% of the usable bytes): the row's micro-batch 4 at pp 4 (its GBS 512 over dp 16 contradicts "
        "its own GA 2: 'inconsistent') is in no stored version of the GPT-OSS preset file: the first ones "
        "(workload_base_configs.py 0fa501a, the first gpt_oss_workload_base_configs.py) make every 120B preset ep 8, "
        "micro_batch_size 8, no pipeline, no recompute; the later ones and V1/V2 (07eea52) set H100 pp 4 at "
        "micro_batch_size 1 with recompute_modules [layernorm, moe_act]; the page's commit of the file is not stored. "
        "At the stored preset's micro-batch 1 the layout fits (54 of 76 GiB), as the 26.02 H100 row (micro-batch 1) "
        "does; the recipes' fused loss (recorded) leaves the peak at 105.0 GiB (a first pipeline stage's)",
}


def memory_miss_reason(run_id: str) -> str | None:
    """Why the memory model misses ``run_id``'s fit, or None when no reason is on record."""
    import re

    for pattern, why in MEMORY_MISSES.items():
        if re.fullmatch(pattern, run_id):
            return why
    return None
