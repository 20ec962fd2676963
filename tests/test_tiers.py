"""The fast tier's list of slow modules names real files (a renamed module would silently join the fast tier)."""

import importlib.util
from pathlib import Path

TESTS = Path(__file__).resolve().parent


def test_every_slow_module_exists():
    spec = importlib.util.spec_from_file_location("root_conftest", TESTS / "conftest.py")
    conf = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(conf)
    assert conf.SLOW_MODULES and sorted(m for m in conf.SLOW_MODULES if not (TESTS / m).is_file()) == []
