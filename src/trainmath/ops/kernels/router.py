"""MoE routers: the gate Linear, the scores, the top-k selection and the routing weights the experts multiply by.
Derived from transformers 5.24's router modules, checked by ``tests/activations``.

The router is replicated (``parallelize_module`` leaves it whole): its logits and probabilities have every expert
on every rank; their rows are the tokens of its input (the MoE input inside the tensor-parallel region).

- ``softmax_topk`` (Qwen2/3-MoE, Mixtral, Qwen3-Next): ``softmax(logits, dtype=fp32)`` keeps its fp32 output,
  ``topk`` its int64 indices; with renormalisation the in-place division keeps the fp32 top-k values and their
  sum. The weights are cast back to the logits' dtype, except with ``fp32_weights`` (Mixtral: the fp32 values
  themselves are the routing weights, 2 bytes × T·k more in bf16 and under autocast).
- ``fp32_linear`` (DeepSeek, GLM-4.5, Nemotron-H): ``F.linear(x.float(), w.float())``: under autocast it runs in
  the compute dtype (its input cast; the weight cast is the autocast weight copy); in a bf16 model both casts are
  fp32 copies that the Linear keeps (the weight's an activation here, not a weight copy); in fp32 it reads its
  input itself (one storage with the shared experts').
- ``sigmoid_noaux`` (DeepSeek-V3's ``noaux_tc``): the sigmoid output (the router dtype), the top-k indices saved by
  ``scores.gather`` and, renormalising, the in-place division's denominator and weights. The group selection
  (group top-2, top-k over groups, masked_fill) yields integer indices only: its nodes cannot reach the loss and
  free what they packed when the forward ends, so ``n_group``/``topk_group`` change nothing.
- ``softmax_greedy`` (DeepSeek-V2): the fp32 softmax, with ``group_limited_greedy`` the masked_fill's bool mask,
  then the top-k indices; the routing weights stay fp32.
- ``topk_softmax`` (gpt-oss): top-k on the logits (int64 indices), then a softmax over the k values (kept).
- ``sigmoid_scatter`` (Llama 4): top-k indices kept by ``scatter_`` and the fp32 sigmoid of the scattered scores
  (every expert's score, 0 where not selected).
"""

from __future__ import annotations

from trainmath.errors import TrainmathError
from trainmath.model.spec import TensorSpec
from trainmath.ops.context import FP32, INT64, Ctx
from trainmath.ops.ir import Axis, Program, Tensor
from trainmath.ops.kernels.linear import cast, linear, weight_axes

ROUTERS = ("softmax_topk", "sigmoid_noaux", "softmax_greedy", "topk_softmax", "sigmoid_scatter")


def _rows(x: Tensor, last: int, dtype: int, name: str, note: str = "") -> Tensor:
    """A per-token tensor with the rows of ``x`` and a whole last axis (experts or top-k slots)."""
    return Tensor(name=name, axes=(*x.axes[:-1], Axis(last)), dtype_bytes=dtype, note=note)


def fp32_linear(prog: Program, ctx: Ctx, name: str, x: Tensor, w: TensorSpec, n: int) -> Tensor:
    """``F.linear(x.float(), w.float())``; returns the logits (compute dtype under autocast, else fp32)."""
    if ctx.p.autocast:
        return linear(prog, ctx, name, x, Axis(n), weight=w)
    xf = cast(prog, x, FP32, f"{name}.input_fp32", "x.float()")
    saved = [xf]
    if ctx.p.weight_bytes != FP32:
        wf = Tensor(name=f"{name}.weight_fp32", axes=weight_axes(w), dtype_bytes=FP32,
                    note="w.float() of a bf16 weight, kept by the Linear")
        prog.emit("cast", f"{name}.weight_float", outputs=(wf,))
        saved.append(wf)
    out = _rows(x, n, FP32, f"{name}.out")
    prog.emit("linear", name, inputs=(xf,), outputs=(out,), saved=saved, weight=w)
    return out


def softmax_topk(prog: Program, ctx: Ctx, name: str, logits: Tensor, k: int, *, renorm: bool,
                 fp32_weights: bool = False) -> Tensor:
    """Softmax over the experts, top-k, optional renormalisation; returns the routing weights (rows × k)."""
    n = logits.axes[-1].size
    probs = _rows(logits, n, FP32, f"{name}.softmax_fp32")
    prog.emit("act", f"{name}.softmax", inputs=(logits,), outputs=(probs,), saved=(probs,), kernel="softmax")
    idx = _rows(logits, k, INT64, f"{name}.topk_indices")
    vals = _rows(logits, k, FP32, f"{name}.topk_values")
    saved: list[Tensor] = [idx]
    if renorm:
        saved += [vals, Tensor(name=f"{name}.topk_sum", axes=logits.axes[:-1], dtype_bytes=FP32)]
    prog.emit("router", f"{name}.topk", inputs=(probs,), outputs=(vals, idx), saved=saved, kernel="softmax_topk")
    return vals if fp32_weights else cast(prog, vals, logits.dtype_bytes, f"{name}.routing_weights")


def sigmoid_noaux(prog: Program, ctx: Ctx, name: str, logits: Tensor, k: int, *, renorm: bool) -> Tensor:
    """DeepSeek-V3's ``noaux_tc`` routing over the logits; returns the routing weights (rows × k)."""
    n, rd = logits.axes[-1].size, logits.dtype_bytes
    scores = _rows(logits, n, rd, f"{name}.sigmoid")
    prog.emit("act", f"{name}.sigmoid", inputs=(logits,), outputs=(scores,), saved=(scores,), kernel="sigmoid")
    idx = _rows(logits, k, INT64, f"{name}.topk_indices", "saved by the gather of the weights")
    weights = _rows(logits, k, rd, f"{name}.topk_weights")
    prog.emit("index", f"{name}.gather", inputs=(scores, idx), outputs=(weights,), saved=(idx,))
    if renorm:
        denom = Tensor(name=f"{name}.topk_sum", axes=logits.axes[:-1], dtype_bytes=rd)
        prog.emit("div", f"{name}.renorm", inputs=(weights, denom), saved=(denom, weights), note="in place")
    return weights


def softmax_greedy(prog: Program, ctx: Ctx, name: str, logits: Tensor, k: int, method: str) -> Tensor:
    """DeepSeek-V2's softmax routing (``greedy`` or ``group_limited_greedy``); returns the fp32 weights."""
    if method not in ("greedy", "group_limited_greedy"):
        raise TrainmathError(f"DeepSeek-V2 topk_method {method!r} is not one of greedy, group_limited_greedy")
    n = logits.axes[-1].size
    probs = _rows(logits, n, FP32, f"{name}.softmax_fp32")
    prog.emit("act", f"{name}.softmax", inputs=(logits,), outputs=(probs,), saved=(probs,), kernel="softmax")
    if method == "group_limited_greedy":
        mask = _rows(logits, n, 1, f"{name}.group_mask", "bool, saved by masked_fill on the scores")
        prog.emit("mask", f"{name}.masked_fill", inputs=(probs,), saved=(mask,), note="group selection")
    idx = _rows(logits, k, INT64, f"{name}.topk_indices")
    weights = _rows(logits, k, FP32, f"{name}.topk_weights")
    prog.emit("router", f"{name}.topk", inputs=(probs,), outputs=(weights, idx), saved=(idx,), kernel=method)
    return weights


def topk_softmax(prog: Program, ctx: Ctx, name: str, logits: Tensor, k: int) -> Tensor:
    """Top-k of the logits, then a softmax over the k values; returns the weights (logits' dtype)."""
    idx = _rows(logits, k, INT64, f"{name}.topk_indices")
    top = _rows(logits, k, logits.dtype_bytes, f"{name}.topk_logits")
    prog.emit("router", f"{name}.topk", inputs=(logits,), outputs=(top, idx), saved=(idx,), kernel="topk")
    weights = _rows(logits, k, logits.dtype_bytes, f"{name}.softmax", "softmax of the k top logits")
    prog.emit("act", f"{name}.softmax", inputs=(top,), outputs=(weights,), saved=(weights,), kernel="softmax")
    return weights


def sigmoid_scatter(prog: Program, ctx: Ctx, name: str, logits: Tensor, k: int) -> Tensor:
    """Top-k indices scattered into a -inf tensor, then the fp32 sigmoid; returns the (rows × n) scores."""
    n = logits.axes[-1].size
    idx = _rows(logits, k, INT64, f"{name}.topk_indices", "saved by scatter_")
    scattered = _rows(logits, n, logits.dtype_bytes, f"{name}.scattered")
    prog.emit("index", f"{name}.scatter", inputs=(logits,), outputs=(scattered, idx), saved=(idx,))
    scores = _rows(logits, n, FP32, f"{name}.sigmoid_fp32")
    prog.emit("act", f"{name}.sigmoid", inputs=(scattered,), outputs=(scores,), saved=(scores,), kernel="sigmoid")
    return scores
