"""``convert TRACE OUT.parquet``: one row per event, for SQL (DuckDB, Polars, pandas).

One reading.  Each batch of events becomes an Arrow batch (typed columns,
``args`` as JSON text: :mod:`streamtrace.io.parquet`), gathered into row
groups written as the pass goes to a staging file in the spool directory.
The same pass runs the merged-trace index (:class:`MergedIndex`), so that
every pid's rank is decided as ``relink`` decides it.  Rows whose ``args``
state no rank are written with the rank the file states up front
(``distributedInfo``, when it can be read before the events); if the
decided rank of any of their pids differs, the staging file is copied with
its ``rank`` column replaced, else it is copied as it is.  With ``-j`` > 1 a
child process parses, indexes and builds the batches while this process
writes.
"""
from __future__ import annotations

import os
import shutil
import tempfile
import time
from typing import Callable, Iterable

import orjson

from ..engine.jobs import resolve_jobs
from ..engine.passes import EmitPlan, IndexResult, read_with_retries, retrying
from ..errors import TraceError
from ..io import parseproc
from ..io.jsonscan import member_value
from ..io.parquet import RowBuilder, RowGroupWriter, pack_batch, require_pyarrow, unpack_batch, write_with_ranks
from ..io.progress import Progress
from ..io.reader import ReadMode, ReadStats, TraceReader, event_loader, header_members
from ..io.sink import OutputTarget, SinkSpec, remove_quietly
from ..io.source import InputSource, SourceSpec
from ..resources import peak_rss_mb
from .mergedindex import MergedIndex, resolve

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


class _Pass:
    """What one reading leaves: the index, the rows' rank facts and the counts."""

    def __init__(self, drop: frozenset[str]) -> None:
        self.drop = drop
        self.index = MergedIndex()
        self.stated = bytearray()  # per row: 1 when its args state its rank
        self.unranked: set = set()  # pids of rows given the default rank
        self.dropped: dict[str, int] = dict.fromkeys(sorted(drop), 0)
        self.rows = 0

    def kept(self, events: list) -> list:
        if not self.drop:
            return events
        kept = []
        for event in events:
            cat = event.get("cat")
            if cat in self.drop:
                self.dropped[cat] += 1
            else:
                kept.append(event)
        return kept

    def add(self, writer: RowGroupWriter, batch, stated: bytes, unranked: set) -> None:
        writer.add(batch)
        self.stated += stated
        self.unranked |= unranked
        self.rows += batch.num_rows


def to_parquet(
    src: SourceSpec,
    dst: SinkSpec,
    *,
    drop_categories: Iterable[str] = (),
    overwrite: bool = False,
    salvage: bool = False,
    spool_dir: str | None = None,
    reread_remote: bool = False,
    progress: bool | None = False,
    jobs: int | str | None = None,
) -> dict:
    """Write every event of ``src`` (less ``drop_categories``) as a row of the Parquet file ``dst``.

    Returns the summary.
    """
    require_pyarrow()
    started = time.perf_counter()
    drop = frozenset(drop_categories)
    processes = resolve_jobs(jobs)
    with InputSource(src, spool_dir=spool_dir, reread_remote=reread_remote) as source:
        target = OutputTarget(dst, overwrite=overwrite, compress="none", inputs=[source.location])
        meter = Progress(source.size, enabled=progress)
        stated_rank = _rank_stated_up_front(source)
        handle, staging = tempfile.mkstemp(prefix="streamtrace-rows-", suffix=".parquet", dir=spool_dir)
        os.close(handle)
        try:
            if processes > 1 and parseproc.available(source):
                done, stats = retrying(source, _in_child(source, staging, drop, stated_rank, salvage, meter), meter)
            else:
                done, stats = read_with_retries(source, _in_process(staging, drop, stated_rank), salvage=salvage,
                                                progress=meter)
            read = time.perf_counter()
            resolved = resolve(done.index, stats.header + stats.trailer)
            rank_of = rank_lookup(resolved.rank_table(), stats.header + stats.trailer)
            as_written = all(rank_of(pid) == stated_rank for pid in done.unranked)
            with target.open() as out:
                if as_written:
                    with open(staging, "rb") as rows:
                        shutil.copyfileobj(rows, out, 1 << 20)
                else:
                    write_with_ranks(staging, out, done.stated, lambda pids: list(map(rank_of, pids)))
        finally:
            remove_quietly(staging)
    ranks = sorted({rank for rank in resolved.ranks.ranks if rank >= 0})
    return {
        **source.describe(),
        **stats.as_dict(),
        "output": target.name,
        "output_format": "parquet",
        "output_compression": "zstd",
        "output_bytes": os.path.getsize(target.path) if target.path else None,
        "rows_written": done.rows,
        "events_written": done.rows,
        "events_dropped": sum(done.dropped.values()),
        "dropped_categories": sorted(drop),
        "dropped_by_category": done.dropped,
        "ranks": ranks,
        "rank_map": resolved.rank_table(),
        "ranks_rewritten": not as_written,
        "warnings": [f"--drop-cat {cat}: no event has this category" for cat, count in done.dropped.items()
                     if not count],
        "pass_seconds": round(read - started, 3),
        "wall_seconds": round(time.perf_counter() - started, 3),
        "peak_rss_mb": peak_rss_mb(),
    }


def rank_lookup(rank_table: list[dict], members: list) -> Callable[[object], int | None]:
    """Each pid's rank as ``relink`` decides it (``rank_table``: its rank map);
    a pid the index never placed (no launch, GPU event or metadata: a
    CPU-only thread, Kineto's ``Record Window End``) has the file's
    ``distributedInfo.rank`` when that is how the file's pids were placed (a
    single rank's file), else none."""
    ranks = {row["pid"]: row["rank"] for row in rank_table}
    whole_file = None
    if all(row["rule"] == "distributedInfo.rank" for row in rank_table):
        distributed = member_value(members, "distributedInfo")
        rank = distributed.get("rank") if isinstance(distributed, dict) else None
        whole_file = rank if type(rank) is int and rank >= 0 else None
    return lambda pid: ranks.get(pid, whole_file)


def emit_rows(result: IndexResult, plan: EmitPlan, target: OutputTarget, rank_of: Callable[[object], int | None], *,
              progress: Progress | None = None) -> int:
    """Pass 2 of a two-pass command into a Parquet file: the spooled lines
    ``plan`` keeps, as rows (pids' ranks from ``rank_of``).  Returns the rows
    written; always deletes the spool."""
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
                    writer.add(builder.batch([load(line) for line in lines])[0])
                if progress is not None:
                    progress.update("pass 2", None, first, result.stats.events)
        return writer.rows_written
    finally:
        result.spool.close()
        if progress is not None:
            progress.done()


def _in_process(staging: str, drop: frozenset[str], stated_rank: int | None):
    """One reading here: index, build and write each batch."""

    def attempt(reader: TraceReader) -> tuple[_Pass, ReadStats]:
        done = _Pass(drop)
        visit = done.index.visit
        builder = RowBuilder(stated_rank)
        with open(staging, "wb") as out, RowGroupWriter(out, builder.schema) as writer:
            for events in reader.batches():
                for event in events:
                    visit(event)
                kept = done.kept(events)
                if kept:
                    done.add(writer, *builder.batch(kept))
        return done, reader.stats

    return attempt


def _in_child(source: InputSource, staging: str, drop: frozenset[str], stated_rank: int | None, salvage: bool,
              meter: Progress):
    """One reading with a parsing child: it indexes and builds the batches, this process writes them."""

    def run(mode: ReadMode) -> tuple[_Pass, ReadStats]:
        done = _Pass(drop)
        child_side = _Pass(drop)  # (a copy lives in the child after the fork: its index and counts)
        builder = RowBuilder(stated_rank)
        visit = child_side.index.visit

        def encode(events: list, first: int) -> tuple[bytes, None]:
            for event in events:
                visit(event)
            kept = child_side.kept(events)
            part = (child_side.index.take_part(), child_side.dropped, len(events))
            child_side.dropped = dict.fromkeys(child_side.dropped, 0)
            if not kept:
                return pack_batch(None, b"", set(), part), None
            return pack_batch(*builder.batch(kept), part), None

        events_seen = [0]
        with open(staging, "wb") as out, RowGroupWriter(out, builder.schema) as writer:

            def on_batch(payload: memoryview, _flagged: bool) -> None:
                batch, stated, unranked, (part, dropped, count) = unpack_batch(payload)
                done.index.absorb(part, 0, events_seen[0])
                events_seen[0] += count
                for cat, number in dropped.items():
                    done.dropped[cat] += number
                if batch is not None:
                    done.add(writer, batch, stated, unranked)

            stats = parseproc.parse_in_child(source, mode, None, on_batch, salvage=salvage, progress=meter,
                                             encode=encode)
        return done, stats

    return run


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
