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
from itertools import compress, repeat
from operator import contains, is_
from typing import TYPE_CHECKING, BinaryIO, Callable

import numpy as np
import orjson

from ..errors import TraceError
from .eventtext import dumps_event

if TYPE_CHECKING:
    import pyarrow

ROW_GROUP_ROWS = 1 << 15  # rows per row group: tens of MB of Arrow data at most, and many groups for parallel readers
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
_NO_ARGS: dict = {}  # stands for the args of an event without an args object: every lookup finds nothing
_KNOWN = frozenset(TOP_LEVEL)
_NONE, _DICT, _INT_OR_NONE = {type(None)}, {dict}, {int, type(None)}
_STR_OR_NONE, _FLOAT_OR_NONE = {str, type(None)}, {float, type(None)}
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
        return _objects_text(pa, [self.rows[row] for row in rows], rows, count)


def _explicit_nulls(values: list, events: list, key: str, extras: _Extras) -> None:
    """A key present with the value null has no typed value: ``extra`` keeps it."""
    nulls = values.count(None)
    if nulls and sum(map(contains, events, repeat(key))) > len(values) - nulls:  # (counted at C speed)
        for row in [row for row, (value, event) in enumerate(zip(values, events))
                    if value is None and event.get(key, _ABSENT) is None]:
            extras.add(row, key, None)


def _int64_array(pa, values: list) -> "pyarrow.Array | None":
    """``values`` as an int64 array when every one is a 64-bit integer or None, else None."""
    if set(map(type, values)) <= _INT_OR_NONE:
        try:
            return pa.array(values, pa.int64())
        except OverflowError:
            pass
    return None


def _text_column(values: list, events: list, key: str, extras: _Extras) -> list:
    """Strings as they are; any other value null here and kept in ``extra``."""
    for row, value in enumerate(values):
        if value is not None and value.__class__ is not str:
            extras.add(row, key, value)
            values[row] = None
    _explicit_nulls(values, events, key, extras)
    return values


def _integer_or_text(pa, values: list, events: list, key: str, extras: _Extras
                     ) -> tuple["pyarrow.Array", "pyarrow.Array"]:
    """``pid``/``tid``: 64-bit integers in one column, strings in another, anything else in ``extra``."""
    integers = _int64_array(pa, values)
    if integers is not None:
        _explicit_nulls(values, events, key, extras)
        return integers, pa.nulls(len(values), pa.string())
    texts: list = [None] * len(values)
    numbers: list = [None] * len(values)
    for row, value in enumerate(values):
        if value.__class__ is int and value in INT64:
            numbers[row] = value
        elif value.__class__ is str:
            texts[row] = value
        elif value is not None:
            extras.add(row, key, value)
    _explicit_nulls(values, events, key, extras)
    return pa.array(numbers, pa.int64()), pa.array(texts, pa.string())


def _integer_column(pa, values: list, events: list, key: str, extras: _Extras) -> "pyarrow.Array":
    """A 64-bit integer column (``id``); anything else null here and kept in ``extra``."""
    integers = _int64_array(pa, values)
    if integers is None:
        for row, value in enumerate(values):
            if value is not None and not (value.__class__ is int and value in INT64):
                extras.add(row, key, value)
                values[row] = None
        integers = pa.array(values, pa.int64())
    _explicit_nulls(values, events, key, extras)
    return integers


def _number_column(pa, values: list, events: list, key: str, extras: _Extras) -> "pyarrow.Array":
    """``ts``/``dur`` as float64 microseconds: a float as it is, another number
    converted with its original kept in ``extra`` (an integer stays an integer
    on the way back), anything else null here and in ``extra``."""
    if not set(map(type, values)) <= _FLOAT_OR_NONE:
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
    return pa.array(values, pa.float64())


def _from_args(pa, args: list, key: str) -> "pyarrow.Array":
    """An integer copied out of each ``args`` object (null when absent or not a 64-bit integer)."""
    values = list(map(dict.get, args, repeat(key)))
    integers = _int64_array(pa, values)
    if integers is None:
        integers = pa.array([value if value.__class__ is int and value in INT64 else None for value in values],
                            pa.int64())
    return integers


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
        fits = list(map(_KNOWN.issuperset, events))  # no key beyond the columns'
        if False in fits:
            for row in [row for row, fit in enumerate(fits) if not fit]:
                event = events[row]
                for key in event.keys() - _KNOWN:
                    extras.add(row, key, event[key])
        texts = [self._dictionary(_field(events, key), events, key, extras) for key in ("ph", "cat", "name")]
        raw_pids = _field(events, "pid")
        pid, pid_text = _integer_or_text(pa, raw_pids, events, "pid", extras)
        tid, tid_text = _integer_or_text(pa, _field(events, "tid"), events, "tid", extras)
        ts = _number_column(pa, _field(events, "ts"), events, "ts", extras)
        dur = _number_column(pa, _field(events, "dur"), events, "dur", extras)
        flow_id = _integer_column(pa, _field(events, "id"), events, "id", extras)
        args = list(map(dict.get, events, repeat("args"), repeat(_ABSENT)))
        objects = args if set(map(type, args)) == _DICT else \
            [value if value.__class__ is dict else _NO_ARGS for value in args]  # (then one lookup each, no test)
        own = list(map(dict.get, objects, repeat("rank")))
        if set(map(type, own)) == _NONE:  # (most traces: no event states its rank)
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
            pa.array(ranks, pa.int32()), *texts, pid, tid, pid_text, tid_text, ts, dur, flow_id,
            *(_from_args(pa, objects, key) for _, key in FROM_ARGS), self._args_text(args), extras.column(pa, count)]
        return pa.RecordBatch.from_arrays(columns, schema=self.schema), stated, unranked

    def _dictionary(self, values: list, events: list, key: str, extras: _Extras) -> "pyarrow.Array":
        """A text column as codes into the batch's distinct values (names repeat thousands of times)."""
        pa = self._pa
        labels = list(dict.fromkeys(values))  # distinct values in order of first sight
        if not set(map(type, labels)) <= _STR_OR_NONE:  # rare: a number or object where text belongs
            return pa.array(_text_column(values, events, key, extras), pa.string()).dictionary_encode()
        _explicit_nulls(values, events, key, extras)
        code_of = {label: code for code, label in enumerate(labels)}
        codes = list(map(code_of.__getitem__, values))
        mask = None
        if None in code_of:
            null_code = code_of[None]
            mask = list(map(null_code.__eq__, codes))
            labels[null_code] = ""  # a placeholder, never read: its rows are masked
        return pa.DictionaryArray.from_arrays(pa.array(codes, pa.int32(), mask=mask), pa.array(labels, pa.string()))

    def _args_text(self, args: list) -> "pyarrow.Array":
        """The JSON text of each ``args`` (null where absent), from one encoder call when the texts can be cut apart."""
        pa = self._pa
        rows = list(compress(range(len(args)), map(is_, map(type, args), repeat(dict))))
        texts = None
        if len(rows) + args.count(_ABSENT) == len(args):  # no args that are not objects
            texts = _objects_text(pa, list(map(args.__getitem__, rows)), rows, len(args)) if rows else \
                pa.nulls(len(args), pa.string())
        if texts is None:
            texts = pa.array([None if value is _ABSENT else _dumps(value) for value in args], pa.string())
        return texts


def _objects_text(pa, objects: list, rows: list, count: int) -> "pyarrow.Array":
    """The JSON text of each object at its row of ``count`` (the others
    null), from one encoder call: the objects are written as one array and
    cut at the ``},{`` between them, straight into an Arrow string array
    (offsets over the one text).  Falls back to an encoder call per object
    when the cut is not exactly one per boundary (that text also occurs inside
    nested lists and strings) or orjson cannot write them in one go."""
    try:
        joined = orjson.dumps(objects).replace(b"},{", b"}{")
        text = np.frombuffer(joined, dtype=np.uint8)
        ends = np.flatnonzero((text[1:-2] == 0x7D) & (text[2:-1] == 0x7B)) + 2  # (offsets in joined: after "[")
    except TypeError:
        ends = None
    if ends is None or len(ends) != len(objects) - 1:
        texts: list = [None] * count
        for row, value in zip(rows, objects):
            texts[row] = _dumps(value)
        return pa.array(texts, pa.string())
    bounds = np.empty(len(objects) + 1, dtype=np.int64)
    bounds[0], bounds[-1], bounds[1:-1] = 1, len(joined) - 1, ends
    if len(rows) == count:
        return pa.StringArray.from_buffers(count, pa.py_buffer(bounds.astype(np.int32)), pa.py_buffer(joined))
    lengths = np.zeros(count, dtype=np.int32)
    lengths[rows] = np.diff(bounds)
    offsets = np.empty(count + 1, dtype=np.int32)
    offsets[0] = 1
    np.cumsum(lengths, out=offsets[1:])
    offsets[1:] += 1
    present = np.zeros(count, dtype=bool)
    present[rows] = True
    validity = pa.py_buffer(np.packbits(present, bitorder="little"))
    return pa.StringArray.from_buffers(count, pa.py_buffer(offsets), pa.py_buffer(joined), validity)


def _field(events: list, key: str) -> list:
    """One top-level field of every event (None where absent)."""
    return list(map(dict.get, events, repeat(key)))


def _pid_key(pid: object) -> object:
    """A pid as rank resolution keys it (ints and strings as they are, anything else by its text)."""
    return pid if pid.__class__ in (int, str) else str(pid)


def pack_batch(batch: "pyarrow.RecordBatch | None", stated: bytes, unranked: set, part: object) -> bytes:
    """A built batch (None: no rows) with its facts and ``part`` (anything picklable), as one message."""
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
        import pyarrow as pa
        import pyarrow.parquet as pq

        self._pa_table = pa.Table
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
        # one dictionary per column and group, whatever the batches: the same file for every -j
        table = self._pa_table.from_batches(self._pending).unify_dictionaries().combine_chunks()
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

    def abandon(self) -> None:
        """Stop, writing nothing more (the output is thrown away)."""
        self._out.abandoned = True
        self._writer.close()

    def __exit__(self, failure: object, *exc: object) -> None:
        """Finish the file, or after a failure drop it."""
        if failure is None:
            self.close()
        else:
            self.abandon()


def copy_rows(sources: list[tuple[str, bytearray, Callable[[list], list] | None]], out: BinaryIO) -> int:
    """Write the rows of the Parquet files ``sources`` into ``out``, one after
    the other; where a source has a ``rank_of_pid`` (a list of pids to their
    ranks), the ``rank`` of each row whose byte in its ``stated`` is 0 is
    replaced by its pid's.  Returns the rows written."""
    import pyarrow.parquet as pq

    with RowGroupWriter(out, schema()) as writer:
        for path, stated, rank_of_pid in sources:
            _copy_with_ranks(pq.ParquetFile(path), writer, stated, rank_of_pid)
    return writer.rows_written


def _copy_with_ranks(source_file, writer: RowGroupWriter, stated: bytearray,
                     rank_of_pid: Callable[[list], list] | None) -> None:
    import pyarrow as pa
    import pyarrow.compute  # noqa: F401

    flags = np.frombuffer(stated, dtype=np.uint8).astype(bool)
    first = 0
    for group in range(source_file.num_row_groups):
        table = source_file.read_row_group(group)
        keep = flags[first:first + table.num_rows]
        first += table.num_rows
        if rank_of_pid is not None:
            pids = [pid if pid is not None else text
                    for pid, text in zip(table.column("pid").to_pylist(), table.column("pid_text").to_pylist())]
            fresh = pa.array(rank_of_pid(pids), pa.int32())
            table = table.set_column(0, "rank", pa.compute.if_else(pa.array(keep), table.column("rank").combine_chunks(),
                                                                   fresh))
        for batch in table.to_batches():
            writer.add(batch)
