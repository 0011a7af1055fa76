"""Run the bad-input matrix (tests/badinputs/) and print the outcome table.

Usage: python scripts/badinput_matrix.py [--command NAME]... [--workers N]

Each cell says what the command did with the damaged input (processed,
repaired and counted, or refused with a one-line located error), or FAIL and
why.  The same table and checks run in CI as tests/test_badinputs.py.
Exit status 1 if any cell fails.
"""
from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from badinputs.matrix import COMMANDS, cases, failures, markdown_table, run_all  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--command", action="append", choices=[command.name for command in COMMANDS],
                        help="only this command (repeatable; default: all)")
    parser.add_argument("--workers", type=int, help="cases run at once (default: the number of cores, at least 2)")
    args = parser.parse_args()
    selected = [(command, bad) for command, bad in cases() if not args.command or command.name in args.command]
    with tempfile.TemporaryDirectory(prefix="streamtrace-badinputs-") as root:
        futures = run_all(Path(root), selected, args.workers)
        results = {key: future.result() for key, future in futures.items()}
    print(markdown_table(results))
    return 1 if failures(results) else 0


if __name__ == "__main__":
    sys.exit(main())
