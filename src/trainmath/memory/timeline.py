"""One training step of one rank as a timeline of events, each with the bytes live at that moment.

The step is ``out = model(ids, labels=ids); out.loss.backward(); opt.step(); opt.zero_grad()``, run as a function
(the model output is dropped when the step returns), one micro-batch after another:

- ``step start``: weights, master weights, optimizer states (after the first step), and the gradients when they
  outlive the step (``grad_lifetime``), and the data-parallel wrapper's buffers;
- ``forward layer i``: the saved tensors of layers 0..i accumulate (plus what the embedding and the rotary
  embedding keep); under ZeRO-3 (FSDP2) the unsharded parameters of layer i and of layer i+1, prefetched;
- ``forward: loss``: the head's saved tensors, the logits and their fp32 upcast, alive together with
  ``log_softmax``'s output just before the upcast is dropped;
- ``backward: loss``: the two fp32 gradients of cross-entropy's backward (``nll_loss_backward`` and
  ``log_softmax_backward``) beside the log-probabilities they read (the labels nll_loss saved are freed by then);
- ``backward: head``: the LM head's weight gradient appears; the loss's tensors are freed;
- from ``backward: loss`` to the end of the step the loop holds what ``LOOP_KEEPS`` says: the whole output
  (``out = model(...)``: the logits and the loss) or the loss alone (``loss = model(...).loss``);
- ``backward layer i`` (i from the last down): its first backward ops, the MLP's, with every saved tensor of the
  layer (under full recompute: the recomputed ones) still alive, the gradient of the layer's output, and what the
  MLP's backward has made so far (``ffn_backward_transient``; a MoE layer on the eager loop: its routed weights'
  gradient buffers, ``eager_experts_backward_transient``); ``backward layer i done``: its saved tensors are
  freed and all its weight gradients exist, beside the gradient of its input;
- ``optimizer step``: every gradient, plus the implementation's temporaries (``optimizers.step_temporary_bytes``);
- ``zero_grad``: set_to_none frees the gradients.

``peak_bytes`` is the largest event. Op-level transients inside one layer's forward or backward (an MLP's
intermediate gradients, a kernel's workspace) are not events: the model is a lower bound by those bytes, which
the MemTracker oracle test bounds (``tests/memory/test_memtracker_oracle.py``).

Gradient lifetime (``GRAD_LIFETIMES``), the convention every tool picks silently:

- ``set_to_none`` (torch's and the HF Trainer's default ``zero_grad``): no gradient exists when the step starts;
  each layer's appear during its backward;
- ``zero``: ``zero_grad(set_to_none=False)``: gradients persist between steps, zeroed;
- ``accumulate``: gradient accumulation over micro-batches (and any pipeline schedule): the last micro-batch runs
  with every gradient already allocated; what ``micro_batches > 1`` implies under ``set_to_none`` as well.

Data-parallel buffers: ZeRO-0 with dp·cp > 1 is torch DDP, whose buckets hold a copy of every gradient for the
whole step (``gradient_as_bucket_view=False``, the default); with ``bucket_view`` the gradients are views of the
buckets, so the gradients are allocated for the whole step and the buckets add nothing. ZeRO-1/2 is DeepSpeed
(one reduce bucket for the whole step; ZeRO-2's partitioned gradients appear during backward like any other), or,
with ``zero_impl="trainmath"``, our runtime's flat buffers (``flat_zero``: no bucket; the reduce, step and
all-gather as events; our ZeRO-3 likewise, without FSDP2's prefetch).
ZeRO-3 is FSDP2 (``fully_shard`` per decoder layer and at the root, ``reshard_after_forward=True``), whose events
are ``fsdp2.step_timeline``'s (all-gather outputs, unsharded parameters and gradients, reduce-scatter buffers as
torch's ``_fully_shard`` holds them; also FSDP2's ZeRO-2 with ``zero_impl="fsdp2"``). Checked:
DDP (both bucket modes) and FSDP2 against MemTracker / FSDPMemTracker over a fake process group
(``tests/memory/test_memtracker_oracle.py``); our flat ZeRO-1/2 against MemTracker on gloo ranks
(``tests/train/test_measure.py``); DeepSpeed's ZeRO-1/2 buffers are not checked. torch's ZeRO-1 (DDP with
``ZeroRedundancyOptimizer``) holds DDP's buckets, Ψ gradient elements, which is DeepSpeed's bucket below 5e8
parameters (measured equal to the byte on the tiny models of ``benchmarks/train_verify.py``).
"""

from __future__ import annotations

from trainmath.arith import ceil_div, numel
from trainmath.layout import ParallelLayout
from trainmath.memory import flat_zero as fz
from trainmath.memory import states as st
from trainmath.memory.precision import Precision
from trainmath.memory.step import Event, StepInputs, acts_at
from trainmath.placement import Placement
from trainmath.tree import Node

GRAD_LIFETIMES = ("set_to_none", "zero", "accumulate")
LOOP_KEEPS = ("output", "loss")
"""What the training loop keeps of the model's output through backward and the optimizer step: ``output``
(``out = model(ids, labels=ids); out.loss.backward()``: the logits live until the step returns) or ``loss``
(``loss = model(ids, labels=ids).loss``: the output object, and with it the logits, is dropped when the forward
returns; nothing saves them for backward — ``log_softmax`` saves its output, the LM head its input — so only the
4-byte loss outlives the forward). The HF Trainer's ``compute_loss`` and ``trainmath train`` are ``loss``.
Measured: on a 2-layer Qwen3 (vocabulary 256, 2 × 64 tokens, fp32) the peak of a ``loss`` step is the logits'
131,072 bytes below the ``output`` step's (MemTracker)."""


def _flat_reduce(u) -> int:
    """Our flat ZeRO-2's buffers while a unit is reduce-scattered: the packed buffer, the shard it reduces into
    and the ring's receive window (the unit's full gradients are counted as gradients)."""
    return u.buffer_bytes + u.grad_shard_bytes + u.ring_window_bytes


def _layer_units(inp: StepInputs) -> list[str]:
    return [f"layer.{i}" for i in inp.layers]


def step_timeline(inp: StepInputs) -> tuple[Event, ...]:
    """The events of one step on one rank (see the module docstring), in order."""
    if inp.fsdp2:
        from trainmath.memory import fsdp2

        return fsdp2.step_timeline(inp)
    all_grads = sum(inp.unit_grads.values())
    root = sum(inp.unit_gathered.get(u, 0) for u in ("embed", "head"))
    events: list[Event] = []

    flat = inp.flat
    sharded_grads = inp.flat_stage >= 2  # our ZeRO-2/3: gradient shards all step, a unit's full ones until reduced
    shards = sum(u.grad_shard_bytes for u in flat.values()) if sharded_grads else 0

    def ev(name: str, *, acts: Node, grads: int, gather: int = 0, reduce: int = 0, logits: int = 0, up: int = 0,
           ce: int = 0, hidden: int = 0, copies: int = 0, temps: int = 0, fp32g: int = 0, buffers: int = 0,
           reduced: bool = False) -> None:
        g = all_grads if inp.grads_persist and not reduced else grads  # ``reduced``: our flat ZeRO's own figure
        overhead = inp.persistent.get("framework_overhead_bytes", 0) + buffers
        parts = {**inp.persistent, "framework_overhead_bytes": overhead, "gradients_bytes": shards + g,
                 "activations_bytes": acts, "logits_bytes": logits,
                 "logits_fp32_bytes": up, "cross_entropy_grad_bytes": ce, "activation_grads_bytes": hidden,
                 "weight_copies_bytes": copies, "zero3_gather_bytes": gather, "zero3_grad_reduce_bytes": reduce,
                 "optimizer_step_temporaries_bytes": temps, "optimizer_fp32_grads_bytes": fp32g}
        events.append(Event(name=name, parts=parts))

    none = Node.of("activations_bytes", [], "bytes")
    ev("step start", acts=none, grads=0)

    def gathered(i: int, direction: int) -> int:
        """Unsharded parameters while layer position ``i`` runs: it, the next one prefetched, and the root."""
        layer_units = _layer_units(inp)
        mine = inp.unit_gathered.get(layer_units[i], 0)
        if inp.flat_stage == 3:  # our ZeRO-3 gathers the unit that runs, no prefetch
            return root + mine
        j = i + direction
        nxt = inp.unit_gathered.get(layer_units[j], 0) if 0 <= j < len(layer_units) else 0
        return root + mine + nxt

    cache = inp.autocast_cache
    layer_casts = [cache.get(f"layer.{i}", 0) for i in inp.layers]
    head_cast = cache.get("head", 0)

    def casts(pos: int | None = None, done: bool = False) -> int:
        """Cached casts nothing else holds (``StepInputs.autocast_cache``): at the loss (``pos`` None), in the
        backward of layer position ``pos``, or once it is ``done``."""
        if pos is None:
            return 0 if inp.casts_saved else sum(layer_casts)
        later = layer_casts[pos + (0 if done else 1):] if inp.casts_saved else \
            layer_casts if done else layer_casts[:pos] + layer_casts[pos + 1:]
        return head_cast + sum(later)

    kept: list[int] = []
    for pos, i in enumerate(inp.layers):
        kept.append(i)
        ev(f"forward layer {i}", acts=acts_at(inp, kept), grads=0, gather=gathered(pos, +1),
           copies=inp.weight_copies)
    # FSDP2's root pre-backward hook all-gathers the last layer before the loss's backward runs
    first_bwd = root + (inp.unit_gathered.get(_layer_units(inp)[-1], 0) if inp.layers and inp.flat_stage != 3
                        else 0)
    if inp.last:
        ev("forward: loss", acts=acts_at(inp, kept), grads=0, gather=root, logits=inp.head_saved + inp.logits,
           up=inp.logits_fp32, copies=inp.weight_copies)
        ev("backward: loss", acts=acts_at(inp, kept), grads=0, gather=first_bwd,
           logits=inp.head_saved - inp.loss_freed + inp.output_held,
           ce=inp.cross_entropy_grads, copies=inp.weight_copies + casts())
    grads = 0
    held = inp.output_held if inp.last else 0
    unit_grads = inp.unit_grads
    if sharded_grads:  # full gradients until their unit's reduce-scatter; the root's until the embedding's
        unit_grads = {k: v for u in flat.values() for k, v in u.full_grads.items()}
    if inp.last:
        grads += unit_grads.get("head", 0) + ((inp.tied_grad or unit_grads.get("embed", 0)) if inp.tied_head else 0)
        ev("backward: head", acts=acts_at(inp, kept), grads=grads, gather=first_bwd,
           reduce=inp.unit_full_grads.get("head", 0), logits=inp.head_saved + held, hidden=inp.hidden_grad,
           copies=inp.weight_copies + casts())
    for pos in range(len(inp.layers) - 1, -1, -1):
        i = inp.layers[pos]
        unit = f"layer.{i}"
        ev(f"backward layer {i}", acts=acts_at(inp, kept, live_layer=i), grads=grads, gather=gathered(pos, -1),
           reduce=inp.unit_full_grads.get(unit, 0), logits=held,  # the MLP's backward transient with the grads
           hidden=inp.hidden_grad + inp.ffn_transient.get(i, 0), copies=inp.weight_copies + casts(pos))
        kept.pop()
        grads += unit_grads.get(unit, 0)
        # our ZeRO-2 reduces the layer now: its packed buffer and gradient shard beside its full gradients; its
        # last gradient is the input norm's, whose input gradient then lives beside the residual stream's
        red = _flat_reduce(flat[unit]) if sharded_grads else 0
        ev(f"backward layer {i} done", acts=acts_at(inp, kept), grads=grads, gather=gathered(pos, -1),
           reduce=inp.unit_full_grads.get(unit, 0), logits=held, hidden=inp.hidden_grad * (2 if red else 1),
           copies=inp.weight_copies + casts(pos, done=True), buffers=red)
        if sharded_grads:
            grads -= unit_grads.get(unit, 0)
    batch = Node.of("activations_bytes", [Node(name="input batch", value=inp.batch, unit="bytes",
                                               note="held by the training loop until the step returns")],
                    "bytes") if inp.first and inp.batch else none
    if inp.first and inp.tied_head and inp.tied_grad:
        # a tied embedding's weight already holds the head's gradient: the lookup's backward makes a second one
        # and autograd's accumulation their sum, three vocabulary × hidden tensors at once. By then every other
        # embedding gradient exists (a position embedding's) and the lookup's input gradient and what the
        # embedding kept (position ids, a dropout's mask) are freed: the loop's batch is all that is left
        # (MemTracker: "Temp" = 3·V·d, no activation but the ids; benchmarks/memory_sim.py --families)
        grads += unit_grads.get("embed", 0) - inp.tied_grad
        ev("backward: embedding", acts=batch, grads=grads + 2 * inp.tied_grad, gather=root,
           reduce=inp.unit_full_grads.get("embed", 0), logits=held, copies=head_cast + sum(layer_casts))
    elif inp.first:
        grads += 0 if inp.tied_head else unit_grads.get("embed", 0)
        red = _flat_reduce(flat["root"]) if sharded_grads else 0
        # tied under ZeRO-3: the three V·d tensors counted with the whole root unit, beside the input gradient
        tied = 2 * unit_grads.get("embed", 0) if inp.tied_head and not flat else 0
        ev("backward: embedding", acts=acts_at(inp, kept), grads=grads + tied, gather=root,
           reduce=inp.unit_full_grads.get("embed", 0), logits=held, hidden=inp.hidden_grad, buffers=red,
           copies=head_cast + sum(layer_casts))
    if not flat:
        ev("optimizer step", acts=batch, grads=0 if inp.grads_freed_by_copy else all_grads, logits=held,
           temps=inp.optimizer_temporaries, fp32g=inp.fp32_grad_copies)
        ev("zero_grad", acts=batch, grads=0, logits=held)
        return tuple(events)
    if inp.flat_stage == 3:  # our ZeRO-3 updates its parameter shards in place; the next forward gathers
        ev("optimizer step", acts=batch, grads=0, logits=held, temps=inp.optimizer_temporaries, reduced=True)
        ev("zero_grad", acts=batch, grads=0, logits=held, reduced=True)
        return tuple(events)
    # our flat ZeRO-1/2 (flat_zero): the reduce (ZeRO-1), the step on temporary parameter shards, the all-gathers
    params = sum(u.param_shard_bytes for u in flat.values())
    if inp.flat_stage == 1:
        model = flat["model"]
        ev("gradient pack", acts=batch, grads=all_grads, logits=held, buffers=model.buffer_bytes)
        ev("gradient reduce-scatter", acts=batch, grads=model.grad_shard_bytes, logits=held,
           buffers=model.buffer_bytes + model.ring_window_bytes, reduced=True)
        ev("optimizer step", acts=batch, grads=model.grad_shard_bytes, logits=held,
           temps=params + inp.optimizer_temporaries, reduced=True)
        ev("parameter all-gather", acts=batch, grads=0, logits=held, buffers=fz.gather_peak_bytes(flat),
           reduced=True)
    else:
        ev("optimizer step", acts=batch, grads=0, logits=held, temps=params + inp.optimizer_temporaries)
        ev("parameter all-gather", acts=batch, grads=0, logits=held, buffers=fz.gather_peak_bytes(flat))
    ev("zero_grad", acts=batch, grads=0, logits=held, reduced=True)
    return tuple(events)


def tensor_grad_bytes(t, layout: ParallelLayout, prec: Precision, *, granularity: int) -> int:
    """Gradient bytes one rank holds for the placed tensor ``t`` (its ZeRO-2 shard when gradients are sharded)."""
    shard, n = st.held_tensors(t, layout, 2)
    return n * st.alloc_bytes(numel(shard) * prec.grad_bytes, granularity)


def unit_bytes(placement: Placement, layout: ParallelLayout, prec: Precision, *, granularity: int) -> tuple[
        dict, dict, dict]:
    """Per unit (``embed``, ``layer.<i>``, ``head``): (gradient bytes held, unsharded parameter bytes under
    ZeRO-3, unsharded gradient bytes under ZeRO-3). Units whose tensors ZeRO does not shard (degree 1) are
    resident already and gather nothing."""
    grads: dict[str, int] = {}
    gathered: dict[str, int] = {}
    full_grads: dict[str, int] = {}
    for t in placement.tensors:
        g = tensor_grad_bytes(t, layout, prec, granularity=granularity)
        grads[t.unit] = grads.get(t.unit, 0) + g
        degree = layout.expert_zero_degree if t.expert else layout.zero_degree
        if layout.zero >= 3 and degree > 1:
            gathered[t.unit] = gathered.get(t.unit, 0) + t.copies * st.alloc_bytes(
                t.numel * prec.weight_bytes, granularity)
            full_grads[t.unit] = full_grads.get(t.unit, 0) + t.copies * st.alloc_bytes(
                t.numel * prec.grad_bytes, granularity)
    return grads, gathered, full_grads


def hidden_grad_bytes(tokens: int, hidden: int, residual_bytes: int, tp: int = 1, sp: bool = False) -> int:
    """One gradient of the hidden states: (T, d) in the residual stream's dtype (split by tp under SP)."""
    return residual_bytes * ceil_div(tokens, tp if sp else 1) * hidden


def ffn_backward_transient(*, tokens: int, hidden: int, intermediate: int, gated: bool, compute_bytes: int,
                           grad_bytes: int, granularity: int, tp: int = 1) -> int:
    """Bytes a dense MLP's backward holds at its peak beyond the layer's saved tensors and its output gradient
    (derived from the op order of ``down(act(gate(x)) * up(x))``, checked by the MemTracker oracle): the down
    projection's weight gradient (d·f/tp in the gradient dtype) and the gradient of its input (c·T·f/tp), after
    which the down projection's saved input (c·T·f/tp) is freed; then, for a gated MLP, the two gradients
    ``mul``'s backward returns (2·c·T·f/tp), for a plain one the activation's (c·T·f/tp). Net: the weight
    gradient + 2·c·T·f/tp (gated) or + c·T·f/tp (plain)."""
    f = ceil_div(intermediate, tp)
    a = st.alloc_bytes(compute_bytes * tokens * f, granularity)
    return st.alloc_bytes(hidden * f * grad_bytes, granularity) + (2 if gated else 1) * a


def eager_experts_backward_transient(*, first_bytes: int, down_bytes: int, granularity: int) -> int:
    """Bytes the eager expert loop's backward holds at its peak for its weight gradients (derived from the loop,
    measured with MemTracker: ``docs/benchmarks.md``, the eager-loop MoE section). Each routed weight is one stacked
    Parameter read per expert as ``W[e]``, so each expert's weight gradient is ``select_backward``'s full-size
    zeros with one slice written, summed with the others in autograd's input buffer out of place: while the loop's
    backward runs, one full-size buffer per routed weight (gate_up: ``first_bytes``, down: ``down_bytes``, in the
    gradient dtype), and at its peak the larger one's old sum, its new contribution and their sum. The buffers
    become the weights' gradients when the layer's backward is done."""
    big, small = max(first_bytes, down_bytes), min(first_bytes, down_bytes)
    return 3 * st.alloc_bytes(big, granularity) + st.alloc_bytes(small, granularity)
