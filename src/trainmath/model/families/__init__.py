"""One module per architecture family: ``config.json`` → ``ModelSpec``.

``BUILDERS`` maps every supported ``model_type`` to its builder. A builder reads every dimension from the
config through a ``ConfigView`` (transformers' defaults for absent keys) and calls ``cfg.check()`` before
returning, so all problems with a config are reported together.
"""

from __future__ import annotations

from collections.abc import Callable

from trainmath.model.config import ConfigView
from trainmath.model.families import classic, deepseek, dense, gpt_oss, hybrid, moe
from trainmath.model.spec import ModelSpec

BUILDERS: dict[str, Callable[[ConfigView, str], ModelSpec]] = {
    **{t: dense.build for t in dense.FAMILIES},
    **{t: moe.build for t in moe.FAMILIES},
    **{t: deepseek.build for t in deepseek.FAMILIES},
    "gpt_oss": gpt_oss.build,
    **{t: hybrid.build for t in hybrid.FAMILIES},
    **{t: classic.build for t in classic.FAMILIES},
}
