import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

import standin  # noqa: E402


@pytest.fixture
def act():
    """The stand-in activation model (the real one is tested by its own engineer)."""
    return standin
