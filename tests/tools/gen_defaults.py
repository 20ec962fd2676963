"""Regenerate src/trainmath/model/defaults.json from transformers' config classes."""
import inspect, json, warnings
warnings.filterwarnings("ignore")
import transformers
from transformers import CONFIG_MAPPING
TYPES = ["qwen3","qwen3_moe","qwen2","qwen2_moe","qwen3_next","llama","llama4_text","mistral","mixtral","deepseek_v2","deepseek_v3","glm4_moe","gpt_oss","gemma2","gemma3_text","phi3","olmo2","cohere","starcoder2","falcon","gpt2","nemotron_h"]
SKIP = {"kwargs", "self", "rope_scaling", "rope_parameters", "bos_token_id", "eos_token_id", "pad_token_id"}
out = {"_source": f"transformers {transformers.__version__}: the non-None defaults of each config class's __init__ (signature or dataclass fields); regenerate with tests/tools/gen_defaults.py"}
for t in TYPES:
    cls = CONFIG_MAPPING[t]
    keep = {}
    sig = inspect.signature(cls.__init__)
    params = {n: p.default for n, p in sig.parameters.items() if p.default is not inspect.Parameter.empty}
    if not params or set(params) <= {"kwargs"}:
        import dataclasses
        if dataclasses.is_dataclass(cls):
            for f in dataclasses.fields(cls):
                if f.default is not dataclasses.MISSING: params[f.name] = f.default
                elif f.default_factory is not dataclasses.MISSING: params[f.name] = f.default_factory()
    for k, v in params.items():
        if k in SKIP or v is None or k.startswith("_"): continue
        try: json.dumps(v, allow_nan=False)
        except Exception: continue
        keep[k] = v
    out[t] = keep
out["_attribute_map"] = {t: dict(CONFIG_MAPPING[t].attribute_map) for t in TYPES if CONFIG_MAPPING[t].attribute_map}
json.dump(out, open("src/trainmath/model/defaults.json", "w"), indent=1)
print({t: len(v) for t, v in out.items() if t != "_source"})
