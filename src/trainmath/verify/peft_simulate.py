"""``trainmath memory --simulate --peft lora``: the fine-tune's step of the user's config on fake tensors, beside the
``--device cpu`` prediction, in the fields ``--simulate`` prints for full training.

One device runs ``verify.peft_sim`` (MemTracker, foreach AdamW over the adapters); ``--zero 3 --dp W`` runs rank 0
of ``verify.peft_fsdp`` (peft before ``fully_shard``, FSDPMemTracker over a fake process group, for-loop AdamW).
What they run and what they do not is checked first, in one line (``check``).
"""

from __future__ import annotations

import time
from dataclasses import replace

from trainmath.errors import TrainmathError

LOOP = ("peft LoRA: the base frozen in its dtype, fp32 adapters (autocast_adapter_dtype=True); loss = "
        "model(...).loss, backward, AdamW over the adapters, zero_grad(set_to_none)")


def check(setup, layout, *, fold_layers: int | None = None) -> None:
    """One ``TrainmathError`` naming everything the peft simulations cannot run."""
    run, bad = setup.peft, []
    fsdp = layout.zero == 3 and layout.dp > 1 and layout.ranks == layout.dp
    if run.job.method != "lora":
        bad.append(f"--peft {run.job.method} (simulate --peft lora; bitsandbytes' 4-bit layers do not run on fake "
                   f"tensors)")
    if run.job.dtype != "fp32":
        bad.append(f"--lora-dtype {run.job.dtype} (peft's default leaves adapters fp32: simulate --lora-dtype fp32)")
    if run.paged or (run.dropout and fsdp):
        bad.append("--paged-optimizer" if run.paged else "--lora-dropout with --zero 3")
    if setup.optimizer not in ("adam", "adamw"):
        bad.append(f"--optimizer {setup.optimizer} (simulate adamw)")
    if not fsdp and setup.optimizer_impl != "foreach":
        bad.append(f"--optimizer-impl {setup.optimizer_impl} on one device (simulate foreach)")
    if fsdp and setup.precision not in ("fp32", "bf16"):
        bad.append(f"--precision {setup.precision} with --zero 3 (simulate fp32 or bf16)")
    elif setup.precision not in ("fp32", "bf16", "amp-bf16"):
        bad.append(f"--precision {setup.precision} (simulate fp32, bf16 or amp-bf16)")
    if setup.loop_keeps != "loss" or setup.backward_in_autocast:
        bad.append("--loop-keeps output / --backward-in-autocast (the loop keeps the loss only)")
    if fold_layers is not None:
        bad.append("--simulate-layers (the fine-tune is simulated whole)")
    if bad:
        raise TrainmathError("--simulate --peft cannot run " + "; ".join(bad))


def peft_simulation(config: dict, spec, setup, layout) -> dict:
    """The simulated step (``peak_bytes``, ``by_kind``, ``buffers_bytes``, ``seconds``, ``loop``, ``peak_segment``)
    and the ``--device cpu`` prediction (``predicted_cpu_peak_bytes``, ``..._event``, ``difference_bytes``)."""
    from trainmath.memory.training import training_memory
    from trainmath.verify.simulate import hf_config

    run = setup.peft
    targets = run.job.targets if isinstance(run.job.targets, str) else list(run.job.targets)
    kw = dict(micro_batch=setup.micro_batch, seq=setup.seq, precision=setup.precision, targets=targets,
              rank=run.job.rank, recompute=setup.recompute, input_grads=run.input_grads, fake=True)
    start = time.perf_counter()
    if layout.zero == 3 and layout.dp > 1:
        from trainmath.verify.peft_fsdp import peft_fsdp_step_peak

        sim = peft_fsdp_step_peak(hf_config(config), world=layout.dp, **kw)
        where = f"rank 0 of FSDP2 over {layout.dp} fake ranks"
    else:
        from trainmath.verify.peft_sim import peft_step_peak

        sim = peft_step_peak(hf_config(config), dropout=run.dropout, **kw)
        where = "one device"
    seconds = time.perf_counter() - start
    cpu = training_memory(spec, replace(setup, device="cpu"), layout)
    return {"peak_bytes": sim["peak_bytes"], "by_kind": sim["by_kind"], "buffers_bytes": sim["buffers_bytes"],
            "seconds": round(seconds, 2), "loop": LOOP, "peak_segment": f"the step, {where} (no per-layer segments)",
            "trainable_params": sim["trainable_params"], "predicted_cpu_peak_bytes": cpu.peak_bytes,
            "predicted_cpu_peak_event": cpu.stages[cpu.stage].phase,
            "difference_bytes": cpu.peak_bytes - (sim["peak_bytes"] - sim["buffers_bytes"])}
