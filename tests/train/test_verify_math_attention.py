"""``verify`` on a model whose SDPA takes PyTorch's math fallback (GPT-2's attention dropout on the CPU): its Q·Kᵀ
and P·V are two ``bmm``s, which FlopCounterMode counts as GEMMs, so ``verify`` moves the attention core into
``gemm_flops`` there (``verify._sdpa_math``, read from the op lists)."""

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from trainmath.families import spec_from_config  # noqa: E402
from trainmath.flops import count_flops  # noqa: E402
from trainmath.verify.train import _sdpa_math  # noqa: E402

GPT2 = dict(model_type="gpt2", n_embd=64, n_layer=2, n_head=4, n_inner=96, vocab_size=128, n_positions=64)


def test_cpu_attention_dropout_runs_sdpa_as_gemms():
    from torch.utils.flop_counter import FlopCounterMode

    spec = spec_from_config(GPT2, name="tiny", source="test")
    qwen3 = spec_from_config(dict(model_type="qwen3", hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                                  num_attention_heads=4, num_key_value_heads=2, head_dim=16, vocab_size=128),
                             name="tiny", source="test")
    assert _sdpa_math(spec, 2, 16, cuda=False) and not _sdpa_math(spec, 2, 16, cuda=True)
    assert not _sdpa_math(qwen3, 2, 16, cuda=False)
    cfg = transformers.AutoConfig.for_model(**GPT2)  # attn_pdrop 0.1, GPT-2's default
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(cfg, attn_implementation="sdpa")
    model.train()
    ids = torch.randint(0, 128, (2, 16), generator=torch.Generator().manual_seed(1))
    with FlopCounterMode(display=False) as fc:
        out = model(input_ids=ids, labels=ids, use_cache=False)
        out.loss.backward()
    counts = fc.get_flop_counts()["Global"]
    assert not any("scaled_dot_product" in str(op) for op, n in counts.items() if n)
    assert sum(n for op, n in counts.items() if "bmm" in str(op)) > 0
    # every matmul, the attention core's included, is a GEMM FlopCounterMode sees: the calculator's whole count
    assert fc.get_total_flops() == count_flops(spec, batch=2, seq=16).training_flops
