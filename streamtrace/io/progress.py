"""Progress lines on stderr, only when a person is watching a terminal."""
from __future__ import annotations

import sys
import time
from typing import TextIO

INTERVAL = 0.5


class Progress:
    """Prints ``pass 1: 1.2 of 3.4 GB (35%), 410k events/s, 12 s left`` at most twice a second."""

    def __init__(self, total_bytes: int | None = None, *, enabled: bool | None = None, stream: TextIO | None = None) -> None:
        self.stream = stream or sys.stderr
        self.enabled = self.stream.isatty() if enabled is None else enabled
        self.total_bytes = total_bytes
        self._label = ""
        self._start = time.monotonic()  # of the current label's work: rates and time left are per pass
        self._next = self._start + INTERVAL
        self._shown = False

    def update(self, label: str, done_bytes: int | None, events: int, total_events: int | None = None) -> None:
        """Show progress; ``done_bytes`` None when only events are counted (pass 2,
        out of ``total_events`` when known)."""
        if not self.enabled:
            return
        now = time.monotonic()
        if label != self._label:
            self._label, self._start = label, now
        if now < self._next:
            return
        self._next = now + INTERVAL
        elapsed = max(now - self._start, 1e-9)
        fraction = None
        if done_bytes is None:
            amount = f"{events:,} events"
            if total_events:
                fraction = events / total_events
                amount = f"{100 * fraction:.0f}% of {total_events:,} events"
        elif self.total_bytes:
            fraction = done_bytes / self.total_bytes
            amount = f"{done_bytes / 1e9:.2f} of {self.total_bytes / 1e9:.2f} GB ({100 * fraction:.0f}%), {events:,} events"
        else:
            amount = f"{done_bytes / 1e9:.2f} GB, {events:,} events"
        left = f", {_duration(elapsed * (1 - fraction) / fraction)} left" if fraction else ""
        self.stream.write(f"\r{label}: {amount}, {events / elapsed / 1000:.0f}k events/s{left}   ")
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


def _duration(seconds: float) -> str:
    """``42 s``, ``3 min 5 s``, ``2 h 10 min``."""
    seconds = round(seconds)
    if seconds < 60:
        return f"{seconds} s"
    if seconds < 3600:
        return f"{seconds // 60} min {seconds % 60} s"
    return f"{seconds // 3600} h {seconds % 3600 // 60} min"
