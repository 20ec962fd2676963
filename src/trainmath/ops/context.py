"""What an op list is emitted for: the run's dtypes, batch, kernels and the config switches the spec lacks.

``Ctx`` is everything a family's emitter reads besides the ``ModelSpec``: micro-batch and sequence, the
``Precision``, the attention kernel and expert path, the router and family switches, the scans' chunk lengths,
and the ``Degrees`` of the rank (read only by the folds, never by an emitter).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from trainmath.errors import TrainmathError
from trainmath.ops.ir import SINGLE, Axis, Degrees
from trainmath.vocabulary import Precision

INT64 = 8
FP32 = 4


@dataclass(frozen=True, kw_only=True, slots=True)
class Router:
    """MoE router switches that change what the router saves but that the ``ModelSpec`` does not carry (read from
    the config by ``Router.from_config``; the defaults are transformers' config-class defaults)."""

    norm_topk_prob: bool = True
    """Renormalise the top-k weights (Qwen3-MoE, DeepSeek-V3; Mixtral always does)."""
    topk_method: str = "noaux_tc"
    """DeepSeek routing: ``greedy`` / ``group_limited_greedy`` (V2, softmax) or ``noaux_tc`` (V3, sigmoid). The
    group sizes (``n_group``, ``topk_group``) change nothing that is kept (``kernels.router.sigmoid_noaux``)."""

    @classmethod
    def from_config(cls, config: dict, defaults: dict | None = None) -> Router:
        """The router switches of a Hugging Face config dict; missing keys: ``defaults`` (the family's
        transformers config-class defaults, ``FamilyDef.config_defaults``), then this class's."""
        base = defaults or {}
        return cls(norm_topk_prob=bool(config.get("norm_topk_prob", base.get("norm_topk_prob", True))),
                   topk_method=config.get("topk_method") or base.get("topk_method", "noaux_tc"))


@dataclass(frozen=True, kw_only=True, slots=True)
class Family:
    """Config switches that change what is saved but that the ``ModelSpec`` does not carry (read from a Hugging
    Face config by ``Family.from_config``; ``Family.default(defaults)`` gives a family's transformers config-class
    defaults, ``FamilyDef.config_defaults``)."""

    partial_rotary_factor: float = 1.0
    """Fraction of the head dim that RoPE rotates (Phi-4-mini 0.75, GLM-4.5 0.5): cos/sin are that wide."""
    final_logit_softcapping: float | None = None
    """Gemma-2's ``logits = cap·tanh(logits/cap)`` before the loss (None: no capping)."""
    attn_logit_softcapping: float | None = None
    """Gemma-2's attention-score capping (eager attention only; SDPA ignores it)."""
    logit_scale: float | None = None
    """Cohere's ``logits = lm_head(h) * logit_scale``."""
    new_decoder_architecture: bool | None = None
    """Falcon's flag (None: inferred from the spec, see ``families.classic.falcon_layer``)."""
    use_qk_norm: bool = True
    """Llama 4's weightless L2 q/k norm on RoPE layers (config default True; Maverick sets False)."""
    attn_temperature_tuning: bool = True
    """Llama 4's query scaling on no-RoPE layers (config default True)."""
    attention_dropout: float = 0.0
    """Dropout on the attention probabilities in training (``attention_dropout``; GPT-2's ``attn_pdrop``)."""
    residual_dropout: float = 0.0
    """Dropout on each sub-block's output before its residual add (``residual_dropout``; GPT-2's
    ``resid_pdrop``)."""
    embedding_dropout: float = 0.0
    """Dropout on the embedding output (``embedding_dropout``; GPT-2's ``embd_pdrop``)."""

    @classmethod
    def default(cls, defaults: dict | None = None) -> Family:
        """The switches under a family's config-class ``defaults`` (``FamilyDef.config_defaults``)."""
        return cls(**{k: v for k, v in (defaults or {}).items() if k in cls.__dataclass_fields__})

    @classmethod
    def from_config(cls, config: dict, defaults: dict | None = None) -> Family:
        """The switches of a Hugging Face config dict (missing keys: ``Family.default(defaults)``)."""
        base = cls.default(defaults)
        rope = config.get("rope_parameters") or config.get("rope_scaling") or {}
        prf = config.get("partial_rotary_factor", rope.get("partial_rotary_factor", base.partial_rotary_factor))
        return cls(partial_rotary_factor=float(prf),
                   final_logit_softcapping=config.get("final_logit_softcapping", base.final_logit_softcapping),
                   attn_logit_softcapping=config.get("attn_logit_softcapping", base.attn_logit_softcapping),
                   logit_scale=config.get("logit_scale", base.logit_scale),
                   new_decoder_architecture=config.get("new_decoder_architecture"),
                   use_qk_norm=bool(config.get("use_qk_norm", base.use_qk_norm)),
                   attn_temperature_tuning=bool(config.get("attn_temperature_tuning", base.attn_temperature_tuning)),
                   **{f: float(_first(config, keys, getattr(base, f))) for f, keys in DROPOUT_KEYS.items()})


DROPOUT_KEYS = {"attention_dropout": ("attention_dropout", "attn_pdrop"),
                "residual_dropout": ("residual_dropout", "resid_pdrop"),
                "embedding_dropout": ("embedding_dropout", "embd_pdrop")}
"""``Family`` dropout field → the config keys that set it (transformers' names; GPT-2's second)."""


def _first(config: dict, keys: tuple[str, ...], default):
    """The value of the first of ``keys`` the config sets (not None), else ``default``."""
    return next((config[k] for k in keys if config.get(k) is not None), default)


@dataclass(frozen=True, kw_only=True)
class Ctx:
    """One emission: the run an op list describes."""

    b: int
    """Micro-batch (sequences)."""
    s: int
    """Sequence length (tokens per sequence)."""
    d: int
    """Hidden size (the residual stream's width)."""
    p: Precision
    eager: bool = False
    """``attn_implementation="eager"`` (the s² softmax is saved) instead of SDPA."""
    experts: str = "eager"
    """``eager`` (transformers' loop over hit experts) or ``grouped`` (``grouped_mm``)."""
    experts_hit: int | None = None
    """Routed experts that received tokens (the autocast weight copies of the eager loop; None: all)."""
    router: Router = field(default_factory=Router)
    family: Family = field(default_factory=Family)
    degrees: Degrees = SINGLE
    """The rank's parallel degrees: read by the folds only."""
    device: str = "cuda"
    """Where the step runs, where it changes what is kept (dropout: CUDA's ``native_dropout`` keeps a bool mask,
    the CPU keeps its scaled noise in the input's dtype and SDPA with dropout takes the math fallback)."""
    gdn_chunk: int = 64
    """Gated DeltaNet's chunk length (``torch_chunk_gated_delta_rule``'s default 64)."""
    mamba_chunk: int | None = None
    """Mamba-2's SSD chunk length (None: the config's ``chunk_size``, carried by the block's dims)."""
    shapes_only: bool = False
    """For the folds that read only shapes (FLOPs, the inference cache): emit every op even where this config's
    saved bytes are not modelled (``unmodelled`` then raises nothing, and such ops save nothing)."""

    def unmodelled(self, why: str) -> None:
        """A config whose saved bytes the emitter does not model: one error line, unless ``shapes_only``."""
        if not self.shapes_only:
            raise TrainmathError(why)

    @property
    def T(self) -> int:
        return self.b * self.s

    def token_rows(self, per_token: int) -> Axis:
        """A flattened axis of ``per_token`` rows for each of the T = b·s tokens (the routed rows T·top_k, or
        Llama 4's n·T), inside a tensor-parallel region: its tokens are the sequence's, so it takes the sequence's
        rule (``seq``: ÷cp; exact because ``--seq`` is a multiple of ``--cp``)."""
        return Axis(self.T * per_token, "seq")

    def rows(self, *, sp: bool = True) -> tuple[Axis, Axis]:
        """The (batch, sequence) axes of a per-token tensor: ``sp`` outside a tensor-parallel region (the
        residual stream, norms), else inside one (what a column-parallel Linear reads and produces)."""
        return Axis(self.b), Axis(self.s, "seq_sp" if sp else "seq")
