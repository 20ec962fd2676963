"""Activation memory: the bytes a training step saves for backward, per layer type and per saved tensor.

Two profiles describe two implementations:

- ``hf`` (default): transformers 5.x modeling code with SDPA attention, ``use_cache=False``, no padding mask (SDPA
  runs ``is_causal`` and native GQA), dropout 0. Every term is one tensor that autograd keeps, found by running the
  modeling code under ``torch.autograd.graph.saved_tensors_hooks`` and counting distinct storages (parameters
  excluded); ``tests/activations`` asserts exact equality on tiny models. ``eager`` is the same with
  ``attn_implementation="eager"`` (the s² softmax is saved).
- ``megatron``: Korthikanti et al. 2022, "Reducing Activation Recomputation in Large Transformer Models", eq. (1)-(2)
  and Table 2: sbh(34 + 5as/h) per layer with TP/SP/selective variants (``activations_megatron`` below).

Recompute: ``none``; ``full`` is transformers' ``gradient_checkpointing_enable()`` (whole layers, measured);
``selective`` exists only in the ``megatron`` profile (Korthikanti et al. §5: drop the 5as²b core-attention term).
For ``hf``/``eager`` it raises on purpose: transformers has no selective checkpointing, and a definition of our own
(e.g. ``torch.utils.checkpoint`` around SDPA) would model no code a user can run; with SDPA the core attention keeps
only q, k, v, the output and the logsumexp, all of which the neighbouring Linears need anyway.

Families (``HF_FAMILIES``): llama, mistral, qwen2, qwen3, qwen3_moe, qwen2_moe (sigmoid-gated shared expert),
mixtral, olmo2, deepseek_v2/v3 (MLA, CPU SDPA math fallback, see ``mla_saved``), phi3 (fused qkv/gate_up),
gemma2 (eager: transformers' default for it), gemma3_text, glm4_moe, starcoder2 (dropout 0), cohere (parallel
attention and MLP, Cohere LayerNorms), gpt2 (Conv1D, fused c_attn, gelu_new; resid/embd/attn dropout 0: nonzero
dropout adds masks that are not modelled; ``reorder_and_upcast_attn`` not modelled), falcon (rotary, no bias;
multi-head, multi-query and the new decoder architecture; see ``_falcon_layer``), gpt_oss (eager attention with
sinks, its default; biased clamped SwiGLU experts; a bf16 model here is ``model.to(bfloat16)``: ``from_pretrained``
with a bf16 dtype keeps the norms in fp32 (``_keep_in_fp32_modules``), which is not modelled). llama4_text (the text model of
``llama4``; see ``_llama4_layer``: every routed expert runs over all T tokens, so expert activations scale with n,
not top-k; needs ``attention_chunk_size``), qwen3_next (Gated DeltaNet on transformers' torch fallback, chunked
and padded to 64, see ``gated_deltanet_saved``; gated attention; shared expert with a sigmoid gate), nemotron_h
(Mamba-2 on the torch path, see ``mamba2_saved``; relu² MLP; attention without rotary; non-gated relu² experts
under DeepSeek-V3's router; ``moe_latent_size`` raises). Config switches that change what is saved but not
the parameters (partial rotary, soft-capping, logit scale, Llama 4's ``use_qk_norm`` and
``attn_temperature_tuning``) come from ``Family``, router switches from ``Router``; by default both are read from
the switches the spec carries (``ModelSpec.options``). Other families raise a ``TrainmathError``. MoE runs
transformers' eager expert loop (``experts_implementation="eager"``). The oracle counts storages still held by the autograd graph
when the forward ends: nodes that cannot reach the loss (a router's group selection) free what they packed.

Precision is two numbers: ``compute_dtype_bytes`` (what matmuls produce) and ``param_dtype_bytes`` (the parameters'
dtype). 2 and 4 is bf16 autocast (fp32 master weights): the residual stream is fp32, every Linear saves its own bf16
cast of an fp32 input, and each Linear's weight is cast once per step and kept for backward ("autocast weight
copies"). 2 and 2 is a pure-bf16 model; 4 and 4 is fp32.

Symbols: b micro-batch, s sequence, T = b·s tokens, d hidden, h/h_kv heads, h_d head dim, q = h·h_d, kv = h_kv·h_d,
f MLP width, c compute bytes, r residual-stream bytes (4 under autocast), V vocabulary.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from trainmath.errors import TrainmathError
from trainmath.model.spec import AttentionDims, Block, LayerSpec, MLADims, MLPDims, MoEDims, ModelSpec
from trainmath.ops import families as op_families
from trainmath.ops.context import FP32, INT64, Ctx, Family, Precision, Router, _norm_topk_default  # noqa: F401
from trainmath.ops.fold import layer_node
from trainmath.ops.ir import Program
from trainmath.ops.selective import selective_layer
from trainmath.tree import Node

PROFILES = ("hf", "eager", "megatron")
RECOMPUTE = ("none", "selective", "full")
HF_FAMILIES = ("llama", "mistral", "qwen2", "qwen3", "qwen3_moe", "qwen2_moe", "mixtral", "deepseek_v2",
               "deepseek_v3", "olmo2", "phi3", "gemma2", "gemma3_text",
               "glm4_moe", "starcoder2", "cohere", "gpt2", "falcon", "gpt_oss", "llama4_text", "qwen3_next", "nemotron_h")
GROUPED_UNMODELLED = ("gpt_oss", "llama4_text", "nemotron_h", "qwen3_next")
"""MoE families whose ``grouped_mm`` expert path is not modelled (only their eager loop is)."""
ROTARY_CAT = ("phi3", "glm4_moe", "qwen3_next")
"""Families whose ``apply_rotary_pos_emb`` ends in ``torch.cat`` (see ``attention_saved``)."""


def _leaf(name: str, value: int, note: str = "") -> Node:
    return Node(name=name, value=value, unit="bytes", note=note)


def _layer_node(layer: LayerSpec, kids: list[Node], copies: list[Node]) -> Node:
    """A layer's tree: its saved activations, and the autocast weight copies when there are any."""
    parts = [Node.of("activations", kids, "bytes")]
    if copies:
        parts.append(Node.of("autocast weight copies", copies, "bytes",
                             note="compute-dtype casts of the fp32 weights, kept for backward"))
    return Node.of(layer.label, parts, "bytes")


def rmsnorm_saved(prefix: str, rows: int, width: int, in_bytes: int) -> list[Node]:
    """RMSNorm as transformers writes it: ``x.to(fp32)``; ``x * rsqrt(mean(x²) + eps)``; ``w * y.to(in_dtype)``.

    Saved (derived from the code, checked by the oracle): the fp32 x (pow and mul save it; it is x itself when x is
    fp32), rsqrt per row (fp32), and y in x's dtype (the weight's mul saves it). The output is not saved here.
    """
    return [
        _leaf(f"{prefix}.x_fp32", FP32 * rows * width, "fp32 copy of the input (the input itself if fp32)"),
        _leaf(f"{prefix}.rsqrt", FP32 * rows, "one fp32 per row"),
        _leaf(f"{prefix}.normalized", in_bytes * rows * width, "x·rsqrt in the input dtype"),
    ]


def olmo2_rmsnorm_saved(prefix: str, rows: int, width: int) -> list[Node]:
    """OLMo-2's RMSNorm: ``(w * (x.to(fp32) * rsqrt(mean(x²) + eps))).to(in_dtype)``: the weight multiplies in
    fp32, so it saves the fp32 x (the input itself when fp32), rsqrt per row and the fp32 normalised y (derived from
    the code, checked by the oracle)."""
    return [
        _leaf(f"{prefix}.x_fp32", FP32 * rows * width, "fp32 copy of the input (the input itself if fp32)"),
        _leaf(f"{prefix}.rsqrt", FP32 * rows, "one fp32 per row"),
        _leaf(f"{prefix}.normalized_fp32", FP32 * rows * width, "x·rsqrt in fp32 (the weight multiplies in fp32)"),
    ]


def gemma_rmsnorm_saved(prefix: str, rows: int, width: int) -> list[Node]:
    """Gemma's RMSNorm: ``y = x.float() * rsqrt(mean(x²) + eps)``; ``(y * (1 + w.float())).type_as(x)``. Saved: the
    fp32 x (the input itself when fp32), rsqrt per row, the fp32 y, and the computed fp32 (1 + w), 4·width bytes
    (a fresh tensor, not the parameter). Derived from ``Gemma2RMSNorm``/``Gemma3RMSNorm``, checked by the oracle."""
    return [
        _leaf(f"{prefix}.x_fp32", FP32 * rows * width, "fp32 copy of the input (the input itself if fp32)"),
        _leaf(f"{prefix}.rsqrt", FP32 * rows, "one fp32 per row"),
        _leaf(f"{prefix}.normalized_fp32", FP32 * rows * width),
        _leaf(f"{prefix}.one_plus_weight", FP32 * width, "1 + w in fp32, saved by the product"),
    ]


def layernorm_saved(prefix: str, rows: int, width: int, in_bytes: int) -> list[Node]:
    """``nn.LayerNorm`` (``native_layer_norm``): saves its input, the per-row mean and rstd, all in the input's
    dtype (fp32 under autocast, which runs layer_norm in fp32 and here gets the fp32 residual stream). Derived from
    the ATen kernel's saved values, checked by the oracle."""
    return [
        _leaf(f"{prefix}.input", in_bytes * rows * width, "the residual stream itself"),
        _leaf(f"{prefix}.mean", in_bytes * rows),
        _leaf(f"{prefix}.rstd", in_bytes * rows),
    ]


def cohere_layernorm_saved(prefix: str, rows: int, width: int, weight_numel: int, p: Precision) -> list[Node]:
    """Cohere's bias-free LayerNorm: ``x = x.to(fp32)``; ``(x - mean).pow(2).mean()``; ``(x - mean) * rsqrt(var +
    eps)``; ``w.to(fp32) * y``. ``x - mean`` is computed twice (pow and the product each save their own fp32 copy),
    then rsqrt per row and the fp32 y (the weight's product); with bf16 parameters ``w.to(fp32)`` is a fresh copy
    that the product saves (4·weight bytes). Used per token (input and final norms, width d) and per head (the
    q/k norms of ``use_qk_norm``, width h_d, one weight of h·h_d). Derived from ``CohereLayerNorm``, checked by the
    oracle."""
    out = [
        _leaf(f"{prefix}.centered_pow", FP32 * rows * width, "x - mean in fp32, saved by pow"),
        _leaf(f"{prefix}.centered_mul", FP32 * rows * width, "x - mean again, saved by the product with rsqrt"),
        _leaf(f"{prefix}.rsqrt", FP32 * rows, "one fp32 per row"),
        _leaf(f"{prefix}.normalized_fp32", FP32 * rows * width, "saved by the weight's product"),
    ]
    if p.param != FP32:
        out.append(_leaf(f"{prefix}.weight_fp32", FP32 * weight_numel, "w.to(fp32) of a bf16 weight"))
    return out


def linear_inputs(prefix: str, names: Sequence[str], tokens: int, width: int, p: Precision) -> list[Node]:
    """Inputs saved by Linears that read the same tensor (q/k/v; gate/up; router). Without autocast they share one
    storage (counted once); under autocast each Linear saves its own compute-dtype cast of the fp32 input."""
    if p.autocast:
        return [_leaf(f"{n}.input_cast", p.compute * tokens * width, "autocast copy, one per Linear")
                for n in names]
    return [_leaf(f"{prefix}.input", p.compute * tokens * width, "shared by " + ", ".join(names))]


def weight_copies(block: Block, p: Precision, experts_hit: int | None = None) -> list[Node]:
    """Autocast casts each Linear weight to the compute dtype once per step and backward keeps the copy
    (c bytes per weight element). Routed experts (transformers' eager expert loop) are sliced then cast on every
    call, so a copy exists per expert that received tokens: ``experts_hit`` (default: all)."""
    if not p.autocast:
        return []
    out = []
    for t in block.tensors:
        if t.kind != "linear":
            continue
        n = t.experts if experts_hit is None else min(experts_hit, t.experts)
        copies = n if t.experts else 1
        out.append(_leaf(f"{t.name}.weight_cast" if not t.name.endswith(".weight") else t.name + "_cast",
                         p.compute * t.numel * copies))
    return out


def _has(block: Block, fragment: str) -> bool:
    return any(fragment in t.name for t in block.tensors)


def attention_saved(block: Block, *, b: int, s: int, d: int, p: Precision, eager: bool, olmo2: bool = False,
                    rotary_cat: bool = False, gemma: bool = False, softcap: bool = False, cohere: bool = False
                    ) -> list[Node]:
    """Grouped-query attention after the input norm: q/k/v inputs, optional q/k RMSNorm, the attention core, o_proj.

    SDPA (CPU flash kernel, or CUDA flash): saves query, key (rotary outputs, compute dtype), value (v_proj output),
    the output (shared with o_proj's input: the output is laid out (b, s, h, h_d), so the transpose is free) and
    logsumexp (fp32, b·h·s). CUDA's memory-efficient kernel pads logsumexp to a multiple of 32 queries and both CUDA
    kernels add an 8-byte RNG seed and offset: not counted. Eager: copies of q, k, v at h heads (repeat_kv / bmm),
    the fp32 softmax (4·b·h·s²) and its compute-dtype cast (2·b·h·s², the same tensor in fp32), and a contiguous
    o_proj input. ``olmo2``: q/k RMSNorms over the whole projection (T, h·h_d) and (T, h_kv·h_d), OLMo-2 style
    (``olmo2_rmsnorm_saved``), instead of per head.

    Fused ``qkv_proj`` (Phi-3): one Linear input; q, k, v are slices (views) of its output, so what SDPA saves as
    the value keeps the whole (T, q + 2·kv) output alive: c·T·(q + 2·kv) where separate projections keep c·T·kv
    (q and k are fresh rotary outputs either way). Derived from ``Phi3Attention.forward``, checked by the oracle.

    ``rotary_cat`` (families in ``ROTARY_CAT``: partial-rotary code, ``torch.cat([rotated, passed])``): the rotary
    query is then contiguous in (b, h, s, h_d), SDPA's output follows the query's layout, and
    ``transpose(1, 2).contiguous()`` before o_proj makes a copy: o_proj's input is a separate c·T·q tensor. With
    ``q·cos + rotate_half(q)·sin`` alone the query keeps the projection's (b, s, h, h_d) layout and the copy is free.

    ``cohere``: per-head q/k norms are Cohere LayerNorms (``cohere_layernorm_saved``); Cohere's interleaved rotary
    runs in fp32 (``q.float()``) but multiplies by cos/sin only, so it saves nothing beyond the shared cos/sin.
    ``gemma``: per-head q/k norms are Gemma RMSNorms (``gemma_rmsnorm_saved``). ``softcap`` (Gemma-2, eager only):
    ``tanh(scores / cap) · cap`` keeps the tanh output, c·b·h·s², beside the fp32 softmax and its cast.
    """
    dims = block.dims
    if not isinstance(dims, AttentionDims):
        raise TrainmathError(f"attention block without AttentionDims: {block.kind}")
    T = b * s
    h, hkv, hd = dims.heads, dims.kv_heads, dims.head_dim
    q, kv = h * hd, hkv * hd
    c = p.compute
    fused = _has(block, "qkv_proj")
    out = linear_inputs("self_attn.qkv", ["qkv_proj"] if fused else ["q_proj", "k_proj", "v_proj"], T, d, p)
    if olmo2:
        out += olmo2_rmsnorm_saved("self_attn.q_norm", T, q)
        out += olmo2_rmsnorm_saved("self_attn.k_norm", T, kv)
    elif _has(block, "q_norm") and cohere:
        out += cohere_layernorm_saved("self_attn.q_norm", T * h, hd, q, p)
        out += cohere_layernorm_saved("self_attn.k_norm", T * hkv, hd, kv, p)
    elif _has(block, "q_norm") and gemma:
        out += gemma_rmsnorm_saved("self_attn.q_norm", T * h, hd)
        out += gemma_rmsnorm_saved("self_attn.k_norm", T * hkv, hd)
    elif _has(block, "q_norm"):
        out += rmsnorm_saved("self_attn.q_norm", T * h, hd, c)
        out += rmsnorm_saved("self_attn.k_norm", T * hkv, hd, c)
    if not eager:
        out += [
            _leaf("sdpa.query", c * T * q, "rotary output (its cast under autocast)"),
            _leaf("sdpa.key", c * T * kv),
            _leaf("sdpa.value", c * T * (q + 2 * kv), "the whole fused qkv_proj output (value is a view of it)")
            if fused else _leaf("sdpa.value", c * T * kv, "v_proj output"),
            _leaf("sdpa.output", c * T * q, "also o_proj's input"),
            _leaf("sdpa.logsumexp", FP32 * b * h * s),
        ]
        if rotary_cat:
            out.append(_leaf("o_proj.input", c * T * q, "contiguous copy: the query (hence the output) is (b, h, s, h_d)"))
    else:
        out += [
            _leaf("eager.query", c * T * q, "contiguous copy for bmm"),
            _leaf("eager.key", c * T * q, "repeated to h heads"),
            *([_leaf("eager.softcap_tanh", c * b * h * s * s, "attention logit soft-capping")] if softcap else []),
            _leaf("eager.softmax_fp32", FP32 * b * h * s * s),
        ]
        if c != FP32:
            out.append(_leaf("eager.probs", c * b * h * s * s, "softmax cast to compute dtype"))
        out += [
            _leaf("eager.value", c * T * q, "repeated to h heads"),
            _leaf("o_proj.input", c * T * q, "transpose(1, 2).contiguous() of the output"),
        ]
    return out


def mla_saved(block: Block, *, b: int, s: int, d: int, p: Precision) -> list[Node]:
    """DeepSeek-V2/V3 multi-head latent attention (transformers' ``DeepseekV{2,3}Attention``) after the input norm.

    Saved: the input of q_a_proj (or q_proj without q LoRA) and kv_a_proj_with_mqa (``linear_inputs``); with q
    LoRA the q_a_layernorm on the (T, q_lora) projection and q_b_proj's input (c·T·q_lora); the kv_a_layernorm on
    the (T, r_kv) latent — a split view of kv_a_proj's (T, r_kv + rope) output, so in fp32 its "fp32 copy" is that
    whole output (4·T·(r_kv + rope)), else a fresh fp32 copy (4·T·r_kv); kv_b_proj's input (c·T·r_kv); the
    attention core; o_proj's input (c·T·h·v). RoPE multiplies by cos/sin (or V2's complex freqs), which need no grad:
    only the shared cos/sin are saved (``rotary``). The key is assembled with ``copy_`` (nothing saved).

    Attention core: q/k head dim (nope + rope) differs from v's, so PyTorch's CPU SDPA cannot run its flash kernel
    and falls back to the math kernel, which on CPU computes in fp32 whatever the input dtype and saves the scaled
    query and key (4·T·h·qk each), the fp32 softmax (4·b·h·s²) and a contiguous fp32 value (4·T·h·v).
    (On CUDA, PyTorch would pick the memory-efficient kernel instead — not modelled here; the oracle runs on CPU.)
    """
    dims = block.dims
    if not isinstance(dims, MLADims):
        raise TrainmathError(f"mla block without MLADims: {block.kind}")
    if dims.qk_head_dim == dims.v_head_dim:
        raise TrainmathError(f"MLA with equal q/k and v head dims ({dims.qk_head_dim}) runs SDPA's flash kernel, "
                             f"which the hf profile does not model for MLA")
    T, c, h = b * s, p.compute, dims.heads
    out = linear_inputs("self_attn.qkv_a", ["q_a_proj" if dims.q_lora_rank else "q_proj", "kv_a_proj_with_mqa"],
                        T, d, p)
    if dims.q_lora_rank:
        out += rmsnorm_saved("self_attn.q_a_layernorm", T, dims.q_lora_rank, c)
        out.append(_leaf("q_b_proj.input", c * T * dims.q_lora_rank))
    latent = dims.kv_lora_rank
    out += [
        _leaf("self_attn.kv_a_layernorm.x_fp32", FP32 * T * (latent + dims.qk_rope_head_dim if c == FP32 else latent),
              "the whole kv_a_proj output in fp32 (the latent is a view of it), else an fp32 copy of the latent"),
        _leaf("self_attn.kv_a_layernorm.rsqrt", FP32 * T),
        _leaf("self_attn.kv_a_layernorm.normalized", c * T * latent),
        _leaf("kv_b_proj.input", c * T * latent),
        _leaf("sdpa_math.query_scaled", FP32 * T * h * dims.qk_head_dim, "fp32 on CPU"),
        _leaf("sdpa_math.key_scaled", FP32 * T * h * dims.qk_head_dim, "fp32 on CPU"),
        _leaf("sdpa_math.softmax_fp32", FP32 * b * h * s * s),
        _leaf("sdpa_math.value", FP32 * T * h * dims.v_head_dim, "contiguous fp32 copy"),
        _leaf("o_proj.input", c * T * h * dims.v_head_dim),
    ]
    return out


def experts_saved(tk: int, d: int, f: int, p: Precision, weight_bytes: int, experts: str = "eager",
                  n: int = 0) -> list[Node]:
    """transformers' eager expert loop (``experts_implementation="eager"``), summed over the hit experts; Σ n_e =
    T·k for any routing. Per expert e with n_e tokens: torch.where's (n_e, 2) int64 token/slot indices, the gathered
    input (c·n_e·d), the fused gate_up output (2c·n_e·f: gate and up are views of it), the activation output and
    the product (c·n_e·f each), its routing weights (``weight_bytes``·n_e), the down output (c·n_e·d) and the
    index_add source in the residual dtype (r·n_e·d).

    ``experts="grouped"`` (``grouped_mm``, transformers 5's default): all T·k rows at once, sorted by expert: the
    sort permutation, its inverse and the token index (8·T·k each, int64), the per-expert offsets (int32, 4·n),
    then the same gathered input, gate_up output, activation output, product and down output, in the residual
    dtype r (``_grouped_mm`` is not an autocast op: under autocast it runs in fp32 on the fp32 weights, which are
    not cast), the routing weights (``weight_bytes``·T·k), and no index_add source (derived from
    ``transformers.integrations.moe``, measured with MemTracker and saved_tensors_hooks)."""
    c, r = p.compute, p.residual
    if experts == "grouped":
        return [
            _leaf("experts.sort_indices", 3 * INT64 * tk, "permutation, inverse and token index"),
            _leaf("experts.offsets", 4 * n, "int32 per-expert offsets"),
            _leaf("experts.gathered_input", r * tk * d),
            _leaf("experts.gate_up_out", 2 * r * tk * f),
            _leaf("experts.act_out", r * tk * f),
            _leaf("experts.down_proj.input", r * tk * f),
            _leaf("experts.routing_weight", weight_bytes * tk),
            _leaf("experts.down_out", r * tk * d),
        ]
    return [
        _leaf("experts.token_slot_indices", 2 * INT64 * tk),
        _leaf("experts.gathered_input", c * tk * d),
        _leaf("experts.gate_up_out", 2 * c * tk * f),
        _leaf("experts.act_out", c * tk * f),
        _leaf("experts.down_proj.input", c * tk * f),
        _leaf("experts.routing_weight", weight_bytes * tk),
        _leaf("experts.down_out", c * tk * d),
        _leaf("experts.index_add_source", r * tk * d),
    ]


def deepseek_moe_saved(block: Block, *, T: int, d: int, p: Precision, router: Router, model_type: str,
                       experts: str = "eager") -> list[Node]:
    """DeepSeek-V2/V3 MoE (``DeepseekV{2,3}MoE``): a router computed in fp32, the eager expert loop and the shared
    experts (one gated MLP of width n_shared·f on the same input).

    Router ``F.linear(x.float(), w.float())``: under autocast it runs in the compute dtype (its input cast, and the
    weight cast counted with the weight copies); in a bf16 model both casts are fp32 copies (4·T·d and 4·n·d); in
    fp32 it reads the MLP input itself (shared with the shared experts). Then, V3 (``noaux_tc``): sigmoid output
    (router dtype·T·n), the top-k indices (8·T·k, saved by ``scores.gather``) and, with ``norm_topk_prob``, the
    in-place division's denominator and weights (router dtype·T·(1 + k)). V2: fp32 softmax (4·T·n), with
    ``group_limited_greedy`` the masked_fill mask (1·T·n), then the top-k indices (8·T·k). The router dtype is c
    under autocast, else fp32; the routing weights the experts multiply by have it too (V2: fp32).

    Packed but not kept: the group selection (V3's group top-2 and top-k over groups and its masked_fill; V2's
    group max and top-k over groups) only produces integer indices, so its autograd nodes cannot reach the loss and
    are freed, with what they saved, when the forward ends. ``n_group``/``topk_group`` therefore change nothing.
    """
    dims = block.dims
    if not isinstance(dims, MoEDims):
        raise TrainmathError(f"moe block without MoEDims: {block.kind}")
    c = p.compute
    n, k, f = dims.experts, dims.top_k, dims.expert_intermediate
    rd = c if p.autocast else FP32
    shared_reads_input = True
    if p.autocast:
        out = [_leaf("router.input_cast", c * T * d)]
    elif c == FP32:
        out = [_leaf("mlp.input", FP32 * T * d, "read by the router and the shared experts")]
        shared_reads_input = False
    else:
        out = [_leaf("router.input_fp32", FP32 * T * d), _leaf("router.weight_fp32", FP32 * n * d,
                                                                "x.float() and w.float() of a bf16 model")]
    if model_type == "deepseek_v3":
        out += [
            _leaf("router.sigmoid", rd * T * n),
            _leaf("router.topk_indices", INT64 * T * k, "saved by the gather of the weights"),
        ]
        if router.norm_topk_prob:
            out += [_leaf("router.topk_sum", rd * T), _leaf("router.topk_weights", rd * T * k)]
        weight_bytes = rd
    else:
        out.append(_leaf("router.softmax_fp32", FP32 * T * n))
        if router.topk_method == "group_limited_greedy":
            out.append(_leaf("router.group_mask", T * n, "bool, saved by masked_fill on the scores"))
        elif router.topk_method != "greedy":
            raise TrainmathError(f"DeepSeek-V2 topk_method {router.topk_method!r} is not one of greedy, "
                                 f"group_limited_greedy")
        out.append(_leaf("router.topk_indices", INT64 * T * k))
        weight_bytes = FP32
    out += experts_saved(T * k, d, f, p, weight_bytes, experts, n)
    if dims.shared_intermediate:
        out += gated_mlp_saved("shared_experts", T, d, dims.shared_intermediate, p, input_saved=shared_reads_input)
    return out


def gated_mlp_saved(prefix: str, tokens: int, d: int, f: int, p: Precision, *, input_saved: bool = True,
                    fused: bool = False) -> list[Node]:
    """SwiGLU ``down(act(gate(x)) * up(x))``: x (see ``linear_inputs``), gate output (act saves its input), act
    output and up output (the product saves both), the product (down's input): 4·c·T·f.

    ``fused`` (Phi-3's ``gate_up_proj``, chunked): one Linear input; gate and up are views of one (T, 2f) output,
    which the activation and the product both keep (2·c·T·f, counted once): the same 4·c·T·f in all."""
    c = p.compute
    if fused:
        out = linear_inputs(f"{prefix}.gate_up_proj", [f"{prefix}.gate_up_proj"], tokens, d, p) if input_saved else []
        return out + [
            _leaf(f"{prefix}.gate_up_out", 2 * c * tokens * f, "gate and up are views of it"),
            _leaf(f"{prefix}.act_out", c * tokens * f),
            _leaf(f"{prefix}.down_proj.input", c * tokens * f),
        ]
    out = linear_inputs(f"{prefix}.gate_up", [f"{prefix}.gate_proj", f"{prefix}.up_proj"], tokens, d, p) \
        if input_saved else []
    return out + [
        _leaf(f"{prefix}.gate_out", c * tokens * f),
        _leaf(f"{prefix}.act_out", c * tokens * f),
        _leaf(f"{prefix}.up_out", c * tokens * f),
        _leaf(f"{prefix}.down_proj.input", c * tokens * f),
    ]


def moe_saved(block: Block, *, T: int, d: int, p: Precision, norm_topk_prob: bool = True,
              fp32_routing_weights: bool = False, experts: str = "eager") -> list[Node]:
    """Qwen3-MoE/Mixtral sparse block with ``experts_implementation="eager"`` (a loop over hit experts).

    Router: its input (``linear_inputs``), fp32 softmax (4·T·n), top-k indices (8·T·k); with ``norm_topk_prob``
    the in-place renormalisation also saves the fp32 top-k values (4·T·k) and their sum (4·T). Per expert e with n_e tokens
    (torch.where gives token and slot indices in one (n_e, 2) int64 storage): the gathered input (c·n_e·d), gate_up
    output (2c·n_e·f: gate and up are views of it), act output and product (c·n_e·f each), its routing weight
    (c·n_e), down output (c·n_e·d) and the index_add source in the residual dtype (r·n_e·d). Σ n_e = T·k for any
    routing, so the total is routing-independent: T·k·(16 + c(2d + 4f + 1) + r·d) bytes.

    ``fp32_routing_weights`` (Mixtral): the router returns the fp32 renormalised top-k values themselves (Qwen3-MoE
    casts them back to the logits' dtype), so each expert's mul saves 4·n_e bytes of weights, not c·n_e: the
    4-2 = 2 bytes × T·k that were missing in bf16 and under autocast (128 bytes per layer at T = 32, k = 2).
    """
    dims = block.dims
    if not isinstance(dims, MoEDims):
        raise TrainmathError(f"moe block without MoEDims: {block.kind}")
    c, r = p.compute, p.residual
    n, k, f = dims.experts, dims.top_k, dims.expert_intermediate
    tk = T * k
    out = linear_inputs("router", ["router"], T, d, p)
    out += [
        _leaf("router.softmax_fp32", FP32 * T * n),
        _leaf("router.topk_indices", INT64 * T * k),
        *([_leaf("router.topk_values", FP32 * T * k), _leaf("router.topk_sum", FP32 * T)] if norm_topk_prob else []),
    ]
    out += experts_saved(tk, d, f, p, FP32 if fp32_routing_weights else c, experts, n)
    if dims.shared_intermediate:
        # the shared expert reads the router's input: one storage unless autocast casts it per Linear
        out += gated_mlp_saved("shared_expert", T, d, dims.shared_intermediate, p, input_saved=p.autocast)
        if _has(block, "shared_expert_gate"):
            out += shared_expert_gate_saved(T, d, p)
    return out


def shared_expert_gate_saved(T: int, d: int, p: Precision) -> list[Node]:
    """Qwen2-MoE's ``sigmoid(shared_expert_gate(x)) * shared_expert(x)``: the gate Linear (d → 1) reads the MoE
    input (its own cast under autocast, else the shared storage), ``sigmoid`` saves its output (c·T) and the product
    saves both factors: the sigmoid again and the shared expert's down_proj output (c·T·d), which a plain MLP block
    never keeps (derived from ``Qwen2MoeSparseMoeBlock.forward``, checked by the oracle). These c·T·(d + 1) bytes,
    plus the gate's input cast and weight copy under autocast, are what a Qwen3-MoE-style count misses."""
    c = p.compute
    out = [_leaf("shared_expert_gate.input_cast", c * T * d, "autocast copy")] if p.autocast else []
    return out + [
        _leaf("shared_expert_gate.sigmoid_out", c * T, "(T, 1), saved by sigmoid and by the product"),
        _leaf("shared_expert.down_out", c * T * d, "saved by the gating product"),
    ]


def layer_saved(layer: LayerSpec, *, b: int, s: int, d: int, p: Precision, eager: bool,
                experts_hit: int | None = None, norm_topk_prob: bool = True, model_type: str = "",
                router: Router | None = None, family: Family | None = None, experts: str = "eager") -> Node:
    """Everything one decoder layer saves for backward (hf profile, no recompute): its input norm (whose fp32 x
    is the layer input itself when the residual stream is fp32), the mixer, the post-attention norm (on the
    residual after attention), the FFN, and under autocast the layer's weight copies. Residual adds save nothing."""
    T = b * s
    mixer = next((bl for bl in layer.blocks if bl.kind in ("attention", "mla", "linear_attention", "mamba")), None)
    ffn = next((bl for bl in layer.blocks if bl.kind in ("mlp", "moe")), None)
    norms = next((bl for bl in layer.blocks if bl.kind == "norm"), None)
    names = [t.name for t in norms.tensors] if norms else []
    olmo2 = names == ["post_attention_layernorm.weight", "post_feedforward_layernorm.weight"]
    if olmo2 and mixer is not None and mixer.kind == "attention" and isinstance(ffn.dims, MLPDims) \
            and ffn.dims.gated:
        return _olmo2_layer(layer, mixer, ffn, b=b, s=s, d=d, p=p, eager=eager)
    if model_type == "starcoder2" and mixer is not None and mixer.kind == "attention" and \
            isinstance(ffn.dims, MLPDims) and not ffn.dims.gated:
        return _starcoder2_layer(layer, mixer, ffn, b=b, s=s, d=d, p=p, eager=eager)
    if model_type == "cohere" and mixer is not None and mixer.kind == "attention" and \
            isinstance(ffn.dims, MLPDims) and ffn.dims.gated:
        return _cohere_layer(layer, mixer, ffn, b=b, s=s, d=d, p=p, eager=eager)
    if experts == "grouped" and ffn is not None and isinstance(ffn.dims, MoEDims) and model_type in GROUPED_UNMODELLED:
        raise TrainmathError(f"the grouped_mm expert path of {model_type} is not modelled; pass --experts eager "
                             f"(transformers' experts_implementation='eager')")
    if model_type == "gpt_oss" and mixer is not None and mixer.kind == "attention" and isinstance(ffn.dims, MoEDims):
        return _gpt_oss_layer(layer, mixer, ffn, b=b, s=s, d=d, p=p, experts_hit=experts_hit)
    if model_type == "falcon" and mixer is not None and mixer.kind == "attention" and isinstance(ffn.dims, MLPDims):
        return _falcon_layer(layer, mixer, ffn, b=b, s=s, d=d, p=p, eager=eager, family=family or Family())
    if model_type == "qwen3_next" and mixer is not None and mixer.kind in ("attention", "linear_attention"):
        return _qwen3_next_layer(layer, mixer, ffn, b=b, s=s, d=d, p=p, eager=eager,
                                 router=router or Router(norm_topk_prob=norm_topk_prob))
    if model_type == "nemotron_h":
        return _nemotron_h_layer(layer, b=b, s=s, d=d, p=p, eager=eager,
                                 router=router or Router(norm_topk_prob=norm_topk_prob))
    if model_type == "llama4_text" and mixer is not None and mixer.kind == "attention":
        return _llama4_layer(layer, mixer, ffn, b=b, s=s, d=d, p=p, eager=eager, family=family or Family())
    if model_type == "gpt2" and mixer is not None and mixer.kind == "attention" and isinstance(ffn.dims, MLPDims):
        return _gpt2_layer(layer, mixer, ffn, b=b, s=s, d=d, p=p, eager=eager)
    if model_type in ("gemma2", "gemma3_text") and mixer is not None and mixer.kind == "attention" and \
            isinstance(ffn.dims, MLPDims) and ffn.dims.gated:
        fam = family or Family.default(model_type)
        return _gemma_layer(layer, mixer, ffn, b=b, s=s, d=d, p=p, eager=eager or model_type == "gemma2",
                            softcap=(eager or model_type == "gemma2") and fam.attn_logit_softcapping is not None)
    if mixer is None or mixer.kind not in ("attention", "mla") or ffn is None or names != [
            "input_layernorm.weight", "post_attention_layernorm.weight"]:
        raise TrainmathError(f"the hf activation profile covers pre-norm attention + MLP/MoE layers "
                             f"({', '.join(HF_FAMILIES)}); layer {layer.label!r} has blocks "
                             f"{[bl.kind for bl in layer.blocks]} and norms {names}")
    r = p.residual
    kids = rmsnorm_saved("input_layernorm", T, d, r)  # its output (w·y) is saved by the Linears that read it
    if mixer.kind == "mla":
        if eager:
            raise TrainmathError("the eager profile has no rule for MLA attention; use profile='hf' (SDPA)")
        kids += mla_saved(mixer, b=b, s=s, d=d, p=p)
    else:
        kids += attention_saved(mixer, b=b, s=s, d=d, p=p, eager=eager, rotary_cat=model_type in ROTARY_CAT)
    kids += rmsnorm_saved("post_attention_layernorm", T, d, r)
    if isinstance(ffn.dims, MLPDims) and ffn.dims.gated:
        kids += gated_mlp_saved("mlp", T, d, ffn.dims.intermediate, p, fused=_has(ffn, "gate_up_proj"))
    elif isinstance(ffn.dims, MoEDims) and model_type in ("deepseek_v2", "deepseek_v3", "glm4_moe"):
        # GLM-4.5's Glm4MoeTopkRouter is DeepSeek-V3's noaux_tc router (fp32 linear, sigmoid, gather, renorm)
        kids += deepseek_moe_saved(ffn, T=T, d=d, p=p, model_type="deepseek_v3" if model_type == "glm4_moe"
                                   else model_type,
                                   router=router or Router(norm_topk_prob=norm_topk_prob, topk_method=(
                                       "greedy" if model_type == "deepseek_v2" else "noaux_tc")), experts=experts)
    elif isinstance(ffn.dims, MoEDims):
        mixtral = model_type == "mixtral"  # always renormalises, keeps fp32 routing weights
        kids += moe_saved(ffn, T=T, d=d, p=p, norm_topk_prob=norm_topk_prob or mixtral, fp32_routing_weights=mixtral,
                          experts=experts)
    else:
        raise TrainmathError(f"the hf activation profile has no rule for a plain (non-gated) MLP: {layer.label!r}")
    activ = Node.of("activations", kids, "bytes")
    # grouped_mm reads the fp32 expert weights as they are: no per-expert casts
    copies = weight_copies(mixer, p) + weight_copies(ffn, p, 0 if experts == "grouped" else experts_hit)
    parts = [activ]
    if copies:
        parts.append(Node.of("autocast weight copies", copies, "bytes",
                             note="compute-dtype casts of the fp32 weights, kept for backward"))
    return Node.of(layer.label, parts, "bytes")


def _gemma_layer(layer: LayerSpec, mixer: Block, ffn: Block, *, b: int, s: int, d: int, p: Precision,
                 eager: bool, softcap: bool) -> Node:
    """Gemma-2/3 ("sandwich" norms): ``h = x + post_attention_layernorm(attn(input_layernorm(x)))``, ``h +
    post_feedforward_layernorm(mlp(pre_feedforward_layernorm(h)))``: four Gemma RMSNorms (``gemma_rmsnorm_saved``;
    the two post-norms act on the attention and MLP outputs), a GELU-tanh gated MLP (saved like SwiGLU: GELU keeps
    its input), Gemma-3's per-head q/k norms. Gemma-2 runs eager attention (transformers' default for it: its
    ``_supports_sdpa`` is False, SDPA cannot soft-cap) with the tanh of the capped scores saved."""
    T = b * s
    kids = gemma_rmsnorm_saved("input_layernorm", T, d)
    kids += attention_saved(mixer, b=b, s=s, d=d, p=p, eager=eager, gemma=True, softcap=softcap)
    kids += gemma_rmsnorm_saved("post_attention_layernorm", T, d)
    kids += gemma_rmsnorm_saved("pre_feedforward_layernorm", T, d)
    kids += gated_mlp_saved("mlp", T, d, ffn.dims.intermediate, p)
    kids += gemma_rmsnorm_saved("post_feedforward_layernorm", T, d)
    return _layer_node(layer, kids, weight_copies(mixer, p) + weight_copies(ffn, p))


def _cohere_layer(layer: LayerSpec, mixer: Block, ffn: Block, *, b: int, s: int, d: int, p: Precision,
                  eager: bool) -> Node:
    """Cohere (Command-R): ``x + attn(ln(x)) + mlp(ln(x))``, attention and SwiGLU MLP in parallel from one
    bias-free LayerNorm (``cohere_layernorm_saved``): without autocast q/k/v and gate/up read one storage (the
    norm's output, counted once); under autocast each of the five Linears saves its own cast. Per-head q/k
    LayerNorms when ``use_qk_norm``."""
    T = b * s
    kids = cohere_layernorm_saved("input_layernorm", T, d, d, p)
    kids += attention_saved(mixer, b=b, s=s, d=d, p=p, eager=eager, cohere=True)
    kids += gated_mlp_saved("mlp", T, d, ffn.dims.intermediate, p, input_saved=p.autocast)
    return _layer_node(layer, kids, weight_copies(mixer, p) + weight_copies(ffn, p))


def gelu_new_saved(prefix: str, tokens: int, f: int, p: Precision) -> list[Node]:
    """transformers' ``NewGELUActivation`` (GPT-2's ``gelu_new``), written as Python tensor ops:
    ``0.5 * x * (1 + tanh(sqrt(2/π) * (x + 0.044715 * x³)))``. Saved: x (by ``pow``; it is the c_fc output), the
    tanh output, and the two factors of the last product, ``0.5·x`` and ``1 + tanh`` (products by Python floats
    save nothing): 4·c·T·f, plus the product itself, which c_proj saves. ``F.gelu(approximate="tanh")`` keeps
    only x. Derived from the code, checked by the oracle."""
    c = p.compute
    return [
        _leaf(f"{prefix}.c_fc_out", c * tokens * f, "x, saved by pow"),
        _leaf(f"{prefix}.tanh_out", c * tokens * f),
        _leaf(f"{prefix}.half_x", c * tokens * f, "0.5·x, saved by the last product"),
        _leaf(f"{prefix}.one_plus_tanh", c * tokens * f, "saved by the last product"),
    ]


def _gpt2_layer(layer: LayerSpec, mixer: Block, ffn: Block, *, b: int, s: int, d: int, p: Precision,
                eager: bool) -> Node:
    """GPT-2: pre-LayerNorm (with bias) blocks of Conv1D layers (``addmm(bias, x, W)`` with W stored (in, out):
    saved like a Linear, its input and, under autocast, the weight's cast; the bias cast is not kept). The fused
    c_attn output (T, 3d) is split into q, k, v views, so what SDPA saves as q, k and v is that one storage,
    c·T·3d; no rotary (learned position embeddings). Eager (``softmax(q·kᵀ·scale)`` without an fp32 upcast) copies
    q, k and v for bmm and keeps the softmax in the input dtype (its bf16 cast too under autocast), not the c_attn
    output. MLP: c_fc's input, ``gelu_new`` (``gelu_new_saved``), c_proj's
    input. Dropouts (resid, embd, attn pdrop; 0.1 in GPT-2's config) are assumed 0: nonzero dropout adds a mask
    and an output per dropout (attention probabilities too) that are not modelled."""
    dims = mixer.dims
    T, c, r = b * s, p.compute, p.residual
    h = dims.heads
    q = h * dims.head_dim
    f = ffn.dims.intermediate
    kids = layernorm_saved("ln_1", T, d, r)
    kids += linear_inputs("attn.c_attn", ["attn.c_attn"], T, d, p)
    if eager:
        kids += [
            _leaf("eager.query", c * T * q, "contiguous copy for bmm"),
            _leaf("eager.key", c * T * q, "contiguous copy of the transposed key for bmm"),
            _leaf("eager.softmax", (FP32 if p.autocast else c) * b * h * s * s,
                  "softmax in the input's dtype (fp32 under autocast, which runs softmax in fp32)"),
            *([_leaf("eager.probs", c * b * h * s * s, ".type(value.dtype) of the fp32 softmax")]
              if p.autocast else []),
            _leaf("eager.value", c * T * q, "contiguous copy for bmm"),
            _leaf("c_proj.input", c * T * q, "reshape(...).contiguous() of the (b, h, s, h_d) output"),
        ]
    else:
        kids += [
            _leaf("sdpa.qkv", c * T * 3 * q, "the c_attn output: q, k and v are views of it"),
            _leaf("sdpa.output", c * T * q, "also c_proj's input"),
            _leaf("sdpa.logsumexp", FP32 * b * h * s),
        ]
    kids += layernorm_saved("ln_2", T, d, r)
    kids += linear_inputs("mlp.c_fc", ["mlp.c_fc"], T, d, p)
    kids += gelu_new_saved("mlp.act", T, f, p)
    kids.append(_leaf("mlp.c_proj.input", c * T * f))
    return _layer_node(layer, kids, weight_copies(mixer, p) + weight_copies(ffn, p))


def _falcon_layer(layer: LayerSpec, mixer: Block, ffn: Block, *, b: int, s: int, d: int, p: Precision,
                  eager: bool, family: Family) -> Node:
    """Falcon (``FalconDecoderLayer``, rotary, SDPA, no bias): ``nn.LayerNorm``s with bias (``layernorm_saved``),
    one fused ``query_key_value`` Linear, rotary (cos/sin only), SDPA with the model's additive (b, 1, s, s) mask
    (see below), ``dense`` reading SDPA's output, and a plain
    ``dense_4h_to_h(gelu(dense_h_to_4h(x)))`` MLP (GELU keeps its input). What SDPA's key and value are depends on
    the variant (derived from ``FalconAttention._split_heads``, checked by the oracle):

    - multi-head (``multi_query=False``): q, k, v are views of the (T, 3d) output; the value keeps it all (c·T·3d).
    - multi-query (Falcon-7B): k and v are ``fused[..., [-2], :]`` index copies with one head and each index node
      keeps its one-element int64 index (8 bytes). SDPA gets 1 key head for h query heads without ``enable_gqa``,
      which no fused kernel takes: PyTorch's math fallback (on CPU in fp32 whatever the dtype) keeps the scaled
      query, the key and value expanded to h heads (4·T·h·h_d each) and the fp32 softmax (4·b·h·s²); its
      (b, h, s, h_d) output makes dense's input a copy. The mask is added there, not kept.
    - new decoder architecture (Falcon-40B/180B): k and v are index copies broadcast to h heads and flattened, so
      the rotary key and the value are c·T·h·h_d each (the value c·T·h_d when h_kv = 1: flattening a stride-0
      broadcast of one head is a view); the two indices as above.

    SDPA (fused kernels) keeps the additive mask it was given, in the compute dtype, one storage per layer
    (autocast casts it per call).

    Parallel attention (all three): attention and MLP read one LayerNorm (one storage without autocast) or, with
    two (``ln_attn``, ``ln_mlp``), two norms of one input (its storage once, mean and rstd per norm); sequential
    layers (``parallel_attn=False``) norm the residual after attention. The variant comes from
    ``Family.new_decoder_architecture`` when set, else from the spec: two norms ``ln_attn``/``ln_mlp`` or
    1 < h_kv < h mean the new architecture; a single-norm new-architecture config with h_kv = h or h_kv = 1 reads
    as multi-head/multi-query unless the flag is given. Not modelled (raise or are assumed off): Linear biases
    (under autocast a bf16 product plus an fp32 bias is fp32, which changes every dtype after it), ALiBi
    (``alibi=True``: no rotary, an s² score path), eager attention, dropout."""
    if eager:
        raise TrainmathError("the eager profile has no rule for Falcon attention; use profile='hf' (SDPA)")
    if any(t.kind == "bias" for t in mixer.tensors + ffn.tensors):
        raise TrainmathError("Falcon with bias=True is not yet modelled (an autocast bf16 product plus an fp32 bias "
                             "promotes to fp32): use --profile megatron")
    dims = mixer.dims
    T, c, r = b * s, p.compute, p.residual
    h, hkv, hd = dims.heads, dims.kv_heads, dims.head_dim
    q, f = h * hd, ffn.dims.intermediate
    norms = [t.name.removesuffix(".weight") for bl in layer.blocks if bl.kind == "norm" for t in bl.tensors
             if t.name.endswith(".weight")]
    new_arch = family.new_decoder_architecture
    if new_arch is None:
        new_arch = norms == ["ln_attn", "ln_mlp"] or 1 < hkv < h
    if norms == ["ln_attn", "ln_mlp"]:
        kids = layernorm_saved("ln_attn", T, d, r)
        kids += layernorm_saved("ln_mlp", T, d, r)[1:]  # the same input, counted once
        kids += linear_inputs("query_key_value", ["query_key_value"], T, d, p)
        kids += linear_inputs("mlp.dense_h_to_4h", ["mlp.dense_h_to_4h"], T, d, p)
    elif norms == ["input_layernorm"]:
        kids = layernorm_saved("input_layernorm", T, d, r)
        kids += linear_inputs("ln_out", ["query_key_value", "mlp.dense_h_to_4h"], T, d, p)
    elif norms == ["input_layernorm", "post_attention_layernorm"]:
        kids = layernorm_saved("input_layernorm", T, d, r)
        kids += linear_inputs("query_key_value", ["query_key_value"], T, d, p)
    else:
        raise TrainmathError(f"Falcon layer norms {norms} are not one of ln_attn/ln_mlp, input_layernorm, "
                             f"input_layernorm/post_attention_layernorm")
    sdpa = [_leaf("sdpa.query", c * T * q, "rotary query"), _leaf("sdpa.output", c * T * q, "also dense's input"),
            _leaf("sdpa.logsumexp", FP32 * b * h * s),
            _leaf("sdpa.attn_mask", c * b * s * s, "the (b, 1, s, s) additive mask as SDPA keeps it, one per layer")]
    if new_arch:
        kids += [_leaf("sdpa.key", c * T * q, "rotary key, broadcast to h heads"),
                 _leaf("sdpa.value", c * T * (q if hkv > 1 else hd),
                       "index copy broadcast to h heads and flattened (a stride-0 view when h_kv = 1)"),
                 _leaf("kv_index", 2 * INT64, "the [-2] and [-1] index tensors"), *sdpa]
    elif hkv == 1:
        kids += [
            _leaf("kv_index", 2 * INT64, "the [-2] and [-1] index tensors"),
            _leaf("sdpa_math.query_scaled", FP32 * T * q, "fp32 on CPU"),
            _leaf("sdpa_math.key", FP32 * T * q, "expanded to h heads"),
            _leaf("sdpa_math.softmax_fp32", FP32 * b * h * s * s),
            _leaf("sdpa_math.value", FP32 * T * q, "expanded to h heads"),
            _leaf("dense.input", c * T * q, "permute + reshape copy of the (b, h, s, h_d) output"),
        ]
    else:
        kids += [_leaf("sdpa.key", c * T * q, "rotary key"),
                 _leaf("sdpa.value", c * T * 3 * q, "a view of the fused (T, 3d) output, which it keeps"), *sdpa]
    if norms == ["input_layernorm", "post_attention_layernorm"]:
        kids += layernorm_saved("post_attention_layernorm", T, d, r)
        kids += linear_inputs("mlp.dense_h_to_4h", ["mlp.dense_h_to_4h"], T, d, p)
    kids += [_leaf("mlp.dense_h_to_4h_out", c * T * f, "the GELU's input"), _leaf("mlp.dense_4h_to_h.input", c * T * f)]
    return _layer_node(layer, kids, weight_copies(mixer, p) + weight_copies(ffn, p))


def sink_attention_saved(block: Block, *, b: int, s: int, p: Precision) -> list[Node]:
    """gpt-oss eager attention with learned sinks: ``cat([q·kᵀ·scale + mask, sinks])``, minus its row max, softmax
    over s + 1 columns, the sink column dropped, ``.to(v.dtype)``, times v. Saved: the rotary query (``torch.cat``
    makes it contiguous (b, h, s, h_d): bmm reads it in place), the key and value repeated to h heads (a copy for
    bmm either way), the row max's int64 indices (8·b·h·s), the softmax over s + 1 columns (4·b·h·s·(s + 1) in fp32
    and under autocast, whose fp32 mask promotes the scores; c·… in a bf16 model), under autocast its bf16 cast
    without the sink column (c·b·h·s²; otherwise bmm reads the softmax in place), and o_proj's input (a
    contiguous copy of the transposed output). The cat, the sinks' expand and the scale save nothing. Derived from
    ``eager_attention_forward`` in ``modeling_gpt_oss``, checked by the oracle."""
    dims = block.dims
    T, c = b * s, p.compute
    h, q = dims.heads, dims.heads * dims.head_dim
    soft = FP32 if p.autocast else c
    return [
        _leaf("eager.query", c * T * q, "the rotary (cat) output, read in place"),
        _leaf("eager.key", c * T * q, "repeated to h heads"),
        _leaf("eager.row_max_indices", INT64 * b * h * s, "max(dim=-1) of the scores with the sink column"),
        _leaf("eager.softmax_with_sink", soft * b * h * s * (s + 1), "s + 1 columns: the sink's included"),
        *([_leaf("eager.probs", c * b * h * s * s, "bf16 cast without the sink column")] if p.autocast else []),
        _leaf("eager.value", c * T * q, "repeated to h heads"),
        _leaf("o_proj.input", c * T * q, "transpose(1, 2).contiguous() of the output"),
    ]


def gpt_oss_moe_saved(block: Block, *, T: int, d: int, p: Precision) -> list[Node]:
    """gpt-oss MoE (``GptOssMLP``, ``experts_implementation="eager"``): a biased router ``linear`` (its input), top-k
    on the logits (int64 indices) and a softmax over the k values (c·T·k); then per hit expert with n_e tokens,
    Σ n_e = T·k: the int64 token and top-k slot indices (``torch.where``; 8·n_e each), the gathered input (c), ``x·W +
    b`` — under autocast a bf16 product plus an fp32 bias, so everything up to the down projection is fp32 (g = 4;
    g = c otherwise) — the (n_e, 2f) gate_up output kept by both clamps (gate and up are its interleaved views),
    the clamped gate, ``sigmoid(α·gate)``, ``glu`` and ``up + 1`` (the product ``(up + 1)·glu`` saves both), the
    down projection's input (its c cast), the biased down output (g, saved by the routing product), the routing
    weight (c) and the product (g = r), which index_add keeps. Derived from ``GptOssExperts``, checked by the oracle."""
    dims = block.dims
    c = p.compute
    g = FP32 if p.autocast else c
    k, f = dims.top_k, dims.expert_intermediate
    tk = T * k
    out = linear_inputs("router", ["router"], T, d, p)
    out += [
        _leaf("router.topk_indices", INT64 * tk),
        _leaf("router.softmax", c * tk, "softmax of the k top logits"),
        _leaf("experts.token_indices", INT64 * tk, "saved by the gather and by index_add"),
        _leaf("experts.slot_indices", INT64 * tk, "top-k positions, saved by the routing weights' gather"),
        _leaf("experts.gathered_input", c * tk * d),
        _leaf("experts.gate_up_out", g * tk * 2 * f, "kept by both clamps"),
        _leaf("experts.gate_clamped", g * tk * f),
        _leaf("experts.sigmoid", g * tk * f),
        _leaf("experts.glu", g * tk * f),
        _leaf("experts.up_plus_one", g * tk * f),
        _leaf("experts.down_proj.input", c * tk * f),
        _leaf("experts.down_out", g * tk * d, "with its bias, saved by the routing product"),
        _leaf("experts.routing_weight", c * tk),
        _leaf("experts.index_add_source", g * tk * d),
    ]
    return out


def _gpt_oss_layer(layer: LayerSpec, mixer: Block, ffn: Block, *, b: int, s: int, d: int, p: Precision,
                   experts_hit: int | None) -> Node:
    """gpt-oss: RMSNorms whose weight multiplies in fp32 (``olmo2_rmsnorm_saved``), biased q/k/v/o, half-width
    cos/sin, eager attention with sinks (``sink_attention_saved``; transformers has no SDPA path for it), the biased
    MoE (``gpt_oss_moe_saved``). Sliding and full layers save the same (the window only changes the mask)."""
    T = b * s
    kids = olmo2_rmsnorm_saved("input_layernorm", T, d)
    kids += linear_inputs("self_attn.qkv", ["q_proj", "k_proj", "v_proj"], T, d, p)
    kids += sink_attention_saved(mixer, b=b, s=s, p=p)
    kids += olmo2_rmsnorm_saved("post_attention_layernorm", T, d)
    kids += gpt_oss_moe_saved(ffn, T=T, d=d, p=p)
    return _layer_node(layer, kids, weight_copies(mixer, p) + weight_copies(ffn, p, experts_hit))


def _llama4_layer(layer: LayerSpec, mixer: Block, ffn: Block, *, b: int, s: int, d: int, p: Precision,
                  eager: bool, family: Family) -> Node:
    """Llama 4 text decoder layer (``Llama4TextDecoderLayer``, SDPA), derived from the code, checked by the oracle.

    Attention: RoPE layers are the chunked ones (``attention_chunk_size``, carried as the sliding window); the others
    (every ``no_rope_layer_interval``-th) use no RoPE and full causal attention. RoPE multiplies ``q.float()`` as
    complex numbers by ``freqs_cis`` (shared, see ``activation_bytes``): nothing else is saved. ``use_qk_norm`` (RoPE
    layers): a weightless L2 norm ``x.float() * rsqrt(mean(x²) + eps)``, keeping the fp32 rotary output (4·T·q,
    4·T·kv) and rsqrt per head row (4·T·h, 4·T·h_kv). No-RoPE layers with ``attn_temperature_tuning``: the query is
    multiplied by an fp32 (1, s, 1, 1) scale expanded over the batch (4·s bytes kept). SDPA: when s ≥ chunk size
    the chunked mask exists (c·b·s², one per layer) and transformers then repeats k/v to h heads (``repeat_kv``:
    c·T·q each), otherwise native GQA (c·T·kv each); query c·T·q, output (also o_proj's input) c·T·q, logsumexp.

    MoE (``Llama4TextMoe``): the router (an autocast Linear) keeps top-k indices (8·T·k, saved by ``scatter_``), the
    fp32 sigmoid of the scattered scores (4·T·n); every routed expert runs over all T tokens: the input repeated n
    times (r·n·T·d, saved by the product with the scores), the scores transposed to (n·T, 1) (c·n·T, a copy), the
    product as bmm input (c·n·T·d: the product itself, or its autocast cast), gate_up output (2c·n·T·f: gate and
    up are views), activation output and product (c·n·T·f each). So expert activations scale with n, not top-k,
    and the autocast expert weight copies are all n. The shared expert is a plain gated MLP reading the MoE input
    (the router's storage without autocast); its output is added in place (nothing saved). Dense layers: a gated
    MLP of width ``intermediate_size_mlp``. RMSNorms multiply by the weight in the input dtype (``rmsnorm_saved``).
    """
    if eager:
        raise TrainmathError("llama4_text: the eager profile is not modelled; use profile='hf' (SDPA)")
    dims = mixer.dims
    T, c, r = b * s, p.compute, p.residual
    h, hkv, hd = dims.heads, dims.kv_heads, dims.head_dim
    q, kv = h * hd, hkv * hd
    rope = dims.sliding_window is not None
    kids = rmsnorm_saved("input_layernorm", T, d, r)
    kids += linear_inputs("self_attn.qkv", ["q_proj", "k_proj", "v_proj"], T, d, p)
    if rope and family.use_qk_norm:
        kids += [_leaf("self_attn.q_l2norm.x_fp32", FP32 * T * q, "fp32 rotary query"),
                 _leaf("self_attn.q_l2norm.rsqrt", FP32 * T * h),
                 _leaf("self_attn.k_l2norm.x_fp32", FP32 * T * kv, "fp32 rotary key"),
                 _leaf("self_attn.k_l2norm.rsqrt", FP32 * T * hkv)]
    if not rope and family.attn_temperature_tuning:
        kids.append(_leaf("self_attn.attn_scales", FP32 * s, "(1, s, 1, 1) fp32, expanded over the batch"))
    masked = rope and s >= dims.sliding_window
    rep = masked and hkv < h
    kids += [_leaf("sdpa.query", c * T * q),
             _leaf("sdpa.key", c * T * (q if rep else kv), "repeat_kv copy to h heads" if rep else ""),
             _leaf("sdpa.value", c * T * (q if rep else kv), "repeat_kv copy to h heads" if rep else "v_proj output"),
             *([_leaf("sdpa.chunked_mask", c * b * s * s, "chunked causal mask, one per layer")] if masked else []),
             _leaf("sdpa.output", c * T * q, "also o_proj's input"),
             _leaf("sdpa.logsumexp", FP32 * b * h * s)]
    kids += rmsnorm_saved("post_attention_layernorm", T, d, r)
    if isinstance(ffn.dims, MoEDims):
        n, k, f = ffn.dims.experts, ffn.dims.top_k, ffn.dims.expert_intermediate
        kids += linear_inputs("feed_forward.router", ["router", "shared_expert.gate_proj",
                                                      "shared_expert.up_proj"], T, d, p)
        kids += [_leaf("router.topk_indices", INT64 * T * k, "saved by scatter_"),
                 _leaf("router.sigmoid_fp32", FP32 * T * n),
                 _leaf("experts.repeated_input", r * n * T * d, "input repeated n times, saved by the product"),
                 _leaf("experts.scores_t", c * n * T, "(n·T, 1) transposed copy of the scores"),
                 _leaf("experts.bmm_input", c * n * T * d, "scaled input (its cast under autocast)"),
                 _leaf("experts.gate_up_out", 2 * c * n * T * f, "gate and up are views of it"),
                 _leaf("experts.act_out", c * n * T * f),
                 _leaf("experts.down_input", c * n * T * f)]
        kids += gated_mlp_saved("feed_forward.shared_expert", T, d, ffn.dims.shared_intermediate, p,
                                input_saved=False)
    else:
        kids += gated_mlp_saved("feed_forward", T, d, ffn.dims.intermediate, p)
    return _layer_node(layer, kids, weight_copies(mixer, p) + weight_copies(ffn, p))


GDN_CHUNK = 64
"""``torch_chunk_gated_delta_rule``'s default chunk size: the sequence is padded to a multiple of it."""


def gated_deltanet_saved(block: Block, *, b: int, s: int, d: int, p: Precision) -> list[Node]:
    """Qwen3-Next's Gated DeltaNet (``Qwen3NextGatedDeltaNet``) on transformers' torch fallback (no
    ``causal_conv1d``/``flash-linear-attention``: ``causal_conv1d_fn`` and ``torch_chunk_gated_delta_rule``), after
    the input norm. Derived from the code, checked by the oracle.

    Symbols: h_v value heads, d_k/d_v head dims, kd = h_k·d_k, vd = h_v·d_v, cd = 2·kd + vd conv channels, K conv
    kernel, C = 64 chunk, L = s padded to a multiple of C, N = L/C chunks, G = b·h_v. Projections: the inputs of
    in_proj_qkvz and in_proj_ba; the depthwise conv keeps its input (the cat of q, k, v: c·T·cd) and SiLU its
    input, the whole padded conv output (c·b·cd·(s + K - 1)). beta = sigmoid(b) keeps c·T·h_v; the decay
    g = -exp(A_log)·softplus(a + dt_bias) keeps the fp32 softplus input and output (4·T·h_v each) and exp(A_log)
    and its negation (4·h_v each).

    The chunked rule runs in fp32: the L2 norms of q and k (repeated to h_v heads) keep their fp32 inputs
    (4·T·h_v·d_k each) and rsqrt (4·T·h_v each); the padded value (4·G·L·d_v), key, query and k·beta (4·G·L·d_k
    each), padded beta and two exp(cumsum(g)) (4·G·L each); the (C, C) bool mask; five (G, L, C) fp32 tensors (the
    decay exp, k_beta·kᵀ, q·kᵀ, ut_system = their product, intra-chunk attention); the two triangular solves'
    results (4·G·L·d_v, 4·G·L·d_k); per chunk v_new (4·G·C·d_v) and the recurrent state the chunk reads (4·G·d_k·d_v,
    the first one zeros). With N > 1 chunks the state carries gradient, adding the decayed query and key
    (4·G·L·d_k each). exp(g_last - cumsum) (4·G·L) and the per-chunk decay exp (4·G·N) stay alive even with one
    chunk (measured).

    Output: the gated RMSNorm (``x.float()``, rsqrt per (token, head), ``w * y.to(c)``, then ``· silu(z.float())``)
    keeps the fp32 x, rsqrt (4·T·h_v), y in c, the fp32 z and its silu, the weight product (param dtype), and
    out_proj's input (c·T·vd)."""
    dims = block.dims
    c, T = p.compute, b * s
    hv, dk, dv = dims.value_heads, dims.key_head_dim, dims.value_head_dim
    kd, vd = dims.key_heads * dk, hv * dv
    cd = 2 * kd + vd
    C = GDN_CHUNK
    N = -(-s // C)
    L, G = N * C, b * hv
    out = linear_inputs("linear_attn.in_proj", ["in_proj_qkvz", "in_proj_ba"], T, d, p)
    out += [
        _leaf("conv1d.input", c * T * cd, "cat of q, k, v"),
        _leaf("conv1d.silu_input", c * b * cd * (s + dims.conv_kernel - 1), "the whole padded conv output"),
        _leaf("beta.sigmoid", c * T * hv),
        _leaf("g.softplus_input", FP32 * T * hv), _leaf("g.softplus_out", FP32 * T * hv),
        _leaf("g.exp_A", FP32 * hv), _leaf("g.neg_exp_A", FP32 * hv),
        _leaf("gdr.q_l2norm.x", FP32 * T * hv * dk), _leaf("gdr.q_l2norm.rsqrt", FP32 * T * hv),
        _leaf("gdr.k_l2norm.x", FP32 * T * hv * dk), _leaf("gdr.k_l2norm.rsqrt", FP32 * T * hv),
        _leaf("gdr.value_padded", FP32 * G * L * dv), _leaf("gdr.key_padded", FP32 * G * L * dk),
        _leaf("gdr.query_padded", FP32 * G * L * dk), _leaf("gdr.k_beta", FP32 * G * L * dk),
        _leaf("gdr.beta_padded", FP32 * G * L), _leaf("gdr.exp_cumsum", 2 * FP32 * G * L, "two exp(cumsum(g))"),
        _leaf("gdr.upper_mask", C * C, "bool"),
        _leaf("gdr.new_values", FP32 * G * L * dv), _leaf("gdr.k_cumdecay", FP32 * G * L * dk),
        _leaf("gdr.exp_last_minus_cumsum", FP32 * G * L, "kept even when N = 1 (measured)"),
        _leaf("gdr.chunk_decay", FP32 * G * N, "kept even when N = 1 (measured)"),
    ]
    if not p.autocast:
        out += [
            _leaf("gdr.chunk_matrices", 5 * FP32 * G * L * C,
                  "decay exp, k_beta·kᵀ, q·kᵀ, ut_system, intra-chunk attention"),
            _leaf("gdr.v_new", N * FP32 * G * C * dv, "per chunk"),
            _leaf("gdr.states", N * FP32 * G * dk * dv, "the state each chunk reads"),
        ]
        if N > 1:
            out += [_leaf("gdr.query_decayed", FP32 * G * L * dk), _leaf("gdr.key_decayed", FP32 * G * L * dk)]
    else:  # every @ runs in c on casts of its fp32 operands
        out += [
            _leaf("gdr.chunk_matrices_fp32", 2 * FP32 * G * L * C, "decay exp, ut_system"),
            _leaf("gdr.products_c", 2 * c * G * L * C, "k_beta·kᵀ and q·kᵀ in c, saved by the decay products"),
            _leaf("gdr.intra_cast", c * G * L * C, "per-chunk casts of the intra-chunk attention"),
            _leaf("gdr.operand_casts", 4 * c * G * L * dk, "kᵀ twice, k_beta, q"),
            _leaf("gdr.state_casts", 2 * N * c * G * dk * dv, "each chunk's state, cast by two products"),
            _leaf("gdr.v_new_casts", (2 * N - 1) * c * G * C * dv),
            _leaf("gdr.chunk_operand_casts", 3 * (N - 1) * c * G * C * dk,
                  "k_cumdecay, decayed query and key slices of the chunks after the first / before the last"),
            _leaf("gdr.states_fp32", (N - 1) * FP32 * G * dk * dv, "kept by the state decay products"),
            _leaf("conv1d.weight_cast", c * cd * dims.conv_kernel),
        ]
    out += [
        _leaf("norm.x_fp32", FP32 * T * vd), _leaf("norm.rsqrt", FP32 * T * hv),
        _leaf("norm.normalized", c * T * vd), _leaf("norm.weighted", p.param * T * vd),
        _leaf("norm.z_fp32", FP32 * T * vd), _leaf("norm.silu_z", FP32 * T * vd),
        _leaf("out_proj.input", c * T * vd),
    ]
    return out


def _qwen3_next_layer(layer: LayerSpec, mixer: Block, ffn: Block, *, b: int, s: int, d: int, p: Precision,
                      eager: bool, router: Router) -> Node:
    """Qwen3-Next: (1 + w) RMSNorms (``gemma_rmsnorm_saved``), Gated DeltaNet (``gated_deltanet_saved``) or gated
    full attention, then a Qwen2-MoE-style sparse block (softmax router, eager experts, sigmoid-gated shared
    expert) or a gated MLP. Gated attention: q_proj emits query and gate (T, 2q); the per-head q norm's fp32 input
    is, in fp32, that whole output (4·T·2q), else an fp32 copy of the query (4·T·q); partial rotary ends in
    ``torch.cat``, so SDPA's output is (b, h, s, h_d) and the reshape before the gate is a copy (c·T·q), kept by
    the gating product beside sigmoid(gate) (c·T·q); o_proj reads the product (c·T·q)."""
    if eager:
        raise TrainmathError("qwen3_next: the eager profile is not modelled; use profile='hf' (SDPA)")
    T, c = b * s, p.compute
    kids = gemma_rmsnorm_saved("input_layernorm", T, d)
    if mixer.kind == "linear_attention":
        kids += gated_deltanet_saved(mixer, b=b, s=s, d=d, p=p)
    else:
        dims = mixer.dims
        h, hkv, hd = dims.heads, dims.kv_heads, dims.head_dim
        q, kv = h * hd, hkv * hd
        kids += linear_inputs("self_attn.qkv", ["q_proj", "k_proj", "v_proj"], T, d, p)
        kids += [
            _leaf("self_attn.q_norm.x_fp32", FP32 * T * (2 * q if c == FP32 else q),
                  "the whole q_proj output in fp32 (query is a view), else an fp32 copy of the query"),
            *gemma_rmsnorm_saved("self_attn.q_norm", T * h, hd)[1:],
            *gemma_rmsnorm_saved("self_attn.k_norm", T * hkv, hd),
            _leaf("sdpa.query", c * T * q), _leaf("sdpa.key", c * T * kv), _leaf("sdpa.value", c * T * kv),
            _leaf("sdpa.output", c * T * q), _leaf("sdpa.logsumexp", FP32 * b * h * s),
            _leaf("gate.attn_output", c * T * q, "contiguous copy of the (b, h, s, h_d) output"),
            _leaf("gate.sigmoid", c * T * q),
            _leaf("o_proj.input", c * T * q),
        ]
    kids += gemma_rmsnorm_saved("post_attention_layernorm", T, d)
    if isinstance(ffn.dims, MoEDims):
        kids += moe_saved(ffn, T=T, d=d, p=p, norm_topk_prob=router.norm_topk_prob)
    else:
        kids += gated_mlp_saved("mlp", T, d, ffn.dims.intermediate, p)
    return _layer_node(layer, kids, weight_copies(mixer, p) + weight_copies(ffn, p))


def nemotron_rmsnorm_saved(prefix: str, rows: int, width: int, p: Precision) -> list[Node]:
    """Nemotron-H's RMSNorm: ``(w.to(fp32) * (x.to(fp32) * rsqrt(mean(x²) + eps))).to(in_dtype)``: the fp32 x,
    rsqrt per row, the fp32 y, and with bf16 parameters the fp32 copy of w (4·width). Derived, checked by the
    oracle."""
    out = olmo2_rmsnorm_saved(prefix, rows, width)
    if p.param != FP32:
        out.append(_leaf(f"{prefix}.weight_fp32", FP32 * width, "w.to(fp32) of a bf16 weight"))
    return out


def mamba2_saved(block: Block, *, b: int, s: int, d: int, p: Precision) -> list[Node]:
    """Nemotron-H's Mamba-2 mixer on transformers' torch path (``causal_conv1d_fn`` + ``mamba2_chunk_scan``, no
    mamba_ssm kernels), after the input norm. Derived from the code, checked by the oracle.

    Symbols: h_m heads, P head dim, I = h_m·P, g groups, N state size, K conv kernel, Q chunk size, L = s padded
    to a multiple of Q, n_c = L/Q chunks, W = 2I + 2gN + h_m the in_proj width. The in_proj output (gate, x/B/C,
    dt are views of it) is kept whole by the conv in fp32 (c·T·W), the SiLU keeps the padded conv output
    (c·b·(I + 2gN)·(s + K - 1)); dt + dt_bias → softplus → clamp keep c·T·h_m twice and dt.float() 4·T·h_m;
    A = -exp(A_log) keeps 4·h_m twice. The scan runs in fp32: the SSM input x in fp32 (in fp32 the whole SiLU
    output, 4·T·(I + 2gN)), its padded copy for D (4·b·L·I), x·dt padded (4·b·L·I); five (b, L, h_m, N) tensors
    for B and C (einsum operand copies, B·decay); three (b, h_m, L, Q) tensors (exp(segsum), G, M = G·L); two
    exp(cumsum) (4·b·h_m·L each); the chunk states and their decayed mix (4·b·(n_c + 1)·h_m·P·N each) and the
    (n_c + 1)² decay; C·states (4·b·L·I) and the padded scan output (4·b·L·I); four bool masks (2·Q², 2·(n_c+1)²).
    Gated RMSNorm (``norm_before_gate=False``): silu of the fp32 gate (input and output 4·T·I), the product (4·T·I),
    rsqrt per group (4·T·g), the fp32 normalised y (4·T·I); out_proj's input (c·T·I)."""
    dims = block.dims
    c, T = p.compute, b * s
    hm, P, g, N, K, Q = dims.heads, dims.head_dim, dims.groups, dims.state_size, dims.conv_kernel, dims.chunk_size
    I = hm * P
    cd = I + 2 * g * N
    W = I + cd + hm
    nc = -(-s // Q)
    L = nc * Q
    out = linear_inputs("mixer.in_proj", ["in_proj"], T, d, p)
    ac = p.autocast
    kept = nc + 1 if nc == 1 else nc  # states[:, :-1] as the last einsum keeps it (measured)
    if ac:  # x/B/C.to(fp32 weight) copy, then conv1d casts it back: the cast and the weight's cast are kept
        out += [_leaf("conv1d.input_cast", c * T * cd), _leaf("conv1d.weight_cast", c * cd * K)]
    else:
        out.append(_leaf("in_proj.output", c * T * W, "the conv input (and in fp32 the gate) are views of it"))
    if c != FP32:
        out.append(_leaf("norm.gate_fp32", FP32 * T * I, "gate.to(fp32), saved by silu"))
    out += [
        _leaf("conv1d.silu_input", c * b * cd * (s + K - 1), "the whole padded conv output"),
        _leaf("dt.softplus_input", c * T * hm), _leaf("dt.clamp_input", c * T * hm),
        _leaf("dt.fp32", (1 if c == FP32 else 2) * FP32 * T * hm, "dt.float(), once per use unless fp32"),
        _leaf("A.exp", FP32 * hm), _leaf("A.neg", FP32 * hm),
        _leaf("scan.x_fp32", FP32 * T * (cd if c == FP32 else I),
              "the whole SiLU output in fp32 (x is a view of it), else x.float()"),
        _leaf("scan.x_padded_for_D", FP32 * b * L * I),
        _leaf("scan.exp_cumsum", 2 * FP32 * b * hm * L),
        _leaf("scan.output_padded", FP32 * b * L * I),
        _leaf("scan.masks", 2 * Q * Q + 2 * (nc + 1) ** 2, "bool"),
    ]
    if not ac:
        out += [
            _leaf("scan.x_dt", (1 if nc == 1 else 2) * FP32 * b * L * I,
                  "x·dt, plus an einsum copy when there is more than one chunk"),
            _leaf("scan.B_C", 5 * FP32 * b * L * hm * N, "einsum operand copies of B and C, B, B·decay"),
            _leaf("scan.chunk_matrices", 3 * FP32 * b * hm * L * Q, "exp(segsum), G, M"),
            _leaf("scan.states", FP32 * b * (nc + 1 + kept) * hm * P * N,
                  "the n_c + 1 states and the einsum copy of all but the last (a view when n_c = 1)"),
            _leaf("scan.decay_chunk", FP32 * b * hm * (nc + 1) ** 2),
            _leaf("scan.C_times_states", FP32 * b * L * I),
        ]
    else:  # every einsum runs in c on casts of its fp32 operands
        out += [
            _leaf("scan.x_dt_casts", 2 * c * b * L * I, "one per einsum"),
            _leaf("scan.B", FP32 * b * L * hm * N, "saved by B·decay"),
            _leaf("scan.B_C_casts", 4 * c * b * L * hm * N, "C twice, B, B·decay"),
            _leaf("scan.exp_segsum", FP32 * b * hm * L * Q), _leaf("scan.G", c * b * hm * L * Q),
            _leaf("scan.M_cast", c * b * hm * L * Q),
            _leaf("scan.states_casts", c * b * (nc + 1 + kept) * hm * P * N,
                  "all states, then all but the last (whole when n_c = 1)"),
            _leaf("scan.decay_chunk", FP32 * b * hm * (nc + 1) ** 2),
            _leaf("scan.decay_chunk_cast", c * b * hm * (nc + 1) ** 2),
            _leaf("scan.C_times_states", c * b * L * I),
        ]
    out += [
        _leaf("norm.silu_gate_out", FP32 * T * I), _leaf("norm.gated", FP32 * T * I),
        _leaf("norm.rsqrt", FP32 * T * g), _leaf("norm.normalized_fp32", FP32 * T * I),
        _leaf("out_proj.input", c * T * I),
    ]
    return out


def relu2_mlp_saved(prefix: str, tokens: int, d: int, f: int, p: Precision, *, input_saved: bool = True
                    ) -> list[Node]:
    """``down(relu(up(x))²)``: x, the relu output (saved by relu and by pow) and the square (down's input)."""
    out = linear_inputs(f"{prefix}.up_proj", [f"{prefix}.up_proj"], tokens, d, p) if input_saved else []
    return out + [_leaf(f"{prefix}.relu_out", p.compute * tokens * f),
                  _leaf(f"{prefix}.down_proj.input", p.compute * tokens * f)]


def _nemotron_h_layer(layer: LayerSpec, *, b: int, s: int, d: int, p: Precision, eager: bool, router: Router
                      ) -> Node:
    """Nemotron-H: each layer is one Nemotron RMSNorm and one mixer: Mamba-2 (``mamba2_saved``), attention
    without rotary (SDPA), a relu² MLP, or a MoE with DeepSeek-V3's sigmoid router (fp32 linear, group selection,
    renormalised top-k) over non-gated relu² experts (eager loop) plus a relu² shared expert."""
    if eager:
        raise TrainmathError("nemotron_h: the eager profile is not modelled; use profile='hf' (SDPA)")
    T, c = b * s, p.compute
    mixer = next(bl for bl in layer.blocks if bl.kind != "norm")
    kids = nemotron_rmsnorm_saved("norm", T, d, p)
    if mixer.kind == "mamba":
        kids += mamba2_saved(mixer, b=b, s=s, d=d, p=p)
    elif mixer.kind == "attention":
        kids += attention_saved(mixer, b=b, s=s, d=d, p=p, eager=False)
    elif mixer.kind == "mlp":
        kids += relu2_mlp_saved("mixer", T, d, mixer.dims.intermediate, p)
    elif mixer.kind == "moe":
        dims = mixer.dims
        if any("latent" in t.name for t in mixer.tensors):
            raise TrainmathError("nemotron_h with moe_latent_size is not yet modelled (use --profile megatron)")
        n, k, f = dims.experts, dims.top_k, dims.expert_intermediate
        rd = c if p.autocast else FP32
        if p.autocast:
            kids.append(_leaf("router.input_cast", c * T * d))
        elif c == FP32:
            kids.append(_leaf("mixer.input", FP32 * T * d, "read by the router and the shared expert"))
        else:
            kids += [_leaf("router.input_fp32", FP32 * T * d), _leaf("router.weight_fp32", FP32 * n * d)]
        kids += [_leaf("router.sigmoid", rd * T * n),
                 _leaf("router.topk_indices", INT64 * T * k, "saved by the gather of the weights")]
        if router.norm_topk_prob:
            kids += [_leaf("router.topk_sum", rd * T), _leaf("router.topk_weights", rd * T * k)]
        tk = T * k
        kids += [_leaf("experts.token_slot_indices", 2 * INT64 * tk), _leaf("experts.gathered_input", c * tk * d),
                 _leaf("experts.relu_out", c * tk * f), _leaf("experts.down_proj.input", c * tk * f),
                 _leaf("experts.routing_weight", rd * tk), _leaf("experts.down_out", c * tk * d),
                 _leaf("experts.index_add_source", rd * tk * d, "in the routing weights' dtype")]
        if dims.shared_intermediate:
            kids += relu2_mlp_saved("mixer.shared_experts", T, d, dims.shared_intermediate, p,
                                    input_saved=c != FP32 or p.autocast)
    else:
        raise TrainmathError(f"nemotron_h layer {layer.label!r} has an unknown mixer {mixer.kind!r}")
    return _layer_node(layer, kids, weight_copies(mixer, p))


def _starcoder2_layer(layer: LayerSpec, mixer: Block, ffn: Block, *, b: int, s: int, d: int, p: Precision,
                      eager: bool) -> Node:
    """StarCoder2: pre-LayerNorm (with bias) attention with q/k/v/o biases and RoPE, then a plain
    ``c_proj(gelu_tanh(c_fc(x)))`` MLP with biases: c_fc's input, the GELU's input (c·T·f) and c_proj's input
    (c·T·f). Dropouts are assumed 0 (the profile's convention); biases save nothing."""
    T, r, c = b * s, p.residual, p.compute
    f = ffn.dims.intermediate
    kids = layernorm_saved("input_layernorm", T, d, r)
    kids += attention_saved(mixer, b=b, s=s, d=d, p=p, eager=eager)
    kids += layernorm_saved("post_attention_layernorm", T, d, r)
    kids += linear_inputs("mlp.c_fc", ["mlp.c_fc"], T, d, p)
    kids += [_leaf("mlp.c_fc_out", c * T * f, "the GELU's input"), _leaf("mlp.c_proj.input", c * T * f)]
    return _layer_node(layer, kids, weight_copies(mixer, p) + weight_copies(ffn, p))


def _olmo2_layer(layer: LayerSpec, mixer: Block, ffn: Block, *, b: int, s: int, d: int, p: Precision,
                 eager: bool) -> Node:
    """OLMo-2's post-norm layer: ``h = x + post_attention_layernorm(attn(x))``, ``h + post_feedforward_layernorm(
    mlp(h))``: no input norms, so q/k/v and gate/up read the residual stream (their casts under autocast); the two
    norms act on the attention and MLP outputs (c·T·d), OLMo-2 style (``olmo2_rmsnorm_saved``)."""
    T = b * s
    kids = attention_saved(mixer, b=b, s=s, d=d, p=p, eager=eager, olmo2=True)
    kids += olmo2_rmsnorm_saved("post_attention_layernorm", T, d)
    kids += gated_mlp_saved("mlp", T, d, ffn.dims.intermediate, p)
    kids += olmo2_rmsnorm_saved("post_feedforward_layernorm", T, d)
    return _layer_node(layer, kids, weight_copies(mixer, p) + weight_copies(ffn, p))


def _rope_dim(spec: ModelSpec, family: Family | None = None) -> int:
    """Width of cos/sin: the rotated part of a head (``int(head_dim · partial_rotary_factor)``, transformers'
    ``compute_default_rope_parameters``), or MLA's rope head dim."""
    factor = family.partial_rotary_factor if family else 1.0
    for layer in spec.layers:
        for bl in layer.blocks:
            if isinstance(bl.dims, AttentionDims):
                return int(bl.dims.head_dim * factor)
            if isinstance(bl.dims, MLADims):
                return bl.dims.qk_rope_head_dim
    return 0


def _check(name: str, value, allowed) -> None:
    if value not in allowed:
        raise TrainmathError(f"{name} must be one of {', '.join(map(str, allowed))}, got {value!r}")


def activation_bytes(spec: ModelSpec, *, micro_batch: int, seq: int, profile: str = "hf",
                     recompute: str = "none", compute_dtype_bytes: int = 2, tp: int = 1, sp: bool = False,
                     cp: int = 1, pp: int = 1, layers: Sequence[int] | None = None,
                     param_dtype_bytes: int = 4, experts_hit: int | None = None,
                     norm_topk_prob: bool | None = None, router: Router | None = None,
                     family: Family | None = None, experts: str = "eager") -> Node:
    """Bytes saved for backward by one micro-batch on one rank: per layer type (× its layers) → per saved tensor,
    plus ``embedding`` (what the embedding saves) and ``rotary`` (cos/sin, computed once, shared by all layers).
    The final norm and the LM head/loss path are in ``logits_bytes``.

    ``recompute="full"``: transformers' ``gradient_checkpointing_enable()`` (``use_reentrant=False`` in 5.x): each
    layer keeps only its input (r·T·d); the backward recomputes one layer at a time, reported as the separate child
    ``recompute transient`` (the largest layer's no-recompute bytes). ``selective`` (hf): not supported; see
    ``activations_megatron`` for Korthikanti's selective recompute.

    ``layers``: indices of the layers on this rank (default: all, or ``pp`` equal stages' first stage).
    ``experts_hit``: routed experts that received tokens (only changes the autocast weight copies; default all).
    ``norm_topk_prob``: the MoE config flag of that name (Qwen3-MoE Hub configs set it; Mixtral always
    renormalises); the spec does not carry it; default (None): transformers' default for the family (False for
    qwen2_moe and deepseek_v2, else True). ``router``: the MoE router switches (``Router.from_config``); when
    given it replaces ``norm_topk_prob``; default ``Router(norm_topk_prob=norm_topk_prob)`` (DeepSeek-V3's routing;
    DeepSeek-V2 configs need ``Router.from_config`` for ``topk_method``, worth 1·T·n bytes per MoE layer).
    The hf profile is single-device: ``tp``/``sp``/``cp`` other than 1 raise.
    """
    _check("profile", profile, PROFILES)
    _check("recompute", recompute, RECOMPUTE)
    _check("compute_dtype_bytes", compute_dtype_bytes, (2, 4))
    _check("param_dtype_bytes", param_dtype_bytes, (2, 4))
    _check("experts", experts, ("eager", "grouped"))
    if micro_batch < 1 or seq < 1:
        raise TrainmathError(f"micro_batch ({micro_batch}) and seq ({seq}) must be positive")
    if param_dtype_bytes < compute_dtype_bytes:
        raise TrainmathError(f"param_dtype_bytes ({param_dtype_bytes}) below compute_dtype_bytes "
                             f"({compute_dtype_bytes}) is not a transformers training setup")
    indices = _rank_layers(spec, layers, pp)
    if profile == "megatron":
        return activations_megatron(spec, micro_batch=micro_batch, seq=seq, recompute=recompute, tp=tp, sp=sp,
                                    cp=cp, layers=indices, compute_dtype_bytes=compute_dtype_bytes)
    if (tp, sp, cp) != (1, False, 1):
        raise TrainmathError(f"the {profile} profile is single-device (--tp {tp}{' --sp' if sp else ''} --cp {cp}); "
                             f"use --profile megatron for tensor/sequence/context parallelism")
    if recompute == "selective" and spec.model_type not in op_families.LAYERS:
        raise TrainmathError(f"--recompute selective (torchtitan's op-level policy on transformers' layers) is "
                             f"modelled for {', '.join(sorted(op_families.LAYERS))} so far; {spec.name} is "
                             f"{spec.model_type!r}: use --recompute full, or --profile megatron for Korthikanti's")
    if spec.model_type not in HF_FAMILIES:
        raise TrainmathError(f"the {profile} activation profile is exact only for {', '.join(HF_FAMILIES)}; "
                             f"{spec.name} is {spec.model_type!r} (not yet modelled: use --profile megatron)")
    if spec.model_type == "llama4_text" and not any(
            isinstance(bl.dims, AttentionDims) and bl.dims.sliding_window is not None
            for layer in spec.layers for bl in layer.blocks):
        raise TrainmathError(f"{spec.name}: llama4_text without attention_chunk_size is not modelled (the spec then "
                             f"cannot tell RoPE from no-RoPE layers); use --profile megatron")
    config = {**spec.options, "model_type": spec.model_type}  # the config's switches, carried by the spec
    if norm_topk_prob is None:
        norm_topk_prob = Router.from_config(config).norm_topk_prob
    router = router or Router(norm_topk_prob=norm_topk_prob, topk_method=Router.from_config(config).topk_method)
    family = family or Family.from_config(config)
    p = Precision(compute=compute_dtype_bytes, param=param_dtype_bytes)
    b, s, d = micro_batch, seq, spec.hidden_size
    T = b * s
    ctx = Ctx(b=b, s=s, d=d, p=p, eager=profile == "eager", experts=experts, experts_hit=experts_hit,
              router=router, family=family)
    groups = []
    largest: Node | None = None
    selective_transient: Node | None = None
    for layer, idx in spec.layer_groups():
        mine = [i for i in idx if i in indices]
        if not mine:
            continue
        emit = op_families.LAYERS.get(spec.model_type)
        if emit is not None:
            prog = Program()
            emit(prog, ctx, layer, op_families.style(spec.model_type))
            one = layer_node(layer.label, prog.ops)
            if recompute == "selective":
                kept, fresh = selective_layer(layer.label, prog.ops, layer)
                if selective_transient is None or fresh.value > selective_transient.value:
                    selective_transient = fresh
                one = kept
        else:
            one = layer_saved(layer, b=b, s=s, d=d, p=p, eager=profile == "eager", experts_hit=experts_hit,
                              norm_topk_prob=router.norm_topk_prob if router else norm_topk_prob,
                              model_type=spec.model_type, router=router, family=family, experts=experts)
        if largest is None or one.value > largest.value:
            largest = one
        if recompute == "full":
            one = Node.of(layer.label, [_leaf("layer input (checkpoint)", p.residual * T * d)], "bytes")
        groups.append(_scaled(one, len(mine), f"{layer.label} × {len(mine)}",
                              f"layers {mine[0]}..{mine[-1]}, {one.value} bytes each"))
    kids = [Node.of("layers", groups, "bytes")]
    if 0 in indices:
        emb = [_leaf("input_ids", INT64 * T, "indices saved by the embedding")]
        if spec.model_type == "gpt2":
            emb.append(_leaf("position_ids", INT64 * s, "(1, s) arange saved by the position embedding"))
        if spec.model_type in ("gemma2", "gemma3_text"):
            emb.append(_leaf("embed_scale", p.param, "sqrt(d) as a 0-dim tensor in the embedding dtype, saved by "
                                                     "the scaling product"))
        kids.append(Node.of("embedding", emb, "bytes"))
    l4_rope = spec.model_type == "llama4_text" and any(
        isinstance(bl.dims, AttentionDims) and bl.dims.sliding_window is not None
        for i in indices for bl in spec.layers[i].blocks)
    if indices and spec.model_type == "llama4_text" and not l4_rope:
        pass  # only no-RoPE layers on this rank: no freqs_cis is saved
    elif indices and (spec.model_type == "deepseek_v2" or l4_rope):
        rope = _rope_dim(spec)
        kids.append(Node.of("rotary", [_leaf("freqs_cis", 8 * s * (rope // 2))], "bytes",
                            note="(1, s, rope_dim/2) complex64 whatever the dtype, shared by every layer"))
    elif indices and spec.model_type not in ("gpt2", "nemotron_h"):  # learned / no positions: no cos/sin
        rope = _rope_dim(spec, family)
        if spec.model_type == "gpt_oss":  # cos/sin of the h_d/2 frequencies, not cat'ed to h_d
            rope //= 2
        rb = FP32 if spec.model_type == "olmo2" else p.residual  # OLMo-2 keeps cos/sin in fp32
        sets = 1
        if spec.model_type == "gemma3_text":  # one cos/sin pair per layer type used (local and global RoPE bases)
            sets = len({bl.dims.sliding_window is not None for i in indices for bl in spec.layers[i].blocks
                        if isinstance(bl.dims, AttentionDims)})
        kids.append(Node.of("rotary", [_leaf("cos", sets * rb * s * rope), _leaf("sin", sets * rb * s * rope)],
                            "bytes", note="(1, s, rope_dim) in the embedding dtype, shared by every layer"
                            + (f"; {sets} sets (sliding and full layers use different RoPE bases)" if sets > 1
                               else "")))
    if recompute == "full" and largest is not None:
        kids.append(Node(name="recompute transient", value=largest.value, unit="bytes", children=largest.children,
                         note="one layer's saved tensors while it is recomputed in backward"))
    if recompute == "selective" and selective_transient is not None:
        kids.append(Node(name="recompute transient", value=selective_transient.value, unit="bytes",
                         children=selective_transient.children, note=selective_transient.note))
    return Node.of(f"activations ({profile}, recompute={recompute})", kids, "bytes",
                   note=f"b={b}, s={s}, compute {p.compute} B, params {p.param} B")


def _scaled(node: Node, k: int, name: str | None = None, note: str | None = None) -> Node:
    """``node`` with every value multiplied by k (k equal layers)."""
    return Node(name=name or node.name, value=node.value * k, unit=node.unit, note=node.note if note is None else note,
                children=tuple(_scaled(c, k) for c in node.children))


def _rank_layers(spec: ModelSpec, layers: Sequence[int] | None, pp: int) -> list[int]:
    n = spec.num_layers
    if layers is not None:
        bad = [i for i in layers if not 0 <= i < n]
        if bad:
            raise TrainmathError(f"layers {bad} out of range for {n} layers")
        return sorted(set(layers))
    if pp < 1 or pp > n:
        raise TrainmathError(f"pp ({pp}) must be between 1 and the number of layers ({n})")
    return list(range(-(-n // pp)))  # the first stage, which holds the most in-flight micro-batches under 1F1B


def logits_bytes(spec: ModelSpec, micro_batch: int, seq: int, *, compute_dtype_bytes: int = 2,
                 param_dtype_bytes: int = 4, tp: int = 1, family: Family | None = None) -> Node:
    """The final norm, LM head and ``ForCausalLMLoss`` (transformers 5.x, labels given, no ``num_items``):

    saved: final RMSNorm (as every norm), the LM head's input (its cast under autocast), the autocast copy of the
    LM head weight (V·d·c), ``log_softmax`` of the fp32 logits (4·T·V: the loss upcasts with ``logits.float()``;
    cross_entropy = log_softmax + nll_loss), the shifted labels (int64 T: labels are padded, not sliced, so all T
    positions count) and nll's total_weight (4 bytes).
    not saved but alive: the logits in the compute dtype (c·T·V, held by the model output until it is dropped) and,
    when c < 4, their fp32 upcast (4·T·V), freed once log_softmax has run: the transient peak of the loss.

    Final norm per family (RMSNorm, OLMo-2/Gemma RMSNorms, LayerNorm, Cohere's LayerNorm). Gemma-2's final
    soft-capping saves the tanh (c·T·V). Cohere's ``logits * logit_scale`` multiplies by a Python float: autograd
    keeps only that scalar (a wrapped number, not packed for backward), so nothing is added; the unscaled head
    output is freed by the product (measured).

    ``tp``: a vocabulary-parallel LM head and loss (Megatron's ``ColumnParallelLinear`` head with
    ``vocab_parallel_cross_entropy``): each rank holds V' = ceil(V/tp) vocabulary entries, so every V term above
    uses V' (the head's weight cast, the log-probabilities, the logits and their fp32 upcast); the final norm, the
    head's input (T·d, gathered whole: no sequence-parallel split assumed) and the labels are per rank whole.
    Derived, not measured (the oracle is single-device); tp = 1 is the measured case.
    """
    if tp < 1:
        raise TrainmathError(f"tp ({tp}) must be at least 1")
    family = family or Family.from_config({**spec.options, "model_type": spec.model_type})
    p = Precision(compute=compute_dtype_bytes, param=param_dtype_bytes)
    T, d, V = micro_batch * seq, spec.hidden_size, -(-spec.vocab_size // tp)
    if spec.model_type in ("olmo2", "gpt_oss"):
        saved = olmo2_rmsnorm_saved("norm", T, d)
    elif spec.model_type == "nemotron_h":
        saved = nemotron_rmsnorm_saved("norm", T, d, p)
    elif spec.model_type in ("gemma2", "gemma3_text", "qwen3_next"):
        saved = gemma_rmsnorm_saved("norm", T, d)
    elif spec.model_type in ("starcoder2", "gpt2", "falcon"):
        saved = layernorm_saved("norm", T, d, p.residual)
    elif spec.model_type == "cohere":
        saved = cohere_layernorm_saved("norm", T, d, d, p)
    else:
        saved = rmsnorm_saved("norm", T, d, p.residual)
    saved += linear_inputs("lm_head", ["lm_head"], T, d, p)
    if p.autocast:
        saved.append(_leaf("lm_head.weight_cast", p.compute * V * d))
    if family.final_logit_softcapping is not None:
        saved.append(_leaf("softcap_tanh", p.compute * T * V, "tanh(logits / cap), saved by tanh"))
    saved += [_leaf("log_softmax_fp32", FP32 * T * V), _leaf("labels", INT64 * T), _leaf("total_weight", FP32)]
    held = [_leaf("logits", p.compute * T * V, "returned in the output" + (
        f" (scaled by logit_scale={family.logit_scale}: the product replaces the head output)"
        if family.logit_scale is not None else ""))]
    if p.compute != FP32:
        held.append(_leaf("logits_fp32 (transient)", FP32 * T * V, "logits.float() in ForCausalLMLoss"))
    return Node.of("logits and loss", [Node.of("saved", saved, "bytes"), Node.of("not saved", held, "bytes")],
                   "bytes", note=f"V={V}" + (f" per rank (tp={tp})" if tp > 1 else "") + f", T={T}")


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
                   [_scaled(layer, n, f"layers × {n}", f"{layer.value} bytes per layer")],
                   "bytes", note=f"Korthikanti et al. 2022 Table 2; b={b}, s={s}, h={h}, a={heads}, t={tp}, "
                                 f"sp={sp}, cp={cp}")


def _heads(spec: ModelSpec) -> int:
    for layer in spec.layers:
        for bl in layer.blocks:
            if isinstance(bl.dims, (AttentionDims, MLADims)):
                return bl.dims.heads
    raise TrainmathError(f"{spec.name}: no attention layer, the megatron profile needs attention heads")
