"""``convert``: recompress or normalise a trace in one streaming pass.

With ``jobs`` > 1 and a large local file, a child process parses, drops and
encodes the events while this process writes (and compresses) them.
"""
from __future__ import annotations

import os
import struct
import time
from typing import Iterable, Sequence

from ..algo.secrets import Findings
from ..engine import parseproc
from ..engine.jobs import resolve_jobs
from ..engine.passes import read_with_retries, retrying
from ..errors import RobustModeNeeded, TraceError
from ..io.destinations import Destinations
from ..io.eventtext import dumped_batch, dumps_event, raise_if_container_field
from ..io.progress import Progress
from ..io.reader import ReadMode, ReadStats, TraceReader
from ..io.redact import (
    RedactOptions,
    Redactor,
    copy_screen,
    host_learner,
    learn_hosts_in_batch,
    learn_hosts_in_members,
    pseudonymizes_hosts,
    redaction_summary,
    restart_redaction,
)
from ..io.sink import OutputTarget, SinkSpec
from ..io.source import InputSource, SourceSpec
from ..io.writer import JoinedLines, TraceWriter
from ..resources import peak_rss_mb
from .toparquet import check_parquet_options, is_parquet, to_parquet


def _counts_struct(categories: int) -> struct.Struct:
    """Events kept in a batch the child sends, then those dropped per category."""
    return struct.Struct(f"<{1 + categories}Q")


def _not_rewindable() -> TraceError:
    return TraceError("needs a second reading in exact mode (big integers or raw control characters) but "
                      "output already went to a stream; write to a file instead")


def convert(
    src: SourceSpec | Sequence[str | os.PathLike],
    dst: SinkSpec,
    *,
    drop_categories: Iterable[str] = (),
    compress: str | None = None,
    level: int | None = None,
    overwrite: bool = False,
    salvage: bool = False,
    spool_dir: str | None = None,
    reread_remote: bool = False,
    progress: bool | str | None = False,
    jobs: int | str | None = None,
    redact: RedactOptions | bool | None = None,
    summary_file: str | os.PathLike | None = None,
) -> dict:
    """Copy ``src`` to ``dst`` event by event, dropping the given categories
    (and with ``redact``, replacing secrets: see :mod:`streamtrace.io.redact`).

    Output compression follows ``dst``'s suffix unless ``compress`` says
    otherwise; a ``.parquet`` suffix writes one row per event instead
    (:mod:`.toparquet`), which may also gather several inputs (``src`` a
    list of files, globs and directories).  Returns the summary.
    """
    if is_parquet(dst):
        check_parquet_options(compress, level, redact)
        return to_parquet(src, dst, drop_categories=drop_categories, overwrite=overwrite, salvage=salvage,
                          spool_dir=spool_dir, reread_remote=reread_remote, progress=progress, jobs=jobs,
                          summary_file=summary_file)
    if isinstance(src, (list, tuple)):
        if len(src) != 1:
            raise TraceError("several inputs go into one .parquet output only; a trace output takes one input "
                             "(merge or batch runs for several)")
        src = src[0]
    started = time.perf_counter()
    dropped_cats = frozenset(drop_categories)
    position = {cat: n for n, cat in enumerate(sorted(dropped_cats))}  # a dropped category's counter
    processes = resolve_jobs(jobs)
    redactor = Redactor.from_options(redact) or copy_screen()  # without --redact: counts the secrets copied
    with InputSource(src, spool_dir=spool_dir, reread_remote=reread_remote) as source:
        destinations = Destinations([source.location], overwrite=overwrite, summary=summary_file)
        target = destinations.target(dst, compress=compress, level=level, redactor=redactor)
        meter = Progress(source.size, enabled=progress)
        if pseudonymizes_hosts(redactor):
            redactor.finder.know_hosts(read_with_retries(source, _learn_hosts, salvage=salvage, progress=meter,
                                                         label="host names"))

        def attempt(reader: TraceReader) -> tuple[int, list[int], ReadStats]:
            restart_redaction(redactor)
            dropped = [0] * len(position)
            writer = None
            event = None
            with target.open() as out:
                try:
                    for event in reader.events():
                        if writer is None:
                            writer = TraceWriter(out, reader.stats.header, redactor)
                        if (cat := event.get("cat")) in dropped_cats:
                            dropped[position[cat]] += 1
                        else:
                            writer.event(dumps_event(event))
                except TypeError:
                    raise_if_container_field(event)
                    raise
                except RobustModeNeeded:
                    if not target.rewindable and writer is not None:
                        raise _not_rewindable().located(source.name) from None
                    raise
                if writer is None:
                    writer = TraceWriter(out, reader.stats.header, redactor)
                writer.close(reader.stats.trailer)
                return writer.events_written, dropped, reader.stats

        if processes > 1 and parseproc.available(source):
            run = _in_child(source, target, position, salvage, meter)
            written, dropped, stats = retrying(source, run, meter)
        else:
            written, dropped, stats = read_with_retries(source, attempt, salvage=salvage, progress=meter)
    return destinations.finish({
        **source.describe(),
        **stats.as_dict(),
        "output": target.name,
        "output_compression": target.compression,
        "events_written": written,
        "events_dropped": sum(dropped),
        "dropped_categories": sorted(dropped_cats),
        "dropped_by_category": dict(zip(position, dropped)),
        "warnings": [f"--drop-cat {cat}: no event has this category" for cat, count in zip(position, dropped)
                     if not count],
        **redaction_summary(redactor),
        "wall_seconds": round(time.perf_counter() - started, 3),
        "peak_rss_mb": peak_rss_mb(),
    })


def _learn_hosts(reader: TraceReader) -> dict[str, str]:
    """A first reading for ``--pseudonymize hosts``: the values under host
    keys anywhere (events, members before or after them), so that the
    writing pass replaces each wherever it appears, before or after the
    place that shows it is a host name."""
    learner, found = host_learner(), Findings()
    for events in reader.batches():
        learn_hosts_in_batch(learner, reader.batch_text, events, found)
    learn_hosts_in_members(learner, reader.stats.header + reader.stats.trailer, found)
    return found.hosts


def _in_child(source: InputSource, target: OutputTarget, position: dict[str, int], salvage: bool,
              meter: Progress):
    """One reading in ``mode`` with a parsing child: it drops, encodes and
    screens for the redactor, this process only writes."""
    counts = _counts_struct(len(position))

    def encode(events: list, first: int) -> tuple[bytes, None]:
        gone = [0] * len(position)
        if position:
            kept = []
            for event in events:
                at = position.get(event.get("cat"))
                if at is None:
                    kept.append(event)
                else:
                    gone[at] += 1
        else:
            kept = events
        lines = dumped_batch(kept, first)[1] if kept else b""
        return counts.pack(len(kept), *gone) + bytes(lines), None

    def run(mode: ReadMode) -> tuple[int, list[int], ReadStats]:
        restart_redaction(target.redactor)
        with target.open() as out:
            writers: list[TraceWriter] = []
            dropped = [0] * len(position)

            def on_header(members: list) -> None:
                writers.append(TraceWriter(out, members, target.redactor))

            def on_batch(payload: memoryview, flagged: bool) -> None:
                kept, *gone = counts.unpack_from(payload)
                writers[0].events(JoinedLines(bytes(payload[counts.size:]), kept), clean=not flagged)
                dropped[:] = map(int.__add__, dropped, gone)

            try:  # the child screens the lines it sends for the redactor, which looks only at those it flags
                stats = parseproc.parse_in_child(source, mode, None, on_batch, salvage=salvage, progress=meter,
                                                 encode=encode, on_header=on_header,
                                                 screen=target.redactor.finder.suspicious)
            except RobustModeNeeded:
                if not target.rewindable and writers:
                    raise _not_rewindable().located(source.name) from None
                raise
            writer = writers[0] if writers else TraceWriter(out, stats.header, target.redactor)
            writer.close(stats.trailer)
            return writer.events_written, dropped, stats

    return run
