"""A frozen MLP's backward under LoRA: what it holds at its peak beside the layer's saved tensors.

Full training's term (``timeline.ffn_backward_transient``) is the down projection's weight gradient plus 2·c·T·f
(gated) or c·T·f (plain): the down projection's backward makes the gradient of its input h (c·T·f) and frees h,
which it saved for its weight's gradient; ``mul``'s backward then returns two gradients (gated), the activation's
one (plain). With the base frozen (``ops.lora``: a frozen Linear saves nothing for its weight) nothing saved h, so
nothing is freed when its gradient is made, and there is no weight gradient:

- ``mul``'s backward (gated: ``down(act(gate(x)) * up(x))``) holds the gradient of h and the two it returns,
  3·c·T·f; a plain MLP's activation backward holds the gradient of h and its own, 2·c·T·f;
- a LoRA branch on the down projection runs its backward first (peft's ``result + lora_B(lora_A(x)) * scaling``:
  the branch is recorded after the base Linear, so autograd runs it first) and frees what only it saved (lora_A's
  input, h itself when no cast was needed, and the r-wide middle) before ``mul``'s backward runs.

Measured: the runtime's FSDP2 ranks (gloo) and FSDPMemTracker over a fake process group give the same peak of a
LoRA step on the tests' shrunk Qwen3, inside layer 1's MLP backward (``tests/train/test_peft_train.py``,
``docs/benchmarks.md``: q_proj,v_proj targets, exact to the bytes of the loop's loss).
"""

from __future__ import annotations

from trainmath.memory import states as st
from trainmath.ops.fold import saved_storages
from trainmath.ops.lora import module_of


def down_projection(ops) -> str | None:
    """The module name of the layer's last Linear (the MLP's down projection), None without one."""
    linears = [op for op in ops if op.kind == "linear" and op.weight is not None]
    return module_of(linears[-1]) if linears else None


def freed_by_down_branch(ops) -> int:
    """Bytes of the saved storages that only the down projection's LoRA branch holds (0 when not adapted)."""
    down = down_projection(ops)
    if down is None:
        return 0
    mine = [op for op in ops if op.name.startswith(f"{down}.lora")]
    others = {id(s) for _, s in saved_storages([op for op in ops if op not in mine])}
    return sum(s.nbytes() for _, s in saved_storages(mine) if id(s) not in others)


def frozen_ffn_backward_transient(peft_ops, *, tokens: int, intermediate: int, gated: bool, compute_bytes: int,
                                  granularity: int, tp: int = 1) -> int:
    """Bytes a frozen MLP's backward holds at its peak beyond the layer's saved tensors and its output gradient
    (module docstring): (3 gated, 2 plain) · c·T·f/tp, less what the down projection's LoRA branch has freed."""
    from trainmath.arith import ceil_div

    a = st.alloc_bytes(compute_bytes * tokens * ceil_div(intermediate, tp), granularity)
    return max(0, (3 if gated else 2) * a - freed_by_down_branch(peft_ops))


def mlp_needs_grad(peft_ops) -> bool:
    """Whether the MLP's backward runs: the ops between the layer's last norm and its down projection save
    something (with the base frozen, an op saves only when one of its inputs requires grad)."""
    down = down_projection(peft_ops)
    norms = [j for j, op in enumerate(peft_ops) if op.kind == "norm"]
    start = norms[-1] + 1 if norms else 0
    end = next((j for j, op in enumerate(peft_ops) if op.kind == "linear" and module_of(op) == down), len(peft_ops))
    return bool(saved_storages(peft_ops[start:end]))


def ffn_transients(spec, setup, layout, prec, gran: int, ops_by_layer: dict) -> dict[int, int]:
    """layer index → ``frozen_ffn_backward_transient`` of its dense MLP (0 for MoE layers, whose frozen experts'
    backward is not modelled here, and where the MLP runs no backward); ``ops_by_layer``: ``memory.peft.layer_ops``."""
    from trainmath.arith import ceil_div
    from trainmath.model.spec import MLPDims

    tokens = setup.micro_batch * ceil_div(setup.seq, layout.cp)
    out = {}
    for i, (_, ops, _) in ops_by_layer.items():
        mlp = [b.dims for b in spec.layers[i].blocks if isinstance(b.dims, MLPDims)]
        out[i] = frozen_ffn_backward_transient(
            ops, tokens=tokens, intermediate=mlp[-1].intermediate, gated=mlp[-1].gated,
            compute_bytes=prec.compute_bytes, granularity=gran, tp=layout.tp) if mlp and mlp_needs_grad(ops) else 0
    return out
