"""ZeRO-3 as torch's FSDP2 runs it: what is alive on one rank at each moment of a training step.

The wrapping is ``fully_shard`` on every decoder layer, then on the root (the embedding, the final norm and the
LM head: one unit), ``reshard_after_forward=True``, implicit prefetching, one reduce-scatter input buffer kept
in flight (torch's defaults). Read from ``torch/distributed/fsdp/_fully_shard/`` (torch 2.13):

- **Per unit, four kinds of buffer.** ``foreach_all_gather`` allocates one flat all-gather output of W × the
  unit's padded shard (each parameter's dim 0 padded to a multiple of W); ``foreach_all_gather_copy_out`` copies
  it into one unsharded tensor per parameter (``all_gather_outputs``, the same padded sizes; the unsharded
  parameter is a view of it). Autograd makes the unsharded gradients (the parameters' own shapes).
  ``foreach_reduce`` copies them into one flat reduce-scatter input (W × the padded shard) and reduces into one
  flat output of the padded shard, whose views are the sharded gradients.
- **Forward.** ``FSDPParamGroup.wait_for_unshard`` in forward keeps the all-gather output in
  ``comm_ctx.all_gather_state`` until the next unit's ``wait_for_unshard`` frees it — and that frees it only when
  it returns (the walrus-bound local ``prev_all_gather_state`` holds it through the copy-out): while unit k is
  copied out, unit k-1's and unit k's all-gather outputs, unit k's unsharded parameters and the root's are
  alive. The last layer's all-gather output lives until the root's post-forward, after the loss (the model
  computes it). The root is not resharded after forward (``FSDPState._lazy_init``).
- **Backward.** The root's pre-backward prefetches the last layer (its all-gather output only); each layer's
  pre-backward copies out (its all-gather output freed at once in backward) and prefetches the layer before.
  ``post_backward`` reshards the layer, frees the previous layer's reduce-scatter input
  (``reduce_scatter_states``, at most one kept), then reduce-scatters: its unsharded gradients beside its
  reduce-scatter input, until they are freed. The root's gradients (LM head, final norm, embedding) stay
  unsharded to the end of backward: its post-backward runs in the root's final callback.
- **Inside a layer's backward.** Its unsharded weight gradients are full size, so the moment its mixer's backward
  runs with every gradient of the ops after the mixer already made can be its peak (``MixerBackward``); so can
  its input norm's backward, the last of the layer, with all of its gradients made (``NormBackward``).

Measured: ``benchmarks/memory_sim.py --families --fsdp 8`` (FSDPMemTracker over a fake process group, every hf
family) and ``tests/memory/test_fsdp2_oracle.py`` (real gloo ranks).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from trainmath.arith import numel
from trainmath.layout import ParallelLayout
from trainmath.memory import states as st
from trainmath.memory.precision import Precision
from trainmath.memory.step import Event, acts_at
from trainmath.placement import Placement
from trainmath.tree import Node

ROOT = ("embed", "head")
"""The calculator's units that ``fully_shard(model)`` gathers together as the root unit."""


@dataclass(frozen=True, kw_only=True)
class Unit:
    """The bytes of one FSDP2 unit's buffers on one rank."""

    unsharded_bytes: int
    """Unsharded parameters: one per parameter, W × its padded shard, in the all-gather dtype."""
    all_gather_bytes: int
    """The flat all-gather output: W × the unit's padded shard."""
    grad_bytes: dict = field(default_factory=dict)
    """Calculator unit (``embed``, ``head``, ``layer.<i>``) → bytes of its unsharded gradients (autograd's, the
    parameters' own shapes), as they appear in backward."""
    reduce_scatter_bytes: int = 0
    """The flat reduce-scatter input: W × the padded shard, in the reduce dtype."""
    sharded_grad_bytes: int = 0
    """The flat reduce-scatter output (the padded shard) whose views are the sharded gradients."""

    @property
    def grads(self) -> int:
        return sum(self.grad_bytes.values())


@dataclass(frozen=True, kw_only=True)
class MixerBackward:
    """One layer's attention backward on the CPU's math SDPA (dropout on the probabilities: no fused kernel,
    ``ops.kernels.dropout``), read from the layer's op list: the ops after the attention (the output projection,
    the residual dropout, the second norm, the MLP) have run their backward, so their saved tensors are freed
    and their weight gradients exist (full size under FSDP2); the math kernel's backward of
    ``out = probs @ value`` (fp32) holds the output's gradient upcast to fp32 and the value's gradient (both
    4·b·h·s·h_d) beside the probabilities' gradient (4·b·h·s², the softmax's shape) being made."""

    saved_after: int
    """Bytes of the layer's saved storages that only the ops after the attention keep."""
    grads_after: int
    """Bytes of the unsharded gradients of the parameters of the ops after the attention."""
    transient: int
    """The math kernel's backward buffers: 2 × 4·b·h·s·h_d + 4·b·h·s²."""


def mixer_backward(ops, tensors, *, param_bytes: int, granularity: int) -> MixerBackward | None:
    """``MixerBackward`` of one layer's op list ``ops`` (None without a math-SDPA attention); ``tensors``: the
    placement's tensors of the layer (module-relative names), their gradients in ``param_bytes``."""
    from trainmath.ops.fold import saved_storages

    k = next((j for j, op in enumerate(ops) if op.kind == "attention" and op.kernel == "sdpa_math"), None)
    if k is None:
        return None
    before = {id(s) for _, s in saved_storages(ops[:k + 1])}
    saved_after = sum(s.nbytes() for _, s in saved_storages(ops) if id(s) not in before)
    modules = {op.name for op in ops[k + 1:]}
    grads_after = sum(st.alloc_bytes(numel(runtime_shape(t)) * param_bytes, granularity) for t in tensors
                      if t.spec.name.rsplit(".", 1)[0] in modules)
    by_name = {t.name.removeprefix("sdpa_math."): t.nbytes() for t in ops[k].saved}
    transient = 2 * by_name["query_scaled"] + by_name["softmax_fp32"]
    return MixerBackward(saved_after=saved_after, grads_after=grads_after, transient=transient)


@dataclass(frozen=True, kw_only=True)
class NormBackward:
    """One layer's input RMSNorm backward (``ops.kernels.norms``, kind ``rms``), the last op of the layer's
    backward, read from its op list: every gradient of the layer is made (full size under FSDP2) and every op
    after the norm has freed its saved tensors; the norm's own node for ``weight * y.to(dtype)``,
    ``x * rsqrt`` and ``rsqrt`` have run and freed theirs, so only ``pow``'s fp32 x remains. The peak is
    ``pow``'s backward (``grad * (2 * x.pow(1))``, ``pow_backward`` in autograd's ``FunctionsManual.cpp``) with
    five fp32 tensors of x's shape alive beside x: the gradient of x from ``x * rsqrt`` (waiting to be summed),
    ``mean``'s backward (the expanded gradient divided by d), ``x.pow(1)``, ``2 * x.pow(1)`` and the product
    (checked with a dispatch mode on one bf16 RMSNorm on the CPU)."""

    saved_after: int
    """Bytes of the layer's saved storages other than the norm's fp32 x."""
    transient: int
    """``pow``'s backward buffers: 5 × the fp32 x's bytes."""


def norm_backward(ops) -> NormBackward | None:
    """``NormBackward`` of one layer's op list ``ops`` (None unless its first norm is an ``rms`` one)."""
    from trainmath.ops.fold import saved_storages

    k = next((j for j, op in enumerate(ops) if op.kind == "norm"), None)
    if k is None or ops[k].kernel != "rms":
        return None
    x = next(s for t, s in saved_storages(ops[k:k + 1]) if t.name.endswith(".x_fp32"))
    saved_after = sum(s.nbytes() for _, s in saved_storages(ops) if s is not x)
    return NormBackward(saved_after=saved_after, transient=5 * x.nbytes())


def runtime_shape(t) -> tuple[int, ...]:
    """The shape FSDP2 shards: a per-expert tensor (``{e}`` in its checkpoint name, ``copies`` experts on the
    rank) is one fused (experts, ...) parameter in transformers 5's modeling code, so dim 0 is the experts
    (Qwen1.5-MoE's 60 experts pad to 64 at W = 8)."""
    if t.copies > 1 or (t.expert and "{e}" in t.spec.name):
        return (t.copies, *t.shape)
    return t.shape


def units(placement: Placement, layout: ParallelLayout, prec: Precision, *, granularity: int,
          param_bytes: int | None = None, reduce_bytes: int | None = None, shard_bytes: int | None = None,
          fp32_router: bool = False) -> dict[str, Unit]:
    """``root``, ``layer.<i>`` (and ``layer.<i>.router``) → ``Unit``. ``param_bytes``: the all-gather dtype
    (``MixedPrecisionPolicy``'s ``param_dtype``; default the weights'); ``reduce_bytes``: its ``reduce_dtype``
    (default the gradients'); ``shard_bytes``: the sharded gradients' (the parameters' original dtype; default the
    gradients'). ``fp32_router``: the family keeps its router weight fp32 (``Style.router_fp32``);
    with lower-precision weights it is its own unit (``runtime.fsdp.shard_model``), all in fp32."""
    acc: dict[str, dict] = {}
    for t in placement.tensors:
        own = fp32_router and prec.weight_bytes != 4 and t.spec.component == "router" and t.spec.kind == "linear"
        name = f"{t.unit}.router" if own else "root" if t.unit in ROOT else t.unit
        pb, rb, gb = (4, 4, 4) if own else (param_bytes or prec.weight_bytes, reduce_bytes or prec.grad_bytes,
                                            shard_bytes or prec.grad_bytes)
        degree = layout.expert_zero_degree if t.expert else layout.zero_degree
        shape = runtime_shape(t)
        padded = numel(st.zero_shard_shape(shape, degree)) * degree  # dim 0 padded to a multiple of W
        a = acc.setdefault(name, {"ag": 0, "rs": 0, "shard": 0, "unsharded": 0, "grads": {}})
        a["ag"] += padded * pb
        a["rs"] += padded * rb
        a["shard"] += padded // degree * gb
        a["unsharded"] += st.alloc_bytes(padded * pb, granularity)
        a["grads"][t.unit] = a["grads"].get(t.unit, 0) + st.alloc_bytes(numel(shape) * pb, granularity)
    return {name: Unit(unsharded_bytes=a["unsharded"], all_gather_bytes=st.alloc_bytes(a["ag"], granularity),
                       grad_bytes=a["grads"], reduce_scatter_bytes=st.alloc_bytes(a["rs"], granularity),
                       sharded_grad_bytes=st.alloc_bytes(a["shard"], granularity)) for name, a in acc.items()}


def step_timeline(inp) -> tuple:
    """The events of one FSDP2 step on one rank (``step.StepInputs`` with ``fsdp2`` set), in order."""
    u = inp.fsdp2
    none = Unit(unsharded_bytes=0, all_gather_bytes=0)
    root = u.get("root", none)
    layers = [u[f"layer.{i}"] for i in inp.layers]
    routers = [u.get(f"layer.{i}.router") for i in inp.layers]
    p_root = root.unsharded_bytes
    s_all = sum(x.sharded_grad_bytes for x in u.values())
    events: list = []

    def ev(name: str, *, acts: Node, gather: int = 0, reduce: int = 0, sharded: int = 0, logits: int = 0,
           up: int = 0, ce: int = 0, hidden: int = 0, copies: int = 0, temps: int = 0, fp32g: int = 0) -> None:
        parts = {**inp.persistent, "gradients_bytes": s_all if inp.grads_persist else sharded,
                 "activations_bytes": acts, "logits_bytes": logits, "logits_fp32_bytes": up,
                 "cross_entropy_grad_bytes": ce, "activation_grads_bytes": hidden, "weight_copies_bytes": copies,
                 "zero3_gather_bytes": gather, "zero3_grad_reduce_bytes": reduce,
                 "optimizer_step_temporaries_bytes": temps, "optimizer_fp32_grads_bytes": fp32g}
        events.append(Event(name=name, parts=parts))

    def with_nodes(acts: Node, *extra: Node) -> Node:
        return Node.of("activations_bytes", [*acts.children, *extra], "bytes")

    batch = Node(name="input batch", value=inp.batch, unit="bytes", note="held by the training loop")
    loop = Node.of("activations_bytes", [batch] if inp.first and inp.batch else [], "bytes")
    ev("step start", acts=Node.of("activations_bytes", [], "bytes"))
    positions = [] if any("position_ids" in n.name for n in inp.resident) or not inp.positions else [
        Node(name="position ids", value=inp.positions, unit="bytes", note="the model's (1, s) int64, forward only")]
    if p_root:
        ev("forward: root all-gather", acts=loop, gather=root.all_gather_bytes + p_root)
    kept: list[int] = []
    prev_ag = root.all_gather_bytes
    raf = inp.fsdp2_reshard

    def kept_unsharded(upto: int) -> int:
        """Without ``reshard_after_forward`` (FSDP2's ZeRO-2), the layers before position ``upto`` (and their
        routers) stay unsharded from their forward to their post-backward."""
        return 0 if raf else sum(layers[j].unsharded_bytes + (routers[j].unsharded_bytes if routers[j] else 0)
                                 for j in range(upto))

    for pos, i in enumerate(inp.layers):
        lay = layers[pos]
        hidden_in = Node(name=f"layer {i} input", value=inp.hidden_grad, unit="bytes", note="the hidden states")
        ev(f"forward layer {i} all-gather", acts=with_nodes(acts_at(inp, kept), hidden_in, *positions),
           gather=p_root + kept_unsharded(pos) + prev_ag + lay.all_gather_bytes + lay.unsharded_bytes,
           copies=inp.weight_copies)
        kept.append(i)
        # a router unit's all-gather (inside the layer) frees the layer's buffer and keeps its own
        prev_ag = routers[pos].all_gather_bytes if routers[pos] else lay.all_gather_bytes
        ev(f"forward layer {i}", acts=with_nodes(acts_at(inp, kept), *positions),
           gather=p_root + kept_unsharded(pos + 1) + (lay.unsharded_bytes if raf else 0) + prev_ag,
           copies=inp.weight_copies)
    last_ag = prev_ag if layers else 0
    top = p_root + kept_unsharded(len(layers))  # what stays unsharded from the loss on
    prefetch = last_ag if raf else 0  # the root's pre-backward all-gathers the last layer (ZeRO-2: unsharded)
    if inp.last:
        ev("forward: loss", acts=with_nodes(acts_at(inp, kept), *positions), gather=top + last_ag,
           logits=inp.head_saved + inp.logits, up=inp.logits_fp32, copies=inp.weight_copies)
        ev("backward: loss", acts=acts_at(inp, kept), gather=top + prefetch,
           logits=inp.head_saved - inp.loss_freed + inp.output_held, ce=inp.cross_entropy_grads,
           copies=inp.weight_copies)
    held = inp.output_held if inp.last else 0
    root_grads = 0  # the root's unsharded gradients so far: they stay until the root's post-backward
    if inp.last:
        root_grads = root.grad_bytes.get("head", 0) + (root.grad_bytes.get("embed", 0) if inp.tied_head else 0)
        ev("backward: head", acts=acts_at(inp, kept), gather=top + prefetch, reduce=root_grads,
           logits=inp.head_saved + held, hidden=inp.hidden_grad, copies=inp.weight_copies)
    sharded = 0
    rs_prev = 0  # the reduce-scatter input of the layer after, kept until this layer's post-backward
    for pos in range(len(inp.layers) - 1, -1, -1):
        i, lay, router = inp.layers[pos], layers[pos], routers[pos]
        before = layers[pos - 1].all_gather_bytes if pos and raf else 0  # prefetched in its pre-backward
        mine = p_root + (lay.unsharded_bytes if raf else kept_unsharded(pos + 1))
        g = lay.grads
        if raf:
            ev(f"backward layer {i} all-gather", acts=acts_at(inp, kept), gather=p_root + lay.all_gather_bytes
               + lay.unsharded_bytes, reduce=root_grads + rs_prev, sharded=sharded, logits=held,
               hidden=inp.hidden_grad, copies=inp.weight_copies)
        # with a router unit the layer prefetches the router (next in reverse post-forward order), and the
        # router's pre-backward the layer before
        ev(f"backward layer {i}", acts=acts_at(inp, kept, live_layer=i), gather=mine
           + (router.all_gather_bytes if router and raf else before), reduce=root_grads + rs_prev,
           sharded=sharded, logits=held, hidden=inp.hidden_grad + inp.ffn_transient.get(i, 0),
           copies=inp.weight_copies)
        mix = inp.fsdp2_mixer.get(i)
        if mix:
            ev(f"backward layer {i} attention", acts=acts_at(inp, kept, live_layer=i, less=mix.saved_after),
               gather=mine + (router.all_gather_bytes if router and raf else before),
               reduce=root_grads + rs_prev + mix.grads_after, sharded=sharded, logits=held,
               hidden=inp.hidden_grad + mix.transient, copies=inp.weight_copies)
        if router:  # its post-backward (inside the layer's backward) frees rs_prev and keeps its own
            sharded += router.sharded_grad_bytes
            rs_prev = router.reduce_scatter_bytes
            mine -= 0 if raf else router.unsharded_bytes
        norm = inp.fsdp2_norm.get(i)
        if norm:  # the layer's input norm, its last op: every gradient of the layer made
            ev(f"backward layer {i} input norm", acts=acts_at(inp, kept, live_layer=i, less=norm.saved_after),
               gather=mine + before, reduce=root_grads + rs_prev + g, sharded=sharded, logits=held,
               hidden=inp.hidden_grad + norm.transient, copies=inp.weight_copies)
        kept.pop()
        ev(f"backward layer {i} done", acts=acts_at(inp, kept), gather=mine + before,
           reduce=root_grads + rs_prev + g, sharded=sharded, logits=held, hidden=inp.hidden_grad,
           copies=inp.weight_copies)
        ev(f"backward layer {i} reduce-scatter", acts=acts_at(inp, kept),
           gather=mine - lay.unsharded_bytes + before, reduce=root_grads + g + lay.reduce_scatter_bytes,
           sharded=sharded, logits=held, hidden=inp.hidden_grad)
        sharded += lay.sharded_grad_bytes
        rs_prev = lay.reduce_scatter_bytes
    if inp.first:
        # a tied embedding's weight already holds the head's gradient: the lookup's and their sum make three
        # vocabulary × hidden tensors at once (as on one device)
        emb = root.grad_bytes.get("embed", 0)
        extra = 2 * emb if inp.tied_head else emb
        ev("backward: embedding", acts=acts_at(inp, kept), gather=p_root, reduce=root_grads + extra + rs_prev,
           sharded=sharded, logits=held, hidden=inp.hidden_grad)
        root_grads += 0 if inp.tied_head else emb
    if p_root:
        ev("backward: root reduce-scatter", acts=loop, reduce=root_grads + root.reduce_scatter_bytes,
           sharded=sharded, logits=held)
    ev("optimizer step", acts=loop, sharded=s_all, logits=held, temps=inp.optimizer_temporaries,
       fp32g=inp.fp32_grad_copies)
    ev("zero_grad", acts=loop, logits=held)
    return tuple(events)
