"""Regenerate src/trainmath/model/defaults.json from transformers' config classes (run from the repository root)."""

import dataclasses
import inspect
import json
import warnings

TYPES = ["qwen3", "qwen3_moe", "qwen2", "qwen2_moe", "qwen3_next", "llama", "llama4_text", "mistral", "mixtral",
         "deepseek_v2", "deepseek_v3", "glm4_moe", "gpt_oss", "gemma2", "gemma3_text", "phi3", "olmo2", "cohere",
         "starcoder2", "falcon", "gpt2", "nemotron_h"]
SKIP = {"kwargs", "self", "rope_scaling", "rope_parameters", "bos_token_id", "eos_token_id", "pad_token_id"}
# The keys common to every PretrainedConfig beyond its fields: the legacy generation / serialisation keys
# transformers still accepts in a config.json.
LEGACY = {"torch_dtype", "output_attentions", "auto_map", "quantization_config", "rope_scaling", "rope_parameters",
          "bos_token_id", "eos_token_id", "pad_token_id", "sep_token_id", "decoder_start_token_id",
          "tie_word_embeddings", "use_cache", "text_config", "vision_config", "tokenizer_class", "prefix",
          "task_specific_params", "torchscript", "pruned_heads", "tie_encoder_decoder", "is_decoder",
          "add_cross_attention", "cross_attention_hidden_size", "finetuning_task", "use_bfloat16",
          "tf_legacy_loss", "max_length", "min_length", "do_sample", "early_stopping", "num_beams",
          "num_beam_groups", "diversity_penalty", "temperature", "top_k", "top_p", "typical_p",
          "repetition_penalty", "length_penalty", "no_repeat_ngram_size", "encoder_no_repeat_ngram_size",
          "bad_words_ids", "num_return_sequences", "output_scores", "return_dict_in_generate",
          "forced_bos_token_id", "forced_eos_token_id", "remove_invalid_values", "suppress_tokens",
          "begin_suppress_tokens", "exponential_decay_length_penalty", "_commit_hash", "_attn_implementation",
          "attn_implementation", "_name_or_path", "model_type", "_source"}


def _defaults(cls) -> dict:
    """The JSON-able, non-None defaults of a config class's __init__ (signature, else dataclass fields)."""
    params = {n: p.default for n, p in inspect.signature(cls.__init__).parameters.items()
              if p.default is not inspect.Parameter.empty}
    if (not params or set(params) <= {"kwargs"}) and dataclasses.is_dataclass(cls):
        for f in dataclasses.fields(cls):
            if f.default is not dataclasses.MISSING:
                params[f.name] = f.default
            elif f.default_factory is not dataclasses.MISSING:
                params[f.name] = f.default_factory()
    keep = {}
    for k, v in params.items():
        if k in SKIP or v is None or k.startswith("_"):
            continue
        try:
            json.dumps(v, allow_nan=False)
        except Exception:
            continue
        keep[k] = v
    return keep


def _fields(cls) -> set:
    """Every key a config class reads (None defaults included)."""
    names = {n for n in inspect.signature(cls.__init__).parameters if n not in ("self", "kwargs")}
    if dataclasses.is_dataclass(cls):
        names |= {f.name for f in dataclasses.fields(cls)}
    return names


def main() -> None:
    warnings.filterwarnings("ignore")
    import transformers
    from transformers import CONFIG_MAPPING, PretrainedConfig

    out = {"_source": f"transformers {transformers.__version__}: the non-None defaults of each config class's "
                      "__init__ (signature or dataclass fields); regenerate with tests/tools/gen_defaults.py"}
    for t in TYPES:
        out[t] = _defaults(CONFIG_MAPPING[t])
    # Together the known keys, against which a misspelt key is caught ("num_hiden_layers: did you mean
    # num_hidden_layers?").
    common = _fields(PretrainedConfig) | set(PretrainedConfig().to_dict()) | LEGACY
    out["_common_keys"] = sorted(common)
    out["_fields"] = {t: sorted(_fields(CONFIG_MAPPING[t]) - common) for t in TYPES}
    out["_attribute_map"] = {t: dict(CONFIG_MAPPING[t].attribute_map) for t in TYPES
                             if CONFIG_MAPPING[t].attribute_map}
    with open("src/trainmath/model/defaults.json", "w") as f:
        json.dump(out, f, indent=1)
    print({t: len(v) for t, v in out.items() if t != "_source"})


if __name__ == "__main__":
    main()
