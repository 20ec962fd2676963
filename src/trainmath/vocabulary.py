"""Words the calculator, the runtime and the CLI share, each defined once.

Precision recipes say how a framework stores weights, gradients, master weights and optimizer states, and in
which dtype activations are computed. Sources: ``torch.autocast`` (amp), Micikevicius et al. 2018 "Mixed
Precision Training" §3.1 and ZeRO (Rajbhandari et al. 2020 §3.1: 2Ψ + 2Ψ + KΨ with K = 12 for mixed-precision
Adam) for ``mixed-bf16``; Transformer Engine for ``fp8``.
"""

from __future__ import annotations

from dataclasses import dataclass

from trainmath.errors import TrainmathError

RECOMPUTE = ("none", "selective", "full")
"""Activation recompute: ``none``; ``selective`` (torchtitan's op-level selective checkpointing); ``full`` (every
layer's forward again in backward: transformers' ``gradient_checkpointing_enable()``, Megatron-LM's full)."""

OPTIMIZERS = ("sgd", "sgd-momentum", "adam", "adamw", "adam-amsgrad", "adafactor", "adam8bit", "adamw8bit",
              "lion")
"""The optimizers whose states and step the calculator counts (``memory.optimizers``)."""
OPTIMIZER_ALIASES = {"momentum": "sgd-momentum"}
"""Other spellings of an optimizer → its name in ``OPTIMIZERS`` (``trainmath train --optimizer momentum``)."""
TRAIN_OPTIMIZERS = ("sgd", "momentum", "adam", "adamw")
"""The optimizers ``trainmath train`` runs, as its ``--optimizer`` spells them."""
OPTIMIZER_IMPLS = ("forloop", "foreach", "fused")
"""torch's optimizer implementations: ``forloop`` (``foreach=False``), ``foreach`` (the default on CUDA),
``fused``."""


def optimizer_name(name: str) -> str:
    """The name in ``OPTIMIZERS`` of an optimizer spelt ``name``."""
    return OPTIMIZER_ALIASES.get(name, name)


TRAIN_PRECISIONS = ("fp32", "amp-bf16", "bf16", "mixed-bf16")
"""The precision recipes (``RECIPES``) ``trainmath train`` runs."""
ATTENTION = ("sdpa", "flash", "eager")
"""Attention kernels, one set of names for every command:

- ``sdpa``: torch's ``scaled_dot_product_attention`` as transformers runs it (``attn_implementation="sdpa"``), the
  kernel torch picks by device: on CUDA FlashAttention-2 or the memory-efficient kernel, on the CPU its flash
  kernel or the math fallback (``ops.kernels.fused_attention``); no s² scores kept;
- ``flash``: a FlashAttention kernel (Dao 2023; Megatron-Core's and Transformer Engine's fused attention): no s²
  scores kept, causally masked blocks skipped;
- ``eager``: the s² scores materialised (transformers' ``attn_implementation="eager"``, Megatron-LM's unfused core
  attention).
"""
MEMORY_ATTENTION = ("sdpa", "eager")
"""The kernels a training setup names (``TrainingSetup.attention``: ``trainmath memory``, ``report``), as
transformers spells them; the megatron profile runs ``sdpa`` as its ``flash`` kernel (Megatron-Core has no SDPA)."""
STEP_ATTENTION = ("flash", "eager")
"""The kernels ``trainmath estimate`` and ``plan`` time (``perf.compute``)."""
ATTENTION_ALIASES = {"flash": "sdpa", "sdpa": "flash"}
"""A command that models one fused kernel and not the other reads the other's name as its own: ``memory`` and
``report`` take ``flash`` as ``sdpa`` (torch's SDPA runs FlashAttention-2 on CUDA), ``estimate`` and ``plan`` take
``sdpa`` as ``flash``."""
MEMORY_ATTENTION_HELP = ("attention kernel: sdpa (default: torch's SDPA as transformers runs it) or eager (the s×s "
                         "scores saved; the megatron profile: unfused core attention); flash is read as sdpa")


def attention_as(word: str, modelled: tuple[str, ...]) -> str:
    """``word`` (one of ``ATTENTION``) as a command that models the kernels ``modelled`` names it: itself, or its
    alias (``ATTENTION_ALIASES``)."""
    if word in modelled:
        return word
    alias = ATTENTION_ALIASES.get(word)
    if alias in modelled:
        return alias
    raise TrainmathError(f"attention must be one of {', '.join(modelled)} (or an alias: "
                         f"{', '.join(f'{a} for {b}' for a, b in ATTENTION_ALIASES.items() if b in modelled)}), "
                         f"got {word!r}")
EXPERTS = ("grouped", "eager")
"""Routed experts as transformers runs them: ``grouped`` (``grouped_mm``, transformers 5's default) or ``eager``
(the per-expert loop)."""
PROFILES = ("hf", "megatron")
"""Activation profiles: what the model code saves (``hf`` transformers, ``megatron`` Megatron-Core)."""
DEVICES = ("cuda", "cpu")
OFFLOAD = ("none", "optimizer", "params")
"""ZeRO-Offload: nothing, the optimizer states and step, also the parameter shards (ZeRO-3)."""
GRAD_LIFETIMES = ("set_to_none", "zero", "accumulate")
"""When gradients exist (``memory.timeline``)."""
LOOP_KEEPS = ("output", "loss")
"""What the training loop keeps of the model's output through backward and the optimizer step: ``output`` (``out =
model(ids, labels=ids); out.loss.backward()``: the logits live until the step returns) or ``loss`` (``loss =
model(ids, labels=ids).loss``: the output object, and with it the logits, is dropped when the forward returns;
nothing saves them for backward — ``log_softmax`` saves its output, the LM head its input — so only the 4-byte loss
outlives the forward). The HF Trainer's ``compute_loss`` and ``trainmath train`` are ``loss``. Measured: on a
2-layer Qwen3 (vocabulary 256, 2 × 64 tokens, fp32) the peak of a ``loss`` step is the logits' 131,072 bytes below
the ``output`` step's (MemTracker)."""
ZERO_IMPLS = ("deepspeed", "trainmath", "fsdp2", "megatron")
"""Whose ZeRO buffers the timeline follows (``memory.setup.TrainingSetup.zero_impl``)."""


@dataclass(frozen=True, kw_only=True)
class Precision:
    """Bytes per element of each training state under one recipe."""

    name: str
    weight_bytes: int
    """The parameters the model computes with (what ``model.parameters()`` holds)."""
    grad_bytes: int
    """``param.grad``: same dtype as the parameter in torch."""
    master_bytes: int
    """A separate fp32 copy of the weights the optimizer updates (0 when the optimizer updates the weights)."""
    state_bytes: int
    """Bytes per element of a full-precision optimizer state (torch creates states ``zeros_like`` the tensor the
    optimizer updates: the master copy when there is one, else the parameter)."""
    compute_bytes: int
    """Bytes per element of activations saved for backward (the autocast / compute dtype)."""
    weight_copy_bytes: int = 0
    """Extra per-element bytes of low-precision copies of linear weights live during forward+backward:
    autocast's bf16 casts (2, saved for backward by the matmul), or Transformer Engine's fp8 weight and its fp8
    transpose (1 + 1)."""
    description: str = ""

    @property
    def autocast(self) -> bool:
        """Parameters wider than the compute dtype: every Linear casts its input and weight (torch.autocast)."""
        return self.weight_bytes > self.compute_bytes

    @property
    def residual_bytes(self) -> int:
        """The residual stream's dtype: the embedding's (the weights') dtype; bf16 + fp32 adds promote to fp32."""
        return self.weight_bytes


RECIPES: dict[str, Precision] = {p.name: p for p in (
    Precision(name="fp32", weight_bytes=4, grad_bytes=4, master_bytes=0, state_bytes=4, compute_bytes=4,
              description="everything fp32"),
    Precision(name="amp-bf16", weight_bytes=4, grad_bytes=4, master_bytes=0, state_bytes=4, compute_bytes=2,
              weight_copy_bytes=2,
              description="fp32 weights, grads and optimizer states; bf16 compute under torch.autocast, which "
                          "casts each linear weight to a bf16 copy that the matmul saves for backward"),
    Precision(name="bf16", weight_bytes=2, grad_bytes=2, master_bytes=0, state_bytes=2, compute_bytes=2,
              description="weights, grads and optimizer states all bf16 (model.to(torch.bfloat16))"),
    Precision(name="mixed-bf16", weight_bytes=2, grad_bytes=2, master_bytes=4, state_bytes=4, compute_bytes=2,
              description="bf16 weights and grads, fp32 master weights and optimizer states (ZeRO's 2+2+12 "
                          "bytes/param for Adam; Megatron's default fp32 main_grad accumulation is not modelled)"),
    Precision(name="fp8", weight_bytes=2, grad_bytes=2, master_bytes=4, state_bytes=4, compute_bytes=2,
              weight_copy_bytes=2,
              description="mixed-bf16 plus Transformer Engine fp8 GEMMs: an fp8 copy of each linear weight and "
                          "its fp8 transpose are cached during the step; under the megatron profile TE's linears "
                          "save their inputs in fp8 (1 byte, memory/te_fp8.py), the hf profile counts them in "
                          "bf16"),
)}


def precision_of(*, compute_bytes: int, weight_bytes: int) -> Precision:
    """The first recipe that computes in ``compute_bytes`` over ``weight_bytes`` parameters (what an op list reads
    of a precision: 2 and 2 a bf16 model, 2 and 4 bf16 autocast, 4 and 4 fp32)."""
    for p in RECIPES.values():
        if (p.compute_bytes, p.weight_bytes) == (compute_bytes, weight_bytes):
            return p
    raise TrainmathError(f"no precision recipe computes in {compute_bytes} bytes over {weight_bytes}-byte "
                         f"parameters; choose one of {', '.join(RECIPES)}")


def get_precision(name: str) -> Precision:
    try:
        return RECIPES[name]
    except KeyError:
        raise TrainmathError(f"unknown precision {name!r}; choose one of {', '.join(RECIPES)}") from None
