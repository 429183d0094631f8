"""Reconnect backoff: whether the tracker answers, and when to try again when it does not (1 s doubling to
60 s), so a dead tracker costs a retry a minute at most and a recovered one is used again soon."""

from __future__ import annotations

import time

MIN_BACKOFF_S = 1.0
MAX_BACKOFF_S = 60.0


class Backoff:
    """Outage state of one tracker. Changed by one thread at a time (the delivery thread, or its starter
    before the thread runs); ``ok`` and ``outages`` may be read from any thread."""

    def __init__(self) -> None:
        self.ok = True
        self.outages = 0  # how many outages were seen
        self._delay = MIN_BACKOFF_S
        self._retry_at = 0.0

    def due(self) -> bool:
        """True when the next retry is due (always, outside an outage)."""
        return time.monotonic() >= self._retry_at

    def failed(self) -> bool:
        """Record a failed attempt and schedule the next; True when it starts a new outage."""
        first = self.ok
        self.ok = False
        self._retry_at = time.monotonic() + self._delay
        self._delay = min(self._delay * 2, MAX_BACKOFF_S)
        if first:
            self.outages += 1
        return first

    def recovered(self) -> bool:
        """Record a successful attempt; True when it ends an outage."""
        if self.ok:
            return False
        self.ok = True
        self._delay = MIN_BACKOFF_S
        return True
