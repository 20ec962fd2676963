"""Feed-forward networks (dense MLPs and one expert's computation over its rows).

Gated (``down(act(gate(x)) * up(x))``, SwiGLU / GeGLU): the activation keeps its input (gate's output), the
product keeps both factors (the activation's output and up's output), down keeps the product: 4·c·T·f beside the
input. Fused ``gate_up_proj`` (Phi-3, chunked): gate and up are views of one (T, 2f) output, which the activation
and the product both keep (2·c·T·f, counted once): the same 4·c·T·f. Plain (``down(act(up(x)))``): the
activation's input and down's input (c·T·f each). ``relu2`` (Nemotron-H: ``relu(x)²``): the relu output is kept
by relu and by pow, the square by down. Derived from the modeling code, checked by ``tests/activations``.

Sharding (``parallelize_module``: column-wise gate/up, row-wise down): the width f is ÷tp; the input is the whole
sequence of the group (``linear.gather_seq``), down's output is reduced whole.
"""

from __future__ import annotations

from trainmath.model.spec import Block
from trainmath.ops.context import Ctx
from trainmath.ops.ir import Axis, Program, Tensor
from trainmath.ops.kernels.attention import find
from trainmath.ops.kernels.linear import gather_seq, linear

ACTS = ("silu", "gelu_tanh", "gelu", "relu2")


def _act_out(name: str, like: Tensor) -> Tensor:
    return Tensor(name=name, axes=like.axes, dtype_bytes=like.dtype_bytes)


def gated_mlp(prog: Program, ctx: Ctx, block: Block, x: Tensor, *, width: int, prefix: str = "mlp",
              act: str = "silu", gather: bool = True) -> Tensor:
    """Append a gated MLP of ``width`` reading ``x``; returns down's output. ``gather=False`` when ``x`` is
    already inside the tensor-parallel region (read by another block too)."""
    xg = gather_seq(prog, x, f"{prefix}.input") if gather else x
    fused = find(block, f"{prefix}.gate_up_proj", "linear")
    wide = Axis(width, "tp")
    if fused is not None:
        gu = linear(prog, ctx, f"{prefix}.gate_up_proj", xg, Axis(2 * width, "tp"), weight=fused)
        gate = gu.view(f"{prefix}.gate", *gu.axes[:-1], wide, note="gate and up are views of it")
        up = gu.view(f"{prefix}.up", *gu.axes[:-1], wide)
    else:
        gate = linear(prog, ctx, f"{prefix}.gate_proj", xg, wide, weight=find(block, f"{prefix}.gate_proj", "linear"))
        up = linear(prog, ctx, f"{prefix}.up_proj", xg, wide, weight=find(block, f"{prefix}.up_proj", "linear"))
    a = _act_out(f"{prefix}.act_out", gate)
    prog.emit("act", f"{prefix}.act_fn", inputs=(gate,), outputs=(a,), saved=(gate,), kernel=act)
    prod = _act_out(f"{prefix}.down_proj.input", gate)
    prog.emit("mul", f"{prefix}.gate_mul", inputs=(a, up), outputs=(prod,), saved=(a, up))
    return linear(prog, ctx, f"{prefix}.down_proj", prod, Axis(ctx.d),
                  weight=find(block, f"{prefix}.down_proj", "linear"))


def plain_mlp(prog: Program, ctx: Ctx, block: Block, x: Tensor, *, width: int, up: str, down: str,
              prefix: str = "mlp", act: str = "gelu_tanh", gather: bool = True) -> Tensor:
    """Append ``down(act(up(x)))`` (module names ``up``/``down`` under ``prefix``); returns down's output."""
    xg = gather_seq(prog, x, f"{prefix}.input") if gather else x
    u = linear(prog, ctx, f"{prefix}.{up}", xg, Axis(width, "tp"), weight=find(block, f"{prefix}.{up}", "linear"))
    a = _act_out(f"{prefix}.{down}.input", u)
    if act == "relu2":
        r = _act_out(f"{prefix}.relu_out", u)
        prog.emit("act", f"{prefix}.relu", inputs=(u,), outputs=(r,), saved=(r,), kernel="relu")
        prog.emit("act", f"{prefix}.square", inputs=(r,), outputs=(a,), saved=(r,), kernel="pow")
    else:
        prog.emit("act", f"{prefix}.act", inputs=(u,), outputs=(a,), saved=(u,), kernel=act)
    return linear(prog, ctx, f"{prefix}.{down}", a, Axis(ctx.d), weight=find(block, f"{prefix}.{down}", "linear"))
