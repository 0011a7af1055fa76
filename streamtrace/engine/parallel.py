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
memory stays bounded.  A failure in a worker is raised here; whatever
happens, every worker is stopped before the caller cleans up.
"""
from __future__ import annotations

import multiprocessing
import pickle
import struct
from typing import Iterator

from ..errors import TraceError
from ..io.spool import EventSpool, Segments
from ..io.writer import JoinedLines
from ..resources import forking, gc_paused
from .parseproc import leave_signals_to_parent, send_failure, widen_pipe
from .plan import EmitPlan

_BLOCK, _END, _FAILED = b"B", b"E", b"F"
_COUNTS = struct.Struct("<QQ")  # events read from the spool, events written


def can_fork() -> bool:
    """Workers need ``fork``: they inherit the plan instead of unpickling it."""
    return "fork" in multiprocessing.get_all_start_methods()


class EmitWorkers:
    """``workers`` processes rewriting ``spool`` through ``plan``; iterate
    :meth:`blocks` for the output, in order.  Use as a context manager: on
    exit every worker is stopped."""

    def __init__(self, spool: EventSpool, plan: EmitPlan, workers: int) -> None:
        segments = spool.segments()
        self._plan = plan
        self._receivers: list = []
        self._processes: list = []
        context = multiprocessing.get_context("fork")
        try:
            for share in range(workers):
                receiver, sender = context.Pipe(duplex=False)
                widen_pipe(sender)
                self._receivers.append(receiver)
                process = context.Process(target=_worker_main, daemon=True,
                                          args=(spool, segments, plan, share, workers, sender, list(self._receivers)))
                with forking():  # (a signal held meanwhile is raised as it ends: the worker is known by then)
                    process.start()
                    self._processes.append(process)
                sender.close()
        except BaseException:
            self.close()
            raise

    def blocks(self) -> Iterator[tuple[memoryview, int, int]]:
        """(output text, events written, events read) per spool block, in
        spool order; the text is events joined as in a trace (``,`` and a
        newline between them), ready for :meth:`TraceWriter.splice`.  At the
        end the workers' pass-2 tallies are added to this process's plan."""
        workers = len(self._processes)
        number = 0
        while True:
            tag, body = self._receive(number % workers)
            if tag == _END:
                break  # the worker whose turn it is has no block left: nor has any other
            read, written = _COUNTS.unpack_from(body)
            yield body[_COUNTS.size:], written, read
            number += 1
        tallies = [pickle.loads(body)]
        for share in range(workers):
            if share != number % workers:
                tag, body = self._receive(share)
                if tag != _END:
                    raise TraceError("validation failed: a pass-2 worker had blocks left over")
                tallies.append(pickle.loads(body))
        for worker_tallies in tallies:
            self._plan.add_tallies(worker_tallies)

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
        for receiver in self._receivers:
            receiver.close()
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
                 inherited: list) -> None:
    """Rewrite blocks ``share``, ``share + workers``, ... and send each; then
    the plan's tallies, or the failure.

    Every reading end inherited from the parent is closed first: if the
    parent dies, the next send then fails at once instead of blocking on a
    pipe nobody reads.
    """
    for receiver in inherited:
        receiver.close()
    leave_signals_to_parent()
    try:
        before = plan.tallies()
        position = 0  # where the plan's counters stand
        for first, block in _share_of(spool, segments, share, workers):
            plan.skip(position, first)
            lines = plan.lines(block, first)
            if isinstance(lines, JoinedLines):  # the joining is done here, off the writer's core
                text, written = lines.text.replace(b"\n", b",\n"), lines.count
            else:
                text, written = b",\n".join(lines), len(lines)
            sender.send_bytes(b"".join((_BLOCK, _COUNTS.pack(len(block), written), text)))
            position = first + len(block)
        after = plan.tallies()
        sender.send_bytes(_END + pickle.dumps({name: after[name] - before[name] for name in after}))
    except BaseException as exc:
        send_failure(sender, _FAILED, exc)
    finally:
        sender.close()


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
