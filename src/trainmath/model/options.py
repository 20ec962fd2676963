"""The switches a ``ModelSpec`` carries (``ModelSpec.options``): config keys that change computation and saved
tensors but no parameter, checked for their kind."""

from __future__ import annotations

import math

from trainmath.model.config import ConfigView, HugeNumber, show

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
