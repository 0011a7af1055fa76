"""The analyses ``analyze`` knows, by name, and which of them a run asks for.

Adding an analysis: its module (a docstring saying what it reads, keeps per
rank, how ranks combine and which tables it writes; an :class:`~.spec.Analysis`
named ``ANALYSIS``) and its line here (see CONTRIBUTING.md).
"""
from __future__ import annotations

from typing import Iterable

from ...errors import TraceError
from . import idle, kernels, launches, steps, stragglers, temporal, utilization
from .spec import Analysis

ANALYSES: dict[str, Analysis] = {analysis.name: analysis for analysis in (
    temporal.ANALYSIS,
    kernels.ANALYSIS,
    idle.ANALYSIS,
    launches.ANALYSIS,
    steps.ANALYSIS,
    stragglers.ANALYSIS,
    utilization.ANALYSIS,
)}
REPORTS = ("collectives",)
"""Analyses that keep their own tables and writer beside the registry's (TraceLens's collective report, whose
columns depend on the trace: :mod:`.collectives`), chosen by name like the others."""
# The order tables are written in (CSV files, the summary): HTA's and their companions as analyze has always
# written them, then the other analyses' tables in the registry's order.
_FIRST = ("temporal_breakdown", "kernel_type_breakdown", "kernel_breakdown", "comm_comp_overlap", "idle_time_breakdown",
          "kernel_launch_stats", "profiler_steps", "step_times", "stragglers", "stragglers_nccl_all", "utilization", "gpu_time",
          "kernel_totals")


def _names(given: str | Iterable[str] | None, option: str) -> list[str]:
    """Analysis names from ``NAME[,NAME]`` text or a list of names; unknown names refused in one line."""
    if given is None:
        return []
    names = [name.strip() for part in ([given] if isinstance(given, str) else given) for name in part.split(",")]
    unknown = [name for name in names if name not in ANALYSES and name not in REPORTS]
    if unknown:
        raise TraceError(f"{option}: no analysis named {', '.join(map(repr, unknown))}; the analyses are "
                         f"{', '.join((*ANALYSES, *REPORTS))}")
    return names


def selected(only: str | Iterable[str] | None = None, skip: str | Iterable[str] | None = None) -> tuple[str, ...]:
    """The analyses a run asks for, in the registry's order (then :data:`REPORTS`): all, or ``only`` these,
    less ``skip``."""
    known = (*ANALYSES, *REPORTS)
    wanted = set(_names(only, "--only")) if only is not None else set(known)
    wanted -= set(_names(skip, "--skip"))
    if not wanted:
        raise TraceError("--only/--skip leave no analysis to run; the analyses are " + ", ".join(known))
    return tuple(name for name in known if name in wanted)


def with_needs(names: Iterable[str]) -> tuple[str, ...]:
    """The analyses to compute per rank: those asked for and those whose results they read."""
    found = {name for name in names if name in ANALYSES}
    while True:
        more = {need for name in found for need in ANALYSES[name].needs} - found
        if not more:
            return tuple(name for name in ANALYSES if name in found)
        found |= more


def tables_of(names: Iterable[str]) -> tuple[str, ...]:
    """The tables these analyses write, in the order written (read from :data:`ANALYSES` as it is now: a test
    may register an analysis of its own)."""
    mine = dict.fromkeys(table for name in names for table in ANALYSES[name].tables)
    return tuple(table for table in _FIRST if table in mine) + tuple(table for table in mine if table not in _FIRST)


def columns_of(table: str) -> tuple[str, ...]:
    """A table's columns, as the analysis writing it declares them."""
    return next(analysis.tables[table] for analysis in ANALYSES.values() if table in analysis.tables)


TABLES: tuple[str, ...] = tables_of(ANALYSES)
COLUMNS: dict[str, tuple[str, ...]] = {table: columns_of(table) for table in TABLES}
