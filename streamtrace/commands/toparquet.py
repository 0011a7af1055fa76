"""``convert TRACE OUT.parquet``: one row per event, for SQL (DuckDB, Polars, pandas).

One reading.  Each batch of events becomes an Arrow batch (typed columns,
``args`` as JSON text: :mod:`streamtrace.io.parquet`), gathered into row
groups written as the pass goes to a staging file in the spool directory.
The same pass gathers the merged-trace index's rank evidence
(:class:`RankIndex`), so that every pid's rank is decided as ``relink``
decides it.  Rows whose ``args``
state no rank are written with the rank the file states up front
(``distributedInfo``, when it can be read before the events); if the
decided rank of any of their pids differs, the staging file is copied with
its ``rank`` column replaced, else it is copied as it is.  With ``-j`` > 1,
pass-1 range workers parse, index and build the batches while this process
writes them.
"""
from __future__ import annotations

import os
import shutil
import tempfile
import time
from dataclasses import dataclass, field
from typing import Callable, Iterable, Sequence

import orjson

from ..algo.ranks import rank_from_file_name
from ..algo.secrets import Findings
from ..engine import parseproc
from ..engine.indexworkers import index_by_ranges
from ..engine.jobs import resolve_jobs
from ..engine.parallel import can_fork
from ..engine.passes import FAST, IndexResult, read_with_retries, with_screen
from ..engine.plan import EmitPlan
from ..errors import RobustModeNeeded, TraceError
from ..io.destinations import Destinations
from ..io.eventtext import event_loader, raise_if_container_field
from ..io.inputs import expand_inputs
from ..io.jsonscan import member_value
from ..io.parquet import RowBuilder, RowGroupWriter, copy_rows, pack_batch, require_pyarrow, unpack_batch
from ..io.progress import Progress
from ..io.reader import ReadStats, TraceReader, header_members
from ..io.redact import Redactor, copied_secrets, copy_screen
from ..io.sink import OutputTarget, SinkSpec, remove_quietly
from ..io.source import InputSource, SourceSpec
from ..resources import gc_paused, peak_rss_mb
from .mergedindex import RankIndex, rank_table, resolve_pid_ranks

TAIL_BYTES = 1 << 20  # where a plain file's members after the events are looked for before reading it


def is_parquet(dst: object) -> bool:
    """Does ``dst`` name a Parquet output (by its suffix)?"""
    return isinstance(dst, (str, os.PathLike)) and os.fspath(dst).lower().endswith(".parquet")


def check_parquet_options(compress: str | None, level: int | None, redact: object) -> None:
    """Refuse, before reading, what a Parquet output cannot do, and a missing ``parquet`` extra."""
    if compress not in (None, "none") or level is not None or redact:
        raise TraceError("a .parquet output takes no --compress, --level or --redact (its columns are "
                         "zstd-compressed; redact the trace first)")
    require_pyarrow()


class _Rows:
    """The events' sink of a Parquet output (see :class:`~streamtrace.engine.indexworkers.EventSink`):
    their rows gathered into row groups of the staging file, and what the
    ranks are checked against afterwards."""

    def __init__(self, staging: str, drop: frozenset[str], stated_rank: int | None) -> None:
        self.staging, self.drop, self.stated_rank = staging, drop, stated_rank
        self.builder = RowBuilder(stated_rank)
        self._file = None
        self.reset()

    def reset(self) -> None:
        """Start the staging file again (the input is being read again)."""
        self.abandon()
        self._file = open(self.staging, "wb")
        self.writer = RowGroupWriter(self._file, self.builder.schema)
        self.stated = bytearray()  # per row: 1 when its args state its rank
        self.unranked: set = set()  # pids of rows given the rank stated up front
        self.dropped: dict[str, int] = dict.fromkeys(sorted(self.drop), 0)
        self.rows = 0

    def frame_encoder(self) -> Callable[[list], bytes]:
        """Made in a pass-1 worker: a chunk's kept events as one message of rows."""
        builder, drop = RowBuilder(self.stated_rank), self.drop

        def encode(events: list) -> bytes:
            kept, dropped = _kept(events, drop)
            return pack_batch(*(builder.batch(kept) if kept else (None, b"", set())), dropped)

        return encode

    def add_frame(self, frame: bytes | memoryview, events: int) -> None:
        batch, stated, unranked, dropped = unpack_batch(memoryview(frame))
        self._add(batch, stated, unranked, dropped)

    def add_events(self, events: list, first_index: int) -> None:
        kept, dropped = _kept(events, self.drop)
        self._add(*(self.builder.batch(kept) if kept else (None, b"", set())), dropped)

    def _add(self, batch, stated: bytes, unranked: set, dropped: dict[str, int]) -> None:
        for cat, count in dropped.items():
            self.dropped[cat] += count
        if batch is not None:
            self.writer.add(batch)
            self.stated += stated
            self.unranked |= unranked
            self.rows += batch.num_rows

    def finish(self) -> None:
        self.writer.close()
        self._file.close()

    def abandon(self) -> None:
        """Stop writing (after a failure, or to start again)."""
        if self._file is not None and not self._file.closed:
            self.writer.abandon()
            self._file.close()


def _kept(events: list, drop: frozenset[str]) -> tuple[list, dict[str, int]]:
    """The events not dropped by category, and the count dropped of each category."""
    if not drop:
        return events, {}
    kept, dropped = [], dict.fromkeys(drop, 0)
    for event in events:
        cat = event.get("cat")
        if cat in drop:
            dropped[cat] += 1
        else:
            kept.append(event)
    return kept, dropped


@dataclass
class _Staged:
    """One input's rows in a staging file, and how its ranks stand."""

    path: str
    rows: _Rows | None = None
    rank_of: Callable[[object], int | None] | None = None
    as_written: bool = True  # every row has its rank already
    summary: dict = field(default_factory=dict)
    secrets: Findings = field(default_factory=Findings)  # in its events (the rows copy them; not its members)


def to_parquet(
    src: SourceSpec | Sequence[str | os.PathLike],
    dst: SinkSpec,
    *,
    drop_categories: Iterable[str] = (),
    overwrite: bool = False,
    salvage: bool = False,
    spool_dir: str | None = None,
    reread_remote: bool = False,
    progress: bool | str | None = False,
    jobs: int | str | None = None,
    summary_file: str | os.PathLike | None = None,
) -> dict:
    """Write every event of ``src`` (less ``drop_categories``) as a row of the Parquet file ``dst``.

    ``src`` may also be a list of files, globs, directories and archives (their trace
    files, :mod:`streamtrace.io.inputs`): their rows follow one another, each file's ranks decided
    on its own (a file whose pids get no rank takes the one its name states,
    ``rank<N>``/``worker<N>``).  Returns the summary.
    """
    require_pyarrow()
    started = time.perf_counter()
    drop = frozenset(drop_categories)
    processes = resolve_jobs(jobs)
    specs = list(src) if isinstance(src, (list, tuple)) else [src]
    named = all(isinstance(spec, (str, os.PathLike)) for spec in specs)
    inputs = expand_inputs(specs) if named else specs  # (an archive of several traces: its members, as a directory)
    several = len(inputs) > 1
    destinations = Destinations([os.fspath(path) for path in inputs if isinstance(path, (str, os.PathLike))],
                                overwrite=overwrite, summary=summary_file)
    target = destinations.target(dst, compress="none", holds="Parquet")
    staged: list[_Staged] = []
    try:
        for path in inputs:
            handle, staging = tempfile.mkstemp(prefix="streamtrace-rows-", suffix=".parquet", dir=spool_dir)
            os.close(handle)
            staged.append(_Staged(staging))
            _stage(path, staged[-1], several, drop, processes, salvage, spool_dir, reread_remote, progress)
        read = time.perf_counter()
        with target.open() as out:
            if len(staged) == 1 and staged[0].as_written:
                with open(staged[0].path, "rb") as rows:
                    shutil.copyfileobj(rows, out, 1 << 20)
            else:
                copy_rows([(one.path, one.rows.stated, None if one.as_written else _many(one.rank_of))
                           for one in staged], out)
    finally:
        for one in staged:
            remove_quietly(one.path)
    parts = [one.summary for one in staged]
    copied = Findings()
    for one in staged:
        copied.absorb(one.secrets, 0)
    dropped = {cat: sum(part["dropped_by_category"][cat] for part in parts) for cat in sorted(drop)}
    total = {"events": sum(part["events"] for part in parts), "rows_written": sum(part["rows_written"] for part in parts)}
    return destinations.finish({
        **(parts[0] if not several else {"input": f"{len(parts)} files", "inputs": parts, **total}),
        "output": target.name,
        "output_format": "parquet",
        "output_compression": "zstd",
        "output_bytes": os.path.getsize(target.path) if target.path else None,
        "events_written": total["rows_written"],
        "events_dropped": sum(dropped.values()),
        "dropped_categories": sorted(drop),
        "dropped_by_category": dropped,
        "warnings": [f"--drop-cat {cat}: no event has this category" for cat, count in dropped.items() if not count],
        **copied_secrets(copied),
        "pass_seconds": round(read - started, 3),
        "wall_seconds": round(time.perf_counter() - started, 3),
        "peak_rss_mb": peak_rss_mb(),
    })


def _many(rank_of: Callable[[object], int | None]) -> Callable[[list], list]:
    return lambda pids: list(map(rank_of, pids))


def _stage(src: SourceSpec, staged: _Staged, several: bool, drop: frozenset[str], processes: int, salvage: bool,
           spool_dir: str | None, reread_remote: bool, progress: bool | str | None) -> None:
    """One input's reading into its staging file, then its ranks decided."""
    with InputSource(src, spool_dir=spool_dir, reread_remote=reread_remote) as source:
        meter = Progress(source.size, enabled=progress)
        stated_rank = _rank_stated_up_front(source)
        screen = copy_screen()
        index, stats, rows = _read(source, staged.path, drop, stated_rank, processes, salvage, meter, screen)
        staged.secrets = screen.findings
        members = stats.header + stats.trailer
        ranks = rank_table(index, resolve_pid_ranks(index, members))
        rank_of = rank_lookup(ranks, members, rank_from_file_name(source.name) if several else None)
        staged.rows, staged.rank_of = rows, rank_of
        staged.as_written = all(rank_of(pid) == stated_rank for pid in rows.unranked)
        staged.summary = {
            **source.describe(),
            **stats.as_dict(),
            "rows_written": rows.rows,
            "dropped_by_category": rows.dropped,
            "ranks": sorted({row["rank"] for row in ranks if row["rank"] is not None}),
            "rank_map": ranks,
            "ranks_rewritten": not staged.as_written,
        }


def rank_lookup(rank_table: list[dict], members: list, named_rank: int | None = None
                ) -> Callable[[object], int | None]:
    """Each pid's rank as ``relink`` decides it (``rank_table``: its rank map);
    a pid the index never placed (no launch, GPU event or metadata: a
    CPU-only thread, Kineto's ``Record Window End``) has the file's
    ``distributedInfo.rank`` when that is how the file's pids were placed (a
    single rank's file), else none.  ``named_rank`` (the rank a file's name
    states) is the rank of every pid that would have none."""
    ranks = {row["pid"]: row["rank"] for row in rank_table}
    whole_file = None
    if all(row["rule"] == "distributedInfo.rank" for row in rank_table):
        distributed = member_value(members, "distributedInfo")
        rank = distributed.get("rank") if isinstance(distributed, dict) else None
        whole_file = rank if type(rank) is int and rank >= 0 else None
    def rank_of(pid: object) -> int | None:
        found = ranks.get(pid, whole_file)
        return named_rank if found is None else found

    return rank_of


def emit_rows(result: IndexResult, plan: EmitPlan, target: OutputTarget, rank_of: Callable[[object], int | None], *,
              progress: Progress | None = None, screen: Redactor | None = None) -> int:
    """Pass 2 of a two-pass command into a Parquet file: the spooled lines
    ``plan`` keeps, as rows (pids' ranks from ``rank_of``), counted by
    ``screen`` when given.  Returns the rows written; always deletes the spool."""
    require_pyarrow()
    load = event_loader(result.stats.exact_numbers)
    builder = RowBuilder(None, rank_of)
    try:
        with target.open() as out, RowGroupWriter(out, builder.schema) as writer:
            first = 0
            for block in result.spool.read_blocks():
                lines = plan.lines(block, first)
                first += len(block)
                if lines:
                    if screen is not None:
                        screen.text(b"\n".join(lines), writer.rows_written)
                    writer.add(builder.batch([load(line) for line in lines])[0])
                if progress is not None:
                    progress.update("pass 2", None, first, result.stats.events)
        return writer.rows_written
    finally:
        result.spool.close()
        if progress is not None:
            progress.done()


@gc_paused()
def _read(source: InputSource, staging: str, drop: frozenset[str], stated_rank: int | None, processes: int,
          salvage: bool, meter: Progress, screen: Redactor) -> tuple[RankIndex, ReadStats, _Rows]:
    """The one reading: with ``processes`` > 1, range workers parse, index
    and build the rows (:mod:`~streamtrace.engine.indexworkers`) while this
    process writes them; else (or when the input needs the ordinary reading)
    everything here.  ``screen`` counts the secrets of the events."""
    rows = _Rows(staging, drop, stated_rank)
    try:
        mode = FAST
        if processes > 1 and not salvage and can_fork() and (source.size is None or source.size >= parseproc.MIN_BYTES):
            try:
                ranges = index_by_ranges(source, RankIndex, rows, processes, meter, screen)
            except RobustModeNeeded as need:  # the ordinary reading starts in the mode the input needs
                ranges, mode = None, need.args[0]
            if ranges is not None:
                rows.finish()
                return ranges[0], ranges[1], rows  # type: ignore[return-value]

        def attempt(reader: TraceReader) -> tuple[RankIndex, ReadStats]:
            rows.reset()
            index = RankIndex()
            visit = index.visit
            scan = with_screen(None, screen)
            done = 0
            for events in reader.batches():
                try:
                    for event in events:
                        visit(event)
                    scan(reader.batch_text, events, done)
                    rows.add_events(events, done)
                except TypeError:
                    for event in events:
                        raise_if_container_field(event)
                    raise
                done += len(events)
            return index, reader.stats

        index, stats = read_with_retries(source, attempt, salvage=salvage, progress=meter, mode=mode)
        rows.finish()
        return index, stats, rows
    except BaseException:
        rows.abandon()
        raise


def _rank_stated_up_front(source: InputSource) -> int | None:
    """``distributedInfo.rank`` if it can be read before the events: in the
    members before them, or for a plain local file in its last bytes.  Only a
    first guess (checked once every pid's rank is decided), so a cheap look
    is enough."""
    if source.path is None:  # a pipe or URL: the events are read once, after this
        return None
    try:
        stream = source.open()
        found = member_value(header_members(stream), "distributedInfo")
        if found is None and stream.compression == "none" and source.file_bytes is not None:
            with open(source.file_bytes, "rb") as raw:
                raw.seek(max(0, (source.size or 0) - TAIL_BYTES))
                found = _distributed_info_in(raw.read())
    except (TraceError, OSError):
        return None
    rank = found.get("rank") if isinstance(found, dict) else None
    return rank if type(rank) is int and rank >= 0 else None


def _distributed_info_in(tail: bytes) -> object:
    at = tail.rfind(b'"distributedInfo"')
    if at < 0:
        return None
    start = tail.find(b"{", at)
    depth = 0
    for end in range(start, len(tail)):  # a small object: braces counted (a brace in a string only spoils the guess)
        depth += {0x7B: 1, 0x7D: -1}.get(tail[end], 0)
        if depth == 0:
            try:
                return orjson.loads(tail[start:end + 1])
            except orjson.JSONDecodeError:
                return None
    return None
