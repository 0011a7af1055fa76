"""``python -m streamtrace`` and the ``streamtrace`` console script.

The command line is imported inside :func:`run`, so that Ctrl-C while it
loads (before its own signal handling is in place) ends the run as Ctrl-C
during one does: one line, exit status 130, no traceback.
"""
from __future__ import annotations

import signal
import sys

from .errors import INTERRUPTED


def run() -> int:
    """The command line's exit status."""
    try:
        from .cli import main

        return main()
    except KeyboardInterrupt:
        print(INTERRUPTED, file=sys.stderr)
        return 128 + signal.SIGINT


if __name__ == "__main__":
    raise SystemExit(run())
