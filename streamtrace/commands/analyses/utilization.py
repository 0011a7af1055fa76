"""Utilization: each rank's GPU busy fraction per time bin over the run (not HTA's).

Reads: through the shared sweep, the kept kernels, copies and sets with the
trace's own times (the union of their spans).
Keeps per rank: its busy time in fine bins over its own GPU span (a few
thousand numbers, whatever the trace's length).
Combines: the fine bins of every rank, regrouped into about
``utilization_bins`` equal bins over the run's GPU span (exact: see
:mod:`streamtrace.algo.utilization`), times counted from the run's earliest
event.
Tables: utilization.
"""
from __future__ import annotations

import numpy as np

from ...algo import utilization as busy_bins
from .spec import Analysis, NoPart, Run

UTILIZATION_BINS = 200


def _combine(run: Run) -> dict[str, list[dict]]:
    """Per rank, the fraction of each of about ``bins`` equal time bins over
    the run's GPU span that its GPU was busy."""
    found = busy_bins.run_bins(run.results("utilization"), run.utilization_bins)
    if found is None:
        return {"utilization": []}
    base = run.base
    starts, ends = (found.starts - base).tolist(), (found.ends - base).tolist()
    widths = found.ends - found.starts
    rows = []
    for r, busy in zip(run.ranks, found.busy):
        fractions = np.round(np.divide(busy, widths, out=np.zeros_like(busy), where=widths > 0), 4).tolist()
        for n, (start, end, time_busy, fraction) in enumerate(zip(starts, ends, np.round(busy, 3).tolist(), fractions)):
            rows.append({"rank": r.rank, "bin": n, "start(us)": start, "end(us)": end, "gpu_busy(us)": time_busy,
                         "busy_fraction": fraction})
    return {"utilization": rows}


ANALYSIS = Analysis(
    name="utilization",
    tables={"utilization": ("rank", "bin", "start(us)", "end(us)", "gpu_busy(us)", "busy_fraction")},
    part=lambda context: NoPart(context, lambda _, swept: swept.busy),
    combine=_combine,
    sweeps=frozenset({"bins"}),
)
