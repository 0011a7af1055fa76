"""Joining partial indexes that workers built over ranges of events.

A worker numbers the streams, labels and other keys it meets in the order
it meets them; the joined index has its own numbering.  These helpers carry
a part's arrays over at C speed: ids through the worker's id map, event
indexes by the part's first event.
"""
from __future__ import annotations

from array import array

import numpy as np


def translated(local: array, id_map: array) -> np.ndarray:
    """``local`` ids as the joined index numbers them (``id_map[local id]``);
    negative values (none, or a code that is not an id) stay as they are."""
    ids = np.frombuffer(local, dtype=local.typecode).astype(np.int64)
    lookup = np.frombuffer(id_map, dtype=id_map.typecode)
    if not len(lookup):
        return ids
    return np.where(ids >= 0, lookup[np.clip(ids, 0, len(lookup) - 1)], ids)


def extend_converted(target: array, values: np.ndarray) -> None:
    """Append ``values`` to ``target`` in ``target``'s own type (in place:
    closures holding ``target.append`` stay valid)."""
    target.frombytes(values.astype(target.typecode, copy=False).tobytes())


def shifted(local: array, offset: int) -> np.ndarray:
    """Event indexes of a part as indexes of the whole trace."""
    return np.frombuffer(local, dtype=local.typecode) + offset
