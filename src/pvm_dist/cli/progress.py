"""How ``train`` and ``eval`` show their progress.

``train``: a live bar on a terminal, plain log lines everywhere else. Under nohup, Slurm or a CI job log
a live bar prints nothing until the end, so off a terminal the progress is a plain line (step, speed,
error against both baselines, ETA) at most every ``every`` seconds, flushed at once, and one at the last
step. ``eval``: plain lines on stderr (stdout keeps its report or ``--json``), only once it has run
``every`` seconds: a short eval prints none.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, TextIO

LOG_EVERY_S = 10.0  # default seconds between plain progress lines


def error_text(p: Any) -> str:
    """The error as shown: pixel RMSE, then the MSE ratio to each baseline (the units said)."""
    if p.error is None:
        return "–"
    ratios = [f"{r:.2f}× {name}" for r, name in ((p.ratio, "copy-last"), (p.ratio_background, "background"))
              if r is not None]
    return f"{p.error:.2f} px RMSE" + (f" (MSE {', '.join(ratios)})" if ratios else "")


def _clock(seconds: float) -> str:
    s = int(max(seconds, 0))
    return f"{s // 3600}:{s // 60 % 60:02d}:{s % 60:02d}"


class _MeanRate:
    """Steps a second since the first report (the engine's start-up, before it, is left out), as the last report's
    rate: the last interval alone holds the animation's host steps (2,479 steps/s shown for a run at 17,226)."""

    def __init__(self) -> None:
        self.origin: tuple[float, int] | None = None  # (time, step) of the first report

    def see(self, now: float, step: int) -> None:
        if self.origin is None:
            self.origin = (now, step)

    def since_first(self, now: float, step: int) -> float | None:
        t0, s0 = self.origin or (now, step)
        return (step - s0) / (now - t0) if step > s0 and now > t0 else None


class LogLines:
    """Plain progress lines on ``stream``, at most every ``every`` seconds (and at the last step)."""

    def __init__(self, name: str, every: float, stream: TextIO | None = None) -> None:
        self.name, self.every, self.stream = name, every, stream or sys.stdout
        self._rate = _MeanRate()
        self._last_line = -float("inf")

    def __call__(self, p: Any) -> None:
        now = time.monotonic()
        if now - self._last_line < self.every and p.step < p.steps:
            return
        self._last_line = now
        self._rate.see(now, p.step)
        # From the wall clock since the first report (pictures, checkpoints included). The first report's own
        # interval holds the start-up (on a GPU, 1,000 steps at 454 steps/s for a run then at 23,000): no ETA from it.
        mean = self._rate.since_first(now, p.step)
        rate, frames, marked = p.steps_per_s, p.frames_per_s, ""
        if p.step >= p.steps:
            eta = _clock(0)
            if mean is not None:
                rate, marked = mean, " (mean)"
                frames = mean * (p.frames_per_s / p.steps_per_s if p.steps_per_s else 1.0)
        else:
            eta = "–" if mean is None else _clock((p.steps - p.step) / mean)
        print(f"{self.name} step {p.step:,}/{p.steps:,} ({100 * p.step / p.steps:.0f}%)  {rate:,.0f} steps/s  "
              f"{frames:,.0f} frames/s{marked}  err {error_text(p)}  ETA {eta}", file=self.stream, flush=True)


class EvalLines:
    """``eval``'s progress, called with (steps run, steps in all): a line on ``stream`` (default stderr) at most
    every ``every`` seconds, timed from the first call (the engine's start-up is not in the rate or the ETA)."""

    def __init__(self, every: float | None = None, stream: TextIO | None = None) -> None:
        self.every, self.stream = LOG_EVERY_S if every is None else every, stream or sys.stderr
        self._rate = _MeanRate()
        self._last_line = 0.0  # (set at the first call)

    def __call__(self, done: int, total: int) -> None:
        now = time.monotonic()
        if self._rate.origin is None:
            self._rate.see(now, done)
            self._last_line = now
            return
        rate = self._rate.since_first(now, done)
        if now - self._last_line < self.every or done >= total or rate is None:
            return
        self._last_line = now
        print(f"eval step {done:,}/{total:,} ({100 * done / total:.0f}%)  {rate:,.0f} steps/s  "
              f"ETA {_clock((total - done) / rate)}", file=self.stream, flush=True)


@contextmanager
def progress_reporter(name: str, steps: int, first_step: int, log_every: float | None) -> Iterator[Callable[[Any], None]]:
    """The progress callback for a run of ``name`` to ``steps``: a rich bar on a terminal, else :class:`LogLines`
    (``log_every`` seconds apart; given, it forces log lines on a terminal too)."""
    if log_every is not None or not sys.stdout.isatty():
        yield LogLines(name, LOG_EVERY_S if log_every is None else log_every)
        return
    from rich.progress import BarColumn, Progress, TextColumn, TimeRemainingColumn

    columns = [TextColumn("[bold]{task.description}"), BarColumn(), TextColumn("step {task.completed:,.0f}/{task.total:,.0f}"),
               TextColumn("{task.fields[rate]}"), TextColumn("err {task.fields[err]}"), TimeRemainingColumn()]
    with Progress(*columns, transient=False) as bar:
        task = bar.add_task(name, total=steps, completed=first_step, rate="", err="–")

        rate = _MeanRate()

        def update(p: Any) -> None:
            now = time.monotonic()
            rate.see(now, p.step)
            mean = rate.since_first(now, p.step) if p.step >= p.steps else None
            shown = f"{p.steps_per_s:,.0f} steps/s" if mean is None else f"{mean:,.0f} steps/s (mean)"
            bar.update(task, completed=p.step, rate=shown, err=error_text(p))

        yield update
