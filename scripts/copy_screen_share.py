"""The secrets screen's share of a copying command's CPU time, measured in
the run itself: with ``-j 1`` every chunk is screened in this process, so
the CPU time of the screen (its pre-filter and the exact check of what it
flags) and of the whole run are taken under the same load, which makes the
ratio usable on a shared machine where wall times are not.

    python scripts/copy_screen_share.py compact TRACE OUT.json.zst
    python scripts/copy_screen_share.py slice TRACE OUT.json.zst
"""
from __future__ import annotations

import argparse
import resource
import time
from typing import Callable

import streamtrace
from streamtrace.io import redact

COMMANDS: dict[str, Callable[..., dict]] = {
    "compact": streamtrace.compact,
    "relink": streamtrace.relink,
    "slice": streamtrace.slice_trace,
}


def timed(function: Callable, spent: list[float]) -> Callable:
    """``function``, adding the CPU time of this thread it takes to ``spent[0]``."""
    def wrapper(*args: object, **kwargs: object) -> object:
        started = time.thread_time()
        try:
            return function(*args, **kwargs)
        finally:
            spent[0] += time.thread_time() - started
    return wrapper


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("command", choices=sorted(COMMANDS))
    parser.add_argument("trace")
    parser.add_argument("output")
    arguments = parser.parse_args()
    spent = [0.0]
    # (scan_batch tests with the finder itself, not through Redactor.suspicious: nothing is counted twice)
    redact.Redactor.suspicious = timed(redact.Redactor.suspicious, spent)  # type: ignore[method-assign]
    redact.Redactor.scan_batch = timed(redact.Redactor.scan_batch, spent)  # type: ignore[method-assign]
    started = time.perf_counter()
    summary = COMMANDS[arguments.command](arguments.trace, arguments.output, jobs=1, overwrite=True)
    wall = time.perf_counter() - started
    cpu = sum(usage.ru_utime + usage.ru_stime
              for usage in map(resource.getrusage, (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN)))
    print(f"{arguments.command}: {summary['events_written']:,} events written; CPU {cpu:.2f} s (wall {wall:.2f} s), "
          f"secrets screen {spent[0]:.2f} s = {100 * spent[0] / cpu:.1f}% of the CPU time")


if __name__ == "__main__":
    main()
