"""The only place that names a model family: each family's table row (``Style``) and, where its layer is not
the standard one, its own layer emitter.

A standard decoder layer (``dense.prenorm_layer``) is the table row plus the spec's blocks: input norm → attention
(q/k/v column, optional q/k norms, rotary, kernel) → o (row) → post-attention norm → MLP or MoE. A Qwen3 layer is
``Style(norm="rms", act="silu", rotary="rotate_half")`` with per-head q/k norms read from the spec's tensors.
Families whose module differs (post-norms, sandwich norms, parallel blocks, fused Conv1D, MLA, linear attention,
Mamba) register their own emitter in ``LAYERS`` from their module in this package.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from trainmath.errors import TrainmathError


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
    full). Under SDPA: ``eager`` none (the causal path), ``bool`` a bool (1, 1, s, s) mask expanded to b (Falcon),
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


STYLES: dict[str, Style] = {
    "llama": Style(),
    "mistral": Style(),
    "qwen2": Style(),
    "qwen3": Style(),
    "qwen3_moe": Style(),
    "qwen2_moe": Style(config_defaults=(("norm_topk_prob", False),)),
    "mixtral": Style(fp32_routing=True),
    "phi3": Style(rotary="rotate_half_cat"),
    "olmo2": Style(norm="rms_fp32_weight", qk_norm="full", rope_fp32=True),
    "gemma2": Style(norm="gemma", act="gelu_tanh", embed_scale=True, attention="eager",
                    config_defaults=(("final_logit_softcapping", 30.0), ("attn_logit_softcapping", 50.0))),
    "gemma3_text": Style(norm="gemma", act="gelu_tanh", embed_scale=True, rope_sets_by_window=True),
    "cohere": Style(norm="cohere", rotary="interleaved_fp32", config_defaults=(("logit_scale", 0.0625),)),
    "starcoder2": Style(norm="layer", act="gelu_tanh", dropout=True),
    "gpt2": Style(norm="layer", act="gelu_new", rotary="none", positions="learned", dropout=True,
                  config_defaults=(("attention_dropout", 0.1), ("residual_dropout", 0.1), ("embedding_dropout", 0.1)),
                  fused_projections=("c_attn",)),
    "falcon": Style(norm="layer", act="gelu", layer_mask="bool", fused_projections=("query_key_value",)),
    "deepseek_v2": Style(positions="freqs_cis", router="softmax_greedy", router_fp32=True,
                         config_defaults=(("norm_topk_prob", False), ("topk_method", "greedy"))),
    "deepseek_v3": Style(router="sigmoid_noaux", router_fp32=True),
    "glm4_moe": Style(rotary="rotate_half_cat", router="sigmoid_noaux", router_fp32=True,
                      config_defaults=(("partial_rotary_factor", 0.5),)),
    "gpt_oss": Style(norm="rms_fp32_weight", rope_half=True, attention="eager", router="topk_softmax"),
    "llama4_text": Style(positions="freqs_cis", rope_layers="windowed", router="sigmoid_scatter", qk_norm_kind="l2",
                         experts_grouped=False, layer_mask="bool_chunked", expert_slices=False),
    "qwen3_next": Style(norm="gemma", rotary="rotate_half_cat", config_defaults=(("partial_rotary_factor", 0.25),)),
    "nemotron_h": Style(norm="nemotron", act="relu2", rotary="none", positions="none", router="sigmoid_noaux",
                        router_fp32=True, experts_grouped=False),
}
"""Every family the hf activation profile models, with its columns (transformers 5.24's modeling code)."""

TP_MEASURED = ("llama", "mistral", "qwen2", "qwen3", "qwen3_moe", "gemma3_text", "olmo2", "starcoder2", "cohere",
               "phi3")
"""Families whose per-rank fold under ``--tp``/``--sp``/``--vocab-parallel`` is measured equal, to the byte, to
what transformers' layers save on 2 gloo ranks under ``trainmath.runtime.tensor_parallel.apply_tp`` (its
``FAMILIES``; ``tests/memory/test_tp_oracle.py``). Cohere only without ``use_qk_norm`` (``tp_measured``)."""


def tp_measured(model_type: str, options: dict | None = None) -> bool:
    """Is this config's per-rank TP fold measured (``TP_MEASURED``)? Not Cohere with ``use_qk_norm`` (Command R+),
    whose (heads, head_dim) q/k norm weights ``apply_tp`` does not split."""
    if model_type == "cohere" and (options or {}).get("use_qk_norm"):
        return False
    return model_type in TP_MEASURED

GROUPED_UNMODELLED = tuple(name for name, row in STYLES.items() if not row.experts_grouped)
"""MoE families whose ``grouped_mm`` expert path is not modelled (only their eager loop is)."""

DEFAULT_STYLE = Style()

LAYERS: dict[str, Callable] = {}
"""model_type → layer emitter ``(prog, ctx, layer, style) -> None`` (filled in by the family modules below)."""


RUNS_AS: dict[str, str] = {"kimi_k2": "deepseek_v3"}
"""Families whose modeling code is another family's (Kimi K2's remote code is DeepSeek-V3's): the shape folds
(FLOPs, the inference cache) emit that family's op list; the saved-bytes profile, which has no row for them,
refuses them until a test checks them against their own code."""


def emitter(model_type: str) -> tuple[Callable, Style]:
    """(layer emitter, table row) the shape folds use for ``model_type``; one error line for a family without."""
    key = model_type if model_type in LAYERS else RUNS_AS.get(model_type)
    if key is None:
        raise TrainmathError(f"no op list for model_type {model_type!r}; modelled: "
                             f"{', '.join(sorted([*LAYERS, *RUNS_AS]))}")
    return LAYERS[key], style(key)


def style(model_type: str) -> Style:
    """The family's row; a family without one (its layers not modelled) gets the default row, which is all the
    head and loss read (a final RMSNorm, an LM head, the cross-entropy) for the megatron profile's logits."""
    return STYLES.get(model_type, DEFAULT_STYLE)


from trainmath.ops.families import (  # noqa: E402  (the family modules register their emitters in LAYERS)
    classic,  # noqa: F401
    dense,  # noqa: F401  (registers its emitters)
    gpt_oss,  # noqa: F401
    hybrid,  # noqa: F401
    llama4,  # noqa: F401
    moe,  # noqa: F401
    postnorm,  # noqa: F401
)
