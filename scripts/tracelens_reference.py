#!/usr/bin/env python3
"""TraceLens's multi-rank collective report for the reference cases (tests/tracelens_cases.py),
written as the committed reference tables tests/reference/tracelens/<case>/<table>.csv, so the
tests compare analyze's collective tables with TraceLens's without TraceLens installed.

Usage: python scripts/tracelens_reference.py TRACELENS_COMMAND [CASE...]

TRACELENS_COMMAND is TraceLens's ``TraceLens_generate_multi_rank_collective_report_pytorch``
(install TraceLens from its source, AMD-AGI/TraceLens, in a separate environment: it is not on
the package index).  Each case's rank files are linked as ``rank<N>_trace.json.gz`` into a
temporary directory and given to it with ``--trace_pattern`` and ``--world_size``, its defaults
kept (aggregates mean, median, min, max; gpus per node from the first file's deviceProperties),
plus ``--all2allv_heatmap`` for the cases with all_to_allv.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from tracelens_cases import CASES, HEATMAP, REFERENCE, case_files  # noqa: E402


def reference(command: str, case: str) -> list[str]:
    """Run TraceLens on one case; replace its reference tables; return their names."""
    with tempfile.TemporaryDirectory(prefix="tracelens-") as work:
        inputs, links, tables = Path(work, "inputs"), Path(work, "links"), Path(work, "tables")
        inputs.mkdir()
        links.mkdir()
        files = case_files(case, inputs)
        for rank, path in enumerate(files):
            os.symlink(os.path.abspath(path), links / f"rank{rank}_trace.json.gz")
        subprocess.run([command, "--trace_pattern", str(links / "rank*_trace.json.gz"), "--world_size", str(len(files)),
                        "--output_csvs_dir", str(tables), *(["--all2allv_heatmap"] if case in HEATMAP else [])],
                       check=True, stdout=subprocess.DEVNULL)
        target = REFERENCE / case
        shutil.rmtree(target, ignore_errors=True)
        shutil.copytree(tables, target)
        return sorted(path.stem for path in target.glob("*.csv"))


def main() -> int:
    if len(sys.argv) < 2 or sys.argv[1].startswith("-"):
        print(__doc__, file=sys.stderr)
        return 2
    for case in sys.argv[2:] or CASES:
        print(case, ", ".join(reference(sys.argv[1], case)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
