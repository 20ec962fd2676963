"""The fast tier's list of slow modules names real files (a renamed module would silently join the fast tier)."""

from conftest import ROOT, SLOW_MODULES


def test_every_slow_module_exists():
    assert sorted(m for m in SLOW_MODULES if not (ROOT / "tests" / m).is_file()) == []
