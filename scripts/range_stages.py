"""Pass 1 as DuckDB reading the whole events range at once, stage by stage,
beside today's pass 1 and ``orjson.loads`` of the same events.

The first chunks of a trace are cut as pass-1 workers get them (as
``scripts/pass1_stages.py`` cuts them) and joined into one range of elements
(``{...},{...}``).  Each stage reads that whole range, in alternating rounds
in this one process, timed by the process's CPU clock (DuckDB runs one
thread: a JSON array is read by one thread whatever it is given, and the CPU
clock is steadier than the wall on a shared machine); the figures are
milliseconds of CPU per MB of range, medians of the rounds:

- ``orjson.loads`` of the range (the yardstick, collector off);
- today's pass 1 of ``inspect`` over the same chunks (``pass1_stages``:
  fold, read test, msgspec projection, secret screen, visit, part);
- DuckDB's ``read_json`` of the range with the columns ``inspect`` reads
  declared in DuckDB types, and an ``inspect``-like aggregate (events,
  span and kernel time per ph, cat and pid), the range handed over as a
  Python file-like object (and the share of that spent in Python serving its
  reads), or through a pipe fed by a thread (``/dev/fd``: DuckDB's own file
  reading), or through a decompressing file-like object (gzip, zstd) beside
  the decompression alone;
- the same aggregate with the columns read as JSON and their types checked
  in SQL (DuckDB casts ``"12"``, ``true`` and ``1.5`` to a declared
  integer silently: reading exactly as the fast reading does needs this or
  a test of the text);
- what DuckDB's parser takes and the fast reading refuses (NaN, a comma
  before a closing bracket, nesting beyond 1,024 levels): found by a strict
  parse that keeps nothing (msgspec), and the fast reading's own number and
  UTF-8 test on the folded text.

    python scripts/range_stages.py TRACE [--chunks 64] [--rounds 3]
"""
from __future__ import annotations

import argparse
import gc
import gzip
import io
import os
import statistics
import threading
import time
from typing import Callable

import duckdb
import msgspec
import orjson
import zstandard
from pass1_stages import first_chunks, time_stages

from streamtrace.algo.secrets import fold
from streamtrace.io.projection import read_alike

_DIGIT = "('-', '0', '1', '2', '3', '4', '5', '6', '7', '8', '9')"
TYPED = {"ph": "VARCHAR", "cat": "VARCHAR", "name": "VARCHAR", "pid": "BIGINT", "tid": "BIGINT",
         "ts": "DOUBLE", "dur": "DOUBLE", "args": "STRUCT(correlation BIGINT)"}
AS_JSON = {**{member: "JSON" for member in TYPED}, "args": "STRUCT(correlation JSON)"}
AGGREGATE = ("SELECT ph, cat, pid, count(*) AS events, min(ts), max(CASE WHEN ph = 'X' THEN ts + dur ELSE ts END), "
             "sum(dur) FILTER (WHERE cat IN ('kernel', 'Kernel')), count(*) FILTER (WHERE odd) AS odd "
             "FROM {rows} GROUP BY ALL")
TYPED_ROWS = "(SELECT *, false AS odd FROM {source})"


def _not_text(member: str) -> str:
    return f"left({member}::VARCHAR, 1) <> '\"'"


def _not_number(member: str) -> str:
    return f"left({member}::VARCHAR, 1) NOT IN {_DIGIT}"


def _not_integer(member: str) -> str:
    return f"({_not_number(member)} OR regexp_matches({member}::VARCHAR, '[.eE]'))"


CHECKED_ROWS = (
    "(SELECT (ph::VARCHAR)[2:-2] AS ph, (cat::VARCHAR)[2:-2] AS cat, pid::BIGINT AS pid, ts::DOUBLE AS ts, "
    "dur::DOUBLE AS dur, args.correlation::BIGINT AS correlation, coalesce("
    + " OR ".join([*map(_not_text, ("ph", "cat", "name")), *map(_not_integer, ("pid", "tid", "args.correlation")),
                   *map(_not_number, ("ts", "dur"))])
    + ", false) AS odd FROM {source})")
"""Rows with their members read as JSON text: ``odd`` where one is not of the
type the fast reading takes (a null or missing member is not odd)."""


class RangeView(io.RawIOBase):
    """A bytes object read by DuckDB as a file, keeping the time its reads take in Python."""

    def __init__(self, data: bytes) -> None:
        self._data = memoryview(data)
        self._at = 0
        self.seconds = 0.0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        self._at = offset if whence == io.SEEK_SET else self._at + offset if whence == io.SEEK_CUR \
            else len(self._data) + offset
        return self._at

    def tell(self) -> int:
        return self._at

    def readinto(self, buffer) -> int:
        started = time.process_time()
        count = min(len(buffer), len(self._data) - self._at)
        buffer[:count] = self._data[self._at:self._at + count]
        self._at += count
        self.seconds += time.process_time() - started
        return count


def aggregate(connection: duckdb.DuckDBPyConnection, source: object, checked: bool = False) -> list[tuple]:
    """The aggregate over the range, ``source`` a file-like object or a ``/dev/fd`` path;
    ``checked``: the members read as JSON and their types checked (:data:`CHECKED_ROWS`)."""
    columns, rows = (AS_JSON, CHECKED_ROWS) if checked else (TYPED, TYPED_ROWS)
    if isinstance(source, str):
        spec = "{" + ", ".join(f"'{member}': '{kind}'" for member, kind in columns.items()) + "}"
        table = f"read_json('{source}', format='array', records='true', columns={spec})"
        return connection.execute(AGGREGATE.format(rows=rows.format(source=table))).fetchall()
    relation = connection.read_json(source, format="array", records="true", columns=columns)
    return relation.query("events", AGGREGATE.format(rows=rows.format(source="events"))).fetchall()


def through_pipe(connection: duckdb.DuckDBPyConnection, data: bytes, checked: bool = False) -> list[tuple]:
    """The aggregate with the range written into a pipe by a thread and read by DuckDB as a file."""
    reading, writing = os.pipe()

    def feed() -> None:
        view = memoryview(data)
        try:
            while view:
                view = view[os.write(writing, view[:1 << 20]):]
        finally:
            os.close(writing)

    feeder = threading.Thread(target=feed, daemon=True)
    feeder.start()
    try:
        return aggregate(connection, f"/dev/fd/{reading}", checked)
    finally:
        feeder.join()
        os.close(reading)


_SKIP = msgspec.json.Decoder(list[msgspec.Struct])


def stages(texts: list[bytes]) -> tuple[dict[str, Callable[[], object]], list[float]]:
    """Each stage as a function of no argument over the range the chunks make, and
    where the file-like stage notes the time Python spends serving its reads."""
    elements = b",".join(texts)
    array = b"[" + elements + b"]"
    compressed = {"gzip": gzip.compress(array, 6), "zstd": zstandard.ZstdCompressor(level=3).compress(array)}
    connection = duckdb.connect(config={"threads": 1, "preserve_insertion_order": True})
    view_share: list[float] = []

    def view() -> object:
        source = RangeView(array)
        result = aggregate(connection, source)
        view_share.append(source.seconds)
        return result

    def opened(kind: str) -> io.RawIOBase:
        if kind == "gzip":
            return gzip.GzipFile(fileobj=io.BytesIO(compressed["gzip"]))
        return zstandard.ZstdDecompressor().stream_reader(io.BytesIO(compressed["zstd"]))

    return {
        "orjson.loads (yardstick)": lambda: orjson.loads(array),
        "today's pass 1 of inspect": lambda: time_stages(texts, "inspect"),
        "DuckDB, file-like object": view,
        "DuckDB, pipe (/dev/fd)": lambda: through_pipe(connection, array),
        "DuckDB, pipe, types checked in SQL": lambda: through_pipe(connection, array, checked=True),
        "strict parse keeping nothing (msgspec)": lambda: _SKIP.decode(array),
        "fold + read test (today's)": lambda: read_alike(elements, fold(elements)),
        "gzip decompression alone": lambda: opened("gzip").read(),
        "DuckDB, gzip file-like object": lambda: aggregate(connection, opened("gzip")),
        "zstd decompression alone": lambda: opened("zstd").read(),
        "DuckDB, zstd file-like object": lambda: aggregate(connection, opened("zstd")),
    }, view_share


def timed(run: Callable[[], object]) -> float:
    """CPU seconds of one run, the collector off (as the yardstick runs)."""
    gc.collect()
    gc.disable()
    try:
        started = time.process_time()
        result = run()
        spent = time.process_time() - started
    finally:
        gc.enable()
    del result
    return spent


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("trace", help="an uncompressed or compressed trace")
    parser.add_argument("--chunks", type=int, default=64, help="chunks of about 1 MiB in the range (default 64)")
    parser.add_argument("--rounds", type=int, default=3, help="alternating rounds; medians shown (default 3)")
    arguments = parser.parse_args()
    texts = first_chunks(arguments.trace, arguments.chunks)
    if not texts:
        raise SystemExit("range_stages.py: the trace is read whole, not in chunks for workers: too small to time")
    runs, view_share = stages(texts)
    megabytes = (sum(map(len, texts)) + len(texts) + 1) / 1e6
    spent: dict[str, list[float]] = {stage: [] for stage in runs}
    for _ in range(arguments.rounds):
        for stage, run in runs.items():
            spent[stage].append(timed(run))
    yardstick = statistics.median(spent["orjson.loads (yardstick)"])
    print(f"{len(texts)} chunks, {megabytes:.1f} MB; CPU ms per MB, medians of {arguments.rounds} rounds")
    for stage, seconds in spent.items():
        median = statistics.median(seconds)
        print(f"  {stage:42s} {median / megabytes * 1e3:6.2f}  {median / yardstick:5.2f}x orjson")
    print(f"  {'(Python serving the file-like reads)':42s} {statistics.median(view_share) / megabytes * 1e3:6.2f}")


if __name__ == "__main__":
    main()
