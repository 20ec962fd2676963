"""Full recompute as transformers runs it (``gradient_checkpointing_enable()``: torch's non-reentrant checkpoint,
which stops early): ``count_flops(recompute="full", checkpoint="torch")`` equals FlopCounterMode's count of a real
step exactly, on tiny models of layers that end in a Linear (its GEMM is not run again), in a dropout (GPT-2) or in
a post-norm (OLMo-2), and in an MoE block (every GEMM is run again); ``megatron`` (the whole layer) is more."""

import pytest

from trainmath.errors import TrainmathError
from trainmath.families import spec_from_config
from trainmath.flops import count_flops

from .oracle import build_model, tiny_config, torch
from .test_oracle import CASES

CHECKPOINTED = ("qwen3-untied", "olmo2", "gpt2", "cohere", "qwen3_moe", "starcoder2-biases")


def _recompute_step(model, *, batch: int, seq: int) -> int:
    """FlopCounterMode's total of forward + backward with every layer checkpointed (training mode)."""
    from torch.utils.flop_counter import FlopCounterMode

    model.train()
    model.gradient_checkpointing_enable()
    ids = torch.randint(0, model.config.vocab_size, (batch, seq), generator=torch.Generator().manual_seed(1))
    with FlopCounterMode(display=False) as fc:
        out = model(input_ids=ids, use_cache=False)
        out.logits.sum().backward()
    return fc.get_total_flops()


@pytest.mark.parametrize("case", CHECKPOINTED)
def test_torch_checkpoint_recompute_equals_flop_counter(case):
    repo, overrides = CASES[case]
    cfg = tiny_config(repo, **overrides)
    spec = spec_from_config(cfg, name=case, source=case)
    batch, seq = 2, 7
    torch_rc = count_flops(spec, batch=batch, seq=seq, recompute="full", checkpoint="torch")
    whole = count_flops(spec, batch=batch, seq=seq, recompute="full")
    assert torch_rc.training_flops == _recompute_step(build_model(cfg), batch=batch, seq=seq)
    ends_in_linear = case in ("qwen3-untied", "cohere", "qwen3_moe")  # qwen3_moe: its dense last layer
    assert (torch_rc.training_flops < whole.training_flops) == ends_in_linear


def test_checkpoint_impl_refused():
    spec = spec_from_config(tiny_config("Qwen/Qwen3-8B"), name="t", source="t")
    with pytest.raises(TrainmathError, match="checkpoint must be one of megatron, torch"):
        count_flops(spec, batch=1, seq=8, recompute="full", checkpoint="reentrant")
