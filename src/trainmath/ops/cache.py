"""The inference cache as a fold over the op lists: what each mixer op leaves behind after a prefill.

Every op that keeps something for the next decode step names it in ``Op.cache``: one ``Tensor`` per field of
transformers' cache, with full sizes and the sharding rule of each axis, like any tensor of the op list. Its
``kind`` is the store it lives in (``CACHE_KINDS``); the dtype it is stored at is a serving convention
(``infer.kv.CacheFormat``), so the fold counts elements, and ``infer.kv`` turns them into bytes.

- ``kv``: keys and values of an attention op, (b, h_kv, s, h_d) each. The token axis is the op list's sequence
  (rule ``seq``); a sliding-window or chunked op (``Op.window``) keeps at most ``window - 1`` of them
  (``cached_tokens``). The K/V-head axis is ``tp``; when there are fewer K/V heads than ranks each rank holds one
  (``Axis.on`` rounds up), replicated, as vLLM's ``QKVParallelLinear`` does.
- ``latent`` / ``expanded``: MLA's two conventions. ``latent``: the normalised c_KV (kv_lora_rank) and the shared
  rotary key (qk_rope_head_dim) per token (DeepSeek-V2 §2.1.2, eq. 9-10; transformers 5, vLLM, SGLang), whole on
  every tensor-parallel rank; ``expanded``: per-head K (qk_nope + qk_rope) and V (v_head_dim) after kv_b_proj
  (transformers 4.x), heads ``tp``. The fold keeps the kind the convention names.
- ``conv``: the depthwise conv's state, (b, channels, columns): ``kernel`` columns (transformers pads a short
  prefill up to the kernel); the ``kernel-1`` convention (causal-conv1d, vLLM) drops one. Channels ``tp``.
- ``state``: a recurrent state, constant in the context: (b, h_v, d_k, d_v) for Gated DeltaNet (Yang et al.
  2024, eq. 10), (b, H, P, N) for Mamba-2 (Dao & Gu 2024, §7). Heads ``tp``.

The shapes are transformers 5.24's (``DynamicCache`` layers, ``update_conv_state``, ``update_recurrent_state``),
checked against its real cache objects by ``tests/infer/test_cache_oracle.py``.
"""

from __future__ import annotations

from collections.abc import Iterable

from trainmath.arith import ceil_div
from trainmath.errors import TrainmathError
from trainmath.ops.context import Ctx
from trainmath.ops.ir import SINGLE, Axis, Degrees, Op, Tensor

CACHE_KINDS = ("kv", "latent", "expanded", "conv", "state")
MLA_CACHE = ("latent", "expanded")
SLIDING_TOKENS = ("window-1", "window")
CONV_TOKENS = ("kernel", "kernel-1")


def _cached(name: str, kind: str, axes: tuple[Axis, ...], dtype: int, note: str = "") -> Tensor:
    return Tensor(name=name, axes=axes, dtype_bytes=dtype, kind=kind, note=note)


def kv_cache(ctx: Ctx, kv_heads: int, head_dim: int, v_head_dim: int) -> tuple[Tensor, Tensor]:
    """K and V of an attention op as the cache holds them: (b, h_kv, s, h_d) and (b, h_kv, s, h_dv)."""
    b, s, c = ctx.b, ctx.s, ctx.p.compute_bytes
    return (_cached("keys", "kv", (Axis(b), Axis(kv_heads, "tp"), Axis(s, "seq"), Axis(head_dim)), c),
            _cached("values", "kv", (Axis(b), Axis(kv_heads, "tp"), Axis(s, "seq"), Axis(v_head_dim)), c))


def mla_cache(ctx: Ctx, *, kv_lora_rank: int, rope_dim: int, heads: int, qk_dim: int, v_dim: int) -> tuple[Tensor, ...]:
    """MLA's cache in both conventions: the latent (c_KV, k^R) and the expanded per-head K and V."""
    b, s, c = ctx.b, ctx.s, ctx.p.compute_bytes
    return (_cached("latent_kv", "latent", (Axis(b), Axis(s, "seq"), Axis(kv_lora_rank)), c),
            _cached("rope_keys", "latent", (Axis(b), Axis(s, "seq"), Axis(rope_dim)), c),
            _cached("keys", "expanded", (Axis(b), Axis(heads, "tp"), Axis(s, "seq"), Axis(qk_dim)), c),
            _cached("values", "expanded", (Axis(b), Axis(heads, "tp"), Axis(s, "seq"), Axis(v_dim)), c))


def conv_state(ctx: Ctx, channels: int, kernel: int) -> Tensor:
    """The depthwise conv's state: (b, channels, kernel) (the last axis is its columns)."""
    return _cached("conv_state", "conv", (Axis(ctx.b), Axis(channels, "tp"), Axis(kernel)), ctx.p.compute_bytes)


def recurrent_state(ctx: Ctx, heads: int, *dims: int) -> Tensor:
    """A recurrent state: (b, heads, *dims) per layer, whatever the context."""
    return _cached("recurrent_state", "state", (Axis(ctx.b), Axis(heads, "tp"), *(Axis(d) for d in dims)), 4)


def cached_tokens(context: int, window: int | None, convention: str = "window-1") -> int:
    """Tokens a layer holds after a prefill of ``context``: all of them for full attention, at most ``window - 1``
    (transformers) or ``window`` for a sliding/chunked layer. Derived from ``DynamicSlidingWindowLayer.update``,
    which keeps ``full_states[:, :, -window + 1:]``."""
    if window is None:
        return context
    return min(context, window - 1 if convention == "window-1" else window)


def _check(what: str, value: str, allowed: tuple[str, ...]) -> None:
    if value not in allowed:
        raise TrainmathError(f"{what} {value!r} is not one of {', '.join(allowed)}")


def cache_elements(op: Op, t: Tensor, deg: Degrees = SINGLE, *, sliding: str = "window-1",
                   conv: str = "kernel") -> int:
    """Elements of one cache tensor of ``op`` on one rank: its token axis capped by the op's window, a conv
    state's columns by the convention, every other axis divided by its rule."""
    n = t.count
    last = len(t.axes) - 1
    for i, a in enumerate(t.axes):
        size = a.size
        if a.shard == "seq":
            size = cached_tokens(size, op.window, sliding)
        elif t.kind == "conv" and i == last and conv == "kernel-1":
            size -= 1
        n *= ceil_div(size, deg.split(a.shard))
    return n


def cache_fold(ops: Iterable[Op], deg: Degrees = SINGLE, *, mla: str = "latent", sliding: str = "window-1",
               conv: str = "kernel") -> list[tuple[Tensor, int]]:
    """(tensor, elements on one rank) for every tensor the cache holds of ``ops``, in op order; MLA's tensors of
    the ``mla`` convention only."""
    _check("mla cache", mla, MLA_CACHE)
    _check("sliding tokens", sliding, SLIDING_TOKENS)
    _check("conv tokens", conv, CONV_TOKENS)
    skip = "expanded" if mla == "latent" else "latent"
    out = []
    for op in ops:
        for t in op.cache:
            if t.kind not in CACHE_KINDS:
                raise TrainmathError(f"{op.name}: cache tensor {t.name} of kind {t.kind!r} (one of "
                                     f"{', '.join(CACHE_KINDS)})")
            if t.kind != skip:
                out.append((t, cache_elements(op, t, deg, sliding=sliding, conv=conv)))
    return out


def grows(ops: Iterable[Op]) -> bool:
    """Whether the cache of ``ops`` keeps growing with the context: a per-token tensor of an op without a
    window (full attention, MLA)."""
    return any(op.window is None and any(a.shard == "seq" for a in t.axes) for op in ops for t in op.cache)
