"""Precision recipes: the bytes per element of each kind of training state.

Each recipe says how a framework stores weights, gradients, master weights and optimizer states, and in which
dtype activations are computed. Sources: ``torch.autocast`` (amp), Micikevicius et al. 2018 "Mixed Precision
Training" §3.1 and ZeRO (Rajbhandari et al. 2020 §3.1: 2Ψ + 2Ψ + KΨ with K = 12 for mixed-precision Adam) for
``mixed-bf16``; Transformer Engine for ``fp8``.
"""

from __future__ import annotations

from dataclasses import dataclass

from trainmath.errors import TrainmathError


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
                          "its fp8 transpose are cached during the step; activations counted in bf16 (TE's fp8 "
                          "saved inputs of linears are not modelled)"),
)}


def get_precision(name: str) -> Precision:
    try:
        return RECIPES[name]
    except KeyError:
        raise TrainmathError(f"unknown precision {name!r}; choose one of {', '.join(RECIPES)}") from None
