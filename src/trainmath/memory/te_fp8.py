"""What Transformer Engine's FP8 linears save for backward, in the ``megatron`` profile's terms.

Under an FP8 recipe (``precision="fp8"``: delayed or current scaling, MXFP8) each TE linear quantizes its input
and saves the FP8 tensor for its weight gradient, not the 16-bit one (``transformer_engine/pytorch/module/
linear.py``, ``layernorm_linear.py``, ``grouped_linear.py``: ``inputmat`` / ``ln_out`` quantized before
``save_for_backward``). So, 1 byte per element instead of ``act_bytes``:

- ``linear_qkv`` and ``linear_fc1`` inputs: the fused norms' output (``ln_out``); the norm inputs stay 16-bit.
- ``linear_fc2`` inputs: the activation's output (SwiGLU / GeLU); fc1's output, the activation's own saved
  input, stays 16-bit.
- the routed experts' permuted rows (``GroupedLinear``'s fc1 input) and their activation output; MLA's
  latents at the up-projections; Mamba's ``in_proj`` input.
- ``linear_proj``: its input is the core attention's output, which the flash kernel keeps in 16 bits for its
  own backward, so TE's FP8 copy is one more byte per element (a term of its own).

The block scales (MXFP8: one byte per 32 elements; per-tensor recipes: one scalar) and the shared expert's FP8
copy of its input are left out. The core attention itself runs in BF16 (no FP8 attention). Derived from the
code, not measured.
"""

from __future__ import annotations

FP8_SAVED = ("linear_qkv: input", "linear_fc1: input", "experts: permuted rows (linear_fc1 input)",
             "q latent: up-projection input", "kv latent: up-projection input", "in_proj: input")
"""Saved tensors that are a TE linear's input, stored in FP8 under an FP8 recipe (beside the activations' outputs,
any name ending ``(linear_fc2 input)``)."""


def fp8_terms(terms: list[tuple[str, int, int]], x: int) -> list[tuple[str, int, int]]:
    """``layer_terms``' (name, bytes before division, divisor) rows under an FP8 recipe: each FP8-saved input at 1
    byte per element (its bytes / ``x``), plus linear_proj's FP8 copy of the attention output."""
    out = []
    for name, value, div in terms:
        if name in FP8_SAVED or name.endswith("(linear_fc2 input)"):
            out.append((name + " [FP8]", value // x, div))
            continue
        out.append((name, value, div))
        if name == "linear_proj: input (attention output)":
            out.append(("linear_proj: input, TE's FP8 copy", value // x, div))
    return out
