"""How many processes a command may keep busy (``-j``).

One meaning everywhere: ``jobs`` is the number of busy processes.  ``1``
runs everything in this process; ``auto`` (the default) takes the CPUs this
process may run on, at most :data:`AUTO_LIMIT` (beyond that the writer in
the main process, not the workers, sets the pace); the environment variable
``STREAMTRACE_JOBS`` replaces the default.
"""
from __future__ import annotations

import ctypes
import os
import signal

from ..errors import TraceError

AUTO_LIMIT = 4
ENVIRONMENT = "STREAMTRACE_JOBS"
PR_SET_PDEATHSIG = 1  # linux/prctl.h


def usable_cpus() -> int:
    """CPUs this process may run on (its affinity mask, not the machine's count)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # macOS and Windows have no affinity call
        return os.cpu_count() or 1


def resolve_jobs(jobs: int | str | None) -> int:
    """A positive process count from ``jobs``: an int, ``"auto"`` or None
    (then ``$STREAMTRACE_JOBS``, else ``auto``)."""
    origin = "-j"
    if jobs is None:
        jobs = os.environ.get(ENVIRONMENT) or "auto"
        origin = ENVIRONMENT if ENVIRONMENT in os.environ else "-j"
    if isinstance(jobs, str):
        text = jobs.strip().lower()
        if text == "auto":
            return max(1, min(usable_cpus(), AUTO_LIMIT))
        if not text.isdigit():
            raise TraceError(f"{origin} takes a number of processes or 'auto', not {jobs!r}")
        jobs = int(text)
    if isinstance(jobs, bool) or not isinstance(jobs, int) or jobs < 1:
        raise TraceError(f"{origin} takes a number of processes >= 1 or 'auto', not {jobs!r}")
    return jobs


def die_with_parent(parent: int) -> None:
    """In a pool worker: end when the process that started it ends.

    A worker pool's processes wait on a queue that never closes, so without
    this a parent killed outright (``kill -9``, the OOM killer) would leave
    them behind, holding the terminal's pipes.  Linux only; elsewhere workers
    still end with a normal exit of the parent.
    """
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    except (OSError, AttributeError):
        return
    if os.getppid() != parent:  # the parent ended before the request took effect
        os._exit(1)
