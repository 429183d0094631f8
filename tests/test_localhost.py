"""A local Ray that pvm-dist starts listens on the loopback interface only, with Ray's token authentication
on, and its ports close when the driver exits."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest
from conftest import cli_command
from listening import descendants, is_loopback, listening
from sweep_helpers import driver_output, environment, of, events, sweep_dir, sweep_file

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads sockets from /proc")


def test_local_sweep_listens_on_loopback_only_and_closes_its_ports(tmp_path):
    pytest.importorskip("ray")
    env = environment(tmp_path)
    env.pop("RAY_AUTH_MODE", None)  # whatever the caller's shell says: Ray's default, token authentication on
    f = sweep_file(tmp_path, "lo", steps=200, checkpoint_every=100, metrics_every=100, backend="reference")
    with open(tmp_path / "driver.out", "w") as out, open(tmp_path / "driver.err", "w") as err:
        proc = subprocess.Popen([*cli_command(), "sweep", "run", str(f), "--root", str(tmp_path / "sweeps"), "-q"],
                                cwd=tmp_path, stdout=out, stderr=err, env=env)
    seen: dict[tuple[str, int], int | None] = {}
    pids: set[int] = set()
    try:
        folder = sweep_dir(tmp_path)
        while proc.poll() is None:  # the whole sweep long: workers come and go
            pids |= descendants(proc.pid)
            seen.update({(s.address, s.port): s.pid for s in listening(pids)})
            if of(events(folder), "trial_ended"):
                break
            time.sleep(0.2)
        assert proc.wait(timeout=180) == 0, driver_output(tmp_path)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert len(seen) >= 4, f"expected GCS, raylet, driver and worker listeners, saw {seen}"
    outside = {k: v for k, v in seen.items() if not is_loopback(k[0])}
    assert not outside, f"listening beyond loopback: {outside}"
    # Token auth on: Ray warns when a cluster runs without it (pvm-dist keeps only its "enabled" notice quiet).
    assert "Token authentication is disabled" not in (tmp_path / "driver.err").read_text(), driver_output(tmp_path)
    deadline = time.monotonic() + 30
    while (left := listening(pids)) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert not left, f"still listening after the driver exited: {left}"


@pytest.mark.exhaustive
def test_a_killed_driver_leaves_nothing_listening_beyond_loopback_and_its_ports_close(tmp_path):
    """SIGKILL of the driver alone (its local Ray is left to notice): what lingers (README: Ray's agents, about a
    minute) stays on loopback, and every port its processes held is closed within two minutes."""
    pytest.importorskip("ray")
    import os
    import signal

    from sweep_helpers import wait_for

    env = environment(tmp_path)
    f = sweep_file(tmp_path, "lk", steps=2000, checkpoint_every=100, metrics_every=100, backend="reference")
    with open(tmp_path / "driver.out", "w") as out, open(tmp_path / "driver.err", "w") as err:
        proc = subprocess.Popen([*cli_command(), "sweep", "run", str(f), "--root", str(tmp_path / "sweeps"), "-q"],
                                cwd=tmp_path, stdout=out, stderr=err, env=env)
    pids: set[int] = set()
    try:
        wait_for(sweep_dir(tmp_path), lambda e: e["event"] == "progress", timeout=240, proc=proc)
        pids = descendants(proc.pid)
        before = listening(pids)
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=60)
    assert before and all(is_loopback(s.address) for s in before), before
    deadline = time.monotonic() + 120
    while (left := listening(pids)) and time.monotonic() < deadline:
        assert all(is_loopback(s.address) for s in left), left
        time.sleep(1)
    for pid in pids if left else ():  # whatever did not exit (a failure) is ended here, not left behind
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    assert not left, f"still listening two minutes after the driver was killed: {left}"
