"""Frame sources. Every source is random-access: ``frames(step)`` gives the [n_seq, D, D, C] uint8
BGR batch for that step (and ``labels``, ``boxes``, ``cuts`` the rest of it), so a resumed run sees exactly
the frames it would have seen. ``frames_block(step, k)`` gives k steps at once ([k, n_seq, D, D, C], for a
device-resident dataset), and a source whose ``device_renderable`` is True also draws that block on the GPU
(``frames_block_device``). :func:`make_source` turns a data string into a source."""

from pvm_dist.data.errors import DataError
from pvm_dist.data.loader import make_source
from pvm_dist.data.source import FrameSource

__all__ = ["DataError", "FrameSource", "make_source"]
