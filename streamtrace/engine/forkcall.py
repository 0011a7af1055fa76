"""One function run in a forked child while this process goes on with other work.

For work after a pass that reads what the pass collected (arrays, maps of
temporary files) and returns something small: the child inherits it all by
fork, copy-on-write, instead of receiving it, and sends back only the
pickled result.  Failures come back as the child's own exception, raised
here; a child that dies without one (killed, out of memory) is one line.
Signals are this process's, as for the engine's other workers: the child
ignores Ctrl-C and ends with this process, and :meth:`ForkedCall.close`
ends it at once (its files are unnamed or the run directory's).  Not
forked (one process asked for, or no ``fork``), the function runs here at
once, before the other work: what it reads is let go before that work
holds its own.
"""
from __future__ import annotations

import multiprocessing
import os
import pickle
from typing import Any, Callable

from ..errors import TraceError
from ..resources import forking, trim_heap
from .jobs import die_with_parent
from .parallel import can_fork
from .parseproc import leave_signals_to_parent, send_failure

_RESULT, _FAILED = b"R", b"F"


class ForkedCall:
    """``function(*args)``, in a forked child when ``fork``, else here at once.
    Use as a context manager: on exit a child still running is ended."""

    def __init__(self, function: Callable[..., Any], *args: Any, fork: bool) -> None:
        self._ran: tuple | None = None  # (the result, when run here)
        self._receiver = self._process = None
        trim_heap()  # (the call starts without this process's free heap pages: a child's resident set starts as ours)
        if not (fork and can_fork()):
            self._ran = (function(*args),)
            return
        context = multiprocessing.get_context("fork")
        self._receiver, sender = context.Pipe(duplex=False)
        self._process = context.Process(target=_child_main, daemon=True,
                                        args=(function, args, sender, self._receiver, os.getpid()))
        try:
            with forking():  # (a signal held meanwhile is raised as it ends: the child is known by then)
                self._process.start()
        except BaseException:
            self.close()
            raise
        finally:
            sender.close()

    def result(self) -> Any:
        """The function's result (waiting for the child), or its failure raised."""
        if self._ran is not None:
            ran, self._ran = self._ran[0], None
            return ran
        if self._receiver is None:
            raise TraceError("validation failed: a forked call's result was asked for twice")
        try:
            message = self._receiver.recv_bytes()
        except EOFError:
            self._process.join(timeout=1)
            raise TraceError(f"a worker process stopped unexpectedly (exit status {self._process.exitcode})") from None
        finally:
            self.close(finished=True)
        if message[:1] == _FAILED:
            raise pickle.loads(message[1:])
        return pickle.loads(message[1:])

    def close(self, *, finished: bool = False) -> None:
        """End the child at once, or (``finished``: it sent its message) once it has had time to exit."""
        if self._receiver is not None:
            self._receiver.close()
            self._receiver = None
        if self._process is not None and self._process.pid is not None:
            if finished:
                self._process.join(timeout=2)
            if self._process.is_alive():
                self._process.terminate()
                self._process.join()

    def __enter__(self) -> ForkedCall:
        return self

    def __exit__(self, *exc: object) -> None:
        self._ran = None
        self.close()


def _child_main(function: Callable[..., Any], args: tuple, sender, receiver, parent: int) -> None:
    """Run the call and send its result or its failure; the inherited reading end closed first, so
    that a send to a parent that died fails at once."""
    receiver.close()
    leave_signals_to_parent()
    die_with_parent(parent)
    try:
        result = function(*args)
        sender.send_bytes(_RESULT + pickle.dumps(result, protocol=pickle.HIGHEST_PROTOCOL))
    except BaseException as exc:
        send_failure(sender, _FAILED, exc)
    finally:
        sender.close()
