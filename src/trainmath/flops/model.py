"""Training FLOPs of a model per step, per sequence and per token, as a tree that sums per GEMM.

A step is one forward and one backward pass over ``batch`` sequences of ``seq`` tokens, plus the forward that
activation recomputation repeats:

- forward: every GEMM of ``trainmath.ops.gemm`` over every layer, plus the LM head over every token;
- backward: 2× the forward of every GEMM (input and weight gradients, or both operands for attention);
  the embedding lookup has no GEMM in either direction;
- recompute (``recompute``): ``none``; ``selective`` is torchtitan's op-level selective checkpointing as
  ``trainmath train --recompute selective`` runs it (``trainmath.ops.selective``): the backward re-runs the
  forward of each layer's ops whose outputs the policy does not cache (every second mm, biased ``addmm``s,
  ``_grouped_mm`` and ``bmm`` experts, eager attention's and SDPA's math fallback's core, scans), except the
  layer's last saving linear, where torch's checkpoint stops the recompute (checked against FlopCounterMode in
  ``tests/flops/test_selective_flops.py``). (Korthikanti et al. 2022's selective recompute, the attention core
  alone, is the ``megatron`` memory profile's, not counted here.)
  ``full`` re-runs the forward of every decoder layer (not the LM head), as Megatron-LM's full checkpointing does
  (``checkpoint="megatron"``), or as torch's non-reentrant checkpoint does (``checkpoint="torch"``, what
  transformers' gradient checkpointing runs: it stops before a layer's last Linear when nothing after it saves a
  tensor; ``trainmath.flops.checkpoint``).

Every GEMM of a decoder layer is a fold over its layer type's op list (``trainmath.ops.flops``, the ops
``trainmath memory`` folds too): the linears, the attention core (with the op's window), the depthwise convs and
the chunked scans. The op list is emitted for shapes only (``Ctx.shapes_only``), so a config whose saved bytes
are not modelled (MLA with equal q/k and v head dims, Falcon with biases, Nemotron-H's latent MoE) still counts;
Kimi K2 runs DeepSeek-V3's op list (``FamilyDef.runs_as``). The LM head is the linear of the head's op list
(``ops.model.head_ops``, the one ``trainmath memory`` folds for the logits).

Linear-attention (Gated DeltaNet) and Mamba-2 layers count their chunked cores as transformers' torch path runs
them, over whole chunks (``gdn_chunk``, 64 in transformers; ``mamba_chunk``, the config's ``chunk_size``).

Everything scales with ``batch`` exactly, so per-sequence figures are exact integers; per-token figures are
floats (the attention term grows with ``seq``).
"""

from __future__ import annotations

from dataclasses import dataclass

from trainmath.errors import TrainmathError
from trainmath.flops.checkpoint import CHECKPOINT_IMPLS, not_recomputed
from trainmath.model.spec import LayerSpec, ModelSpec
from trainmath.ops import flops as op_flops
from trainmath.ops import selective
from trainmath.ops.emit import head_ops, layer_ops, layer_top_k
from trainmath.ops.gemm import CAUSAL, Gemm, core_note, module_name
from trainmath.ops.ir import SINGLE, Degrees
from trainmath.tree import Node
from trainmath.vocabulary import RECOMPUTE

# Components in output order: the parameter ledger's, with the attention core between attention and the FFN.
COMPONENT_ORDER = ("embed_tokens", "pos_embed", "attention", "attention_core", "linear_attention", "mamba",
                   "mlp_dense", "router", "experts", "shared_experts", "lm_head")


@dataclass(frozen=True, kw_only=True, slots=True)
class LayerGemms:
    """The forward GEMMs of one layer type over the whole step, and the layers of that type."""

    label: str
    layers: tuple[int, ...]
    gemms: tuple[Gemm, ...]
    selective: tuple[bool, ...] = ()
    """Per GEMM: does torchtitan's op-level selective checkpointing recompute it (``recompute="selective"``'s
    count, ``ops.selective``); empty for a layer without an op list."""

    @property
    def flops_per_layer(self) -> int:
        return sum(g.flops for g in self.gemms)


@dataclass(frozen=True, kw_only=True, slots=True)
class FlopsReport:
    """Forward, backward and recompute FLOPs of one training step; each is a component → module tree."""

    model: str
    batch: int
    seq: int
    causal: str
    recompute: str
    forward: Node
    backward: Node
    recomputed: Node
    training: Node
    """forward + backward + recompute: the step's total, with those three as children."""
    layer_types: tuple[LayerGemms, ...]
    head: tuple[Gemm, ...]
    notes: tuple[str, ...]
    conventions: tuple[str, ...]

    @property
    def tokens(self) -> int:
        return self.batch * self.seq

    @property
    def training_flops(self) -> int:
        return self.training.value

    def per_sequence(self, node: Node) -> int:
        """A step figure per sequence: exact, since every term is linear in the batch."""
        return node.value // self.batch

    def to_dict(self) -> dict:
        def fig(node: Node) -> dict:
            return {"per_step": node.value, "per_sequence": self.per_sequence(node),
                    "per_token": node.value / self.tokens}

        return {
            "model": self.model, "batch": self.batch, "seq": self.seq, "tokens": self.tokens,
            # "recompute" is the recomputed FLOPs below; the setting is in the conventions ("recompute=full: ...")
            "causal": self.causal,
            "forward_flops": self.forward.value, "backward_flops": self.backward.value,
            "recompute_flops": self.recomputed.value, "training_flops": self.training.value,
            "forward": fig(self.forward), "backward": fig(self.backward), "recompute": fig(self.recomputed),
            "training": fig(self.training),
            "forward_components": self.forward.flat(),
            "tree": self.training.to_dict(),
            "layer_types": [{"label": lt.label, "layers": len(lt.layers), "forward_flops_per_layer":
                             lt.flops_per_layer, "gemms": [_gemm_dict(g) for g in lt.gemms]}
                            for lt in self.layer_types],
            "head_gemms": [_gemm_dict(g) for g in self.head],
            "notes": list(self.notes), "conventions": list(self.conventions),
        }


def _gemm_dict(g: Gemm) -> dict:
    return {"name": g.name, "component": g.component, "m": g.m, "k": g.k, "n": g.n, "count": g.count,
            "forward_flops": g.flops}


def _tree(name: str, per_module: dict[str, dict[str, int]], notes: dict[str, str]) -> Node:
    comps = []
    for c in COMPONENT_ORDER:
        mods = per_module.get(c, {})
        kids = tuple(Node(name=m, value=v, unit="flops") for m, v in mods.items())
        comps.append(Node.of(c, kids, "flops", note=notes.get(c, "")))
    return Node.of(name, comps, "flops")


MIXERS = ("attention", "mla", "linear_attention", "mamba")


def layer_gemms(spec: ModelSpec, layer: LayerSpec, *, batch: int, seq: int, causal: str = "executed",
                gdn_chunk: int = 64, mamba_chunk: int | None = None, deg: Degrees = SINGLE) -> list[Gemm]:
    """The forward GEMMs of one layer, folded from its op list (``trainmath.ops.flops``) on one rank of ``deg``,
    listed block by block as the spec orders them: each block's linears (in op order, matched by the weight
    each multiplies by), the mixer's core (attention, conv, scan) after its linears."""
    return _layer_fold(spec, layer, batch=batch, seq=seq, causal=causal, gdn_chunk=gdn_chunk,
                       mamba_chunk=mamba_chunk, deg=deg)[0]


def _layer_fold(spec: ModelSpec, layer: LayerSpec, *, batch: int, seq: int, causal: str, gdn_chunk: int,
                mamba_chunk: int | None, deg: Degrees = SINGLE) -> tuple[list[Gemm], tuple[bool, ...]]:
    """``layer_gemms`` and, per GEMM, whether torchtitan's op-level selective checkpointing recomputes it
    (``ops.selective``: the linears whose outputs it does not cache, the core unless SDPA's kernel is cached,
    scans and convolutions)."""
    ops = layer_ops(spec, layer, batch=batch, seq=seq, gdn_chunk=gdn_chunk, mamba_chunk=mamba_chunk)
    folded = op_flops.linear_gemms_from_ops(ops, deg, top_k=layer_top_k(layer))
    again = {id(g) for g, run in zip(folded, selective.recomputed_linears(ops, layer)) if run}
    names = [{module_name(t.name) for t in b.tensors if t.kind == "linear"} for b in layer.blocks]
    if any(sum(g.name in mine for mine in names) != 1 for g in folded):
        raise TrainmathError(f"{spec.name} {layer.label}: the op list's linears "
                             f"{sorted(g.name for g in folded)} do not match its blocks' {sorted(set().union(*names))}")
    core = op_flops.core_gemms_from_ops(ops, deg, causal=causal)
    mixer = next((i for i, b in enumerate(layer.blocks) if b.kind in MIXERS), None)
    if core and mixer is None:
        raise TrainmathError(f"{spec.name} {layer.label}: attention or scan ops in a layer without a mixer block")
    if selective.core_recomputed(ops):
        again |= {id(g) for g in core}
    out: list[Gemm] = []
    for i, mine in enumerate(names):
        out += [g for g in folded if g.name in mine] + (core if i == mixer else [])
    return out, tuple(id(g) in again for g in out)


def _not_recomputed(spec: ModelSpec, layer: LayerSpec, batch: int, seq: int, impl: str, notes: list) -> set[str]:
    """The layer's GEMMs full recompute skips under ``impl`` (``flops.checkpoint``), read from its op list; none
    (with a note) for a layer without one."""
    if impl == "megatron":
        return set()
    try:
        return not_recomputed(layer_ops(spec, layer, batch=batch, seq=seq), impl)
    except (TrainmathError, KeyError):
        notes.append(f"{layer.label}: no op list, so the whole layer is counted as recomputed")
        return set()


def count_flops(spec: ModelSpec, *, batch: int, seq: int, causal: str = "executed",
                recompute: str = "none", gdn_chunk: int = 64, mamba_chunk: int | None = None,
                checkpoint: str = "megatron") -> FlopsReport:
    """GEMM FLOPs of one training step of ``batch`` sequences of ``seq`` tokens (see the module docstring).
    ``checkpoint``: what ``recompute="full"`` runs again (``flops.checkpoint``): ``megatron`` the whole layer,
    ``torch`` torch's non-reentrant checkpoint, which stops before the layer's last saving Linear."""
    problems = []
    if checkpoint not in CHECKPOINT_IMPLS:
        problems.append(f"checkpoint must be one of {', '.join(CHECKPOINT_IMPLS)}; got {checkpoint!r}")
    if not isinstance(batch, int) or batch < 1:
        problems.append(f"batch must be a positive integer; got {batch!r}")
    if not isinstance(seq, int) or seq < 1:
        problems.append(f"seq must be a positive integer; got {seq!r}")
    if causal not in CAUSAL:
        problems.append(f"causal must be one of {', '.join(CAUSAL)}; got {causal!r}")
    if recompute not in RECOMPUTE:
        problems.append(f"recompute must be one of {', '.join(RECOMPUTE)}; got {recompute!r}")
    if mamba_chunk is None:  # the config's chunk_size, carried by each Mamba block's dims
        mamba_chunk = next((b.dims.chunk_size for layer in spec.layers for b in layer.blocks if b.kind == "mamba"),
                           128)
    for key, val in (("gdn_chunk", gdn_chunk), ("mamba_chunk", mamba_chunk)):
        if not isinstance(val, int) or val < 1:
            problems.append(f"{key} must be a positive integer; got {val!r}")
    if problems:
        raise TrainmathError("; ".join(problems))

    fwd: dict[str, dict[str, int]] = {}
    rec: dict[str, dict[str, int]] = {}
    notes: dict[str, str] = {}
    report_notes: list[str] = []

    bwd: dict[str, dict[str, int]] = {}

    def add(into: dict, g: Gemm, times: int, flops: int | None = None) -> None:
        mods = into.setdefault(g.component, {})
        mods[g.name] = mods.get(g.name, 0) + (g.flops if flops is None else flops) * times

    layer_types = []
    for layer, idx in spec.layer_groups():
        # every GEMM of the layer as a fold over its op list (``trainmath.ops.flops``), listed by block
        gemms, flags = _layer_fold(spec, layer, batch=batch, seq=seq, causal=causal, gdn_chunk=gdn_chunk,
                                   mamba_chunk=mamba_chunk)
        for b in layer.blocks:
            if core_note(b.kind) and core_note(b.kind) not in report_notes:
                report_notes.append(core_note(b.kind))
        layer_types.append(LayerGemms(label=layer.label, layers=tuple(idx), gemms=tuple(gemms), selective=flags))
        skip = _not_recomputed(spec, layer, batch, seq, checkpoint, report_notes) if recompute == "full" else set()
        for g, again in zip(gemms, flags):
            add(fwd, g, len(idx))
            add(bwd, g, len(idx), g.backward_flops)
            if (recompute == "full" and g.name not in skip) or (recompute == "selective" and again):
                add(rec, g, len(idx))

    head = op_flops.linear_gemms_from_ops(head_ops(spec, batch=batch, seq=seq))
    for g in head:
        add(fwd, g, 1)
        add(bwd, g, 1, g.backward_flops)
    if spec.tie_word_embeddings:
        notes["lm_head"] = "tied to embed_tokens: the matmul still runs"
    notes["embed_tokens"] = "row lookup: no GEMM"

    forward = _tree("forward", fwd, notes)
    backward = _tree("backward", bwd, notes)
    recomputed = _tree("recompute", rec, {})
    training = Node.of("training", [forward, backward, recomputed], "flops",
                       note=f"{batch} × {seq} tokens, causal={causal}, recompute={recompute}")
    conventions = (
        "GEMMs only (2·m·k·n each), as torch.utils.flop_counter counts; norms, activations, softmax, rotary, "
        "bias adds excluded",
        "backward = 2 × forward per GEMM (input and weight gradients); embedding lookups 0",
        f"attention causal={causal}: " + ("every s × s product as eager attention executes it (masked and "
                                          "sliding-window entries included)" if causal == "executed"
                                          else "only attended query-key pairs Σ min(i + 1, window)"),
        "MoE: top_k routed experts per token (the active experts), router and shared experts on every token",
        f"recompute={recompute}: " + {"none": "no recomputation",
                                      "selective": "torchtitan's op-level policy: the layers' linears whose "
                                                   "outputs it does not cache (every 2nd mm, biased addmm, grouped "
                                                   "and bmm experts) and cores not run by SDPA's cached kernel, "
                                                   "forward again; the layer's last saving linear not (early stop)",
                                      "full": "forward of every decoder layer again (LM head not)"
                                      + ("" if checkpoint == "megatron" else "; torch's non-reentrant checkpoint "
                                         "stops early: a layer's last Linear, when nothing after it saves a "
                                         "tensor, is not run again")}[recompute],
    )
    if any(core_note(k) in report_notes for k in ("linear_attention", "mamba")):
        conventions += (f"linear-attention / Mamba-2 cores: chunked as executed, chunk {gdn_chunk} / {mamba_chunk}, "
                        "padded to whole chunks",)
    return FlopsReport(model=spec.name, batch=batch, seq=seq, causal=causal, recompute=recompute, forward=forward,
                       backward=backward, recomputed=recomputed, training=training, layer_types=tuple(layer_types),
                       head=tuple(head), notes=tuple(report_notes) + spec.notes, conventions=conventions)


def selective_recompute_flops(spec, *, batch: int, seq: int) -> int:
    """Recomputed linear FLOPs of one micro-batch over all layers (``count_flops(recompute="selective")``
    without its attention-core part; a family without op lists raises)."""
    selective.check_family(spec)
    rec = count_flops(spec, batch=batch, seq=seq, recompute="selective").recomputed
    return rec.value - rec.flat().get("attention_core", 0)
