"""Stop a long loop cleanly on Ctrl-C: SIGINT/SIGTERM raise a flag the loop checks between steps.

Training and the sweep driver both use it, so a signal never lands mid-write (a checkpoint, the
journal): the loop sees the flag, saves what it has and returns. SIGHUP (the terminal or SSH session
closed) does the same, unless it is ignored (``nohup``): it used to end the process where it stood.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any


@contextmanager
def stop_on_signals() -> Iterator[Callable[[], bool]]:
    """Turn SIGINT/SIGTERM (and SIGHUP, where it is not ignored) into a flag; restore the handlers afterwards.

    Outside the main thread, where Python cannot set handlers, the flag never rises.
    """
    stop = {"flag": False}

    def handler(signum: int, frame: Any) -> None:
        stop["flag"] = True

    previous = {}
    if threading.current_thread() is threading.main_thread():
        hangup = getattr(signal, "SIGHUP", None)  # not on Windows
        watched = [signal.SIGINT, signal.SIGTERM]
        if hangup is not None and signal.getsignal(hangup) is not signal.SIG_IGN:
            watched.append(hangup)
        previous = {sig: signal.signal(sig, handler) for sig in watched}
    try:
        yield lambda: stop["flag"]
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)
