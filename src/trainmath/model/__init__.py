"""Model structure: ``config.json`` → ``ModelSpec`` (single device, no parallelism)."""

from __future__ import annotations

import math

from trainmath.errors import TrainmathError
from trainmath.model.config import ConfigReport, ConfigView, HugeNumber, show, suspect_keys
from trainmath.model.spec import ModelSpec

# model_types that are another type's config under a different name: (reads as, note for the user)
ALIASES = {
    "kimi_k2": ("deepseek_v3", "kimi_k2 is DeepSeek-V3's architecture (DeepseekV3ForCausalLM)"),
    "llama4_text": ("llama4_text", ""),
}


def supported_model_types() -> list[str]:
    from trainmath.model.families import BUILDERS

    return sorted(set(BUILDERS) | set(ALIASES) | {"llama4"})


def spec_from_config(data: dict[str, object], *, name: str, source: str, strict: bool = False) -> ModelSpec:
    """Build the ``ModelSpec`` of a Hugging Face config dict; one ``TrainmathError`` lists every problem.

    ``spec.config_report`` says which keys came from transformers' defaults and which look misspelt; with
    ``strict`` either is an error."""
    from trainmath.model.families import BUILDERS

    model_type = data.get("model_type")
    notes: list[str] = []
    if model_type == "llama4":  # the multimodal wrapper: count its text model
        text = data.get("text_config")
        if not isinstance(text, dict):
            raise TrainmathError(f"{source}: model_type llama4 needs a text_config object")
        data = {**text, "architectures": data.get("architectures"), "model_type": "llama4_text",
                "tie_word_embeddings": text.get("tie_word_embeddings", data.get("tie_word_embeddings", False))}
        model_type = "llama4_text"
        notes.append("llama4: the text model (Llama4ForCausalLM) is counted; the vision tower and projector are not")
    if not isinstance(model_type, str):
        raise TrainmathError(f"{source} has no model_type; supported: {', '.join(supported_model_types())}")
    read_as = model_type
    if model_type in ALIASES:
        read_as, note = ALIASES[model_type]
        if note:
            notes.append(note)
    if read_as not in BUILDERS:
        raise TrainmathError(
            f"{source}: model_type {model_type!r} is not supported; supported: {', '.join(supported_model_types())}")
    cfg = ConfigView(data, model_type=read_as, source=source)
    spec = BUILDERS[read_as](cfg, name)
    options = config_options(cfg)
    cfg.check()
    report = ConfigReport(model_type=read_as, defaulted=dict(cfg.defaulted), suspects=suspect_keys(data, read_as))
    if strict and report.strict_problems():
        raise TrainmathError(f"{source} ({model_type}, --strict): " + "; ".join(report.strict_problems()))
    from dataclasses import replace

    return replace(spec, model_type=model_type, notes=tuple(notes) + spec.notes, options=options,
                   config_report=report)


DROPOUT_OPTIONS = ("attention_dropout", "residual_dropout", "embedding_dropout", "attn_pdrop", "resid_pdrop",
                   "embd_pdrop", "hidden_dropout")
"""Training dropout probabilities (transformers' names; GPT-2's ``*_pdrop``; Falcon's ``hidden_dropout``)."""

OPTION_KEYS = ("final_logit_softcapping", "attn_logit_softcapping", "logit_scale", "norm_topk_prob", "topk_method",
               "new_decoder_architecture", "use_qk_norm", "attn_temperature_tuning", *DROPOUT_OPTIONS)


_NUMBER_OPTIONS = ("final_logit_softcapping", "attn_logit_softcapping", "logit_scale")
_BOOL_OPTIONS = ("norm_topk_prob", "new_decoder_architecture", "use_qk_norm", "attn_temperature_tuning")


def config_options(cfg: ConfigView) -> dict[str, object]:
    """The switches ``ModelSpec.options`` carries: set in the config, or by transformers' class default; a value
    of the wrong kind is recorded as a problem of ``cfg``."""
    out = {key: value for key in OPTION_KEYS if (value := cfg.get(key, None)) is not None}
    for key in _NUMBER_OPTIONS:
        if key in out and not _positive_number(out[key]):
            cfg.invalid.append(f"{key} must be a positive finite number or null, got {show(out.pop(key))}")
    for key in _BOOL_OPTIONS:
        if key in out and not isinstance(out[key], bool):
            cfg.invalid.append(f"{key} must be true or false, got {show(out.pop(key))}")
    for key in DROPOUT_OPTIONS:
        v = out.get(key)
        if key in out and (isinstance(v, bool) or not isinstance(v, int | float) or not 0 <= v < 1):
            cfg.invalid.append(f"{key} must be a probability in [0, 1), got {show(out.pop(key))}")
    if "topk_method" in out and not isinstance(out["topk_method"], str):
        cfg.invalid.append(f"topk_method must be a string, got {show(out.pop('topk_method'))}")
    rope = cfg.data.get("rope_parameters") or cfg.data.get("rope_scaling") or {}
    factor = cfg.data.get("partial_rotary_factor",
                          rope.get("partial_rotary_factor") if isinstance(rope, dict) else None)
    if factor is not None:
        if _positive_number(factor) and factor <= 1:
            out["partial_rotary_factor"] = factor
        else:
            cfg.invalid.append(f"partial_rotary_factor must be a number in (0, 1], got {show(factor)}")
    if "quantization_config" in cfg.data:  # the format the checkpoint ships in (read by trainmath.infer)
        out["quantization_config"] = cfg.data["quantization_config"]
    return out


def _positive_number(value: object) -> bool:
    return (isinstance(value, int | float) and not isinstance(value, bool) and not isinstance(value, HugeNumber)
            and math.isfinite(value) and value > 0)
