"""Model structure: ``config.json`` → ``ModelSpec`` (single device, no parallelism).

The families (``trainmath.families``) read a config into a ``ModelSpec``; ``spec_from_config`` and
``supported_model_types`` are theirs, reachable here for callers written against this room.
"""

from __future__ import annotations

from trainmath.model.options import DROPOUT_OPTIONS, OPTION_KEYS, config_options
from trainmath.model.spec import ModelSpec

__all__ = ["DROPOUT_OPTIONS", "OPTION_KEYS", "ModelSpec", "config_options", "spec_from_config",
           "supported_model_types"]


def spec_from_config(data: dict[str, object], *, name: str, source: str, strict: bool = False) -> ModelSpec:
    """``trainmath.families.spec_from_config``."""
    from trainmath import families

    return families.spec_from_config(data, name=name, source=source, strict=strict)


def supported_model_types() -> list[str]:
    """``trainmath.families.supported_model_types``."""
    from trainmath import families

    return families.supported_model_types()
