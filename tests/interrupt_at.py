"""Run the streamtrace CLI and signal it at a named moment of its work.

    python interrupt_at.py MOMENT WHOM SIGNAL MARKER streamtrace-arguments...

The moment comes in whichever process does that work (the main process, a
pool worker, a range worker, the parse child or a pass-2 worker):

- ``pass1``: the third piece of pass 1 (spool text or frame, or a chunk a
  range worker parses or decodes into a projection) in that process;
- ``between``: a spool's writing side closes (pass 1 is over);
- ``pass2``: a block read back from a spool has been written, or a pass-2
  worker reads its second segment;
- ``splice``: the first rewritten block or fragment spliced into the output
  (into a plain file, which pass-2 workers write themselves: the first
  block whose place in it is reserved);
- ``fork``: the main process has just forked a worker (the signal arrives
  while Python runs its at-fork callbacks).

``WHOM`` gets ``SIGNAL`` there: ``process`` (the CLI's process), ``group``
(its process group, as Ctrl-C at a terminal does) or ``worker`` (the
process the moment came in, when it is not the CLI's own: a worker killed
from outside).  It happens once per run, in the first process to get
there: that process creates ``MARKER``, which tells the test it happened.
Small inputs take the paths of large ones (-j > 1: range workers or the
parse child; range workers get small chunks).
"""
from __future__ import annotations

import os
import signal
import sys
from typing import Any, Callable

from streamtrace import cli
from streamtrace.engine import indexworkers, parseproc
from streamtrace.io.projection import Projection
from streamtrace.io.spool import EventSpool
from streamtrace.io.writer import TraceWriter

MAIN = os.getpid()


def main(moment: str, whom: str, signal_name: str, marker: str, argv: list[str]) -> int:
    signum = getattr(signal, signal_name)

    def arrive() -> None:
        if whom == "worker" and os.getpid() == MAIN:
            return
        try:
            os.close(os.open(marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
        except FileExistsError:
            return
        if whom == "group":
            os.killpg(0, signum)
        else:
            os.kill(MAIN if whom == "process" else os.getpid(), signum)

    parseproc.MIN_BYTES = 0
    indexworkers.CHUNK_BYTES = 64 << 10
    if moment == "pass1":
        calls = at_call(3, arrive)
        wrap(EventSpool, "add_text", calls)
        wrap(EventSpool, "add_frame", calls)
        wrap(indexworkers, "chunk_events", calls)
        wrap(Projection, "decode", calls)
        wrap(Projection, "decode_with_lines", calls)
    elif moment == "between":
        wrap(EventSpool, "finish", lambda spool, *args: spool._file is not None and not spool._file.closed and arrive())
    elif moment == "pass2":
        wrap(EventSpool, "read_segment", at_call(2, arrive))
        original = EventSpool.read_blocks

        def read_blocks(spool: EventSpool) -> Any:
            for block in original(spool):
                yield block
                arrive()

        EventSpool.read_blocks = read_blocks  # type: ignore[method-assign]
    elif moment == "splice":
        calls = at_call(1, arrive)
        wrap(TraceWriter, "splice", calls)
        wrap(TraceWriter, "reserve", calls)
    elif moment == "fork":
        os.register_at_fork(after_in_parent=arrive)
    else:
        raise SystemExit(f"no moment {moment!r}")
    return cli.main(argv)


def at_call(nth: int, arrive: Callable[[], None]) -> Callable[..., None]:
    """A hook that calls ``arrive`` on its ``nth`` call in a process (a forked one counts afresh)."""
    counts: dict[int, int] = {}

    def hook(*args: object) -> None:
        pid = os.getpid()
        counts[pid] = counts.get(pid, 0) + 1
        if counts[pid] == nth:
            arrive()

    return hook


def wrap(owner: object, name: str, before: Callable[..., object]) -> None:
    """``owner.name`` calls ``before`` with its arguments first."""
    original = getattr(owner, name)

    def wrapped(*args: Any, **kwargs: Any) -> Any:
        before(*args)
        return original(*args, **kwargs)

    setattr(owner, name, wrapped)


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:5], sys.argv[5:]))
