"""User-facing failures.

Every failure the user can cause (bad input, refused output, a full disk)
is a :class:`TraceError`: the CLI prints it as one line naming the file and
the position, and exits with status 1 instead of showing a traceback.
"""
from __future__ import annotations

INTERRUPTED = "streamtrace: interrupted; no output written"
"""The one line the command line prints when its user stops it (exit 128 + the signal)."""


class TraceError(Exception):
    """A failure to report in one line: ``file: where: what``."""

    def __init__(
        self,
        message: str,
        *,
        path: str | None = None,
        event_index: int | None = None,
        byte_offset: int | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.path = path
        self.event_index = event_index
        self.byte_offset = byte_offset

    def located(self, path: str) -> "TraceError":
        """Name the file when the raiser did not know it."""
        if self.path is None:
            self.path = path
        return self

    def __str__(self) -> str:
        where = []
        if self.event_index is not None:
            where.append(f"event {self.event_index}")
        if self.byte_offset is not None:
            where.append(f"byte {self.byte_offset}")
        parts = [p for p in (self.path, ", ".join(where)) if p]
        return ": ".join(parts + [self.message])


class TransferError(TraceError):
    """Moving the bytes failed (a download, a temporary file), not reading
    them: the message names the URL or file, and no position in the trace."""


class RobustModeNeeded(Exception):
    """Raised inside a read when the fast parser met input it cannot take.

    The engine rereads the input from the start in the exact, repairing mode.
    Never reaches the user.
    """
