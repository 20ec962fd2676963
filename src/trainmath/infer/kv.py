"""The inference cache, term by term: K/V per token for attention layers, the latent for MLA, and the constant
conv + recurrent state of linear-attention (Gated DeltaNet) and Mamba-2 layers. Every figure is per
tensor-parallel rank and exact in bytes, a fold over each layer's op list: every mixer op names the tensors the
cache keeps of it (``trainmath.ops.cache``, their shapes and sharding rules); this module stores them in a
``CacheFormat``.

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
from trainmath.model.spec import LayerSpec, ModelSpec
from trainmath.tree import Node


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
    kv_heads: str = "model-code"
    """Heads an attention layer's K/V cache holds: ``model-code`` (as the model's transformers code caches them:
    ``num_heads`` for Falcon's new decoder architecture, whose ``FalconAttention`` broadcasts K/V before caching)
    or ``kv-heads`` (the config's K/V heads, as serving engines allocate the cache: TensorRT-LLM's
    ``FalconForCausalLM.prepare_inputs`` passes ``num_kv_heads`` to the cache, NVIDIA/TensorRT-LLM
    tensorrt_llm/models/falcon/model.py@027cd518e3b63809a5c5799187991e7f1164fb12; vLLM's ``FalconAttention``
    builds ``Attention(num_kv_heads=config.num_kv_heads // tp)``, vllm-project/vllm
    vllm/model_executor/models/falcon.py@00620f91ea186ca295a1eb69f4acba9d0efaaaaa). The two differ only where
    the model code caches more heads than the config's K/V heads."""

    def __post_init__(self) -> None:
        checks = [("kv dtype", self.kv_dtype, KV_DTYPES), ("conv dtype", self.conv_dtype, ("fp32", "bf16", "fp16")),
                  ("state dtype", self.state_dtype, ("fp32", "bf16", "fp16")),
                  ("mla cache", self.mla_cache, ("latent", "expanded")),
                  ("sliding tokens", self.sliding_tokens, ("window-1", "window")),
                  ("conv tokens", self.conv_tokens, ("kernel", "kernel-1")),
                  ("kv heads", self.kv_heads, KV_HEADS)]
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
            f"engine stores KV heads as: {self.kv_heads}"
            + (" (the heads the model's transformers code caches)" if self.kv_heads == "model-code"
               else " (the config's K/V heads, as TensorRT-LLM and vLLM allocate the cache)"),
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


KV_HEADS = ("model-code", "kv-heads")
"""``CacheFormat.kv_heads`` conventions."""

STORE = {"kv": "kv_dtype", "latent": "kv_dtype", "expanded": "kv_dtype", "conv": "conv_dtype",
         "state": "state_dtype"}
"""The ``CacheFormat`` field that gives each cache store (``ops.cache.CACHE_KINDS``) its dtype."""


def _ops(spec: ModelSpec, layer: LayerSpec, *, batch: int, context: int) -> list:
    from trainmath.ops.emit import layer_ops  # the op lists import the kernels: only when a cache is folded

    return layer_ops(spec, layer, batch=batch, seq=context)


def layer_cache(spec: ModelSpec, layer: LayerSpec, *, batch: int, context: int, fmt: CacheFormat,
                tp: int) -> tuple[Node, ...]:
    """The cache tensors of one layer on one TP rank, as nodes in bytes (empty for a layer without a mixer): a
    fold over the layer's op list (``ops.cache.cache_fold``), each tensor at its store's dtype."""
    from trainmath.ops.cache import cache_fold
    from trainmath.ops.ir import Degrees

    fold = cache_fold(_ops(spec, layer, batch=batch, context=context), Degrees(tp=tp), mla=fmt.mla_cache,
                      sliding=fmt.sliding_tokens, conv=fmt.conv_tokens)
    if fmt.kv_heads == "kv-heads":
        fold = [(t, _as_kv_heads(layer, t, n, tp)) for t, n in fold]
    return tuple(Node(name=t.name, value=tensor_bytes(n, DTYPE_BITS[getattr(fmt, STORE[t.kind])]), unit="bytes")
                 for t, n in fold)


def _as_kv_heads(layer: LayerSpec, t, elements: int, tp: int) -> int:
    """Elements of a K/V cache tensor (b, heads, s, h_d) on one rank when the engine stores the config's K/V
    heads: ``elements`` / (its heads per rank) · (the K/V heads per rank, ``kv_heads_per_rank``)."""
    if t.kind != "kv":
        return elements
    stored = {b.dims.kv_heads for b in layer.blocks if b.kind == "attention"}
    held = t.axes[1].size
    if len(stored) != 1 or held in stored:
        return elements
    per_rank = -(-held // tp)
    return elements // per_rank * kv_heads_per_rank(stored.pop(), tp)


def validate_tp(spec: ModelSpec, tp: int) -> None:
    """tp must divide the attention heads; K/V heads must be a multiple or a divisor of tp; GDN and Mamba heads
    and groups must be divisible. One error quoting the values."""
    if tp <= 0:
        raise TrainmathError(f"tensor parallel size must be positive, got {tp}")
    for layer, _ in spec.layer_groups():
        for b in layer.blocks:
            d = b.dims
            if b.kind == "attention":
                heads_per_rank(d.heads, tp, "num_attention_heads")
                kv_heads_per_rank(d.kv_heads, tp)
            elif b.kind == "mla":
                heads_per_rank(d.heads, tp, "num_attention_heads")
            elif b.kind == "linear_attention":
                heads_per_rank(d.key_heads, tp, "linear_num_key_heads")
                heads_per_rank(d.value_heads, tp, "linear_num_value_heads")
            elif b.kind == "mamba":
                heads_per_rank(d.heads, tp, "mamba_num_heads")
                heads_per_rank(d.groups, tp, "n_groups")


def cache_tree(spec: ModelSpec, *, batch: int, context: int, fmt: CacheFormat, tp: int) -> Node:
    """The whole cache on one TP rank: one child per layer type (its value over all layers of the type), each
    with its tensors (keys, values, latent_kv, rope_keys, conv_state, recurrent_state) summed over those layers.
    tp must divide the heads as ``validate_tp`` says (K/V heads: or be a multiple of them)."""
    validate_tp(spec, tp)
    groups = []
    for layer, idx in spec.layer_groups():
        per_layer = layer_cache(spec, layer, batch=batch, context=context, fmt=fmt, tp=tp)
        children = [Node(name=c.name, value=c.value * len(idx), unit="bytes") for c in per_layer]
        groups.append(Node.of(f"{layer.label} x{len(idx)}", children, "bytes",
                              note=f"{sum(c.value for c in per_layer):,} bytes per layer"))
    return Node.of("kv_cache", groups, "bytes")


def grows_with_context(spec: ModelSpec, fmt: CacheFormat) -> bool:
    """Whether any layer's cache keeps growing with the context (full attention or MLA), i.e. whether the
    largest context that fits is finite (``ops.cache.grows`` over each layer's op list)."""
    from trainmath.ops.cache import grows

    return any(grows(_ops(spec, layer, batch=1, context=1)) for layer, _ in spec.layer_groups())


def kv_bytes_per_token(spec: ModelSpec, *, fmt: CacheFormat, tp: int) -> int:
    """Cache bytes one more token of context adds on one TP rank once every sliding window is full: the K/V of
    the full-attention and MLA layers (the blog series' 2·N·h_kv·h_d·bytes for a dense model)."""
    big = 1 << 40  # a context beyond every window: sliding layers are saturated at both points
    a = cache_tree(spec, batch=1, context=big, fmt=fmt, tp=tp).value
    b = cache_tree(spec, batch=1, context=big + 1, fmt=fmt, tp=tp).value
    return b - a
