"""Multi-head latent attention (DeepSeek-V2/V3, transformers' ``DeepseekV{2,3}Attention``) after the input norm,
and PyTorch's SDPA math fallback that it runs on CPU. Derived from the code, checked by ``tests/activations``.

Projections: q_a_proj (or q_proj without q LoRA) and kv_a_proj_with_mqa read the norm output; with q LoRA the
q_a_layernorm normalises the (T, q_lora) projection for q_b_proj; the kv_a_layernorm normalises the (T, r_kv)
latent, a split view of kv_a_proj's (T, r_kv + rope) output (so in fp32 its "fp32 copy" is that whole output),
for kv_b_proj. RoPE multiplies by cos/sin (or V2's complex freqs), which need no gradient: only the shared
cos/sin are kept (``fold`` prologue). The key is assembled with ``copy_`` (nothing saved).

Attention core (``sdpa_math``): the q/k head dim (nope + rope) differs from v's, so CPU SDPA cannot run its flash
kernel and falls back to the math kernel, which on CPU computes in fp32 whatever the input dtype and keeps the
scaled query and key (4·T·h·qk each), the fp32 softmax (4·b·h·s²) and a contiguous fp32 value (4·T·h·v); o_proj
reads a contiguous copy of its (b, h, s, v) output. (On CUDA PyTorch would pick the memory-efficient kernel
instead: not modelled; the oracle runs on CPU.)

Sharding (torchtitan's DeepSeek plan): q_a/kv_a projections and their norms replicated (whole latent widths),
q_b/kv_b column-wise (heads ÷tp), o_proj row-wise.
"""

from __future__ import annotations

from trainmath.errors import TrainmathError
from trainmath.model.spec import Block, MLADims
from trainmath.ops.cache import mla_cache
from trainmath.ops.context import FP32, Ctx
from trainmath.ops.ir import Axis, Program, Tensor, tensor
from trainmath.ops.kernels.attention import find, heads_axes
from trainmath.ops.kernels.linear import gather_seq, linear
from trainmath.ops.kernels.norms import norm


def sdpa_math(prog: Program, ctx: Ctx, q: Tensor, k: Tensor, v: Tensor, *, heads: int, qk_dim: int,
              v_dim: int, prefix: str = "self_attn", cache: tuple[Tensor, ...] = ()) -> Tensor:
    """PyTorch's math SDPA on CPU (fp32 internally) over per-head (b, s, h, ·) q, k, v; returns o_proj's
    (b, s, h·v) input in the compute dtype. ``cache``: what the inference cache holds of the op."""
    rows = ctx.rows(sp=False)
    hq = (*rows, Axis(heads, "tp"))
    scores = (Axis(ctx.b), Axis(heads, "tp"), Axis(ctx.s, "seq"), Axis(ctx.s))
    saved = (Tensor(name="sdpa_math.query_scaled", axes=(*hq, Axis(qk_dim)), dtype_bytes=FP32, note="fp32 on CPU"),
             Tensor(name="sdpa_math.key_scaled", axes=(*hq, Axis(qk_dim)), dtype_bytes=FP32, note="fp32 on CPU"),
             Tensor(name="sdpa_math.softmax_fp32", axes=scores, dtype_bytes=FP32),
             Tensor(name="sdpa_math.value", axes=(*hq, Axis(v_dim)), dtype_bytes=FP32, note="contiguous fp32 copy"))
    out = Tensor(name=f"{prefix}.o_proj.input", axes=(*rows, Axis(heads * v_dim, "tp")),
                 dtype_bytes=ctx.p.compute_bytes, note="contiguous copy of the (b, h, s, v) output")
    prog.emit("attention", "sdpa_math", inputs=(q, k, v), outputs=(out,), saved=saved, kernel="sdpa_math",
              cache=cache)
    return out


def mla_attention(prog: Program, ctx: Ctx, block: Block, x: Tensor, *, norm_kind: str = "rms",
                  prefix: str = "self_attn") -> Tensor:
    """Append MLA reading ``x`` (the input norm's output); returns o_proj's output."""
    dims = block.dims
    if not isinstance(dims, MLADims):
        raise TrainmathError(f"mla block without MLADims: {block.kind}")
    if ctx.eager:
        raise TrainmathError("the eager profile has no rule for MLA attention; use profile='hf' (SDPA)")
    flash = dims.qk_head_dim == dims.v_head_dim
    if flash:
        ctx.unmodelled(f"MLA with equal q/k and v head dims ({dims.qk_head_dim}) runs SDPA's flash kernel, "
                       f"which the hf profile does not model for MLA")
    h, qk, vd = dims.heads, dims.qk_head_dim, dims.v_head_dim
    rows = ctx.rows(sp=False)
    xg = gather_seq(prog, x, f"{prefix}.input")

    def w(frag: str):
        return find(block, f"{prefix}.{frag}", "linear")

    if dims.q_lora_rank:
        qa = linear(prog, ctx, f"{prefix}.q_a_proj", xg, Axis(dims.q_lora_rank), weight=w("q_a_proj"))
        qa = norm(prog, ctx, norm_kind, f"{prefix}.q_a_layernorm", qa, find(block, "q_a_layernorm"))
        q = linear(prog, ctx, f"{prefix}.q_b_proj", qa, Axis(h * qk, "tp"), weight=w("q_b_proj"))
    else:
        q = linear(prog, ctx, f"{prefix}.q_proj", xg, Axis(h * qk, "tp"), weight=w("q_proj"))
    latent = dims.kv_lora_rank
    kva = linear(prog, ctx, f"{prefix}.kv_a_proj_with_mqa", xg, Axis(latent + dims.qk_rope_head_dim),
                 weight=w("kv_a_proj_with_mqa"))
    kv_latent = kva.view(f"{prefix}.kv_latent", *rows, Axis(latent), note="split view of kv_a_proj's output")
    kvn = norm(prog, ctx, norm_kind, f"{prefix}.kv_a_layernorm", kv_latent, find(block, "kv_a_layernorm"))
    kv = linear(prog, ctx, f"{prefix}.kv_b_proj", kvn, Axis(h * (dims.qk_nope_head_dim + vd), "tp"),
                weight=w("kv_b_proj"))
    # per head: the query, the key assembled from kv_b_proj's k_nope and the shared rotary key (``copy_``), v
    q4 = q.view(f"{prefix}.query", *heads_axes(ctx, h, qk))
    k4 = tensor(f"{prefix}.key", heads_axes(ctx, h, qk), ctx.p.compute_bytes, "k_nope and the rotary key, by copy_")
    v4 = kv.view(f"{prefix}.value", *heads_axes(ctx, h, vd), note="a view of kv_b_proj's output")
    cache = mla_cache(ctx, kv_lora_rank=latent, rope_dim=dims.qk_rope_head_dim, heads=h, qk_dim=qk, v_dim=vd)
    if flash:  # shapes only (``Ctx.shapes_only``): what the flash kernel saves here is not modelled
        o_in = tensor(f"{prefix}.o_proj.input", (*rows, Axis(h * vd, "tp")), ctx.p.compute_bytes)
        prog.emit("attention", "sdpa", inputs=(q4, k4, v4), outputs=(o_in,), kernel="sdpa", cache=cache,
                  note="saved bytes not modelled")
    else:
        o_in = sdpa_math(prog, ctx, q4, k4, v4, heads=h, qk_dim=qk, v_dim=vd, prefix=prefix, cache=cache)
    return linear(prog, ctx, f"{prefix}.o_proj", o_in, Axis(ctx.d), weight=w("o_proj"))
