"""Oracle: Falcon's eager attention (``attn_implementation="eager"``), every variant, against what transformers'
own code saves (the harness of ``test_hf_oracle``). ``query @ key.transpose`` and ``probs @ value`` broadcast the
key and value heads, so bmm keeps contiguous h-head copies of q, k and v; the softmax is in the hidden states'
dtype (fp32 under autocast, then cast for the second bmm); the mask add and the in-place scale keep nothing; the
index copies keep their int64 indices as with SDPA."""

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

from test_hf_oracle import FALCON, FAMILY_CASES, PREC, _family_case  # noqa: E402

CASES = [(extra, attn) for model_type, extra, attn in FAMILY_CASES if model_type == "falcon"]


@pytest.mark.parametrize("mode", list(PREC))
@pytest.mark.parametrize("extra", [e for e, _ in CASES],
                         ids=[",".join(f"{k}={v}" for k, v in e.items() if k not in FALCON) or "multi_query"
                              for e, _ in CASES])
def test_falcon_eager_exact(extra, mode):
    _, predicted, measured = _family_case("falcon", extra, "eager", mode, False)
    assert predicted == measured
