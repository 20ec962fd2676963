"""Exact parameter counts from a ``ModelSpec``: total, per component, per layer type, activated per token.

Conventions, stated in every output:
- *total* counts unique parameters: a tied lm_head adds nothing (it is embed_tokens' storage).
- *activated* per token = everything dense (embeddings, attention, norms, dense MLPs, router, shared experts)
  + top_k of the n routed experts of each MoE layer. The embedding row lookup is counted as activated, as
  model cards do (Qwen3-235B-A22B: 22,190,763,520; Jiang Yi's blog series gives 22.14e9, counting the router
  as k·d instead of n·d).
- *non-embedding* excludes embed_tokens, pos_embed and an untied lm_head (Kaplan et al. 2020 exclude
  embeddings; an untied output matrix is counted with them here, the convention of most model cards).
"""

from __future__ import annotations

from dataclasses import dataclass

from trainmath.model.spec import COMPONENTS, EMBEDDING_COMPONENTS, ExtraTensors, ModelSpec, TensorSpec
from trainmath.tree import Node


@dataclass(frozen=True, kw_only=True)
class LayerTypeCount:
    label: str
    layers: int
    params_per_layer: int
    activated_per_layer: int

    @property
    def params(self) -> int:
        return self.layers * self.params_per_layer


@dataclass(frozen=True, kw_only=True)
class ParamReport:
    """The parameter ledger's totals. ``components`` is a tree: component → module (e.g. attention → q_proj)."""

    model: str
    model_type: str
    total_params: int
    activated_params: int
    non_embedding_params: int
    components: Node
    activated: Node
    layer_types: tuple[LayerTypeCount, ...]
    extras: tuple[ExtraTensors, ...]
    notes: tuple[str, ...]
    conventions: tuple[str, ...]

    def to_dict(self) -> dict:
        return {
            "model": self.model,
            "model_type": self.model_type,
            "total_params": self.total_params,
            "activated_params": self.activated_params,
            "non_embedding_params": self.non_embedding_params,
            "components": self.components.flat(),
            "activated_components": self.activated.flat(),
            "component_tree": self.components.to_dict(),
            "layer_types": [
                {"label": lt.label, "layers": lt.layers, "params_per_layer": lt.params_per_layer,
                 "activated_per_layer": lt.activated_per_layer, "params": lt.params} for lt in self.layer_types
            ],
            "not_counted": [{"label": e.label, "params": e.params, "why": e.why} for e in self.extras],
            "notes": list(self.notes),
            "conventions": list(self.conventions),
        }


CONVENTIONS = (
    "total counts unique tensors: a tied lm_head adds 0",
    "activated = all dense parameters (embeddings included) + top_k routed experts per MoE layer",
    "non_embedding excludes embed_tokens, pos_embed and an untied lm_head",
)


def _module(t: TensorSpec) -> str:
    """The module a tensor belongs to, without layer/expert indices: ``self_attn.q_proj``, ``mlp.experts.w1``."""
    parts = t.name.split(".")
    if parts[-1] in ("weight", "bias"):
        parts = parts[:-1]
    return ".".join(p for p in parts if p != "{e}")


def tensor_params(t: TensorSpec) -> int:
    """Unique parameters a tensor adds: numel × copies, or 0 when tied to another tensor."""
    return 0 if t.tied else t.numel * t.copies


def layer_activated(layer) -> int:
    """Parameters of one layer a token runs through: top_k copies of routed-expert tensors, all of the rest."""
    total = 0
    for b in layer.blocks:
        k = getattr(b.dims, "top_k", 0)
        for t in b.tensors:
            total += 0 if t.tied else t.numel * (k if t.experts else 1)
    return total


def count_params(spec: ModelSpec) -> ParamReport:
    """The exact ledger of ``spec``: every tensor counted once, grouped by component and module."""
    # component → module → params (ordered by first appearance)
    per: dict[str, dict[str, int]] = {c: {} for c in COMPONENTS}
    act: dict[str, int] = dict.fromkeys(COMPONENTS, 0)

    def add(t: TensorSpec, times: int, active_copies: int) -> None:
        per[t.component][_module(t)] = per[t.component].get(_module(t), 0) + tensor_params(t) * times
        act[t.component] += (0 if t.tied else t.numel * active_copies) * times

    for t in spec.pre + spec.post:
        add(t, 1, 1)
    layer_counts = []
    for layer, idx in spec.layer_groups():
        n = len(idx)
        for b in layer.blocks:
            k = getattr(b.dims, "top_k", 0)
            for t in b.tensors:
                add(t, n, k if t.experts else 1)
        layer_counts.append(LayerTypeCount(label=layer.label, layers=n,
                                           params_per_layer=sum(tensor_params(t) for t in layer.tensors),
                                           activated_per_layer=layer_activated(layer)))
    comp_nodes = []
    for c in COMPONENTS:
        kids = tuple(Node(name=m, value=v, unit="params") for m, v in per[c].items())
        note = "tied to embed_tokens" if c == "lm_head" and spec.tie_word_embeddings else ""
        comp_nodes.append(Node.of(c, kids, "params", note=note))
    components = Node.of("total", comp_nodes, "params")
    activated = Node.of("activated", [Node(name=c, value=act[c], unit="params") for c in COMPONENTS], "params")
    emb = sum(components.child(c).value for c in EMBEDDING_COMPONENTS)
    return ParamReport(
        model=spec.name, model_type=spec.model_type, total_params=components.value,
        activated_params=activated.value, non_embedding_params=components.value - emb, components=components,
        activated=activated, layer_types=tuple(layer_counts), extras=spec.extras, notes=spec.notes,
        conventions=CONVENTIONS,
    )
