"""``--peft none|lora|qlora`` on ``estimate`` and ``plan``: the flags (those of ``memory`` and ``flops``), the
fine-tune they make of a job, and what ``estimate`` prints of it."""

from __future__ import annotations

import argparse


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The fine-tuning flags (``adapters.add_peft_args``: --peft, --lora-rank, --lora-alpha, --lora-targets,
    --lora-dtype)."""
    from trainmath.adapters import add_peft_args

    add_peft_args(p)


def with_peft(spec, job, args: argparse.Namespace):
    """``job`` as the fine-tune the flags name (``Job.peft``; the hf activation profile unless --profile says
    otherwise), or as it is for full training; a flag that cannot apply raises one line."""
    from dataclasses import replace

    from trainmath.adapters import peft_from_args
    from trainmath.errors import TrainmathError

    pj = peft_from_args(args)  # --lora-* without --peft: one line
    if not pj.enabled:
        return replace(job, profile=getattr(args, "profile", None) or "megatron")
    from trainmath.adapters import adapter_report
    from trainmath.flops.peft import targets_of
    from trainmath.memory.peft import PeftRun
    from trainmath.perf.peft import job_peft_problems

    adapter_report(spec, pj, 0)  # unknown targets, a rank too large: one line with the model's module names
    targets_of(spec, pj)
    if getattr(args, "offload", "none") == "auto":
        raise TrainmathError("--offload auto is not searched with --peft: name --offload optimizer (ZeRO-Offload "
                             "of the adapters, ZeRO-1/2) or leave it off")
    tuned = replace(job, peft=PeftRun(job=pj), profile=getattr(args, "profile", None) or "hf")
    bad = job_peft_problems(tuned)
    if bad:
        raise TrainmathError("; ".join(bad))
    return tuned


def lines(est) -> list[str]:
    """The fine-tune's figures: the adapters, and the compute by op class with its FLOPs and seconds."""
    from trainmath.render import table

    p = est.peft
    rows = [[c.replace("_", " "), f"{v['flops'] / 1e12:,.2f}" if v["flops"] else "-", f"{v['seconds']:.4f}"]
            for c, v in p["compute"].items() if v["seconds"] > 0 or v["flops"]]
    head = (f"fine-tune: peft {p['method']} r={p['lora_rank']}, {p['trainable_params']:,} trainable parameters, "
            f"layer 0 {'computes' if p['input_grads'] else 'does not compute'} its input's gradient; per GPU per "
            f"step, attention FLOPs causal={p['flops_causal']} (what the kernel runs)")
    out = [head, table(["compute by op class", "TFLOP", "seconds"], rows, align="lrr")]
    if p["dequant_elements"]:
        out.append(f"QLoRA dequantises {p['dequant_elements']:,} weight elements per GPU per step (memory-bound)")
    return out + [""]
