"""The ``6N + attention`` closed form, shown beside the per-GEMM count as a cross-check.

Training FLOPs per token ≈ 6N + 6·Σ_layers s·h·(d_qk + d_v):
- 6N: each parameter of a matmul does one multiply-add (2 FLOPs) per token forward and twice that backward
  (Kaplan et al. 2020, "Scaling Laws for Neural Language Models", §2.1 and Table 1: C ≈ 6N; Hoffmann et al. 2022,
  Chinchilla, Appendix F, counts the same with the embedding and output matrices included).
- attention: per token and layer, Q·Kᵀ and P·V are 2·s·h·d_qk + 2·s·h·d_v forward and twice that backward:
  6·s·h·(d_qk + d_v) = 12·s·h·Q when d_qk = d_v = Q — PaLM's 12·L·H·Q·T (Chowdhery et al. 2022, Appendix B),
  which does not halve for causal masking. With ``causal="half"`` the term is halved instead (Megatron-LM's
  convention, Narayanan et al. 2021 §5.1).

N here is the activated parameter count per token (``trainmath.params``: top_k routed experts) without the
input embeddings (a lookup, no matmul) and with the LM head's matrix even when tied (its matmul runs).
It still includes norm scales and biases, which do no GEMM, so it slightly over-counts; linear-attention and
Mamba layers contribute no attention term. Recomputation is not included.
"""

from __future__ import annotations

from dataclasses import dataclass

from trainmath.errors import TrainmathError
from trainmath.model.spec import MLADims, ModelSpec
from trainmath.ops.gemm import CAUSAL


@dataclass(frozen=True, kw_only=True, slots=True)
class ClosedForm:
    matmul_params: int
    """N: activated parameters without input embeddings, with the (possibly tied) LM head."""
    attention_flops_per_token: float
    """6·Σ_layers s·h·(d_qk + d_v), halved for causal="half"."""
    tokens: int

    @property
    def per_token_flops(self) -> float:
        return 6 * self.matmul_params + self.attention_flops_per_token

    @property
    def training_flops(self) -> float:
        return self.per_token_flops * self.tokens

    def to_dict(self) -> dict:
        return {"matmul_params": self.matmul_params, "six_n_per_token": 6 * self.matmul_params,
                "attention_flops_per_token": self.attention_flops_per_token,
                "per_token_flops": self.per_token_flops, "training_flops": self.training_flops}


def matmul_params(spec: ModelSpec) -> int:
    """N of 6N: activated parameters (``count_params``) − embed_tokens − pos_embed + a tied LM head's matrix."""
    from trainmath.params import count_params

    act = count_params(spec).activated
    n = act.value - act.child("embed_tokens").value - act.child("pos_embed").value
    n += sum(t.numel for t in spec.post if t.tied and t.kind == "linear")
    return n


def attention_term_per_token(spec: ModelSpec, *, seq: int, causal: str = "executed") -> float:
    """6·Σ_layers s·h·(d_qk + d_v) FLOPs per token, training (PaLM Appendix B's 12·L·H·Q·T generalised to MLA's
    unequal d_qk and d_v); halved for ``causal="half"``."""
    if causal not in CAUSAL:
        raise TrainmathError(f"causal must be one of {', '.join(CAUSAL)}; got {causal!r}")
    total = 0
    for layer in spec.layers:
        for b in layer.blocks:
            if b.kind == "attention":
                total += 6 * seq * b.dims.heads * (b.dims.head_dim + b.dims.v_head_dim)
            elif b.kind == "mla" and isinstance(b.dims, MLADims):
                total += 6 * seq * b.dims.heads * (b.dims.qk_head_dim + b.dims.v_head_dim)
    return total / 2 if causal == "half" else float(total)


def closed_form_flops(spec: ModelSpec, *, batch: int, seq: int, causal: str = "executed") -> ClosedForm:
    """Training FLOPs (forward + backward, no recompute) of ``batch`` × ``seq`` tokens by 6N + attention."""
    return ClosedForm(matmul_params=matmul_params(spec),
                      attention_flops_per_token=attention_term_per_token(spec, seq=seq, causal=causal),
                      tokens=batch * seq)
