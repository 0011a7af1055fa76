"""Events as Parquet rows: typed columns for what people query, the rest as JSON text.

One row per event.  A typed column holds a top-level field when the value
has the column's type; ``args`` holds the JSON text of the event's ``args``
value, and ``extra`` the JSON object of every other top-level key plus the
original of any value a typed column could not hold exactly (an integer
``ts``, a float pid, ...), so that every event can be rebuilt from its row
(docs/input-handling.md, "Parquet rows").  ``correlation``, ``stream``,
``device``, ``external_id`` and ``rank`` are copies out of ``args`` (or, for
``rank``, the pid's rank) for querying; ``args`` keeps the originals.

pyarrow is imported only when a Parquet output is asked for: it is an
optional extra, and importing it costs startup time every other command
would pay.
"""
from __future__ import annotations

import pickle
import struct
from decimal import Decimal
from typing import TYPE_CHECKING, BinaryIO, Callable

import orjson

from ..errors import TraceError
from .reader import dumps_event

if TYPE_CHECKING:
    import pyarrow

ROW_GROUP_ROWS = 1 << 16  # rows per row group: tens of MB of Arrow data at most, and many groups for parallel readers
COMPRESSION = "zstd"
INT64 = range(-(1 << 63), 1 << 63)
TOP_LEVEL = ("ph", "cat", "name", "pid", "tid", "ts", "dur", "id", "args")
"""The top-level keys with a column of their own (``pid``/``tid`` in two: integer or text)."""
FROM_ARGS = (("correlation", "correlation"), ("stream", "stream"), ("device", "device"),
             ("external_id", "External id"))
"""Integer columns copied from ``args`` (column, key)."""
DICTIONARY_COLUMNS = ["rank", "ph", "cat", "name", "pid", "tid", "pid_text", "tid_text", "stream", "device"]
STATISTICS_COLUMNS = ["rank", "ph", "cat", "pid", "tid", "ts", "dur", "correlation", "stream", "device"]
_ABSENT = object()
_PART_LENGTH = struct.Struct("<Q")


def require_pyarrow() -> None:
    """Refuse in one line when the ``parquet`` extra is not installed."""
    try:
        import pyarrow  # noqa: F401
        import pyarrow.parquet  # noqa: F401
    except ImportError:
        raise TraceError("Parquet output needs the 'parquet' extra: pip install 'streamtrace[parquet]'") from None


def schema() -> "pyarrow.Schema":
    import pyarrow as pa

    text, integer, number = pa.string(), pa.int64(), pa.float64()
    labels = pa.dictionary(pa.int32(), text)
    return pa.schema([
        ("rank", pa.int32()), ("ph", labels), ("cat", labels), ("name", labels), ("pid", integer), ("tid", integer),
        ("pid_text", text), ("tid_text", text), ("ts", number), ("dur", number), ("id", integer),
        *((column, integer) for column, _ in FROM_ARGS), ("args", text), ("extra", text)])


def _dumps(value: object) -> bytes:
    """JSON text of a value (exact-mode numbers and integers beyond 64 bits keep their text)."""
    try:
        return orjson.dumps(value)
    except TypeError:
        return dumps_event(value)  # type: ignore[arg-type]


class _Extras:
    """Per row of a batch, the top-level keys that go to ``extra`` (few rows have any)."""

    def __init__(self) -> None:
        self.rows: dict[int, dict] = {}

    def add(self, row: int, key: str, value: object) -> None:
        self.rows.setdefault(row, {})[key] = value

    def column(self, pa, count: int) -> "pyarrow.Array":
        if not self.rows:
            return pa.nulls(count, pa.string())
        rows = sorted(self.rows)
        members = [self.rows[row] for row in rows]
        texts = _cut_objects(pa, members)
        if texts is None:
            texts = pa.array([_dumps(value) for value in members], pa.string())
        if len(rows) == count:
            return texts
        at = dict(zip(rows, range(len(rows))))
        return texts.take(pa.array([at.get(row) for row in range(count)], pa.int32()))


def _explicit_nulls(values: list, events: list, key: str, extras: _Extras) -> None:
    """A key present with the value null has no typed value: ``extra`` keeps it."""
    if None in values:
        for row in [row for row, (value, event) in enumerate(zip(values, events))
                    if value is None and event.get(key, _ABSENT) is None]:
            extras.add(row, key, None)


def _text_column(values: list, events: list, key: str, extras: _Extras) -> list:
    """Strings as they are; any other value null here and kept in ``extra``."""
    if not set(map(type, values)) <= {str, type(None)}:
        for row, value in enumerate(values):
            if value is not None and value.__class__ is not str:
                extras.add(row, key, value)
                values[row] = None
    _explicit_nulls(values, events, key, extras)
    return values


def _integer_or_text(values: list, events: list, key: str, extras: _Extras) -> tuple[list, list | None]:
    """``pid``/``tid``: 64-bit integers in one column, strings in another, anything else in ``extra``."""
    texts = None
    if not set(map(type, values)) <= {int, type(None)} or not _all_int64(values):
        texts = [None] * len(values)
        for row, value in enumerate(values):
            if value is None or (value.__class__ is int and value in INT64):
                continue
            if value.__class__ is str:
                texts[row] = value
            else:
                extras.add(row, key, value)
            values[row] = None
    _explicit_nulls(values if texts is None else [v if t is None else t for v, t in zip(values, texts)],
                    events, key, extras)
    return values, texts


def _all_int64(values: list) -> bool:
    integers = [value for value in values if value is not None]
    return not integers or (min(integers) >= INT64.start and max(integers) < INT64.stop)


def _integer_column(values: list, events: list, key: str, extras: _Extras) -> list:
    """A 64-bit integer column (``id``); anything else null here and kept in ``extra``."""
    if not set(map(type, values)) <= {int, type(None)} or not _all_int64(values):
        for row, value in enumerate(values):
            if value is not None and not (value.__class__ is int and value in INT64):
                extras.add(row, key, value)
                values[row] = None
    _explicit_nulls(values, events, key, extras)
    return values


def _number_column(values: list, events: list, key: str, extras: _Extras) -> list:
    """``ts``/``dur`` as float64 microseconds: a float as it is, another number
    converted with its original kept in ``extra`` (an integer stays an integer
    on the way back), anything else null here and in ``extra``."""
    if not set(map(type, values)) <= {float, type(None)}:
        for row, value in enumerate(values):
            kind = value.__class__
            if value is None or kind is float:
                continue
            if kind is int or kind is Decimal:
                values[row] = float(value)
                if kind is int:
                    extras.add(row, key, value)
            else:
                extras.add(row, key, value)
                values[row] = None
    _explicit_nulls(values, events, key, extras)
    return values


def _from_args(args: list, key: str) -> list:
    """An integer copied out of ``args`` (null when absent or not a 64-bit integer)."""
    values = [value.get(key) if value.__class__ is dict else None for value in args]
    if set(map(type, values)) <= {int, type(None)} and _all_int64(values):
        return values
    return [value if value.__class__ is int and value in INT64 else None for value in values]


class RowBuilder:
    """Builds the Arrow batch of a list of events.

    ``default_rank`` is the rank of events whose ``args`` state none (None:
    unknown yet).  For each batch it also records which events stated their
    own rank, and the pids of those that did not, so that the ranks can be
    checked, and if need be replaced, once the whole trace has been seen.
    """

    def __init__(self, default_rank: int | None, rank_of: Callable[[object], int | None] | None = None) -> None:
        """``rank_of``: when the pids' ranks are known before the rows are
        built, each pid's (``default_rank`` is then not used)."""
        import pyarrow as pa

        self._pa = pa
        self.schema = schema()
        self.default_rank = default_rank
        self._rank_of = rank_of

    def batch(self, events: list) -> tuple["pyarrow.RecordBatch", bytes, set]:
        """The rows, one byte per event (1: ``args.rank`` stated), and the pids of unranked events."""
        pa = self._pa
        count = len(events)
        extras = _Extras()
        known = frozenset(TOP_LEVEL)
        for row, event in enumerate(events):
            if not known.issuperset(event):
                for key, value in event.items():
                    if key not in known:
                        extras.add(row, key, value)
        texts = [self._dictionary([event.get(key) for event in events], events, key, extras)
                 for key in ("ph", "cat", "name")]
        raw_pids = [event.get("pid") for event in events]
        pid, pid_text = _integer_or_text(raw_pids[:], events, "pid", extras)
        tid, tid_text = _integer_or_text([event.get("tid") for event in events], events, "tid", extras)
        ts = _number_column([event.get("ts") for event in events], events, "ts", extras)
        dur = _number_column([event.get("dur") for event in events], events, "dur", extras)
        flow_id = _integer_column([event.get("id") for event in events], events, "id", extras)
        args = [event.get("args", _ABSENT) for event in events]
        own = [value.get("rank") if value.__class__ is dict else None for value in args]
        if set(map(type, own)) == {type(None)}:  # (most traces: no event states its rank)
            stated = bytes(count)
            unranked = set(map(_pid_key, set(raw_pids)))
        else:
            stated = bytes(rank.__class__ is int and 0 <= rank < 1 << 31 for rank in own)
            unranked = {_pid_key(pid) for pid, flag in zip(raw_pids, stated) if not flag}
        if self._rank_of is not None:
            rank_of = self._rank_of
            ranks = [rank if flag else rank_of(_pid_key(pid)) for rank, flag, pid in zip(own, stated, raw_pids)]
        elif stated.count(0) == count:
            ranks = [self.default_rank] * count
        else:
            ranks = [rank if flag else self.default_rank for rank, flag in zip(own, stated)]
        columns = [
            pa.array(ranks, pa.int32()), *texts, pa.array(pid, pa.int64()), pa.array(tid, pa.int64()),
            pa.array(pid_text or [None] * count, pa.string()), pa.array(tid_text or [None] * count, pa.string()),
            pa.array(ts, pa.float64()), pa.array(dur, pa.float64()), pa.array(flow_id, pa.int64()),
            *(pa.array(_from_args(args, key), pa.int64()) for _, key in FROM_ARGS),
            self._args_text(args), extras.column(pa, count)]
        return pa.RecordBatch.from_arrays(columns, schema=self.schema), stated, unranked

    def _dictionary(self, values: list, events: list, key: str, extras: _Extras) -> "pyarrow.Array":
        """A text column as codes into the batch's distinct values (names repeat thousands of times)."""
        pa = self._pa
        lookup: dict = {}
        codes = [lookup.setdefault(value, len(lookup)) for value in values]
        if not set(map(type, lookup)) <= {str, type(None)}:  # rare: a number or object where text belongs
            values = _text_column(values, events, key, extras)
            return pa.array(values, pa.string()).dictionary_encode()
        _explicit_nulls(values, events, key, extras)
        labels = list(lookup)  # in code order: each code is its value's position of first sight
        mask = None
        if None in lookup:
            null_code = lookup[None]
            mask = [code == null_code for code in codes]
            labels[null_code] = ""  # a placeholder, never read: its rows are masked
        return pa.DictionaryArray.from_arrays(pa.array(codes, pa.int32(), mask=mask), pa.array(labels, pa.string()))

    def _args_text(self, args: list) -> "pyarrow.Array":
        """The JSON text of each ``args`` (null where absent), from one encoder call when the texts can be cut apart."""
        pa = self._pa
        objects = [value for value in args if value.__class__ is dict]
        texts = _cut_objects(pa, objects) if objects else None
        if texts is None or len(objects) + args.count(_ABSENT) != len(args):
            return pa.array([None if value is _ABSENT else _dumps(value) for value in args], pa.string())
        if len(objects) == len(args):
            return texts
        positions = iter(range(len(objects)))
        return texts.take(pa.array([None if value is _ABSENT else next(positions) for value in args], pa.int32()))


def _cut_objects(pa, objects: list) -> "pyarrow.Array | None":
    """JSON objects encoded as one array and cut at the ``},{`` between them,
    straight into an Arrow string array (offsets over the one text); None
    when the cut is not exactly one per object boundary (that text also
    occurs inside nested lists and strings) or orjson cannot write them."""
    import numpy as np

    try:
        joined = orjson.dumps(objects).replace(b"},{", b"}{")
    except TypeError:
        return None
    text = np.frombuffer(joined, dtype=np.uint8)
    ends = np.flatnonzero((text[1:-2] == 0x7D) & (text[2:-1] == 0x7B)) + 1
    if len(ends) != len(objects) - 1:
        return None
    offsets = np.empty(len(objects) + 1, dtype=np.int32)
    offsets[0], offsets[-1] = 0, len(joined) - 2
    offsets[1:-1] = ends
    return pa.StringArray.from_buffers(len(objects), pa.py_buffer(offsets), pa.py_buffer(joined[1:-1]))


def _pid_key(pid: object) -> object:
    """A pid as rank resolution keys it (ints and strings as they are, anything else by its text)."""
    return pid if pid.__class__ in (int, str) else str(pid)


def pack_batch(batch: "pyarrow.RecordBatch | None", stated: bytes, unranked: set, part: object) -> bytes:
    """A built batch (None: no rows) with what a child process sends along with it, as one message."""
    facts = pickle.dumps((stated, unranked, part), pickle.HIGHEST_PROTOCOL)
    if batch is None:
        return _PART_LENGTH.pack(len(facts)) + facts
    import pyarrow as pa

    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, batch.schema) as stream:  # a stream: the dictionaries travel with the batch
        stream.write_batch(batch)
    return b"".join((_PART_LENGTH.pack(len(facts)), facts, sink.getvalue().to_pybytes()))


def unpack_batch(message: memoryview) -> tuple["pyarrow.RecordBatch | None", bytes, set, object]:
    import pyarrow as pa

    (length,) = _PART_LENGTH.unpack_from(message)
    rows_at = _PART_LENGTH.size + length
    stated, unranked, part = pickle.loads(message[_PART_LENGTH.size:rows_at])
    batch = pa.ipc.open_stream(pa.py_buffer(message[rows_at:])).read_next_batch() if len(message) > rows_at else None
    return batch, stated, unranked, part


class _Positioned:
    """A binary stream with the position Arrow's writer asks for (pipes and uploads have none)."""

    def __init__(self, out: BinaryIO) -> None:
        self._out = out
        self._position = 0
        self.closed = False
        self.abandoned = False  # after a failure: the writer's last words go nowhere

    def write(self, data: bytes) -> int:
        if not self.abandoned:
            self._out.write(data)
        self._position += len(data)
        return len(data)

    def tell(self) -> int:
        return self._position

    def flush(self) -> None:
        pass

    def close(self) -> None:
        self.closed = True


class RowGroupWriter:
    """Batches gathered into row groups of :data:`ROW_GROUP_ROWS` rows, written as they fill."""

    def __init__(self, out: BinaryIO, schema: "pyarrow.Schema") -> None:
        import pyarrow.parquet as pq

        self._pa_table = __import__("pyarrow").Table
        self._out = _Positioned(out)
        self._writer = pq.ParquetWriter(self._out, schema, compression=COMPRESSION,
                                        use_dictionary=DICTIONARY_COLUMNS, write_statistics=STATISTICS_COLUMNS)
        self._pending: list = []
        self._rows = 0
        self.rows_written = 0

    def add(self, batch: "pyarrow.RecordBatch") -> None:
        self._pending.append(batch)
        self._rows += batch.num_rows
        if self._rows >= ROW_GROUP_ROWS:
            self._flush(ROW_GROUP_ROWS)

    def _flush(self, limit: int) -> None:
        table = self._pa_table.from_batches(self._pending)
        whole = table.num_rows - table.num_rows % limit
        if whole:
            self._writer.write_table(table.slice(0, whole), row_group_size=limit)
        rest = table.slice(whole)
        self._pending = rest.to_batches() if rest.num_rows else []
        self._rows = rest.num_rows
        self.rows_written += whole

    def close(self) -> None:
        """Write the last, shorter row group and the footer."""
        if self._rows:
            self._flush(self._rows)
        self._writer.close()

    def __enter__(self) -> "RowGroupWriter":
        return self

    def __exit__(self, failure: object, *exc: object) -> None:
        """Finish the file, or after a failure drop it (the output is thrown away)."""
        if failure is None:
            self.close()
        else:
            self._out.abandoned = True
            self._writer.close()


def write_with_ranks(source: str, out: BinaryIO, stated: bytearray, rank_of_pid: Callable[[list], list]) -> int:
    """Copy the Parquet file ``source`` into ``out`` with the ``rank`` of every
    row that did not state its own replaced by its pid's (``rank_of_pid``
    maps a list of pids to ranks); ``stated`` has one byte per row (1: keep
    the rank)."""
    import pyarrow.parquet as pq

    source_file = pq.ParquetFile(source)
    with RowGroupWriter(out, source_file.schema_arrow) as writer:
        _copy_with_ranks(source_file, writer, stated, rank_of_pid)
    return writer.rows_written


def _copy_with_ranks(source_file, writer: RowGroupWriter, stated: bytearray, rank_of_pid: Callable[[list], list]
                     ) -> None:
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute  # noqa: F401

    flags = np.frombuffer(stated, dtype=np.uint8).astype(bool)
    first = 0
    for group in range(source_file.num_row_groups):
        table = source_file.read_row_group(group)
        keep = flags[first:first + table.num_rows]
        first += table.num_rows
        pids = [pid if pid is not None else text
                for pid, text in zip(table.column("pid").to_pylist(), table.column("pid_text").to_pylist())]
        fresh = pa.array(rank_of_pid(pids), pa.int32())
        ranks = pa.compute.if_else(pa.array(keep), table.column("rank").combine_chunks(), fresh)
        table = table.set_column(0, "rank", ranks)
        for batch in table.to_batches():
            writer.add(batch)
