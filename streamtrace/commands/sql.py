"""``sql TRACE... QUERY``: SQL over the events of a trace of any size, in bounded memory.

The events become the rows ``convert TRACE OUT.parquet`` writes
(:mod:`.toparquet`: typed columns, ``args`` as JSON text, each row's rank
as ``relink`` decides it; several inputs are one table, each file's rows in
turn), in a Parquet file in a scratch directory.  DuckDB reads that file as
the view ``events`` under a memory limit, spilling what does not fit to the
same directory, and the answer is fetched in batches and written as they
come (a table as text, or CSV).  The scratch directory is removed whatever
happens.

Parquet rather than DuckDB's JSON reader over the event text: the rows are
exact where that reader is not (it refuses text the reading repairs, such as
bad UTF-8, fails on an integer beyond 64 bits in an integer column, rewrites
the numbers in the JSON text it keeps, and knows no ranks); the conversion
is most of the time (docs/input-handling.md, "SQL").

DuckDB runs in a helper thread: it holds the thread that calls it until a
query step ends, so the main thread stays free to take a stop (Ctrl-C,
SIGTERM), interrupt the query and clean up.
"""
from __future__ import annotations

import csv
import io
import os
import re
import shutil
import tempfile
import threading
import time
from decimal import Decimal
from itertools import chain
from typing import BinaryIO, Callable, Iterator, Sequence, TypeVar

import duckdb
import orjson

from ..engine.jobs import resolve_jobs
from ..errors import TraceError
from ..io.destinations import Destinations
from ..io.scratch import check_local_spool_dir
from ..io.sink import SinkSpec
from ..io.source import SourceSpec
from ..resources import peak_rss_mb
from .mergerank import discover_inputs
from .toparquet import to_parquet

DEFAULT_MEMORY_MB = 256
MIN_MEMORY_MB = 32
FETCH_ROWS = 2048  # rows per fetch: the answer is never held whole
STOP_WAIT_SECONDS = 10.0  # after a stop, how long the interrupted query may take to give up
CONVERSION_ONLY = ("output", "output_format", "output_compression", "output_bytes", "events_written",
                   "events_dropped", "dropped_categories", "dropped_by_category", "pass_seconds",
                   "wall_seconds", "peak_rss_mb")
"""Keys of the conversion's summary that describe its scratch file, not the trace."""
_CSV_AS_IS = {str, int, float, type(None)}  # what the csv module writes as _cell would (None empty, floats exact)
_POSITION = re.compile(r"^LINE (\d+): ")
_T = TypeVar("_T")


class _Stopped(Exception):
    """The main thread took a stop: the helper thread ends its writing."""


def sql(
    src: SourceSpec | Sequence[str | os.PathLike],
    query: str,
    output: SinkSpec | None = None,
    *,
    csv_format: bool | None = None,
    overwrite: bool = False,
    memory_mb: int = DEFAULT_MEMORY_MB,
    salvage: bool = False,
    spool_dir: str | None = None,
    reread_remote: bool = False,
    progress: bool | str | None = False,
    jobs: int | str | None = None,
    summary_file: str | os.PathLike | None = None,
) -> dict:
    """Run ``query`` over the table ``events`` of ``src`` (a trace, or a list
    of files, globs, directories and archives as ``merge`` takes them).

    With ``output`` (a path, ``-`` or a binary file object) the answer is
    written there as it is fetched, CSV when ``csv_format`` or when the
    output's name ends in ``.csv`` (before a compression suffix), else a
    table as text; the summary counts its rows (``row_count``).  Without,
    the summary also holds the answer itself (``rows``: a list of tuples, in
    memory; for small answers).  DuckDB gets ``memory_mb`` MB and ``jobs``
    threads.  Returns the summary.
    """
    started = time.perf_counter()
    if not query.strip():
        raise TraceError("the query is empty; give a SQL statement such as \"SELECT count(*) FROM events\"")
    if memory_mb < MIN_MEMORY_MB:
        raise TraceError(f"--memory takes at least {MIN_MEMORY_MB} MB, not {memory_mb}")
    _require_pyarrow()
    check_local_spool_dir(spool_dir)
    threads = resolve_jobs(jobs)
    specs = list(src) if isinstance(src, (list, tuple)) else [src]
    named = all(isinstance(spec, (str, os.PathLike)) for spec in specs)
    inputs = discover_inputs(specs) if named else specs  # an archive of rank files too: one table, as merge reads it
    destinations = Destinations(inputs if named else [], overwrite=overwrite, summary=summary_file)
    named_csv = isinstance(output, (str, os.PathLike)) and _named_csv(os.fspath(output))
    as_csv = bool(csv_format) if csv_format is not None else named_csv
    target = None if output is None else destinations.target(output, holds="CSV" if as_csv else "text")
    scratch = tempfile.mkdtemp(prefix="streamtrace-sql-", dir=spool_dir)
    try:
        rows_path = os.path.join(scratch, "events.parquet")
        converted = to_parquet(inputs, rows_path, salvage=salvage, spool_dir=scratch, reread_remote=reread_remote,
                               progress=progress, jobs=threads)
        read = time.perf_counter()
        connection = duckdb.connect(config={"memory_limit": f"{memory_mb}MB", "threads": threads,
                                            "temp_directory": os.path.join(scratch, "duckdb")})
        try:
            connection.execute(f"CREATE VIEW events AS SELECT * FROM read_parquet({_literal(rows_path)})")

            def answer(stop: threading.Event) -> tuple[list[str], list | int]:
                cursor = _execute(connection, query)
                columns = [column[0] for column in cursor.description]
                batches = _batches(cursor, query, stop)
                if target is None:
                    return columns, [row for batch in batches for row in batch]
                with target.open() as out:
                    return columns, (_write_csv if as_csv else _write_table)(columns, batches, out)

            columns, rows = _in_helper_thread(answer, connection.interrupt)
        finally:
            try:
                connection.close()
            except duckdb.Error:  # still busy in the helper thread after a stop: the run is ending anyway
                pass
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    answered = {"columns": columns, "row_count": len(rows) if isinstance(rows, list) else rows}
    if isinstance(rows, list):
        answered["rows"] = rows
    return destinations.finish({
        **{key: value for key, value in converted.items() if key not in CONVERSION_ONLY},
        "table_rows": converted["events_written"],
        "query": query,
        **answered,
        "output": None if target is None else target.name,
        "output_format": None if target is None else "csv" if as_csv else "table",
        "memory_limit_mb": memory_mb,
        "threads": threads,
        "pass_seconds": round(read - started, 3),
        "query_seconds": round(time.perf_counter() - read, 3),
        "wall_seconds": round(time.perf_counter() - started, 3),
        "peak_rss_mb": peak_rss_mb(),
    })


def _require_pyarrow() -> None:
    try:
        import pyarrow.parquet  # noqa: F401
    except ImportError:
        raise TraceError("sql needs the 'parquet' extra (its table is Parquet rows): "
                         "pip install 'streamtrace[parquet]'") from None


def _named_csv(name: str) -> bool:
    """``out.csv``, ``out.csv.gz``: a name that asks for CSV."""
    stem = name.lower()
    for suffix in (".gz", ".gzip", ".zst", ".zstd"):
        stem = stem.removesuffix(suffix)
    return stem.endswith(".csv")


def _literal(text: str) -> str:
    """A SQL string literal."""
    return "'" + text.replace("'", "''") + "'"


def _in_helper_thread(work: Callable[[threading.Event], _T], interrupt: Callable[[], None]) -> _T:
    """``work`` in a helper thread, this one waiting: a stop raised here
    (KeyboardInterrupt, Terminated) sets ``work``'s event and interrupts the
    query, waits for the helper to clean up, and goes on up.  (Waited for on
    an event: a stop raised inside ``Thread.join`` would leave the thread
    marked as ended while it runs.)"""
    outcome: dict[str, object] = {}
    stop, done = threading.Event(), threading.Event()

    def run() -> None:
        try:
            outcome["value"] = work(stop)
        except BaseException as failure:  # handed to the waiting thread
            outcome["error"] = failure
        finally:
            done.set()

    threading.Thread(target=run, name="streamtrace-sql", daemon=True).start()
    try:
        done.wait()
    except BaseException:
        stop.set()
        interrupt()
        done.wait(STOP_WAIT_SECONDS)
        raise
    if "error" in outcome:
        raise outcome["error"]  # type: ignore[misc]
    return outcome["value"]  # type: ignore[return-value]


def _execute(connection: duckdb.DuckDBPyConnection, query: str) -> duckdb.DuckDBPyConnection:
    """The query's cursor; a refusal is one line."""
    try:
        cursor = connection.execute(query)
    except duckdb.Error as failure:
        raise _query_error(failure, query) from None
    if cursor is None:  # DuckDB's answer to a text of comments and semicolons
        raise TraceError("query: it holds no SQL statement, only comments or semicolons")
    return cursor


def _batches(cursor: duckdb.DuckDBPyConnection, query: str, stop: threading.Event) -> Iterator[list[tuple]]:
    """The answer, :data:`FETCH_ROWS` rows at a time."""
    while True:
        if stop.is_set():
            raise _Stopped
        try:
            batch = cursor.fetchmany(FETCH_ROWS)
        except duckdb.Error as failure:
            raise _query_error(failure, query) from None
        if not batch:
            return
        yield batch


def _query_error(failure: Exception, query: str) -> TraceError:
    """DuckDB's message on one line, led by where in the query it points.

    DuckDB shows the line (a window of it, between "...", when it is long)
    with carets under the place; the column is counted in the query's own line."""
    raw = str(failure).splitlines()
    lines = [line.strip() for line in raw]
    where = ""
    for number, line in enumerate(lines):
        found = _POSITION.match(line)
        if found and number + 1 < len(lines) and "^" in lines[number + 1]:
            line_number = int(found.group(1))
            shown = raw[number][len(found.group(0)):]
            caret = raw[number + 1].index("^") - len(found.group(0))
            if shown.startswith("..."):
                shown, caret = shown[3:], caret - 3
            source = query.splitlines()[line_number - 1:line_number] or [""]
            start = source[0].find(shown.removesuffix("..."))
            where = f"line {line_number}, column {start + caret + 1}: " if start >= 0 else f"line {line_number}: "
            lines[number:number + 2] = []
            break
    message = " ".join(line for line in lines if line)
    return TraceError(f"query: {where}{message}")


def _cell(value: object, null: str) -> str:
    """A value as text: numbers as Python writes them (exact), JSON for lists and structs."""
    if value is None:
        return null
    if value is True or value is False:
        return "true" if value else "false"
    if isinstance(value, (str, int, float, Decimal)):
        return str(value)
    if isinstance(value, (list, dict, tuple)):
        return orjson.dumps(value, default=str).decode()
    return str(value)


def _write_csv(columns: list[str], batches: Iterator[list[tuple]], out: BinaryIO) -> int:
    """CSV with a header line; NULL is an empty field.  Returns the rows written."""
    out.write(_csv_lines([columns]))
    count = 0
    for batch in batches:
        plain = set(map(type, chain.from_iterable(batch))) <= _CSV_AS_IS
        out.write(_csv_lines(batch if plain else [[_cell(value, "") for value in row] for row in batch]))
        count += len(batch)
    return count


def _csv_lines(rows: list) -> bytes:
    """Rows as CSV lines (a batch at a time: the outputs take bytes)."""
    text = io.StringIO()
    csv.writer(text, lineterminator="\n").writerows(rows)
    return text.getvalue().encode()


def _write_table(columns: list[str], batches: Iterator[list[tuple]], out: BinaryIO) -> int:
    """A table as text: widths from the header and the first batch (a longer
    value later widens its own line only), numbers to the right.  Returns
    the rows written."""
    first = next(batches, [])
    right = [bool(values) and all(isinstance(value, (int, float, Decimal)) and not isinstance(value, bool)
                                  for value in values)
             for values in ([row[index] for row in first if row[index] is not None] for index in range(len(columns)))]
    texts = list(map(_table_cells, first))
    widths = [max([len(name), *(len(row[index]) for row in texts)]) for index, name in enumerate(columns)]

    def line(cells: list[str]) -> bytes:
        padded = (cell.rjust(width) if aligned else cell.ljust(width) for cell, width, aligned in zip(cells, widths, right))
        return ("  ".join(padded).rstrip() + "\n").encode()

    out.write(line(columns) + line(["-" * width for width in widths]))
    out.write(b"".join(map(line, texts)))
    count = len(first)
    for batch in batches:
        out.write(b"".join(line(_table_cells(row)) for row in batch))
        count += len(batch)
    return count


def _table_cells(row: tuple) -> list[str]:
    """A row's cells in the text table (NULL named, line breaks written as \\n so that a row stays a line)."""
    return [_cell(value, "NULL").replace("\n", "\\n") for value in row]
