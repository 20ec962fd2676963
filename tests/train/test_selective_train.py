"""``trainmath train --recompute selective``: torchtitan's op-level policy on the decoder layers
(``runtime.checkpointing.apply_selective``) changes no arithmetic: cached outputs are the values forward computed,
the rest is recomputed by the same kernels, so the loss curve is bitwise the one without recompute."""

import pytest

from tests.train.runs import cached, losses


@pytest.mark.parametrize("strategy,impl", [("ddp", "torch"), ("zero3", "torch"), ("zero3", "trainmath")])
def test_selective_recompute_is_bitwise_no_recompute(strategy, impl):
    got = losses(cached(2, strategy=strategy, impl=impl, recompute="selective"))
    assert got == losses(cached(2, strategy=strategy, impl=impl))
    assert got[-1] != got[0]  # it trains
