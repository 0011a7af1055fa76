"""HTA's kernel breakdown, and ``kernel_totals``.

Reads: the kept rows on a stream: name, duration (HTA's times), and for the
kernels, copies and sets their duration as the trace states it.
Keeps per rank: per name, count and duration statistics (bounded by the
names, which are interned).
Combines: kernel_breakdown, HTA's, gives each rank's top names per kernel
type (its ``duration_ratio``/``num_kernels`` rules), sorted by type, name,
rank; kernel_totals sums every name over all ranks.
Tables: kernel_breakdown (HTA's, times rounded as HTA rounds them),
kernel_totals (every name, the trace's own times, most time first).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ...algo import analysis as hta
from ...algo import sweeps
from .spec import Analysis, ChunkView, RankContext, Run, Swept


@dataclass
class KernelResult:
    """A rank's kernel_breakdown rows, and (name, type, count, total time) per name from the trace's own times."""

    rows: list
    totals: list


class KernelPart:
    def __init__(self, context: RankContext) -> None:
        self.context = context
        self.names, self.exact_names = sweeps.NameTotals(), sweeps.NameTotals()

    def feed(self, view: ChunkView) -> None:
        rows = view.rows
        self.names.add(rows.name, rows.dur)
        self.exact_names.add(rows.name[view.idle], rows.exact_dur[view.idle])

    def finish(self, swept: Swept) -> KernelResult:
        strings, name_type, rank = self.context.strings, self.context.name_type, self.context.rank
        rows = []
        for kind in hta.BREAKDOWN_TYPES:
            for row in hta.aggregate_names(self.names.stats(strings, np.flatnonzero(name_type == kind))):
                rows.append({"name": row["name"], "sum (us)": row["sum"], "max (us)": row["max"],
                             "min (us)": row["min"], "stddev": row["std"], "mean (us)": row["mean"],
                             "kernel_type": hta.TYPE_NAMES[kind], "rank": rank})
        exact = self.exact_names
        return KernelResult(rows, [(stats.name, hta.TYPE_NAMES[name_type[at]], stats.count, stats.total)
                                   for at, stats in zip(np.flatnonzero(exact.count).tolist(), exact.stats(strings))])

    def close(self) -> None:
        pass


def _combine(run: Run) -> dict[str, list[dict]]:
    results = run.results("kernels")
    return {"kernel_breakdown": sorted((row for result in results for row in result.rows),
                                       key=lambda row: (row["kernel_type"], row["name"], row["rank"])),
            "kernel_totals": _kernel_totals(results)}


def _kernel_totals(results: list[KernelResult]) -> list[dict]:
    """Every GPU row name over all ranks, with its type, count and total time from the trace's own times
    (kernel_breakdown, HTA's, rounds them and keeps 10 names per type and rank), most time first."""
    totals: dict[tuple[str, str], list] = {}
    for result in results:
        for name, kind, count, total in result.totals:
            known = totals.setdefault((name, kind), [0, 0.0])
            known[0] += count
            known[1] += total
    ordered = sorted(totals, key=lambda key: (-totals[key][1], key))
    return [{"name": name, "kernel_type": kind, "count": totals[(name, kind)][0],
             "sum (us)": round(totals[(name, kind)][1], 3)} for name, kind in ordered]


ANALYSIS = Analysis(
    name="kernels",
    tables={"kernel_breakdown": ("name", "sum (us)", "max (us)", "min (us)", "stddev", "mean (us)", "kernel_type",
                                 "rank"),
            "kernel_totals": ("name", "kernel_type", "count", "sum (us)")},
    part=KernelPart,
    combine=_combine,
)
