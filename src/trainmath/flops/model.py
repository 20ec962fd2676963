"""Training FLOPs of a model per step, per sequence and per token, as a tree that sums per GEMM.

A step is one forward and one backward pass over ``batch`` sequences of ``seq`` tokens, plus the forward that
activation recomputation repeats:

- forward: every GEMM of ``trainmath.flops.gemm`` over every layer, plus the LM head over every token;
- backward: 2× the forward of every GEMM (input and weight gradients, or both operands for attention);
  the embedding lookup has no GEMM in either direction;
- recompute (``recompute``): ``none``; ``selective`` is torchtitan's op-level selective checkpointing as
  ``trainmath train --recompute selective`` runs it (``trainmath.ops.selective``): the backward re-runs the
  forward of each layer's ops whose outputs the policy does not cache (every second mm, biased ``addmm``s,
  ``_grouped_mm`` and ``bmm`` experts, eager attention's and SDPA's math fallback's core, scans), except the
  layer's last saving linear, where torch's checkpoint stops the recompute (checked against FlopCounterMode in
  ``tests/flops/test_selective_flops.py``); a family without op lists raises. (Korthikanti et al. 2022's
  selective recompute, the attention core alone, is the ``megatron`` memory profile's, not counted here.)
  ``full`` re-runs the forward of every decoder layer (not the LM head), as Megatron-LM's full checkpointing does.

The linears' GEMMs are a fold over each layer type's op list (``trainmath.ops.flops``, the ops ``trainmath
memory`` folds too), equal to ``flops.gemm.linear_gemms`` over the spec's blocks for every catalog model
(``tests/ops/test_flops_fold.py``); a family without an op list (Kimi-K2), or a config its emitter does not model
(a note says which), counts them from the spec's blocks. The attention core, conv and scan GEMMs come from the
blocks' dims (``flops.gemm.core_gemms``).

Linear-attention (Gated DeltaNet) and Mamba-2 layers count their chunked cores as transformers' torch path runs
them, over whole chunks (``gdn_chunk``, 64 in transformers; ``mamba_chunk``, the config's ``chunk_size``).

Everything scales with ``batch`` exactly, so per-sequence figures are exact integers; per-token figures are
floats (the attention term grows with ``seq``).
"""

from __future__ import annotations

from dataclasses import dataclass

from trainmath.errors import TrainmathError
from trainmath.flops.gemm import CAUSAL, Gemm, _module, core_gemms, core_note, linear_gemms
from trainmath.model.spec import Block, LayerSpec, ModelSpec
from trainmath.ops import families, selective
from trainmath.ops.flops import layer_ops, layer_top_k, linear_gemms_from_ops
from trainmath.tree import Node

RECOMPUTE = ("none", "selective", "full")

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


def _op_linears(spec: ModelSpec, layer: LayerSpec, batch: int, seq: int
                ) -> tuple[list[list[Gemm]] | None, str, set[int] | None]:
    """The linear GEMMs folded from a layer's op list, grouped by the spec block whose linear tensor each
    multiplies by (in op order within a block), so that a layer lists each block's linears then its core; or
    (None, why) when the family has no op list or its emitter does not model this config (its saved bytes are
    unknown, e.g. MLA with equal q/k and v head dims): the linears are then counted from the spec's blocks.
    Third: the ``id``s of the GEMMs torchtitan's op-level selective checkpointing recomputes (``ops.selective``:
    the linears whose outputs it does not cache, the attention core unless SDPA's kernel is cached, scans and
    convolutions), None without an op list."""
    if spec.model_type not in families.LAYERS:
        return None, "", None
    try:
        ops = layer_ops(spec, layer, batch=batch, seq=seq)
    except TrainmathError as e:
        return None, f"{layer.label}: linears counted from the spec's blocks, as the op list does not model it ({e})", \
            None
    folded = linear_gemms_from_ops(ops, top_k=layer_top_k(layer))
    names = [{_module(t.name) for t in b.tensors if t.kind == "linear"} for b in layer.blocks]
    groups = [[g for g in folded if g.name in mine] for mine in names]
    if any(sum(g.name in mine for mine in names) != 1 for g in folded):
        raise TrainmathError(f"{spec.name} {layer.label}: the op list's linears "
                             f"{sorted(g.name for g in folded)} do not match its blocks' {sorted(set().union(*names))}")
    again = {id(g) for g, run in zip(folded, selective.recomputed_linears(ops, layer)) if run}
    return groups, "", again | ({CORE} if selective.core_recomputed(ops) else set())


CORE = -1
"""In ``_op_linears``' recomputed set: the layer's core GEMMs (attention, scans) are recomputed."""


def count_flops(spec: ModelSpec, *, batch: int, seq: int, causal: str = "executed",
                recompute: str = "none", gdn_chunk: int = 64, mamba_chunk: int | None = None) -> FlopsReport:
    """GEMM FLOPs of one training step of ``batch`` sequences of ``seq`` tokens (see the module docstring)."""
    problems = []
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

    tokens = batch * seq
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
        gemms: list[Gemm] = []
        # the linears as a fold over the layer's op list (``trainmath.ops.flops``), listed by block
        linears, why, again = _op_linears(spec, layer, batch, seq)
        if why:
            report_notes.append(why)
        if recompute == "selective" and again is None:
            raise TrainmathError(f"--recompute selective counts torchtitan's op-level policy over the layer's op "
                                 f"list; {spec.name} ({spec.model_type}) {layer.label} has none"
                                 + (f" ({why})" if why else "") + ": use --recompute full or none")
        for b in layer.blocks:
            gemms += linear_gemms(b, tokens) if linears is None else linears.pop(0)
            cores = core_gemms(b, batch=batch, seq=seq, causal=causal, gdn_chunk=gdn_chunk, mamba_chunk=mamba_chunk)
            gemms += cores
            if again is not None and CORE in again:
                again |= {id(g) for g in cores}
            if core_note(b.kind) and core_note(b.kind) not in report_notes:
                report_notes.append(core_note(b.kind))
        flags = () if again is None else tuple(id(g) in again for g in gemms)
        layer_types.append(LayerGemms(label=layer.label, layers=tuple(idx), gemms=tuple(gemms), selective=flags))
        for g in gemms:
            add(fwd, g, len(idx))
            add(bwd, g, len(idx), g.backward_flops)
            if recompute == "full" or (recompute == "selective" and id(g) in again):
                add(rec, g, len(idx))

    head = linear_gemms(Block(kind="head", tensors=tuple(t for t in spec.post if t.kind == "linear")), tokens)
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
                                      "full": "forward of every decoder layer again (LM head not)"}[recompute],
    )
    if any(core_note(k) in report_notes for k in ("linear_attention", "mamba")):
        conventions += (f"linear-attention / Mamba-2 cores: chunked as executed, chunk {gdn_chunk} / {mamba_chunk}, "
                        "padded to whole chunks",)
    return FlopsReport(model=spec.name, batch=batch, seq=seq, causal=causal, recompute=recompute, forward=forward,
                       backward=backward, recomputed=recomputed, training=training, layer_types=tuple(layer_types),
                       head=tuple(head), notes=tuple(report_notes) + spec.notes, conventions=conventions)
