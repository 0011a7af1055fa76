"""``convert``: recompress or normalise a trace in one streaming pass."""
from __future__ import annotations

import time
from typing import Iterable

from ..engine.passes import read_with_retries
from ..errors import RobustModeNeeded, TraceError
from ..io.progress import Progress
from ..io.reader import ReadStats, TraceReader, dumps_event, raise_if_container_field
from ..io.sink import OutputTarget, SinkSpec
from ..io.source import InputSource, SourceSpec
from ..io.writer import TraceWriter
from ..resources import peak_rss_mb


def convert(
    src: SourceSpec,
    dst: SinkSpec,
    *,
    drop_categories: Iterable[str] = (),
    compress: str | None = None,
    level: int | None = None,
    overwrite: bool = False,
    salvage: bool = False,
    spool_dir: str | None = None,
    progress: bool | None = False,
) -> dict:
    """Copy ``src`` to ``dst`` event by event, dropping the given categories.

    Output compression follows ``dst``'s suffix unless ``compress`` says
    otherwise.  Returns the summary.
    """
    started = time.perf_counter()
    dropped_cats = frozenset(drop_categories)
    with InputSource(src, spool_dir=spool_dir) as source:
        target = OutputTarget(dst, overwrite=overwrite, compress=compress, level=level, inputs=[source.path])
        meter = Progress(source.size, enabled=progress)

        def attempt(reader: TraceReader) -> tuple[int, int, ReadStats]:
            dropped = 0
            writer = None
            event = None
            with target.open() as out:
                try:
                    for event in reader.events():
                        if writer is None:
                            writer = TraceWriter(out, reader.stats.header)
                        if event.get("cat") in dropped_cats:
                            dropped += 1
                        else:
                            writer.event(dumps_event(event))
                except TypeError:
                    raise_if_container_field(event)
                    raise
                except RobustModeNeeded:
                    if not target.rewindable and writer is not None:
                        raise TraceError(
                            "needs a second reading in exact mode (big integers or raw control "
                            "characters) but output already went to a stream; write to a file instead",
                            path=source.name,
                        ) from None
                    raise
                if writer is None:
                    writer = TraceWriter(out, reader.stats.header)
                writer.close(reader.stats.trailer)
                return writer.events_written, dropped, reader.stats

        written, dropped, stats = read_with_retries(source, attempt, salvage=salvage, progress=meter)
    return {
        "input": source.name,
        **stats.as_dict(),
        "output": target.name,
        "output_compression": target.compression,
        "events_written": written,
        "events_dropped": dropped,
        "dropped_categories": sorted(dropped_cats),
        "wall_seconds": round(time.perf_counter() - started, 3),
        "peak_rss_mb": peak_rss_mb(),
    }
