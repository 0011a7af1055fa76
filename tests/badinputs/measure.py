"""Run one command and report its exit status and true peak RSS.

Why a separate, small process: on Linux a child's ``ru_maxrss`` starts at the
resident size of the process it was forked (or vforked) from, because exec
keeps the old address space's high-water mark.  Forked straight from a test
process that has grown past the memory limit, every case would seem to
exceed it.  Forked from this launcher, which stays small, the figure is the
command's own.

Usage: ``python measure.py REPORT TIMEOUT ARGV...``; writes
``{"returncode": int | null, "peak_rss_kib": int}`` to REPORT (returncode
null: killed after TIMEOUT seconds) and passes stdin, stdout and stderr through.
"""
from __future__ import annotations

import json
import os
import sys
import time


def main(report: str, timeout: float, argv: list[str]) -> None:
    """Spawn ``argv``, wait at most ``timeout`` seconds, write the report."""
    pid = os.posix_spawnp(argv[0], argv, os.environ)
    deadline = time.monotonic() + timeout
    while True:
        done, status, usage = os.wait4(pid, os.WNOHANG)
        if done:
            returncode = os.waitstatus_to_exitcode(status)
            break
        if time.monotonic() > deadline:
            os.kill(pid, 9)
            _, _, usage = os.wait4(pid, 0)
            returncode = None
            break
        time.sleep(0.01)
    with open(report, "w") as out:
        json.dump({"returncode": returncode, "peak_rss_kib": usage.ru_maxrss}, out)


if __name__ == "__main__":
    main(sys.argv[1], float(sys.argv[2]), sys.argv[3:])
