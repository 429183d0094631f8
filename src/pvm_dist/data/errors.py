"""The one error every data source raises for bad user data."""

from __future__ import annotations

from pathlib import Path


class DataError(ValueError):
    """A missing, unreadable, empty or corrupt data file, or a data string that names nothing.

    The message is one line and names the file (or data string) and the problem, so a command line can
    print it as it is.
    """


def data_error(path: str | Path, problem: str) -> DataError:
    """``DataError("<path>: <problem>")`` with any newline in the problem folded into the one line."""
    return DataError(f"{path}: {' '.join(str(problem).split())}")


def recorded_data_error(exc: DataError, recorded: str) -> DataError:
    """``exc`` saying where its data came from, when that is the data a checkpoint records (given by no --data):
    the data may have moved since the run. Unchanged if it names none of ``recorded``'s parts (held-out data)."""
    message = str(exc)
    if any(part.strip() and part.strip() in message for part in recorded.split(",")):
        return DataError(f"{message} (the data the checkpoint records; if it moved, give its new place with --data)")
    return exc


def opencv_path(path: str | Path) -> str:
    """``path`` as a string OpenCV may be given. OpenCV crashes the interpreter on a string that is not valid
    UTF-8 (a file name of undecodable bytes arrives as lone surrogates), so such a name is a DataError."""
    text = str(path)
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        raise data_error(ascii(text), "the file name is not valid UTF-8, which OpenCV cannot open; rename it") from None
    return text
