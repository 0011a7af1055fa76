"""scripts/range_stages.py: DuckDB reads the whole range the same way through
each way of handing it over, the checked reading flags the members DuckDB
would cast silently, and the strict parse refuses what DuckDB's parser takes."""
from __future__ import annotations

import io
import json
from collections import Counter

import duckdb
import msgspec
import pytest
import range_stages

from streamtrace.io.projection import read_alike

EVENTS = [
    {"ph": "X", "cat": "kernel", "name": "gemm", "pid": 0, "tid": 7, "ts": 20.5, "dur": 5.5,
     "args": {"correlation": 42, "stream": 7}},
    {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 100, "tid": 101, "ts": 12, "dur": 3.0,
     "args": {"correlation": 42}},
    {"ph": "i", "cat": "user_annotation", "name": "mark", "pid": 100, "tid": 101, "ts": 30.25},
    {"ph": "X", "cat": "kernel", "name": "gemm", "pid": 0, "tid": 7, "ts": 40.0, "dur": 1.25,
     "args": {"correlation": 43}},
]
CHUNKS = [json.dumps(EVENTS[:2])[1:-1].encode(), json.dumps(EVENTS[2:])[1:-1].encode()]
"""Two chunks of elements, as pass 1 cuts them."""


def _counts(rows: list[tuple]) -> Counter:
    return Counter({(ph, cat, pid): events for ph, cat, pid, events, *_ in rows})


def test_every_way_of_handing_the_range_over_reads_the_same_events():
    runs, view_share = range_stages.stages(CHUNKS)
    expected = Counter((event["ph"], event["cat"], event["pid"]) for event in EVENTS)
    readings = [runs[stage]() for stage in runs if stage.startswith("DuckDB")]
    assert len(readings) == 5
    for rows in readings:
        assert _counts(rows) == expected
        assert sorted(rows, key=repr) == sorted(readings[0], key=repr)
    kernels = next(row for row in readings[0] if row[1] == "kernel")
    assert kernels[4:7] == (20.5, 41.25, 6.75)  # first ts, last end, kernel time
    assert len(view_share) == 1 and view_share[0] >= 0


@pytest.mark.parametrize("value, read", [('"12"', 12), ("true", 1), ("1.5", 2)])
def test_duckdb_casts_a_value_of_another_type_to_a_declared_integer(value, read):
    """What the checked reading is for: DuckDB takes these silently."""
    relation = duckdb.connect().read_json(io.BytesIO(f'[{{"a": {value}}}]'.encode()), format="array",
                                          columns={"a": "BIGINT"})
    assert relation.fetchall() == [(read,)]


def test_duckdb_skips_an_integer_beyond_64_bits_in_a_member_it_does_not_read():
    """orjson would round it: the fast reading's own number test finds it, DuckDB says nothing."""
    text = b'[{"a": 1, "b": 123456789012345678901234567890}]'
    assert duckdb.connect().read_json(io.BytesIO(text), format="array", columns={"a": "BIGINT"}).fetchall() == [(1,)]
    assert not read_alike(text)


@pytest.mark.parametrize("member, value", [("pid", '"0"'), ("ts", "true"), ("args.correlation", "42.5"),
                                           ("name", "5"), ("tid", '"7"'), ("cat", "1")])
def test_the_checked_reading_flags_what_duckdb_would_cast(member, value):
    """A member of another type than the fast reading takes: DuckDB's typed
    reading takes it as a value of the declared type, the checked one flags it."""
    text = CHUNKS[0].decode()
    parent, _, key = member.rpartition(".")
    old = f'"{key}": {json.dumps(EVENTS[0][parent][key] if parent else EVENTS[0][key])}'
    assert old in text
    changed = [text.replace(old, f'"{key}": {value}', 1).encode(), CHUNKS[1]]
    connection = duckdb.connect()
    array = b"[" + b",".join(changed) + b"]"
    typed = range_stages.through_pipe(connection, array)
    checked = range_stages.through_pipe(connection, array, checked=True)
    assert sum(row[-1] for row in typed) == 0
    assert sum(row[-1] for row in checked) == 1
    assert sum(row[3] for row in typed) == len(EVENTS)


@pytest.mark.parametrize("damage", ['"stream": 7}', '"stream": NaN}', '"stream": [7, ]}'])
def test_the_strict_parse_refuses_what_duckdb_takes(damage):
    """NaN and a comma before a closing bracket: DuckDB reads the events (the
    member is one it skips), the fast reading and the strict parse refuse them."""
    text = CHUNKS[0].replace(b'"stream": 7}', damage.encode(), 1)
    array = b"[" + b",".join((text, CHUNKS[1])) + b"]"
    assert sum(row[3] for row in range_stages.through_pipe(duckdb.connect(), array)) == len(EVENTS)
    if damage == '"stream": 7}':
        assert len(range_stages._SKIP.decode(array)) == len(EVENTS)
        return
    with pytest.raises(msgspec.DecodeError):
        range_stages._SKIP.decode(array)
