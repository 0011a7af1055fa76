"""Pass 1 on two cores: a child process parses, the parent indexes.

Parsing JSON is most of a pass, and it holds the GIL, so threads cannot
share it.  When pass 2 follows, pass 1 must turn every event into a compact
line for the spool anyway, so the work splits cleanly: the child parses the
file, encodes events a thousand at a time with one orjson call, writes
them to the spool as lines and sends the same text, as one JSON array, to
the parent, which decodes it with one orjson call (much cheaper
than parsing the raw text) for the index visitor.  Without a spool (inspect,
attribute) a chunk the fast parser read whole is sent as the input's own
text: encoding it again would cost the child more than the parent saves.  The wall time of
pass 1 is then the larger of the two halves instead of their sum.

Only local files take this path (the child reopens the file by name); pipes
and file objects are read in-process.
"""
from __future__ import annotations

import fcntl
import multiprocessing
import os
import pickle
import signal
import struct
from typing import Callable

from ..errors import TraceError
from ..io.eventtext import dumped_batch
from ..io.progress import Progress
from ..io.reader import ReadMode, ReadStats, TraceReader
from ..io.source import InputSource
from ..io.spool import EventSpool
from ..resources import HELD_SIGNALS, forking, gc_paused

BATCH_EVENTS = 1024  # events per message: the parent holds one message's events at a time
PIPE_BYTES = 1 << 20
MIN_BYTES = 16 << 20  # below this a child process costs more than it saves
_HEADER, _BATCH, _DONE, _FAILED = b"H", b"B", b"D", b"F"
Encoder = Callable[[list, int], "tuple[bytes | memoryview, bytes | memoryview | None]"]
"""(events, index of the first) -> (what the parent receives, the spool's lines or None)."""
_PROGRESS = struct.Struct("<QQ?")  # raw bytes read, events so far, whether the batch was flagged


def available(source: InputSource) -> bool:
    """Can (and should) this source be parsed in a child process?"""
    if source.path is None or not os.path.isfile(source.path) or (source.size or 0) < MIN_BYTES:
        return False
    return "fork" in multiprocessing.get_all_start_methods()


def parse_in_child(
    source: InputSource,
    mode: ReadMode,
    spool: EventSpool | None,
    on_batch: Callable[[memoryview, bool], None],
    *,
    salvage: bool = False,
    progress: Progress | None = None,
    label: str = "pass 1",
    encode: Encoder = dumped_batch,
    on_header: Callable[[list], None] | None = None,
    screen: Callable[[bytes | memoryview], bool] | None = None,
) -> ReadStats:
    """Parse ``source`` in a child that writes the event lines to ``spool``
    (from scratch; None: no spool); call ``on_batch`` with each batch, in
    order, as ``encode`` makes it in the child (by default the text of one
    JSON array of the events), and with whether ``screen`` (run in the
    child, which has time to spare) flags that text (True when no
    ``screen``); return the reading's stats.  ``on_header`` gets the members
    before the events as soon as they are known.

    ``spool`` is finished here: its file is the child's to write.  Errors
    raised while parsing (:class:`TraceError`, a request to reread in a
    stricter mode) are raised here, in the parent.
    """
    if spool is not None:
        spool.finish()
    context = multiprocessing.get_context("fork")
    receiver, sender = context.Pipe(duplex=False)
    widen_pipe(sender)
    child = context.Process(target=_child_main, daemon=True,
                            args=(source.path, mode, salvage, spool and spool.path, encode, screen, sender, receiver))
    try:
        with forking():  # (a signal held meanwhile is raised as it ends, and the child stopped below)
            child.start()
        sender.close()
        while True:
            try:
                message = receiver.recv_bytes()
            except EOFError:
                raise TraceError(f"the parser process stopped unexpectedly (exit status {child.exitcode})") from None
            tag, body = message[:1], memoryview(message)[1:]
            if tag == _BATCH:
                raw_bytes, events, flagged = _PROGRESS.unpack_from(body)
                on_batch(body[_PROGRESS.size:], bool(flagged))
                if progress is not None:
                    progress.update(label, raw_bytes, events)
            elif tag == _HEADER:
                if on_header is not None:
                    on_header(pickle.loads(body))
            elif tag == _DONE:
                return pickle.loads(body)
            else:
                raise pickle.loads(body)
    finally:
        receiver.close()
        if child.pid is not None:  # (started)
            child.join(timeout=2)  # after its last message the child is exiting anyway
        if child.is_alive():
            child.terminate()
            child.join()


@gc_paused()
def _child_main(path: str, mode: ReadMode, salvage: bool, spool_path: str | None, encode: Encoder,
                screen: Callable[[bytes | memoryview], bool] | None, sender, receiver) -> None:
    """Parse ``path``, spool and send event lines in batches, then the stats or the failure.

    The inherited reading end is closed first: if the parent dies, the next
    send then fails at once instead of blocking on a pipe nobody reads.
    """
    receiver.close()
    leave_signals_to_parent()
    try:
        with InputSource(path) as source:
            stream = source.open()
            reader = TraceReader(stream, mode, salvage=salvage)
            spool = None if spool_path is None else EventSpool(path=spool_path)
            done = 0
            header_sent = False
            as_read = spool is None and encode is dumped_batch  # the input's own text can be the message

            def send(payload: bytes | memoryview, done: int) -> None:
                flagged = screen is None or screen(payload)
                sender.send_bytes(b"".join((_BATCH, _PROGRESS.pack(stream.raw_bytes_read, done, flagged), payload)))

            for chunk in reader.batches():
                if not header_sent:
                    sender.send_bytes(_HEADER + pickle.dumps(reader.stats.header))
                    header_sent = True
                if as_read and reader.batch_text is not None:  # (text with escapes is encoded anew: see batch_text)
                    done += len(chunk)
                    send(b"".join((b"[", reader.batch_text.rstrip(b" \t\r\n").removesuffix(b","), b"]")), done)
                    continue
                for at in range(0, len(chunk), BATCH_EVENTS):
                    batch = chunk[at:at + BATCH_EVENTS]
                    payload, lines = encode(batch, done)
                    done += len(batch)
                    if spool is not None:
                        spool.add_text(lines, len(batch))
                    send(payload, done)
            if spool is not None:
                spool.finish()
            sender.send_bytes(_DONE + pickle.dumps(reader.stats))
    except BaseException as exc:
        send_failure(sender, _FAILED, exc)
    finally:
        sender.close()


def leave_signals_to_parent() -> None:
    """In a forked worker: Ctrl-C is the parent's to handle (at a terminal it
    reaches the whole process group), and SIGTERM ends the worker at once,
    not through the CLI's handlers inherited by fork.  The parent stops its
    workers and removes every file of the run."""
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    if hasattr(signal, "pthread_sigmask"):
        signal.pthread_sigmask(signal.SIG_UNBLOCK, HELD_SIGNALS)  # held while the parent forked (resources.forking)


def send_failure(sender, tag: bytes, failure: BaseException) -> None:
    """Hand a child's failure to the parent, which raises it; if the parent
    is gone (or the failure cannot be pickled) there is no one to tell."""
    try:
        sender.send_bytes(tag + pickle.dumps(failure))
    except (OSError, pickle.PicklingError):
        pass


def widen_pipe(connection) -> None:
    """A 1 MiB pipe (Linux; 64 KiB by default) lets the child run several
    batches ahead instead of waiting for the parent at every batch."""
    try:
        fcntl.fcntl(connection.fileno(), getattr(fcntl, "F_SETPIPE_SZ", 1031), PIPE_BYTES)
    except OSError:
        pass
