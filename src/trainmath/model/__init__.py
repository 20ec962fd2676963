"""Model structure: the ``ModelSpec`` a config becomes (single device, no parallelism).

The families (``trainmath.families``) read a config into a ``ModelSpec`` (``families.spec_from_config``).
"""

from __future__ import annotations

from trainmath.model.options import DROPOUT_OPTIONS, OPTION_KEYS, config_options
from trainmath.model.spec import ModelSpec

__all__ = ["DROPOUT_OPTIONS", "OPTION_KEYS", "ModelSpec", "config_options"]
