"""Resource figures reported in summaries."""
from __future__ import annotations

import gc
import resource
import sys
from contextlib import contextmanager
from typing import Iterator


def peak_rss_mb() -> float:
    """Peak resident set size of this process so far, in MB.

    Prefers Linux's VmHWM, which starts afresh at exec; ru_maxrss would also
    count the parent's memory from before the exec of a forked child.
    """
    try:
        with open("/proc/self/status", "rb") as status:
            for line in status:
                if line.startswith(b"VmHWM:"):
                    return round(int(line.split()[1]) * 1024 / 1e6, 1)
    except OSError:
        pass
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    scale = 1 if sys.platform == "darwin" else 1024
    return round(peak * scale / 1e6, 1)


@contextmanager
def gc_paused() -> Iterator[None]:
    """Run without the cyclic garbage collector.

    The passes allocate millions of short-lived, acyclic containers (event
    dicts, lines, sort keys); the collector's scans of them cost 10-20% of
    a pass and find nothing.  Usable as a decorator; nests.
    """
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


@contextmanager
def frozen_heap() -> Iterator[None]:
    """Fork children with this process's objects frozen (``gc.freeze``).

    A child's collections then leave alone every object it merely inherited:
    no finalizer of the parent's garbage runs in the child (one waiting on a
    lock that another thread of the parent held at the fork would hang it),
    and the pages it shares with the parent stay shared instead of being
    copied by the collector's bookkeeping.
    """
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()
