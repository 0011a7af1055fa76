"""The secrets screen's share of a copying command's CPU time, measured in
the run itself: the CPU time of the screen (its pre-filter and the exact
check of what it flags), in this process and in the forked workers, and of
the whole run are taken under the same load, which makes the ratio usable
on a shared machine where wall times are not.

    python scripts/copy_screen_share.py compact TRACE OUT.json.zst           # the default -j
    python scripts/copy_screen_share.py slice TRACE OUT.json.zst --jobs 1

``--without-screen`` runs the command with the screen turned off, to
compare whole runs (wall time at the default -j) on a quiet machine.
"""
from __future__ import annotations

import argparse
import multiprocessing
import resource
import time
from typing import Callable

import streamtrace
from streamtrace.engine import passes
from streamtrace.io import redact

COMMANDS: dict[str, Callable[..., dict]] = {
    "compact": streamtrace.compact,
    "relink": streamtrace.relink,
    "slice": streamtrace.slice_trace,
}


def timed(function: Callable, spent: "multiprocessing.sharedctypes.Synchronized[float]") -> Callable:
    """``function``, adding the CPU time of the calling thread it takes to
    ``spent``, a counter shared with the workers this process forks."""
    def wrapper(*args: object, **kwargs: object) -> object:
        started = time.thread_time()
        try:
            return function(*args, **kwargs)
        finally:
            with spent.get_lock():
                spent.value += time.thread_time() - started
    return wrapper


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("command", choices=sorted(COMMANDS))
    parser.add_argument("trace")
    parser.add_argument("output")
    parser.add_argument("--jobs", "-j", default=None, help="as the command's -j (default: the command's default)")
    parser.add_argument("--without-screen", action="store_true", help="turn the screen off (for an A/B of whole runs)")
    arguments = parser.parse_args()
    if arguments.without_screen:
        passes.copy_screen = lambda learn_hosts=False: None  # type: ignore[assignment]
    spent = multiprocessing.get_context("fork").Value("d", 0.0)
    # (scan_batch tests with the finder itself, not through Redactor.suspicious: nothing is counted twice)
    redact.Redactor.suspicious = timed(redact.Redactor.suspicious, spent)  # type: ignore[method-assign]
    redact.Redactor.scan_batch = timed(redact.Redactor.scan_batch, spent)  # type: ignore[method-assign]
    started = time.perf_counter()
    summary = COMMANDS[arguments.command](arguments.trace, arguments.output, jobs=arguments.jobs, overwrite=True)
    wall = time.perf_counter() - started
    cpu = sum(usage.ru_utime + usage.ru_stime
              for usage in map(resource.getrusage, (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN)))
    print(f"{arguments.command} -j {arguments.jobs or 'default'}: {summary['events_written']:,} events written; "
          f"CPU {cpu:.2f} s (wall {wall:.2f} s), secrets screen {spent.value:.2f} s = "
          f"{100 * spent.value / cpu:.1f}% of the CPU time")


if __name__ == "__main__":
    main()
