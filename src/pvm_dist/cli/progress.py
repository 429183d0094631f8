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


class LogLines:
    """Plain progress lines on ``stream``, at most every ``every`` seconds (and at the last step)."""

    def __init__(self, name: str, every: float, stream: TextIO | None = None) -> None:
        self.name, self.every, self.stream = name, every, stream or sys.stdout
        self._origin: tuple[float, int] | None = None  # (time, step) of the first report: start-up is not in the ETA
        self._last_line = -float("inf")

    def __call__(self, p: Any) -> None:
        now = time.monotonic()
        if now - self._last_line < self.every and p.step < p.steps:
            return
        self._last_line = now
        if self._origin is None:
            self._origin = (now, p.step)
        t0, s0 = self._origin
        # From the wall clock since the first report (pictures, checkpoints included). The first report's own
        # interval holds the start-up (on a GPU, 1,000 steps at 454 steps/s for a run then at 23,000): no ETA from it.
        rate, frames, mean = p.steps_per_s, p.frames_per_s, ""
        if p.step >= p.steps:
            eta = _clock(0)
            if p.step > s0 and now > t0:  # the last interval alone holds the animation's host steps: the mean instead
                rate, mean = (p.step - s0) / (now - t0), " (mean)"
                frames = rate * (p.frames_per_s / p.steps_per_s if p.steps_per_s else 1.0)
        elif p.step > s0 and now > t0:
            eta = _clock((p.steps - p.step) * (now - t0) / (p.step - s0))
        else:
            eta = "–"
        print(f"{self.name} step {p.step:,}/{p.steps:,} ({100 * p.step / p.steps:.0f}%)  {rate:,.0f} steps/s  "
              f"{frames:,.0f} frames/s{mean}  err {error_text(p)}  ETA {eta}", file=self.stream, flush=True)


class EvalLines:
    """``eval``'s progress, called with (steps run, steps in all): a line on ``stream`` (default stderr) at most
    every ``every`` seconds, timed from the first call (the engine's start-up is not in the rate or the ETA)."""

    def __init__(self, every: float | None = None, stream: TextIO | None = None) -> None:
        self.every, self.stream = LOG_EVERY_S if every is None else every, stream or sys.stderr
        self._origin: tuple[float, int] | None = None
        self._last_line = 0.0

    def __call__(self, done: int, total: int) -> None:
        now = time.monotonic()
        if self._origin is None:
            self._origin, self._last_line = (now, done), now
            return
        t0, d0 = self._origin
        if now - self._last_line < self.every or done >= total or done <= d0:
            return
        self._last_line = now
        rate = (done - d0) / (now - t0)
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

        def update(p: Any) -> None:
            bar.update(task, completed=p.step, rate=f"{p.steps_per_s:,.0f} steps/s", err=error_text(p))

        yield update
