"""Resource figures reported in summaries."""
from __future__ import annotations

import _thread  # (threading's lock, without importing threading at start-up)
import ctypes
import functools
import gc
import resource
import signal
import sys
from contextlib import contextmanager
from typing import Callable, Iterator

M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3  # glibc's mallopt parameters
MMAP_THRESHOLD_MAX = 32 << 20  # where glibc's own threshold ends once large buffers were freed
TRIM_THRESHOLD = 32 << 20  # free heap top kept while buffers come from the OS (see buffers_from_os)
WORKER_MMAP_THRESHOLD = 4 << 20  # a worker's buffers from the OS from this size on (chunks of 1 MiB stay below)


STOPS_REQUESTED: list[int] = []
"""SIGINT/SIGTERM the CLI's process was sent (its handler records each
before raising): Python drops an exception raised in a finalizer, so the
stop must still be seen where it decides what the user gets."""


def stop_if_requested() -> None:
    """Raise the stop a signal asked for, even if its exception was dropped:
    called before an output is published, so a run asked to stop never leaves one."""
    if STOPS_REQUESTED:
        raise KeyboardInterrupt


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

    Blocks may overlap (the tasks of a Dask worker's threads): the first to
    enter freezes and the last to leave unfreezes, so that no block freezes
    another's live objects, whose garbage its collections would then keep.
    """
    with _FREEZING:
        _FROZEN_BLOCKS[0] += 1
        if _FROZEN_BLOCKS[0] == 1:
            gc.freeze()
    try:
        yield
    finally:
        with _FREEZING:
            _FROZEN_BLOCKS[0] -= 1
            if _FROZEN_BLOCKS[0] == 0:
                gc.unfreeze()


_FREEZING = _thread.allocate_lock()
_FROZEN_BLOCKS = [0]  # frozen_heap blocks running now


HELD_SIGNALS = frozenset({signal.SIGINT, signal.SIGTERM})


@contextmanager
def forking() -> Iterator[None]:
    """Fork children in this block: with the heap frozen (:func:`frozen_heap`)
    and SIGINT and SIGTERM held until it ends.

    A signal whose handler raises while Python runs its at-fork callbacks is
    printed and lost (an exception cannot leave them), so a Ctrl-C at that
    moment would not stop the run; held, it is acted on as the block ends.
    Children start with both held and release them once they have set their
    own handlers.
    """
    with frozen_heap(), signals_held():
        yield


@contextmanager
def signals_held() -> Iterator[None]:
    """SIGINT and SIGTERM wait, in this thread, until the block ends: for a
    step a stop must not cut in two, such as a fork."""
    if not hasattr(signal, "pthread_sigmask"):  # (Windows)
        yield
        return
    signal.pthread_sigmask(signal.SIG_BLOCK, HELD_SIGNALS)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_UNBLOCK, HELD_SIGNALS)


@functools.cache
def _malloc() -> tuple[Callable[[int], int], Callable[[int, int], int]] | None:
    """glibc's ``malloc_trim`` and ``mallopt``, or None (another C library)."""
    try:
        libc = ctypes.CDLL(None)
        return libc.malloc_trim, libc.mallopt
    except (OSError, AttributeError):
        return None


def trim_heap() -> None:
    """Hand the heap's free pages back to the OS (glibc keeps them otherwise)."""
    controls = _malloc()
    if controls is not None:
        controls[0](0)


@contextmanager
def buffers_from_os(threshold: int) -> Iterator[None]:
    """Keep resident memory close to live memory (glibc; elsewhere nothing).

    glibc serves a buffer from its heap when it is below a threshold that
    rises to the size of any large buffer freed, and keeps freed heap pages
    resident: growing index arrays and short-lived scratch then pile up
    there.  A fixed threshold hands buffers from ``threshold`` bytes on to
    the OS and back as they are freed; a trim on entry hands back the heap's
    free pages.  The heap's top is trimmed from :data:`TRIM_THRESHOLD` on,
    not lower: the few MB of event dicts that each parsed chunk frees would
    otherwise go back to the OS and fault in again at the next chunk.
    Usable as a decorator.
    """
    controls = _malloc()
    if controls is None:
        yield
        return
    tune = controls[1]
    trim_heap()
    fix_heap_thresholds(threshold)
    try:
        yield
    finally:
        tune(M_MMAP_THRESHOLD, MMAP_THRESHOLD_MAX)  # glibc has no way back to its sliding threshold
        tune(M_TRIM_THRESHOLD, 2 * MMAP_THRESHOLD_MAX)
        trim_heap()


def fix_heap_thresholds(threshold: int = WORKER_MMAP_THRESHOLD) -> None:
    """Buffers from ``threshold`` bytes on come from the OS; the heap's top
    goes back to it only from :data:`TRIM_THRESHOLD` on (glibc; elsewhere
    nothing).  A worker decoding chunk after chunk calls it once: glibc's
    sliding thresholds otherwise trim the heap after each chunk's objects
    are freed, and the next chunk faults the same pages in again
    (``inspect -j 2`` of a 0.5 GB trace: 350 K page faults and 1.2 s of
    system time, against 53 K and 0.45 s)."""
    controls = _malloc()
    if controls is not None:
        controls[1](M_MMAP_THRESHOLD, threshold)
        controls[1](M_TRIM_THRESHOLD, max(threshold, TRIM_THRESHOLD))
