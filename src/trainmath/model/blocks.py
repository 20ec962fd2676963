"""Constructors for the blocks that decoder layers are made of, shared by every family.

Each returns a ``Block`` whose tensors carry checkpoint names relative to the layer. The parameter formula of
each block, in the notation of Jiang Yi's blog series (d = hidden size, h = heads, h_kv = KV heads, h_d = head dim,
d_ff = MLP width), is in its docstring; the counts themselves are always the sum of the tensors' shapes.
"""

from __future__ import annotations

from trainmath.model.spec import (
    AttentionDims,
    Block,
    LinearAttentionDims,
    MambaDims,
    MLADims,
    MLPDims,
    MoEDims,
    TensorSpec,
)


def linear(name: str, out_features: int, in_features: int, component: str, shard: str, *, bias: bool = False,
           bias_shard: str | None = None, experts: int = 0) -> tuple[TensorSpec, ...]:
    """An ``nn.Linear(in, out)``: weight (out, in) and optionally bias (out,). A row-parallel layer's bias is
    replicated (added after the reduction); a column-parallel layer's bias is split with its outputs."""
    ts = [TensorSpec(name=f"{name}.weight", shape=(out_features, in_features), component=component, shard=shard,
                     experts=experts)]
    if bias:
        b_shard = bias_shard or ("column" if shard == "column" else "replicated")
        ts.append(TensorSpec(name=f"{name}.bias", shape=(out_features,), component=component, kind="bias",
                             shard=b_shard, experts=experts))
    return tuple(ts)


def norm(name: str, dim: int, component: str = "norms", *, bias: bool = False, shard: str = "replicated"
         ) -> tuple[TensorSpec, ...]:
    """RMSNorm (d: a scale) or LayerNorm (2d: scale and shift), as the first article of Jiang Yi's blog series
    counts them."""
    ts = [TensorSpec(name=f"{name}.weight", shape=(dim,), component=component, kind="norm", shard=shard)]
    if bias:
        ts.append(TensorSpec(name=f"{name}.bias", shape=(dim,), component=component, kind="norm", shard=shard))
    return tuple(ts)


def attention(*, d: int, heads: int, kv_heads: int, head_dim: int, prefix: str = "self_attn",
              q_bias: bool = False, kv_bias: bool = False, o_bias: bool = False, qk_norm: str | None = None,
              qk_norm_bias: bool = False, sinks: bool = False, sliding_window: int | None = None,
              names: tuple[str, str, str, str] = ("q_proj", "k_proj", "v_proj", "o_proj"),
              fused_qkv: str | None = None) -> Block:
    """Grouped-query attention: 2·h·h_d·d + 2·h_kv·h_d·d (+ biases h·h_d + 2·h_kv·h_d [+ d]) (+ q/k norms).

    ``qk_norm``: None; ``"head"`` (RMSNorm over one head, 2·h_d: Qwen3, Gemma 3); ``"full"`` (over all heads,
    h·h_d + h_kv·h_d: OLMo 2); ``"per_head"`` (a separate scale per head, h·h_d + h_kv·h_d: Cohere).
    ``fused_qkv``: the name of a single fused Q/K/V projection (Phi-3 ``qkv_proj``) instead of three.
    """
    q_out, kv_out = heads * head_dim, kv_heads * head_dim
    qn, kn, vn, on = names
    p = f"{prefix}."
    ts: list[TensorSpec] = []
    if fused_qkv:
        ts += linear(p + fused_qkv, q_out + 2 * kv_out, d, "attention", "column", bias=q_bias)
    else:
        ts += linear(p + qn, q_out, d, "attention", "column", bias=q_bias)
        ts += linear(p + kn, kv_out, d, "attention", "column", bias=kv_bias)
        ts += linear(p + vn, kv_out, d, "attention", "column", bias=kv_bias)
    ts += linear(p + on, d, q_out, "attention", "row", bias=o_bias)
    if qk_norm == "head":
        ts += norm(p + "q_norm", head_dim, "attention", bias=qk_norm_bias)
        ts += norm(p + "k_norm", head_dim, "attention", bias=qk_norm_bias)
    elif qk_norm == "full":
        ts += norm(p + "q_norm", q_out, "attention", shard="column")
        ts += norm(p + "k_norm", kv_out, "attention", shard="column")
    elif qk_norm == "per_head":
        ts.append(TensorSpec(name=p + "q_norm.weight", shape=(heads, head_dim), component="attention", kind="norm",
                             shard="head"))
        ts.append(TensorSpec(name=p + "k_norm.weight", shape=(kv_heads, head_dim), component="attention",
                             kind="norm", shard="head"))
    if sinks:
        ts.append(TensorSpec(name=p + "sinks", shape=(heads,), component="attention", kind="param", shard="head"))
    dims = AttentionDims(heads=heads, kv_heads=kv_heads, head_dim=head_dim, v_head_dim=head_dim,
                         sliding_window=sliding_window, sinks=sinks)
    return Block(kind="attention", tensors=tuple(ts), dims=dims)


def mla(*, d: int, dims: MLADims, bias: bool = False, prefix: str = "self_attn") -> Block:
    """Multi-head latent attention (DeepSeek-V2 §2.1, eq. 9–14):
    q: d·h·(d_nope+d_rope) without q LoRA, else d·r_q + r_q (norm) + r_q·h·(d_nope+d_rope);
    kv: d·(r_kv+d_rope) + r_kv (norm) + r_kv·h·(d_nope+d_v); out: h·d_v·d."""
    p = f"{prefix}."
    h = dims.heads
    ts: list[TensorSpec] = []
    if dims.q_lora_rank is None:
        ts += linear(p + "q_proj", h * dims.qk_head_dim, d, "attention", "column")
    else:
        ts += linear(p + "q_a_proj", dims.q_lora_rank, d, "attention", "replicated", bias=bias)
        ts += norm(p + "q_a_layernorm", dims.q_lora_rank, "attention")
        ts += linear(p + "q_b_proj", h * dims.qk_head_dim, dims.q_lora_rank, "attention", "column")
    ts += linear(p + "kv_a_proj_with_mqa", dims.kv_lora_rank + dims.qk_rope_head_dim, d, "attention", "replicated",
                 bias=bias)
    ts += norm(p + "kv_a_layernorm", dims.kv_lora_rank, "attention")
    ts += linear(p + "kv_b_proj", h * (dims.qk_nope_head_dim + dims.v_head_dim), dims.kv_lora_rank, "attention",
                 "column")
    ts += linear(p + "o_proj", d, h * dims.v_head_dim, "attention", "row", bias=bias)
    return Block(kind="mla", tensors=tuple(ts), dims=dims)


def gated_mlp(*, d: int, d_ff: int, prefix: str = "mlp", bias: bool = False, component: str = "mlp_dense",
              names: tuple[str, str, str] = ("gate_proj", "up_proj", "down_proj"), fused: str | None = None,
              experts: int = 0) -> tuple[TensorSpec, ...]:
    """SwiGLU/GeGLU MLP y = W2(W3 x ⊙ act(W1 x)): 3·d·d_ff (+ 2·d_ff + d with biases).
    ``fused``: name of a single gate+up projection of width 2·d_ff (Phi-3 ``gate_up_proj``)."""
    g, u, dn = names
    p = f"{prefix}."
    ts: list[TensorSpec] = []
    if fused:
        ts += linear(p + fused, 2 * d_ff, d, component, "column", bias=bias, experts=experts)
    else:
        ts += linear(p + g, d_ff, d, component, "column", bias=bias, experts=experts)
        ts += linear(p + u, d_ff, d, component, "column", bias=bias, experts=experts)
    ts += linear(p + dn, d, d_ff, component, "row", bias=bias, experts=experts)
    return tuple(ts)


def plain_mlp(*, d: int, d_ff: int, prefix: str = "mlp", bias: bool = True,
              names: tuple[str, str] = ("c_fc", "c_proj"), component: str = "mlp_dense") -> tuple[TensorSpec, ...]:
    """The original transformer's MLP y = W2 act(W1 x + b1) + b2: 2·d·d_ff + d_ff + d (Jiang Yi's blog series,
    first article)."""
    up, down = names
    return (linear(f"{prefix}.{up}", d_ff, d, component, "column", bias=bias)
            + linear(f"{prefix}.{down}", d, d_ff, component, "row", bias=bias))


def dense_mlp_block(tensors: tuple[TensorSpec, ...], *, d: int, d_ff: int, gated: bool) -> Block:
    return Block(kind="mlp", tensors=tensors, dims=MLPDims(hidden=d, intermediate=d_ff, gated=gated))


def moe_block(*, d: int, dims: MoEDims, expert_tensors: tuple[TensorSpec, ...],
              router: tuple[TensorSpec, ...], shared: tuple[TensorSpec, ...] = ()) -> Block:
    """A mixture-of-experts layer: router d·n (+ n bias), n routed experts of 3·d·d_ff_e each, shared experts.
    Activated per token: router + k routed experts + shared experts (Jiang Yi's blog series, first article,
    corrected)."""
    return Block(kind="moe", tensors=router + expert_tensors + shared, dims=dims)


def linear_attention_gdn(*, d: int, dims: LinearAttentionDims, prefix: str = "linear_attn") -> Block:
    """Qwen3-Next's Gated DeltaNet: in_proj_qkvz d·(2·k_dim + 2·v_dim), in_proj_ba d·2·h_v, depthwise conv
    (2·k_dim + v_dim)·kernel, dt_bias and A_log h_v each, gated RMSNorm over one value head, out_proj v_dim·d."""
    k_dim = dims.key_heads * dims.key_head_dim
    v_dim = dims.value_heads * dims.value_head_dim
    conv_dim = 2 * k_dim + v_dim
    p = f"{prefix}."
    c = "linear_attention"
    ts = (
        TensorSpec(name=p + "dt_bias", shape=(dims.value_heads,), component=c, kind="param", shard="head"),
        TensorSpec(name=p + "A_log", shape=(dims.value_heads,), component=c, kind="param", shard="head"),
        TensorSpec(name=p + "conv1d.weight", shape=(conv_dim, 1, dims.conv_kernel), component=c, kind="conv",
                   shard="column"),
        *linear(p + "in_proj_qkvz", 2 * k_dim + 2 * v_dim, d, c, "column"),
        *linear(p + "in_proj_ba", 2 * dims.value_heads, d, c, "column"),
        *norm(p + "norm", dims.value_head_dim, c),
        *linear(p + "out_proj", d, v_dim, c, "row"),
    )
    return Block(kind="linear_attention", tensors=ts, dims=dims)


def mamba2(*, d: int, dims: MambaDims, prefix: str = "mixer", conv_bias: bool = True, proj_bias: bool = False
           ) -> Block:
    """Mamba-2 mixer (Dao & Gu 2024, §7): in_proj d·(2·I + 2·g·N + H) for [z, x, B, C, dt], depthwise conv over
    I + 2·g·N channels (+ bias), dt_bias, A_log and D per head, gated RMSNorm over I, out_proj I·d."""
    inter, gn, h = dims.intermediate, dims.groups * dims.state_size, dims.heads
    conv_dim = inter + 2 * gn
    p = f"{prefix}."
    c = "mamba"
    ts = [
        TensorSpec(name=p + "dt_bias", shape=(h,), component=c, kind="param", shard="head"),
        TensorSpec(name=p + "A_log", shape=(h,), component=c, kind="param", shard="head"),
        TensorSpec(name=p + "D", shape=(h,), component=c, kind="param", shard="head"),
        TensorSpec(name=p + "conv1d.weight", shape=(conv_dim, 1, dims.conv_kernel), component=c, kind="conv",
                   shard="column"),
    ]
    if conv_bias:
        ts.append(TensorSpec(name=p + "conv1d.bias", shape=(conv_dim,), component=c, kind="bias", shard="column"))
    ts += linear(p + "in_proj", 2 * inter + 2 * gn + h, d, c, "column", bias=proj_bias)
    ts += norm(p + "norm", inter, c, shard="column")
    ts += linear(p + "out_proj", d, inter, c, "row", bias=proj_bias)
    return Block(kind="mamba", tensors=tuple(ts), dims=dims)


def norm_block(*names_dims: tuple[str, int], bias: bool = False) -> Block:
    """The layer's own norms (input_layernorm, post_attention_layernorm, ...): d each (2d with LayerNorm bias)."""
    ts: tuple[TensorSpec, ...] = ()
    for name, dim in names_dims:
        ts += norm(name, dim, bias=bias)
    return Block(kind="norm", tensors=ts)
