"""A headless Chromium driven over the DevTools protocol on a pipe (``--remote-debugging-pipe``): navigate,
click what a person would click, and save screenshots, with nothing to install beside Chromium itself.
Used by ``screenshots.py`` for the README's pictures of MLflow's UI; not part of the package."""

from __future__ import annotations

import base64
import json
import os
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any


class Browser:
    """One page of a headless Chromium; commands and their replies go as NUL-terminated JSON on fds 3 and 4."""

    def __init__(self, chromium: str = "/usr/bin/chromium", width: int = 1600, height: int = 900) -> None:
        to_browser_r, self._to_browser = os.pipe()
        self._from_browser, from_browser_w = os.pipe()
        self._profile = tempfile.TemporaryDirectory(prefix="cdp-profile-")
        args = [chromium, "--headless=new", "--remote-debugging-pipe", "--disable-gpu", "--no-first-run",
                "--no-default-browser-check", f"--user-data-dir={self._profile.name}", f"--window-size={width},{height}",
                "--hide-scrollbars", "--force-device-scale-factor=1"]
        if os.geteuid() == 0:  # Chromium refuses to run its sandbox as root (a container)
            args.append("--no-sandbox")
        script = f'exec "$0" "$@" 3<&{to_browser_r} 4>&{from_browser_w}'
        self.proc = subprocess.Popen(["sh", "-c", script, *args], pass_fds=(to_browser_r, from_browser_w),
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        os.close(to_browser_r)
        os.close(from_browser_w)
        self._buffer = b""
        self._next_id = 0
        target = self._send("Target.createTarget", {"url": "about:blank"})["targetId"]
        self._session = self._send("Target.attachToTarget", {"targetId": target, "flatten": True})["sessionId"]
        self.send("Page.enable")
        self.send("Emulation.setDeviceMetricsOverride",
                  {"width": width, "height": height, "deviceScaleFactor": 1, "mobile": False})

    def _send(self, method: str, params: dict[str, Any] | None = None, session: str | None = None) -> dict[str, Any]:
        self._next_id += 1
        msg: dict[str, Any] = {"id": self._next_id, "method": method, "params": params or {}}
        if session:
            msg["sessionId"] = session
        os.write(self._to_browser, json.dumps(msg).encode() + b"\0")
        while True:
            while b"\0" not in self._buffer:
                chunk = os.read(self._from_browser, 1 << 20)
                if not chunk:
                    raise RuntimeError("chromium closed its pipe")
                self._buffer += chunk
            raw, self._buffer = self._buffer.split(b"\0", 1)
            reply = json.loads(raw)
            if reply.get("id") == self._next_id:
                if "error" in reply:
                    raise RuntimeError(f"{method}: {reply['error']}")
                return reply.get("result", {})

    def send(self, method: str, params: dict[str, Any] | None = None) -> dict[str, Any]:
        """A command to the page."""
        return self._send(method, params, self._session)

    def eval(self, js: str) -> Any:
        """The value of a JavaScript expression in the page."""
        out = self.send("Runtime.evaluate", {"expression": js, "returnByValue": True, "awaitPromise": True})
        if "exceptionDetails" in out:
            raise RuntimeError(f"{js[:80]}...: {out['exceptionDetails'].get('text')}")
        return out["result"].get("value")

    def goto(self, url: str, settle: float = 4.0) -> None:
        self.send("Page.navigate", {"url": url})
        time.sleep(settle)

    def wait_for(self, js: str, timeout: float = 60.0) -> Any:
        """Poll a JavaScript expression until it is truthy."""
        end = time.time() + timeout
        while time.time() < end:
            value = self.eval(js)
            if value:
                return value
            time.sleep(0.5)
        raise TimeoutError(js)

    def click_at(self, x: float, y: float) -> None:
        """A real mouse click (pressed, released) at page coordinates."""
        for kind in ("mouseMoved", "mousePressed", "mouseReleased"):
            self.send("Input.dispatchMouseEvent", {"type": kind, "x": x, "y": y, "button": "left", "clickCount": 1})
        time.sleep(0.7)

    def click(self, js_element: str) -> bool:
        """Click the centre of the element a JavaScript expression finds; False if it finds none."""
        rect = self.eval(f"(() => {{ const e = {js_element}; if (!e) return null; e.scrollIntoView({{block: 'center'}});"
                         f" const r = e.getBoundingClientRect(); return [r.x + r.width / 2, r.y + r.height / 2]; }})()")
        if not rect:
            return False
        self.click_at(*rect)
        return True

    def screenshot(self, path: Path) -> Path:
        data = self.send("Page.captureScreenshot", {"format": "png"})["data"]
        path.write_bytes(base64.b64decode(data))
        return path

    def close(self) -> None:
        try:
            self._send("Browser.close")
        except RuntimeError:
            pass
        self.proc.wait(timeout=10)
        self._profile.cleanup()
