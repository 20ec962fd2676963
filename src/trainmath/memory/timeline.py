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
- ``backward layer i attention`` (where ``Buckets.mixer`` has the layer): its math-SDPA attention's backward, the
  ops after it done (``fsdp2.MixerBackward``);
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

The ZeRO implementation is the timeline's parameter (``ZeroImpl``): its ``Walk`` adds, at each moment this
skeleton walks, the gradients it holds, its gathered and reducing buffers, and the events of its own collectives.

Data-parallel buffers (``Buckets``): ZeRO-0 with dp·cp > 1 is torch DDP, whose buckets hold a copy of every gradient
for the whole step (``gradient_as_bucket_view=False``, the default); with ``bucket_view`` the gradients are views of
the buckets, so the gradients are allocated for the whole step and the buckets add nothing. ZeRO-1/2 is DeepSpeed
(one reduce bucket for the whole step; ZeRO-2's partitioned gradients appear during backward like any other), or,
with ``zero_impl="trainmath"``, our runtime's flat buffers (``flat_zero.Flat``: no bucket; the reduce, step and
all-gather as events; our ZeRO-3 likewise, without FSDP2's prefetch). ZeRO-3 is FSDP2 (``fsdp2.FSDP2``:
``fully_shard`` per decoder layer and at the root, ``reshard_after_forward=True``; all-gather outputs, unsharded
parameters and gradients, reduce-scatter buffers as torch's ``_fully_shard`` holds them; also FSDP2's ZeRO-2 with
``zero_impl="fsdp2"``; on a pipeline stage, unsharded all step with gradients accumulated unsharded,
``fsdp2_pipeline``). Checked: DDP (both bucket modes) and FSDP2 against MemTracker / FSDPMemTracker over a fake
process group (``tests/memory/test_memtracker_oracle.py``); our flat ZeRO-1/2 against MemTracker on gloo ranks
(``tests/train/test_measure.py``); DeepSpeed's ZeRO-1/2 buffers are not checked. torch's ZeRO-1 (DDP with
``ZeroRedundancyOptimizer``) holds DDP's buckets, Ψ gradient elements, which is DeepSpeed's bucket below 5e8
parameters (measured equal to the byte on the tiny models of ``benchmarks/train_verify.py``).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from trainmath.arith import ceil_div, numel
from trainmath.layout import ParallelLayout
from trainmath.memory import states as st
from trainmath.memory.step import Event, Kind, Moment, StepInputs, Walk, acts_at
from trainmath.placement import Placement
from trainmath.tree import Node
from trainmath.vocabulary import Precision


def step_timeline(inp: StepInputs, zero: ZeroImpl | None = None) -> tuple[Event, ...]:
    """The events of one step on one rank (see the module docstring), in order, as the ZeRO implementation
    ``zero`` runs it (default ``Buckets()``: no ZeRO, DDP or DeepSpeed)."""
    w = (zero or Buckets()).walk(inp)
    copies = inp.weight_copies
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

    events = w.start(Moment(kind=Kind.STEP_START, acts=Node.of("activations_bytes", [], "bytes")))
    kept: list[int] = []
    for pos, i in enumerate(inp.layers):
        kept.append(i)
        events += w.forward(pos, Moment(kind=Kind.FORWARD_LAYER, layer=i, acts=acts_at(inp, kept), copies=copies))
    held = inp.output_held if inp.last else 0
    if inp.last:
        events += w.loss(Moment(kind=Kind.FORWARD_LOSS, acts=acts_at(inp, kept), logits=inp.head_saved + inp.logits,
                                up=inp.logits_fp32, copies=copies),
                         Moment(kind=Kind.BACKWARD_LOSS, acts=acts_at(inp, kept), ce=inp.cross_entropy_grads,
                                logits=inp.head_saved - inp.loss_freed + inp.output_held, copies=copies + casts()))
        events += w.head(Moment(kind=Kind.BACKWARD_HEAD, acts=acts_at(inp, kept), logits=inp.head_saved + held,
                                hidden=inp.hidden_grad, copies=copies + casts()))
    for pos in range(len(inp.layers) - 1, -1, -1):
        i = inp.layers[pos]
        back = w.backward(pos, Moment(kind=Kind.BACKWARD_LAYER, layer=i, acts=acts_at(inp, kept, live_layer=i),
                                      logits=held, hidden=inp.hidden_grad + inp.ffn_transient.get(i, 0),
                                      copies=copies + casts(pos)))
        events += _with_recompute(inp, kept, i, back)
        kept.pop()
        events += w.backward_done(pos, Moment(kind=Kind.BACKWARD_LAYER_DONE, layer=i, acts=acts_at(inp, kept),
                                              logits=held, hidden=inp.hidden_grad,
                                              copies=copies + casts(pos, done=True)))
    loop = w.loop_acts()
    if inp.first:
        events += w.embedding(Moment(kind=Kind.BACKWARD_EMBEDDING, acts=acts_at(inp, kept), logits=held,
                                     hidden=inp.hidden_grad, copies=head_cast + sum(layer_casts)), loop)
    events += w.end(Moment(kind=Kind.OPTIMIZER_STEP, acts=loop, logits=held))
    return tuple(events)


def _with_recompute(inp: StepInputs, kept: list[int], i: int, back: list[Event]) -> list[Event]:
    """``back`` with the recompute's peak of layer ``i`` (``StepInputs.recompute_peaks``) before its
    ``backward layer i`` event: the same buffers, the activations as the recompute holds them."""
    if i not in inp.recompute_peaks:
        return back
    not_yet, transient, grads = inp.recompute_peaks[i]
    k = next(j for j, e in enumerate(back) if e.kind is Kind.BACKWARD_LAYER)
    acts = acts_at(inp, kept, live_layer=i, less=not_yet)
    acts = Node.of("activations_bytes", [*acts.children, Node(
        name=f"layer {i} recompute intermediates", value=transient, unit="bytes",
        note="the recomputed forward's frame and LoRA sums, not saved")], "bytes")
    ev = back[k]
    peak = replace(ev, kind=Kind.BACKWARD_RECOMPUTE, live=replace(
        ev.live, activations_bytes=acts, activation_grads_bytes=inp.hidden_grad + grads))
    return [*back[:k], peak, *back[k:]]


class ZeroImpl:
    """A ZeRO implementation as the timeline's parameter: ``walk`` starts its walk along one step."""

    def walk(self, inp: StepInputs) -> Walk:
        raise NotImplementedError


@dataclass(frozen=True)
class Buckets(ZeroImpl):
    """No ZeRO, torch DDP (its buckets in ``framework_overhead_bytes``), or DeepSpeed's ZeRO-1/2 (its reduce
    bucket likewise) and ZeRO-3 (each layer's parameters gathered with the next prefetched). ``mixer``: layer
    index → ``fsdp2.MixerBackward``, the math-SDPA attention's backward moment inside that layer's backward
    (a fine-tune's, ``memory.peft.mixer_terms``; empty: not an event)."""

    mixer: dict = field(default_factory=dict)

    def walk(self, inp: StepInputs) -> Walk:
        return BucketsWalk(inp, self.mixer)


class BucketsWalk(Walk):
    """Gradients appear unit by unit in backward (or persist) and live to ``zero_grad``; ZeRO-3's gathered units
    come and go with the layer that runs."""

    prefetch = True
    """A layer's parameters are gathered with the next one's (the root pre-backward's too)."""
    tied_in_root = True
    """A tied embedding's three V·d tensors are counted with the whole embedding unit (``tied_grad`` 0)."""

    def __init__(self, inp: StepInputs, mixer: dict):
        super().__init__(inp)
        self.mixer = mixer
        """``Buckets.mixer``: layer index → the attention backward's moment inside that layer."""
        self.all_grads = sum(inp.unit_grads.values())
        self.root = sum(inp.unit_gathered.get(u, 0) for u in ("embed", "head"))
        self.unit_grads = inp.unit_grads
        self.shards = 0
        """Gradient shards held the whole step."""
        self.grads = 0
        """The gradients made so far in backward."""

    def ev(self, m: Moment, grads: int, *, reduced: bool = False, **terms) -> list[Event]:
        """``reduced``: the figure is the implementation's own even when gradients persist."""
        g = self.all_grads if self.inp.grads_persist and not reduced else grads
        return [self.event(m, gradients=self.shards + g, **terms)]

    def gathered(self, pos: int, direction: int) -> int:
        """Unsharded parameters while layer position ``pos`` runs: it, the next one prefetched, and the root."""
        units = [f"layer.{i}" for i in self.inp.layers]
        mine = self.inp.unit_gathered.get(units[pos], 0)
        j = pos + direction
        nxt = self.inp.unit_gathered.get(units[j], 0) if self.prefetch and 0 <= j < len(units) else 0
        return self.root + mine + nxt

    def first_backward(self) -> int:
        """Gathered at the loss's backward: FSDP's root pre-backward hook gathers the last layer."""
        inp = self.inp
        return self.root + (inp.unit_gathered.get(f"layer.{inp.layers[-1]}", 0) if inp.layers and self.prefetch
                            else 0)

    def reduce_buffers(self, unit: str) -> int:
        """Buffers of the implementation's reduce of ``unit`` at the end of its backward."""
        return 0

    def start(self, m):
        return self.ev(m, 0)

    def forward(self, pos, m):
        return self.ev(m, 0, gather=self.gathered(pos, +1))

    def loss(self, fwd, bwd):
        return self.ev(fwd, 0, gather=self.root) + self.ev(bwd, 0, gather=self.first_backward())

    def head(self, m):
        inp = self.inp
        self.grads += self.unit_grads.get("head", 0) + (
            (inp.tied_grad or self.unit_grads.get("embed", 0)) if inp.tied_head else 0)
        return self.ev(m, self.grads, gather=self.first_backward(), reduce=inp.unit_full_grads.get("head", 0))

    def backward(self, pos, m):
        inp, i = self.inp, self.inp.layers[pos]
        gather, reduce = self.gathered(pos, -1), inp.unit_full_grads.get(f"layer.{i}", 0)
        out = self.ev(m, self.grads, gather=gather, reduce=reduce)  # the MLP's backward transient with the grads
        mix = self.mixer.get(i)
        if mix:  # the attention's backward: the ops after it done, their gradients made (fsdp2.MixerBackward)
            acts = acts_at(inp, list(inp.layers[:pos + 1]), live_layer=i, less=mix.saved_after)
            out += self.ev(replace(m, kind=Kind.BACKWARD_ATTENTION, acts=acts, hidden=inp.hidden_grad + mix.transient),
                           self.grads + mix.grads_after, gather=gather, reduce=reduce)
        return out

    def backward_done(self, pos, m):
        unit = f"layer.{self.inp.layers[pos]}"
        self.grads += self.unit_grads.get(unit, 0)
        red = self.reduce_buffers(unit)
        # a reduce at the layer's end: its last gradient is the input norm's, whose input gradient then lives
        # beside the residual stream's
        return self.ev(replace(m, hidden=m.hidden * (2 if red else 1)), self.grads, gather=self.gathered(pos, -1),
                       reduce=self.inp.unit_full_grads.get(unit, 0), buffers=red)

    def embedding(self, m, loop):
        inp = self.inp
        full = inp.unit_full_grads.get("embed", 0)
        if inp.tied_head and inp.tied_grad:
            # a tied embedding's weight already holds the head's gradient: the lookup's backward makes a second
            # one and autograd's accumulation their sum, three vocabulary × hidden tensors at once. By then every
            # other embedding gradient exists (a position embedding's) and the lookup's input gradient and what
            # the embedding kept (position ids, a dropout's mask) are freed: the loop's batch is all that is left
            # (MemTracker: "Temp" = 3·V·d, no activation but the ids; benchmarks/memory_sim.py --families)
            self.grads += self.unit_grads.get("embed", 0) - inp.tied_grad
            return self.ev(replace(m, acts=loop, hidden=0), self.grads + 2 * inp.tied_grad, gather=self.root,
                           reduce=full)
        self.grads += 0 if inp.tied_head else self.unit_grads.get("embed", 0)
        # tied under ZeRO-3: the three V·d tensors counted with the whole root unit, beside the input gradient
        tied = 2 * self.unit_grads.get("embed", 0) if inp.tied_head and self.tied_in_root else 0
        return self.ev(m, self.grads + tied, gather=self.root, reduce=full, buffers=self.reduce_buffers("root"))

    def end(self, m):
        inp = self.inp
        grads = 0 if inp.grads_freed_by_copy else self.all_grads  # Megatron frees each as it copies it
        return (self.ev(replace(m, temps=inp.optimizer_temporaries, fp32g=inp.fp32_grad_copies), grads)
                + self.ev(replace(m, kind=Kind.ZERO_GRAD), 0))


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
    done: dict[tuple, tuple[int, int, int] | tuple[int]] = {}  # the layers' tensors repeat: one figure per shape
    for t in placement.tensors:
        key = (t.shape, t.copies, t.expert)
        one = done.get(key)
        if one is None:
            degree = layout.expert_zero_degree if t.expert else layout.zero_degree
            g = tensor_grad_bytes(t, layout, prec, granularity=granularity)
            one = done[key] = (g, t.copies * st.alloc_bytes(t.numel * prec.weight_bytes, granularity),
                               t.copies * st.alloc_bytes(t.numel * prec.grad_bytes, granularity)) \
                if layout.zero >= 3 and degree > 1 else (g,)
        grads[t.unit] = grads.get(t.unit, 0) + one[0]
        if len(one) == 3:
            gathered[t.unit] = gathered.get(t.unit, 0) + one[1]
            full_grads[t.unit] = full_grads.get(t.unit, 0) + one[2]
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
