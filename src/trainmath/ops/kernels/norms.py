"""Normalisations, as each family's module writes them, with what autograd keeps (derived from the code, checked
by the oracle in ``tests/activations``). ``kind`` is a family's table column (``Style.norm``):

- ``rms`` (``LlamaRMSNorm``): ``x.to(fp32)``; ``x * rsqrt(mean(x²) + eps)``; ``w * y.to(in_dtype)``: keeps the
  fp32 x (pow and mul save it; x itself when fp32), rsqrt per row (fp32) and y in x's dtype (the weight's mul).
- ``rms_fp32_weight`` (OLMo-2, gpt-oss): ``(w * (x.to(fp32) * rsqrt(...))).to(in_dtype)``: the weight
  multiplies in fp32, so y is kept in fp32.
- ``gemma`` (Gemma-2/3, Qwen3-Next): ``x.float() * rsqrt(...)``, ``(y * (1 + w.float())).type_as(x)``: y in fp32
  and the computed fp32 (1 + w), a fresh tensor of the weight's size.
- ``nemotron`` (Nemotron-H): as ``rms_fp32_weight``, plus ``w.to(fp32)`` when the parameters are not fp32.
- ``layer`` (``nn.LayerNorm``, ``native_layer_norm``): its input, the per-row mean and rstd in the input's dtype
  (fp32 under autocast, which runs layer_norm in fp32 and here gets the fp32 residual stream).
- ``cohere`` (``CohereLayerNorm``, bias-free): ``x - mean`` twice in fp32 (pow and the product each save their
  own), rsqrt per row, the fp32 y (the weight's product) and ``w.to(fp32)`` of a non-fp32 weight.
- ``l2`` (Llama 4's weightless q/k norm): ``x.float() * rsqrt(mean(x²) + eps)``: the fp32 x and rsqrt per row.
"""

from __future__ import annotations

from trainmath.errors import TrainmathError
from trainmath.model.spec import TensorSpec
from trainmath.ops.context import FP32, Ctx
from trainmath.ops.ir import Program, Tensor
from trainmath.ops.kernels.linear import cast, weight_axes

NORMS = ("rms", "rms_fp32_weight", "gemma", "nemotron", "layer", "cohere", "l2")


def _t(name: str, like: Tensor, dtype: int, *, rows_only: bool = False, note: str = "") -> Tensor:
    axes = like.axes[:-1] if rows_only else like.axes
    return Tensor(name=name, axes=axes, dtype_bytes=dtype, note=note)


def _alias(x: Tensor, name: str, note: str) -> Tensor:
    """``x`` under the name of what this norm saves (a view: the same storage, so nothing is added; the tree then
    names the norm's saved tensor as the legacy trees did, e.g. ``input_layernorm.x_fp32``)."""
    return x.view(name, *x.axes, note=note)


def _fp32_weight(name: str, w: TensorSpec, note: str) -> Tensor:
    return Tensor(name=name, axes=weight_axes(w), dtype_bytes=FP32, note=note)


def norm(prog: Program, ctx: Ctx, kind: str, name: str, x: Tensor, weight: TensorSpec | None = None) -> Tensor:
    """Append the norm ``name`` of ``kind`` (``NORMS``) over the last axis of ``x``; returns its output."""
    p = ctx.p
    if kind == "layer":
        saved = [_alias(x, f"{name}.input", "the input itself"), _t(f"{name}.mean", x, x.dtype_bytes, rows_only=True),
                 _t(f"{name}.rstd", x, x.dtype_bytes, rows_only=True)]
        out_dtype = x.dtype_bytes
    elif kind == "cohere":
        saved = [_t(f"{name}.centered_pow", x, FP32, note="x - mean in fp32, saved by pow"),
                 _t(f"{name}.centered_mul", x, FP32, note="x - mean again, saved by the product with rsqrt"),
                 _t(f"{name}.rsqrt", x, FP32, rows_only=True),
                 _t(f"{name}.normalized_fp32", x, FP32, note="saved by the weight's product")]
        if p.weight_bytes != FP32 and weight is not None:
            saved.append(_fp32_weight(f"{name}.weight_fp32", weight, "w.to(fp32) of a bf16 weight"))
        out_dtype = x.dtype_bytes
    elif kind in ("rms", "rms_fp32_weight", "gemma", "nemotron", "l2"):
        xf = cast(prog, x, FP32, f"{name}.x_fp32", "fp32 copy of the input (the input itself if fp32)")
        if xf is x:
            xf = _alias(x, f"{name}.x_fp32", "the input itself (already fp32)")
        saved = [xf, _t(f"{name}.rsqrt", x, FP32, rows_only=True, note="one fp32 per row")]
        if kind == "rms":
            saved.append(_t(f"{name}.normalized", x, x.dtype_bytes, note="x·rsqrt in the input dtype"))
            out_dtype = max(x.dtype_bytes, p.weight_bytes)
        elif kind == "l2":
            out_dtype = FP32
        else:
            saved.append(_t(f"{name}.normalized_fp32", x, FP32, note="x·rsqrt in fp32 (the weight multiplies in fp32)"))
            out_dtype = x.dtype_bytes
        if kind == "gemma" and weight is not None:
            saved.append(_fp32_weight(f"{name}.one_plus_weight", weight, "1 + w in fp32, saved by the product"))
        if kind == "nemotron" and p.weight_bytes != FP32 and weight is not None:
            saved.append(_fp32_weight(f"{name}.weight_fp32", weight, "w.to(fp32) of a bf16 weight"))
    else:
        raise TrainmathError(f"unknown norm kind {kind!r} (one of {', '.join(NORMS)})")
    out = Tensor(name=f"{name}.out", axes=x.axes, dtype_bytes=out_dtype)
    prog.emit("norm", name, inputs=(x,), outputs=(out,), saved=saved, kernel=kind, weight=weight)
    return out
