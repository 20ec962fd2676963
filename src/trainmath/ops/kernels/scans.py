"""Linear-attention and state-space mixers on transformers' torch fallbacks (no ``causal_conv1d``, no
flash-linear-attention, no mamba_ssm kernels), after the input norm: the causal depthwise conv1d, Qwen3-Next's
chunked gated delta rule and Mamba-2's SSD chunk scan, each with its gated RMSNorm. Derived from the code,
checked by ``tests/activations`` (one and several chunks).

The chunked scans keep many fp32 tensors whose sizes are exact only as the code pads and chunks them; each is
one ``Tensor`` here (``count`` where the code keeps several equal ones: per chunk, per use). Heads (value heads,
Mamba heads, groups) are ``tp``: ``parallelize_module`` splits the column-wise in_proj, conv and norm over them.
Positions are ``seq``. Context parallelism over a scan is refused (``memory.activations``): torch's
``context_parallel`` splits only SDPA, and the torch scan carries its state along the whole sequence, so there is
no per-rank run of these layers to describe.
"""

from __future__ import annotations

from trainmath.model.spec import Block, LinearAttentionDims, MambaDims
from trainmath.ops.cache import conv_state, recurrent_state
from trainmath.ops.context import FP32, Ctx
from trainmath.ops.ir import Axis, Program, Tensor, tensor
from trainmath.ops.kernels.attention import find
from trainmath.ops.kernels.linear import cast, gather_seq, linear, weight_copy


def _conv(prog: Program, ctx: Ctx, block: Block, prefix: str, x: Tensor, channels: int, kernel: int,
          saved: list[Tensor]) -> Tensor:
    """``causal_conv1d_fn``'s torch path: ``silu(conv1d(x)[..., :s])``; the SiLU keeps the whole padded conv
    output (c·b·channels·(s + K - 1)); the inference cache keeps the (b, channels, K) conv state. Returns the SiLU
    output (b, s, channels)."""
    c = ctx.p.compute_bytes
    chan = Axis(channels, "tp")
    padded = tensor(f"{prefix}.conv1d.silu_input", (Axis(ctx.b), chan, Axis(ctx.s + kernel - 1, "seq")), c,
                "the whole padded conv output")
    w = find(block, "conv1d.weight")
    wc = weight_copy(ctx, w) if w is not None else None
    prog.emit("conv", f"{prefix}.conv1d", inputs=(x,), outputs=(padded,), saved=(*saved, *([wc] if wc else [])),
              kernel="conv1d_depthwise", weight=w, cache=(conv_state(ctx, channels, kernel),))
    out = tensor(f"{prefix}.conv1d.silu_out", (*ctx.rows(sp=False), chan), c)
    prog.emit("act", f"{prefix}.conv1d.silu", inputs=(padded,), outputs=(out,), saved=(padded,), kernel="silu")
    return out


UNREACHED = "unreached"
"""The kernel of an op whose output cannot reach the loss but whose saved tensors stay alive after a plain
forward (measured: Gated DeltaNet's last state update with one chunk, exp(g_last - cumsum) and the chunk decay).
A checkpoint's recompute does not store them: the forward's nodes, and the holders they owned, are gone."""


def gated_deltanet(prog: Program, ctx: Ctx, block: Block, x: Tensor, *, prefix: str = "linear_attn") -> Tensor:
    """Qwen3-Next's Gated DeltaNet reading ``x`` (the input norm's output); returns out_proj's output.

    Symbols: h_v value heads, d_k/d_v head dims, kd = h_k·d_k, vd = h_v·d_v, cd = 2·kd + vd conv channels, K conv
    kernel, C the chunk (``Ctx.gdn_chunk``, 64 in transformers), L = s padded to a multiple of C, N = L/C chunks, G =
    b·h_v. The depthwise conv keeps its input (the cat of q, k, v) and SiLU the padded conv output; beta = sigmoid(b)
    keeps c·T·h_v; the decay g = -exp(A_log)·softplus(a + dt_bias) keeps the fp32 softplus input and output and
    exp(A_log) and its negation. The chunked rule runs in fp32: the L2 norms of q and k (repeated to h_v heads) keep
    their fp32 inputs and rsqrt; the padded value, key, query and k·beta, padded beta and two exp(cumsum(g)); the (C, C)
    bool mask; five (G, L, C) fp32 tensors (the decay exp, k_beta·kᵀ, q·kᵀ, their product, intra-chunk attention); the
    two triangular solves' results; per chunk v_new and the state the chunk reads. With N > 1 the state carries
    gradient, adding the decayed query and key. exp(g_last - cumsum) and the per-chunk decay stay alive even with one
    chunk (measured). Under autocast every ``@`` runs in c on casts of its fp32 operands (the casts are kept instead of
    some fp32 products). Output: the gated RMSNorm (``x.float()``, rsqrt per (token, head), ``w * y.to(c)``, then ``·
    silu(z.float())``) and out_proj's input."""
    dims = block.dims
    if not isinstance(dims, LinearAttentionDims):
        raise TypeError(f"a linear_attention block carries LinearAttentionDims, got {type(dims).__name__}")
    c, b = ctx.p.compute_bytes, ctx.b
    hv, dk, dv = dims.value_heads, dims.key_head_dim, dims.value_head_dim
    kd, vd = dims.key_heads * dk, hv * dv
    cd = 2 * kd + vd
    C = ctx.gdn_chunk
    N = -(-ctx.s // C)
    L = N * C
    rows = ctx.rows(sp=False)
    H = Axis(hv, "tp")
    xg = gather_seq(prog, x, f"{prefix}.input")
    linear(prog, ctx, f"{prefix}.in_proj_qkvz", xg, Axis(2 * kd + 2 * vd, "tp"), weight=find(block, "in_proj_qkvz"))
    linear(prog, ctx, f"{prefix}.in_proj_ba", xg, Axis(2 * hv, "tp"), weight=find(block, "in_proj_ba"))
    qkv = tensor(f"{prefix}.conv1d.input", (*rows, Axis(cd, "tp")), c, "cat of q, k, v")
    _conv(prog, ctx, block, prefix, qkv, cd, dims.conv_kernel, [qkv])
    per_head = (*rows, H)
    prog.emit("act", f"{prefix}.gates", saved=(
        tensor("beta.sigmoid", per_head, c), tensor("g.softplus_input", per_head, FP32),
        tensor("g.softplus_out", per_head, FP32),
        tensor("g.exp_A", (H,), FP32), tensor("g.neg_exp_A", (H,), FP32)), kernel="sigmoid, softplus, exp")
    G = (Axis(b), H)
    GL = (*G, Axis(L, "seq"))
    v_pad, k_pad, q_pad = (tensor(f"gdr.{n}_padded", (*GL, Axis(w)), FP32)
                           for n, w in (("value", dv), ("key", dk), ("query", dk)))
    saved = [tensor("gdr.q_l2norm.x", (*per_head, Axis(dk)), FP32), tensor("gdr.q_l2norm.rsqrt", per_head, FP32),
             tensor("gdr.k_l2norm.x", (*per_head, Axis(dk)), FP32), tensor("gdr.k_l2norm.rsqrt", per_head, FP32),
             v_pad, k_pad, q_pad, tensor("gdr.k_beta", (*GL, Axis(dk)), FP32),
             tensor("gdr.beta_padded", GL, FP32), tensor("gdr.exp_cumsum", GL, FP32, "two exp(cumsum(g))", count=2),
             tensor("gdr.upper_mask", (Axis(C), Axis(C)), 1, "bool"),
             tensor("gdr.new_values", (*GL, Axis(dv)), FP32), tensor("gdr.k_cumdecay", (*GL, Axis(dk)), FP32),
             tensor("gdr.exp_last_minus_cumsum", GL, FP32, "kept even when N = 1 (measured)"),
             tensor("gdr.chunk_decay", (*G, Axis(N)), FP32, "kept even when N = 1 (measured)")]
    if N == 1:  # saved only by the final state's update, which cannot reach the loss (no cache): see UNREACHED
        prog.emit("scan", f"{prefix}.final_state_update", saved=saved[-2:], kernel=UNREACHED)
        saved = saved[:-2]
    chunk_v, chunk_k, state = (*G, Axis(C), Axis(dv)), (*G, Axis(C), Axis(dk)), (*G, Axis(dk), Axis(dv))
    GLC = (*GL, Axis(C))
    if not ctx.p.autocast:
        saved += [tensor("gdr.chunk_matrices", GLC, FP32, "decay exp, k_beta·kᵀ, q·kᵀ, ut_system, intra-chunk "
                                                      "attention", count=5),
                  tensor("gdr.v_new", chunk_v, FP32, "per chunk", count=N),
                  tensor("gdr.states", state, FP32, "the state each chunk reads", count=N)]
        if N > 1:
            saved += [tensor("gdr.query_decayed", (*GL, Axis(dk)), FP32),
                      tensor("gdr.key_decayed", (*GL, Axis(dk)), FP32)]
    else:
        saved += [tensor("gdr.chunk_matrices_fp32", GLC, FP32, "decay exp, ut_system", count=2),
                  tensor("gdr.products_c", GLC, c, "k_beta·kᵀ and q·kᵀ in c, saved by the decay products", count=2),
                  tensor("gdr.intra_cast", GLC, c, "per-chunk casts of the intra-chunk attention"),
                  tensor("gdr.operand_casts", (*GL, Axis(dk)), c, "kᵀ twice, k_beta, q", count=4),
                  tensor("gdr.state_casts", state, c, "each chunk's state, cast by two products", count=2 * N),
                  tensor("gdr.v_new_casts", chunk_v, c, count=2 * N - 1)]
        if N > 1:
            saved += [tensor("gdr.chunk_operand_casts", chunk_k, c, "k_cumdecay, decayed query and key slices of the "
                                                                "chunks after the first / before the last",
                         count=3 * (N - 1)),
                      tensor("gdr.states_fp32", state, FP32, "kept by the state decay products", count=N - 1)]
    out = tensor(f"{prefix}.core_out", (*per_head, Axis(dv)), FP32)
    prog.emit("scan", f"{prefix}.chunk_gated_delta_rule", inputs=(q_pad, k_pad, v_pad), outputs=(out,), saved=saved,
              kernel="chunk_gated_delta_rule", chunk=C, cache=(recurrent_state(ctx, hv, dk, dv),))
    wide = (*per_head, Axis(dv))
    prog.emit("norm", f"{prefix}.norm", inputs=(out,), saved=(
        tensor("norm.x_fp32", wide, FP32), tensor("norm.rsqrt", per_head, FP32), tensor("norm.normalized", wide, c),
        tensor("norm.weighted", wide, ctx.p.weight_bytes), tensor("norm.z_fp32", wide, FP32),
        tensor("norm.silu_z", wide, FP32)),
        kernel="gated_rms", weight=find(block, "linear_attn.norm"))
    o_in = tensor(f"{prefix}.out_proj.input", (*rows, Axis(vd, "tp")), c)
    return linear(prog, ctx, f"{prefix}.out_proj", o_in, Axis(ctx.d), weight=find(block, "out_proj"))


def mamba2(prog: Program, ctx: Ctx, block: Block, x: Tensor, *, prefix: str = "mixer") -> Tensor:
    """Nemotron-H's Mamba-2 mixer (``causal_conv1d_fn`` + the torch SSD chunk scan) reading ``x``; returns
    out_proj's output.

    Symbols: h_m heads, P head dim, I = h_m·P, g groups, N state size, K conv kernel, Q chunk size (``Ctx.mamba_chunk``,
    else the config's), L = s padded to a multiple of Q, n_c = L/Q chunks, W = 2I + 2gN + h_m the in_proj width. The
    in_proj output (gate, x/B/C and dt are views of it) is kept whole by the conv in fp32 and in a bf16 model; under
    autocast ``x/B/C.to(fp32 weight)`` then conv1d's cast back keep the cast and the weight's cast. dt + dt_bias →
    softplus → clamp keep c·T·h_m twice and dt.float() once per use unless fp32; A = -exp(A_log) keeps 4·h_m twice. The
    scan runs in fp32: the SSM input x in fp32 (in fp32 a view of the whole SiLU output), its padded copy for D, x·dt
    padded; B and C (einsum operand copies, B·decay); exp(segsum), G, M = G·L; two exp(cumsum); the chunk states and
    their decayed mix and the (n_c + 1)² decay; C·states and the padded scan output; four bool masks. Under autocast
    every einsum runs in c on casts of its fp32 operands. Gated RMSNorm (``norm_before_gate= False``): silu of the fp32
    gate, the product, rsqrt per group, the fp32 normalised y; out_proj's input."""
    dims = block.dims
    if not isinstance(dims, MambaDims):
        raise TypeError(f"a mamba block carries MambaDims, got {type(dims).__name__}")
    c, b, ac = ctx.p.compute_bytes, ctx.b, ctx.p.autocast
    hm, P, g, N, K = dims.heads, dims.head_dim, dims.groups, dims.state_size, dims.conv_kernel
    Q = ctx.mamba_chunk or dims.chunk_size
    I = hm * P  # noqa: E741  (Dao & Gu's and the docstring's name for the SSM width)
    cd = I + 2 * g * N
    nc = -(-ctx.s // Q)
    L = nc * Q
    rows = ctx.rows(sp=False)
    H = Axis(hm, "tp")
    xg = gather_seq(prog, x, f"{prefix}.input")
    zxbcdt = linear(prog, ctx, f"{prefix}.in_proj", xg, Axis(I + cd + hm, "tp"), weight=find(block, "in_proj"))
    gate = zxbcdt.view(f"{prefix}.gate", *rows, Axis(I, "tp"), note="a view of in_proj's output")
    xbc = zxbcdt.view(f"{prefix}.xBC", *rows, Axis(cd, "tp"), note="a view of in_proj's output")
    conv_in = tensor(f"{prefix}.conv1d.input_cast", xbc.axes, c, "cast back from the fp32-weight copy") if ac else xbc
    silu = _conv(prog, ctx, block, prefix, conv_in, cd, K, [conv_in])
    gate32 = cast(prog, gate, FP32, f"{prefix}.norm.gate_fp32", "gate.to(fp32), saved by silu")
    per_head = (*rows, H)
    prog.emit("act", f"{prefix}.dt", saved=(
        tensor("dt.softplus_input", per_head, c), tensor("dt.clamp_input", per_head, c),
        tensor("dt.fp32", per_head, FP32, "dt.float(), once per use unless fp32", count=1 if c == FP32 else 2),
        tensor("A.exp", (H,), FP32), tensor("A.neg", (H,), FP32)), kernel="softplus, clamp, exp")
    xs = silu.view(f"{prefix}.x", *per_head, Axis(P), note="a view of the SiLU output")
    x32 = cast(prog, xs, FP32, "scan.x_fp32", "x.float() (in fp32 the whole SiLU output: x is a view of it)")
    bL = (Axis(b), Axis(L, "seq"))
    bLI, bLN, bhLQ = (*bL, H, Axis(P)), (*bL, H, Axis(N)), (Axis(b), H, Axis(L, "seq"), Axis(Q))
    kept = nc + 1 if nc == 1 else nc  # states[:, :-1] as the last einsum keeps it (measured)
    states, decay = (Axis(b), H, Axis(P), Axis(N)), (Axis(b), H, Axis(nc + 1), Axis(nc + 1))
    saved = [x32, tensor("scan.x_padded_for_D", bLI, FP32),
             tensor("scan.exp_cumsum", (Axis(b), H, Axis(L, "seq")), FP32, count=2),
             tensor("scan.output_padded", bLI, FP32),
             tensor("scan.masks_chunk", (Axis(Q), Axis(Q)), 1, "bool", count=2),
             tensor("scan.masks_states", (Axis(nc + 1), Axis(nc + 1)), 1, "bool", count=2)]
    if not ac:
        saved += [tensor("scan.x_dt", bLI, FP32, "x·dt, plus an einsum copy with more than one chunk",
                     count=1 if nc == 1 else 2),
                  tensor("scan.B_C", bLN, FP32, "einsum operand copies of B and C, B, B·decay", count=5),
                  tensor("scan.chunk_matrices", bhLQ, FP32, "exp(segsum), G, M", count=3),
                  tensor("scan.states", states, FP32, "the n_c + 1 states and the einsum copy of all but the last "
                                                  "(a view when n_c = 1)", count=nc + 1 + kept),
                  tensor("scan.decay_chunk", decay, FP32), tensor("scan.C_times_states", bLI, FP32)]
    else:
        saved += [tensor("scan.x_dt_casts", bLI, c, "one per einsum", count=2),
                  tensor("scan.B", bLN, FP32, "saved by B·decay"),
                  tensor("scan.B_C_casts", bLN, c, "C twice, B, B·decay", count=4),
                  tensor("scan.exp_segsum", bhLQ, FP32), tensor("scan.G", bhLQ, c), tensor("scan.M_cast", bhLQ, c),
                  tensor("scan.states_casts", states, c, "all states, then all but the last (whole when n_c = 1)",
                     count=nc + 1 + kept),
                  tensor("scan.decay_chunk", decay, FP32), tensor("scan.decay_chunk_cast", decay, c),
                  tensor("scan.C_times_states", bLI, c)]
    y = tensor(f"{prefix}.scan_out", (*per_head, Axis(P)), FP32)
    # the chunks read x·dt and B padded to L, B repeated from groups to heads
    x_pad, b_heads = tensor("scan.x_padded", bLI, FP32), tensor("scan.B_heads", bLN, FP32)
    prog.emit("scan", f"{prefix}.ssd_chunk_scan", inputs=(x_pad, b_heads), outputs=(y,), saved=saved,
              kernel="mamba2_chunk_scan", chunk=Q, cache=(recurrent_state(ctx, hm, P, N),))
    wide = (*rows, Axis(I, "tp"))
    prog.emit("norm", f"{prefix}.norm", inputs=(y, gate32), saved=(
        gate32, tensor("norm.silu_gate_out", wide, FP32), tensor("norm.gated", wide, FP32),
        tensor("norm.rsqrt", (*rows, Axis(g, "tp")), FP32), tensor("norm.normalized_fp32", wide, FP32)),
        kernel="gated_rms_groups", weight=find(block, "mixer.norm"))
    o_in = tensor(f"{prefix}.out_proj.input", wide, c)
    return linear(prog, ctx, f"{prefix}.out_proj", o_in, Axis(ctx.d), weight=find(block, "out_proj"))
