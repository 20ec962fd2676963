"""Everything the report and the web page show, computed once from a model and a setup. Pure: it calls the
calculator and returns values (no printing, no files, no matplotlib), so ``report``, ``serve`` and
``plot memory`` share it.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from trainmath.errors import TrainmathError
from trainmath.memory.host import HOST_MEMORY_BYTES
from trainmath.plot.charts import peak_phase
from trainmath.usable import MEM_UTIL_PERCENT, rule_text, usable_bytes
from trainmath.vocabulary import MEMORY_ATTENTION, RECOMPUTE, STEP_ATTENTION, attention_as

COMPARE = ("recompute", "zero", "none")


@dataclass(frozen=True, kw_only=True)
class ReportData:
    spec: object
    params: object
    """``ParamReport``."""
    flops: object
    """``FlopsReport`` of one micro-batch (batch = micro-batch, the whole model: no division by TP/PP)."""
    closed: object
    memory: object
    """``MemoryReport`` of the chosen setup and layout."""
    variants: tuple
    """(label, MemoryReport or the reason it cannot be built), one per recompute setting."""
    gpu: object
    """``GPU`` preset or None."""
    serving: object
    """``InferenceReport`` of the serving setup (KV cache and fit on ``gpu``)."""
    plan: object = None
    """``PlanResult`` of ``trainmath plan`` for the job (when the GPU count was given), or None."""
    mem_util_percent: int = MEM_UTIL_PERCENT
    """``--mem-util``: the fit rule's usable share (``trainmath.usable``)."""
    host: object = None
    """``memory.host.HostMemory`` of an offloaded job (host RAM per node), or None without offload."""
    host_memory_bytes: int = HOST_MEMORY_BYTES
    """``--host-memory``: host RAM per node the verdict checks ``host`` against."""
    speed: object = None
    """``infer.speed.FixedBatch`` of the serving setup on ``gpu`` (a prompt of its context, then
    ``serve_output`` tokens), or None without a GPU."""
    adapters: object = None
    """``adapters.AdapterReport`` of a fine-tuning job (``--peft lora|qlora``), or None: full training."""
    peft_note: str = ""
    """What the memory and FLOPs shown for a fine-tuning job are (``report.peft.fine_tune_setup``)."""

    @property
    def fit(self) -> dict | None:
        """Training fit verdict on the GPU under the one fit rule (``trainmath.usable``)."""
        if self.gpu is None:
            return None
        usable = usable_bytes(self.gpu.memory_bytes, self.mem_util_percent)
        margin = usable - self.memory.peak_bytes
        out = {"gpu": self.gpu.name, "memory_bytes": self.gpu.memory_bytes, "usable_bytes": usable,
               "mem_util_percent": self.mem_util_percent, "fit_rule": rule_text(self.gpu.memory_bytes,
                                                                                 self.mem_util_percent),
               "fits": margin >= 0, "gpu_fits": margin >= 0, "margin_bytes": margin}
        if self.host is not None:
            from trainmath.memory.host import HostFit

            h = HostFit(host_bytes=self.host.host_bytes, host_memory_bytes=self.host_memory_bytes)
            out.update(h.to_dict(), host_bytes=h.host_bytes, fits=margin >= 0 and h.fits)
        return out


LAYOUT_KEYS = ("dp", "tp", "pp", "cp", "ep", "zero", "sp")


def parse_layout(text: str, base):
    """'dp=8,tp=2,zero=3' → ``base`` (a ParallelLayout) with those degrees replaced; ``sp=1`` turns SP on."""
    changes = {}
    for item in filter(None, (x.strip() for x in text.split(","))):
        key, eq, value = item.partition("=")
        if key not in LAYOUT_KEYS or not eq or not value.strip().isdigit() or int(value[:41]) > 2**40:
            raise TrainmathError(f"layout {text!r}: {item!r} is not KEY=INTEGER (at most 2**40) with KEY one of "
                                 f"{', '.join(LAYOUT_KEYS)} (e.g. dp=8,tp=2,zero=3)")
        changes[key] = bool(int(value)) if key == "sp" else int(value)
    if not changes:
        raise TrainmathError(f"layout {text!r} names no degree (e.g. dp=8,tp=2,zero=3)")
    return replace(base, **changes)


def memory_variants(spec, setup, layout, compare: str = "recompute", layouts: tuple[str, ...] = ()) -> tuple:
    """The setup's memory under each recompute setting (``compare="recompute"``), each ZeRO stage
    (``"zero"``), the setup alone (``"none"``), or — when ``layouts`` are given ('dp=8,zero=3', ...) — each of
    those layouts: (label, MemoryReport or error text) pairs."""
    from trainmath.layout import layout_problems
    from trainmath.memory.training import training_memory

    if compare not in COMPARE:
        raise TrainmathError(f"--compare must be one of {', '.join(COMPARE)}, got {compare!r}")
    if layouts:
        cases = []
        for text in layouts:
            lay = parse_layout(text, layout)
            bad = layout_problems(lay)
            if bad:
                raise TrainmathError(f"layout {text!r}: {'; '.join(bad)}")
            cases.append((text, setup, lay))
    elif compare == "recompute":
        cases = [(f"recompute {r}", setup if r == setup.recompute else replace(setup, recompute=r), layout)
                 for r in RECOMPUTE]
    elif compare == "zero":
        cases = [(f"ZeRO-{z}", setup, replace(layout, zero=z)) for z in range(4)]
    else:
        cases = [(f"{layout.describe()}, recompute {setup.recompute}", setup, layout)]
    out = []
    for label, s, lay in cases:
        try:
            out.append((label, training_memory(spec, s, lay)))
        except TrainmathError as e:
            out.append((label, str(e)))
    return tuple(out)


def plan_for(spec, setup, *, gpus: int, gpu, global_batch: int | None = None, top: int = 3,
             mem_util_percent: int = MEM_UTIL_PERCENT, peft=None):
    """The planner's best layouts (``trainmath plan``) of ``spec`` on ``gpus`` × ``gpu`` for the setup's sequence,
    precision and optimizer; global batch defaults to micro-batch × GPUs. The planner's own model: megatron
    activation profile, flash attention unless the setup says eager; a fine-tune (``peft``, an
    ``adapters.PeftJob``) is planned as ``trainmath plan --peft`` (``plan.peft``, the hf profile)."""
    from trainmath.perf import Job
    from trainmath.plan import plan

    if gpu is None:
        raise TrainmathError("--gpus needs --gpu (the planner fits layouts to a GPU's memory)")
    if not isinstance(gpus, int) or gpus < 1:
        raise TrainmathError(f"--gpus must be a positive integer, got {gpus!r}")
    batch = global_batch if global_batch is not None else setup.micro_batch * gpus
    if not isinstance(batch, int) or batch < 1:
        raise TrainmathError(f"--global-batch must be a positive integer, got {batch!r}")
    job = Job(global_batch=batch, seq=setup.seq, precision=setup.precision, optimizer=setup.optimizer,
              attention=attention_as(setup.attention, STEP_ATTENTION), profile="megatron",
              mem_util_percent=mem_util_percent)
    if peft is not None and peft.enabled:
        from trainmath.memory.peft import PeftRun
        from trainmath.perf.peft import job_peft_problems

        job = replace(job, profile="hf", peft=PeftRun(job=peft))
        bad = job_peft_problems(job)
        if bad:
            raise TrainmathError("; ".join(bad))
    return plan(spec, gpus=gpus, gpu=gpu, job=job, top=top)


def planned_setup(setup, top):
    """(setup, layout) of the planner's top layout ``top`` (an ``Estimate``): its layout, micro-batch, micro-batches,
    recompute and activation profile, as ``perf.step.memory_peak_bytes`` builds them; the rest of ``setup`` kept."""
    from dataclasses import replace

    from trainmath.perf.step import memory_recompute

    job = top.job
    return replace(setup, micro_batch=job.micro_batch, recompute=memory_recompute(job), profile=job.profile,
                   attention=attention_as(job.attention, MEMORY_ATTENTION),
                   micro_batches=top.micro_batches), top.layout


def gather(spec, setup, layout, *, gpu=None, serving=None, plan=None,
           mem_util_percent: int = MEM_UTIL_PERCENT, serve_output: int = 128,
           host_memory_bytes: int = HOST_MEMORY_BYTES, peft=None) -> ReportData:
    """Parameters, FLOPs, memory (the setup and its recompute variants), and serving memory of ``spec``; with a
    fine-tuning job (``adapters.PeftJob``), its adapters."""
    from dataclasses import replace

    from trainmath.flops import closed_form_flops, count_flops
    from trainmath.infer import InferenceSetup, infer_memory
    from trainmath.memory.training import training_memory
    from trainmath.params import count_params

    if plan is not None and plan.layouts:  # the page shows the layout the planner chose, under the profile whose
        # peak it fitted (the largest of its fit profiles)
        setup, layout = planned_setup(setup, plan.layouts[0])
        setup = max((replace(setup, profile=p) for p in plan.fit_profiles),
                    key=lambda s: training_memory(spec, s, layout).peak_bytes)
    params = count_params(spec)
    adapters, peft_note, flops = None, "", None
    if peft is not None and peft.enabled:
        from trainmath.adapters import adapter_report
        from trainmath.report.peft import fine_tune_setup

        adapters = adapter_report(spec, peft, params.total_params)
        setup, flops, peft_note = fine_tune_setup(spec, setup, layout, peft)
    memory = training_memory(spec, setup, layout)  # the chosen setup must work: its error is the answer
    from trainmath.memory.host import check_host_memory, job_host_memory

    host = job_host_memory(spec, setup, layout, gpus_per_node=gpu.gpus_per_node if gpu is not None else None)
    serving = serving or InferenceSetup(batch=1, context=setup.seq, tp=layout.tp)
    return ReportData(
        spec=spec, params=params, adapters=adapters, peft_note=peft_note,
        flops=flops or count_flops(spec, batch=setup.micro_batch, seq=setup.seq, recompute=setup.recompute),
        closed=closed_form_flops(spec, batch=setup.micro_batch, seq=setup.seq),
        memory=memory, variants=memory_variants(spec, setup, layout, "recompute"), gpu=gpu,
        serving=infer_memory(spec, serving, gpu=gpu, mem_util_percent=mem_util_percent), plan=plan,
        mem_util_percent=mem_util_percent, host=host, host_memory_bytes=check_host_memory(host_memory_bytes),
        speed=None if gpu is None else serving_speed(spec, serving, gpu, serve_output),
    )


def serving_speed(spec, serving, gpu, output: int):
    """TTFT, TPOT and throughput of the serving setup on ``gpu`` (``trainmath infer --input --output``)."""
    from trainmath.infer.speed import fixed_batch

    if not isinstance(output, int) or output < 1:
        raise TrainmathError(f"serve-output must be a positive integer, got {output!r}")
    return fixed_batch(spec, serving, gpu, input=serving.context, output=output)


def timeline_doc(data: ReportData) -> dict:
    """What ``trainmath memory --json`` says of the step's timeline (the peak stage's events, in order), with the
    GPU's margin when one is given: the input of ``plot timeline``'s chart."""
    m = data.memory.to_dict()
    doc = {"model": m["model"], "timeline": m["timeline"], "peak_event": m["peak_event"]}
    if data.fit is not None:
        doc.update(fits=data.fit["fits"], margin_bytes=data.fit["margin_bytes"])
    return doc


def charts(data: ReportData) -> dict:
    """name → chart object (``trainmath.plot.charts``) of the report."""
    from trainmath.plot.charts import memory_chart, params_chart, serving_chart
    from trainmath.plot.fromjson import timeline_chart

    p = data.params
    return {
        "params": params_chart([p], activated=p.activated_params != p.total_params),
        "memory": memory_chart(data.variants, title=f"Training memory per GPU: {data.memory.layout.describe()}",
                               gpu=data.gpu),
        "timeline": timeline_chart(timeline_doc(data)),
        "serving": serving_chart(data.serving),
    }


def summary(data: ReportData) -> dict:
    """The headline numbers as exact integers (what the web page shows and a test compares with the CLI)."""
    from trainmath.report.peft import summary as peft_summary

    p, m, s = data.params, data.memory, data.serving
    return {
        "model": data.spec.name,
        "total_params": p.total_params, "activated_params": p.activated_params,
        "training_flops": data.flops.training.value, "tokens": data.flops.tokens,
        "peak_bytes": m.peak_bytes, "peak_phase": peak_phase(m),
        "breakdown": m.breakdown.flat(), "layout": m.layout.describe(),
        "fit": data.fit,
        "kv_cache_bytes": s.kv_cache_bytes, "serving_weights_bytes": s.weights_bytes,
        "serving_total_bytes": s.total_bytes, "kv_bytes_per_token": s.kv_bytes_per_token,
        "serving_fit": s.fit.to_dict() if s.fit is not None else None,
        "peft": peft_summary(data.adapters, data.peft_note),
        "serving_speed": None if data.speed is None else {
            k: v for k, v in data.speed.to_dict().items() if k in (
                "batch", "input", "output", "ttft_s", "tpot_s", "e2e_s", "output_tokens_per_s",
                "prefill_tokens_per_s", "ttft_bound", "tpot_bound")},
    }
