"""The roofline of each performance-model sheet row, beyond TraceLens's
columns: appended after them, whatever spec gave it (built-in or
``--gpu-spec``), so TraceLens's own columns stay as it writes them.

Per row (one op name and parameters): the roofline time of one such op
(TraceLens's rule: the longer of its FLOPs at the peak of its compute spec
and its bytes at the memory bandwidth), which roof bounds it, and that time
as a percentage of the row's mean kernel time: the share of the roofline
the ops of the row reach on the whole (their total roofline time over their
total kernel time), where TraceLens's ``Pct Roofline_mean`` averages the
ops' shares.
"""
from __future__ import annotations

import math
from collections import Counter

from .opsheets import roofline
from .opstables import NA, Table

COLUMNS = ("roofline time (us)", "roofline bound", "% of roofline")
NEEDS = ("GFLOPS_first", "Data Moved (MB)_first", "Compute Spec", "Kernel Time (µs)_mean")
MB = 1024 * 1024  # TraceLens's "MB" of Data Moved


def _number(value: object) -> float:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else math.nan


def row_roofline(spec: dict, gflops: float, moved_mb: float, compute: str, mean_us: float) -> list[object]:
    """The three cells of one row (empty where the spec has no peak for its
    compute spec, or the row has no FLOPs or bytes)."""
    moved = None if math.isnan(moved_mb) else moved_mb * MB
    found = roofline(spec, compute, gflops, moved, mean_us) if not math.isnan(gflops) else {}
    if not found:
        return [NA, NA, NA]
    pct = found["Pct Roofline"]
    return [found["Roofline Time (µs)"], found["Roofline Bound"], NA if math.isnan(pct) else pct]


def add_roofline(tables: dict[str, Table], spec: dict) -> list[str]:
    """Append :data:`COLUMNS` to every sheet of ``tables`` (those with the
    columns a sheet has); notes on the rows left without a roofline."""
    unpeaked: Counter[str] = Counter()
    peaks = spec.get("max_achievable_tflops") or {}
    for table in tables.values():
        header = table.header[-1]
        if len(table.header) != 1 or not all(column in header for column in NEEDS):
            continue
        at = [header.index(column) for column in NEEDS]
        header.extend(COLUMNS)
        for row in table.rows:
            gflops, moved_mb, compute, mean_us = (row[i] for i in at)
            row.extend(row_roofline(spec, _number(gflops), _number(moved_mb), compute or "", _number(mean_us)))
            if compute and compute not in peaks:
                unpeaked[compute] += 1
    if not unpeaked:
        return []
    listed = ", ".join(f"{count} of {compute}" for compute, count in sorted(unpeaked.items()))
    return [f"sheet rows whose compute spec has no peak in the GPU spec get no roofline: {listed}"]
