"""A read-only array of strings stored in two NumPy buffers.

# NOTE [ Copy-on-read in DataLoader workers ]
# Forked workers share the parent's memory pages until something writes to them. A Python
# list of str objects is written to on every *read*: touching an element bumps its refcount,
# which dirties the page it lives on, so each worker slowly gets its own copy of the whole
# index and RSS grows with num_workers x dataset size (pytorch/pytorch#13246). Two NumPy
# arrays (one byte buffer, one offsets array) hold no per-item Python objects, so reading
# them copies nothing.
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np


class StringArray:
    """Strings packed as UTF-8 into one uint8 buffer plus int64 offsets.

    >>> a = StringArray(["cat/1.jpg", "dog/2.jpg"])
    >>> len(a), a[1]
    (2, 'dog/2.jpg')
    """

    def __init__(self, strings: Iterable[str]) -> None:
        encoded = [s.encode("utf-8") for s in strings]
        self._offsets = np.zeros(len(encoded) + 1, dtype=np.int64)
        np.cumsum([len(b) for b in encoded], out=self._offsets[1:])
        self._buffer = np.frombuffer(b"".join(encoded), dtype=np.uint8).copy()

    def __len__(self) -> int:
        return len(self._offsets) - 1

    def __getitem__(self, index: int) -> str:
        if not -len(self) <= index < len(self):
            raise IndexError(f"index {index} out of range for {len(self)} strings")
        index %= len(self)
        start, end = self._offsets[index], self._offsets[index + 1]
        return self._buffer[start:end].tobytes().decode("utf-8")
