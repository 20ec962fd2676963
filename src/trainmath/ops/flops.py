"""GEMM FLOPs of the linears as a fold over an op list, on one rank of a layout.

Each ``linear`` op with a weight is one GEMM (``flops.gemm.Gemm``): m = the rows of its input (the product of the
input's axes but the last, on the rank: the tokens, or the routed rows of an expert op, whole under expert
parallelism, whose ranks each bring their own micro-batch, see ``ir.SHARDS``), and k, n = the weight's in and out
features (``flops.gemm._in_out``), each divided as the op's tensors are: n by the rule of the output's last axis
(``tp``: a column-parallel Linear), k by the input's (``tp``: a row-parallel one). Names and components are the
weight's, as ``flops.gemm.linear_gemms`` gives them, so the FLOPs trees keep their names. A fused expert projection
whose gate and up are stored apart is one op per weight, the later ones without an output of their own: they produce
the other columns of the first one's output, under its rule.

Experts (``experts``): ``active`` (default, the convention of ``trainmath flops``: each token runs its top_k
experts) counts an ``all_tokens`` op (Llama 4, ``kernels.experts.all_tokens_experts``: every expert over every
token, n·T rows) as T·top_k rows; ``executed`` counts the rows the kernel runs, n / top_k times more, which is
what FlopCounterMode reports for Llama 4 (``tests/flops/test_oracle_hybrid.py``). Every other expert path runs
exactly T·top_k rows, so both conventions agree there.

At ``Degrees()`` the fold equals ``linear_gemms`` over the layer's blocks for every catalog model
(``tests/ops/test_flops_fold.py``); FlopCounterMode checks those on tiny models (``tests/flops``).
"""

from __future__ import annotations

from collections.abc import Iterable

from trainmath.arith import ceil_div
from trainmath.errors import TrainmathError
from trainmath.flops.gemm import Gemm, _in_out, _module
from trainmath.model.spec import LayerSpec, ModelSpec
from trainmath.ops import families
from trainmath.ops.context import Ctx, Family, Precision, Router
from trainmath.ops.ir import SINGLE, Degrees, Op, Program

EXPERT_COUNTS = ("active", "executed")


def _rows(op: Op, deg: Degrees, experts: str, top_k: int | None) -> int:
    """m: the rows of the op's input on the rank (active rows of an ``all_tokens`` op, see the module doc)."""
    axes = op.inputs[0].axes[:-1]
    if op.kernel == "all_tokens" and experts == "active":
        if not top_k or len(axes) != 1 or op.weight is None or not op.weight.experts:
            raise TrainmathError(f"{op.name}: counting active experts needs the block's top_k (got {top_k!r}) "
                                 "and one routed-row axis")
        full = axes[0].size // op.weight.experts * top_k
        return ceil_div(full, deg.split(axes[0].shard))
    m = 1
    for a in axes:
        m *= a.on(deg)
    return m


def linear_gemms_from_ops(ops: Iterable[Op], deg: Degrees = SINGLE, *, experts: str = "active",
                          top_k: int | None = None) -> list[Gemm]:
    """One GEMM per ``linear`` op with a weight, with its (m, k, n) on one rank of ``deg``. ``top_k``: the routed
    experts per token, needed only to count an ``all_tokens`` op's active rows."""
    if experts not in EXPERT_COUNTS:
        raise TrainmathError(f"experts must be one of {', '.join(EXPERT_COUNTS)}; got {experts!r}")
    out = []
    rule = None
    for op in ops:
        if op.kind != "linear" or op.weight is None:
            continue
        if op.outputs:
            rule = op.outputs[0].axes[-1].shard
        elif rule is None:
            raise TrainmathError(f"linear op {op.name} has no output and follows no fused projection")
        k, n = _in_out(op.weight)
        out.append(Gemm(name=_module(op.weight.name), component=op.weight.component,
                        m=_rows(op, deg, experts, top_k), k=ceil_div(k, deg.split(op.inputs[0].axes[-1].shard)),
                        n=ceil_div(n, deg.split(rule))))
    return out


def layer_ops(spec: ModelSpec, layer: LayerSpec, *, batch: int, seq: int, experts: str = "eager") -> list[Op]:
    """The op list ``trainmath memory`` folds for one decoder layer of ``spec``, in a bf16 model (dtypes change
    no FLOPs), with the family switches of the spec's config (``spec.options``)."""
    style = families.style(spec.model_type)
    config = {**spec.options, "model_type": spec.model_type}
    ctx = Ctx(b=batch, s=seq, d=spec.hidden_size, p=Precision(compute=2, param=2),
              eager=style.attention == "eager", experts=experts, router=Router.from_config(config),
              family=Family.from_config(config))
    prog = Program()
    families.LAYERS[spec.model_type](prog, ctx, layer, style)
    return prog.ops


def layer_top_k(layer: LayerSpec) -> int | None:
    """The routed experts per token of a layer's MoE block (None without one)."""
    return next((b.dims.top_k for b in layer.blocks if getattr(b.dims, "top_k", 0)), None)
