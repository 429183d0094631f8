"""A real ``mlflow server`` for tests: 127.0.0.1, a SQLite store, served artifacts, restartable."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path


def free_port() -> int:
    return free_ports(1)[0]


def free_ports(n: int) -> list[int]:
    """n distinct free ports on 127.0.0.1: all bound at once before any is released (ports asked for one at a
    time can repeat, and a server given the same port twice fails to start)."""
    with contextlib.ExitStack() as stack:
        socks = [stack.enter_context(socket.socket()) for _ in range(n)]
        for s in socks:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in socks]





class MlflowServer:
    """``mlflow server`` on 127.0.0.1 with a SQLite store and served artifacts, restartable on the same port."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.port = free_port()
        self.db = root / "server.db"
        self.artifacts = root / "server-artifacts"
        self.log = root / "server.log"
        self.proc: subprocess.Popen | None = None
        self.start_seconds: list[float] = []

    @property
    def uri(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, timeout: float = 60.0) -> None:
        env = {**os.environ, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"}
        env.pop("MLFLOW_TRACKING_URI", None)
        exe = Path(sys.executable).parent / "mlflow"
        cmd = [str(exe)] if exe.exists() else [sys.executable, "-m", "mlflow"]
        cmd += ["server", "--host", "127.0.0.1", "--port", str(self.port),
                "--backend-store-uri", f"sqlite:///{self.db}", "--artifacts-destination", str(self.artifacts),
                "--serve-artifacts", "--workers", "1"]
        t0 = time.perf_counter()
        with open(self.log, "ab") as log:
            self.proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=self.root,
                                         start_new_session=True)
        deadline = t0 + timeout
        while time.perf_counter() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"mlflow server exited ({self.proc.returncode}):\n{self._tail()}")
            try:
                with urllib.request.urlopen(f"{self.uri}/health", timeout=1) as r:
                    if r.status == 200:
                        self.start_seconds.append(time.perf_counter() - t0)
                        return
            except OSError:
                pass
            time.sleep(0.1)
        self.kill()
        raise RuntimeError(f"mlflow server not healthy after {timeout:.0f} s:\n{self._tail()}")

    def kill(self) -> None:
        """SIGKILL the whole server (a crash, not a clean shutdown)."""
        if self.proc is None:
            return
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.proc.wait(timeout=30)
        self.proc = None
        deadline = time.perf_counter() + 10
        while time.perf_counter() < deadline:  # the uvicorn child dies with its group; wait for the port
            with socket.socket() as s:
                if s.connect_ex(("127.0.0.1", self.port)) != 0:
                    return
            time.sleep(0.05)

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def _tail(self) -> str:
        return self.log.read_text(errors="replace")[-3000:] if self.log.exists() else ""


