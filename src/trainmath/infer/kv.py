"""The inference cache, term by term: K/V per token for attention layers, the latent for MLA, and the constant
conv + recurrent state of linear-attention (Gated DeltaNet) and Mamba-2 layers. Every figure is per
tensor-parallel rank and exact in bytes.

What is held after a prefill of ``context`` tokens (the oracle: transformers' ``DynamicCache`` built from the
config, summed tensor by tensor, in ``tests/infer``):

- full attention: K and V of every token, (batch, h_kv, context, h_d) each;
- sliding-window / chunked attention: only the last ``window - 1`` tokens — transformers'
  ``DynamicSlidingWindowLayer`` keeps ``window - 1`` because the next query brings its own K/V (the ``window``
  convention keeps ``window`` tokens, as a paged engine that allocates the full window would);
- MLA (DeepSeek-V2 §2.1.2): the normalised latent c_KV (kv_lora_rank) and the shared rotary key (qk_rope_head_dim)
  of every token, as one "head". transformers 5 caches exactly this latent (``cache.update(kv_nope, k_rot)`` in
  ``modeling_deepseek_v3``), and so do vLLM/SGLang; older transformers (4.x) cached the decompressed per-head
  K (qk_nope + qk_rope) and V (v_head_dim) — the ``expanded`` convention;
- Gated DeltaNet / Mamba-2: a conv state of the last ``conv_kernel`` inputs of the depthwise conv (transformers
  pads a short prefill up to the kernel; causal-conv1d/vLLM keep ``kernel - 1``), and the recurrent state —
  (h_v, d_k, d_v) per sequence for Gated DeltaNet (Yang et al. 2024, eq. 10), (H, P, N) for Mamba-2 (Dao & Gu
  2024, §7). transformers computes and stores the recurrent state in float32 whatever the model dtype, and
  Nemotron-H's config names ``mamba_ssm_cache_dtype: float32``; the conv state is in the activations' dtype.
"""

from __future__ import annotations

from dataclasses import dataclass

from trainmath.errors import TrainmathError
from trainmath.infer.dtypes import DTYPE_BITS, KV_DTYPES, tensor_bytes
from trainmath.model.spec import AttentionDims, LayerSpec, LinearAttentionDims, MambaDims, MLADims, ModelSpec
from trainmath.tree import Node

MIXERS = ("attention", "mla", "linear_attention", "mamba")


@dataclass(frozen=True, kw_only=True, slots=True)
class CacheFormat:
    """How the cache is stored; every field is a convention printed with the result."""

    kv_dtype: str = "bf16"
    """K/V (and MLA latent) storage: fp32, bf16, fp16, fp8 or int8. fp8/int8 KV usually carries one scale per
    tensor per layer (vLLM ``k_scale``/``v_scale``): a few bytes, not counted."""
    conv_dtype: str = "bf16"
    """Conv state of linear-attention/Mamba layers: the activations' dtype."""
    state_dtype: str = "fp32"
    """Recurrent (SSM / delta-rule) state: float32 in transformers and in Nemotron-H's ``mamba_ssm_cache_dtype``."""
    mla_cache: str = "latent"
    """``latent`` (kv_lora_rank + qk_rope_head_dim per token, transformers 5 / vLLM / SGLang) or ``expanded``
    (per-head K and V after kv_b_proj)."""
    sliding_tokens: str = "window-1"
    """Tokens a sliding/chunked layer keeps: ``window-1`` (transformers' DynamicCache) or ``window``."""
    conv_tokens: str = "kernel"
    """Columns of the conv state: ``kernel`` (transformers) or ``kernel-1`` (causal-conv1d, vLLM)."""

    def __post_init__(self) -> None:
        checks = [("kv dtype", self.kv_dtype, KV_DTYPES), ("conv dtype", self.conv_dtype, ("fp32", "bf16", "fp16")),
                  ("state dtype", self.state_dtype, ("fp32", "bf16", "fp16")),
                  ("mla cache", self.mla_cache, ("latent", "expanded")),
                  ("sliding tokens", self.sliding_tokens, ("window-1", "window")),
                  ("conv tokens", self.conv_tokens, ("kernel", "kernel-1"))]
        for what, value, allowed in checks:
            if value not in allowed:
                raise TrainmathError(f"{what} {value!r} is not one of {', '.join(allowed)}")

    def conventions(self) -> tuple[str, ...]:
        return (
            f"kv cache: K/V at {self.kv_dtype}; conv state at {self.conv_dtype}; recurrent state at "
            f"{self.state_dtype}",
            f"mla cache: {self.mla_cache}"
            + (" (kv_lora_rank + qk_rope_head_dim per token per layer, replicated on every TP rank)"
               if self.mla_cache == "latent" else " (per-head K of qk_nope+qk_rope and V of v_head_dim)"),
            f"sliding/chunked layers keep {self.sliding_tokens} tokens after a prefill"
            + (" (transformers' DynamicSlidingWindowLayer)" if self.sliding_tokens == "window-1" else ""),
            f"conv state keeps {self.conv_tokens} columns"
            + (" (transformers)" if self.conv_tokens == "kernel" else ""),
        )


def kv_heads_per_rank(kv_heads: int, tp: int, what: str = "num_key_value_heads") -> int:
    """K/V heads one TP rank holds: kv/tp when tp divides them; 1 when kv < tp and kv divides tp (each head is
    then replicated on tp/kv ranks, as Megatron and vLLM do); anything else is an error.
    Source: vLLM ``QKVParallelLinear`` (num_kv_head_replicas = tp / kv)."""
    if kv_heads % tp == 0:
        return kv_heads // tp
    if tp % kv_heads == 0:
        return 1
    raise TrainmathError(f"tensor parallel size {tp} must divide {what} ({kv_heads}) or be a multiple of it")


def heads_per_rank(heads: int, tp: int, what: str) -> int:
    """Heads of a head-split tensor on one TP rank; tp must divide them."""
    if heads % tp:
        raise TrainmathError(f"tensor parallel size {tp} must divide {what} ({heads})")
    return heads // tp


def cached_tokens(context: int, window: int | None, convention: str = "window-1") -> int:
    """Tokens a layer holds after a prefill of ``context``: all of them for full attention, at most ``window - 1``
    (transformers) or ``window`` for a sliding/chunked layer. Derived from ``DynamicSlidingWindowLayer.update``,
    which keeps ``full_states[:, :, -window + 1:]``."""
    if window is None:
        return context
    return min(context, window - 1 if convention == "window-1" else window)


def attention_kv_bytes_per_token(dims: AttentionDims, kv_bits: int, tp: int) -> tuple[int, int]:
    """(K, V) bytes per token of one attention layer on one TP rank: h_kv,rank·h_d and h_kv,rank·h_dv elements.
    Seed (third article): KV cache = 2·b·s·N·h_kv·h_d·bytes; K and V are kept apart here because MLA and some
    models have h_dv ≠ h_d."""
    kv = kv_heads_per_rank(dims.kv_heads, tp)
    return tensor_bytes(kv * dims.head_dim, kv_bits), tensor_bytes(kv * dims.v_head_dim, kv_bits)


def mla_kv_bytes_per_token(dims: MLADims, kv_bits: int, tp: int, mode: str) -> tuple[int, int]:
    """(first, second) cached bytes per token of one MLA layer on one TP rank.
    latent: (kv_lora_rank, qk_rope_head_dim) elements — DeepSeek-V2 §2.1.2, eq. 9-10: only c_KV and the decoupled
    rotary key k^R are cached, (d_c + d_h^R)·l elements per token; the latent is shared by all heads, so every TP
    rank keeps all of it. expanded: (h_rank·(qk_nope + qk_rope), h_rank·v_head_dim) elements, K and V per head."""
    if mode == "latent":
        return tensor_bytes(dims.kv_lora_rank, kv_bits), tensor_bytes(dims.qk_rope_head_dim, kv_bits)
    h = heads_per_rank(dims.heads, tp, "num_attention_heads")
    return tensor_bytes(h * dims.qk_head_dim, kv_bits), tensor_bytes(h * dims.v_head_dim, kv_bits)


def _conv_columns(kernel: int, convention: str) -> int:
    return kernel if convention == "kernel" else kernel - 1


def gdn_state_bytes(dims: LinearAttentionDims, fmt: CacheFormat, tp: int) -> tuple[int, int]:
    """(conv, recurrent) bytes per sequence of one Gated DeltaNet layer on one TP rank.
    conv: (2·h_k·d_k + h_v·d_v)/tp channels (q, k, v go through the depthwise conv) × kernel columns;
    recurrent: h_v/tp × d_k × d_v (one d_k × d_v matrix per value head; keys are repeated to the value heads).
    Shapes from transformers ``Qwen3NextGatedDeltaNet.forward`` (``mixed_qkv`` into ``update_conv_state``,
    ``last_recurrent_state`` (b, h_v, d_k, d_v) into ``update_recurrent_state``)."""
    hk = heads_per_rank(dims.key_heads, tp, "linear_num_key_heads")
    hv = heads_per_rank(dims.value_heads, tp, "linear_num_value_heads")
    channels = 2 * hk * dims.key_head_dim + hv * dims.value_head_dim
    conv = tensor_bytes(channels * _conv_columns(dims.conv_kernel, fmt.conv_tokens), DTYPE_BITS[fmt.conv_dtype])
    rec = tensor_bytes(hv * dims.key_head_dim * dims.value_head_dim, DTYPE_BITS[fmt.state_dtype])
    return conv, rec


def mamba_state_bytes(dims: MambaDims, fmt: CacheFormat, tp: int) -> tuple[int, int]:
    """(conv, ssm) bytes per sequence of one Mamba-2 layer on one TP rank.
    conv: (I + 2·g·N)/tp channels (x, B, C go through the conv) × kernel columns; ssm: H/tp × P × N
    (Dao & Gu 2024 §7: one P × N state per head). Shapes from transformers ``NemotronHMamba2Mixer``
    (``hidden_states_B_C`` into ``update_conv_state``, ``final_state`` (b, H, P, N) into ``update_recurrent_state``).
    tp must divide the heads and the groups (replicating groups when g < tp, as vLLM can, is not modelled)."""
    h = heads_per_rank(dims.heads, tp, "mamba_num_heads")
    g = heads_per_rank(dims.groups, tp, "n_groups")
    channels = h * dims.head_dim + 2 * g * dims.state_size
    conv = tensor_bytes(channels * _conv_columns(dims.conv_kernel, fmt.conv_tokens), DTYPE_BITS[fmt.conv_dtype])
    ssm = tensor_bytes(h * dims.head_dim * dims.state_size, DTYPE_BITS[fmt.state_dtype])
    return conv, ssm


def layer_cache(layer: LayerSpec, *, batch: int, context: int, fmt: CacheFormat, tp: int) -> tuple[Node, ...]:
    """The cache tensors of one layer on one TP rank, as nodes in bytes (empty for a layer without a mixer)."""
    bits = DTYPE_BITS[fmt.kv_dtype]
    out: list[Node] = []
    for block in layer.blocks:
        d = block.dims
        if block.kind == "attention":
            k, v = attention_kv_bytes_per_token(d, bits, tp)
            n = batch * cached_tokens(context, d.sliding_window, fmt.sliding_tokens)
            out += [Node(name="keys", value=k * n, unit="bytes"), Node(name="values", value=v * n, unit="bytes")]
        elif block.kind == "mla":
            k, v = mla_kv_bytes_per_token(d, bits, tp, fmt.mla_cache)
            n = batch * context
            names = ("latent_kv", "rope_keys") if fmt.mla_cache == "latent" else ("keys", "values")
            out += [Node(name=names[0], value=k * n, unit="bytes"), Node(name=names[1], value=v * n, unit="bytes")]
        elif block.kind in ("linear_attention", "mamba"):
            conv, rec = (gdn_state_bytes if block.kind == "linear_attention" else mamba_state_bytes)(d, fmt, tp)
            out += [Node(name="conv_state", value=batch * conv, unit="bytes"),
                    Node(name="recurrent_state", value=batch * rec, unit="bytes")]
    return tuple(out)


def cache_tree(spec: ModelSpec, *, batch: int, context: int, fmt: CacheFormat, tp: int) -> Node:
    """The whole cache on one TP rank: one child per layer type (its value over all layers of the type), each
    with its tensors (keys, values, latent_kv, rope_keys, conv_state, recurrent_state) summed over those layers."""
    groups = []
    for layer, idx in spec.layer_groups():
        per_layer = layer_cache(layer, batch=batch, context=context, fmt=fmt, tp=tp)
        children = [Node(name=c.name, value=c.value * len(idx), unit="bytes") for c in per_layer]
        groups.append(Node.of(f"{layer.label} x{len(idx)}", children, "bytes",
                              note=f"{sum(c.value for c in per_layer):,} bytes per layer"))
    return Node.of("kv_cache", groups, "bytes")


def grows_with_context(spec: ModelSpec, fmt: CacheFormat) -> bool:
    """Whether any layer's cache keeps growing with the context (full attention or MLA), i.e. whether the
    largest context that fits is finite."""
    for layer in spec.layers:
        for b in layer.blocks:
            if b.kind == "mla" or (b.kind == "attention" and b.dims.sliding_window is None):
                return True
    return False


def kv_bytes_per_token(spec: ModelSpec, *, fmt: CacheFormat, tp: int) -> int:
    """Cache bytes one more token of context adds on one TP rank once every sliding window is full: the K/V of
    the full-attention and MLA layers (the seed's 2·N·h_kv·h_d·bytes for a dense model)."""
    big = 1 << 40  # a context beyond every window: sliding layers are saturated at both points
    a = cache_tree(spec, batch=1, context=big, fmt=fmt, tp=tp).value
    b = cache_tree(spec, batch=1, context=big + 1, fmt=fmt, tp=tp).value
    return b - a
