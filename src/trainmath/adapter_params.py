"""peft's ``target_parameters``: LoRA on a bare ``nn.Parameter`` (peft's ``lora.ParamWrapper``), which is how peft
reaches transformers 5's MoE routed experts (fused 3-d Parameters ``experts.gate_up_proj`` / ``experts.down_proj``)
and the routers stored as a bare weight (``mlp.gate.weight``, gpt-oss's ``mlp.router.weight``).

What peft 0.21 does (``tuners/lora/layer.py``, ``ParamWrapper``):
- a 3-d Parameter of shape (E, a, b) gets ``lora_A = nn.Linear(in, r·E)`` and ``lora_B = nn.Linear(r·E, out)``
  (``_get_in_out_features``: ``in, out = a, b``, swapped when the layer is not ``is_transposed``), so r·E·(a + b)
  trainable parameters, r·(in + out) per expert; a 2-d weight (out, in) gets r·(in + out);
- the parameter is matched as ``target_modules`` strings are (``tuners_utils._inject_parameters``): the full name
  ``<module>.<parameter>`` equals the target or ends with ``"." + target``;
- every forward, ``_activate_lora`` parametrizes the weight as ``W + scaling · lhs @ rhs`` (``_LoraFactorsProxy``,
  one ``baddbmm`` per (E, a, r) × (E, r, b), in the weight's dtype) under ``parametrize.cached()``: the adapted
  weight is a new tensor of the whole expert stack, and the experts' GEMMs now take its gradient.

The ledger names experts as transformers 4 did (``experts.{e}.gate_proj.weight``) for the families transformers 5
converts, or as transformers 5 does (gpt-oss, Llama 4); ``hf_parameters`` gives both the names transformers 5's
modules hold: the column-parallel expert weights of a layer fused into ``<block>.experts.gate_up_proj`` (gate then
up, as ``gate_up_proj`` is concatenated), the row-parallel one ``<block>.experts.down_proj``.
"""

from __future__ import annotations

from dataclasses import dataclass

from trainmath.errors import TrainmathError

NONE = "none"
"""``--lora-targets none``: no Linear modules, only ``--lora-target-parameters`` (peft's ``target_modules=[]``)."""


@dataclass(frozen=True, kw_only=True)
class HFParameter:
    """One parameter peft can wrap with ``target_parameters``, named relative to its layer as transformers 5 holds
    it, in every layer that has it."""

    name: str
    experts: int
    """E of a 3-d expert stack; 1 for a 2-d weight (a router)."""
    in_features: int
    out_features: int
    """Per expert: the GEMM's reduction and output widths (gate_up_proj: in = hidden, out = 2·moe_intermediate)."""
    layers: tuple[int, ...]
    ledger: tuple[str, ...]
    """The ledger tensors it stands for (one per fused part)."""


def _hf_name(t, v4_block: str | None) -> str:
    """transformers 5's layer-relative name of a ledger expert / router weight. ``v4_block``: the sparse block's
    ledger name in a layer whose experts the ledger names as transformers 4 did (Mixtral's
    ``block_sparse_moe``); every model type transformers 5 converts holds that block as ``mlp``."""
    name = t.name
    if v4_block is not None and name.startswith(v4_block + "."):
        name = "mlp" + name[len(v4_block):]
    if ".{e}." not in name:
        return name
    return f"{name.split('.{e}.')[0]}.{'gate_up_proj' if t.shard == 'column' else 'down_proj'}"


def hf_parameters(spec) -> dict[str, HFParameter]:
    """Every routed-expert and router weight of ``spec`` as transformers 5's modules hold it (see the module
    docstring), in order of first appearance."""
    found: dict[str, dict] = {}
    for i, layer in enumerate(spec.layers):
        per: dict[str, dict] = {}
        v4 = next((t.name.split(".experts.{e}.")[0] for t in layer.tensors if ".experts.{e}." in t.name), None)
        for t in layer.tensors:
            if t.kind != "linear" or not (t.experts or t.component == "router"):
                continue
            out_f, in_f = reversed(t.shape) if t.transposed else t.shape
            e = per.setdefault(_hf_name(t, v4), {"experts": t.experts or 1, "in": in_f, "out": 0, "ledger": []})
            e["out"] += out_f
            e["ledger"].append(t.name)
        for name, e in per.items():
            entry = found.setdefault(name, {**e, "layers": []})
            if (entry["experts"], entry["in"], entry["out"]) != (e["experts"], e["in"], e["out"]):
                raise TrainmathError(f"parameter {name} changes shape across layers; per-layer LoRA is not modelled")
            entry["layers"].append(i)
    return {n: HFParameter(name=n, experts=e["experts"], in_features=e["in"], out_features=e["out"],
                           layers=tuple(e["layers"]), ledger=tuple(e["ledger"])) for n, e in found.items()}


def matches(name: str, target: str) -> bool:
    """peft's rule for a string in ``target_parameters``: the name equals it or ends with ``"." + target``."""
    return name == target or name.endswith("." + target)


def parameter_targets(spec, targets: tuple[str, ...], flag: str = "--lora-target-parameters") -> list[HFParameter]:
    """The parameters ``targets`` name, or a one-line error naming what the model has."""
    have = hf_parameters(spec)
    if not have and targets:
        raise TrainmathError(f"{flag} {','.join(targets)}: {spec.name} has no routed experts or router parameters "
                             f"(a dense model's Linears are --lora-targets modules)")
    chosen: dict[str, HFParameter] = {}
    for target in targets:
        hits = [p for n, p in have.items() if matches(n, target)]
        if not hits:
            raise TrainmathError(f"{flag} {target}: no such routed-expert or router parameter in {spec.name}; it "
                                 f"has {', '.join(have)}")
        for p in hits:
            chosen[p.name] = p
    return list(chosen.values())


def delta_weight_flops(p: HFParameter, rank: int) -> int:
    """FLOPs of one ``ParamWrapper`` forward of ``p`` in one layer: ``baddbmm`` of (E, a, r) × (E, r, b),
    2·E·a·b·r (derived from ``_LoraFactorsProxy.forward``); its backward is the two factors' gradients, twice
    that (the frozen W needs none)."""
    return 2 * p.experts * p.in_features * p.out_features * rank
