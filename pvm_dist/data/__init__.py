"""Frame sources. Every source is random-access: ``frames(step)`` gives the [n_seq, D, D, C] uint8
BGR batch for that step, so a resumed run sees exactly the frames it would have seen."""

from pvm_dist.data.synthetic import FrameSource, make_source

__all__ = ["FrameSource", "make_source"]
