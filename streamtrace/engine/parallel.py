"""Pass 2 on several cores: forked workers rewrite the spool's blocks, this
process writes them out in order.

The plan is built once, between the passes, and the workers are forked
after it: they share its arrays copy-on-write instead of receiving them.
The spool's blocks are shared out, block ``n`` going to worker
``n % workers``: when the spool knows its segments (runs of lines that
decompress on their own, as pass 1's workers write them), a worker reads
only its own; otherwise every worker reads the whole spool (decompression
runs in a thread outside the GIL) and rewrites only its share.  This process takes the blocks back
in that order, so the output is the same bytes whatever the number of
workers, and a worker runs at most a pipe's worth ahead of the writer:
memory stays bounded.  Into a plain local file the workers write their
blocks themselves (``os.pwrite``): they send only each block's length, and
this process, which knows the lengths before it, sends back where the
block goes.  The kernel's copying into the page cache (on a VM whose freed
memory goes back to the host, seconds per GB) then runs on every core.
Into a gzip output they compress the whole pieces of their block the same
way (``io.gzipped``) and send those: a tenth of the bytes through the
pipes, and this process compresses only the pieces that straddle blocks.
A failure in a worker is raised here; whatever happens, every worker is
stopped before the caller cleans up.
"""
from __future__ import annotations

import multiprocessing
import os
import pickle
import struct
from collections import deque
from typing import Iterator

from ..errors import TraceError
from ..io.gzipped import GzipPieces
from ..io.spool import EventSpool, Segments
from ..io.writer import JoinedLines, TraceWriter
from ..resources import forking, gc_paused
from .parseproc import leave_signals_to_parent, send_failure, widen_pipe
from .plan import EmitPlan

_BLOCK, _PLACE, _PIECES, _END, _FAILED = b"B", b"P", b"Z", b"E", b"F"
_COUNTS = struct.Struct("<QQ")  # events read from the spool, events written
_LENGTH = struct.Struct("<Q")  # a block's bytes, which its worker writes itself (then its last byte)
_PLACED = struct.Struct("<Q?")  # where they go, and whether after the separator (then the byte before)
_AHEAD = 2  # blocks a worker holds while their places are not yet known


def can_fork() -> bool:
    """Workers need ``fork``: they inherit the plan instead of unpickling it."""
    return "fork" in multiprocessing.get_all_start_methods()


class EmitWorkers:
    """``workers`` processes rewriting ``spool`` through ``plan``; :meth:`write`
    puts their blocks into the output, in order.  ``output``: the descriptor
    of a plain file the workers write their blocks into themselves;
    ``pieces``: the level of a gzip output whose whole pieces the workers
    compress (the writer's stream is then a :class:`GzipPieces`).  Use as
    a context manager: on exit every worker is stopped."""

    def __init__(self, spool: EventSpool, plan: EmitPlan, workers: int, output: int | None = None,
                 pieces: int | None = None) -> None:
        segments = spool.segments()
        self._plan = plan
        self._receivers: list = []
        self._placers: list = []  # to each worker that writes or compresses its blocks: where they go
        self._processes: list = []
        self._compressed: dict[int, memoryview] = {}  # placed blocks' pieces that came before their turn
        self._compressed_from = [0] * workers  # pieces messages received from each worker
        self._next_compressed = 0  # the block whose pieces go into the output next
        self._pieces = pieces is not None
        context = multiprocessing.get_context("fork")
        try:
            for share in range(workers):
                receiver, sender = context.Pipe(duplex=False)
                widen_pipe(sender)
                self._receivers.append(receiver)
                places = None
                if output is not None or pieces is not None:
                    places, placer = context.Pipe(duplex=False)
                    self._placers.append(placer)
                process = context.Process(target=_worker_main, daemon=True,
                                          args=(spool, segments, plan, share, workers, sender,
                                                self._receivers + self._placers, output, pieces, places))
                with forking():  # (a signal held meanwhile is raised as it ends: the worker is known by then)
                    process.start()
                    self._processes.append(process)
                sender.close()
                if places is not None:
                    places.close()
        except BaseException:
            self.close()
            raise

    def write(self, writer: TraceWriter) -> Iterator[int]:
        """Each block into ``writer`` in spool order (its text spliced in,
        or its place reserved and sent to the worker that writes it); yields
        the events each took from the spool.  At the end, when every worker
        has written its blocks, their pass-2 tallies are added to this
        process's plan."""
        workers = len(self._processes)
        number = 0
        while True:
            share = number % workers
            tag, body = self._receive_block(share, writer)
            if tag == _END:
                break  # the worker whose turn it is has no block left: nor has any other
            read, written = _COUNTS.unpack_from(body)
            if tag == _PLACE:
                length, last = _LENGTH.unpack_from(body, _COUNTS.size)[0], bytes(body[_COUNTS.size + _LENGTH.size:])
                self._place(share, writer.reserve(length, written, last))
            else:
                writer.splice((body[_COUNTS.size:],), written)
            yield read
            number += 1
        tallies = [pickle.loads(body)]
        for share in range(workers):
            if share != number % workers:
                tag, body = self._receive_block(share, writer)
                if tag != _END:
                    raise TraceError("validation failed: a pass-2 worker had blocks left over")
                tallies.append(pickle.loads(body))
        if self._pieces and self._next_compressed != number:
            raise TraceError(f"validation failed: {self._next_compressed} of {number} blocks' pieces were written")
        for worker_tallies in tallies:
            self._plan.add_tallies(worker_tallies)

    def _receive_block(self, share: int, writer: TraceWriter) -> tuple[bytes, memoryview]:
        """The next message of worker ``share`` about a new block (or its
        end); pieces it sends meanwhile go into ``writer`` in block order."""
        while True:
            tag, body = self._receive(share)
            if tag != _PIECES:
                return tag, body
            workers = len(self._processes)
            self._compressed[share + workers * self._compressed_from[share]] = body
            self._compressed_from[share] += 1
            while self._next_compressed in self._compressed:
                writer.add_placed(self._compressed.pop(self._next_compressed))
                self._next_compressed += 1

    def _place(self, share: int, place: tuple[int, bool, bytes]) -> None:
        at, separated, before = place
        try:
            self._placers[share].send_bytes(_PLACED.pack(at, separated) + before)
        except OSError:  # the worker is gone: the failure it sent, if any, is among its messages
            while True:
                self._receive(share)  # raises that failure, or (at their end) that the worker stopped

    def _receive(self, share: int) -> tuple[bytes, memoryview]:
        """The next message of worker ``share``; its failure raised here."""
        try:
            message = self._receivers[share].recv_bytes()
        except EOFError:
            process = self._processes[share]
            process.join(timeout=1)
            raise TraceError(f"a pass-2 worker stopped unexpectedly (exit status {process.exitcode})") from None
        tag, body = message[:1], memoryview(message)[1:]
        if tag == _FAILED:
            raise pickle.loads(body)
        return tag, body

    def close(self) -> None:
        for connection in self._receivers + self._placers:
            connection.close()
        for process in self._processes:
            if process.is_alive():
                process.terminate()
            process.join()

    def __enter__(self) -> "EmitWorkers":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


@gc_paused()
def _worker_main(spool: EventSpool, segments: Segments | None, plan: EmitPlan, share: int, workers: int, sender,
                 inherited: list, output: int | None, pieces: int | None, places) -> None:
    """Rewrite blocks ``share``, ``share + workers``, ... and send each (or,
    with ``output`` or ``pieces``, send its length, then write it where
    ``places`` says, or send it compressed for that place); then the plan's
    tallies, or the failure.

    Every connection end the parent keeps is closed here first: if the
    parent dies, the next send then fails (and a wait for a place ends) at
    once instead of blocking on a pipe nobody reads.
    """
    for connection in inherited:
        connection.close()
    leave_signals_to_parent()
    try:
        before = plan.tallies()
        position = 0  # where the plan's counters stand
        unplaced: deque[bytes] = deque()
        for first, block in _share_of(spool, segments, share, workers):
            plan.skip(position, first)
            lines = plan.lines(block, first)
            if isinstance(lines, JoinedLines):  # the joining is done here, off the writer's core
                text, written = lines.text.replace(b"\n", b",\n"), lines.count
            else:
                text, written = b",\n".join(lines), len(lines)
            counts = _COUNTS.pack(len(block), written)
            if places is None:
                sender.send_bytes(b"".join((_BLOCK, counts, text)))
            else:
                sender.send_bytes(b"".join((_PLACE, counts, _LENGTH.pack(len(text)), text[-1:])))
                unplaced.append(text)
                while unplaced and (len(unplaced) > _AHEAD or places.poll()):
                    _put_placed(unplaced.popleft(), places, output, pieces, sender)
            position = first + len(block)
        while unplaced:
            _put_placed(unplaced.popleft(), places, output, pieces, sender)
        after = plan.tallies()
        sender.send_bytes(_END + pickle.dumps({name: after[name] - before[name] for name in after}))
    except BaseException as exc:
        send_failure(sender, _FAILED, exc)
    finally:
        sender.close()


def _put_placed(text: bytes, places, output: int | None, pieces: int | None, sender) -> None:
    """Write ``text`` where the parent placed it (after the separator when
    events come before it), or send it compressed for that place."""
    message = places.recv_bytes()
    at, separated = _PLACED.unpack_from(message)
    data = b",\n" + text if separated else text
    if output is None:
        sender.send_bytes(_PIECES + GzipPieces.placed(data, at, message[_PLACED.size:], pieces))  # type: ignore[arg-type]
        return
    view = memoryview(data)
    while view:
        done = os.pwrite(output, view, at)
        view, at = view[done:], at + done


def _share_of(spool: EventSpool, segments: Segments | None, share: int,
              workers: int) -> Iterator[tuple[int, list[bytes]]]:
    """(first event, lines) of blocks ``share``, ``share + workers``, ...:
    the spool's ``segments``, of which this worker reads only its own, or (a
    spool without them) its ~1 MB blocks, all of which it must read through."""
    if segments is None:
        done = 0
        for number, block in enumerate(spool.read_blocks()):
            if number % workers == share:
                yield done, block
            done += len(block)
        return
    for start, end, first, count in segments[share::workers]:
        lines = spool.read_segment(start, end)
        if len(lines) != count:
            raise TraceError(f"validation failed: {len(lines)} events in a spool segment, {count} spooled")
        yield first, lines
