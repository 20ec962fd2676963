"""Linears, casts and the tensor-parallel region boundary.

``nn.Linear`` saves its input for the weight gradient (and its weight for the input gradient: a parameter, not
counted). Under autocast (``Precision.autocast``) each Linear casts its input and its weight to the compute dtype
and saves both casts: the input cast is one storage per Linear even when several read the same tensor (q, k, v),
and the weight cast exists once per step per weight ("autocast weight copies"). Without autocast Linears reading
one tensor save that one storage. Derived from ``torch.nn.functional.linear`` under ``torch.autocast``, checked by
``tests/activations``.
"""

from __future__ import annotations

from trainmath.model.spec import TensorSpec
from trainmath.ops.context import Ctx
from trainmath.ops.ir import Axis, Program, Tensor
from trainmath.placement import tp_axis


def cast(prog: Program, x: Tensor, dtype_bytes: int, name: str, note: str = "") -> Tensor:
    """``x.to(dtype)``: x itself when it already has that dtype, else a new tensor (nothing saved)."""
    if x.dtype_bytes == dtype_bytes:
        return x
    out = Tensor(name=name, axes=x.axes, dtype_bytes=dtype_bytes, note=note)
    prog.emit("cast", name, inputs=(x,), outputs=(out,))
    return out


def weight_axes(w: TensorSpec, copies: int | None = None) -> tuple[Axis, ...]:
    """A parameter's axes with the rule tensor parallelism splits it by (``placement.tp_axis``; ``vocab``
    tensors split only under a vocabulary-parallel layout); a routed expert's copies are a leading ``expert``
    axis."""
    axis = tp_axis(w)
    rule = "vocab" if w.shard == "vocab" else "tp"
    axes = tuple(Axis(n, rule if i == axis else None) for i, n in enumerate(w.shape))
    if w.experts:
        axes = (Axis(w.experts if copies is None else copies, "expert"), *axes)
    return axes


def weight_copy(ctx: Ctx, w: TensorSpec, copies: int | None = None) -> Tensor | None:
    """The compute-dtype cast of a parameter that autocast keeps for backward (None without autocast)."""
    if not ctx.p.autocast:
        return None
    name = w.name + "_cast" if w.name.endswith(".weight") else w.name + ".weight_cast"
    return Tensor(name=name, axes=weight_axes(w, copies), dtype_bytes=ctx.p.compute_bytes, kind="weight_copy")


def linear(prog: Program, ctx: Ctx, name: str, x: Tensor, out: Axis, *, weight: TensorSpec | None = None,
           out_dtype: int | None = None) -> Tensor:
    """``y = x Wᵀ (+ b)``: saves its input (its compute-dtype cast under autocast, unless the input already has
    that dtype) and, under autocast, the weight's cast. ``out`` is the output's last axis (with its sharding
    rule: ``tp`` for a column-parallel Linear, None for a row-parallel one, whose output is reduced whole);
    ``out_dtype`` defaults to the compute dtype."""
    c = ctx.p.compute_bytes
    xin = x
    if ctx.p.autocast and x.dtype_bytes != c:
        xin = Tensor(name=f"{name}.input_cast", axes=x.axes, dtype_bytes=c, note="autocast copy, one per Linear")
    y = Tensor(name=f"{name}.out", axes=(*x.axes[:-1], out), dtype_bytes=out_dtype or c)
    saved = [xin]
    if weight is not None:
        wc = weight_copy(ctx, weight)
        if wc is not None:
            saved.append(wc)
    prog.emit("linear", name, inputs=(x,), outputs=(y,), saved=saved, weight=weight)
    return y


def gather_seq(prog: Program, x: Tensor, name: str) -> Tensor:
    """Entering a tensor-parallel region: the sequence-parallel input is all-gathered along the sequence (the
    ``g`` of Korthikanti et al. 2022 Fig. 5). The output has the whole sequence (``seq``) of the tensor-parallel
    group; without sequence parallelism it is the input itself, which the fold sees as the same storage
    (``Tensor.base`` of the gathered tensor; ``fold.storage_on``). Under SP torch's ``PrepareModuleInput``
    all-gathers into a new tensor and the column-wise Linears save it (their casts under autocast); Megatron's
    ``LinearWithGradAccumulationAndAsyncCommunication`` saves the un-gathered shard and gathers again in backward,
    which this does not model. Measured: on 2 gloo ranks (``tests/memory/tp_oracle.py``) the per-rank fold equals
    what transformers' layers save under ``parallelize_module``, with and without SP (``docs/benchmarks.md``)."""
    axes = tuple(Axis(a.size, "seq") if a.shard == "seq_sp" else a for a in x.axes)
    out = Tensor(name=f"{name}.gathered", axes=axes, dtype_bytes=x.dtype_bytes, base=x, kind="gathered",
                 note="all-gathered over the sequence-parallel group")
    prog.emit("gather", name, inputs=(x,), outputs=(out,))
    return out


def reduce_seq(prog: Program, ctx: Ctx, y: Tensor, name: str) -> Tensor:
    """Leaving a tensor-parallel region: a row-parallel Linear's partial output is all-reduced, or reduce-scattered
    along the sequence under sequence parallelism (the ``ḡ`` of Korthikanti et al. 2022 Fig. 5), back to the
    residual stream's (b, s) axes. A fresh tensor: the partial output it reduces is saved by no op."""
    out = Tensor(name=f"{name}.reduced", axes=(*ctx.rows(), y.axes[-1]), dtype_bytes=y.dtype_bytes,
                 note="the row-parallel output, reduced")
    prog.emit("reduce", name, inputs=(y,), outputs=(out,))
    return out
