"""The headless-Chromium harness itself leaves nothing in $TMPDIR: a browser that fails to start is reported at
once and its profile folder removed; a profile given by the caller is the caller's."""

import tempfile
import time

import pytest

from headless import Browser, BrowserError


def test_a_browser_that_cannot_start_leaves_no_profile(tmp_path, monkeypatch):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # a private $TMPDIR for mkdtemp
    t = time.monotonic()
    with pytest.raises(BrowserError, match="the browser exited with code 1"):
        Browser(binary="/bin/false")
    assert time.monotonic() - t < 10  # noticed when it exits, not after the 30 s reply timeout
    assert list(tmp_path.iterdir()) == []


def test_a_given_profile_is_kept(tmp_path):
    profile = tmp_path / "profile"
    profile.mkdir()
    with pytest.raises(BrowserError):
        Browser(binary="/bin/false", profile=str(profile))
    assert profile.is_dir()
