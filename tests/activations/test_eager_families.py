"""Oracle: eager attention (``attn_implementation="eager"``) for the families whose eager path ``test_hf_oracle``
does not cover, against what transformers' own code saves (its harness).

Falcon, every variant: ``query @ key.transpose`` and ``probs @ value`` broadcast the key and value heads, so bmm
keeps contiguous h-head copies of q, k and v; the softmax is in the hidden states' dtype (fp32 under autocast,
then cast for the second bmm); the mask add and the in-place scale keep nothing; the index copies keep their
int64 indices as with SDPA. StarCoder2 and Cohere: the standard eager attention (fp32 softmax and its cast)."""

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

from test_hf_oracle import FALCON, FAMILY_CASES, PREC, _family_case  # noqa: E402

CASES = [(m, extra) for m, extra, _ in FAMILY_CASES if m in ("falcon", "starcoder2", "cohere")]


@pytest.mark.parametrize("mode", list(PREC))
@pytest.mark.parametrize("model_type,extra", CASES,
                         ids=[m + ":" + (",".join(f"{k}={v}" for k, v in e.items() if k not in FALCON) or "default")
                              for m, e in CASES])
def test_eager_exact(model_type, extra, mode):
    _, predicted, measured = _family_case(model_type, extra, "eager", mode, False)
    assert predicted == measured
