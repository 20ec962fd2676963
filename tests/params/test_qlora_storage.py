"""QLoRA storage: our bytes per 4-bit weight equal the tensors bitsandbytes' quantize_4bit returns (on the CPU)."""

import pytest

from trainmath.qlora import nf4_storage

torch = pytest.importorskip("torch")
F = pytest.importorskip("bitsandbytes.functional")


@pytest.mark.parametrize("shape", [(64, 64), (300, 130), (1, 17), (4096, 1024), (257 * 64, 65)])
@pytest.mark.parametrize("double_quant", [True, False])
@pytest.mark.parametrize("quant_type", ["nf4", "fp4"])
def test_storage_equals_bitsandbytes(shape, double_quant, quant_type):
    w = torch.randn(*shape, dtype=torch.bfloat16)
    q, s = F.quantize_4bit(w, blocksize=64, compress_statistics=double_quant, quant_type=quant_type)
    theirs = q.numel() * q.element_size() + s.absmax.nbytes + s.code.nbytes
    if double_quant:
        theirs += s.state2.absmax.nbytes + s.state2.code.nbytes + s.offset.nbytes
    ours = nf4_storage(w.numel(), double_quant=double_quant)
    assert ours["total"] == theirs
    assert ours["packed"] == q.nbytes
