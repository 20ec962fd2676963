"""Mixture-of-experts families built like Llama: mixtral, qwen2_moe, qwen3_moe (and the config reading of llama4_text,
whose layer is ``families.llama4``).

MoE layer (Jiang Yi's blog series, first article): router d·n + n routed experts of 3·d·d_ff_e each (+ shared experts);
activated per token: router + k routed experts + shared experts. Which layers are sparse is read from the
config exactly as transformers decides it: ``decoder_sparse_step`` and ``mlp_only_layers`` (Qwen),
``moe_layers`` / ``interleave_moe_layer_step`` (Llama 4), every layer (Mixtral).

The op list (``moe_layer``, also DeepSeek's and GLM-4.5's): input norm → attention (GQA, or DeepSeek's MLA) → residual →
post-attention norm → a gated MLP (dense layers: ``first_k_dense_replace``, ``mlp_only_layers``) or the sparse block →
residual.

The sparse block (``moe_block``): the post-attention norm's output enters the tensor-parallel region once; the
replicated router, the routed experts and the shared expert(s) read it. Table columns choose the router
(``Style.router``: Qwen2/3-MoE and Mixtral's softmax top-k, DeepSeek-V3's sigmoid ``noaux_tc`` (GLM-4.5,
Nemotron-H too), DeepSeek-V2's softmax greedy), whether its Linear runs ``F.linear(x.float(), w.float())``
(``router_fp32``), and Mixtral's fp32 routing weights (``fp32_routing``). The shared expert is a gated MLP (relu²
for Nemotron-H) of the spec's width; Qwen2-MoE's is scaled by ``sigmoid(shared_expert_gate(x))``, whose product
keeps the sigmoid (c·T) and the shared expert's output (c·T·d), which a plain MLP never keeps. Derived from the
modeling code, checked by ``tests/activations``.
"""

from __future__ import annotations

from trainmath.errors import TrainmathError
from trainmath.families.base import FamilyDef, TPPlan
from trainmath.families.common import (
    architecture,
    embeddings,
    head,
    head_dim,
    int_list,
    kv_heads,
    layer_parts,
    layer_types,
    residual,
    window_for,
)
from trainmath.model import blocks
from trainmath.model.config import ConfigView
from trainmath.model.spec import Block, LayerSpec, MLPDims, ModelSpec, MoEDims, TensorSpec
from trainmath.ops.context import Ctx
from trainmath.ops.ir import Axis, Program, Tensor
from trainmath.ops.kernels import router as routers
from trainmath.ops.kernels.attention import find, gqa_attention
from trainmath.ops.kernels.experts import eager_experts, routed_experts
from trainmath.ops.kernels.linear import gather_seq, linear
from trainmath.ops.kernels.mla import mla_attention
from trainmath.ops.kernels.mlp import gated_mlp, plain_mlp
from trainmath.ops.kernels.norms import norm
from trainmath.ops.style import Style


def _is_sparse(cfg: ConfigView, mt: str, i: int, n_experts: int) -> bool:
    if mt == "mixtral":
        return True
    if mt == "llama4_text":
        moe_layers = int_list(cfg, "moe_layers", cfg.int("num_hidden_layers"))
        if moe_layers is None:
            step = cfg.int("interleave_moe_layer_step")
            moe_layers = range(step - 1, cfg.int("num_hidden_layers"), step)
        return i in moe_layers
    only = int_list(cfg, "mlp_only_layers", cfg.int("num_hidden_layers"), []) or []
    step = cfg.int("decoder_sparse_step")
    return i not in only and n_experts > 0 and (i + 1) % step == 0


def moe_layer_block(cfg: ConfigView, mt: str, d: int) -> blocks.Block:
    """The sparse feed-forward of one layer, with checkpoint names as each family publishes them."""
    if mt == "mixtral":
        n, k, f = cfg.int("num_local_experts"), cfg.int("num_experts_per_tok"), cfg.int("intermediate_size")
        cfg.require(k <= n, f"num_experts_per_tok ({k}) must not exceed num_local_experts ({n})")
        experts = blocks.gated_mlp(d=d, d_ff=f, prefix="block_sparse_moe.experts.{e}", names=("w1", "w3", "w2"),
                                   component="experts", experts=n)
        router = blocks.linear("block_sparse_moe.gate", n, d, "router", "replicated")
        return blocks.moe_block(d=d, dims=MoEDims(experts=n, top_k=k, expert_intermediate=f, shared_intermediate=0),
                                expert_tensors=experts, router=router)
    if mt == "llama4_text":
        n, k, f = cfg.int("num_local_experts"), cfg.int("num_experts_per_tok"), cfg.int("intermediate_size")
        cfg.require(k <= n, f"num_experts_per_tok ({k}) must not exceed num_local_experts ({n})")
        # Published Llama 4 checkpoints store the experts fused: gate_up (n, d, 2f) and down (n, f, d).
        experts = (
            TensorSpec(name="feed_forward.experts.gate_up_proj", shape=(d, 2 * f), component="experts",
                       shard="column", experts=n, transposed=True),
            TensorSpec(name="feed_forward.experts.down_proj", shape=(f, d), component="experts", shard="row",
                       experts=n, transposed=True),
        )
        router = blocks.linear("feed_forward.router", n, d, "router", "replicated")
        shared = blocks.gated_mlp(d=d, d_ff=f, prefix="feed_forward.shared_expert", component="shared_experts")
        return blocks.moe_block(d=d, dims=MoEDims(experts=n, top_k=k, expert_intermediate=f, shared_intermediate=f),
                                expert_tensors=experts, router=router, shared=shared)
    # qwen2_moe, qwen3_moe
    n, k, f = cfg.int("num_experts"), cfg.int("num_experts_per_tok"), cfg.int("moe_intermediate_size")
    cfg.require(k <= n, f"num_experts_per_tok ({k}) must not exceed num_experts ({n})")
    experts = blocks.gated_mlp(d=d, d_ff=f, prefix="mlp.experts.{e}", component="experts", experts=n)
    router = blocks.linear("mlp.gate", n, d, "router", "replicated")
    shared: tuple[TensorSpec, ...] = ()
    f_shared = 0
    if mt == "qwen2_moe":
        # transformers always builds the shared expert and its gate, even at width 0
        f_shared = cfg.int("shared_expert_intermediate_size", minimum=0)
        shared = blocks.gated_mlp(d=d, d_ff=f_shared, prefix="mlp.shared_expert", component="shared_experts")
        shared += blocks.linear("mlp.shared_expert_gate", 1, d, "shared_experts", "replicated")
    return blocks.moe_block(d=d, dims=MoEDims(experts=n, top_k=k, expert_intermediate=f,
                                              shared_intermediate=f_shared),
                            expert_tensors=experts, router=router, shared=shared)


def build(cfg: ConfigView, name: str) -> ModelSpec:
    mt = cfg.model_type
    d, vocab, n = cfg.int("hidden_size"), cfg.int("vocab_size"), cfg.int("num_hidden_layers")
    h = cfg.int("num_attention_heads")
    hkv, hd = kv_heads(cfg, h), head_dim(cfg, d, h)
    tied = cfg.bool("tie_word_embeddings")
    if mt == "qwen2_moe":
        bias = dict(q_bias=cfg.bool("qkv_bias"), kv_bias=cfg.bool("qkv_bias"))
    elif mt == "mixtral":
        bias = {}
    else:
        bias = dict(q_bias=cfg.bool("attention_bias"), kv_bias=cfg.bool("attention_bias"),
                    o_bias=cfg.bool("attention_bias"))
    qk_norm = "head" if mt == "qwen3_moe" else None  # Llama 4's QK norm is a weightless L2 norm
    ffn_prefix = "feed_forward" if mt == "llama4_text" else "mlp"
    dense_ff = cfg.int("intermediate_size_mlp" if mt == "llama4_text" else "intermediate_size")
    dense = blocks.dense_mlp_block(blocks.gated_mlp(d=d, d_ff=dense_ff, prefix=ffn_prefix), d=d, d_ff=dense_ff,
                                   gated=True)
    sparse = moe_layer_block(cfg, mt, d)
    norms = blocks.norm_block(("input_layernorm", d), ("post_attention_layernorm", d))
    if mt == "llama4_text":
        # Llama4TextConfig: layers that use RoPE (no_rope_layers[i] == 1, all but every no_rope_layer_interval-th)
        # attend within chunks of attention_chunk_size; the others are full attention.
        window = cfg.window("attention_chunk_size")
        interval = cfg.int("no_rope_layer_interval")
        rope = (int_list(cfg, "no_rope_layers", 1) or [int((i + 1) % interval != 0) for i in range(n)])[:n]
        default = ["chunked_attention" if r and window is not None else "full_attention" for r in rope]
    else:
        # Qwen reads the window only with use_sliding_window (transformers writes sliding_window 0 when it is off)
        use_sw = cfg.bool("use_sliding_window", False) if mt != "mixtral" else cfg.window() is not None
        window = cfg.window() if use_sw else None
        default = (["sliding_attention"] * n if use_sw and window is not None else ["full_attention"] * n)
    types = layer_types(cfg, n, default, ("full_attention", "sliding_attention", "chunked_attention"))
    n_experts = sparse.dims.experts
    cache: dict[tuple[str, bool], LayerSpec] = {}
    layers = []
    for i, t in enumerate(types):
        is_sparse = _is_sparse(cfg, mt, i, n_experts)
        key = (t, is_sparse)
        if key not in cache:
            attn = blocks.attention(d=d, heads=h, kv_heads=hkv, head_dim=hd, qk_norm=qk_norm,
                                    sliding_window=window_for(t, window if isinstance(window, int) else None),
                                    **bias)
            cache[key] = LayerSpec(label=f"{t} + {'moe' if is_sparse else 'mlp'}",
                                   blocks=(attn, sparse if is_sparse else dense, norms))
        layers.append(cache[key])
    prefix = "model."
    notes: tuple[str, ...] = ()
    if "ForConditionalGeneration" in architecture(cfg):
        prefix = "language_model.model."  # the multimodal checkpoint nests the text model
    symbols = dict(N=n, V=vocab, d=d, h=h, h_kv=hkv, h_d=hd, n=n_experts, k=sparse.dims.top_k,
                   d_ff=sparse.dims.expert_intermediate)
    cfg.check()
    post = head(vocab, d, tied, final_norm=prefix + "norm",
                name=("language_model.lm_head.weight" if prefix != "model." else "lm_head.weight"))
    return ModelSpec(
        name=name, model_type=mt, architecture=architecture(cfg), vocab_size=vocab, hidden_size=d,
        max_position_embeddings=cfg.int("max_position_embeddings"), layer_prefix=prefix + "layers.{i}.",
        pre=embeddings(vocab, d, prefix + "embed_tokens.weight"), layers=tuple(layers), post=post,
        tie_word_embeddings=tied, notes=notes, symbols=symbols,
    )

def router_weight(block: Block):
    """The router's Linear weight (``mlp.gate.weight``, ``feed_forward.router.weight`` ...) and the block's
    module prefix."""
    w = next((t for t in block.tensors if t.kind == "linear" and not t.experts
              and (t.name.endswith(".gate.weight") or t.name.endswith(".router.weight"))), None)
    if w is None:
        raise TrainmathError(f"MoE block without a router weight: {[t.name for t in block.tensors]}")
    return w, w.name.rsplit(".", 2)[0]


def shared_prefix(block: Block) -> str | None:
    """The module prefix of the shared expert(s) (``mlp.shared_expert``, ``mlp.shared_experts``), or None."""
    t = next((t for t in block.tensors if not t.experts and "shared_expert" in t.name
              and t.name.endswith(("gate_proj.weight", "up_proj.weight"))), None)
    return t.name.rsplit(".", 2)[0] if t else None


def routing(prog: Program, ctx: Ctx, block: Block, x: Tensor, style: Style) -> tuple[Tensor, str]:
    """The router of ``style`` over ``x``; returns (the routing weights, the block prefix)."""
    dims = block.dims
    w, prefix = router_weight(block)
    name = f"{prefix}.{w.name.rsplit('.', 2)[1]}"
    n, k = dims.experts, dims.top_k
    if style.router_fp32:
        logits = routers.fp32_linear(prog, ctx, name, x, w, n)
    else:
        logits = linear(prog, ctx, name, x, Axis(n), weight=w)
    if style.router == "softmax_topk":
        weights = routers.softmax_topk(prog, ctx, name, logits, k, renorm=ctx.router.norm_topk_prob
                                       or style.fp32_routing, fp32_weights=style.fp32_routing)
    elif style.router == "sigmoid_noaux":
        weights = routers.sigmoid_noaux(prog, ctx, name, logits, k, renorm=ctx.router.norm_topk_prob)
    elif style.router == "softmax_greedy":
        weights = routers.softmax_greedy(prog, ctx, name, logits, k, ctx.router.topk_method)
    else:
        raise TrainmathError(f"router {style.router!r} is not one of softmax_topk, sigmoid_noaux, softmax_greedy")
    return weights, prefix


def check_experts_path(ctx: Ctx, style: Style, model_type: str) -> None:
    """The grouped path raises for a family whose grouped_mm path is not modelled (``Style.experts_grouped``)."""
    if ctx.experts == "grouped" and not style.experts_grouped:
        raise TrainmathError(f"the grouped_mm expert path of {model_type} is not modelled; pass --experts eager "
                             f"(transformers' experts_implementation='eager')")


def moe_block(prog: Program, ctx: Ctx, block: Block, h: Tensor, style: Style, *, latent: bool = False) -> None:
    """The sparse block reading ``h`` (the post-attention norm's output), in the module's call order: a
    sigmoid-gated shared expert (Qwen2-MoE, Qwen3-Next) runs first, then the router and the routed experts, then
    its gate; an ungated one (DeepSeek, GLM-4.5, Nemotron-H) after the routed experts. The order is what
    selective checkpointing's every-second-mm count sees. ``latent`` (Nemotron-H's ``moe_latent_size``, shapes
    only): the routed experts run between ``fc1_latent_proj`` (d → latent) and ``fc2_latent_proj`` (latent → d)
    on every token."""
    dims = block.dims
    if not isinstance(dims, MoEDims):
        raise TrainmathError(f"moe block without MoEDims: {block.kind}")
    xg = gather_seq(prog, h, "mlp.input")
    sp = shared_prefix(block) if dims.shared_intermediate else None
    gw = find(block, "shared_expert_gate", "linear") if sp is not None else None
    out = _shared_mlp(prog, ctx, block, xg, style, sp) if gw is not None else None
    weights, prefix = routing(prog, ctx, block, xg, style)
    k, f = dims.top_k, dims.expert_intermediate
    xe = xg
    if latent:
        fc1, fc2 = find(block, "fc1_latent_proj", "linear"), find(block, "fc2_latent_proj", "linear")
        xe = linear(prog, ctx, f"{prefix}.fc1_latent_proj", xg, Axis(fc1.shape[0]), weight=fc1)
    if dims.gated:
        routed_experts(prog, ctx, block, xe, weights, k=k, f=f, prefix=f"{prefix}.experts", act=style.act)
    else:  # non-gated relu² experts (eager only); the weighted output keeps the routing weights' dtype
        eager_experts(prog, ctx, block, xe, weights, k=k, f=f, prefix=f"{prefix}.experts", act="relu2",
                      source_dtype=weights.dtype_bytes)
    if latent:
        lat = Tensor(name=f"{prefix}.experts.output", axes=xe.axes, dtype_bytes=xe.dtype_bytes)
        linear(prog, ctx, f"{prefix}.fc2_latent_proj", lat, Axis(ctx.d), weight=fc2)
    if sp is None:
        return
    if gw is None:
        _shared_mlp(prog, ctx, block, xg, style, sp)
        return
    g = linear(prog, ctx, f"{prefix}.shared_expert_gate", xg, Axis(1), weight=gw)
    sig = Tensor(name=f"{prefix}.shared_expert_gate.sigmoid_out", axes=g.axes, dtype_bytes=g.dtype_bytes,
                 note="(T, 1), saved by sigmoid and by the product")
    prog.emit("act", f"{prefix}.shared_expert_gate.sigmoid", inputs=(g,), outputs=(sig,), saved=(sig,),
              kernel="sigmoid")
    gated = Tensor(name=f"{sp}.gated_out", axes=out.axes, dtype_bytes=out.dtype_bytes)
    prog.emit("mul", f"{sp}.gate_mul", inputs=(sig, out), outputs=(gated,), saved=(sig, out))


def _shared_mlp(prog: Program, ctx: Ctx, block: Block, xg: Tensor, style: Style, sp: str) -> Tensor:
    """The shared expert: a gated MLP, or Nemotron-H's relu² one."""
    dims = block.dims
    if dims.gated:
        return gated_mlp(prog, ctx, block, xg, width=dims.shared_intermediate, prefix=sp, act=style.act,
                         gather=False)
    return plain_mlp(prog, ctx, block, xg, width=dims.shared_intermediate, up="up_proj", down="down_proj",
                     prefix=sp, act="relu2", gather=False)


def ffn(prog: Program, ctx: Ctx, block: Block, h: Tensor, style: Style) -> None:
    """A gated MLP or the sparse block, reading the post-attention norm's output ``h``."""
    if isinstance(block.dims, MoEDims):
        moe_block(prog, ctx, block, h, style)
    elif isinstance(block.dims, MLPDims) and block.dims.gated:
        gated_mlp(prog, ctx, block, h, width=block.dims.intermediate, act=style.act)
    else:
        raise TrainmathError(f"the hf activation profile has no rule for a plain (non-gated) MLP here: {block.kind}")


def moe_layer(prog: Program, ctx: Ctx, layer: LayerSpec, style: Style) -> None:
    """The pre-norm layer with GQA or MLA attention and a gated MLP or the sparse block."""
    mixer, block, norms = layer_parts(layer)
    names = [t.name for t in norms.tensors] if norms else []
    if mixer is None or mixer.kind not in ("attention", "mla") or block is None \
            or names != ["input_layernorm.weight", "post_attention_layernorm.weight"]:
        raise TrainmathError(f"layer {layer.label!r} is not a pre-norm attention + MLP/MoE layer (blocks "
                             f"{[bl.kind for bl in layer.blocks]}, norms {names})")
    x = residual(ctx, "layer.input")
    h = norm(prog, ctx, style.norm, "input_layernorm", x, find(norms, "input_layernorm"))
    if mixer.kind == "mla":
        mla_attention(prog, ctx, mixer, h, norm_kind=style.norm)
    else:
        qk = style.qk_norm if find(mixer, "q_norm") is not None else None
        gqa_attention(prog, ctx, mixer, h, rotary=style.rotary, qk_norm=qk,
                      qk_norm_kind=style.qk_norm_kind or style.norm)
    h = norm(prog, ctx, style.norm, "post_attention_layernorm", residual(ctx, "attention.residual"),
             find(norms, "post_attention_layernorm"))
    ffn(prog, ctx, block, h, style)


QWEN_MOE_LORA = ({"gate": "gate.weight", "gate_proj": "gate_up_proj", "up_proj": "gate_up_proj",
                   "down_proj": "down_proj"}, ("gate_proj", "up_proj"))
"""peft's v4 → v5 MoE target conversion shared by Qwen-style experts (``mlp.experts``, ``mlp.gate``)."""

MIXTRAL = FamilyDef(model_type="mixtral", build=build, layer=moe_layer, style=Style(fp32_routing=True),
                    lora_moe_conversion=({"gate": "gate.weight", "w1": "gate_up_proj", "w3": "gate_up_proj",
                                          "w2": "down_proj"}, ("w1", "w3")))
QWEN2_MOE = FamilyDef(model_type="qwen2_moe", build=build, layer=moe_layer,
                      style=Style(config_defaults=(("norm_topk_prob", False),)))
QWEN3_MOE = FamilyDef(model_type="qwen3_moe", build=build, layer=moe_layer, style=Style(), tp=TPPlan(head_norm_dim=2),
                      lora_moe_conversion=QWEN_MOE_LORA, blog_formulas=("activated_router",))
