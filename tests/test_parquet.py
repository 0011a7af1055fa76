"""``convert TRACE OUT.parquet``: rows that rebuild every event, and SQL answers equal to inspect's and attribute's."""
from __future__ import annotations

import csv
import gzip
import json
import os
import subprocess
import sys
import tarfile
from collections import Counter, defaultdict
from pathlib import Path

import pytest
from conftest import REAL_TRACES, ROOT, TRACES, events_of, large_ones_slow, load_json

import streamtrace
from streamtrace import TraceError, attribute, convert, inspect
from streamtrace.engine import indexworkers, parseproc
from streamtrace.synth import SynthConfig, write_traces

pq = pytest.importorskip("pyarrow.parquet")
duckdb = pytest.importorskip("duckdb")

DLRM = sorted((TRACES / "dlrm_8ranks").glob("*.json.gz"))
GPU_CATS = ("kernel", "Kernel", "gpu_memcpy", "gpu_memset")
SMALL = dict(pp_stages=2, microbatches=2, steps=1, eager_kernels=2, graph_kernels=6, graph_streams=4, python_noise=1)


def rebuild(row: dict) -> dict:
    """The event a row stands for, by the rule of docs/input-handling.md ("Parquet rows")."""
    event = {key: row[key] for key in ("ph", "cat", "name", "ts", "dur", "id") if row[key] is not None}
    for key in ("pid", "tid"):
        value = row[key] if row[key] is not None else row[f"{key}_text"]
        if value is not None:
            event[key] = value
    if row["args"] is not None:
        event["args"] = json.loads(row["args"])
    if row["extra"] is not None:
        event.update(json.loads(row["extra"]))
    return event


def rows_of(path: Path) -> list[dict]:
    return pq.read_table(path).to_pylist()


@pytest.fixture(scope="module")
def merged16(tmp_path_factory) -> Path:
    directory = tmp_path_factory.mktemp("k16")
    truth = write_traces(SynthConfig(ranks=16, **SMALL), directory, compress="gz", merged_style="rank-arg")
    return directory / truth["merged"]["file"]


@pytest.fixture(scope="module")
def merged_by_name(tmp_path_factory) -> Path:
    """Ranks stated only by process names, and a distributedInfo (rank 0) that covers one of them."""
    directory = tmp_path_factory.mktemp("k4names")
    truth = write_traces(SynthConfig(ranks=4, **SMALL), directory, compress="none", merged_style="process-name")
    return directory / truth["merged"]["file"]


@pytest.mark.parametrize("trace", large_ones_slow(REAL_TRACES + DLRM), ids=lambda p: p.name)
def test_every_event_rebuilds_from_its_row(trace: Path, tmp_path: Path) -> None:
    out = tmp_path / "events.parquet"
    summary = convert(trace, out, jobs=1)
    original = events_of(load_json(trace))
    rebuilt = [rebuild(row) for row in rows_of(out)]
    assert summary["rows_written"] == len(original)
    assert rebuilt == original
    for before, after in zip(original, rebuilt):  # equal also in kind: 1 == 1.0 would pass the comparison above
        assert [type(before.get(key)) for key in ("ts", "dur", "pid", "tid", "id")] == \
            [type(after.get(key)) for key in ("ts", "dur", "pid", "tid", "id")]


def test_odd_values_rebuild_exactly(tmp_path: Path) -> None:
    """Values the typed columns cannot hold keep their kind through ``extra``."""
    events = [
        {"ph": "X", "cat": "kernel", "name": "k", "pid": 0, "tid": 7, "ts": 5, "dur": 2.5, "args": {"correlation": 1}},
        {"ph": "X", "cat": None, "name": 3, "pid": 1.5, "tid": "main", "ts": 1.25, "dur": None},
        {"ph": "i", "name": "Record Window End", "pid": "", "tid": "", "ts": 9.0, "s": "g"},
        {"ph": "f", "id": "0x1f", "cat": "ac2g", "name": "ac2g", "pid": 0, "tid": 7, "ts": 5.0, "bp": "e"},
        {"ph": "X", "name": "big", "pid": 1 << 70, "tid": True, "ts": 1.0, "dur": 0.5, "id": 1 << 64,
         "args": {"Comms Id": 1 << 70, "list": [{"a": 1}, {"b": 2}], "text": "},{"}},
        {"ph": "M", "name": "process_name", "pid": 0, "args": None},
        {"name": "no ph"},
    ]
    source = tmp_path / "odd.json"
    source.write_text(json.dumps({"traceEvents": events}))
    out = tmp_path / "odd.parquet"
    convert(source, out, jobs=1)
    rows = rows_of(out)
    assert [rebuild(row) for row in rows] == json.loads(source.read_text())["traceEvents"]
    assert type(rebuild(rows[0])["ts"]) is int and rows[0]["ts"] == 5.0  # queryable, and an int again on the way back
    assert (rows[2]["pid"], rows[2]["pid_text"], rows[1]["tid_text"]) == (None, "", "main")
    assert rows[0]["correlation"] == 1 and rows[4]["id"] is None


def _sql(path: Path, query: str) -> list[tuple]:
    return duckdb.sql(query.replace("EVENTS", f"read_parquet('{path}')")).fetchall()


def _attribute_rows(trace: Path, tmp_path: Path) -> list[dict]:
    table = tmp_path / f"{trace.name}.csv"
    attribute(trace, table, jobs=1)
    with open(table, newline="") as handle:
        return list(csv.DictReader(handle))


def _check_against_commands(trace: Path, tmp_path: Path) -> None:
    out = tmp_path / "events.parquet"
    convert(trace, out, jobs=1)
    seen = inspect(trace, jobs=1)
    by_kind = {f"{ph}/{cat}": count for ph, cat, count in _sql(out, "SELECT ph, cat, count(*) FROM EVENTS GROUP BY ALL")}
    assert by_kind == seen["events_by_ph_cat"]
    top = _sql(out, "SELECT name, count(*), sum(dur) FROM EVENTS WHERE cat IN ('kernel', 'Kernel') AND ph = 'X' "
                    "AND dur >= 0 GROUP BY name ORDER BY sum(dur) DESC, name LIMIT 10")
    assert [(name, count) for name, count, _ in top] == [(k["name"], k["count"]) for k in seen["top_kernels"]]
    assert [total for _, _, total in top] == pytest.approx([k["total_us"] for k in seen["top_kernels"]], abs=1e-3)
    gpu_rows = _attribute_rows(trace, tmp_path)
    counts, kernel_time = Counter(), defaultdict(float)
    for row in gpu_rows:
        rank = int(row["rank"]) if row["rank"] else None
        counts[rank] += 1
        if row["cat"] in ("kernel", "Kernel"):
            kernel_time[rank] += float(row["dur"])
    cats = ", ".join(f"'{cat}'" for cat in GPU_CATS)
    assert dict(_sql(out, f"SELECT rank, count(*) FROM EVENTS WHERE cat IN ({cats}) AND ph = 'X' GROUP BY rank")) == counts
    per_rank = dict(_sql(out, "SELECT rank, sum(dur) FROM EVENTS WHERE cat IN ('kernel', 'Kernel') AND ph = 'X' "
                              "GROUP BY rank"))
    assert per_rank == pytest.approx(dict(kernel_time), rel=1e-12)
    # events and rank per pid as inspect counts them (no metadata); a pid that several ranks share (events
    # stating different args.rank) has one rank per event here, and inspect's one for the pid
    per_pid = {pid: (count, low, high) for pid, count, low, high in _sql(
        out, "SELECT coalesce(CAST(pid AS VARCHAR), pid_text), count(*), min(rank), max(rank) FROM EVENTS "
             "WHERE ph IS DISTINCT FROM 'M' GROUP BY 1")}
    for pid in seen["pids"]:
        count, low, high = per_pid[str(pid["pid"])]
        assert count == pid["events"], pid
        if low == high:
            assert low == pid["rank"], pid


@pytest.mark.parametrize("trace", large_ones_slow(REAL_TRACES + DLRM), ids=lambda p: p.name)
def test_sql_answers_equal_inspect_and_attribute(trace: Path, tmp_path: Path) -> None:
    _check_against_commands(trace, tmp_path)


def test_sql_on_a_merged_16_rank_trace(merged16: Path, tmp_path: Path) -> None:
    _check_against_commands(merged16, tmp_path)
    ranks = _sql(tmp_path / "events.parquet", "SELECT DISTINCT rank FROM EVENTS WHERE cat = 'kernel' ORDER BY 1")
    assert [rank for (rank,) in ranks] == list(range(16))


def test_ranks_found_after_the_pass_replace_the_first_guess(merged_by_name: Path, tmp_path: Path) -> None:
    out = tmp_path / "events.parquet"
    summary = convert(merged_by_name, out, jobs=1)
    expected = {row["pid"]: row["rank"] for row in summary["rank_map"]}
    assert sorted(set(expected.values()) - {None}) == [0, 1, 2, 3]
    for pid, rank in _sql(out, "SELECT DISTINCT pid, rank FROM EVENTS WHERE pid IS NOT NULL"):
        assert expected.get(pid) == rank, pid


def test_drop_cat(tmp_path: Path) -> None:
    trace = TRACES / "b200_eager.json.gz"
    out = tmp_path / "events.parquet"
    summary = convert(trace, out, drop_categories=["python_function", "no_such_cat"], jobs=1)
    original = [event for event in events_of(load_json(trace)) if event.get("cat") != "python_function"]
    assert [rebuild(row) for row in rows_of(out)] == original
    assert summary["dropped_by_category"]["python_function"] == 15230
    assert summary["warnings"] == ["--drop-cat no_such_cat: no event has this category"]


@pytest.mark.parametrize("which", ["gzip", "plain"])
def test_range_workers_write_the_same_file(which: str, merged16: Path, merged_by_name: Path, tmp_path: Path,
                                           monkeypatch) -> None:
    """-j 2 (pass-1 range workers build the rows; a plain file's chunks are read by the workers themselves)."""
    trace = merged16 if which == "gzip" else merged_by_name
    monkeypatch.setattr(parseproc, "MIN_BYTES", 0)  # range workers for a small file too
    monkeypatch.setattr(indexworkers, "CHUNK_BYTES", 1 << 14)  # and many chunks
    one, two = tmp_path / "one.parquet", tmp_path / "two.parquet"
    convert(trace, one, jobs=1)
    convert(trace, two, jobs=2)
    assert rows_of(one) == rows_of(two)
    assert one.read_bytes() == two.read_bytes()


def test_no_file_left_when_the_input_is_cut(tmp_path: Path) -> None:
    source = tmp_path / "cut.json"
    text = (TRACES / "kineto_small.json").read_bytes()
    source.write_bytes(text[: len(text) // 2])
    spool = tmp_path / "spool"
    spool.mkdir()
    out = tmp_path / "events.parquet"
    with pytest.raises(TraceError):
        convert(source, out, spool_dir=str(spool), jobs=1)
    assert not out.exists() and sorted(os.listdir(tmp_path)) == ["cut.json", "spool"] and not os.listdir(spool)


def test_existing_output_refused_before_reading(tmp_path: Path) -> None:
    out = tmp_path / "events.parquet"
    out.write_bytes(b"keep")
    with pytest.raises(TraceError, match="exists"):
        convert(TRACES / "kineto_small.json", out)
    assert out.read_bytes() == b"keep"


def test_without_pyarrow_one_line_names_the_extra(tmp_path: Path) -> None:
    code = ("import sys; sys.modules['pyarrow'] = None; sys.modules['pyarrow.parquet'] = None\n"
            "from streamtrace.cli import main; sys.exit(main())")
    out = tmp_path / "events.parquet"
    done = subprocess.run([sys.executable, "-c", code, "convert", str(TRACES / "kineto_small.json"), str(out)],
                          capture_output=True, text=True, cwd=ROOT)
    assert done.returncode == 1
    assert done.stderr.count("\n") == 1 and "pip install 'streamtrace[parquet]'" in done.stderr
    assert not out.exists()


def test_gzip_input_and_compressed_suffix_refused(tmp_path: Path) -> None:
    with pytest.raises(TraceError, match="--compress"):
        convert(TRACES / "kineto_small.json", tmp_path / "events.parquet", compress="gzip")
    source = tmp_path / "small.json.gz"
    source.write_bytes(gzip.compress((TRACES / "kineto_small.json").read_bytes()))
    convert(source, tmp_path / "events.parquet", jobs=1)
    assert len(rows_of(tmp_path / "events.parquet")) == len(events_of(load_json(TRACES / "kineto_small.json")))


def test_slice_writes_the_kept_events_as_rows(merged16: Path, tmp_path: Path) -> None:
    """``slice -o OUT.parquet``: the same events as the sliced trace, with the ranks ``convert`` gives them."""
    options = dict(ranks="1,3", drop_categories=["python_function"], jobs=1)
    sliced = tmp_path / "sliced.json"
    streamtrace.slice_trace(merged16, sliced, **options)
    table = tmp_path / "sliced.parquet"
    summary = streamtrace.slice_trace(merged16, table, **options)
    rows = rows_of(table)
    assert [rebuild(row) for row in rows] == events_of(load_json(sliced))
    assert summary["events_written"] == len(rows)
    assert {row["rank"] for row in rows if row["ph"] != "M"} == {1, 3}
    whole = tmp_path / "whole.parquet"
    convert(merged16, whole, jobs=1)
    key = lambda row: tuple(value for column, value in row.items() if column != "rank")  # noqa: E731
    ranks = defaultdict(set)
    for row in rows_of(whole):
        ranks[key(row)].add(row["rank"])
    assert [ranks[key(row)] for row in rows] == [{row["rank"]} for row in rows]


def test_slice_to_parquet_refuses_what_it_cannot_do(tmp_path: Path) -> None:
    with pytest.raises(TraceError, match="--redact"):
        streamtrace.slice_trace(TRACES / "kineto_small.json", tmp_path / "x.parquet", redact=True)
    assert not (tmp_path / "x.parquet").exists()


@pytest.mark.slow
def test_several_rank_files_into_one_file(tmp_path: Path) -> None:
    """A directory of rank files (as merge takes it): each file's rows in turn, each with its file's rank."""
    out = tmp_path / "dlrm.parquet"
    summary = convert(TRACES / "dlrm_8ranks", out, jobs=1)
    rows = rows_of(out)
    expected = []
    for trace in DLRM:
        one = tmp_path / f"{trace.name}.parquet"
        convert(trace, one, jobs=1)
        expected += rows_of(one)
    assert rows == expected
    assert [rebuild(row) for row in rows] == [event for trace in DLRM for event in events_of(load_json(trace))]
    assert {row["rank"] for row in rows} == set(range(8)) and summary["input"] == "8 files"
    for trace in DLRM:
        rank = load_json(trace)["distributedInfo"]["rank"]
        kernels = sum(float(row["dur"]) for row in _attribute_rows(trace, tmp_path) if row["cat"] == "kernel")
        assert _sql(out, f"SELECT sum(dur) FROM EVENTS WHERE rank = {rank} AND cat = 'kernel'")[0][0] == pytest.approx(kernels)


def test_several_inputs_need_a_parquet_output(tmp_path: Path) -> None:
    with pytest.raises(TraceError, match="several inputs"):
        convert([str(path) for path in DLRM[:2]], tmp_path / "two.json")
    assert not (tmp_path / "two.json").exists()


def test_an_archive_of_rank_files_into_one_file(tmp_path: Path) -> None:
    """A tar of rank files reads as the directory it was made from: each member's rows in turn, with its rank."""
    bundle = tmp_path / "dlrm.tar.gz"
    with tarfile.open(bundle, "w:gz") as tar:
        for trace in DLRM:
            tar.add(trace, arcname=f"dlrm_8ranks/{trace.name}")
    out = tmp_path / "dlrm.parquet"
    summary = convert(bundle, out, jobs=1)
    rows = rows_of(out)
    assert [rebuild(row) for row in rows] == [event for trace in DLRM for event in events_of(load_json(trace))]
    ranks = [load_json(trace)["distributedInfo"]["rank"] for trace in DLRM]
    assert [row["rank"] for row in rows] == [rank for trace, rank in zip(DLRM, ranks)
                                             for _ in events_of(load_json(trace))]
    assert summary["input"] == "8 files"
