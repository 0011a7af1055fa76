"""TraceLens's PyTorch perf report for one trace: its tables that need no
performance model (:mod:`.opstables`), its performance-model sheets
(:mod:`.opsheets`) and unified summary (:mod:`.unifiedperf`), by file
stem, with notes on what it leaves out."""
from __future__ import annotations

from typing import Callable

from . import opsgraphs, opstables
from .opsheets import model_sheets
from .opstables import OpsFacts, Table
from .unifiedperf import unified_perf_summary


def perf_tables(facts: OpsFacts, spec: dict | None = None, settle: Callable[..., None] = lambda *held: None,
                ) -> tuple[dict[str, Table], list[str]]:
    """TraceLens's tables for one trace, by file stem, and notes on what it
    leaves out; ``spec`` (TraceLens's arch JSON form) adds the roofline.
    ``settle`` is called after each stage with what later stages keep (the
    caller may move their arrays out of memory and give back the pages the
    stage read)."""
    notes = [f"{facts.untimed} host or GPU events without a numeric ts or dur left out (TraceLens fails on them)"
             ] if facts.untimed else []
    timeline = opstables.gpu_timeline(facts)
    if timeline is None:
        return {}, [*notes, "no GPU event is linked to a launch: TraceLens stops here ('No GPU events found in the "
                    "trace')"]
    tables = {"gpu_timeline": timeline[0]}
    total_us = timeline[1]
    settle()
    tree = opstables.OpTree(facts)
    settle(tree)
    graph_tables, graph_notes = opsgraphs.graph_report(tree)  # (beyond TraceLens: replays given to captured ops)
    tables.update(graph_tables)
    notes += graph_notes
    if facts.has_cpu_ops:
        rows = opstables.ops_rows(tree)
        settle(rows)
        if rows:
            for stem, table in (("ops_summary_by_category", opstables.ops_summary_by_category),
                                ("ops_summary", opstables.ops_summary)):
                tables[stem] = table(rows)
                settle()
            tables["ops_unique_args"] = opstables.ops_unique_args(tree, rows)
        del rows
        settle()
        unified, more = unified_perf_summary(tree, facts.signature_values, spec, settle)
        if unified is not None:
            tables["unified_perf_summary"] = unified
        notes += more
        settle()
        sheets, more = model_sheets(tree, facts.signature_values, spec)
        tables.update(sheets)
        notes += more
        settle()
    else:
        notes.append("no cpu_op in the trace: GPU-only tables, as TraceLens")
    if facts.python_stack:
        notes.append("python_func events: TraceLens's kernel tables refuse such traces (none written)")
        return tables, notes
    kernels = opstables.kernels(tree)
    settle(kernels)
    if len(kernels.g):
        tables["kernel_summary"] = opstables.kernel_summary(tree, kernels, total_us)
        settle()
        histogram, summary = opstables.short_kernels(tree, kernels, total_us)
        tables["short_kernel_histogram"] = histogram
        tables["short_kernels_summary"] = summary
    return tables, notes
