"""The ``megatron`` activation profile: Korthikanti et al. 2022, "Reducing Activation Recomputation in Large
Transformer Models" (arXiv:2205.05198), eq. (1)-(2) and Table 2: sbh(34 + 5as/h) per layer with TP/SP/selective
variants, for a GPT layer whose heads and hidden size are read from the spec (GQA, SwiGLU, q_dim ≠ d and MoE are
not in the paper's model and not modelled)."""

from __future__ import annotations

from collections.abc import Sequence

from trainmath.errors import TrainmathError
from trainmath.model.spec import AttentionDims, MLADims, ModelSpec
from trainmath.tree import Node, scaled


def _leaf(name: str, value: int, note: str = "") -> Node:
    return Node(name=name, value=value, unit="bytes", note=note)


def megatron_layer_terms(*, s: int, b: int, h: int, a: int, t: int = 1, sp: bool = False, selective: bool = False,
                         cp: int = 1, act_bytes: int = 2) -> list[Node]:
    """Korthikanti et al. 2022, §4.1 and Table 2: one GPT layer's activations, tensor by tensor.

    Attention (11sbh + 5as²b with 2-byte activations): QKV input 2sbh, Q and K 4sbh, softmax 2as²b, its dropout
    mask as²b, dropout output 2as²b, V 2sbh, output projection input 2sbh, dropout mask sbh. MLP (19sbh): input
    2sbh, first Linear output 8sbh, GeLU output 8sbh, dropout mask sbh. Two LayerNorm inputs: 4sbh. Total
    sbh(34 + 5as/h). Tensor parallelism t divides the 24sbh + 5as²b inside the attention and MLP blocks; sequence
    parallelism also divides the 10sbh of LayerNorms, dropouts and block inputs; selective recompute drops the
    5as²b core-attention term. Masks are 1 byte, other tensors ``act_bytes`` (the paper: 2). Context parallelism
    cp (derived, not in the paper): each rank keeps s/cp queries, so every term is divided by cp.
    """
    x = act_bytes
    sbh = s * b * h
    rep = t if sp else 1  # the parts Table 2 keeps replicated without sequence parallelism
    terms = [
        ("layernorm inputs", 2 * x * sbh, rep),
        ("attention: QKV input", x * sbh, rep),
        ("attention: Q, K", 2 * x * sbh, t),
        ("attention: V", x * sbh, t),
        ("attention: projection input", x * sbh, t),
        ("attention: dropout mask", sbh, rep),
        ("mlp: input", x * sbh, rep),
        ("mlp: first linear output", 4 * x * sbh, t),
        ("mlp: GeLU output", 4 * x * sbh, t),
        ("mlp: dropout mask", sbh, rep),
    ]
    if not selective:
        terms += [
            ("attention: softmax output", x * a * s * s * b, t),
            ("attention: softmax dropout mask", a * s * s * b, t),
            ("attention: dropout output", x * a * s * s * b, t),
        ]
    out = []
    for name, value, div in terms:
        out.append(_leaf(name, value // (div * cp), f"/{div * cp}" if div * cp > 1 else ""))
    return out


def activations_megatron(spec: ModelSpec, *, micro_batch: int, seq: int, recompute: str = "none", tp: int = 1,
                         sp: bool = False, cp: int = 1, layers: Sequence[int] = (), compute_dtype_bytes: int = 2
                         ) -> Node:
    """The ``megatron`` profile: Korthikanti et al. 2022 per layer (``megatron_layer_terms``) × layers on the rank.
    Full recompute keeps each layer's input, 2sbh (Table 2 last row; /t with sequence parallelism).
    Heads a and hidden h are read from the spec (a = query heads, h = hidden size), as the paper's GPT has them.
    Embedding, final norm and logits are not in Table 2 and are not added."""
    if tp < 1 or cp < 1:
        raise TrainmathError(f"tp ({tp}) and cp ({cp}) must be at least 1")
    if sp and tp == 1:
        raise TrainmathError("sp=True needs tp > 1 (sequence parallelism splits along the tensor-parallel group)")
    if seq % (tp if sp else 1) or seq % cp:
        raise TrainmathError(f"seq ({seq}) must be divisible by tp ({tp}) with sp and by cp ({cp})")
    heads = _heads(spec)
    b, s, h = micro_batch, seq, spec.hidden_size
    if recompute == "full":
        one = [_leaf("layer input (checkpoint)", compute_dtype_bytes * s * b * h // ((tp if sp else 1) * cp))]
    else:
        one = megatron_layer_terms(s=s, b=b, h=h, a=heads, t=tp, sp=sp, selective=recompute == "selective",
                                   cp=cp, act_bytes=compute_dtype_bytes)
    n = len(layers)
    layer = Node.of("per layer", one, "bytes")
    return Node.of(f"activations (megatron, recompute={recompute})",
                   [scaled(layer, n, f"layers × {n}", f"{layer.value} bytes per layer")],
                   "bytes", note=f"Korthikanti et al. 2022 Table 2; b={b}, s={s}, h={h}, a={heads}, t={tp}, "
                                 f"sp={sp}, cp={cp}")


def _heads(spec: ModelSpec) -> int:
    for layer in spec.layers:
        for bl in layer.blocks:
            if isinstance(bl.dims, (AttentionDims, MLADims)):
                return bl.dims.heads
    raise TrainmathError(f"{spec.name}: no attention layer, the megatron profile needs attention heads")
