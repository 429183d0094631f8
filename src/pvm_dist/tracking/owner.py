"""Which folders a live process is using, across processes, by ``flock`` (the OS drops a lock when its process dies).

A tracker holds a shared lock on the folder its fallback dir sits in (a run folder, a sweep trial's folder) for as
long as it is open; :func:`claim` takes the same lock exclusively, so ``pvm-dist sync`` touches only spools nobody
is writing. A training run holds a lock file in its run folder, and a sweep driver one in its sweep's folder
(:func:`take`), so a second ``train`` into the same folder or a second driver of the same sweep (the resume command
run twice) is refused. Where ``fcntl`` is missing (Windows) every folder counts as free."""

from __future__ import annotations

import contextlib
import errno
import os
from collections.abc import Iterator
from pathlib import Path

LOCK_FILE = ".pvm-dist.lock"  # in a run's or a sweep's folder: held by the process training into it or driving it


class FolderLock:
    """A ``flock`` held on a folder (released by :meth:`release`, or by the OS when the process ends)."""

    def __init__(self, fd: int | None) -> None:
        self._fd = fd

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)  # closing the descriptor drops its lock
            self._fd = None


def _try_flock(fd: int, exclusive: bool) -> bool | None:
    """Lock ``fd`` without waiting: True, False while another process holds it, or None where the file system has no
    flock (some network mounts answer ENOLCK) or no fcntl at all (Windows): there is nothing to hold, which is not a
    folder in use."""
    try:
        import fcntl
    except ImportError:
        return None
    try:
        fcntl.flock(fd, (fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH) | fcntl.LOCK_NB)
    except OSError as exc:
        return False if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES) else None
    return True


def _locked(fd: int, exclusive: bool) -> FolderLock | None:
    """A FolderLock on ``fd`` (closed unless it holds the lock), or None while another process holds it."""
    got = _try_flock(fd, exclusive)
    if got:
        return FolderLock(fd)
    os.close(fd)
    return None if got is False else FolderLock(None)


def _lock(folder: Path, exclusive: bool) -> FolderLock | None:
    try:
        folder.mkdir(parents=True, exist_ok=True)
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return FolderLock(None)
    return _locked(fd, exclusive)


def hold(folder: Path) -> FolderLock:
    """Mark ``folder`` in use by a live tracker (shared: several trackers may hold it)."""
    return _lock(folder, exclusive=False) or FolderLock(None)


def claim(folder: Path) -> FolderLock | None:
    """Take ``folder`` for ourselves, or None while a live tracker (of any process) holds it."""
    return _lock(folder, exclusive=True)


def take(lock_file: Path) -> FolderLock | None:
    """Hold ``lock_file`` (created if need be; its folder must exist) for this process alone, or None while another
    process holds it. The file stays: removing a lock file races with a process about to lock it."""
    return _locked(os.open(lock_file, os.O_RDWR | os.O_CREAT, 0o644), exclusive=True)


@contextlib.contextmanager
def holding(folder: Path, busy: Exception) -> Iterator[None]:
    """Hold ``folder``'s :data:`LOCK_FILE` (:func:`take`) for the block; raise ``busy`` if another process holds it."""
    lock = take(folder / LOCK_FILE)
    if lock is None:
        raise busy
    try:
        yield
    finally:
        lock.release()
