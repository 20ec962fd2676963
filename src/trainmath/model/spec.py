"""The single-device structure of a model: which tensors exist, their shapes, and the dimensions of each block.

A ``ModelSpec`` is built from a Hugging Face ``config.json`` by one family module (``trainmath.families``)
and is the one source every later figure derives from: parameter counts (``trainmath.params``), FLOPs,
activation and KV-cache bytes, and the placement of tensors on ranks. Nothing here knows about parallelism:
a tensor carries a *sharding hint* (how tensor parallelism would split it), but no count depends on a degree.

Tensor names follow the published checkpoints (``model.layers.{i}.mlp.experts.{e}.gate_proj.weight``) so that a
``model.safetensors.index.json`` can be compared with the ledger name by name.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from trainmath.arith import numel

# The components a parameter can belong to. Every tensor names exactly one.
COMPONENTS = (
    "embed_tokens",
    "pos_embed",
    "lm_head",
    "attention",
    "linear_attention",
    "mamba",
    "mlp_dense",
    "experts",
    "router",
    "shared_experts",
    "norms",
)
EMBEDDING_COMPONENTS = ("embed_tokens", "pos_embed", "lm_head")

# How tensor parallelism would split a tensor (Megatron's terms); used by placement, never by counting.
SHARDS = ("column", "row", "vocab", "replicated", "head")


@dataclass(frozen=True, kw_only=True)
class TensorSpec:
    """One parameter tensor, or one per routed expert.

    ``kind`` says how the tensor is used by the forward pass, which is what FLOPs need:
    ``linear`` (weight of shape (out, in), applied as x @ W.T: 2·in·out FLOPs per token),
    ``embedding`` (a row lookup), ``bias``, ``norm`` (a scale or shift), ``conv`` (depthwise convolution),
    ``param`` (any other learned vector: sinks, A_log, dt_bias, D).
    """

    name: str
    """Checkpoint name relative to its layer (``self_attn.q_proj.weight``); ``{e}`` stands for the expert index.
    A routed-expert tensor without ``{e}`` is stored fused, as one (experts, *shape) tensor (Llama 4, gpt-oss)."""
    shape: tuple[int, ...]
    """Shape as stored in the checkpoint (Linear weights are (out_features, in_features))."""
    component: str
    """One of ``COMPONENTS``."""
    kind: str = "linear"
    """``linear``, ``embedding``, ``bias``, ``norm``, ``conv`` or ``param``."""
    shard: str = "replicated"
    """One of ``SHARDS``: how tensor parallelism splits this tensor."""
    experts: int = 0
    """0 for an ordinary tensor; n > 0 for a routed expert's tensor, of which there are n copies."""
    tied: bool = False
    """True when the tensor is the same storage as another (lm_head tied to embed_tokens): counted once, there."""
    transposed: bool = False
    """True for GPT-2's Conv1D, whose weight is stored (in_features, out_features)."""

    @property
    def numel(self) -> int:
        """Elements in one copy."""
        return numel(self.shape)

    @property
    def copies(self) -> int:
        """How many copies exist: n for a routed expert's tensor, else 1."""
        return self.experts or 1


@dataclass(frozen=True, kw_only=True)
class AttentionDims:
    """Multi-head attention with grouped K/V heads (MHA when kv_heads == heads, MQA when 1)."""

    heads: int
    kv_heads: int
    head_dim: int
    """Dimension of one query/key head (``head_dim`` in the config; not always hidden_size / heads)."""
    v_head_dim: int
    """Dimension of one value head (equals head_dim except in MLA)."""
    sliding_window: int | None = None
    """Tokens a query attends back to on this layer, or None for full attention."""
    sinks: bool = False
    """Learned per-head attention sinks (gpt-oss)."""


@dataclass(frozen=True, kw_only=True)
class MLADims:
    """Multi-head latent attention (DeepSeek-V2 §2.1): K/V are compressed to a kv_lora_rank latent plus a shared
    rotary key; queries optionally through a q_lora_rank bottleneck."""

    heads: int
    q_lora_rank: int | None
    kv_lora_rank: int
    qk_nope_head_dim: int
    qk_rope_head_dim: int
    v_head_dim: int

    @property
    def qk_head_dim(self) -> int:
        return self.qk_nope_head_dim + self.qk_rope_head_dim


@dataclass(frozen=True, kw_only=True)
class LinearAttentionDims:
    """Gated DeltaNet (Yang et al. 2024), as in Qwen3-Next: a recurrent state of k_dim × v_dim per head."""

    key_heads: int
    value_heads: int
    key_head_dim: int
    value_head_dim: int
    conv_kernel: int


@dataclass(frozen=True, kw_only=True)
class MambaDims:
    """Mamba-2 mixer (Dao & Gu 2024), as in Nemotron-H: SSM state of heads × head_dim × state_size."""

    heads: int
    head_dim: int
    state_size: int
    groups: int
    conv_kernel: int
    intermediate: int
    """heads × head_dim: the width of the SSM input x."""
    chunk_size: int = 128
    """Length of the chunks the SSD scan runs over (the config's ``chunk_size``; FLOPs depend on it)."""


@dataclass(frozen=True, kw_only=True)
class MLPDims:
    """A feed-forward network: gated (SwiGLU/GeGLU, three matrices) or plain (two matrices)."""

    hidden: int
    intermediate: int
    gated: bool


@dataclass(frozen=True, kw_only=True)
class MoEDims:
    """A mixture-of-experts feed-forward: ``experts`` routed experts of which ``top_k`` run per token, plus
    ``shared_experts`` always-on experts of ``shared_intermediate`` width each (total)."""

    experts: int
    top_k: int
    expert_intermediate: int
    shared_intermediate: int
    """Total width of the always-on shared expert(s); 0 when there is none."""
    gated: bool = True
    activation_clamp: bool = False
    """The routed experts clamp the gate and up projections before the activation (gpt-oss's ``swiglu_limit``):
    memory-bound copies, priced in ``trainmath.perf.moe.CLAMP_HALF_COPIES``."""


MixerDims = AttentionDims | MLADims | LinearAttentionDims | MambaDims
FFNDims = MLPDims | MoEDims


@dataclass(frozen=True, kw_only=True)
class Block:
    """A module of a layer (its attention, its MLP, a norm), with its tensors and dimensions."""

    kind: str
    """``attention``, ``mla``, ``linear_attention``, ``mamba``, ``mlp``, ``moe`` or ``norm``."""
    tensors: tuple[TensorSpec, ...]
    dims: MixerDims | FFNDims | None = None


@dataclass(frozen=True, kw_only=True)
class LayerSpec:
    """One decoder layer. Equal layers are the same object, so counting is per distinct layer type."""

    label: str
    """Human name of the layer type: ``full_attention + moe``, ``sliding_attention + mlp``, ``mamba``."""
    blocks: tuple[Block, ...]

    @property
    def tensors(self) -> tuple[TensorSpec, ...]:
        return tuple(t for b in self.blocks for t in b.tensors)


@dataclass(frozen=True, kw_only=True)
class ExtraTensors:
    """Tensors a checkpoint carries that the transformers model does not build (DeepSeek-V3's multi-token
    prediction layer, MoE router correction-bias buffers). Reported beside the total, never added to it."""

    label: str
    why: str
    tensors: tuple[TensorSpec, ...]
    layer_indices: tuple[int, ...] = ()
    """Layers the tensors repeat in (names use ``{i}``); empty for model-level tensors."""

    @property
    def params(self) -> int:
        per = sum(t.numel * t.copies for t in self.tensors)
        return per * max(1, len(self.layer_indices))


@dataclass(frozen=True, kw_only=True)
class ModelSpec:
    """A decoder-only language model as built on one device."""

    name: str
    model_type: str
    architecture: str
    vocab_size: int
    hidden_size: int
    max_position_embeddings: int
    layer_prefix: str
    """Name prefix of layer i, with ``{i}``: ``model.layers.{i}.``, ``transformer.h.{i}.``."""
    pre: tuple[TensorSpec, ...]
    """Tensors before the layers (full names): token and position embeddings."""
    layers: tuple[LayerSpec, ...]
    post: tuple[TensorSpec, ...]
    """Tensors after the layers (full names): final norm, lm_head."""
    tie_word_embeddings: bool
    extras: tuple[ExtraTensors, ...] = ()
    notes: tuple[str, ...] = ()
    """Facts about how the config was read that a user should see (e.g. 'vision tower not counted')."""
    symbols: dict = field(default_factory=dict, compare=False, hash=False)
    """The symbols of Jiang Yi's blog series (N, |V|, d, d_ff, h_d, h, h_kv, n, k) with their values, for
    ``--explain``."""
    options: dict = field(default_factory=dict, compare=False, hash=False)
    """Config switches that change computation and saved tensors but no parameter: ``partial_rotary_factor``,
    ``final_logit_softcapping``, ``attn_logit_softcapping``, ``logit_scale``, ``norm_topk_prob``,
    ``topk_method``, ``new_decoder_architecture`` (present only when the config or transformers' class default
    sets them)."""
    config_report: object = field(default=None, compare=False, hash=False)
    """How the config was read (``trainmath.model.config.ConfigReport``): keys taken from transformers' defaults
    and keys that look misspelt; None for a spec not built from a config."""
    family: object = field(default=None, compare=False, hash=False, repr=False)
    """The family's definition (``trainmath.families.FamilyDef``), attached by ``spec_from_config``: what generic
    code asks instead of comparing ``model_type``."""

    @property
    def num_layers(self) -> int:
        return len(self.layers)

    def layer_groups(self) -> list[tuple[LayerSpec, list[int]]]:
        """Distinct layer types in order of first appearance, with the indices of the layers of each type."""
        groups: dict[LayerSpec, list[int]] = {}
        for i, layer in enumerate(self.layers):
            groups.setdefault(layer, []).append(i)
        return list(groups.items())


def named_tensors(spec: ModelSpec, *, include_tied: bool = False, include_extras: bool = False):
    """Every tensor of the model with its full checkpoint name and shape, experts and layers expanded:
    yields ``(name, shape, TensorSpec)``. Tied tensors (a tied lm_head) are skipped unless asked for; tensors
    the transformers model does not build (``spec.extras``) are added only with ``include_extras``."""
    for t in spec.pre:
        if include_tied or not t.tied:
            yield t.name, t.shape, t
    for i, layer in enumerate(spec.layers):
        prefix = spec.layer_prefix.format(i=i)
        for t in layer.tensors:
            if t.experts and "{e}" not in t.name:  # experts stored fused as one (n, ...) tensor
                yield prefix + t.name, (t.experts, *t.shape), t
            elif t.experts:
                for e in range(t.experts):
                    yield prefix + t.name.format(e=e), t.shape, t
            else:
                yield prefix + t.name, t.shape, t
    for t in spec.post:
        if include_tied or not t.tied:
            yield t.name, t.shape, t
    if include_extras:
        for extra in spec.extras:
            for i in extra.layer_indices or (None,):
                for t in extra.tensors:
                    base = t.name if i is None else spec.layer_prefix.format(i=i) + t.name
                    for e in range(t.experts or 1):
                        yield (base.format(e=e) if t.experts else base), t.shape, t
