"""A minimal headless-Chromium driver over the DevTools protocol on a pipe (``--remote-debugging-pipe``:
NUL-separated JSON on fds 3 and 4), standard library only: no selenium, no chromedriver, nothing downloaded.

It records console errors, uncaught exceptions and failed loads of every page, evaluates expressions, sets a
file input, and takes screenshots.
"""

from __future__ import annotations

import base64
import json
import os
import queue
import shutil
import subprocess
import tempfile
import threading
import time

CHROMIUM = "/usr/bin/chromium"
FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--no-first-run",
         "--no-default-browser-check", "--disable-extensions", "--disable-background-networking",
         "--disable-component-update", "--disable-sync", "--disable-default-apps", "--mute-audio",
         "--disable-features=Translate,MediaRouter,OptimizationHints", "--remote-debugging-pipe")


class BrowserError(RuntimeError):
    pass


class Browser:
    def __init__(self, binary: str = CHROMIUM, width: int = 1100, height: int = 900,
                 profile: str | None = None) -> None:
        """``profile``: the user-data folder (kept: the caller owns it, e.g. pytest's tmp_path); without one a
        temporary folder is made and removed by :meth:`close` (or at once when the browser fails to start)."""
        self._own_profile = profile is None
        self.profile = tempfile.mkdtemp(prefix="trainmath-chromium-") if profile is None else str(profile)
        try:
            self._start(binary, width, height)
        except BaseException:
            self.close()
            raise

    def _start(self, binary: str, width: int, height: int) -> None:
        to_browser_r, to_browser_w = os.pipe()
        from_browser_r, from_browser_w = os.pipe()
        args = " ".join(FLAGS)  # bash, not sh: dash cannot redirect from fds above 9
        cmd = (f"exec {binary} {args} --user-data-dir={self.profile} --window-size={width},{height} about:blank "
               f"3<&{to_browser_r} 4>&{from_browser_w}")
        self._to_browser, self._from_browser = to_browser_w, from_browser_r
        try:
            self.proc = subprocess.Popen(["/bin/bash", "-c", cmd], pass_fds=(to_browser_r, from_browser_w),
                                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        finally:
            os.close(to_browser_r)
            os.close(from_browser_w)
        self._next = 0
        self._replies: dict[int, queue.Queue] = {}
        self._lock = threading.Lock()
        self.events: list[dict] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()
        target = self.call("Target.createTarget", {"url": "about:blank"})["targetId"]
        self.session = self.call("Target.attachToTarget", {"targetId": target, "flatten": True})["sessionId"]
        for domain in ("Runtime", "Log", "Page"):
            self.call(f"{domain}.enable", session=True)
        self.call("Emulation.setDeviceMetricsOverride", {"width": width, "height": height, "deviceScaleFactor": 1,
                                                         "mobile": False}, session=True)

    def _read(self) -> None:
        buf = b""
        while True:
            try:
                chunk = os.read(self._from_browser, 1 << 16)
            except OSError:
                return
            if not chunk:
                return
            buf += chunk
            while b"\0" in buf:
                raw, buf = buf.split(b"\0", 1)
                msg = json.loads(raw)
                if "id" in msg:
                    with self._lock:
                        q = self._replies.get(msg["id"])
                    if q is not None:
                        q.put(msg)
                else:
                    self.events.append(msg)

    def call(self, method: str, params: dict | None = None, *, session: bool = False, timeout: float = 30) -> dict:
        with self._lock:
            self._next += 1
            mid = self._next
            self._replies[mid] = q = queue.Queue()
        msg = {"id": mid, "method": method, "params": params or {}}
        if session:
            msg["sessionId"] = self.session
        end = time.monotonic() + timeout
        try:
            os.write(self._to_browser, json.dumps(msg).encode() + b"\0")
        except BrokenPipeError:
            pass  # the browser is gone: said below with its exit code
        while True:
            try:
                reply = q.get(timeout=0.1)
                break
            except queue.Empty:
                if self.proc.poll() is not None:  # no reply can come
                    raise BrowserError(f"{method}: the browser exited with code {self.proc.returncode}") from None
                if time.monotonic() > end:
                    raise BrowserError(f"{method}: no reply in {timeout} s") from None
        if "error" in reply:
            raise BrowserError(f"{method}: {reply['error']}")
        return reply.get("result", {})

    # -------------------------------------------------------------------------------------------- page API

    def open(self, url: str, timeout: float = 20) -> None:
        """Navigate and wait for the load event; console records start afresh."""
        self.events.clear()
        self.call("Page.navigate", {"url": url}, session=True)
        self.wait_for("document.readyState === 'complete'", timeout)

    def eval(self, expression: str, timeout: float = 30):
        res = self.call("Runtime.evaluate", {"expression": expression, "awaitPromise": True, "returnByValue": True},
                        session=True, timeout=timeout)
        if "exceptionDetails" in res:
            raise BrowserError(f"{expression[:60]}: {res['exceptionDetails'].get('text')}")
        return res["result"].get("value")

    def wait_for(self, expression: str, timeout: float = 20):
        """Poll ``expression`` until it is truthy; its value."""
        end = time.monotonic() + timeout
        while True:
            value = self.eval(expression)
            if value:
                return value
            if time.monotonic() > end:
                raise BrowserError(f"timed out waiting for {expression}")
            time.sleep(0.05)

    def problems(self) -> list[str]:
        """Console errors and warnings, uncaught exceptions and failed loads since the last ``open``."""
        out = []
        for e in self.events:
            m, p = e.get("method"), e.get("params", {})
            if m == "Runtime.consoleAPICalled" and p.get("type") in ("error", "warning", "assert"):
                out.append(f"console.{p['type']}: " + " ".join(str(a.get("value", a.get("description")))
                                                           for a in p.get("args", [])))
            elif m == "Runtime.exceptionThrown":
                d = p.get("exceptionDetails", {})
                out.append(f"exception: {d.get('text')} {d.get('exception', {}).get('description', '')}")
            elif m == "Log.entryAdded" and p.get("entry", {}).get("level") in ("error", "warning"):
                out.append(f"log: {p['entry'].get('text')} {p['entry'].get('url', '')}")
        return out

    def set_files(self, selector: str, paths: list[str]) -> None:
        root = self.call("DOM.getDocument", session=True)["root"]["nodeId"]
        node = self.call("DOM.querySelector", {"nodeId": root, "selector": selector}, session=True)["nodeId"]
        self.call("DOM.setFileInputFiles", {"nodeId": node, "files": paths}, session=True)

    def screenshot(self, path: str, full_page: bool = True) -> str:
        res = self.call("Page.captureScreenshot", {"format": "png", "captureBeyondViewport": full_page},
                        session=True)
        with open(path, "wb") as f:
            f.write(base64.b64decode(res["data"]))
        return path

    def close(self) -> None:
        """End the browser and remove the profile folder this object made (all of it, even after a failed start)."""
        proc = getattr(self, "proc", None)
        if proc is not None:
            try:
                self.call("Browser.close", timeout=5)
            except (BrowserError, OSError):
                pass
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=10)
        for fd in (getattr(self, "_to_browser", None), getattr(self, "_from_browser", None)):
            try:
                if fd is not None:
                    os.close(fd)
            except OSError:
                pass
        if self._own_profile:
            shutil.rmtree(self.profile, ignore_errors=True)
