"""Model structure: ``config.json`` → ``ModelSpec`` (single device, no parallelism)."""

from __future__ import annotations


from trainmath.errors import TrainmathError
from trainmath.model.config import ConfigView
from trainmath.model.spec import ModelSpec

# model_types that are another type's config under a different name: (reads as, note for the user)
ALIASES = {
    "kimi_k2": ("deepseek_v3", "kimi_k2 is DeepSeek-V3's architecture (DeepseekV3ForCausalLM)"),
    "llama4_text": ("llama4_text", ""),
}


def supported_model_types() -> list[str]:
    from trainmath.model.families import BUILDERS

    return sorted(set(BUILDERS) | set(ALIASES) | {"llama4"})


def spec_from_config(data: dict[str, object], *, name: str, source: str) -> ModelSpec:
    """Build the ``ModelSpec`` of a Hugging Face config dict; one ``TrainmathError`` lists every problem."""
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
    from dataclasses import replace

    return replace(spec, model_type=model_type, notes=tuple(notes) + spec.notes, options=config_options(cfg))


OPTION_KEYS = ("final_logit_softcapping", "attn_logit_softcapping", "logit_scale", "norm_topk_prob", "topk_method",
               "new_decoder_architecture", "use_qk_norm", "attn_temperature_tuning")


def config_options(cfg: ConfigView) -> dict[str, object]:
    """The switches ``ModelSpec.options`` carries: set in the config, or by transformers' class default."""
    out = {key: value for key in OPTION_KEYS if (value := cfg.get(key, None)) is not None}
    rope = cfg.data.get("rope_parameters") or cfg.data.get("rope_scaling") or {}
    factor = cfg.data.get("partial_rotary_factor", rope.get("partial_rotary_factor") if isinstance(rope, dict) else None)
    if factor is not None:
        out["partial_rotary_factor"] = factor
    if "quantization_config" in cfg.data:  # the format the checkpoint ships in (read by trainmath.infer)
        out["quantization_config"] = cfg.data["quantization_config"]
    return out
