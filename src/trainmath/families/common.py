"""Pieces every family shares: the model-level tensors, head_dim, layer types, validation of heads, and the
layer parts and residual stream the emitters read."""

from __future__ import annotations

from trainmath.model.blocks import norm
from trainmath.model.config import ConfigView, show
from trainmath.model.spec import LayerSpec, TensorSpec
from trainmath.ops.context import Ctx
from trainmath.ops.ir import Axis, Tensor


def head_dim(cfg: ConfigView, d: int, heads: int) -> int:
    """``head_dim`` from the config when set; else hidden_size / heads, as transformers derives it."""
    explicit = cfg.get("head_dim", None)
    if explicit is not None:
        return cfg.int("head_dim")
    cfg.require(d % heads == 0, f"hidden_size ({d}) must be divisible by num_attention_heads ({heads}) when "
                                f"head_dim is not set")
    return max(1, d // heads)


def kv_heads(cfg: ConfigView, heads: int, key: str = "num_key_value_heads") -> int:
    """KV heads (default: as many as query heads), checked to divide the query heads."""
    kv = cfg.int(key) if cfg.get(key, None) is not None else heads
    cfg.require(heads % kv == 0, f"{key} ({kv}) must divide num_attention_heads ({heads})")
    return kv


def embeddings(vocab: int, d: int, name: str = "model.embed_tokens.weight") -> tuple[TensorSpec, ...]:
    """Token embedding: |V|·d (seed: the first term of d(2|V|+1))."""
    return (TensorSpec(name=name, shape=(vocab, d), component="embed_tokens", kind="embedding", shard="vocab"),)


def head(vocab: int, d: int, tied: bool, *, final_norm: str = "model.norm", norm_bias: bool = False,
         name: str = "lm_head.weight") -> tuple[TensorSpec, ...]:
    """Final norm (d, or 2d for LayerNorm) and the LM head |V|·d (0 new parameters when tied)."""
    return norm(final_norm, d, bias=norm_bias) + (
        TensorSpec(name=name, shape=(vocab, d), component="lm_head", shard="vocab", tied=tied),)


# The layer types transformers' configs name (``layer_types``) that trainmath builds.
LAYER_TYPES = ("full_attention", "sliding_attention", "chunked_attention", "linear_attention")


def layer_types(cfg: ConfigView, n: int, default: list[str], known: tuple[str, ...] = LAYER_TYPES) -> list[str]:
    """The config's ``layer_types`` when given (checked for length and names), else the family's derivation."""
    given = cfg.data.get("layer_types")
    if given is None:
        return default
    if not isinstance(given, list) or len(given) != n:
        cfg.invalid.append(f"layer_types must list one type per layer ({n}), got "
                           f"{len(given) if isinstance(given, list) else show(given)}")
        return default
    bad = list(dict.fromkeys(t for t in given if t not in known))
    if bad:
        cfg.invalid.append(f"layer_types has unknown types {show(bad)}; known: {', '.join(known)}")
        return default
    return list(given)


def int_list(cfg: ConfigView, key: str, n: int, default: list[int] | None = None) -> list[int] | None:
    """A list of layer indices (``mlp_only_layers``, ``moe_layers``) or 0/1 flags: integers in 0..n."""
    value = cfg.get(key, default)
    if value is None:
        return default
    if not isinstance(value, list) or not all(isinstance(v, int) and not isinstance(v, bool) and 0 <= v <= max(n, 1)
                                              for v in value):
        cfg.invalid.append(f"{key} must be a list of layer indices (integers in 0..{n}), got {show(value)}")
        return default
    return value


def window_for(kind: str, window: int | None) -> int | None:
    """The attention window of a layer type: the sliding window for sliding/chunked layers, else None."""
    return window if kind in ("sliding_attention", "chunked_attention") else None


def architecture(cfg: ConfigView) -> str:
    archs = cfg.data.get("architectures") or []
    if not isinstance(archs, list) or not all(isinstance(a, str) for a in archs):
        cfg.invalid.append(f"architectures must be a list of class names, got {show(archs)}")
        return cfg.model_type
    return archs[0] if archs else cfg.model_type

def layer_parts(layer: LayerSpec):
    """(mixer, ffn, norm block) of a layer (None where absent)."""
    mixer = next((bl for bl in layer.blocks if bl.kind in ("attention", "mla", "linear_attention", "mamba")), None)
    ffn = next((bl for bl in layer.blocks if bl.kind in ("mlp", "moe")), None)
    norms = next((bl for bl in layer.blocks if bl.kind == "norm"), None)
    return mixer, ffn, norms


def residual(ctx: Ctx, name: str) -> Tensor:
    """A (b, s, d) tensor of the residual stream (in the embedding's dtype: fp32 under autocast)."""
    return Tensor(name=name, axes=(*ctx.rows(), Axis(ctx.d)), dtype_bytes=ctx.p.residual_bytes)
