"""``slice``: cut a trace into pieces a viewer can open (SPEC 10).

Pass 1 (:class:`SliceIndex`) keeps the merged index (launches, GPU events,
rank evidence), the ``ProfilerStep#N`` spans and the flow keys in memory,
and spills per event its start, end, pid, ``args.rank`` and a few flags to
disk (:class:`~streamtrace.io.spool.ColumnSpill`): memory stays bounded
whatever the event count.  Between the passes every event gets a verdict
from those columns, chunk by chunk with numpy: kept, or the first reason it
is dropped.  GPU events take the step of their launch (by (rank,
correlation)), since GPU work lags the CPU; flows are kept only where a start
and an end of the same flow are both kept, and the metadata of exactly the
pids that keep an event.  Pass 2 copies the kept lines unchanged.
"""
from __future__ import annotations

import itertools
import os
import re
import shutil
import tempfile
import time
from contextlib import ExitStack
from typing import Iterable

import numpy as np

from ..engine.jobs import resolve_jobs
from ..engine.passes import IndexResult, emit_pass, index_pass, screen_of_copy
from ..engine.plan import EmitPlan
from ..errors import TraceError
from ..io.configfiles import load_rank_map
from ..io.destinations import Destinations
from ..io.progress import Progress
from ..io.redact import RedactOptions, Redactor, pseudonymizes_hosts, redaction_summary
from ..io.sink import OutputTarget, SinkSpec, publish_all
from ..io.source import InputSource, SourceSpec
from ..io.writer import TraceWriter
from ..resources import peak_rss_mb
from .sliceindex import METADATA_EVERYWHERE, REASONS, SliceIndex, selection_of
from .sliceplan import Metadata, Planner, no_file_for, number_ranges, plan_slice
from .split import max_open_writers
from .toparquet import check_parquet_options, emit_rows, is_parquet, rank_lookup


class SlicePlan(EmitPlan):
    """Pass 2 of a single output: kept lines copied unchanged, the others dropped."""

    _KEEP = bytes.maketrans(b"\x00\x01", b"\x01\x00")

    def __init__(self, destination: np.ndarray) -> None:
        self.actions = destination.base if isinstance(destination.base, bytearray) else bytearray(destination)

    def lines(self, block: list[bytes], first_index: int) -> list[bytes]:
        wanted = self.actions[first_index:first_index + len(block)]
        if wanted.count(0) == len(block):
            return block
        return list(itertools.compress(block, wanted.translate(self._KEEP)))


def _write_each_step(result: IndexResult, destination: np.ndarray, metadata: Metadata, numbers: list[int],
                     chosen: list[int], staging: str, names: dict[int, str], compress: str, level: int | None,
                     redactor: Redactor | None) -> dict[int, int]:
    """One file per chosen step id, as many open at once as ``split`` opens (a spool reading per group)."""
    counts: dict[int, int] = {}
    stats = result.stats
    group_size = max_open_writers(None)
    for first in range(0, len(chosen), group_size):
        group = chosen[first:first + group_size]
        with ExitStack() as stack:
            writers: dict[int, TraceWriter] = {}
            for step in group:
                target = OutputTarget(os.path.join(staging, names[step]), compress=compress, level=level,
                                      background=False)  # a compressor thread per file would cost MBs each
                writers[step] = TraceWriter(stack.enter_context(target.open()), stats.header, redactor)
            batches: dict[int, list[bytes]] = {step: [] for step in group}
            position = ordinal = 0
            for block in result.spool.read_blocks():
                goes = destination[position:position + len(block)].tolist()
                position += len(block)
                for line, step in zip(block, goes):
                    if step >= 0:
                        batch = batches.get(step)
                        if batch is not None:
                            batch.append(line)
                    elif step == METADATA_EVERYWHERE:
                        for target_step in metadata.steps[ordinal]:
                            batch = batches.get(target_step)
                            if batch is not None:
                                batch.append(line)
                        ordinal += 1
                for step, batch in batches.items():
                    if batch:
                        writers[step].events(batch)
                        batches[step] = []
            if position != len(destination):
                raise TraceError(f"validation failed: {position} events spooled, {len(destination)} indexed")
            for step, writer in writers.items():
                writer.close(stats.trailer)
                counts[step] = writer.events_written
    return counts


SUFFIXES = {"gzip": ".json.gz", "zstd": ".json.zst", "none": ".json"}


def slice_trace(
    src: SourceSpec,
    dst: SinkSpec | str | os.PathLike,
    *,
    steps: str | set[int] | None = None,
    window: str | None = None,
    ranks: str | set[int] | None = None,
    pids: str | Iterable[object] | None = None,
    drop_categories: Iterable[str] = (),
    drop_name: str | re.Pattern | None = None,
    max_mb: float | None = None,
    each_step: bool = False,
    rank_map: str | dict | None = None,
    overwrite: bool = False,
    compress: str | None = None,
    level: int | None = None,
    salvage: bool = False,
    spool_dir: str | None = None,
    reread_remote: bool = False,
    progress: bool | str | None = False,
    jobs: int | str | None = None,
    redact: RedactOptions | bool | None = None,
    summary_file: str | os.PathLike | None = None,
) -> dict:
    """Write the events of ``src`` that the selection keeps to ``dst`` (with
    ``each_step``: one ``step<N>.json.gz`` per step into the directory ``dst``).

    ``steps`` ("3,5-6"), ``window`` ("START:END", us/ms/s, "+" = after the
    first event), ``ranks`` ("0-3,7"), ``pids``, ``drop_categories`` and
    ``drop_name`` (a regex) all must hold; ``max_mb`` takes the longest run of
    consecutive steps that fits (without ``steps``: the whole trace when it
    fits).  A selection that keeps no event raises TraceError before anything
    is written.  Returns the summary.
    """
    started = time.perf_counter()
    selection = selection_of(steps, window, ranks, pids, drop_categories, drop_name, max_mb, each_step)
    processes = resolve_jobs(jobs)
    mapping = load_rank_map(rank_map) if isinstance(rank_map, str) else rank_map
    if each_step:
        compress = compress or "gzip"
        if compress not in SUFFIXES:
            raise TraceError(f"unknown compression {compress!r}; choose from {', '.join(SUFFIXES)}")
    rows = not each_step and is_parquet(dst)  # a Parquet file of the kept events
    if rows:
        check_parquet_options(compress, level, redact)
    redactor = Redactor.from_options(redact)  # one for every file: pseudonyms agree across them
    with InputSource(src, spool_dir=spool_dir, reread_remote=reread_remote) as source:
        destinations = Destinations([source.location], overwrite=overwrite, summary=summary_file)
        if each_step:
            directory = destinations.directory(_output_directory(dst), writes="--each-step files",
                                               existing=rf"step\d+{re.escape(SUFFIXES[compress])}")
        target = None if each_step else destinations.target(dst, compress=compress, level=level, redactor=redactor,
                                                            holds="Parquet" if rows else "JSON")
        meter = Progress(source.size, enabled=progress)
        result = index_pass(source, lambda: SliceIndex(selection, spool_dir), keep_events=True, spool_dir=spool_dir,
                            salvage=salvage, progress=meter, jobs=processes, learn_hosts=pseudonymizes_hosts(redactor))
        redactor = screen_of_copy(result, redactor)
        if target is not None:
            target.redactor = None if rows else redactor
        index: SliceIndex = result.visitor  # type: ignore[assignment]
        empty_steps: list[int] = []  # --each-step: steps the selection keeps nothing of
        try:
            planner, rank_table, taken, (verdicts, destination, metadata) = plan_slice(index, result, selection, mapping)
            planned = time.perf_counter()
            if each_step:
                empty_steps = planner.drop_steps_without_events(destination)
                taken = [number for number in taken if number not in empty_steps]
                files = _emit_each_step(result, planner, destination, metadata, directory, compress, level,
                                        destinations, redactor)
                written = sum(files.values())
                output = {"output_dir": directory, "files": files,
                          "output_bytes": sum(os.path.getsize(os.path.join(directory, name)) for name in files)}
        except BaseException:
            result.spool.close()
            index.spill.close()
            raise
        if not each_step:
            index.spill.close()
            if rows:
                rank_of = rank_lookup(rank_table, result.stats.header + result.stats.trailer)
                written = emit_rows(result, SlicePlan(destination), target, rank_of, progress=meter, screen=redactor)
            else:
                written = emit_pass(result, SlicePlan(destination), target, progress=meter, jobs=processes)
            output = {"output": target.name, "output_compression": target.compression,
                      "output_bytes": os.path.getsize(target.path) if target.path else None}
        else:
            result.spool.close()
            index.spill.close()
    reasons = {name: int(count) for name, count in zip(REASONS, verdicts.reasons) if name != "kept" and count}
    summary = {
        **source.describe(),
        **output,
        "steps_found": {str(rank): number_ranges(numbers) for rank, numbers in planner.steps.found.items()},
        "steps_selected": taken,
        "whole_trace_fits": taken is None if selection.max_mb is not None else None,
        "window_us": list(planner.window) if selection.window is not None else None,
        "events_read": result.stats.events,
        "events_written": written,
        "events_dropped": reasons,
        "flow_events": verdicts.flows_total,
        "flow_events_kept": verdicts.flows_kept,
        "flow_events_dropped_without_partner": verdicts.flows_without_partner,
        "flow_events_unpaired_in_input": verdicts.flows_unpaired_in_input,
        "rank_map": rank_table,
        "warnings": [no_file_for(empty_steps)] if empty_steps else [],
        "read": result.stats.as_dict(),
        **redaction_summary(redactor),
        "pass1_seconds": round(result.seconds, 3),
        "plan_seconds": round(planned - started - result.seconds, 3),
        "wall_seconds": round(time.perf_counter() - started, 3),
        "peak_rss_mb": peak_rss_mb(),
    }
    return destinations.finish(summary)



FILE_NAME = re.compile(r"\.(json|gz|zst|parquet|csv)$", re.IGNORECASE)


def _output_directory(dst: object) -> str:
    """``--each-step``'s directory; a file's name (``steps.json.gz``) is refused, not made a directory."""
    if not isinstance(dst, (str, os.PathLike)) or dst == "-":
        raise TraceError("--each-step writes a directory: give its path as the output")
    path = os.fspath(dst)
    if FILE_NAME.search(path) and not os.path.isdir(path):
        raise TraceError(f"--each-step writes one file per step into a directory, and -o {path} names a file; "
                         f"give a directory, e.g. -o {FILE_NAME.sub('', path.rstrip(os.sep)).removesuffix('.json')}/")
    return path


def _emit_each_step(result: IndexResult, planner: Planner, destination: np.ndarray, metadata: Metadata,
                    directory: str, compress: str, level: int | None, destinations: Destinations,
                    redactor: Redactor | None) -> dict[str, int]:
    """Write every chosen step's file into a staging directory, then move them all into place."""
    numbers = planner.steps.numbers
    chosen = planner.chosen.tolist()
    names = {step: f"step{numbers[step]}{SUFFIXES[compress]}" for step in chosen}
    destinations.claim_all(os.path.join(directory, name) for name in names.values())  # before any is written
    created = not os.path.isdir(directory)
    os.makedirs(directory, exist_ok=True)
    staging = tempfile.mkdtemp(prefix=".streamtrace-slice-", dir=directory)
    try:
        counts = _write_each_step(result, destination, metadata, numbers, chosen, staging, names, compress, level,
                                  redactor)
        publish_all([(os.path.join(staging, names[step]), os.path.join(directory, names[step])) for step in chosen],
                    destinations.overwrite)
    except BaseException:
        if created:
            shutil.rmtree(directory, ignore_errors=True)
        raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return {names[step]: counts[step] for step in chosen}
