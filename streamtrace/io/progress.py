"""Progress lines on stderr, only when a person is watching a terminal."""
from __future__ import annotations

import sys
import time
from typing import TextIO

INTERVAL = 0.5


class Progress:
    """Prints ``pass 1: 1.2 of 3.4 GB (35%), 410k events/s`` at most twice a second."""

    def __init__(self, total_bytes: int | None = None, *, enabled: bool | None = None, stream: TextIO | None = None) -> None:
        self.stream = stream or sys.stderr
        self.enabled = self.stream.isatty() if enabled is None else enabled
        self.total_bytes = total_bytes
        self._start = time.monotonic()
        self._next = self._start + INTERVAL
        self._shown = False

    def update(self, label: str, done_bytes: int | None, events: int) -> None:
        """Show progress; ``done_bytes`` None when only events are counted (pass 2)."""
        if not self.enabled:
            return
        now = time.monotonic()
        if now < self._next:
            return
        self._next = now + INTERVAL
        rate = events / max(now - self._start, 1e-9)
        if done_bytes is None:
            amount = "writing"
        elif self.total_bytes:
            amount = f"{done_bytes / 1e9:.2f} of {self.total_bytes / 1e9:.2f} GB ({100 * done_bytes / self.total_bytes:.0f}%)"
        else:
            amount = f"{done_bytes / 1e9:.2f} GB"
        self.stream.write(f"\r{label}: {amount}, {events:,} events, {rate / 1000:.0f}k events/s   ")
        self.stream.flush()
        self._shown = True

    def count(self, label: str, done: int, total: int) -> None:
        """Show ``label: done/total`` (tasks finished), the last one always."""
        if not self.enabled or (done < total and time.monotonic() < self._next):
            return
        self._next = time.monotonic() + INTERVAL
        self.stream.write(f"\r{label}: {done:,}/{total:,}   ")
        self.stream.flush()
        self._shown = True

    def done(self) -> None:
        if self._shown:
            self.stream.write("\r" + " " * 79 + "\r")
            self.stream.flush()
            self._shown = False
