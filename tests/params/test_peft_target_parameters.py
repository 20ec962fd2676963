"""LoRA on routed experts and routers (peft's ``target_parameters``, ``ParamWrapper``): our trainable / total
parameters equal peft's ``get_nb_trainable_parameters()`` to the integer, on every catalog MoE family, built on
the meta device from its catalog config (cut to 8 layers, as ``test_peft_oracle``)."""

import warnings

import pytest

from trainmath.adapter_params import hf_parameters
from trainmath.adapters import PeftJob, adapter_report
from trainmath.cli import main
from trainmath.errors import TrainmathError
from trainmath.params import count_params

from .reference import meta_model, torch
from .test_peft_oracle import _spec

peft = pytest.importorskip("peft")
warnings.filterwarnings("ignore")

MOE = ["Qwen/Qwen3-30B-A3B", "mistralai/Mixtral-8x7B-v0.1", "openai/gpt-oss-20b", "Qwen/Qwen1.5-MoE-A2.7B",
       "meta-llama/Llama-4-Scout-17B-16E-Instruct", "deepseek-ai/DeepSeek-V2-Lite", "deepseek-ai/DeepSeek-V3",
       "moonshotai/Kimi-K2-Instruct", "zai-org/GLM-4.5", "Qwen/Qwen3-Next-80B-A3B-Thinking"]
EXPERTS = ("experts.gate_up_proj", "experts.down_proj")


def _peft(config: dict, rank: int, modules, params) -> tuple[int, int]:
    model = meta_model(config)
    with torch.device("meta"):
        lora = peft.LoraConfig(r=rank, target_modules=modules if isinstance(modules, str) else list(modules),
                               target_parameters=list(params))
        pm = peft.get_peft_model(model, lora)
    return pm.get_nb_trainable_parameters()


def _router(spec) -> str:
    return next(n for n in hf_parameters(spec) if not n.endswith(EXPERTS)).split(".", 1)[1]


@pytest.mark.parametrize("repo_id", MOE)
@pytest.mark.parametrize("rank,mode", [(8, "experts"), (16, "experts+router"), (64, "attention+experts")])
def test_expert_targets_equal_peft(repo_id, rank, mode):
    src, spec = _spec(repo_id, shrink=True)
    params = EXPERTS + ((_router(spec),) if mode == "experts+router" else ())
    modules = ("q_proj", "v_proj") if mode.startswith("attention") else ()
    if spec.layers[0].blocks and any(b.kind == "mla" for b in spec.layers[0].blocks) and modules:
        modules = ("q_b_proj", "kv_b_proj") if any("q_b_proj" in t.name for t in spec.layers[0].tensors) \
            else ("q_proj", "kv_b_proj")
    job = PeftJob(method="lora", rank=rank, targets=modules or "none", target_parameters=params)
    ours = adapter_report(spec, job, count_params(spec).total_params)
    assert (ours.trainable_params, ours.total_params) == _peft(src.config, rank, modules, params)
    assert sum(p for m, p in ours.modules if m.parameter) > 0


@pytest.mark.parametrize("repo_id,modules,params", [
    ("Qwen/Qwen3-30B-A3B", ("gate_proj", "up_proj"), ("experts.gate_up_proj",)),  # converted pair at 2r, once
    ("mistralai/Mixtral-8x7B-v0.1", ("w2",), ("mlp.experts.gate_up_proj",)),  # v4 w2 converted + a full suffix
    ("openai/gpt-oss-20b", "all-linear", ("gate_up_proj",)),  # no conversion: all-linear + a bare suffix
])
def test_mixed_with_module_targets_equal_peft(repo_id, modules, params):
    src, spec = _spec(repo_id, shrink=True)
    job = PeftJob(method="lora", rank=8, targets=modules, target_parameters=params)
    ours = adapter_report(spec, job, count_params(spec).total_params)
    assert (ours.trainable_params, ours.total_params) == _peft(src.config, 8, modules, params)


def test_per_expert_rule_pinned():
    """peft's ParamWrapper: lora_A (in → r·E), lora_B (r·E → out): r·E·(in + out) per layer for a 3-d stack."""
    _, spec = _spec("Qwen/Qwen3-30B-A3B")
    job = PeftJob(method="lora", rank=8, targets="none", target_parameters=("experts.down_proj",))
    (m, p), = adapter_report(spec, job, 0).modules
    assert (m.name, m.in_features, m.out_features, m.experts) == ("mlp.experts.down_proj", 768, 2048, 128)
    assert p == 8 * 128 * (768 + 2048) * 48


def run_cli(capsys, *argv):
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


@pytest.mark.parametrize("repo,argv,msg", [
    ("meta-llama/Llama-3.1-8B", ["--lora-target-parameters", "experts.gate_up_proj"], "has no routed experts"),
    ("Qwen/Qwen3-30B-A3B", ["--lora-target-parameters", "experts.w1"],
     "it has mlp.gate.weight, mlp.experts.gate_up_proj, mlp.experts.down_proj"),
    ("openai/gpt-oss-20b", ["--lora-targets", "experts"], "--lora-target-parameters"),
    ("Qwen/Qwen3-30B-A3B", ["--lora-targets", "none"], "adapts nothing"),
    ("Qwen/Qwen3-30B-A3B", ["--lora-target-parameters", ","], "name at least one"),
])
def test_bad_input_one_line_exit_2(capsys, repo, argv, msg):
    code, out, err = run_cli(capsys, "params", repo, "--peft", "lora", *argv)
    assert code == 2 and out == "" and err.count("\n") == 1 and msg in err, err


def test_cli_json(capsys):
    import json

    code, out, _ = run_cli(capsys, "params", "openai/gpt-oss-20b", "--peft", "lora", "--lora-targets", "none",
                           "--lora-target-parameters", "experts.gate_up_proj,experts.down_proj", "--json")
    d = json.loads(out)
    assert code == 0 and d["lora_target_parameters"] == list(EXPERTS)
    # 24 layers, 32 experts: gate_up_proj 2880 → 5760, down_proj 2880 → 2880, r = 8
    assert d["trainable_params"] == 8 * 32 * 24 * ((2880 + 5760) + (2880 + 2880))
    with pytest.raises(TrainmathError):
        adapter_report(_spec("openai/gpt-oss-20b")[1], PeftJob(method="lora", targets=("experts",)), 0)
