"""A checkpointed layer's recompute under peft: the moment inside its backward where the recomputed forward
peaks (``gradient_checkpointing_enable``, non-reentrant ``torch.utils.checkpoint`` with early stop).

The layer's first backward node that unpacks a saved tensor reruns its forward, which saves its tensors again
and, like any forward, holds its intermediates while it runs: the Python frame's references (the attention's
residual sum, the MLP input that ``up_proj`` still needs, ``up_proj``'s base output waiting for the gate's
product) and, inside each LoRA Linear (peft's ``result + lora_B(lora_A(x)) * scaling``), lora_B's output beside
its scaled copy; a module's input (``mlp.input``, a LoRA Linear's input) lives until the module returns. Meanwhile the
gradients the backward made before the unpack stay alive: when the layer's last
saving op is a LoRA branch, the scaled gradient of that branch (adapter or compute dtype) and, if the branch
summed in another dtype than the base's output, the base output's gradient cast back. Recomputation stops at
the last op that saves a tensor (early stop). Walked over the layer's peft op list in execution order
(``down(act(gate(x)) * up(x))`` runs the activation right after ``gate_proj``). Measured against MemTracker
(``tests/memory/test_peft_recompute.py``) and FSDPMemTracker (``benchmarks/peft_memory.py --fsdp 8 --seq 4096``)."""

from __future__ import annotations

from dataclasses import dataclass

from trainmath.memory import states as st
from trainmath.ops.ir import Op, Tensor
from trainmath.ops.lora import module_of


@dataclass(frozen=True, kw_only=True)
class Recompute:
    """The recompute's peak, bytes, relative to the layer's backward moment (all its tensors recomputed)."""

    not_yet: int
    """The layer's saved storages the recompute has not made again by its peak."""
    transient: int
    """Forward intermediates live at the peak that no op has saved (yet)."""
    grads: int
    """Gradients the layer's backward made before the recompute, beyond its output's."""


def _base(t: Tensor) -> Tensor:
    while t.base is not None:
        t = t.base
    return t


def execution_order(ops: list[Op]) -> list[Op]:
    """``ops`` as Python runs them: an activation whose input is a Linear's output runs right after that Linear
    (and its LoRA branch), as in ``down(act(gate(x)) * up(x))``."""
    out = list(ops)
    for op in list(out):
        if op.kind != "act" or len(op.inputs) != 1:
            continue
        src = _base(op.inputs[0])
        j = next((k for k, p in enumerate(out) if p.kind == "linear" and any(o is src for o in p.outputs)), None)
        if j is None:
            continue
        name = module_of(out[j])
        end = j
        while end + 1 < len(out) and out[end + 1].name.startswith(f"{name}.lora"):
            end += 1
        out.remove(op)
        out.insert(end + 1, op)
    return out


def recompute_peak(ops: list[Op], *, granularity: int = 1) -> Recompute:
    """The recompute's peak over the peft op list ``ops`` of one layer (module docstring)."""
    order = execution_order(ops)
    alias: dict[int, Tensor] = {}

    def root(t: Tensor) -> Tensor:
        t = _base(t)
        while id(t) in alias:
            t = alias[id(t)]
        return t

    for op in order:  # a gather / reduce on one rank is the same storage
        if op.kind in ("gather", "reduce") and len(op.inputs) == 1 and len(op.outputs) == 1:
            alias[id(op.outputs[0])] = root(op.inputs[0])
    tensors: dict[int, Tensor] = {}
    first: dict[int, int] = {}
    last: dict[int, int] = {}
    saved: list[set] = []
    produced: set[int] = set()
    for k, op in enumerate(order):
        for t in (*op.inputs, *op.outputs):
            r = root(t)
            tensors[id(r)] = r
            first.setdefault(id(r), k)
            last[id(r)] = k
        produced |= {id(root(t)) for t in op.outputs}
        mine = set()
        for s in op.saved:
            r = root(s)
            tensors[id(r)] = r
            mine.add(id(r))
        saved.append(mine)
    for k, op in enumerate(order):  # a module's input stays in its forward's frame until the module returns
        if op.kind == "gather" and op.name.endswith(".input") and op.outputs:
            prefix = op.name.removesuffix("input")
            end = max(j for j, p in enumerate(order) if p.name.startswith(prefix))
            r = id(root(op.outputs[0]))
            last[r] = max(last[r], end)
    for k, op in enumerate(order):  # a LoRA Linear's input stays in its frame until the branch's sum returns
        if op.name.endswith(".lora_B"):
            base = next((p for p in order if p.kind == "linear" and module_of(p) == op.name[:-len(".lora_B")]), None)
            if base is not None and base.inputs:
                r = id(root(base.inputs[0]))
                last[r] = max(last.get(r, k), k)
    everything = set().union(*saved) if saved else set()
    layer_input = id(root(order[0].inputs[0])) if order and order[0].inputs else None
    # a tensor no listed op makes (a residual sum) lives in the frame to the layer's end
    frame = {r for r in tensors if r not in produced and r not in everything and r != layer_input}

    def size(r: int) -> int:
        return st.alloc_bytes(tensors[r].nbytes(), granularity)

    total = sum(size(r) for r in everything)
    stop = max((k for k, s in enumerate(saved) if s), default=-1)
    best = (0, total, 0)
    now: set[int] = set()
    for k, op in enumerate(order[:stop + 1]):
        now |= saved[k]
        live = {r for r in tensors if r not in now and r != layer_input and r in first and first[r] <= k
                and (last[r] >= k or r in frame)}
        scaled = size(id(root(op.outputs[0]))) if op.name.endswith(".lora_B") and op.outputs and k < stop else 0
        transient = sum(size(r) for r in live) + scaled
        here = sum(size(r) for r in now)
        if here + transient > best[0]:
            best = (here + transient, total - here, transient)
    grads = 0
    if stop >= 0 and order[stop].name.endswith(".lora_B") and order[stop].outputs:
        out = order[stop].outputs[0]
        grads = st.alloc_bytes(out.nbytes(), granularity)
        base = next((p for p in order if p.kind == "linear" and module_of(p) == order[stop].name[:-len(".lora_B")]),
                    None)
        if base is not None and base.outputs and base.outputs[0].dtype_bytes != out.dtype_bytes:
            grads += st.alloc_bytes(base.outputs[0].nbytes(), granularity)
    return Recompute(not_yet=best[1], transient=best[2], grads=grads)
