"""The fine-tuning part of the report and the web page: the adapters ``trainmath params --peft`` counts.

Pure: values and HTML strings. The memory, step timeline and FLOPs beside it are the fine-tune's where the
calculator models its step (``memory.peft``, ``flops.peft``), else full training's; the page says which
(``fine_tune_setup``). The planner's step times are the fine-tune's (``plan.peft``).
"""

from __future__ import annotations

from html import escape

MEMORY_NOTE = ("memory, FLOPs and the step timeline on this page are full training's: the calculator does not yet "
               "model a fine-tune's step (only its parameters, above)")
FINE_TUNE_NOTE = ("memory, FLOPs and the step timeline on this page are the fine-tune's (frozen base, adapters' "
                  "gradients and states, LoRA activations; the frozen base's backward computes input gradients "
                  "only), and so are the planner's step times (trainmath plan --peft)")


def fine_tune_setup(spec, setup, layout, job) -> tuple[object, object, str]:
    """(the setup whose memory the page shows, the fine-tune's FLOPs report or None, what they are): the
    fine-tune's step where the calculator models it (``memory.peft``, ``flops.peft``), else full training's with
    the reason."""
    from dataclasses import replace

    from trainmath.errors import TrainmathError
    from trainmath.flops.peft import peft_flops
    from trainmath.memory.peft import PeftRun
    from trainmath.memory.training import training_memory

    run = PeftRun(job=job)
    try:
        flops = peft_flops(spec, job, batch=setup.micro_batch, seq=setup.seq, recompute=setup.recompute,
                           input_grads=run.input_grad(setup.recompute)).report
        flops_note = ""
    except TrainmathError as e:
        flops, flops_note = None, f"the FLOPs are full training's: {e}"
    tuned = replace(setup, peft=run)
    try:
        training_memory(spec, tuned, layout)
    except TrainmathError as e:
        note = (f"memory and the step timeline on this page are full training's: {e}; "
                + (flops_note or "the FLOPs and the planner's step times are the fine-tune's"))
        return setup, flops, note
    if flops is None:
        return tuned, None, f"memory and the step timeline on this page are the fine-tune's; {flops_note}"
    return tuned, flops, FINE_TUNE_NOTE


def summary(adapters, note: str = MEMORY_NOTE) -> dict | None:
    """The page's fine-tuning numbers (exact integers), or None for full training."""
    if adapters is None:
        return None
    d = adapters.to_dict()
    return {k: d[k] for k in ("peft", "lora_rank", "lora_alpha", "lora_targets", "lora_dtype", "trainable_params",
                              "adapter_params", "total_params", "adapter_bytes")} | {"memory_note": note}


def section(adapters, note: str = MEMORY_NOTE) -> str:
    """The report's "Fine-tuning" section, or "" for full training."""
    if adapters is None:
        return ""
    j = adapters.job
    targets = j.targets if isinstance(j.targets, str) else ",".join(j.targets)
    rows = "".join(f"<tr><td>{escape(m.name)}</td><td>{m.in_features:,}</td><td>{m.out_features:,}</td>"
                   f"<td>{j.rank * m.rank_mult}</td><td>{m.count:,}</td><td>{p:,}</td></tr>"
                   for m, p in adapters.modules)
    share = 100 * adapters.trainable_params / adapters.total_params
    notes = "".join(f"<p class='sub'>note: {escape(n)}</p>" for n in adapters.notes)
    return (f'<section id="peft"><h2>Fine-tuning ({escape(j.method)})</h2>'
            f'<p class="sub">r={j.rank}, alpha={j.lora_alpha}, targets={escape(targets)}, adapters in '
            f'{escape(j.dtype)}, as peft\'s LoraConfig</p>'
            '<table><thead><tr><th>module</th><th>in</th><th>out</th><th>rank</th><th>modules</th>'
            f'<th>adapter params</th></tr></thead><tbody>{rows}</tbody></table>'
            f'<p>trainable <b id="trainable-params">{adapters.trainable_params:,}</b> ({share:.4f}% of '
            f'{adapters.total_params:,} with the adapters; peft\'s get_nb_trainable_parameters())</p>'
            f'{notes}<p class="sub" id="peft-memory-note">{escape(note)}</p></section>')
