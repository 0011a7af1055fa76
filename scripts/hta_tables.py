#!/usr/bin/env python3
"""HTA 0.5.0's tables for trace files, computed by HTA itself: the yardstick
for ``streamtrace analyze`` in benchmarks (HTA needs the ``dev`` extra).

Usage: python scripts/hta_tables.py TRACE...

The files are linked into a temporary directory (HTA reads a directory) and
go through the same HTA calls as the tests' oracle (tests/hta_oracle.py):
every analysis behind analyze's tables, HTA's defaults kept.  Prints the
number of rows HTA gave per table, and the tables it raised on.  Timed as a
command by scripts/bench.py, e.g.

    python scripts/bench.py small.json --yardsticks orjson --rounds 1 -- \\
        python scripts/hta_tables.py {input} -- streamtrace analyze {input} -o {tmp}/t -q --json
"""
from __future__ import annotations

import json
import os
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from hta_oracle import hta_run  # noqa: E402


def main() -> int:
    paths = sys.argv[1:]
    if not paths or any(path.startswith("-") for path in paths):
        print(__doc__, file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory(prefix="hta-tables-") as directory:
        for n, path in enumerate(paths):
            os.symlink(os.path.abspath(path), os.path.join(directory, f"{n}_{os.path.basename(path)}"))
        tables, raised = hta_run(Path(directory))
    print(json.dumps({"rows": {name: len(rows) for name, rows in tables.items()},
                      "raised": {name: repr(error) for name, error in raised.items()}}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
