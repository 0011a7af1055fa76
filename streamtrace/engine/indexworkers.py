"""Pass 1 on several cores: forked workers parse and index ranges of the
events array, this process joins their partial indexes in event order.

This process reads (and decompresses) the input and cuts the events array
into chunks of a few MB at candidate element boundaries without parsing
them (:meth:`TraceReader.batches` with ``hand_off``).  Chunk ``n`` goes to
worker ``n % workers``, which parses ``[`` + chunk + ``]``, runs its own
index visitor over the events, encodes them for the events' sink (the
spool: lines in a zstd frame; a Parquet output: an Arrow batch), and sends
back that frame and the visitor's part
(:meth:`take_part`: what it indexed since the last part, with its ids new
since then).  This process takes the results back in chunk order, appends
the frames to the spool and merges each part into the one visitor the
command sees (:meth:`absorb`, with the part's first event index and the
worker it came from, whose ids it maps).  The output is therefore the same
whatever the number of workers.

Every chunk that parses proves the next cut (see ``batches``).  A chunk a
worker cannot read as the plain fast reading would (a wrong cut, as where
the events array ends; an integer beyond 64 bits; an event that is not an
object; a visitor's complaint) is refused, and this process reads on from
there itself.  Whatever that reading cannot handle in turn makes
:func:`index_by_ranges` give up, and the engine reads the input again the
ordinary way, which either succeeds or reports the problem with its exact
position.
"""
from __future__ import annotations

import multiprocessing
import os
import pickle
import struct
import threading
from typing import Callable, Protocol

from ..algo.secrets import Findings, fold
from ..errors import RobustModeNeeded, TraceError
from ..io.chunkcut import chunk_events
from ..io.progress import Progress
from ..io.projection import ProjectedChunk
from ..io.reader import ChunkRefused, ReadMode, ReadStats, TraceReader
from ..io.redact import Redactor
from ..io.repair import Utf8Repair
from ..io.source import InputSource
from ..resources import fix_heap_thresholds, forking, gc_paused
from .parseproc import leave_signals_to_parent, send_failure, widen_pipe

CHUNK_BYTES = 1 << 20  # text per chunk: a part's overhead is small beside it, and a worker holds one chunk's events
IN_FLIGHT = 2  # chunks per worker handed out and not yet taken back: bounds memory
_PART, _REFUSED, _FAILED = b"P", b"R", b"F"  # results
_TEXT, _RANGE = b"T", b"O"  # tasks: a chunk's text, or where it is in the input file
_SIZES = struct.Struct("<QQQq")  # events in the chunk, bytes of the pickled part, UTF-8 repairs and bytes they added
_PLACE = struct.Struct("<QQ")  # a chunk's offset and length in the input file


class PartVisitor(Protocol):
    """An index visitor whose work can be split by ranges of events
    (it says so with a true ``splits_by_ranges``)."""

    splits_by_ranges: bool

    def visit(self, event: dict) -> None: ...

    def take_part(self) -> object:
        """What was indexed since the last part (picklable); the visitor then
        indexes on as if it had seen none of those events (caches may stay)."""

    def absorb(self, part: object, source: int, first_event: int) -> None:
        """Add a part from ``source`` (a worker number) whose first event is
        ``first_event``; parts come in event order, and each source's parts
        in the order it took them."""

    # optional: ``projection`` (a Projection of the members it reads) and
    # visit_projected(chunk: ProjectedChunk) -> bool, which indexes the chunk's
    # events as visit() would and says so, or returns False having changed
    # nothing (the chunk is then read the ordinary way): see ChunkIndexer.
    # Older form, used when no spool is written: visit_chunk(text) -> count or None.


class EventSink(Protocol):
    """Where pass 1 keeps the events (:class:`~streamtrace.io.spool.EventSpool`, or rows)."""

    def frame_encoder(self) -> Callable[[list], bytes]:
        """A function, made in a worker, encoding a chunk's events for :meth:`add_frame`."""

    # optional: text_frame_encoder() -> Callable[[bytes], bytes], the same for
    # spool lines in the input's own text (Projection.decode_with_lines), and
    # add_text(lines, count) keeping such lines made in this process

    def add_frame(self, frame: bytes | memoryview, events: int) -> None: ...

    def add_events(self, events: list, first_index: int) -> None:
        """Keep events this process parsed."""

    def reset(self) -> None:
        """Forget everything kept: the input is being read again."""


def splits_by_ranges(visitor: object) -> bool:
    return getattr(visitor, "splits_by_ranges", False)


class IndexWorkers:
    """``workers`` processes indexing the chunks :meth:`submit` hands out;
    results are absorbed into ``visitor`` and ``spool`` in chunk order.
    Use as a context manager: on exit every worker is stopped."""

    def __init__(self, make_visitor: Callable[[], PartVisitor], workers: int, visitor: PartVisitor,
                 spool: EventSink | None, input_file: str | None = None, screen: Redactor | None = None) -> None:
        """``input_file``: a plain local file the input's bytes are; workers
        then read each chunk from it themselves, given its place, instead of
        receiving its text through a pipe.  ``screen``: the secrets screen
        each worker runs on its chunks (see :class:`ChunkIndexer`), whose
        findings come back with the parts into this one."""
        self.visitor = visitor
        self.screen = screen
        self._input_file = input_file
        self.spool = spool
        self.events = 0  # events absorbed so far
        self.utf8_repaired = self.utf8_growth = 0  # in the chunks absorbed that workers read from the file
        self._sent = self._taken = 0
        self._tasks: list = []
        self._results: list = []
        self._processes: list = []
        context = multiprocessing.get_context("fork")
        try:
            for _ in range(workers):
                tasks_out, tasks_in = context.Pipe(duplex=False)
                results_in, results_out = context.Pipe(duplex=False)
                widen_pipe(tasks_in)
                widen_pipe(results_out)
                self._tasks.append(tasks_in)
                self._results.append(results_in)
                process = context.Process(
                    target=_worker_main, daemon=True,
                    args=(make_visitor, spool, input_file, screen, tasks_out, results_out,
                          self._tasks + self._results))
                with forking():  # (a signal held meanwhile is raised as it ends: the worker is known by then)
                    process.start()
                    self._processes.append(process)
                tasks_out.close()
                results_out.close()
        except BaseException:
            self.close()
            raise
        self._senders = [_Sender(connection) for connection in self._tasks]

    @property
    def reads_places(self) -> bool:
        """Do the workers read chunks from the input file (:meth:`submit_place`)?"""
        return self._input_file is not None

    def submit(self, text: bytes, offset: int | None) -> int:
        """Hand a chunk of elements to the next worker; return how many
        chunks are absorbed (see :class:`HandOff`)."""
        if self._input_file is not None and offset is not None:
            return self.submit_place(offset, len(text))
        return self._send(_TEXT + text)

    def submit_place(self, offset: int, length: int) -> int:
        """Hand the chunk at ``offset`` of the input file to the next worker,
        which reads it there; return as :meth:`submit` does."""
        return self._send(_RANGE + _PLACE.pack(offset, length))

    def _send(self, task: bytes) -> int:
        if self._sent - self._taken >= IN_FLIGHT * len(self._processes):
            self._take()
        self._senders[self._sent % len(self._processes)].send(task)
        self._sent += 1
        return self._taken

    def settle(self) -> int:
        """Absorb every chunk handed out so far; return their number."""
        while self._taken < self._sent:
            self._take()
        return self._taken

    def _take(self) -> None:
        share = self._taken % len(self._processes)
        try:
            message = self._results[share].recv_bytes()
        except EOFError:
            process = self._processes[share]
            process.join(timeout=1)
            raise TraceError(f"a pass-1 worker stopped unexpectedly (exit status {process.exitcode})") from None
        tag, body = message[:1], memoryview(message)[1:]
        if tag == _REFUSED:
            raise ChunkRefused(self._taken)
        if tag == _FAILED:
            raise pickle.loads(body)
        count, size, repairs, growth = _SIZES.unpack_from(body)
        self.utf8_repaired += repairs
        self.utf8_growth += growth
        part_end = _SIZES.size + size
        part, found = pickle.loads(body[_SIZES.size:part_end])
        self.visitor.absorb(part, share, self.events)
        absorb_findings(self.screen, found, self.events)
        if self.spool is not None:
            self.spool.add_frame(body[part_end:], count)
        self.events += count
        self._taken += 1

    def close(self) -> None:
        """Stop the workers (their results are all taken, or no longer
        wanted), then the sending threads, whose sends fail once the
        workers are gone."""
        for process in self._processes:
            if process.is_alive():
                process.terminate()
            process.join()
        for sender in getattr(self, "_senders", ()):
            sender.close()
        for connection in self._tasks + self._results:
            connection.close()

    def __enter__(self) -> "IndexWorkers":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class _Sender:
    """Sends one worker its chunks from a thread of this process, so that
    handing out a chunk never waits for a worker busy sending its previous
    result (which this process may not be reading yet)."""

    def __init__(self, connection) -> None:
        self._connection = connection
        self._pending: list[bytes] = []
        self._ready = threading.Condition()
        self._closed = False
        self._failure: BaseException | None = None
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def send(self, text: bytes) -> None:
        with self._ready:
            if self._failure is not None:
                raise self._failure
            self._pending.append(text)
            self._ready.notify()

    def _run(self) -> None:
        while True:
            with self._ready:
                while not self._pending and not self._closed:
                    self._ready.wait()
                if not self._pending:
                    return
                text = self._pending.pop(0)
            try:
                self._connection.send_bytes(text)
            except OSError as exc:  # the worker is gone: taking its result says why
                with self._ready:
                    self._failure = exc
                return

    def close(self) -> None:
        with self._ready:
            self._closed = True
            self._pending.clear()
            self._ready.notify()
        self._thread.join(timeout=5)


class ChunkIndexer:
    """How a chunk of elements is indexed, the same in a worker and in this
    process (so the events' sink gets the same lines whichever does it).

    A visitor with a ``projection`` gets the chunk decoded into it
    (``visit_projected``) when that reads the chunk, and the sink then keeps
    the events' own text (:meth:`~streamtrace.io.projection.Projection.decode_with_lines`)
    when the sink takes text; otherwise the chunk is parsed into dicts,
    visited event by event and the events handed to the sink.

    A ``screen`` (a redactor that only counts) looks at every chunk for
    secrets: its cheap test reads the folded copy the projection makes
    anyway, and only a chunk it flags is parsed into dicts and walked.
    """

    def __init__(self, visitor: PartVisitor, sink: EventSink | None, sink_takes_text: bool,
                 screen: Redactor | None = None) -> None:
        if hasattr(visitor, "partial"):
            visitor.partial = True  # it sees parts: what depends on the events before them waits for absorb
        self.visitor = visitor
        self._scan = getattr(visitor, "scan_batch", None)  # (counts in the part, its events numbered from 0)
        self._screen = screen
        self._keeps_events = sink is not None
        projection = getattr(visitor, "projection", None)
        self._projection = projection if sink is None or sink_takes_text else None
        self._visit_chunk = getattr(visitor, "visit_chunk", None) if sink is None else None

    def __call__(self, text: bytes) -> tuple[int, bytes | list | None] | None:
        """(events, what the sink keeps: spool lines, the parsed events, or
        None without a sink), or None: the chunk is refused.  (A part is
        one chunk: the screen counts each chunk from scratch, so a chunk
        refused, or read again as dicts, is not counted twice.)"""
        try:
            if self._projection is not None:
                indexed = self._projected(text)
                if indexed is not None:
                    return indexed
            elif self._visit_chunk is not None:
                count = self._visit_chunk(text)
                return None if count is None else (count, None)
            events = chunk_events(text)
            if events is None:
                return None
            visit = self.visitor.visit
            for event in events:
                visit(event)
            if self._scan is not None:
                self._scan(text, events, 0)
            if self._screen is not None:
                self._screen.findings = Findings()
                self._screen.scan_batch(text, events, 0)
        except (TraceError, TypeError):
            return None  # the ordinary reading reports it with its position
        return len(events), events if self._keeps_events else None

    def _projected(self, text: bytes) -> tuple[int, bytes | None] | None:
        lines = elements = None
        folded = fold(text)
        if self._keeps_events:
            decoded = self._projection.decode_with_lines(text, folded)
            if decoded is None:
                return None
            events, lines, elements = decoded
        else:
            events = self._projection.decode(text, folded)
            if events is None:
                return None
        if self._screen is not None:
            self._screen.findings = Findings()
            if self._screen.suspicious(text, folded):
                flagged = chunk_events(text)
                if flagged is None:
                    return None
                self._screen.scan_batch(text, flagged, 0)
        if not self.visitor.visit_projected(ProjectedChunk(text, events, elements, folded)):
            return None
        return len(events), lines

    def take_part(self) -> tuple[object, Findings | None]:
        """The visitor's part, and what the screen found in its chunk."""
        return self.visitor.take_part(), None if self._screen is None else self._screen.findings


def absorb_findings(screen: Redactor | None, found: Findings | None, first_event: int) -> None:
    """Add what a part's screen found (its events numbered from 0) to ``screen``."""
    if screen is not None and found is not None:
        screen.findings.absorb(found, first_event)


@gc_paused()
def _worker_main(make_visitor: Callable[[], PartVisitor], sink: EventSink | None,
                 input_file: str | None, screen: Redactor | None, tasks, results, inherited: list) -> None:
    """Index each chunk sent until the sending side closes; send back, per
    chunk, the part and the chunk's frame for the events' sink, or a refusal.

    The parent's ends of every pipe are closed first: if the parent dies,
    the worker's next receive or send fails at once.
    """
    for connection in inherited:
        connection.close()
    leave_signals_to_parent()
    fix_heap_thresholds()
    try:
        visitor = make_visitor()
        text_encoder = getattr(sink, "text_frame_encoder", None)
        index = ChunkIndexer(visitor, sink, text_encoder is not None, screen)
        encode = sink.frame_encoder() if sink is not None else None
        encode_text = text_encoder() if text_encoder is not None else None
        chunk_of = _chunk_reader(input_file)
        while True:
            try:
                task = tasks.recv_bytes()
            except EOFError:
                return
            read = chunk_of(task)
            indexed = None if read is None else index(read[0])
            if indexed is None:
                results.send_bytes(_REFUSED)
                return
            count, kept = indexed
            frame = b"" if kept is None else encode_text(kept) if isinstance(kept, bytes) else encode(kept)
            part = pickle.dumps(index.take_part(), pickle.HIGHEST_PROTOCOL)
            results.send_bytes(b"".join((_PART, _SIZES.pack(count, len(part), *read[1:]), part, frame)))
    except BaseException as exc:
        send_failure(results, _FAILED, exc)
    finally:
        results.close()


class InlineIndexer:
    """The hand-off of :class:`IndexWorkers` done in this process, chunk by
    chunk as they come (one busy process): the same chunks, indexed by a
    visitor of their own whose parts ``visitor`` absorbs, and kept the same
    way, so the output is the same as with workers, and a refused chunk
    leaves nothing in ``visitor``."""

    def __init__(self, make_visitor: Callable[[], PartVisitor], visitor: PartVisitor, spool: EventSink | None,
                 screen: Redactor | None = None) -> None:
        self.visitor = visitor
        self.spool = spool
        self.screen = screen
        self.events = 0
        self._taken = 0
        part_screen = None if screen is None else Redactor(screen.finder, replace=False, learner=screen.learner)
        self._index = ChunkIndexer(make_visitor(), spool, spool is not None and hasattr(spool, "add_text"), part_screen)

    def submit(self, text: bytes, offset: int | None) -> int:
        indexed = self._index(text)
        if indexed is None:
            raise ChunkRefused(self._taken)
        count, kept = indexed
        part, found = self._index.take_part()
        self.visitor.absorb(part, 0, self.events)
        absorb_findings(self.screen, found, self.events)
        if isinstance(kept, bytes):
            self.spool.add_text(kept, count)
        elif kept is not None:
            self.spool.add_events(kept, self.events)
        self.events += count
        self._taken += 1
        return self._taken

    def settle(self) -> int:
        return self._taken

    def __enter__(self) -> "InlineIndexer":
        return self

    def __exit__(self, *exc: object) -> None:
        pass


def _chunk_reader(input_file: str | None) -> Callable[[bytes], tuple[bytes, int, int] | None]:
    """A worker's way from a task to the chunk's text, with its invalid UTF-8
    repaired as the reading repairs the bytes it reads (a chunk read from the
    file is as the file has it), the repairs and the bytes they added (None:
    the file no longer holds as many bytes, so it changed under us: refuse
    the chunk)."""
    descriptor = os.open(input_file, os.O_RDONLY) if input_file is not None else None
    repair = Utf8Repair()

    def chunk_of(task: bytes) -> tuple[bytes, int, int] | None:
        if task[:1] == _TEXT:
            return task[1:], 0, 0
        offset, length = _PLACE.unpack_from(task, 1)
        text = os.pread(descriptor, length, offset)
        if len(text) != length:
            return None
        if text.isascii():
            return text, 0, 0
        before = repair.repaired  # (a chunk starts and ends with an ASCII byte: nothing is held back)
        repaired = repair.feed(text)
        return repaired, repair.repaired - before, len(repaired) - length

    return chunk_of


def index_by_ranges(source: InputSource, make_visitor: Callable[[], PartVisitor], spool: EventSink | None,
                    workers: int, progress: Progress | None = None,
                    screen: Redactor | None = None) -> tuple[PartVisitor, ReadStats] | None:
    """Pass 1 with ``workers`` processes indexing chunks (see the module's
    text); None when the visitor's work does not split by ranges, or when
    the input needs the ordinary reading, and :class:`RobustModeNeeded` when
    it needs a stricter one (``spool`` is then empty again).  ``screen``:
    a redactor that counts the secrets of the events (from scratch)."""
    visitor = make_visitor()
    if not splits_by_ranges(visitor):
        return None
    scan = getattr(visitor, "scan_batch", None)
    if screen is not None:
        screen.findings = Findings()
    indexed_here = 0  # events of the array's end, parsed and indexed in this process
    stream = source.open()
    input_file = source.file_bytes if stream.compression == "none" else None
    with (IndexWorkers(make_visitor, workers, visitor, spool, input_file, screen) if workers > 1
          else InlineIndexer(make_visitor, visitor, spool, screen)) as pool:
        tick = None
        if progress is not None:
            tick = lambda reader: progress.update("pass 1", reader.raw_bytes_read, pool.events + indexed_here)  # noqa: E731
        reader = TraceReader(stream, ReadMode(), on_chunk=tick)
        try:
            for batch in reader.batches(hand_off=pool, chunk_bytes=CHUNK_BYTES):
                for event in batch:
                    visitor.visit(event)
                if scan is not None:
                    scan(None, batch, pool.events + indexed_here)
                if screen is not None:
                    screen.scan_batch(None, batch, pool.events + indexed_here)
                if spool is not None:
                    spool.add_events(batch, pool.events + indexed_here)
                indexed_here += len(batch)
        except RobustModeNeeded:
            if spool is not None:
                spool.reset()
            raise
        except (TraceError, TypeError):
            if spool is not None:
                spool.reset()
            return None
        finally:
            if progress is not None:
                progress.done()
    reader.stats.events = pool.events + indexed_here
    return visitor, reader.stats
