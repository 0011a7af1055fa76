"""Temporary files: a full or failing disk says where more room can come from."""
from __future__ import annotations

import errno
import os
from contextlib import contextmanager
from typing import Iterator

from ..errors import TraceError, TransferError


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
