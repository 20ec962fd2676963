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

from dataclasses import dataclass, field, replace

from trainmath.arith import numel
from trainmath.layout import ParallelLayout
from trainmath.memory import states as st
from trainmath.memory.step import Event, Kind, Moment, StepInputs, Walk, acts_at
from trainmath.memory.timeline import ZeroImpl
from trainmath.placement import Placement
from trainmath.tree import Node
from trainmath.vocabulary import Precision

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
    reduce_output_bytes: int = 0
    """Under a ``reduce_dtype`` other than the all-gather dtype: the flat reduce-scatter output in the reduce dtype,
    alive beside the input once ``foreach_reduce`` has freed the unsharded gradients (``reduce_scatter_moment``);
    0 otherwise (the copy-in moment is the larger)."""
    accumulated_grad_bytes: int = 0
    """The unsharded gradients in the reduce dtype (the parameters' own shapes): what ``post_backward`` keeps
    without gradient sync (``unsharded_accumulated_grad``, ``memory.fsdp2_pipeline``)."""

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


def mixer_backward(ops, tensors, *, param_bytes: int, granularity: int, grads_after=None) -> MixerBackward | None:
    """``MixerBackward`` of one layer's op list ``ops`` (None without a math-SDPA attention); ``tensors``: the
    placement's tensors of the layer (module-relative names), their gradients in ``param_bytes``.
    ``grads_after``: the names of the ops after the attention → bytes of their parameters' gradients (default:
    ``tensors``'; a fine-tune's are its adapters', ``memory.peft.fsdp_terms``)."""
    from trainmath.ops.fold import saved_storages

    k = next((j for j, op in enumerate(ops) if op.kind == "attention" and op.kernel == "sdpa_math"), None)
    if k is None:
        return None
    before = {id(s) for _, s in saved_storages(ops[:k + 1])}
    saved_after = sum(s.nbytes() for _, s in saved_storages(ops) if id(s) not in before)
    modules = {op.name for op in ops[k + 1:]}
    if grads_after is None:
        grads = sum(st.alloc_bytes(numel(runtime_shape(t)) * param_bytes, granularity) for t in tensors
                    if t.spec.name.rsplit(".", 1)[0] in modules)
    else:
        grads = grads_after(modules)
    by_name = {t.name.removeprefix("sdpa_math."): t.nbytes() for t in ops[k].saved}
    transient = 2 * by_name["query_scaled"] + by_name["softmax_fp32"]
    return MixerBackward(saved_after=saved_after, grads_after=grads, transient=transient)


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
        a = acc.setdefault(name, {"ag": 0, "rs": 0, "shard": 0, "unsharded": 0, "grads": {}, "out": 0, "acc": 0})
        a["ag"] += padded * pb
        a["rs"] += padded * rb
        a["out"] += padded // degree * rb if rb != pb else 0
        a["shard"] += padded // degree * gb
        a["unsharded"] += st.alloc_bytes(padded * pb, granularity)
        a["grads"][t.unit] = a["grads"].get(t.unit, 0) + st.alloc_bytes(numel(shape) * pb, granularity)
        a["acc"] += st.alloc_bytes(numel(shape) * rb, granularity)
    return {name: Unit(unsharded_bytes=a["unsharded"], all_gather_bytes=st.alloc_bytes(a["ag"], granularity),
                       grad_bytes=a["grads"], reduce_scatter_bytes=st.alloc_bytes(a["rs"], granularity),
                       sharded_grad_bytes=st.alloc_bytes(a["shard"], granularity),
                       reduce_output_bytes=st.alloc_bytes(a["out"], granularity),
                       accumulated_grad_bytes=a["acc"]) for name, a in acc.items()}


def reduce_scatter_moment(unit: Unit, unsharded: int, kept: int = 0) -> int:
    """The larger of ``foreach_reduce``'s two moments for ``unit`` (torch 2.13's ``_fsdp_collectives.py``), beside
    its reduce-scatter input: the copy-in (``chunk_cat`` into the input: the ``unsharded`` gradients alive) and,
    under a ``reduce_dtype`` other than the all-gather dtype, the reduce-scatter itself (``unsharded_grads.clear()``
    has freed the gradients; the flat output is allocated in the reduce dtype; ``kept``: gradients that outlive
    the clear). With ``reduce_dtype`` = ``orig_dtype`` (fp32 parameters) there is no cast after the reduce."""
    if not unit.reduce_output_bytes:
        return unsharded
    return max(unsharded, unit.reduce_output_bytes + kept)


@dataclass(frozen=True)
class FSDP2(ZeroImpl):
    """FSDP2 as the timeline's parameter: ``units`` from ``units``, ``reshard`` its ``reshard_after_forward``
    (True for ZeRO-3, False for its ZeRO-2), ``mixer`` / ``norm``: layer index → ``MixerBackward`` /
    ``NormBackward``, the moments inside a layer's backward that can be its peak. On a pipeline stage:
    ``fsdp2_pipeline.PipelinedFSDP2``."""

    units: dict
    reshard: bool = True
    mixer: dict = field(default_factory=dict)
    norm: dict = field(default_factory=dict)

    def walk(self, inp: StepInputs) -> Walk:
        return FSDP2Walk(inp, self)


def _with(acts: Node, *extra: Node) -> Node:
    return Node.of("activations_bytes", [*acts.children, *extra], "bytes")


class FSDP2Walk(Walk):
    """One FSDP2 step (the module docstring): each unit's all-gather and reduce-scatter are events; the root's
    gradients stay unsharded to the end of backward."""

    loop_note = "held by the training loop"

    def __init__(self, inp: StepInputs, zero: FSDP2):
        super().__init__(inp)
        u, self.z = zero.units, zero
        self.root = u.get("root", Unit(unsharded_bytes=0, all_gather_bytes=0))
        self.layers = [u[f"layer.{i}"] for i in inp.layers]
        self.routers = [u.get(f"layer.{i}.router") for i in inp.layers]
        self.p_root = self.root.unsharded_bytes
        self.s_all = sum(x.sharded_grad_bytes for x in u.values())
        self.positions = [] if any("position_ids" in n.name for n in inp.resident) or not inp.positions else [
            Node(name="position ids", value=inp.positions, unit="bytes", note="the model's (1, s) int64, forward only")]
        self.prev_ag = self.root.all_gather_bytes
        self.root_grads = 0
        """The root's unsharded gradients so far: they stay until the root's post-backward."""
        self.sharded = 0
        self.rs_prev = 0
        """The reduce-scatter input of the layer after, kept until this layer's post-backward."""

    def ev(self, m: Moment, *, sharded: int = 0, **terms) -> list[Event]:
        return [self.event(m, gradients=self.s_all if self.inp.grads_persist else sharded, **terms)]

    def kept_unsharded(self, upto: int) -> int:
        """Without ``reshard_after_forward`` (FSDP2's ZeRO-2), the layers before position ``upto`` (and their
        routers) stay unsharded from their forward to their post-backward."""
        return 0 if self.z.reshard else sum(self.layers[j].unsharded_bytes + (
            self.routers[j].unsharded_bytes if self.routers[j] else 0) for j in range(upto))

    def start(self, m):
        out = self.ev(m)
        if self.p_root:
            out += self.ev(replace(m, kind=Kind.ROOT_ALL_GATHER, acts=self.loop_acts()),
                           gather=self.root.all_gather_bytes + self.p_root)
        return out

    def forward(self, pos, m):
        inp, lay, i = self.inp, self.layers[pos], self.inp.layers[pos]
        hidden_in = Node(name=f"layer {i} input", value=inp.hidden_grad, unit="bytes", note="the hidden states")
        out = self.ev(replace(m, kind=Kind.FORWARD_ALL_GATHER,
                              acts=_with(acts_at(inp, list(inp.layers[:pos])), hidden_in, *self.positions)),
                      gather=self.p_root + self.kept_unsharded(pos) + self.prev_ag + lay.all_gather_bytes
                      + lay.unsharded_bytes)
        # a router unit's all-gather (inside the layer) frees the layer's buffer and keeps its own
        self.prev_ag = self.routers[pos].all_gather_bytes if self.routers[pos] else lay.all_gather_bytes
        return out + self.ev(replace(m, acts=_with(m.acts, *self.positions)),
                             gather=self.p_root + self.kept_unsharded(pos + 1)
                             + (lay.unsharded_bytes if self.z.reshard else 0) + self.prev_ag)

    def top(self) -> tuple[int, int, int]:
        """(what stays unsharded from the loss on, the last layer's all-gather output, what of it the root's
        pre-backward prefetches: nothing under ZeRO-2, where the layer is unsharded already)."""
        last_ag = self.prev_ag if self.layers else 0
        return self.p_root + self.kept_unsharded(len(self.layers)), last_ag, last_ag if self.z.reshard else 0

    def loss(self, fwd, bwd):
        top, last_ag, prefetch = self.top()
        return (self.ev(replace(fwd, acts=_with(fwd.acts, *self.positions)), gather=top + last_ag)
                + self.ev(bwd, gather=top + prefetch))

    def head(self, m):
        top, _, prefetch = self.top()
        g = self.root.grad_bytes
        self.root_grads = g.get("head", 0) + (g.get("embed", 0) if self.inp.tied_head else 0)
        return self.ev(m, gather=top + prefetch, reduce=self.root_grads)

    def backward(self, pos, m):
        inp, lay, router, i = self.inp, self.layers[pos], self.routers[pos], self.inp.layers[pos]
        raf = self.z.reshard
        self.before = self.layers[pos - 1].all_gather_bytes if pos and raf else 0  # prefetched in its pre-backward
        self.mine = self.p_root + (lay.unsharded_bytes if raf else self.kept_unsharded(pos + 1))
        out = []
        if raf:
            out += self.ev(replace(m, kind=Kind.BACKWARD_ALL_GATHER, acts=acts_at(inp, list(inp.layers[:pos + 1])),
                                   hidden=inp.hidden_grad),
                           gather=self.p_root + lay.all_gather_bytes + lay.unsharded_bytes,
                           reduce=self.root_grads + self.rs_prev, sharded=self.sharded)
        # with a router unit the layer prefetches the router (next in reverse post-forward order), and the
        # router's pre-backward the layer before
        gather = self.mine + (router.all_gather_bytes if router and raf else self.before)
        out += self.ev(m, gather=gather, reduce=self.root_grads + self.rs_prev, sharded=self.sharded)
        kept = list(inp.layers[:pos + 1])
        mix = self.z.mixer.get(i)
        if mix:
            out += self.ev(replace(m, kind=Kind.BACKWARD_ATTENTION, acts=acts_at(inp, kept, live_layer=i,
                                                                               less=mix.saved_after),
                                   hidden=inp.hidden_grad + mix.transient), gather=gather,
                           reduce=self.root_grads + self.rs_prev + mix.grads_after, sharded=self.sharded)
        if router:  # its post-backward (inside the layer's backward) frees rs_prev and keeps its own
            self.sharded += router.sharded_grad_bytes
            self.rs_prev = router.reduce_scatter_bytes
            self.mine -= 0 if raf else router.unsharded_bytes
        norm = self.z.norm.get(i)
        if norm:  # the layer's input norm, its last op: every gradient of the layer made
            out += self.ev(replace(m, kind=Kind.BACKWARD_INPUT_NORM, acts=acts_at(inp, kept, live_layer=i,
                                                                                less=norm.saved_after),
                                   hidden=inp.hidden_grad + norm.transient), gather=self.mine + self.before,
                           reduce=self.root_grads + self.rs_prev + lay.grads, sharded=self.sharded)
        return out

    def backward_done(self, pos, m):
        lay, g = self.layers[pos], self.layers[pos].grads
        out = self.ev(m, gather=self.mine + self.before, reduce=self.root_grads + self.rs_prev + g,
                      sharded=self.sharded)
        out += self.ev(replace(m, kind=Kind.LAYER_REDUCE_SCATTER, copies=0),
                       gather=self.mine - lay.unsharded_bytes + self.before,
                       reduce=self.root_grads + reduce_scatter_moment(lay, g) + lay.reduce_scatter_bytes,
                       sharded=self.sharded)
        self.sharded += lay.sharded_grad_bytes
        self.rs_prev = lay.reduce_scatter_bytes
        return out

    def embedding(self, m, loop):
        # a tied embedding's weight already holds the head's gradient: the lookup's and their sum make three
        # vocabulary × hidden tensors at once (as on one device)
        emb = self.root.grad_bytes.get("embed", 0)
        extra = 2 * emb if self.inp.tied_head else emb
        out = self.ev(m, gather=self.p_root, reduce=self.root_grads + extra + self.rs_prev, sharded=self.sharded)
        self.root_grads += 0 if self.inp.tied_head else emb
        return out

    def end(self, m):
        inp, out = self.inp, []
        if self.p_root:
            # measured under FSDPMemTracker (FakeTensorMode): with an untied head, the embedding's gradient (the
            # lookup's, made last in backward), with no Python referrer, outlives foreach_reduce's clear of the
            # root's gradients; with a tied one (the lookup's summed into the head's) nothing does
            kept = 0 if self.inp.tied_head else self.root.grad_bytes.get("embed", 0)
            out += self.ev(replace(m, kind=Kind.ROOT_REDUCE_SCATTER), sharded=self.sharded,
                           reduce=reduce_scatter_moment(self.root, self.root_grads, kept)
                           + self.root.reduce_scatter_bytes)
        return (out + self.ev(replace(m, temps=inp.optimizer_temporaries, fp32g=inp.fp32_grad_copies),
                              sharded=self.s_all)
                + self.ev(replace(m, kind=Kind.ZERO_GRAD)))
