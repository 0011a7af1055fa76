"""Temporary files: a full or failing disk says where more room can come from."""
from __future__ import annotations

import errno
from contextlib import contextmanager
from typing import Iterator

from ..errors import TransferError


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
