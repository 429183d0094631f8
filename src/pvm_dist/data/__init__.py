"""Frame sources. Every source is random-access: ``frames(step)`` gives the [n_seq, D, D, C] uint8
BGR batch for that step (and ``labels``, ``boxes``, ``cuts`` the rest of it), so a resumed run sees exactly
the frames it would have seen. :func:`make_source` turns a data string into a source."""

from pvm_dist.data.errors import DataError
from pvm_dist.data.source import FrameSource, make_source

__all__ = ["DataError", "FrameSource", "make_source"]
