"""Every model family, one ``FamilyDef`` each, registered once; ``spec_from_config`` reads a config through its
family and attaches it to the spec (``ModelSpec.family``).

A family module (``families/<group>.py``) holds the family's config reading (its keys and the ledger's blocks), its
layer's op emitter with the emitter's table row (``Style``), its TP plan and what has been measured; generic code
asks ``spec.family`` and never compares ``model_type``. Adding a family: ``docs/adding-a-family.md``.
"""

from __future__ import annotations

from dataclasses import replace

from trainmath.errors import TrainmathError
from trainmath.families import classic, deepseek, dense, gpt_oss, hybrid, llama4, moe, postnorm
from trainmath.families.base import FamilyDef, TPPlan
from trainmath.model.config import ConfigReport, ConfigView, suspect_keys
from trainmath.model.options import config_options
from trainmath.model.spec import ModelSpec
from trainmath.ops.style import DEFAULT_STYLE, Style

__all__ = ["DEFAULT_STYLE", "REGISTRY", "FamilyDef", "Style", "TPPlan", "get", "register", "spec_from_config",
           "supported_model_types"]

REGISTRY: dict[str, FamilyDef] = {}
"""model_type → its definition, in the order the hf profile lists the families it models."""


def register(fam: FamilyDef) -> FamilyDef:
    """Add a family (a test may add one; ``REGISTRY.pop`` removes it); one error line for a second definition of
    a model_type."""
    if REGISTRY.get(fam.model_type, fam) is not fam:
        raise TrainmathError(f"model_type {fam.model_type!r} is defined twice")
    REGISTRY[fam.model_type] = fam
    return fam


for _fam in (dense.LLAMA, dense.MISTRAL, dense.QWEN2, dense.QWEN3, moe.QWEN3_MOE, moe.QWEN2_MOE, moe.MIXTRAL,
             dense.PHI3, postnorm.OLMO2, postnorm.GEMMA2, postnorm.GEMMA3_TEXT, postnorm.COHERE, classic.STARCODER2,
             classic.GPT2, classic.FALCON, deepseek.DEEPSEEK_V2, deepseek.DEEPSEEK_V3, deepseek.GLM4_MOE,
             gpt_oss.GPT_OSS, llama4.LLAMA4_TEXT, hybrid.QWEN3_NEXT, hybrid.NEMOTRON_H, deepseek.KIMI_K2,
             llama4.LLAMA4):
    register(_fam)


def get(model_type: str) -> FamilyDef | None:
    """The definition of ``model_type`` (None for a family trainmath does not define)."""
    return REGISTRY.get(model_type)


def supported_model_types() -> list[str]:
    """Every ``model_type`` a config may name."""
    return sorted(REGISTRY)


def spec_from_config(data: dict[str, object], *, name: str, source: str, strict: bool = False) -> ModelSpec:
    """Build the ``ModelSpec`` of a Hugging Face config dict; one ``TrainmathError`` lists every problem.

    ``spec.config_report`` says which keys came from transformers' defaults and which look misspelt; with
    ``strict`` either is an error. ``spec.family`` is the family's definition."""
    model_type = data.get("model_type")
    notes: list[str] = []
    wrapper = REGISTRY.get(model_type) if isinstance(model_type, str) else None
    if wrapper is not None and wrapper.unwrap is not None:  # a multimodal wrapper: count its text model
        data = wrapper.unwrap(data, source)
        model_type = data["model_type"]
        notes.append(wrapper.note)
    if not isinstance(model_type, str):
        raise TrainmathError(f"{source} has no model_type; supported: {', '.join(supported_model_types())}")
    fam = REGISTRY.get(model_type)
    if fam is None or fam.build is None:
        raise TrainmathError(
            f"{source}: model_type {model_type!r} is not supported; supported: {', '.join(supported_model_types())}")
    read_as = fam.config_as or model_type
    if fam.config_as and fam.note:
        notes.append(fam.note)
    cfg = ConfigView(data, model_type=read_as, source=source)
    spec = fam.build(cfg, name)
    options = config_options(cfg)
    cfg.check()
    report = ConfigReport(model_type=read_as, defaulted=dict(cfg.defaulted), suspects=suspect_keys(data, read_as))
    if strict and report.strict_problems():
        raise TrainmathError(f"{source} ({model_type}, --strict): " + "; ".join(report.strict_problems()))
    return replace(spec, model_type=model_type, notes=tuple(notes) + spec.notes, options=options,
                   config_report=report, family=fam)


def modelled() -> tuple[str, ...]:
    """The families the hf activation profile models (a layer emitter and its row), in registry order."""
    return tuple(m for m, f in REGISTRY.items() if f.modelled)


def tp_measured_families() -> tuple[str, ...]:
    """The families with a measured TP plan (``FamilyDef.tp``), in registry order."""
    return tuple(m for m, f in REGISTRY.items() if f.tp is not None)


def dropout_families() -> tuple[str, ...]:
    """The families whose emitters apply the config's dropouts (``Style.dropout``)."""
    return tuple(m for m, f in REGISTRY.items() if f.style is not None and f.style.dropout)


def emitter(model_type: str):
    """(layer emitter, row) the shape folds use for ``model_type``; one error line for a family without."""
    fam = REGISTRY.get(model_type)
    if fam is None or fam.shape_family.layer is None:
        known = sorted(m for m, f in REGISTRY.items() if f.shape_family.layer is not None)
        raise TrainmathError(f"no op list for model_type {model_type!r}; modelled: {', '.join(known)}")
    return fam.shape_emitter()
