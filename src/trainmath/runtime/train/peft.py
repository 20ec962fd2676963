"""LoRA and QLoRA on the runtime's model, through peft (the reference implementation, as transformers is for the
model).

``apply_peft`` takes the built (and, for ``--precision bf16``, cast) transformers model and returns peft's
``PeftModel``: ``LoraConfig`` from the same job as ``trainmath params --peft`` (rank, alpha, targets including
``all-linear``; ``lora_dropout=0`` so the runs are deterministic and every rank computes the same step;
``bias="none"``), with the adapters then cast to ``--lora-dtype``. peft freezes every base parameter: only the
adapters get gradients and optimizer states.

QLoRA: every ``nn.Linear`` of the model but the output layer (transformers' bitsandbytes integration skips
``get_output_embeddings()``, and peft's ``all-linear`` leaves it out too) becomes ``bitsandbytes.nn.Linear4bit``
with QLoRA's storage (NF4, blocks of 64, double-quantized absmax, uint8 packing; Dettmers et al. 2023, §3), computed
in the model's dtype; peft then wraps those layers with its ``lora.bnb.Linear4bit``. The quantization happens when
the weights are moved to the device (bitsandbytes quantizes on ``.to``; on the CPU too, with bitsandbytes >= 0.45).
"""

from __future__ import annotations

import torch

from trainmath.adapters import ALL_LINEAR, PeftJob
from trainmath.errors import TrainmathError

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


def import_peft(job: PeftJob) -> None:
    """Import peft (and bitsandbytes for QLoRA), or say in one line how to install them."""
    import importlib

    for name in ("peft", "bitsandbytes") if job.method == "qlora" else ("peft",):
        try:
            importlib.import_module(name)
        except ImportError as e:
            raise TrainmathError(f"--peft {job.method} needs {name} ({e}): pip install \"trainmath[peft]\"") from None


def lora_config(job: PeftJob):
    """peft's ``LoraConfig`` of ``job`` (the flags of ``trainmath params --peft``)."""
    from peft import LoraConfig

    targets = ALL_LINEAR if job.targets == ALL_LINEAR else list(job.targets)
    return LoraConfig(r=job.rank, lora_alpha=job.lora_alpha, target_modules=targets, lora_dropout=0.0, bias="none",
                      task_type="CAUSAL_LM")


def quantize_base(model: torch.nn.Module, device: torch.device) -> int:
    """Replace every ``nn.Linear`` but the output layer by a bitsandbytes NF4 ``Linear4bit`` holding the same
    weights, quantized on ``device``; returns how many were replaced."""
    import bitsandbytes as bnb

    skip = model.get_output_embeddings()
    compute = next(p.dtype for p in model.parameters() if p.is_floating_point())
    replaced = 0
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            if type(child) is not torch.nn.Linear or child is skip:
                continue
            q = bnb.nn.Linear4bit(child.in_features, child.out_features, bias=child.bias is not None,
                                  compute_dtype=compute, compress_statistics=True, quant_type="nf4",
                                  quant_storage=torch.uint8, device="meta")
            q.weight = bnb.nn.Params4bit(child.weight.data, requires_grad=False, compress_statistics=True,
                                         quant_type="nf4", blocksize=64, quant_storage=torch.uint8)
            if child.bias is not None:
                q.bias = torch.nn.Parameter(child.bias.data, requires_grad=False)
            setattr(parent, name, q.to(device))
            replaced += 1
    return replaced


def apply_peft(model: torch.nn.Module, job: PeftJob, device: torch.device) -> torch.nn.Module:
    """``get_peft_model(model, lora_config(job))`` with the adapters in ``job.dtype``; QLoRA quantizes first."""
    from peft import get_peft_model

    if job.method == "qlora":
        quantize_base(model, device)
    try:
        peft_model = get_peft_model(model, lora_config(job), autocast_adapter_dtype=False)
    except ValueError as e:  # peft's own message for targets it cannot find or wrap
        raise TrainmathError(f"peft: {str(e).splitlines()[0]}") from None
    dtype = DTYPES[job.dtype]
    for name, p in peft_model.named_parameters():
        if "lora_" in name:
            p.data = p.data.to(dtype)
    return peft_model


def peft_counts(model: torch.nn.Module) -> dict[str, int]:
    """peft's own counts on this rank's ``PeftModel``, before any wrapping: ``get_nb_trainable_parameters()``
    (trainable, all — peft counts a 4-bit weight's packed uint8 elements twice) and the adapters' elements."""
    trainable, total = model.get_nb_trainable_parameters()
    adapters = sum(p.numel() for n, p in model.named_parameters() if "lora_" in n)
    return {"trainable_params": int(trainable), "total_params": int(total), "adapter_params": int(adapters),
            "quant_state_bytes": quant_state_bytes(model)}


def quant_state_bytes(model: torch.nn.Module) -> int:
    """Bytes of the tensors bitsandbytes keeps beside each packed 4-bit weight (its ``QuantState``: absmax, code
    table, and with double quantization the nested state's absmax, code table and the offset), each storage
    once."""
    seen: dict[int, int] = {}

    def add(t):
        if isinstance(t, torch.Tensor) and t.untyped_storage().nbytes():
            seen[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()

    for p in model.parameters():
        qs = getattr(p, "quant_state", None)
        if qs is None:
            continue
        for t in (qs.absmax, qs.code, getattr(qs, "offset", None)):
            add(t)
        if getattr(qs, "state2", None) is not None:
            add(qs.state2.absmax)
            add(qs.state2.code)
    return sum(seen.values())


def frozen_parameters(model: torch.nn.Module) -> list[torch.nn.Parameter]:
    return [p for p in model.parameters() if not p.requires_grad]
