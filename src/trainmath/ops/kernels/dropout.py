"""Dropout in training (``nn.functional.dropout(x, p, training=True)``) as PyTorch runs it on each device, and how
it changes the attention kernels. Derived from ATen's ``native/Dropout.cpp`` and ``transformers/attention.cpp``
(torch 2.13), checked by ``tests/activations/test_dropout_oracle.py``.

- CUDA (``is_fused_kernel_acceptable``: a CUDA tensor, 0 < p < 1): ``native_dropout`` keeps its bool mask,
  1 byte per element; its output is a new tensor that only its consumer may keep.
- CPU (``at::_dropout_impl``): ``noise = empty_like(x).bernoulli_(1 - p).div_(1 - p)``, then ``x * noise``: the
  product keeps the noise (it needs no gradient, so ``x`` is not kept), in ``x``'s dtype.
- SDPA with dropout: on CUDA the flash and memory-efficient kernels take it (an RNG seed and offset, not
  counted, as without dropout); on the CPU neither fused kernel accepts dropout (``sdp_utils_cpp``'s
  ``check_for_dropout``), so the math fallback runs (``_scaled_dot_product_attention_math``): in fp32 whatever the
  dtype (bf16/fp16 inputs are upcast), it keeps the scaled query, the scaled transposed key and the value (4·T·q
  each, h heads), the softmax (4·b·h·s²), the dropout's noise and its output (4·b·h·s² each); its output is cast
  back to the compute dtype. The value is a copy unless the model is fp32 with as many key as query heads and one
  sequence: then bmm's (b·h, s, h_d) reshape of it is a view, which keeps its base (a fused projection whole).

Sharding: what the input has (the mask or noise has the input's axes).
"""

from __future__ import annotations

from trainmath.ops.context import FP32, Ctx
from trainmath.ops.ir import Axis, Program, Tensor, tensor

BOOL = 1


def dropout(prog: Program, ctx: Ctx, x: Tensor, p: float, name: str) -> Tensor:
    """Append dropout of ``x`` with probability ``p`` (a no-op returning ``x`` when ``p`` is 0); returns its
    output, a new tensor of ``x``'s shape and dtype."""
    if not p:
        return x
    if ctx.device == "cpu":
        keep = tensor(f"{name}.noise", x.axes, x.dtype_bytes, "bernoulli(1 - p) / (1 - p) in the input's dtype, "
                                                             "kept by the product (CPU)")
    else:
        keep = tensor(f"{name}.mask", x.axes, BOOL, "native_dropout's bool mask (CUDA)")
    out = tensor(f"{name}.out", x.axes, x.dtype_bytes)
    prog.emit("dropout", name, inputs=(x,), outputs=(out,), saved=(keep,), kernel=ctx.device, note=f"p={p}")
    return out


def sdpa_math_dropout(prog: Program, ctx: Ctx, q: Tensor, k: Tensor, v: Tensor, p: float,
                      o_axes: tuple[Axis, ...], scores: tuple[Axis, ...], **at) -> Tensor:
    """Append SDPA with dropout ``p`` on the CPU (the math fallback, module docstring) over ``q``, ``k``, ``v``
    (any key heads: ``enable_gqa`` repeats them to h heads); returns its (b, h, s, h_d) output in the compute
    dtype (not yet laid out for the output projection). ``at``: the attention op's window and cache
    (``ir.Op``), as the other attention kernels carry them."""
    saved = [tensor("sdpa_math.query_scaled", o_axes, FP32, "query (upcast to fp32) times sqrt(scale)"),
             tensor("sdpa_math.key_scaled", o_axes, FP32, "transposed key (fp32, h heads) times sqrt(scale)"),
             tensor("sdpa_math.softmax_fp32", scores, FP32, "kept by _safe_softmax")]
    probs = dropout(prog, ctx, saved[-1], p, "sdpa_math.dropout")
    if ctx.p.compute_bytes == FP32 and ctx.b == 1 and v.axes[2].size == o_axes[2].size:
        value = v  # no upcast, no repeat, and with one sequence bmm's (b·h, s, h_d) reshape is a view
    else:
        value = tensor("sdpa_math.value", o_axes, FP32, "fp32, h heads, as the second bmm reads it")
    saved += [probs, value]
    out = tensor("sdpa_math.output", o_axes, ctx.p.compute_bytes, "cast back to the compute dtype")
    prog.emit("attention", "sdpa_math", inputs=(q, k, v), outputs=(out,), saved=saved, kernel="sdpa_math",
              note=f"dropout p={p} on the CPU: no fused kernel", **at)
    return out
