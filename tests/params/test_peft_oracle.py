"""LoRA adapters: our trainable / total parameters equal peft's get_nb_trainable_parameters() to the integer.

peft wraps transformers' own modules (built on the meta device from each catalog config), so the module names,
the all-linear rule and the fused projections are peft's, independent of the ledger's Linear list.
"""

import warnings

import pytest

from trainmath.adapters import PeftJob, adapter_report, linear_modules
from trainmath.cli import main
from trainmath.errors import TrainmathError
from trainmath.families import spec_from_config
from trainmath.params import count_params
from trainmath.sources import catalog_entry, catalog_index

from .reference import meta_model, torch

peft = pytest.importorskip("peft")
warnings.filterwarnings("ignore")


def _one_per_family() -> list[str]:
    seen: dict[str, str] = {}
    for repo_id in sorted(catalog_index()):
        seen.setdefault(catalog_entry(repo_id).config["model_type"], repo_id)
    return sorted(seen.values())


FAMILIES = _one_per_family()


class _Src:
    def __init__(self, config):
        self.config = config


def _shrunk(config: dict, layers: int = 8) -> dict:
    """The config cut to its first ``layers`` layers (per-layer lists and patterns cut with it): both sides read
    the same config, so the comparison stays exact, and peft's module walk over 94 layers is not repeated."""
    if "text_config" in config:  # Llama 4: the layers live in the text config
        return {**config, "text_config": _shrunk(config["text_config"], layers)}
    n = config.get("num_hidden_layers", 0)
    if n <= layers:
        return config
    out = {k: (v[:layers] if isinstance(v, (list, str)) and len(v) == n else v) for k, v in config.items()}
    out["num_hidden_layers"] = layers
    return out


def _spec(repo_id, *, shrink: bool = False):
    src = catalog_entry(repo_id)
    if shrink:
        src = _Src(_shrunk(src.config))
    return src, spec_from_config(src.config, name=repo_id, source=repo_id)


def _attention_targets(spec) -> tuple[str, ...]:
    """The layer's attention Linear modules (q_proj,v_proj where the model has them), by their short names."""
    names = [n.rsplit(".", 1)[-1] for n in linear_modules(spec)
             if any(t.name == n + ".weight" and t.component in ("attention", "linear_attention")
                    for layer in spec.layers for t in layer.tensors)]
    if {"q_proj", "v_proj"} <= set(names):
        return ("q_proj", "v_proj")
    return tuple(dict.fromkeys(names))


def _peft_counts(config: dict, rank: int, targets) -> tuple[int, int]:
    model = meta_model(config)
    with torch.device("meta"):
        lora = peft.LoraConfig(r=rank, target_modules=targets if isinstance(targets, str) else list(targets))
        pm = peft.get_peft_model(model, lora)
    return pm.get_nb_trainable_parameters()


@pytest.mark.parametrize("repo_id", FAMILIES)
@pytest.mark.parametrize("rank,mode", [(8, "attention"), (64, "all-linear")])
def test_trainable_params_equal_peft(repo_id, rank, mode):
    src, spec = _spec(repo_id, shrink=True)
    targets = "all-linear" if mode == "all-linear" else _attention_targets(spec)
    if spec.model_type == "nemotron_h" and mode == "all-linear":  # peft refuses the Mamba mixer's out_proj
        with pytest.raises(ValueError, match="incompatible with Mamba"):
            _peft_counts(src.config, rank, targets)
        with pytest.raises(TrainmathError, match="peft refuses LoRA on mixer.out_proj"):
            adapter_report(spec, PeftJob(method="lora", rank=rank, targets=targets), 0)
        return
    ours = adapter_report(spec, PeftJob(method="lora", rank=rank, targets=targets), count_params(spec).total_params)
    trainable, total = _peft_counts(src.config, rank, targets)
    assert (ours.trainable_params, ours.total_params) == (trainable, total)
    assert ours.trainable_params > 0


@pytest.mark.parametrize("repo_id,targets", [
    ("microsoft/Phi-3.5-mini-instruct", ("qkv_proj", "gate_up_proj")),  # fused projections, one adapter each
    ("mistralai/Mixtral-8x7B-v0.1", ("self_attn.q_proj", "o_proj")),   # MoE: attention targets
    ("Qwen/Qwen1.5-MoE-A2.7B", ("shared_expert.gate_proj", "down_proj")),  # shared experts
    ("meta-llama/Llama-4-Scout-17B-16E-Instruct", ("router", "q_proj")),  # Llama 4's router is an nn.Linear
    ("Qwen/Qwen3-30B-A3B", ("q_proj", "gate_proj", "up_proj", "down_proj")),  # experts → fused parameters, 2r
    ("deepseek-ai/DeepSeek-V2-Lite", ("gate", "down_proj", "kv_b_proj")),  # router + experts; dense MLPs dropped
    ("mistralai/Mixtral-8x7B-v0.1", ("w2", "k_proj")),  # Mixtral's v4 expert names
    ("nvidia/Nemotron-H-56B-Base-8K", ("in_proj", "up_proj", "q_proj")),  # Mamba mixer, MLP and attention
])
def test_named_targets_equal_peft(repo_id, targets):
    src, spec = _spec(repo_id, shrink=True)
    ours = adapter_report(spec, PeftJob(method="lora", rank=16, targets=targets), count_params(spec).total_params)
    assert (ours.trainable_params, ours.total_params) == _peft_counts(src.config, 16, targets)


def test_routed_experts_refused_in_one_line():
    _, spec = _spec("openai/gpt-oss-20b")  # fused experts with no v4 conversion: only target_parameters reach them
    with pytest.raises(TrainmathError, match="target_parameters"):
        adapter_report(spec, PeftJob(method="lora", targets=("experts",)), 0)


def test_half_a_fused_pair_refused_as_peft_does():
    src, spec = _spec("Qwen/Qwen3-30B-A3B", shrink=True)
    with pytest.raises(ValueError, match="fused"):
        _peft_counts(src.config, 8, ["gate_proj"])
    with pytest.raises(TrainmathError, match="target both or neither"):
        adapter_report(spec, PeftJob(method="lora", targets=("gate_proj",)), 0)


def run_cli(capsys, *argv):
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


@pytest.mark.parametrize("argv,msg", [
    (["--peft", "lora", "--lora-rank", "0"], "positive"),
    (["--peft", "lora", "--lora-rank", "4097"], "smaller dimension"),
    (["--peft", "lora", "--lora-targets", "qkv"], "it has down_proj, gate_proj, k_proj"),
    (["--lora-rank", "16"], "needs --peft"),
    (["--peft", "none", "--lora-targets", "all-linear"], "needs --peft"),
])
def test_bad_input_one_line_exit_2(capsys, argv, msg):
    code, out, err = run_cli(capsys, "params", "meta-llama/Llama-3.1-8B", *argv)
    assert code == 2 and out == "" and err.count("\n") == 1 and msg in err


def test_qlora_on_quantized_checkpoint_is_refused(capsys):
    code, _, err = run_cli(capsys, "params", "openai/gpt-oss-20b", "--peft", "qlora")
    assert code == 2 and "already ships quantized (mxfp4" in err
