"""``analyze``: HTA's tables (Holistic Trace Analysis 0.5.0), streamed (SPEC 14).

One task per input file (``-j`` processes or a Dask cluster, :mod:`.analyses.task`):
pass 1 with :class:`AnalyzeIndex` keeps, per event that HTA reads (events
with a ``dur`` and a ``cat``), a few typed-array entries; its ranks are found
as ``relink`` finds them, so a merged multi-rank file gives each rank its own
tables.  Each rank's rows are read once, HTA's rules applied, feeding every
analysis the run asks for (:mod:`.analyses.registry`: all, or ``only``/``skip``);
each returns a small result per rank (launch statistics, one row per launched
kernel, go to a CSV part on disk).  Here, the coordinator: it runs the tasks,
gives every rank's results to each analysis to combine, and writes the
tables and the page.
"""
from __future__ import annotations

import dataclasses
import os
import time
from typing import Sequence

from ..engine.executors import TaskRunner, Work, shared_path
from ..engine.jobs import resolve_jobs
from ..errors import TraceError
from ..io import report as page
from ..io.destinations import Destinations
from ..io.inputs import expand_inputs, trace_names_in
from ..resources import peak_rss_mb
from .analyses import collectives  # TraceLens's collective report (SPEC 16), from what pass 1 collects
from .analyses import ops as ops_analysis  # TraceLens's perf report (SPEC 17): made in each input's task
from .analyses.index import AnalyzeIndex
from .analyses.launches import read_parts
from .analyses.registry import ANALYSES, COLUMNS, TABLES, selected, with_needs
from .analyses.spec import RankResult
from .analyses.tables import LAUNCH_TABLE, build_tables, claim_outputs, write_tables
from .analyses.task import FileResult, Options, analyze_file, analyze_file_in_store, discard
from .analyses.utilization import UTILIZATION_BINS
from .mergerank import rank_files_in

JSON_LAUNCH_ROWS = 100_000  # beyond this --json leaves the launch rows to -o DIR (as dicts they would take ~50 MB)
PAGE_ANALYSES = ("temporal", "kernels", "idle", "steps", "stragglers", "utilization")  # the tables the page draws


def analyze(srcs: str | os.PathLike | Sequence[str | os.PathLike], out_dir: str | None = None, *,
            jobs: int | str | None = None, dask: str | None = None, include_last_step: bool = False,
            ranks: set[int] | None = None, salvage: bool = False, spool_dir: str | None = None,
            overwrite: bool = False, num_candidates: int = 2, progress: bool | str | None = False,
            reread_remote: bool = False, utilization_bins: int = UTILIZATION_BINS, html: str | os.PathLike | None = None,
            command: str | None = None, summary_file: str | os.PathLike | None = None,
            only: str | Sequence[str] | None = None, skip: str | Sequence[str] | None = None,
            all2allv_heatmap: bool = False, ops: bool = False, gpu_spec: str | None = None,
            align_clocks: bool = False, collective_rows: bool | str = True) -> dict:
    """HTA's tables for every rank of the inputs; returns the summary, whose
    ``tables`` maps each table name to its rows (HTA's column names).

    ``srcs``: what ``merge`` accepts (files, globs, directories, archives,
    URLs), or one merged multi-rank file.  ``out_dir``: one CSV per table.
    ``html``: also write the report page there (needs ``streamtrace[report]``),
    its header naming ``command`` as what made it.  ``only``/``skip``:
    the analyses to run, or not (names, or ``NAME[,NAME]``; all by default):
    a skipped analysis writes no table and reads nothing of the input.
    Inputs with collective kernels also give TraceLens's collective tables
    (:mod:`.analyses.collectives`; ``all2allv_heatmap``: its heat map too; ``align_clocks``: the
    tables beyond TraceLens's on clocks aligned on collective ends).  ``ops``: also TraceLens's
    perf-report tables per input, under ``out_dir/ops/`` (see :mod:`.analyses.ops`), with the roofline
    of ``gpu_spec`` (TraceLens's arch JSON form) if given.  ``collective_rows``: the summary's tables
    carry the collective tables of a row per kernel or collective (up to
    :data:`.analyses.collectives.JSON_ROWS` rows each, a list of dicts: a table longer is None, its CSV
    has it); without (False), those are None and ``summary["collectives"]`` has what the report's lines
    say of them; ``"streamed"``: each is an iterable of its rows read from a temporary file one at a time
    (:class:`.analyses.collectives.SummaryRows`, written by :func:`streamtrace.io.streamjson.write` without
    being held), which the caller lets go with :func:`streamtrace.io.streamjson.close`.  ``summary_file``
    and ``html`` read the rows so, never holding a table's.
    """
    started = time.perf_counter()
    if collective_rows not in (True, False, "streamed"):
        raise TraceError(f"collective_rows is True, False or 'streamed', not {collective_rows!r}")
    if num_candidates < 1:
        raise TraceError(f"--candidates (num_candidates) must be at least 1, not {num_candidates}")
    specs = [srcs] if isinstance(srcs, (str, os.PathLike)) else list(srcs)
    picked = selected(only, skip)
    chosen = tuple(name for name in picked if name in ANALYSES)
    missing = [name for name in PAGE_ANALYSES if name not in chosen]
    if html is not None and missing:
        raise TraceError(f"--html draws the tables of {', '.join(PAGE_ANALYSES)}: it needs them all, and "
                         f"{', '.join(missing)} {'is' if len(missing) == 1 else 'are'} left out (--only/--skip)")
    files = _inputs(specs)
    destinations = Destinations(files, overwrite=overwrite, summary=summary_file)
    targets = claim_outputs(destinations, out_dir, html, chosen)
    collective_targets = collectives.claim(destinations, out_dir) if "collectives" in picked else {}
    if gpu_spec is not None and not ops:
        raise TraceError("--gpu-spec gives the roofline of the ops tables: add --ops")
    ops_spec = ops_analysis.prepare(destinations, out_dir, gpu_spec) if ops else None
    processes = resolve_jobs(jobs)
    alone = len(files) == 1 and dask is None  # one input: its pass 1 takes every process
    if files == ["-"] and not alone:
        raise TraceError("analyze --dask reads files or URLs the workers can reach, not stdin ('-')")
    with TaskRunner(1 if alone else processes, dask=dask, spool_dir=spool_dir, progress=progress, objects=True) as runner:
        if runner.distributed:
            files = [shared_path(path) for path in files]
        options = Options(include_last_step, salvage, runner.work_dir, reread_remote, processes if alone else 1,
                          analyses=with_needs(chosen), ops=ops, gpu_spec=ops_spec, collectives="collectives" in picked)
        per_file = _run(runner, files, options)
        results = [rank for result in per_file for rank in result.ranks]
        ops_files, ops_notes, ops_parts = ops_analysis.combine([result.ops for result in per_file if result.ops])
        collective = None
        try:  # (the launch parts are in the run's directory: done with before it goes)
            if ranks is not None:
                results = [result for result in results if result.rank in ranks]
            _refuse_repeated_ranks(results)
            launches = [result.results["launches"] for result in results if "launches" in chosen]
            parts = [launch.path for launch in launches if launch.path]
            tables = build_tables(results, chosen, num_candidates, utilization_bins)
            keep = collectives.JSON_ROWS if collective_rows or summary_file is not None or html is not None else 0
            collective = collectives.collective_report([result.collectives for result in sorted(results, key=lambda r: r.rank)
                                                        if result.collectives is not None and "collectives" in picked],
                                                       all2allv_heatmap, align_clocks, _local(spool_dir), keep)
            for result in results:
                result.collectives = None  # (their records are the report's now)
            collectives.add_causes(collective, tables)
            tables.update(collectives.as_records(collective, keep) if collective_rows is True
                          else collectives.streamed_records(collective))
            launch_rows = sum(launch.rows for launch in launches)
            notes = [note for result in per_file for note in result.notes]
            notes += [note for result in results for note in result.notes] + collective.notes + ops_notes
            summary = {
                "command": "analyze",
                "read": _read_totals([result.read for result in per_file]),
                "inputs": len(files),
                "ranks": sorted(result.rank for result in results),
                "devices": sorted({name for result in per_file for name in result.devices}),
                "rank_info": [{"rank": r.rank, "source": r.source, "pp_stage": r.pp_stage}
                              for r in sorted(results, key=lambda r: r.rank)],
                "output": list(targets.values()) + ([os.fspath(html)] if html is not None else []),
                "tables": tables,
                "kernel_launch_rows": launch_rows,
                "events_skipped": sum(result.skipped_events for result in per_file),
                "last_step_left_out": sorted(result.rank for result in results if result.last_step_left_out),
                "notes": notes,
                "pass1_seconds": round(sum(result.pass1_seconds for result in per_file), 3),
            }
            if collective.tables:
                summary["collectives"] = collective.figures
            if ops:
                summary["ops"] = ops_parts  # (what the page draws of each input's ops tables)
            if "launches" in chosen:
                tables[LAUNCH_TABLE] = None  # (read below from the parts, if few enough for --json)
            with destinations:  # the tables and the page appear together, or none of them
                write_tables(destinations, tables, parts, targets)
                summary["output"][len(targets):len(targets)] = collectives.write(destinations, collective, collective_targets)
                summary["output"] += ops_analysis.write(destinations, out_dir, ops_files)
                if html is not None:
                    destinations.write(html, page.render(summary, files, command), role="HTML report")
            if "launches" in chosen:
                tables[LAUNCH_TABLE] = read_parts(parts) if launch_rows <= JSON_LAUNCH_ROWS else None
        except BaseException:
            if collective is not None:
                collectives.close(collective)
            raise
        finally:
            for result in per_file:
                discard(result)
    summary["wall_seconds"] = round(time.perf_counter() - started, 3)
    summary["peak_rss_mb"] = peak_rss_mb()
    try:
        destinations.finish(summary)  # (the long tables' rows read from their files as it is written)
    except BaseException:
        collectives.close(collective)
        raise
    if collective_rows != "streamed":
        collectives.close(collective)
        if collective_rows is False:
            tables.update({name: None for name, rows in tables.items() if isinstance(rows, collectives.SummaryRows)})
    return summary


def _read_totals(reads: list[dict]) -> dict:
    """The inputs' readings together: counts summed, flags or-ed, names of the first."""
    total: dict = {}
    for read in reads:
        for key, value in read.items():
            if key not in total:
                total[key] = value
            elif isinstance(value, bool):
                total[key] = total[key] or value
            elif isinstance(value, int):
                total[key] += value
    return total


def _inputs(specs: list) -> list[str]:
    if not specs:
        raise TraceError("analyze needs at least one input")
    if [os.fspath(spec) for spec in specs] == ["-"]:
        return ["-"]  # read in this process (no worker could read this stdin)
    return expand_inputs(specs, _files_in)


def _files_in(directory: str) -> list[str]:
    """A directory's rank files, as merge takes them; its one trace when it holds one, ranked or not (HTA
    reads it as rank 0)."""
    traces = trace_names_in(directory)
    return [os.path.join(directory, traces[0])] if len(traces) == 1 else rank_files_in(directory)


def _run(runner: TaskRunner, files: list[str], options: Options) -> list[FileResult]:
    """Every input's ranks; files whose own step names disagree with all
    inputs' (HTA cuts by the names of every rank) run again."""
    per_file = _run_tasks(runner, files, options, "inputs done")
    wanted = len(set().union(*(result.step_names for result in per_file))) > 1
    again = [n for n, result in enumerate(per_file) if result.filtered != wanted]
    if again:
        forced = dataclasses.replace(options, filter_steps=wanted, ops=False)  # (the ops tables need no step cut)
        for n in again:
            discard(per_file[n])
        redone = _run_tasks(runner, [files[n] for n in again], forced, "inputs redone")
        for n, result in zip(again, redone):
            per_file[n] = dataclasses.replace(result, ops=per_file[n].ops)
    return per_file


def _run_tasks(runner: TaskRunner, files: list[str], options: Options, label: str) -> list[FileResult]:
    if runner.store is None:
        return list(runner.ordered(analyze_file, [(path, options) for path in files], label=label,
                                   work=Work.reading(files)))
    return list(runner.ordered(analyze_file_in_store, [(path, options, runner.store) for path in files], label=label))


def _local(spool_dir: str | None) -> str | None:
    """Where this process keeps temporary files: ``--spool-dir`` unless it is a bucket (a --dask run's)."""
    return None if spool_dir is None or "://" in spool_dir else spool_dir


def _refuse_repeated_ranks(results: list[RankResult]) -> None:
    seen: dict[int, str] = {}
    for result in results:
        if result.rank in seen:
            raise TraceError(f"rank {result.rank} is in {seen[result.rank]} and in {result.source}: "
                             "give each rank once (or --ranks)")
        seen[result.rank] = result.source



__all__ = ["ANALYSES", "AnalyzeIndex", "COLUMNS", "TABLES", "analyze"]
