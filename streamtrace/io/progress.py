"""Progress on stderr: a bar on a terminal, a line every 10 s in a log or a pipe."""
from __future__ import annotations

import sys
import time
from typing import Protocol, TextIO, Union

BAR_INTERVAL = 0.5
LINE_INTERVAL = 10.0
Wanted = Union[bool, str, None]
"""What a command's ``progress`` keyword takes: None (the library's default)
a bar when stderr is a terminal and nothing elsewhere; True a bar whatever
stderr is; ``"lines"`` a line every :data:`LINE_INTERVAL` seconds (the
command line's default when stderr is not a terminal); False nothing."""


class Meter(Protocol):
    """What a pass reports its progress to: a :class:`Progress`, or one task's part of one."""

    def update(self, label: str, done_bytes: int | None, events: int, total_events: int | None = None) -> None: ...

    def done(self) -> None: ...


class Progress:
    """Shows ``pass 1: 1.20 of 3.40 GB (35%), 5,123,456 events, 95.2 MB/s, 410k events/s, 12 s left``.

    Rates and time left are those of the current label's work (a new pass
    starts them afresh, from its own first update)."""

    def __init__(self, total_bytes: int | None = None, *, enabled: Wanted = None, stream: TextIO | None = None) -> None:
        self.stream = stream or sys.stderr
        if enabled is None:
            enabled = self.stream.isatty()
        self.mode = "bar" if enabled is True else "lines" if enabled == "lines" else None
        self.interval = LINE_INTERVAL if self.mode == "lines" else BAR_INTERVAL
        self.total_bytes = total_bytes
        self._label: str | None = None
        self._start = time.monotonic()
        self._next = self._start + self.interval
        self._from = (0, 0)  # bytes and events where the current label's work began
        self._shown = False  # a bar is on the screen
        self._lines_shown = False
        self._counted: set[str] = set()  # labels whose last task was shown

    def update(self, label: str, done_bytes: int | None, events: int, total_events: int | None = None, *,
               note: str = "") -> None:
        """Show progress; ``done_bytes`` None when only events are counted
        (pass 2, out of ``total_events`` when known); ``note`` is added at
        the end (``ranks indexed: 1/4``)."""
        if self.mode is None:
            return
        now = time.monotonic()
        if label != self._label:
            if self._label is not None:  # a later pass: its rates start now (the first one's when the meter was made)
                self._start, self._from = now, (done_bytes or 0, events)
                self._next = max(self._next, now + min(self.interval, 1.0))  # a rate needs some time behind it
            self._label = label
        if now < self._next:
            return
        self._next = now + self.interval
        elapsed = max(now - self._start, 1e-6)
        events_rate = f"{_rate((events - self._from[1]) / elapsed)} events/s"
        fraction = None
        if done_bytes is None:
            amount = f"{events:,} events"
            if total_events:
                fraction = events / total_events
                amount = f"{_percent(fraction)} of {total_events:,} events"
            parts = [amount, events_rate]
        else:
            bytes_rate = f"{_size(max(done_bytes - self._from[0], 0) / elapsed)}/s"
            if self.total_bytes:
                fraction = min(done_bytes / self.total_bytes, 1.0)
                amount = f"{_size_of(done_bytes, self.total_bytes)} ({_percent(fraction)})"
            else:
                amount = _size(done_bytes)
            parts = [amount, f"{events:,} events", bytes_rate, events_rate]
        if fraction is not None:
            done_here = (fraction - self._from[0] / self.total_bytes if done_bytes is not None
                         else fraction - self._from[1] / total_events)  # the part the rate was measured on
            if done_here > 0:
                parts.append(f"{_duration(elapsed * (1 - fraction) / done_here)} left")
        self._show(f"{label}: {', '.join(parts)}" + (f"; {note}" if note else ""))

    def count(self, label: str, done: int, total: int) -> None:
        """Show ``label: done/total`` (tasks finished), the last one always
        (in a log only when the run has shown lines before: a quick run stays quiet)."""
        if self.mode is None or label in self._counted:
            return
        now = time.monotonic()
        if done < total and now < self._next:
            return
        if done == total:
            self._counted.add(label)
            if self.mode == "lines" and not self._lines_shown:
                return
        self._next = now + self.interval
        self._show(f"{label}: {done:,}/{total:,}")

    def done(self) -> None:
        """Clear the bar (lines in a log stay)."""
        if self._shown:
            self.stream.write("\r" + " " * 79 + "\r")
            self.stream.flush()
            self._shown = False

    def _show(self, text: str) -> None:
        if self.mode == "lines":
            self.stream.write(f"streamtrace: {text}\n")
            self._lines_shown = True
        else:
            self.stream.write(f"\r{text}   ")
            self._shown = True
        self.stream.flush()


class Share:
    """One task's part of a run's :class:`Progress`: the task's counts, offset
    by what the tasks before it did, shown against the run's totals (``merge``
    writing its ranks one after the other in this process)."""

    def __init__(self, meter: Progress, bytes_before: int, events_before: int, total_events: int | None,
                 note: str) -> None:
        self.meter, self.bytes_before, self.events_before = meter, bytes_before, events_before
        self.total_events, self.note = total_events, note

    def update(self, label: str, done_bytes: int | None, events: int, total_events: int | None = None) -> None:
        self.meter.update(label, None if done_bytes is None else self.bytes_before + done_bytes,
                          self.events_before + events, self.total_events, note=self.note)

    def done(self) -> None:
        """The task's end is not the run's: the bar stays."""


def _percent(fraction: float) -> str:
    return f"{100 * fraction:.0f}%"


def _unit(count: float) -> tuple[str, float, int]:
    """The unit a byte count reads best in, its scale and its decimals (powers of 10, as file sizes are shown)."""
    return ("GB", 1e9, 2) if count >= 1e9 else ("MB", 1e6, 1) if count >= 1e6 else ("kB", 1e3, 0)


def _size(count: float) -> str:
    """``812 kB``, ``3.4 MB``, ``1.20 GB``."""
    unit, scale, digits = _unit(count)
    return f"{count / scale:.{digits}f} {unit}"


def _size_of(done: int, total: int) -> str:
    """``0.4 of 42.0 MB``: both in the total's unit."""
    unit, scale, digits = _unit(total)
    return f"{done / scale:.{digits}f} of {total / scale:.{digits}f} {unit}"


def _rate(per_second: float) -> str:
    """``850``, ``41k``, ``1.2M``."""
    if per_second >= 1e6:
        return f"{per_second / 1e6:.1f}M"
    if per_second >= 1e4:
        return f"{per_second / 1e3:.0f}k"
    return f"{per_second:,.0f}"


def _duration(seconds: float) -> str:
    """``42 s``, ``3 min 5 s``, ``2 h 10 min``."""
    seconds = round(seconds)
    if seconds < 60:
        return f"{seconds} s"
    if seconds < 3600:
        return f"{seconds // 60} min {seconds % 60} s"
    return f"{seconds // 3600} h {seconds % 3600 // 60} min"
