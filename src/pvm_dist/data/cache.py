"""A bounded LRU cache of decoded, already resized uint8 frame chunks.

File sources decode frames in chunks of ``CHUNK`` consecutive frames of one file and keep them here. The
total size of the kept arrays never exceeds the budget (default 1 GiB): putting a chunk evicts the least
recently used ones first, and an evicted chunk is decoded again when it is next asked for. Decoding is
deterministic, so a re-decoded chunk is identical to the evicted one. Kept arrays are read-only.

Give it room for at least ``n_seq`` chunks (n_seq × 32 frames; 60×60×3 frames: 346 KB a chunk): below
that, the streams evict each other's chunks and every step decodes whole chunks again (correct, but slow).
The cache, like the sources, is meant for one thread.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Hashable

import numpy as np

DEFAULT_CACHE_BYTES = 1 << 30
CHUNK = 32


class FrameCache:
    """LRU map from a key (file index, chunk index) to a uint8 array, bounded by ``budget`` bytes."""

    def __init__(self, budget: int | None = None) -> None:
        self.budget = DEFAULT_CACHE_BYTES if budget is None else int(budget)
        if self.budget < 0:
            raise ValueError(f"cache budget must be >= 0 bytes, got {budget}")
        self._items: OrderedDict[Hashable, np.ndarray] = OrderedDict()
        self.bytes = 0
        self.hits = self.misses = self.evictions = 0

    def __len__(self) -> int:
        return len(self._items)

    def __contains__(self, key: Hashable) -> bool:
        return key in self._items

    def get(self, key: Hashable, load: Callable[[], np.ndarray]) -> np.ndarray:
        """The kept array for ``key`` (now the most recently used), else ``load()``, kept if it fits."""
        arr = self._items.get(key)
        if arr is not None:
            self._items.move_to_end(key)
            self.hits += 1
            return arr
        self.misses += 1
        arr = load()
        self.put(key, arr)
        return arr

    def put(self, key: Hashable, arr: np.ndarray) -> None:
        """Keep ``arr`` under ``key``, evicting least recently used chunks to stay within the budget.

        An array larger than the whole budget is not kept (the caller still has it).
        """
        arr.setflags(write=False)
        old = self._items.pop(key, None)
        if old is not None:
            self.bytes -= old.nbytes
        if arr.nbytes > self.budget:
            return
        while self._items and self.bytes + arr.nbytes > self.budget:
            _, dropped = self._items.popitem(last=False)
            self.bytes -= dropped.nbytes
            self.evictions += 1
        self._items[key] = arr
        self.bytes += arr.nbytes

    def stats(self) -> dict[str, int]:
        return {"budget": self.budget, "bytes": self.bytes, "chunks": len(self._items), "hits": self.hits,
                "misses": self.misses, "evictions": self.evictions}
