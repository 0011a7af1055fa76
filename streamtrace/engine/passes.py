"""The two-pass engine every command runs on.

A command is an index visitor (pass 1: sees each event once, keeps compact
typed-array indexes) plus, when it rewrites the trace, an emit plan (pass 2:
patches, drops or keeps each event line and appends new events).  The engine
owns the loops, the rereading when the fast parser meets odd input, the
event spool between the passes, and cleanup.
"""
from __future__ import annotations

import time
from contextlib import ExitStack
from dataclasses import dataclass, field
from typing import Callable, Iterable, Protocol, TypeVar

from orjson import loads

from ..algo.secrets import Findings
from ..errors import RobustModeNeeded, TraceError, TransferError
from ..io.eventtext import dumped_batch, loads_spooled, raise_if_container_field
from ..io.progress import Meter
from ..io.reader import ReadMode, ReadStats, TraceReader, warn_if_slow_backend
from ..io.redact import Redactor, copy_redactor, copy_screen
from ..io.scratch import check_local_spool_dir
from ..io.sink import OutputTarget
from ..io.source import InputSource
from ..io.spool import EventSpool
from ..io.writer import TraceWriter
from ..resources import gc_paused
from . import parseproc
from .indexworkers import index_by_ranges
from .parallel import EmitWorkers, can_fork
from .plan import EmitPlan

T = TypeVar("T")
FAST = ReadMode()  # the first reading's mode: floats and 64-bit integers, no string repair
SPOOL_BATCH = 512  # orjson.dumps results keep ~4 KB of capacity each: batch small


class Visitor(Protocol):
    def visit(self, event: dict) -> None: ...


BatchScan = Callable[["bytes | memoryview | None", list, int], None]
"""A visitor's optional ``scan_batch(text, events, first_index)``: called
per batch with the events and their JSON text when it is at hand (one
array, lines, or the input's own text; else None), for checks cheaper on
text than event by event (secret detection).  A visitor that has it may
also have ``screen_batch(text) -> bool``, the scan's cheap first test: when
a parse child reads, the child runs it and the scan is called only for the
batches it flags, so the main process, which runs the visitor, does less."""


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
    progress: Meter | None = None,
    label: str = "pass 1",
    mode: ReadMode = FAST,
) -> T:
    """Run ``attempt`` over a reading in ``mode``; reread in a stricter mode
    when asked to.

    ``attempt`` must start from scratch each time: the engine may call it up
    to three times (fast, exact numbers, string repair).
    """
    warn_if_slow_backend()
    tick = None
    if progress is not None:
        tick = lambda reader: progress.update(label, reader.raw_bytes_read, reader.stats.events)  # noqa: E731

    def run(mode: ReadMode) -> T:
        reader = TraceReader(source.open(), mode, salvage=salvage, on_chunk=tick)
        try:
            return attempt(reader)
        except TraceError as exc:
            raise reader.blame(exc)

    return retrying(source, run, progress, mode)


def retrying(source: InputSource, run: Callable[[ReadMode], T], progress: Meter | None,
             mode: ReadMode = FAST) -> T:
    """Call ``run`` in ``mode`` (by default the fast one), then in stricter
    modes while it asks for them."""
    while True:
        try:
            return run(mode)
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
    secrets: Findings = field(default_factory=Findings)  # in the events and top-level members read (when screened)


@gc_paused()
def index_pass(
    source: InputSource,
    make_visitor: Callable[[], Visitor],
    *,
    keep_events: bool,
    spool_dir: str | None = None,
    salvage: bool = False,
    progress: Meter | None = None,
    jobs: int = 1,
    learn_hosts: bool = False,
) -> IndexResult:
    """Pass 1: visit every event; spool the event lines when pass 2 follows.

    With a large input (or one of unknown size), ``jobs`` worker processes
    (with one job, this process) parse and index ranges of the events when
    the visitor's work splits that way (:mod:`.indexworkers`); otherwise, or when the input
    needs the ordinary reading, parsing (and spooling) of a large local file
    runs in a child process (:mod:`streamtrace.engine.parseproc`) while this
    process indexes.
    On failure the spool is deleted; on success the caller owns it (see
    :func:`emit_pass`, which deletes it).

    When the events are kept for a copy, a secrets screen
    (:func:`~streamtrace.io.redact.copy_screen`) counts the secrets of the
    input in ``secrets``: pass 2 then knows whether what it writes needs
    looking at (:func:`screen_of_copy`).  With ``learn_hosts`` (the copy
    pseudonymizes host names), the screen also learns the host names of the
    input into ``secrets.hosts``, for pass 2 to replace wherever they appear.
    """
    started = time.perf_counter()
    check_local_spool_dir(spool_dir)
    spool = EventSpool(spool_dir) if keep_events else None
    screen = copy_screen(learn_hosts) if keep_events else None

    def attempt(reader: TraceReader) -> tuple[Visitor, ReadStats]:
        visitor = make_visitor()
        visit = visitor.visit
        scan = with_screen(getattr(visitor, "scan_batch", None), screen)
        event = None
        try:
            if spool is None and scan is None:
                for event in reader.events():
                    visit(event)
            else:
                if spool is not None:
                    spool.reset()
                done = 0
                for batch in reader.batches():
                    for event in batch:
                        visit(event)
                    if spool is not None:
                        lines = dumped_batch(batch, done)[1]
                        spool.add_text(lines, len(batch))
                    if scan is not None:
                        scan(lines if spool is not None else reader.batch_text, batch, done)
                    done += len(batch)
        except TypeError:
            raise_if_container_field(event)
            raise
        except TraceError as exc:
            if exc.event_index is None and spool is not None and event is not None \
                    and not isinstance(exc, TransferError):
                exc.event_index = done + next(n for n, seen in enumerate(batch) if seen is event)
            raise
        return visitor, reader.stats

    def attempt_in_child(mode: ReadMode) -> tuple[Visitor, ReadStats]:
        """The same, with parsing and encoding done by a child process."""
        visitor = make_visitor()
        visit = visitor.visit
        scan = with_screen(getattr(visitor, "scan_batch", None), screen)
        first_test = getattr(visitor, "screen_batch", None)  # the scan's cheap first test, run in the child
        if screen is not None:
            first_test = screen.suspicious if first_test is None else _either(first_test, screen)

        visitor_event: list = [None]  # the event being visited, for errors raised on it
        visited = [0]

        # exact mode: orjson alone would round ints beyond 64 bits and refuse huge floats
        decode = loads_spooled if mode.exact_numbers else loads

        def index_batch(batch: memoryview, flagged: bool) -> None:
            events = decode(batch)
            first = visited[0]
            for event in events:
                visitor_event[0] = event
                visited[0] += 1
                visit(event)
            if scan is not None and flagged:
                scan(batch, events, first)

        try:
            return visitor, parseproc.parse_in_child(source, mode, spool, index_batch, salvage=salvage,
                                                     progress=progress, screen=first_test)
        except TypeError:
            raise_if_container_field(visitor_event[0])
            raise
        except TraceError as exc:
            if exc.path is None and exc.event_index is None and visitor_event[0] is not None:
                exc.event_index = visited[0] - 1  # a complaint about the event being visited
            raise

    try:
        ranges, mode = None, FAST
        size = source.size  # (None: a pipe or URL, of unknown size, may be large)
        if not salvage:
            large = size is None or size >= parseproc.MIN_BYTES
            if large:
                warn_if_slow_backend()  # (pipes and URLs too: this process reads, and a reread takes the source's copy)
            workers = jobs if large and can_fork() else 1  # (a small input is not worth a fork)
            try:  # (one process: the same chunks, indexed here, so the output depends neither on jobs nor on size)
                ranges = index_by_ranges(source, make_visitor, spool, workers, progress, screen)
            except RobustModeNeeded as need:  # the ordinary reading starts in the mode the input needs
                mode = need.args[0]
        if ranges is not None:
            visitor, stats = ranges
        elif jobs > 1 and parseproc.available(source):
            visitor, stats = retrying(source, attempt_in_child, progress, mode)
        else:
            visitor, stats = read_with_retries(source, attempt, salvage=salvage, progress=progress, mode=mode)
        if screen is not None:
            screen.members(stats.header + stats.trailer)
        if spool is not None:
            spool.finish()  # its compressor's buffers go before the command's plan takes its memory
    except BaseException:
        if spool is not None:
            spool.close()
        raise
    return IndexResult(visitor, stats, time.perf_counter() - started, spool,
                       Findings() if screen is None else screen.findings)


def with_screen(scan: BatchScan | None, screen: Redactor | None) -> BatchScan | None:
    """The visitor's batch scan and the secrets screen's, as one (the
    screen's counts start from scratch: this is a new reading)."""
    if screen is None:
        return scan
    screen.findings = Findings()
    if scan is None:
        return screen.scan_batch

    def both(text: bytes | memoryview | None, events: list, first_index: int) -> None:
        scan(text, events, first_index)
        screen.scan_batch(text, events, first_index)
    return both


def _either(first_test: Callable[[bytes | memoryview], bool], screen: Redactor) -> Callable[[bytes | memoryview], bool]:
    return lambda text: first_test(text) or screen.suspicious(text)


def screen_of_copy(result: IndexResult, redactor: Redactor | None) -> Redactor | None:
    """The redactor pass 2 writes through (:func:`~streamtrace.io.redact.copy_redactor`
    of what pass 1 found); a screen that counts turns off writing in place:
    the writer sees every byte."""
    return copy_redactor(redactor, result.secrets)


def batches(items: Iterable[bytes], size: int) -> Iterable[list[bytes]]:
    batch: list[bytes] = []
    for item in items:
        batch.append(item)
        if len(batch) >= size:
            yield batch
            batch = []
    yield batch


def emit_pass(result: IndexResult, plan: EmitPlan, target: OutputTarget, *, progress: Meter | None = None,
              jobs: int = 1) -> int:
    """Pass 2: stream the spooled events through ``plan`` into ``target``,
    rewritten by ``jobs`` worker processes when ``jobs`` > 1 (this process
    then only writes).

    Returns the number of events written.  Always deletes the spool.
    Without a redactor of its own, ``target`` gets one that counts the
    secrets copied when the input holds any (:func:`screen_of_copy`).
    """
    target.redactor = screen_of_copy(result, target.redactor)
    try:
        with ExitStack() as stack:
            workers = None
            forks = jobs > 1 and result.spool is not None and can_fork()
            in_place = forks and target.plain_file  # the workers write their blocks into the file themselves
            if forks and not in_place:
                # forked before the output opens: no compressor thread to inherit
                workers = stack.enter_context(EmitWorkers(result.spool, plan, jobs, pieces=target.pieces_level))
            out = stack.enter_context(target.open())
            writer = TraceWriter(out, plan.header(result.stats.header), target.redactor)
            if in_place:
                out.flush()  # the header, before the workers write after it (they inherit no buffer)
                workers = stack.enter_context(EmitWorkers(result.spool, plan, jobs, output=out.fileno()))
            emit_events(result.spool, plan, writer, progress=progress, workers=workers)
            writer.close(plan.trailer(result.stats.trailer))
            return writer.events_written
    finally:
        if result.spool is not None:
            result.spool.close()


@gc_paused()
def emit_events(spool: EventSpool | None, plan: EmitPlan, writer: TraceWriter, *,
                progress: Meter | None = None, workers: EmitWorkers | None = None, keep: bool = False) -> None:
    """The event part of pass 2: spooled lines through ``plan`` (here, or in
    ``workers``), then its appended events, into an open ``writer``
    (``merge`` writes several spools into one writer).  Deletes the spool
    unless ``keep`` (a task that may run again reads it again)."""
    if spool is None:
        raise ValueError("emit_pass needs an index pass run with keep_events=True")
    total = None if plan.actions is None else len(plan.actions)
    try:
        read = 0
        if workers is None:
            for block in spool.read_blocks():
                writer.events(plan.lines(block, read))
                read += len(block)
                if progress is not None:
                    progress.update("pass 2", None, read, total)
        else:
            for count in workers.write(writer):
                read += count
                if progress is not None:
                    progress.update("pass 2", None, read, total)
            plan.skip(0, read)  # this process's counters now stand where the workers' ended
        if plan.actions is not None and read != len(plan.actions):
            raise TraceError(f"validation failed: {read} events spooled, {len(plan.actions)} indexed")
        for batch in batches(plan.appended(), SPOOL_BATCH):
            writer.events(batch)
    finally:
        if not keep:
            spool.close()
        if progress is not None:
            progress.done()

