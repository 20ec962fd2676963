"""A decoder layer's op list as it runs under peft's LoRA: every base parameter frozen, LoRA branches on the
targeted Linears, and which tensors require grad.

What autograd saves follows from two facts of torch's derivative formulas (``tools/autograd/derivatives.yaml``):
a product saves each operand only for the *other* operand's gradient, and an op none of whose inputs requires
grad is not recorded at all. So, with the base frozen:

- a frozen Linear (``mm``/``addmm``) saves nothing for its weight's gradient: not its input; it still holds its
  weight for the input's gradient (a parameter, no new storage, or under autocast the weight's bf16 cast, which
  autocast does not cache for a tensor that needs no grad);
- an RMSNorm's last product ``weight * normalized`` saves no ``normalized`` (Gemma's ``(1 + w)`` and the fp32 weight
  casts stay: they are the operands the input's gradient needs); LayerNorm's kernel saves what it saves;
- an op whose inputs need no grad saves nothing: with a frozen embedding, layer 0 starts without gradients unless
  ``enable_input_require_grads()`` (what peft runs with gradient checkpointing) marks the embedding's output;
  tensors the op list does not produce (a residual sum) need grad once anything before them in the layer does;
  eager attention's contiguous output, kept for o_proj's weight gradient, is not kept for a frozen o_proj;
- a LoRA branch (peft's ``lora.Linear.forward``: ``result + lora_B(lora_A(dropout(x.to(A.dtype)))) * scaling``)
  saves lora_A's input (``x`` cast to the adapter dtype when it differs, a new tensor per module; under autocast
  its compute-dtype cast; with ``lora_dropout`` > 0 the dropout's output and mask instead) and the r-wide middle
  lora_B multiplies, and under autocast both adapter weights' casts.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from trainmath.ops.ir import Axis, Op, Tensor

FP32 = 4


@dataclass(frozen=True, kw_only=True)
class LoraRun:
    """The peft run of one layer: which Linear modules carry an adapter and in what dtypes."""

    targets: frozenset = field(default_factory=frozenset)
    """Module names relative to the layer (``self_attn.q_proj``) that peft wraps."""
    rank: int = 8
    adapter_bytes: int = FP32
    """The adapters' dtype (``--lora-dtype``)."""
    dropout: float = 0.0
    """peft's ``lora_dropout`` (0: ``nn.Identity``, nothing saved)."""
    input_grad: bool = True
    """The layer's input requires grad (every layer after the first adapted one; layer 0 with
    ``enable_input_require_grads``)."""
    device: str = "cuda"
    """Dropout keeps a bool mask on CUDA, its noise in the input's dtype on the CPU (as ``kernels.dropout``)."""
    wrapped: frozenset = field(default_factory=frozenset)
    """Ledger weight names (routed experts, routers) peft's ``ParamWrapper`` adapts (``target_parameters``): the
    weight the op reads is ``W + B·A``, which requires grad, so the op's output does."""


def module_of(op: Op) -> str:
    return op.weight.name.removesuffix(".weight") if op.weight is not None else op.name


def _root(t: Tensor) -> Tensor:
    while t.base is not None:
        t = t.base
    return t


def _branch(op: Op, run: LoraRun, autocast: bool, compute: int, x_grad: bool) -> list[Op]:
    """The ops peft adds after a targeted Linear ``op``: the input cast, dropout, lora_A, lora_B (lora_A keeps
    its weight's cast only for its input's gradient: ``x_grad``)."""
    x, name = op.inputs[0], module_of(op)
    rows, out_axis = x.axes[:-1], (op.outputs[0].axes[-1] if op.outputs else Axis(op.weight.shape[0]))
    ops: list[Op] = []
    xa = x
    if x.dtype_bytes != run.adapter_bytes:
        xa = Tensor(name=f"{name}.lora_input", axes=x.axes, dtype_bytes=run.adapter_bytes,
                    note="x.to(lora_A.weight.dtype), one per adapted Linear")
        ops.append(Op(kind="cast", name=f"{name}.lora_cast", inputs=(x,), outputs=(xa,)))
    if run.dropout > 0:
        mask = Tensor(name=f"{name}.lora_dropout.mask", axes=x.axes,
                      dtype_bytes=1 if run.device == "cuda" else xa.dtype_bytes)
        dropped = Tensor(name=f"{name}.lora_dropout.out", axes=x.axes, dtype_bytes=xa.dtype_bytes)
        ops.append(Op(kind="dropout", name=f"{name}.lora_dropout", inputs=(xa,), outputs=(dropped,), saved=(mask,)))
        xa = dropped
    act_bytes = compute if autocast else run.adapter_bytes
    a_in = xa
    if autocast and xa.dtype_bytes != compute:
        a_in = Tensor(name=f"{name}.lora_A.input_cast", axes=x.axes, dtype_bytes=compute,
                      note="autocast copy for lora_A")
    mid = Tensor(name=f"{name}.lora_A.out", axes=(*rows, Axis(run.rank)), dtype_bytes=act_bytes,
                 note="the r-wide middle, saved by lora_B")
    out = Tensor(name=f"{name}.lora_B.out", axes=(*rows, out_axis), dtype_bytes=act_bytes)
    in_f = op.weight.shape[-1] if not op.weight.transposed else op.weight.shape[0]
    out_f = out_axis.size
    copies_a = (Tensor(name=f"{name}.lora_A.weight_cast", axes=(Axis(run.rank), Axis(in_f)), dtype_bytes=compute,
                       kind="weight_copy"),) if autocast and x_grad else ()
    copies_b = (Tensor(name=f"{name}.lora_B.weight_cast", axes=(Axis(out_f), Axis(run.rank)), dtype_bytes=compute,
                       kind="weight_copy"),) if autocast else ()
    ops.append(Op(kind="lora", name=f"{name}.lora_A", inputs=(xa,), outputs=(mid,), saved=(a_in, *copies_a)))
    ops.append(Op(kind="lora", name=f"{name}.lora_B", inputs=(mid,), outputs=(out,), saved=(mid, *copies_b)))
    return ops


def grad_flow(ops: list[Op], run: LoraRun) -> list[tuple[Op, list[bool], bool]]:
    """Per op: (the op, which of its inputs require grad, whether peft adapts it), in forward order."""
    grad: set[int] = set()
    produced: set[int] = set()
    any_grad = False
    first = ops[0].inputs[0] if ops and ops[0].inputs else None

    def needs(t: Tensor) -> bool:
        r = _root(t)
        if id(t) in grad or id(r) in grad:
            return True
        if id(r) in produced or id(t) in produced:
            return False
        if first is not None and r is _root(first):
            return run.input_grad
        return any_grad

    out = []
    prev: list[bool] = []
    for op in ops:
        # an op with no listed inputs continues the op before it on an unlisted intermediate (gelu_new's tanh of
        # the polynomial in x that pow starts): that intermediate needs grad as the previous op's inputs did
        rg = [needs(t) for t in op.inputs] if op.inputs else [any(prev)]
        prev = rg
        target = op.kind == "linear" and op.weight is not None and module_of(op) in run.targets
        out.append((op, rg, target))
        # a rotary op maps q → q_rot and k → k_rot: each output needs grad as its own input does
        weight_grad = target or (op.weight is not None and op.weight.name in run.wrapped)
        flags = rg if op.kind == "rotary" and len(rg) == len(op.outputs) else [any(rg) or weight_grad] * len(op.outputs)
        for t, g in zip(op.outputs, flags):
            produced.add(id(t))
            if g:
                grad.add(id(t))
        any_grad = any_grad or any(rg) or weight_grad
    return out


def _saved(op: Op, rg: list[bool]) -> tuple[Tensor, ...]:
    """What ``op`` saves with its parameters frozen and ``rg`` its inputs' requires-grad flags."""
    if op.kind == "linear" and op.weight is not None:
        return tuple(t for t in op.saved if t.kind == "weight_copy") if any(rg) else ()
    if not any(rg):
        return ()
    if op.kind == "norm" and op.weight is not None:
        return tuple(t for t in op.saved if not t.name.endswith((".normalized", ".normalized_fp32")))
    if op.kind == "attention" and op.kernel == "eager":
        # the contiguous output is listed for o_proj's weight gradient, which a frozen o_proj does not take;
        # and each bmm keeps an operand only for the other's gradient: Q for K's, K for Q's, P for V's
        q, k, v = rg[:3]
        need = {"eager.query": k, "eager.key": q, "eager.probs": v, "eager.probs_autocast": v}
        return tuple(t for t in op.saved if not any(t is o for o in op.outputs) and need.get(t.name, True)
                     and (q or k or t.name.startswith("eager.probs")))
    if op.kind == "mul" and len(op.inputs) == 2:  # each operand is saved for the other's gradient
        roots = [_root(t) for t in op.inputs]
        return tuple(t for t in op.saved if not any(_root(t) is roots[i] and not rg[1 - i] for i in (0, 1)))
    return op.saved


def lora_layer(ops: list[Op], run: LoraRun, *, autocast: bool, compute: int) -> list[Op]:
    """``ops`` with the frozen base's saves and the LoRA branches (see the module docstring)."""
    out: list[Op] = []
    for op, rg, target in grad_flow(ops, run):
        out.append(Op(kind=op.kind, name=op.name, inputs=op.inputs, outputs=op.outputs, saved=_saved(op, rg),
                      kernel=op.kernel, weight=op.weight, window=op.window, chunk=op.chunk, cache=op.cache,
                      note=op.note))
        if target:
            out += _branch(op, run, autocast, compute, any(rg))
    return out


def frozen_head(ops: list[Op]) -> list[Op]:
    """The final norm, LM head and loss with every parameter frozen (their input requires grad)."""
    return lora_layer(ops, LoraRun(), autocast=False, compute=2)
