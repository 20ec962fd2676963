"""Routed experts: how transformers 5.24 runs them, with what each path keeps for backward (derived from
``transformers.integrations.moe`` and the families' expert modules, measured with saved_tensors_hooks and
MemTracker, checked by ``tests/activations`` and ``tests/memory``).

Rows: Σ n_e = T·k over the experts for any routing, so one tensor of T·k rows stands for the per-expert tensors
of the loop (``Ctx.token_rows``). A context-parallel rank routes its own T/cp tokens: T/cp·k rows (``seq``). An
expert-parallel rank keeps them otherwise whole: EP ranks are drawn from data parallelism (dp·cp), each brings
its own tokens, and under balanced routing receives as many rows for its n/ep experts (``ops.ir.SHARDS``); only
expert-count axes (weight copies, per-expert offsets) are ``expert`` (÷ep). The expert width is ``tp``
(expert tensor parallelism = tensor parallelism, as ``placement`` assumes).

- ``eager_loop`` (``experts_implementation="eager"``): per hit expert, torch.where's token and slot indices (one
  (n_e, 2) int64 storage), the gathered input (its compute-dtype cast under autocast), the fused gate_up output
  (gate and up are views of it), the activation output and the product; down's output and the routing weight
  (indexed per expert) kept by the routing product; the index_add source. Autocast casts each hit expert's weight
  slice: ``min(experts_hit, n)`` weight copies per expert weight.
- ``grouped_mm`` (transformers 5's default): all T·k rows at once, sorted by expert: the sort permutation, its
  inverse and the token index (int64), the int32 per-expert offsets, then the same gathered input, gate_up output,
  activation output, product and down output, all in the input's dtype (``_grouped_mm`` is no autocast op: under
  autocast it runs in fp32 on the fp32 weights, uncast: no weight copies), the routing weights, no index_add.
- ``all_tokens`` (Llama 4): every expert runs over all T tokens (scores 0 where unselected): n·T rows.
- ``clamped_swiglu`` (gpt-oss): biased ``x·W + b`` (under autocast a bf16 product plus an fp32 bias: fp32 up to
  the down projection), the gate and up interleaved views clamped, ``(up + 1)·gate·sigmoid(α·gate)``; its
  ``grouped_mm`` path adds the biases in place and keeps the sorted expert ids for their gathers.
"""

from __future__ import annotations

from trainmath.errors import TrainmathError
from trainmath.model.spec import Block, TensorSpec
from trainmath.ops.context import FP32, INT64, Ctx
from trainmath.ops.ir import Axis, Program, Tensor, tensor
from trainmath.ops.kernels.linear import weight_copy

EXPERT_PATHS = ("eager", "grouped")


def routed_weights(block: Block) -> tuple[list[TensorSpec], TensorSpec]:
    """(the expert weights producing gate/up, in that order; down's) of a MoE block."""
    ws = [t for t in block.tensors if t.experts and t.kind == "linear"]
    down = [t for t in ws if "down_proj" in t.name or ".w2." in t.name]
    first = [t for t in ws if t not in down]
    first.sort(key=lambda t: 1 if ("up_proj" in t.name and "gate_up" not in t.name) or ".w3." in t.name else 0)
    if len(down) != 1 or not first:
        raise TrainmathError(f"MoE block without recognisable expert weights: {[t.name for t in ws]}")
    return first, down[0]


def hit_copies(ctx: Ctx, n: int) -> int:
    """Experts whose weight slice the eager loop casts under autocast: the hit ones (all by default)."""
    return n if ctx.experts_hit is None else min(ctx.experts_hit, n)


def expert_linear(prog: Program, ctx: Ctx, name: str, x: Tensor, out: Axis, weights: list[TensorSpec], *,
                  copies: int | None, autocast: bool = True, out_dtype: int | None = None,
                  kernel: str | None = None) -> Tensor:
    """One (fused) expert projection over the routed rows: one op per spec weight (gate and up stored apart
    are one fused matmul in the module: one input cast, one output). Saves the input (its cast under autocast
    when ``autocast``) and, with ``copies`` not None, the weights' autocast casts (``copies`` experts). ``kernel``
    defaults to ``grouped_mm`` (``copies`` None) or ``eager_loop``; ``all_tokens`` marks rows that are every
    expert over every token (``ops.flops`` then counts the active T·top_k of them by default)."""
    c = ctx.p.compute_bytes
    xin = x
    if autocast and ctx.p.autocast and x.dtype_bytes != c:
        xin = tensor(f"{name}.input_cast", x.axes, c, "autocast copy of the routed rows")
    y = tensor(f"{name}.out", (*x.axes[:-1], out), out_dtype or (c if autocast else x.dtype_bytes))
    for i, w in enumerate(weights):
        saved = [xin]
        wc = weight_copy(ctx, w, copies) if copies is not None else None
        if wc is not None:
            saved.append(wc)
        prog.emit("linear", name, inputs=(x,), outputs=(y,) if i == 0 else (), saved=saved, weight=w,
                  kernel=kernel or ("grouped_mm" if copies is None else "eager_loop"),
                  note="" if i == 0 else f"fused with {weights[0].name}: one matmul, one output")
    return y


def _gated(prog: Program, prefix: str, h: Tensor, f: int, act: str) -> Tensor:
    """``act(gate) * up`` over views of the fused gate_up output; returns the product."""
    gate = h.view(f"{prefix}.gate", *h.axes[:-1], Axis(f, "tp"), note="gate and up are views of gate_up")
    up = h.view(f"{prefix}.up", *h.axes[:-1], Axis(f, "tp"))
    a = tensor(f"{prefix}.act_out", gate.axes, h.dtype_bytes)
    prog.emit("act", f"{prefix}.act_fn", inputs=(gate,), outputs=(a,), saved=(gate,), kernel=act)
    prod = tensor(f"{prefix}.down_proj.input", gate.axes, h.dtype_bytes)
    prog.emit("mul", f"{prefix}.gate_mul", inputs=(a, up), outputs=(prod,), saved=(a, up))
    return prod


def _relu2(prog: Program, prefix: str, h: Tensor) -> Tensor:
    r = tensor(f"{prefix}.relu_out", h.axes, h.dtype_bytes, "saved by relu and by pow")
    prog.emit("act", f"{prefix}.relu", inputs=(h,), outputs=(r,), saved=(r,), kernel="relu")
    sq = tensor(f"{prefix}.down_proj.input", h.axes, h.dtype_bytes)
    prog.emit("act", f"{prefix}.square", inputs=(r,), outputs=(sq,), saved=(r,), kernel="pow")
    return sq


def eager_experts(prog: Program, ctx: Ctx, block: Block, x: Tensor, weights: Tensor, *, k: int, f: int,
                  prefix: str, act: str = "silu", source_dtype: int | None = None) -> None:
    """The eager per-expert loop over the MoE input ``x`` with the (rows × k) routing ``weights``; ``act``
    ``relu2`` runs non-gated relu² experts. The index_add source has ``source_dtype`` (default: the residual's,
    as ``.to(hidden_states.dtype)`` makes it)."""
    first, down = routed_weights(block)
    n = down.experts
    rows = ctx.token_rows(k)  # ÷cp; whole on an expert-parallel rank (module docstring)
    d = x.axes[-1]
    idx = tensor(f"{prefix}.token_slot_indices", (rows, Axis(2)), INT64, "torch.where's (n_e, 2) indices per expert")
    xs = tensor(f"{prefix}.gathered_input", (rows, d), x.dtype_bytes, "hidden_states[token_idx]")
    prog.emit("index", f"{prefix}.gather", inputs=(x,), outputs=(xs,), saved=(idx,))
    copies = hit_copies(ctx, n)
    gated = act != "relu2"
    h = expert_linear(prog, ctx, f"{prefix}.gate_up_proj" if gated else f"{prefix}.up_proj", xs,
                      Axis((2 if gated else 1) * f, "tp"), first, copies=copies)
    prod = _gated(prog, prefix, h, f, act) if gated else _relu2(prog, prefix, h)
    y = expert_linear(prog, ctx, f"{prefix}.down_proj", prod, d, [down], copies=copies)
    rw = tensor(f"{prefix}.routing_weight", (rows, Axis(1)), weights.dtype_bytes, "top_k_weights[token_idx, slot]")
    prog.emit("index", f"{prefix}.routing_weight", inputs=(weights,), outputs=(rw,), saved=(idx,))
    wy = tensor(f"{prefix}.weighted", (rows, d), max(y.dtype_bytes, rw.dtype_bytes))
    prog.emit("mul", f"{prefix}.routing_mul", inputs=(y, rw), outputs=(wy,), saved=(y, rw))
    src = tensor(f"{prefix}.index_add_source", (rows, d), source_dtype or ctx.p.residual_bytes)
    prog.emit("index_add", f"{prefix}.index_add", inputs=(src, idx), saved=(src,))


def grouped_experts(prog: Program, ctx: Ctx, block: Block, x: Tensor, weights: Tensor, *, k: int, f: int,
                    prefix: str, act: str = "silu", clamped: bool = False) -> None:
    """transformers' ``grouped_mm`` path over the MoE input ``x`` (gated experts). ``clamped``: gpt-oss's biased
    experts (``has_bias``, ``is_transposed``, its own ``_apply_gate``, ``_clamped_gate``), which also keep the
    sorted expert ids (int64) for both bias gathers (``gate_up_proj_bias[expert_ids_g]``, ``down_proj_bias[...]``);
    the biases are added in place (``out.add_(bias)``: nothing more saved, no dtype change), so every row tensor has
    the input's dtype, which ``_grouped_mm``'s ``input.to(weight.dtype)`` makes the weights' (fp32 under
    autocast)."""
    first, down = routed_weights(block)
    n = down.experts
    rows = ctx.token_rows(k)  # ÷cp; whole on an expert-parallel rank (module docstring)
    d = x.axes[-1]
    sort = [tensor(f"{prefix}.{nm}", (rows,), INT64, note) for nm, note in (
        ("sort_permutation", "argsort of the expert ids"), ("sort_inverse", "its inverse"),
        ("token_index", "the token of each sorted row"),
        *((("sorted_expert_ids", "kept by the two bias gathers"),) if clamped else ()))]
    offsets = tensor(f"{prefix}.offsets", (Axis(n, "expert"),), 4, "int32 per-expert offsets")
    xs = tensor(f"{prefix}.gathered_input", (rows, d), x.dtype_bytes, "sorted rows, in the input's dtype")
    prog.emit("index", f"{prefix}.sort", inputs=(x,), outputs=(xs,), saved=(*sort, offsets))
    h = expert_linear(prog, ctx, f"{prefix}.gate_up_proj", xs, Axis(2 * f, "tp"), first, copies=None,
                      autocast=False)
    prod = _clamped_gate(prog, prefix, h, f, h.dtype_bytes) if clamped else _gated(prog, prefix, h, f, act)
    y = expert_linear(prog, ctx, f"{prefix}.down_proj", prod, d, [down], copies=None, autocast=False)
    rw = tensor(f"{prefix}.routing_weight", (rows, Axis(1)), weights.dtype_bytes)
    prog.emit("index", f"{prefix}.routing_weight", inputs=(weights,), outputs=(rw,), saved=(sort[0],))
    wy = tensor(f"{prefix}.weighted", (rows, d), max(y.dtype_bytes, rw.dtype_bytes))
    prog.emit("mul", f"{prefix}.routing_mul", inputs=(y, rw), outputs=(wy,), saved=(y, rw))


def routed_experts(prog: Program, ctx: Ctx, block: Block, x: Tensor, weights: Tensor, *, k: int, f: int,
                   prefix: str, act: str = "silu") -> None:
    """The expert path ``ctx.experts`` (``EXPERT_PATHS``) for gated experts."""
    if ctx.experts == "grouped":
        grouped_experts(prog, ctx, block, x, weights, k=k, f=f, prefix=prefix, act=act)
    elif ctx.experts == "eager":
        eager_experts(prog, ctx, block, x, weights, k=k, f=f, prefix=prefix, act=act)
    else:
        raise TrainmathError(f"experts path {ctx.experts!r} is not one of {', '.join(EXPERT_PATHS)}")


def all_tokens_experts(prog: Program, ctx: Ctx, block: Block, x: Tensor, scores: Tensor, *, f: int,
                       prefix: str, act: str = "silu") -> None:
    """Every expert over all T tokens: ``x.repeat(n, 1) * scores.T.reshape(-1, 1)``, then batched gate_up, act,
    product, down. The product keeps the repeated input and a transposed copy of the scores (compute dtype)."""
    first, down = routed_weights(block)
    n = down.experts
    rows = ctx.token_rows(n)  # ÷cp; whole on an expert-parallel rank (module docstring)
    d = x.axes[-1]
    c = ctx.p.compute_bytes
    rep = tensor(f"{prefix}.repeated_input", (rows, d), x.dtype_bytes, "input repeated n times, saved by the product")
    st = tensor(f"{prefix}.scores_t", (rows, Axis(1)), c, "(n·T, 1) transposed copy of the scores")
    prog.emit("copy", f"{prefix}.repeat", inputs=(x, scores), outputs=(rep, st))
    scaled = tensor(f"{prefix}.scaled_input", (rows, d), max(rep.dtype_bytes, c))
    prog.emit("mul", f"{prefix}.score_mul", inputs=(rep, st), outputs=(scaled,), saved=(rep, st))
    h = expert_linear(prog, ctx, f"{prefix}.gate_up_proj", scaled, Axis(2 * f, "tp"), first, copies=n,
                      kernel="all_tokens")
    prod = _gated(prog, prefix, h, f, act)
    expert_linear(prog, ctx, f"{prefix}.down_proj", prod, d, [down], copies=n, kernel="all_tokens")


def _clamped_gate(prog: Program, prefix: str, h: Tensor, f: int, g: int) -> Tensor:
    """gpt-oss's ``_apply_gate`` over the (rows × 2f) gate_up output ``h``: the interleaved gate and up views
    clamped (each clamp keeps its view), ``glu = gate·sigmoid(α·gate)``, ``(up + 1)·glu``; returns the product."""
    rows = h.axes[0]
    gate = h.view(f"{prefix}.gate", rows, Axis(f, "tp"), note="interleaved views of gate_up, kept by both clamps")
    up = h.view(f"{prefix}.up", rows, Axis(f, "tp"))
    gc = tensor(f"{prefix}.gate_clamped", gate.axes, g)
    uc = tensor(f"{prefix}.up_clamped", gate.axes, g)
    prog.emit("act", f"{prefix}.clamp_gate", inputs=(gate,), outputs=(gc,), saved=(gate,), kernel="clamp")
    prog.emit("act", f"{prefix}.clamp_up", inputs=(up,), outputs=(uc,), saved=(up,), kernel="clamp")
    sig = tensor(f"{prefix}.sigmoid", gate.axes, g)
    prog.emit("act", f"{prefix}.sigmoid", inputs=(gc,), outputs=(sig,), saved=(sig,), kernel="sigmoid")
    glu = tensor(f"{prefix}.glu", gate.axes, g)
    prog.emit("mul", f"{prefix}.glu", inputs=(gc, sig), outputs=(glu,), saved=(gc, sig))
    up1 = tensor(f"{prefix}.up_plus_one", gate.axes, g)
    prod = tensor(f"{prefix}.gated", gate.axes, g)
    prog.emit("mul", f"{prefix}.gate_mul", inputs=(up1, glu), outputs=(prod,), saved=(up1, glu))
    return prod


def clamped_swiglu_experts(prog: Program, ctx: Ctx, block: Block, x: Tensor, weights: Tensor, *, k: int, f: int,
                           prefix: str) -> None:
    """The eager loop over biased experts with the clamped, interleaved SwiGLU; token and slot indices are
    separate storages here (one is kept by the gather and index_add, the other by the weights' gather)."""
    first, down = routed_weights(block)
    n = down.experts
    rows = ctx.token_rows(k)  # ÷cp; whole on an expert-parallel rank (module docstring)
    d = x.axes[-1]
    c = ctx.p.compute_bytes
    g = FP32 if ctx.p.autocast else c  # bf16 product + fp32 bias
    tok = tensor(f"{prefix}.token_indices", (rows,), INT64, "saved by the gather and by index_add")
    slot = tensor(f"{prefix}.slot_indices", (rows,), INT64, "top-k positions, saved by the routing weights' gather")
    xs = tensor(f"{prefix}.gathered_input", (rows, d), x.dtype_bytes)
    prog.emit("index", f"{prefix}.gather", inputs=(x,), outputs=(xs,), saved=(tok,))
    copies = hit_copies(ctx, n)
    h = expert_linear(prog, ctx, f"{prefix}.gate_up_proj", xs, Axis(2 * f, "tp"), first, copies=copies,
                      out_dtype=g)
    prod = _clamped_gate(prog, prefix, h, f, g)
    y = expert_linear(prog, ctx, f"{prefix}.down_proj", prod, d, [down], copies=copies, out_dtype=g)
    rw = tensor(f"{prefix}.routing_weight", (rows, Axis(1)), weights.dtype_bytes)
    prog.emit("index", f"{prefix}.routing_weight", inputs=(weights,), outputs=(rw,), saved=(slot,))
    wy = tensor(f"{prefix}.index_add_source", (rows, d), g, "the weighted output, kept by index_add")
    prog.emit("mul", f"{prefix}.routing_mul", inputs=(y, rw), outputs=(wy,), saved=(y, rw))
    prog.emit("index_add", f"{prefix}.index_add", inputs=(wy, tok), saved=(wy,))

