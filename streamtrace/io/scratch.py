"""Temporary files: a full or failing disk says where more room can come from."""
from __future__ import annotations

import errno
import mmap
import os
import tempfile
import weakref
from contextlib import contextmanager
from typing import IO, Iterator

import numpy as np

from ..errors import TraceError, TransferError

PARKED_BYTES = 1 << 20  # arrays park_arrays moves to a file from this size on
_MAPS: list[weakref.ref] = []  # the maps mapped_array made that may still be in use


def mapped_array(file: IO[bytes], dtype: np.dtype | str) -> np.ndarray:
    """A read-only array over a map of ``file`` (a plain array: a memmap's own indexing costs ~10x a plain
    array's), whose resident pages :func:`release_mapped_pages` can give back; the map holds the file."""
    mapping = mmap.mmap(file.fileno(), 0, access=mmap.ACCESS_READ)
    _MAPS[:] = [ref for ref in _MAPS if ref() is not None]
    _MAPS.append(weakref.ref(mapping))
    return np.frombuffer(mapping, dtype=dtype)


def release_mapped_pages(above: int = 0) -> None:
    """Take the pages of every map :func:`mapped_array` made out of this process's resident set, once the
    file pages it holds exceed ``above`` bytes (cheap to ask: work may call it every block): they stay in
    the page cache and fault back in when read again, so work done in stages or blocks counts in its
    resident set only the mapped columns it reads now, not all it has read."""
    if above and _file_pages_resident() * mmap.PAGESIZE <= above:
        return
    for ref in _MAPS:
        mapping = ref()
        if mapping is not None and hasattr(mapping, "madvise"):  # (no madvise: the pages stay, as before)
            mapping.madvise(mmap.MADV_DONTNEED)


def _file_pages_resident() -> int:
    """This process's resident file-backed pages (Linux; elsewhere as if many)."""
    try:
        with open("/proc/self/statm", "rb") as statm:
            return int(statm.read().split()[2])
    except (OSError, IndexError, ValueError):
        return 1 << 40


def park_arrays(holder: object, directory: str | None) -> None:
    """Move the large one-dimensional arrays among ``holder``'s attributes into mapped temporary files
    (read-only from then on), so that work done in stages holds in its resident set only the parts the
    current stage reads (with :func:`release_mapped_pages` between the stages)."""
    for name, value in list(vars(holder).items()):
        if isinstance(value, np.ndarray) and value.ndim == 1 and value.nbytes >= PARKED_BYTES and not is_mapped(value):
            with spool_writes(directory or tempfile.gettempdir()), \
                    tempfile.TemporaryFile(prefix="streamtrace-parked-", dir=directory) as file:
                value.tofile(file)
                file.flush()
                setattr(holder, name, mapped_array(file, value.dtype))


def is_mapped(array: np.ndarray) -> bool:
    """Whether ``array``'s values are in a map (of :func:`mapped_array`, or numpy's memmap)."""
    base = array
    while isinstance(base, np.ndarray):
        base = base.base
    return isinstance(base.obj if isinstance(base, memoryview) else base, mmap.mmap)


def check_local_spool_dir(spool_dir: str | None) -> None:
    """Refuse a ``--spool-dir`` a run on this machine cannot keep files in,
    before anything is read (a temporary file's own error names a file that
    was never made)."""
    if spool_dir is None:
        return
    if "://" in spool_dir:
        raise TraceError(f"--spool-dir {spool_dir}: a bucket holds the spool of --dask runs only (merge, analyze); "
                         "here give a local directory")
    if not os.path.isdir(spool_dir):
        raise TraceError(f"--spool-dir {spool_dir}: no such directory")


@contextmanager
def spool_writes(path: str) -> Iterator[None]:
    """Writing a spool file: a full or failing disk is one line naming the
    file, and says where more room can come from."""
    try:
        yield
    except OSError as exc:
        if exc.errno in (errno.ENOSPC, errno.EDQUOT):
            raise TransferError("disk full while writing a temporary file; give --spool-dir a directory on a "
                             "filesystem with room", path=path) from None
        raise TransferError(f"cannot write a temporary file: {exc.strerror or exc}", path=path) from None
