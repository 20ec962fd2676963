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

ACTS = ("silu", "gelu_tanh", "gelu", "gelu_new", "relu2")


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
    elif act == "gelu_new":
        gelu_new(prog, u, a, f"{prefix}.act")
    else:
        prog.emit("act", f"{prefix}.act", inputs=(u,), outputs=(a,), saved=(u,), kernel=act)
    return linear(prog, ctx, f"{prefix}.{down}", a, Axis(ctx.d), weight=find(block, f"{prefix}.{down}", "linear"))


def gelu_new(prog: Program, x: Tensor, out: Tensor, prefix: str) -> None:
    """transformers' ``NewGELUActivation`` (GPT-2's ``gelu_new``) as the Python tensor ops it is written in:
    ``0.5 * x * (1 + tanh(sqrt(2/π) * (x + 0.044715 * x³)))``. ``pow`` keeps x, ``tanh`` its output, the last
    product its two factors ``0.5·x`` and ``1 + tanh`` (products by Python floats and the adds keep nothing):
    4·c·T·f beside the output, where ``F.gelu(approximate="tanh")`` keeps only x. Derived from the code, checked by
    ``tests/activations``."""
    t = _act_out(f"{prefix}.tanh_out", x)
    half = _act_out(f"{prefix}.half_x", x)
    one_plus = _act_out(f"{prefix}.one_plus_tanh", x)
    prog.emit("act", f"{prefix}.pow", inputs=(x,), saved=(x,), kernel="pow", note="x³ keeps x")
    prog.emit("act", f"{prefix}.tanh", outputs=(t,), saved=(t,), kernel="tanh")
    prog.emit("mul", f"{prefix}.half_x", inputs=(x,), outputs=(half,), note="0.5·x: a Python float keeps nothing")
    prog.emit("add", f"{prefix}.one_plus_tanh", inputs=(t,), outputs=(one_plus,))
    prog.emit("mul", f"{prefix}.product", inputs=(half, one_plus), outputs=(out,), saved=(half, one_plus))
