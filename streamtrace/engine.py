"""The two-pass engine every command runs on.

A command is an index visitor (pass 1: sees each event once, keeps compact
typed-array indexes) plus, when it rewrites the trace, an emit plan (pass 2:
patches, drops or keeps each event line and appends new events).  The engine
owns the loops, the rereading when the fast parser meets odd input, the
event spool between the passes, and cleanup.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable, Iterable, Protocol, TypeVar

from .errors import RobustModeNeeded, TraceError
from .jsonscan import RawMember
from .progress import Progress
from .reader import ReadMode, ReadStats, TraceReader, dumps_event, warn_if_slow_backend
from .sink import OutputTarget
from .source import InputSource
from .spool import EventSpool
from .writer import TraceWriter

T = TypeVar("T")
EMIT_PROGRESS_EVERY = 65536


class Visitor(Protocol):
    def visit(self, event: dict) -> None: ...


class EmitPlan:
    """Pass 2 decisions; the defaults copy the trace unchanged.

    A plan either overrides :meth:`patch` (called for every event), or sets
    ``actions`` (one byte per event, 0 = copy unchanged) and overrides
    :meth:`patch_action`, which is called only for the non-zero events.
    """

    actions: bytearray | None = None

    def header(self, members: list[RawMember]) -> list[RawMember]:
        return members

    def patch(self, index: int, line: bytes) -> bytes | None:
        """The line to write for event ``index``, or None to drop it."""
        return line

    def patch_action(self, action: int, line: bytes) -> bytes | None:
        """The line to write for an event whose action byte is ``action``."""
        raise NotImplementedError

    def appended(self) -> Iterable[bytes]:
        """Event lines to add before the array closes."""
        return ()

    def trailer(self, members: list[RawMember]) -> list[RawMember]:
        return members


def _combine(current: ReadMode, wanted: ReadMode) -> ReadMode:
    return ReadMode(
        exact_numbers=current.exact_numbers or wanted.exact_numbers,
        repair_strings=current.repair_strings or wanted.repair_strings,
    )


def read_with_retries(
    source: InputSource,
    attempt: Callable[[TraceReader], T],
    *,
    salvage: bool = False,
    progress: Progress | None = None,
    label: str = "pass 1",
) -> T:
    """Run ``attempt`` over a reading; reread in a stricter mode when asked to.

    ``attempt`` must start from scratch each time: the engine may call it up
    to three times (fast, exact numbers, string repair).
    """
    warn_if_slow_backend()
    mode = ReadMode()
    tick = None
    if progress is not None:
        tick = lambda reader: progress.update(label, reader.raw_bytes_read, reader.stats.events)  # noqa: E731
    while True:
        reader = TraceReader(source.open(), mode, salvage=salvage, on_chunk=tick)
        try:
            return attempt(reader)
        except RobustModeNeeded as need:
            mode = _combine(mode, need.args[0])
        except TraceError as exc:
            raise exc.located(source.name)
        finally:
            if progress is not None:
                progress.done()


@dataclass
class IndexResult:
    """What pass 1 leaves for the rest of a command."""

    visitor: Visitor
    stats: ReadStats
    seconds: float
    spool: EventSpool | None = field(default=None, repr=False)


def index_pass(
    source: InputSource,
    make_visitor: Callable[[], Visitor],
    *,
    keep_events: bool,
    spool_dir: str | None = None,
    salvage: bool = False,
    progress: Progress | None = None,
) -> IndexResult:
    """Pass 1: visit every event; spool the event lines when pass 2 follows.

    On failure the spool is deleted; on success the caller owns it (see
    :func:`emit_pass`, which deletes it).
    """
    started = time.perf_counter()
    spool = EventSpool(spool_dir) if keep_events else None

    def attempt(reader: TraceReader) -> tuple[Visitor, ReadStats]:
        visitor = make_visitor()
        visit = visitor.visit
        if spool is None:
            for event in reader.events():
                visit(event)
        else:
            spool.reset()
            add = spool.add
            for event in reader.events():
                visit(event)
                add(dumps_event(event))
        return visitor, reader.stats

    try:
        visitor, stats = read_with_retries(source, attempt, salvage=salvage, progress=progress)
    except BaseException:
        if spool is not None:
            spool.close()
        raise
    return IndexResult(visitor, stats, time.perf_counter() - started, spool)


def emit_pass(result: IndexResult, plan: EmitPlan, target: OutputTarget, *, progress: Progress | None = None) -> int:
    """Pass 2: stream the spooled events through ``plan`` into ``target``.

    Returns the number of events written.  Always deletes the spool.
    """
    spool = result.spool
    if spool is None:
        raise ValueError("emit_pass needs an index pass run with keep_events=True")
    try:
        with target.open() as out:
            writer = TraceWriter(out, plan.header(result.stats.header))
            write = writer.event
            if plan.actions is None:
                patch = plan.patch
                for index, line in enumerate(spool.read_lines()):
                    new = patch(index, line)
                    if new is not None:
                        write(new)
                    if progress is not None and index % EMIT_PROGRESS_EVERY == 0:
                        progress.update("pass 2", None, index)
            else:
                patch_action = plan.patch_action
                for index, (line, action) in enumerate(zip(spool.read_lines(), plan.actions)):
                    if action:
                        line = patch_action(action, line)
                        if line is None:
                            continue
                    write(line)
                    if progress is not None and index % EMIT_PROGRESS_EVERY == 0:
                        progress.update("pass 2", None, index)
            for line in plan.appended():
                write(line)
            writer.close(plan.trailer(result.stats.trailer))
            return writer.events_written
    finally:
        spool.close()
        if progress is not None:
            progress.done()
