#!/usr/bin/env python3
"""Write synthetic multi-rank Kineto traces (+ ground truth) for tests and benchmarks.

The same as ``streamtrace synth --json`` (see ``streamtrace synth --help``), for
a checkout without installing.  Example:
  python scripts/synth_trace.py OUTDIR --ranks 8 --pp-stages 4 --microbatches 8 \\
      --schedule zb --target-mb 250 --compress gzip --seed 1
Prints the truth summary (without per-step lists) as JSON.
"""
from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing

from streamtrace.cli import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main(["synth", "--json", *sys.argv[1:]]))
