import pathlib
import sys
import threading

import pytest

sys.path.insert(0, str(pathlib.Path(__file__).parent))  # vizdata.py, headless.py


@pytest.fixture(scope="module")
def browser(tmp_path_factory):
    """Headless Chromium for one test module; its profile lives under pytest's temporary folder, so nothing is
    left in $TMPDIR even if the process is killed."""
    from headless import Browser

    b = Browser(profile=tmp_path_factory.mktemp("chromium-profile"))
    try:
        yield b
    finally:
        b.close()


@pytest.fixture(scope="module")
def url():
    """The local web calculator on a free port of 127.0.0.1, for one test module."""
    from trainmath.serve.app import make_server

    server = make_server("127.0.0.1", 0)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}/"
    server.shutdown()
    server.server_close()
