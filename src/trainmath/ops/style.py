"""The columns of a family's table row: the computation quirks an emitter reads (``Style``).

A family's definition (``trainmath.families``) carries one ``Style``; the emitters and the head's op list read its
columns, never a family's name.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, kw_only=True)
class Style:
    """A family's computation quirks: the columns of the table ``STYLES``."""

    norm: str = "rms"
    """The norm kind of the layer and final norms (``kernels.norms.NORMS``)."""
    qk_norm: str | None = "head"
    """q/k norms when the spec has them: ``head`` (per head, Qwen3) or ``full`` (over the whole projection,
    OLMo-2)."""
    qk_norm_kind: str | None = None
    """The q/k norms' kind when it differs from ``norm``."""
    act: str = "silu"
    rotary: str = "rotate_half"
    """``kernels.attention.ROTARY``; ``rotate_half_cat`` for partial-rotary code ending in ``torch.cat``."""
    positions: str = "rope"
    """``rope`` (cos/sin shared by all layers), ``freqs_cis`` (complex64, DeepSeek-V2, Llama 4), ``learned``
    (GPT-2: a position embedding saves its (1, s) ids), ``none`` (Nemotron-H)."""
    rope_fp32: bool = False
    """cos/sin kept in fp32 whatever the dtype (OLMo-2)."""
    rope_half: bool = False
    """cos/sin of the h_d/2 frequencies, not concatenated to h_d (gpt-oss)."""
    rope_sets_by_window: bool = False
    """One cos/sin pair per layer kind (Gemma-3: local and global RoPE bases)."""
    rope_layers: str = "all"
    """Which attention layers rotate: ``all``, or ``windowed`` (Llama 4: only the chunked layers; a rank holding
    none of them keeps no rotary table)."""
    embed_scale: bool = False
    """The embedding output is scaled by a 0-dim sqrt(d) tensor, which the product keeps (Gemma)."""
    attention: str = "sdpa"
    """The kernel transformers picks by default (Gemma-2 and gpt-oss: eager)."""
    router: str = "softmax_topk"
    """The MoE router (``kernels.router.ROUTERS``): ``softmax_topk`` (Qwen, Mixtral), ``sigmoid_noaux``
    (DeepSeek-V3's ``noaux_tc``), ``softmax_greedy`` (DeepSeek-V2), ``topk_softmax`` (gpt-oss),
    ``sigmoid_scatter`` (Llama 4)."""
    router_fp32: bool = False
    """The router Linear is ``F.linear(x.float(), w.float())`` (DeepSeek, GLM-4.5, Nemotron-H)."""
    fp32_routing: bool = False
    """The routing weights are the renormalised fp32 top-k values, always renormalised (Mixtral)."""
    experts_grouped: bool = True
    """transformers' ``grouped_mm`` expert path is modelled (else only the eager loop is)."""
    dropout: bool = False
    """The emitters apply the config's dropouts (``context.Family``); a family without it refuses a nonzero one."""
    layer_mask: str = "eager"
    """The attention mask each decoder layer receives as an argument (a checkpoint holds it for the recompute).
    Under eager attention, every family: a (b, 1, s, s) mask in the parameters' dtype per attention kind (sliding,
    full). Under SDPA: ``eager`` none (the causal path) until a sliding window is at most s, then a bool (1, 1, s, s)
    sliding-window mask, ``bool`` a bool (1, 1, s, s) mask expanded to b (Falcon),
    ``bool_chunked`` a bool (b, 1, s, s) mask when a chunked layer's chunk is at most s (Llama 4)."""
    fused_projections: tuple[str, ...] = ()
    """Modules that fuse several projections in one weight (q/k/v, gate/up). ``parallelize_module``'s
    ``ColwiseParallel`` on such a weight gives each rank a contiguous slice of it, not its own heads of q, k and v
    (or columns of gate and up), so the module's split of the output is wrong: the hf profile refuses ``--tp``
    for these families (``memory.activations``)."""
    expert_slices: bool = True
    """The eager loop reads each expert's slice ``W[e]`` of the stacked weights, so each expert's weight gradient
    is a full-size ``select_backward`` (``memory.timeline.eager_experts_backward_transient``); False: Llama 4's
    batched experts over all tokens."""
    config_defaults: tuple[tuple[str, object], ...] = ()
    """transformers 5.24's config-class defaults of the switches that change what is saved but no parameter
    (``context.Family``, ``context.Router``), used where a config omits them."""


DEFAULT_STYLE = Style()
"""The row of a family whose layers are not modelled: all the head and loss read (a final RMSNorm, an LM head,
the cross-entropy)."""
