"""``--explain``: the parameter formula in the notation of Jiang Yi's blog series, with the values substituted.

Symbols (seed, first article): N layers, |V| vocabulary, d hidden size, d_ff MLP width, h_d head dim, h query
heads, h_kv KV heads, n routed experts, k experts per token. Each block's formula is evaluated from its own dims
and checked against the ledger's tensor sum, so the explanation cannot silently drift from the count.
"""

from __future__ import annotations

from dataclasses import dataclass

from trainmath.model.spec import AttentionDims, Block, MLADims, MLPDims, ModelSpec, MoEDims
from trainmath.params import ParamReport, tensor_params


@dataclass(frozen=True, kw_only=True)
class Term:
    what: str
    formula: str
    substituted: str
    value: int
    ledger: int

    @property
    def exact(self) -> bool:
        return self.value == self.ledger


def _block_term(b: Block, d: int, *, activated: bool = False) -> Term:
    ledger = sum(tensor_params(t) for t in b.tensors)
    dims = b.dims
    if isinstance(dims, AttentionDims):
        h, hkv, hd = dims.heads, dims.kv_heads, dims.head_dim
        core = 2 * h * hd * d + 2 * hkv * hd * d
        rest = ledger - core
        formula = "2·h·h_d·d + 2·h_kv·h_d·d"
        sub = f"2·{h}·{hd}·{d} + 2·{hkv}·{hd}·{d}"
        if rest:
            formula += " + (" + _extras_label(b) + ")"
            sub += f" + {rest:,}"
        return Term(what="attention", formula=formula, substituted=sub, value=core + rest, ledger=ledger)
    if isinstance(dims, MoEDims):
        n, k, f = dims.experts, dims.top_k, dims.expert_intermediate
        m = 3 if dims.gated else 2
        used = k if activated else n
        experts = m * used * d * f
        router = n * d
        rest = (layer_activated_block(b) if activated else ledger) - experts - router
        sym = "k" if activated else "n"
        formula = f"n·d + {m}·{sym}·d·d_ff"
        sub = f"{n}·{d} + {m}·{used}·{d}·{f}"
        if rest:
            formula += " + (shared experts, biases)"
            sub += f" + {rest:,}"
        value = router + experts + rest
        return Term(what="moe (activated)" if activated else "moe", formula=formula, substituted=sub, value=value,
                    ledger=layer_activated_block(b) if activated else ledger)
    if isinstance(dims, MLPDims):
        f = dims.intermediate
        if dims.gated:
            core, formula, sub = 3 * d * f, "3·d·d_ff", f"3·{d}·{f}"
        else:
            core, formula, sub = 2 * d * f, "2·d·d_ff", f"2·{d}·{f}"
        rest = ledger - core
        if rest:
            formula += " + (biases)"
            sub += f" + {rest:,}"
        return Term(what="mlp", formula=formula, substituted=sub, value=core + rest, ledger=ledger)
    if isinstance(dims, MLADims):
        return Term(what="mla", formula="Σ MLA projections (DeepSeek-V2 §2.1)", substituted=f"{ledger:,}",
                    value=ledger, ledger=ledger)
    if b.kind == "norm":
        count = len(b.tensors)
        return Term(what="norms", formula=f"{count}·d" if all(t.shape == (d,) for t in b.tensors) else "norms",
                    substituted=f"{count}·{d}", value=sum(t.numel for t in b.tensors), ledger=ledger)
    return Term(what=b.kind, formula=f"Σ {b.kind} tensors", substituted=f"{ledger:,}", value=ledger, ledger=ledger)


def _extras_label(b: Block) -> str:
    """What a block holds beyond its core matrices: q/k norms (2·h_d in Qwen3), biases, sinks, gated query."""
    kinds = {"norm": "q/k norms", "bias": "biases", "param": "sinks"}
    found = [kinds[k] for k in dict.fromkeys(t.kind for t in b.tensors) if k in kinds]
    return ", ".join(found) or "gated query"


def layer_activated_block(b: Block) -> int:
    k = getattr(b.dims, "top_k", 0)
    return sum(0 if t.tied else t.numel * (k if t.experts else 1) for t in b.tensors)


def explain(spec: ModelSpec, report: ParamReport) -> list[str]:
    """Lines of text: symbols, the per-layer-type formulas, the total, and (MoE) the activated count."""
    s = spec.symbols
    names = {"N": "N", "V": "|V|", "d": "d", "d_ff": "d_ff", "h_d": "h_d", "h": "h", "h_kv": "h_kv", "n": "n",
             "k": "k"}
    lines = ["symbols: " + ", ".join(f"{names[k]} = {v:,}" for k, v in s.items() if k in names)]
    d = spec.hidden_size
    total_terms = []
    moe = False
    for layer, idx in spec.layer_groups():
        terms = [_block_term(b, d) for b in layer.blocks]
        per = sum(t.value for t in terms)
        lines.append(f"layer type '{layer.label}' × {len(idx)}:")
        for t in terms:
            mark = "" if t.exact else f"   (ledger {t.ledger:,})"
            lines.append(f"  {t.what:<10} = {t.formula} = {t.substituted} = {t.value:,}{mark}")
        lines.append(f"  per layer  = {per:,}")
        total_terms.append((len(idx), per))
        if any(isinstance(b.dims, MoEDims) for b in layer.blocks):
            moe = True
            act = [_block_term(b, d, activated=isinstance(b.dims, MoEDims)) for b in layer.blocks]
            lines.append(f"  activated  = {sum(t.value for t in act):,}  (MoE with k = {layer_moe_k(layer)} "
                         f"routed experts of n = {layer_moe_n(layer)})")
    emb = report.components.child("embed_tokens").value + report.components.child("pos_embed").value
    head = report.components.child("lm_head").value
    final = sum(tensor_params(t) for t in spec.post if t.component == "norms")
    tied = "tied: 0" if spec.tie_word_embeddings else f"d·|V| = {head:,}"
    lines.append(f"embeddings = d·|V| = {d}·{spec.vocab_size} = {emb:,}" if emb == d * spec.vocab_size
                 else f"embeddings (token + position) = {emb:,}")
    lines.append(f"lm_head    = {tied}")
    lines.append(f"final norm = {final:,}")
    layers_sum = " + ".join(f"{n}·{p:,}" for n, p in total_terms)
    lines.append(f"total      = {layers_sum} + {emb:,} + {head:,} + {final:,} = {report.total_params:,}")
    if moe:
        lines.append(f"activated  = {report.activated_params:,}  (all dense parameters + k of n experts per MoE layer)")
    if "activated_router" in spec.family.blog_formulas and moe:
        n_moe = sum(len(idx) for layer, idx in spec.layer_groups()
                    if any(isinstance(b.dims, MoEDims) for b in layer.blocks))
        seed = report.activated_params - n_moe * (s["n"] - s["k"]) * d
        lines.append(f"note: the activated formula of Jiang Yi's blog series on distributed training counts the "
                     f"router as k·d, not n·d (every token scores all n experts); that gives {seed:,}, "
                     f"{report.activated_params - seed:,} too few")
    if set(s) >= {"N", "V", "d", "d_ff", "h", "h_kv", "h_d"} and "closed_form" in spec.family.blog_formulas:
        N, V, dff, h, hkv, hd = s["N"], s["V"], s["d_ff"], s["h"], s["h_kv"], s["h_d"]
        seed = N * (2 * d + 3 * d * dff + 2 * h * hd * d + 2 * hkv * hd * d + 2 * hd) + d * (2 * V + 1)
        if spec.tie_word_embeddings:
            seed -= d * V
        lines.append("closed form of Jiang Yi's blog series "
                     "N·(2d + 3d·d_ff + 2h·h_d·d + 2h_kv·h_d·d + 2h_d) + d(2|V|+1)"
                     f"{' − d|V| (tied)' if spec.tie_word_embeddings else ''} = {seed:,}")
    return lines


def layer_moe_k(layer) -> int:
    return next(b.dims.top_k for b in layer.blocks if isinstance(b.dims, MoEDims))


def layer_moe_n(layer) -> int:
    return next(b.dims.experts for b in layer.blocks if isinstance(b.dims, MoEDims))
