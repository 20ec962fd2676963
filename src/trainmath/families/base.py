"""What a family is: one ``FamilyDef`` (config reading, ledger blocks, op emitter and its row, TP plan, what has
been measured, and each switch generic code asks instead of comparing ``model_type``)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from trainmath.errors import TrainmathError
from trainmath.ops.style import DEFAULT_STYLE, Style


@dataclass(frozen=True, kw_only=True)
class TPPlan:
    """How ``trainmath.runtime.tensor_parallel.apply_tp`` splits the family's decoder layers. A family with a plan
    is one whose per-rank fold under ``--tp``/``--sp``/``--vocab-parallel`` is measured equal, to the byte, to what
    transformers' layers save on 2 gloo ranks under that plan (``tests/memory/test_tp_oracle.py``)."""

    head_norm_dim: int | None = None
    """Per-head q/k norms: the heads dimension of the tensor they read (2: (b, s, h, h_d) before the transpose,
    Qwen3; 1: (b, h, s, h_d) after it, Gemma-3). They run on the rank's heads (``SequenceParallel``)."""
    feature_norms: bool = False
    """q/k norms over the whole projection (OLMo-2): ``tensor_parallel.feature_sharded_norm``."""
    refused_with: str | None = None
    """A config switch under which the plan does not apply (Cohere's ``use_qk_norm``)."""
    refused_why: str = ""
    """Why, as the refusal says it."""

    def refuses(self, switches) -> bool:
        """Does a config (a dict of switches, or a transformers config object) set ``refused_with``?"""
        if self.refused_with is None:
            return False
        value = switches.get(self.refused_with) if isinstance(switches, dict) else getattr(switches,
                                                                                            self.refused_with, False)
        return bool(value)


@dataclass(frozen=True, kw_only=True)
class FamilyDef:
    """One architecture family, registered once (``trainmath.families.register``); generic code reads these fields
    and never names a family."""

    model_type: str
    """The ``model_type`` of the Hugging Face config."""
    build: Callable | None = None
    """``(ConfigView, name) -> ModelSpec``: the config's keys → the ledger's blocks (None: a wrapper, ``unwrap``)."""
    config_as: str | None = None
    """Read through another family's key table and defaults (Kimi K2 is DeepSeek-V3's config)."""
    note: str = ""
    """What the user is told when ``config_as`` or ``unwrap`` applies."""
    unwrap: Callable | None = None
    """``(data, source) -> data``: the text model's config inside a multimodal wrapper (Llama 4)."""
    layer: Callable | None = None
    """The layer's op emitter ``(prog, ctx, layer, style) -> None``; None: the hf profile does not model it."""
    style: Style | None = None
    """The emitter's table row (None with ``layer``)."""
    runs_as: FamilyDef | None = None
    """The family whose modeling code this one runs (Kimi K2: DeepSeek-V3's): the shape folds (FLOPs, the inference
    cache) emit its op list; the saved-bytes profile refuses this one until a test checks it against its code."""
    tp: TPPlan | None = None
    """The measured TP plan (``TPPlan``); None: derived from the op lists' axes, not measured."""
    linear_router: bool = False
    """The MoE router is an ``nn.Linear`` (Llama 4's ``Llama4Router``), which peft can wrap; other routers hold a
    bare weight Parameter."""
    lora_moe_conversion: tuple | None = None
    """peft's v4 → v5 MoE target conversion: ({v4 leaf name: v5 parameter}, the fused pair)."""
    lora_mamba: bool = False
    """peft refuses LoRA on ``out_proj``/``conv1d`` of this family (its Mamba check)."""
    checkpoint_position_ids: bool = True
    """Under activation checkpointing the layer is called with the (1, s) int64 position ids, which
    ``torch.utils.checkpoint`` keeps as an argument (GPT-2 adds its learned positions before the layers)."""
    blog_formulas: tuple[str, ...] = ()
    """Formulas of Jiang Yi's blog series that ``explain`` checks this family against: ``closed_form`` (the dense
    parameter count, Qwen3), ``activated_router`` (the MoE activated count, Qwen3-MoE)."""

    @property
    def row(self) -> Style:
        """The table row the saved-bytes folds read (the default row without one: the head and loss only)."""
        return self.style or DEFAULT_STYLE

    @property
    def config_defaults(self) -> dict:
        """transformers' config-class defaults of the switches ``ops.context.Family``/``Router`` read
        (``Style.config_defaults``)."""
        return dict(self.row.config_defaults)

    @property
    def modelled(self) -> bool:
        """Does the hf activation profile model this family (a layer emitter and its row)?"""
        return self.layer is not None and self.style is not None

    @property
    def shape_family(self) -> FamilyDef:
        """The family whose op list the shape folds emit (``runs_as``, else this one)."""
        return self.runs_as or self

    def shape_emitter(self) -> tuple[Callable, Style]:
        """(layer emitter, row) for the shape folds; one error line for a family without an op list."""
        fam = self.shape_family
        if fam.layer is None:
            raise TrainmathError(f"no op list for model_type {self.model_type!r}")
        return fam.layer, fam.row

    def tp_measured(self, options: dict | None = None) -> bool:
        """Is this config's per-rank TP fold measured (``tp``, and the config not under ``tp.refused_with``)?"""
        return self.tp is not None and not self.tp.refuses(options or {})
