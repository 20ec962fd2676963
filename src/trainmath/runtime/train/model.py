"""The model a run trains: a published config shrunk by the flags, built by transformers with random weights.

The same shrunk config dict goes to the calculator (``spec_from_config``) and to transformers
(``AutoConfig.for_model`` → ``AutoModelForCausalLM.from_config``), so the prediction and the measurement describe
the same model. Model code stays single-device: parallelism is applied by ``strategies``.
"""

from __future__ import annotations

import torch

from trainmath.errors import TrainmathError
from trainmath.families import spec_from_config
from trainmath.sources import resolve

# flag → the config keys it sets (the first one present in the config is used; the rest are other families' names)
_KEYS = {
    "layers": ("num_hidden_layers", "n_layer"),
    "hidden": ("hidden_size", "n_embd"),
    "intermediate": ("intermediate_size", "n_inner"),
    "heads": ("num_attention_heads", "n_head"),
    "kv_heads": ("num_key_value_heads",),
    "vocab": ("vocab_size",),
    "experts": ("num_experts", "num_local_experts", "n_routed_experts"),
}


def shrunk_config(model: str, overrides: dict) -> tuple[str, dict]:
    """(display name, config dict) of ``model`` with the flags' values; per-layer lists cut to the new depth."""
    src = resolve(model)
    cfg = {k: v for k, v in src.config.items() if not k.startswith("_")}
    old_layers = cfg.get("num_hidden_layers", cfg.get("n_layer"))
    if "experts" in overrides and not any(k in cfg for k in _KEYS["experts"]):
        raise TrainmathError(f"--experts: {src.name} is not a mixture-of-experts model (its config has none of "
                             f"{', '.join(_KEYS['experts'])})")
    for flag, value in overrides.items():
        keys = [k for k in _KEYS[flag] if k in cfg] or [_KEYS[flag][0]]
        cfg[keys[0]] = value
    if "heads" in overrides and "kv_heads" not in overrides and "num_key_value_heads" in cfg:
        cfg["num_key_value_heads"] = min(cfg["num_key_value_heads"], overrides["heads"])
    if ("hidden" in overrides or "heads" in overrides) and "head_dim" in cfg:
        cfg["head_dim"] = cfg.get("hidden_size", 0) // cfg.get("num_attention_heads", 1)
    if "experts" in overrides:
        for k in ("num_experts_per_tok", "moe_topk"):
            if k in cfg:
                cfg[k] = min(cfg[k], overrides["experts"])
    layers = cfg.get("num_hidden_layers", cfg.get("n_layer"))
    for k, v in list(cfg.items()):
        if isinstance(v, list) and old_layers and len(v) == old_layers and layers != old_layers:
            cfg[k] = v[:layers]
    cfg.pop("torch_dtype", None)
    cfg.pop("dtype", None)
    cfg["use_cache"] = False
    vocab = cfg.get("vocab_size")
    for k in ("bos_token_id", "eos_token_id", "pad_token_id"):  # ids past a shrunk vocabulary mean nothing
        ids = cfg.get(k)
        if vocab and ids is not None and any(i >= vocab for i in (ids if isinstance(ids, list) else [ids])):
            cfg[k] = None
    heads, kv = cfg.get("num_attention_heads"), cfg.get("num_key_value_heads")
    if heads and kv and heads % kv:
        raise TrainmathError(f"--kv-heads ({kv}) must divide --heads ({heads})")
    name = src.name + ("" if not overrides else " (" + ", ".join(f"{k}={v}" for k, v in overrides.items()) + ")")
    return name, cfg


def model_spec(name: str, cfg: dict):
    """The calculator's ``ModelSpec`` of the shrunk config."""
    return spec_from_config(dict(cfg), name=name, source=name)


def build_model(cfg: dict, *, seed: int, recompute: str) -> torch.nn.Module:
    """transformers' model of ``cfg`` in fp32 with weights drawn from ``seed`` (the same on every rank)."""
    from transformers import AutoConfig, AutoModelForCausalLM

    conf = dict(cfg)
    model_type = conf.pop("model_type")
    try:
        hf = AutoConfig.for_model(model_type, **conf)
    except Exception as e:  # noqa: BLE001 - transformers' message, one line
        raise TrainmathError(f"transformers cannot build a {model_type} config: {str(e).splitlines()[0]}") from None
    hf._attn_implementation = "sdpa"
    torch.manual_seed(seed)
    # Experts as a loop of plain matmuls ("eager"): the path FlopCounterMode and the calculator's profile describe
    # (transformers' default grouped kernels are invisible to the counter on CPU).
    model = AutoModelForCausalLM.from_config(hf, dtype=torch.float32, experts_implementation="eager")
    if recompute == "full":
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    elif recompute == "selective":  # torchtitan's op-level policy (trainmath.runtime.checkpointing)
        from trainmath.runtime.checkpointing import apply_selective

        apply_selective(model)
    return model


def decoder_layers(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The repeated blocks, the units FSDP and our ZeRO-2/3 shard one at a time (of the model peft wraps, when it
    is a ``PeftModel``)."""
    if hasattr(model, "get_base_model"):
        model = model.get_base_model()
    for path in ("model.layers", "transformer.h", "model.decoder.layers"):
        obj = model
        try:
            for part in path.split("."):
                obj = getattr(obj, part)
        except AttributeError:
            continue
        return list(obj)
    raise TrainmathError(f"cannot find the decoder layers of {type(model).__name__}")
