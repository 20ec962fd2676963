"""Every strategy × implementation trains like one process on the whole batch (equal tokens per step).

Oracle: one process, plain model, same global batch of 4 sequences. Tolerance: 1e-5 absolute on the loss (the
sums of gradients run in another order on 2 and 4 ranks: fp32 rounding only, measured ≤ 5e-7); at one rank every
strategy is bitwise the plain model (same arithmetic in the same order).
"""

import pytest

from tests.train.runs import STRATEGIES, cached, losses

LOSS_TOLERANCE = 1e-5


@pytest.fixture(scope="module")
def reference():
    return losses(cached(1))


@pytest.mark.parametrize("nproc", [2, 4])
@pytest.mark.parametrize("strategy,impl", STRATEGIES)
def test_same_loss_curve_as_one_process(reference, strategy, impl, nproc):
    got = losses(cached(nproc, strategy=strategy, impl=impl))
    assert len(got) == len(reference) == 4
    assert max(abs(a - b) for a, b in zip(got, reference)) <= LOSS_TOLERANCE
    assert got[-1] != got[0]  # it trains


@pytest.mark.parametrize("strategy,impl", STRATEGIES)
def test_one_rank_is_bitwise_the_plain_model(reference, strategy, impl):
    assert losses(cached(1, strategy=strategy, impl=impl)) == reference


@pytest.mark.parametrize("nproc", [2, 4])
@pytest.mark.parametrize("strategy", ["zero1", "zero2", "zero3"])
def test_our_zero_equals_torchs(strategy, nproc):
    ours = losses(cached(nproc, strategy=strategy, impl="trainmath"))
    theirs = losses(cached(nproc, strategy=strategy, impl="torch"))
    assert max(abs(a - b) for a, b in zip(ours, theirs)) <= LOSS_TOLERANCE


def test_every_rank_reports_the_same_losses():
    res = cached(4, strategy="zero3", impl="trainmath")
    assert all(losses({0: res[r]}) == losses(res) for r in res)


@pytest.mark.parametrize("strategy,impl", [("ddp", "torch"), ("zero2", "trainmath")])
def test_gradient_accumulation_at_equal_tokens(reference, strategy, impl):
    got = losses(cached(2, strategy=strategy, impl=impl, grad_accum=2))
    assert max(abs(a - b) for a, b in zip(got, reference)) <= LOSS_TOLERANCE


@pytest.mark.parametrize("strategy,impl", [("ddp", "torch"), ("zero3", "torch"), ("zero3", "trainmath")])
def test_full_recompute_is_bitwise_no_recompute(strategy, impl):
    """Recomputing a layer's forward repeats the same arithmetic: the losses do not change at all."""
    assert losses(cached(2, strategy=strategy, impl=impl, recompute="full")) == losses(
        cached(2, strategy=strategy, impl=impl))


@pytest.mark.parametrize("precision", ["bf16", "amp-bf16"])
def test_bf16_our_zero3_equals_fsdp2(reference, precision):
    """The two ZeRO-3s agree as in fp32 (measured: bitwise); bf16 rounding moves the curve off the fp32 one by
    ~4e-4 (bf16) and ~1e-4 (amp-bf16) here: asserted within 2e-3, and not equal to it."""
    ours = losses(cached(2, strategy="zero3", impl="trainmath", precision=precision))
    theirs = losses(cached(2, strategy="zero3", impl="torch", precision=precision))
    assert max(abs(a - b) for a, b in zip(ours, theirs)) <= LOSS_TOLERANCE
    assert 0 < max(abs(a - b) for a, b in zip(ours, reference)) <= 2e-3


@pytest.mark.parametrize("strategy,impl", [("ddp", "torch"), ("zero3", "torch"), ("zero1", "trainmath"),
                                           ("zero3", "trainmath")])
def test_moe_with_experts_no_token_reaches(strategy, impl):
    """Mixtral, top-2 of 64 experts (~23 get no token per rank and step): the same curve as one process."""
    got = losses(cached(2, strategy=strategy, impl=impl, moe=True))
    assert max(abs(a - b) for a, b in zip(got, losses(cached(1, moe=True)))) <= LOSS_TOLERANCE
