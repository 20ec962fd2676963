"""The ``megatron`` activation profile: what Megatron-Core's ``TransformerLayer`` saves for backward, per layer.

For the paper's GPT layer (LayerNorm, multi-head attention with q = d, a GeLU MLP of width 4d, dropout > 0 and the
unfused core attention that saves the s² softmax: ``--attention eager``) this is Korthikanti et al. 2022,
"Reducing Activation Recomputation in Large Transformer Models" (arXiv:2205.05198), §4 and Table 2, exactly:
sbh(34 + 5as/h) per layer, with its TP / SP / selective / full-recompute rows (``megatron_layer_terms``, and the
general fold ``layer_terms`` below, which reduces to it on that shape). For other shapes (SwiGLU, GQA, RMSNorm,
q_dim ≠ d, no dropout, flash attention) the same tensors are read from the spec's dimensions, each term from the
Megatron-LM module that saves it (paths in NVIDIA/Megatron-LM):

- ``megatron/core/transformer/transformer_layer.py``: pre-norm layer, ``input_layernorm`` → ``self_attention`` →
  bias-dropout-add → ``pre_mlp_layernorm`` → ``mlp`` → bias-dropout-add. Each norm (LayerNorm or RMSNorm,
  ``megatron/core/transformer/torch_norm.py`` / Transformer Engine) saves its input, x·T·d; its fp32 statistics
  (mean, rstd: 4 or 8 bytes per token) are left out, as the paper leaves them out.
- ``megatron/core/tensor_parallel/layers.py`` (``LinearWithGradAccumulationAndAsyncCommunication``): a
  column-parallel linear saves its input; with sequence parallelism the rank's s/t slice, all-gathered again in
  backward (Korthikanti §4.2.2), hence /t with SP. Row-parallel linears save their (already /t) input.
- ``megatron/core/transformer/attention.py`` + ``dot_product_attention.py`` / TE's ``DotProductAttention``: the
  core attention keeps q (h·h_d), k and v (h_kv·h_d, h_kv·h_v: GQA's smaller K/V), all /t. Flash (``sdpa``, the
  default): plus its output (the same storage as ``linear_proj``'s input) and the fp32 softmax logsumexp,
  4·b·(h/t)·s; no s² tensor. Unfused (``eager``): the softmax output x·(h/t)·s²·b, and with attention dropout > 0
  its 1-byte mask and its output (x·(h/t)·s²·b each); ``linear_proj``'s input x·T·q/t. Rotary embedding saves no
  per-layer tensor (its backward needs cos/sin only).
- ``megatron/core/fusions/fused_bias_dropout.py``: the hidden dropout after attention and after the MLP keeps a
  1-byte mask, T·d (/t with SP), only when the config's residual dropout > 0.
- ``megatron/core/transformer/mlp.py`` + ``megatron/core/fusions/fused_bias_swiglu.py``: ``linear_fc1`` saves its
  input (the norm's output); SwiGLU's ``SwiGLUFunction`` saves its input, fc1's fused gate‖up output, x·T·2f/t,
  and ``linear_fc2`` saves the activation's output x·T·f/t. GeLU (``fused_bias_gelu.py``) saves fc1's output
  x·T·f/t and fc2 its output x·T·f/t (Korthikanti's 8sbh + 8sbh at f = 4h).
- MoE (``megatron/core/transformer/moe/``, derived): the router's input is the pre-MLP norm's output (saved once),
  its logits x·T·E; each routed expert is the MLP above over the rows it receives; balanced routing gives a rank
  T·k routed rows (expert parallelism spreads experts, not rows; expert tensor parallelism = tp divides their
  width), the permuted rows (fc1's input) x·T·k·d, and the unpermute saves the experts' output x·T·k·d and the fp32
  probabilities 4·T·k; a shared expert is a dense MLP of its width. Load imbalance is not modelled.
- MLA (``megatron/core/transformer/multi_latent_attention.py``, derived): q and k are h·(d_nope + d_rope) wide, v
  h·d_v; the down-projections' latents (q_lora_rank, kv_lora_rank) are each saved twice (their norm's input and
  the up-projection's input), replicated over tp.
- Mamba-2 and Gated DeltaNet layers (hybrids: Nemotron-H, Qwen3-Next): ``_scan``, derived, not checked; refused
  with cp > 1.

T = b·s/cp tokens on the rank (context parallelism keeps s/cp queries; each term is divided by cp). Activations
are ``act_bytes`` (2: bf16), masks 1 byte. Full recompute (``--recompute-granularity full``,
``--recompute-method uniform``, one layer per checkpoint) keeps the layer input, x·T·d (/t with SP): Table 2's
last row; its backward recomputes one layer, which then holds that layer's no-recompute tensors. Selective recompute
(Megatron-Core's default ``core_attn`` module) drops the core attention's own tensors (the s² terms, or flash's
logsumexp) and recomputes them in the layer's backward.
"""

from __future__ import annotations

from collections.abc import Sequence

from trainmath.errors import TrainmathError
from trainmath.memory.megatron_recompute import check_modules, drops
from trainmath.memory.saved import LayerGroup, SavedActivations
from trainmath.memory.te_fp8 import fp8_terms
from trainmath.model.spec import (
    AttentionDims,
    LayerSpec,
    LinearAttentionDims,
    MambaDims,
    MLADims,
    MLPDims,
    ModelSpec,
    MoEDims,
)
from trainmath.tree import Node


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


def layer_terms(layer: LayerSpec, *, b: int, s: int, d: int, t: int = 1, sp: bool = False, cp: int = 1,
                x: int = 2, flash: bool = True, attention_dropout: float = 0.0, residual_dropout: float = 0.0,
                fp8: bool = False, expert_tp: int | None = None) -> tuple[list[Node], list[Node]]:
    """(tensors kept through the step, core-attention tensors that selective recompute drops) of one Megatron-Core
    layer on one rank, bytes each (module docstring: where each term comes from). Each value is divided exactly
    once by the degrees it names (/t, /t with SP, /cp). ``fp8``: an FP8 recipe's linears save their inputs in FP8
    (``memory.te_fp8``). ``expert_tp`` (default t): the routed experts' tensor-parallel split; with 1 under SP
    (Megatron-Core's MoE parallel folding, ``layout.ParallelLayout.expert_tp``) each TP rank routes its own s/t
    tokens to whole experts, so the routed rows are /t and the experts' widths whole: the same fc1 and
    activation bytes, the permuted rows and the unpermute /t."""
    rep = t if sp else 1
    kept: list[tuple[str, int, int]] = []  # (name, bytes before division, divisor)
    core: list[tuple[str, int, int]] = []
    rows = s * b  # every divisor below includes cp
    for block in layer.blocks:
        dims = block.dims
        if isinstance(dims, (MambaDims, LinearAttentionDims)):
            if cp > 1:
                raise TrainmathError(f"--cp {cp} with {block.kind} layers is not modelled: the scan carries its "
                                     f"state along the whole sequence; pass --cp 1")
            kept += [("input_layernorm: input", x * rows * d, rep), ("in_proj: input", x * rows * d, rep)]
            kept += [(n, v, t) for n, v, _ in _scan(dims, x * rows, b * s)]
        elif isinstance(dims, (AttentionDims, MLADims)):
            kept += [("input_layernorm: input", x * rows * d, rep), ("linear_qkv: input", x * rows * d, rep)]
            if isinstance(dims, AttentionDims):
                q, k, v = dims.heads * dims.head_dim, dims.kv_heads * dims.head_dim, dims.kv_heads * dims.v_head_dim
                o = dims.heads * dims.v_head_dim
            else:
                q = k = dims.heads * (dims.qk_nope_head_dim + dims.qk_rope_head_dim)
                v = o = dims.heads * dims.v_head_dim
                for rank, name in ((dims.q_lora_rank, "q"), (dims.kv_lora_rank, "kv")):
                    if rank:
                        kept += [(f"{name} latent: norm input", x * rows * rank, 1),
                                 (f"{name} latent: up-projection input", x * rows * rank, 1)]
            kept += [("core attention: q", x * rows * q, t), ("core attention: k", x * rows * k, t),
                     ("core attention: v", x * rows * v, t), ("linear_proj: input (attention output)", x * rows * o, t)]
            heads = dims.heads
            if flash:
                core.append(("core attention: softmax logsumexp (fp32)", 4 * b * heads * s, t))
            else:
                core.append(("core attention: softmax output", x * heads * s * s * b, t))
                if attention_dropout > 0:
                    core += [("core attention: softmax dropout mask", heads * s * s * b, t),
                             ("core attention: dropout output", x * heads * s * s * b, t)]
            if residual_dropout > 0:
                kept.append(("attention: hidden dropout mask", rows * d, rep))
        elif isinstance(dims, MLPDims):
            kept += [("pre_mlp_layernorm: input", x * rows * d, rep), ("linear_fc1: input", x * rows * d, rep)]
            kept += _mlp(dims.intermediate, dims.gated, x * rows, t, "mlp")
            if residual_dropout > 0:
                kept.append(("mlp: hidden dropout mask", rows * d, rep))
        elif isinstance(dims, MoEDims):
            routed = rows * dims.top_k
            # expert TP 1 under SP (MoE parallel folding): each TP rank routes its own s/t tokens to whole experts
            shard = t if sp and expert_tp == 1 else 1
            kept += [("pre_mlp_layernorm: input", x * rows * d, rep), ("router: input", x * rows * d, rep),
                     ("router: logits", x * rows * dims.experts, 1),
                     ("experts: permuted rows (linear_fc1 input)", x * routed * d, shard)]
            kept += _mlp(dims.expert_intermediate, dims.gated, x * routed, t, "experts")
            kept += [("unpermute: expert output", x * routed * d, shard),
                     ("unpermute: probabilities (fp32)", 4 * routed, shard)]
            if dims.shared_intermediate:
                kept += _mlp(dims.shared_intermediate, dims.gated, x * rows, t, "shared expert")
            if residual_dropout > 0:
                kept.append(("mlp: hidden dropout mask", rows * d, rep))

    def leaves(terms):
        return [_leaf(n, v // (div * cp), f"/{div * cp}" if div * cp > 1 else "") for n, v, div in terms]

    if fp8:  # Transformer Engine's FP8 linears save their inputs in FP8 (memory/te_fp8.py)
        kept = fp8_terms(kept, x)
    return leaves(kept), leaves(core)


def _scan(dims, xrows: int, tokens: int) -> list[tuple[str, int, int]]:
    """Mamba-2 (``megatron/core/ssm/mamba_mixer.py``) or Gated DeltaNet, derived from what each op's backward
    reads (not checked against Megatron-Core): the input projection's output, the causal conv's output, the scan's
    output and fp32 chunk states (one state per 64- or ``chunk_size``-token chunk), the gated norm's output (the
    output projection's input), all split over tp by heads."""
    if isinstance(dims, MambaDims):
        di, gn = dims.intermediate, dims.groups * dims.state_size
        chunks = -(-tokens // dims.chunk_size)
        return [("in_proj: output (z, x, B, C, dt)", xrows * (2 * di + 2 * gn + dims.heads), 1),
                ("conv1d: output (x, B, C)", xrows * (di + 2 * gn), 1), ("ssd scan: output", xrows * di, 1),
                ("ssd scan: chunk states (fp32)", 4 * chunks * dims.heads * dims.head_dim * dims.state_size, 1),
                ("out_proj: input (gated norm output)", xrows * di, 1)]
    k, v = dims.key_heads * dims.key_head_dim, dims.value_heads * dims.value_head_dim
    chunks = -(-tokens // 64)
    return [("in_proj: output (q, k, v, z, b, a)", xrows * (2 * k + 2 * v + 2 * dims.value_heads), 1),
            ("conv1d: output (q, k, v)", xrows * (2 * k + v), 1), ("delta rule: output", xrows * v, 1),
            ("delta rule: chunk states (fp32)", 4 * chunks * dims.value_heads * dims.key_head_dim
             * dims.value_head_dim, 1), ("out_proj: input (gated norm output)", xrows * v, 1)]


def _mlp(width: int, gated: bool, xrows: int, t: int, name: str) -> list[tuple[str, int, int]]:
    """fc1's output (SwiGLU's saved input: gate‖up, 2f; GeLU's input: f) and the activation's output (fc2's
    input, f), both column-split over tp."""
    if gated:
        return [(f"{name}: linear_fc1 output (SwiGLU input, gate and up)", xrows * 2 * width, t),
                (f"{name}: SwiGLU output (linear_fc2 input)", xrows * width, t)]
    return [(f"{name}: linear_fc1 output (GeLU input)", xrows * width, t),
            (f"{name}: GeLU output (linear_fc2 input)", xrows * width, t)]


def activations_megatron(spec: ModelSpec, *, micro_batch: int, seq: int, recompute: str = "none", tp: int = 1,
                         sp: bool = False, cp: int = 1, layers: Sequence[int] = (), compute_dtype_bytes: int = 2,
                         attention: str = "sdpa", attention_dropout: float = 0.0, residual_dropout: float = 0.0,
                         recompute_saves: Sequence[str] = (), recompute_modules: Sequence[str] = (),
                         fp8: bool = False, expert_tp: int | None = None) -> SavedActivations:
    """The ``megatron`` profile on one rank: ``layers`` → ``<layer label> × n`` (as the hf profile names its
    groups, so the timeline puts each on its layer's events) → per saved tensor (``layer_terms``), and under
    recompute the ``recompute transient``: what one layer's backward holds again (full: the whole layer's
    tensors; selective: its core attention's). ``attention``: ``sdpa`` is flash attention, ``eager`` Megatron's
    unfused core attention (the paper's, s² softmax saved). Embedding, final norm and logits are not in Table 2:
    the head is ``logits_bytes``. ``recompute_saves`` (with ``full``): tensors of ``layer_terms`` kept beside the
    checkpointed input, by name, as a JAX remat policy ``save_only_these_names`` keeps them (MaxText's
    ``remat_policy``, e.g. ``save_qkv_proj``: the q, k and v projections; every other tensor recomputed);
    a name no layer has is refused. ``recompute_modules`` (with ``selective``): Megatron-Core's
    ``--recompute-modules`` (``memory.megatron_recompute``; empty: ``core_attn``, its default). ``fp8``: under an
    FP8 recipe Transformer Engine's linears save their inputs in FP8 (``memory.te_fp8``)."""
    if tp < 1 or cp < 1:
        raise TrainmathError(f"tp ({tp}) and cp ({cp}) must be at least 1")
    if sp and tp == 1:
        raise TrainmathError("sp=True needs tp > 1 (sequence parallelism splits along the tensor-parallel group)")
    if seq % (tp if sp else 1) or seq % cp:
        raise TrainmathError(f"seq ({seq}) must be divisible by tp ({tp}) with sp and by cp ({cp})")
    check_modules(recompute_modules)
    b, s, d, x = micro_batch, seq, spec.hidden_size, compute_dtype_bytes
    groups, largest, core_largest = [], None, None
    found: set[str] = set()
    for layer, idx in spec.layer_groups():
        mine = [i for i in idx if i in set(layers)]
        if not mine:
            continue
        kept, core = layer_terms(layer, b=b, s=s, d=d, t=tp, sp=sp, cp=cp, x=x, flash=attention != "eager",
                                 attention_dropout=attention_dropout, residual_dropout=residual_dropout, fp8=fp8,
                                 expert_tp=expert_tp)
        whole = Node.of(layer.label, kept + core, "bytes")
        if largest is None or whole.value > largest.value:
            largest = whole
        if recompute == "full":
            keep = [n for n in kept + core if n.name in set(recompute_saves)]
            one = Node.of(layer.label, [_leaf("layer input (checkpoint)", x * s * b * d // ((tp if sp else 1) * cp)),
                                        *keep], "bytes")
            found.update(n.name for n in keep)
        elif recompute == "selective":
            mods = tuple(recompute_modules) or ("core_attn",)
            mla = any(isinstance(blk.dims, MLADims) for blk in layer.blocks)
            gone = [n for n in kept if drops(n.name, mods, mla=mla)] + (core if "core_attn" in mods else [])
            one = Node.of(layer.label, [n for n in kept + core if n not in gone], "bytes")
            if gone and (core_largest is None or sum(n.value for n in gone) > core_largest.value):
                core_largest = Node.of(layer.label, gone, "bytes")
        else:
            one = whole
        groups.append(LayerGroup(label=layer.label, layers=tuple(mine), one=one))
    if recompute == "full" and set(recompute_saves) - found:
        raise TrainmathError(f"recompute saves {sorted(set(recompute_saves) - found)} name no tensor the megatron "
                             f"profile saves in {spec.name}'s layers (memory.megatron.layer_terms names)")
    transient = largest if recompute == "full" else core_largest if recompute == "selective" else None
    if transient is not None:
        transient = Node(name="recompute transient", value=transient.value, unit="bytes",
                         children=transient.children, note="one layer's recomputed tensors while its backward runs")
    return SavedActivations(profile="megatron", recompute=recompute, groups=tuple(groups),
                            recompute_transient=transient,
                            note=f"Megatron-Core, Korthikanti et al. 2022 Table 2 terms; b={b}, s={s}, d={d}, t={tp}, "
                                 f"sp={sp}, cp={cp}, attention "
                                 f"{'unfused (s² softmax saved)' if attention == 'eager' else 'flash'}")
