"""Pre-norm MoE decoder layers: input norm → attention (GQA, or DeepSeek's MLA) → residual → post-attention
norm → a gated MLP (dense layers: ``first_k_dense_replace``, ``mlp_only_layers``) or the sparse block → residual.

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
from trainmath.model.spec import Block, LayerSpec, MLPDims, MoEDims
from trainmath.ops.context import Ctx
from trainmath.ops.families import GROUPED_UNMODELLED, LAYERS, Style
from trainmath.ops.families.dense import blocks, residual
from trainmath.ops.ir import Axis, Program, Tensor
from trainmath.ops.kernels import router as routers
from trainmath.ops.kernels.attention import find, gqa_attention
from trainmath.ops.kernels.experts import eager_experts, routed_experts
from trainmath.ops.kernels.linear import gather_seq, linear
from trainmath.ops.kernels.mla import mla_attention
from trainmath.ops.kernels.mlp import gated_mlp, plain_mlp
from trainmath.ops.kernels.norms import norm


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


def check_experts_path(ctx: Ctx, model_type: str) -> None:
    """The grouped path raises for the families whose grouped_mm path is not modelled."""
    if ctx.experts == "grouped" and model_type in GROUPED_UNMODELLED:
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
    mixer, block, norms = blocks(layer)
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


for _family in ("qwen3_moe", "qwen2_moe", "mixtral", "deepseek_v2", "deepseek_v3", "glm4_moe"):
    LAYERS[_family] = moe_layer
