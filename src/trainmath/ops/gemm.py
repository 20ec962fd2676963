"""The GEMMs of a model, per step: name, shape (m, k, n) and batch count; the linears of a spec block, and the
formulas the op folds (``trainmath.ops.flops``) count the rest with.

A GEMM multiplies an (m, k) matrix by a (k, n) one, ``count`` times: 2·m·k·n·count FLOPs (one multiply and one
add per term). Only matrix products are counted, as ``torch.utils.flop_counter.FlopCounterMode`` does (it sees
mm, addmm, bmm, baddbmm, sdpa and convolution); norms, activations, softmax, rotary embeddings, residual adds and
bias adds are left out. Embedding lookups are row gathers: 0 FLOPs.

Shapes, per block kind (b = batch, s = sequence, t = b·s tokens):
- a ``linear`` tensor of shape (out, in): m = t, k = in, n = out (``nn.Linear``, x @ W.T; GPT-2's Conv1D alike).
  A bias is added by the same ``addmm`` and adds no FLOPs here.
- routed experts (MoE): m = t·top_k in total across experts (each token runs top_k experts), k and n as above;
  the router is an ordinary linear (m = t, k = d, n = experts); shared experts run on every token.
- attention core (an ``attention`` op of any kernel, ``ops.flops.attention_gemms``): scores Q·Kᵀ with m = s,
  k = head_dim (MLA: qk_nope + qk_rope), n = s_kv, and values P·V with m = s, k = s_kv, n = v_head_dim, each
  ``count`` = b·heads times (K/V heads are repeated to the query heads first, so GQA runs h products, not h_kv).
- ``linear_attention`` (Gated DeltaNet) and ``mamba`` (Mamba-2): projections as above, the depthwise causal
  conv1d (counted like FlopCounterMode counts a convolution: 2·b·(s + K − 1)·K per channel, the output before
  trimming the K − 1 padded positions, ``ops.flops.conv_gemm``), and the chunked core as transformers' torch
  path executes it (sequence padded to whole chunks; ``ops.flops.scan_gemms``). Fused kernels
  (fla, mamba_ssm) run the same chunked algorithm; their exact FLOPs may differ by masked or padded work.

What FlopCounterMode (torch 2.13) sees, checked by ``tests/flops`` on tiny transformers 5.24 models:
every ``nn.Linear``/``F.linear`` (the MoE router included), eager attention's two matmuls, the eager per-expert
loop (``experts_implementation="eager"``; the default ``grouped_mm`` is invisible to it), depthwise conv1d, and
the chunked einsums/matmuls of Gated DeltaNet and Mamba-2, all equal to the folds' forward count. It does not
see CPU SDPA (``_scaled_dot_product_flash_attention_for_cpu``) nor triangular solves; it counts a depthwise
conv's backward as (C + 1)× its forward (``groups`` ignored). Llama 4 in transformers runs every expert on every
token, num_experts / top_k times the active expert FLOPs counted here.

Causal masking (``causal``): ``"executed"`` (default) counts the s × s_kv products as eager attention executes
them, masked entries included, which is what FlopCounterMode reports; sliding windows are also executed in full.
``"half"`` counts only the query-key pairs a causal (and windowed) mask keeps, Σᵢ min(i + 1, w), which is
s(s + 1)/2 without a window: the work a causal flash kernel can skip to.
"""

from __future__ import annotations

from dataclasses import dataclass

from trainmath.errors import TrainmathError
from trainmath.model.spec import Block, TensorSpec

CAUSAL = ("executed", "half")


@dataclass(frozen=True, kw_only=True, slots=True)
class Gemm:
    """One matrix product of the forward pass, ``count`` times (m, k) @ (k, n)."""

    name: str
    """Module name without layer/expert indices (``self_attn.q_proj``), or ``attention.scores`` / ``.values``."""
    component: str
    """The parameter-ledger component (``attention``, ``experts``, ...) or ``attention_core`` for Q·Kᵀ and P·V."""
    m: int
    k: int
    n: int
    count: int = 1
    weighted: bool = True
    """True when one operand is a weight (backward: input grad + weight grad); False for activation × activation
    (attention: grads for both operands). Either way backward runs two GEMMs of the forward's size."""

    @property
    def flops(self) -> int:
        """Forward FLOPs: 2·m·k·n per product (derived: k multiplies and k − 1 adds, counted as 2k, per output)."""
        return 2 * self.m * self.k * self.n * self.count

    @property
    def backward_flops(self) -> int:
        """Backward FLOPs: 2× forward. For Y = X·W: dX = dY·Wᵀ (m·n·k) and dW = Xᵀ·dY (k·m·n); for S = Q·Kᵀ:
        dQ and dK alike (derived; Kaplan et al. 2020 §2.1, 'the backward pass is twice the forward')."""
        return 2 * self.flops


def in_out(t: TensorSpec) -> tuple[int, int]:
    """(in_features, out_features) of a linear weight: stored (out, in), GPT-2 Conv1D and fused experts (in, out)."""
    if len(t.shape) != 2:
        raise TrainmathError(f"linear tensor {t.name} has shape {t.shape}; expected 2 dimensions")
    return (t.shape[0], t.shape[1]) if t.transposed else (t.shape[1], t.shape[0])


def module_name(name: str) -> str:
    parts = name.split(".")
    if parts[-1] == "weight":
        parts = parts[:-1]
    return ".".join(p for p in parts if p != "{e}")


def linear_gemms(block: Block, tokens: int) -> list[Gemm]:
    """One GEMM per ``linear`` tensor of ``block``; routed-expert tensors run on tokens·top_k rows in total."""
    top_k = getattr(block.dims, "top_k", 0)
    out = []
    for t in block.tensors:
        if t.kind != "linear":
            continue
        k, n = in_out(t)
        m = tokens * top_k if t.experts else tokens
        out.append(Gemm(name=module_name(t.name), component=t.component, m=m, k=k, n=n))
    return out


def attended_pairs(seq: int, kv_seq: int, *, causal: str, window: int | None) -> int:
    """Query-key pairs whose products are counted, per head and sequence.

    ``executed``: seq·kv_seq (eager attention computes every entry, then masks).
    ``half``: query i (0-based, the last ``seq`` of ``kv_seq`` positions) sees keys j ≤ i + (kv_seq − seq) and,
    with a window w, the last w of them: Σᵢ min(i + 1 + kv_seq − seq, w) (derived). Without a window and
    seq = kv_seq that is s(s + 1)/2, the '½ for causal' of Megatron-LM's and PaLM's formulas plus the diagonal.
    """
    if causal not in CAUSAL:
        raise TrainmathError(f"causal must be one of {', '.join(CAUSAL)}; got {causal!r}")
    if causal == "executed":
        return seq * kv_seq
    offset = kv_seq - seq
    if window is None:
        window = kv_seq
    # queries i < c see i + 1 + offset keys, the other seq − c see the full window
    c = max(0, min(window - offset, seq))
    return c * (c + 1) // 2 + c * offset + (seq - c) * window


def core_note(kind: str) -> str:
    """How a block whose core is not attention is counted."""
    return {
        "linear_attention": "Gated DeltaNet: chunked delta rule (chunk 64) and depthwise conv1d counted as "
                            "transformers' torch path executes them; triangular solves not counted",
        "mamba": "Mamba-2: chunked SSD scan and depthwise conv1d counted as transformers' torch path executes them",
    }.get(kind, "")
