"""Stopping: SIGTERM and SIGINT clean up like Ctrl-C, and the stop is reported once."""
from __future__ import annotations

import os
import signal
import sys

from ..errors import INTERRUPTED
from ..resources import STOPS_REQUESTED


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised like Ctrl-C so that the same cleanup runs."""


def install_signal_handlers() -> None:
    """SIGTERM raises :class:`Terminated` and SIGINT ``KeyboardInterrupt``,
    so that temporary files are cleaned up, in this process only.

    A worker forked from this process inherits the handlers until it sets
    its own; a signal in that moment (the run stopping as the worker starts)
    ends the worker at once and quietly, instead of raising in it: the
    parent does the cleaning up and says what happened."""
    owner = os.getpid()
    report_unraisable = sys.unraisablehook

    def handle(signum: int, frame: object) -> None:
        if os.getpid() != owner:
            os._exit(128 + signum)
        STOPS_REQUESTED.append(signum)
        raise Terminated if signum == signal.SIGTERM else KeyboardInterrupt

    def unraisable(hook_args: object) -> None:  # the stop is reported once, by main()
        if not isinstance(getattr(hook_args, "exc_value", None), KeyboardInterrupt):
            report_unraisable(hook_args)  # type: ignore[arg-type]

    signal.signal(signal.SIGTERM, handle)
    signal.signal(signal.SIGINT, handle)
    sys.unraisablehook = unraisable


def interrupted(signum: int) -> int:
    print(INTERRUPTED, file=sys.stderr)
    return 128 + signum
