"""``streamtrace sql``: answers equal plain Python over ``json.load`` of the same trace, ranks per row,
one-line refusals, nothing left behind."""
from __future__ import annotations

import bisect
import csv
import gzip
import io
import json
import os
import re
import signal
import subprocess
import sys
import tarfile
import time
from collections import Counter, defaultdict
from pathlib import Path

import pytest
from conftest import ROOT, TRACES, all_but_first_slow, events_of, load_json

import streamtrace
from streamtrace import TraceError
from streamtrace.cli import main
from streamtrace.synth import SynthConfig, write_traces

pytest.importorskip("pyarrow.parquet")

KINETO = TRACES / "kineto_small.json"
DLRM = TRACES / "dlrm_8ranks"
SMALL = dict(pp_stages=2, microbatches=2, steps=1, eager_kernels=2, graph_kernels=6, graph_streams=4, python_noise=1)


def ask(source, query: str, **options) -> list[tuple]:
    return streamtrace.sql(source, query, jobs=1, **options)["rows"]


def test_answers_equal_plain_python_over_the_events() -> None:
    events = events_of(load_json(KINETO))
    by_kind = Counter((event.get("ph"), event.get("cat")) for event in events)
    assert dict(((ph, cat), count) for ph, cat, count in ask(KINETO, "SELECT ph, cat, count(*) FROM events GROUP BY ALL")) \
        == by_kind
    kernel_time: dict[str, float] = defaultdict(float)
    for event in events:
        if event.get("cat") == "kernel":
            kernel_time[event["name"]] += event["dur"]
    answer = ask(KINETO, "SELECT name, sum(dur) FROM events WHERE cat = 'kernel' GROUP BY name")
    assert dict(answer) == pytest.approx(dict(kernel_time), rel=1e-12)
    rows = ask(KINETO, "SELECT ph, name, coalesce(pid::VARCHAR, pid_text), coalesce(tid::VARCHAR, tid_text), ts, dur, args, "
                       "pid_text IS NULL FROM events")  # input order; ts and dur exact
    assert [row[:6] for row in rows] == [tuple(str(value) if key in ("pid", "tid") else value
                                               for key, value in ((key, event.get(key)) for key in
                                                                  ("ph", "name", "pid", "tid", "ts", "dur")))
                                         for event in events]
    assert [row[7] for row in rows] == [not isinstance(event["pid"], str) for event in events]
    assert [None if row[6] is None else json.loads(row[6]) for row in rows] == [event.get("args") for event in events]


@pytest.mark.parametrize("packed", all_but_first_slow(["directory", "archive"]))
def test_several_rank_files_are_one_table_each_row_with_its_rank(packed: str, tmp_path: Path) -> None:
    source = DLRM
    if packed == "archive":
        source = tmp_path / "ranks.tar"
        with tarfile.open(source, "w") as archive:
            archive.add(DLRM, arcname="dlrm")
    expected = {}
    for path in sorted(DLRM.glob("*.json.gz")):
        rank = int(re.search(r"worker(\d+)", path.name).group(1))
        kernels = [event for event in events_of(load_json(path)) if event.get("cat") == "kernel"]
        expected[rank] = (len(kernels), sum(event["dur"] for event in kernels))
    answer = ask(source, "SELECT rank, count(*), sum(dur) FROM events WHERE cat = 'kernel' GROUP BY rank")
    assert {rank: count for rank, count, _ in answer} == {rank: count for rank, (count, _) in expected.items()}
    assert {rank: total for rank, _, total in answer} == \
        pytest.approx({rank: total for rank, (_, total) in expected.items()}, rel=1e-12)


def test_a_merged_file_gives_each_row_the_rank_it_came_from(tmp_path: Path) -> None:
    """Ranks stated only by process names: each row's rank is the rank file it was merged from
    (synth's truth: merged index = rank index + the rank's offset); pids no rule places
    ('Spans', 'Traces') have none."""
    truth = write_traces(SynthConfig(ranks=4, **SMALL), tmp_path, compress="gz", merged_style="process-name")
    merged = tmp_path / truth["merged"]["file"]
    events = events_of(load_json(merged))
    offsets = truth["merged"]["merged_offset"]
    expected = [bisect.bisect_right(offsets, index) - 1 if isinstance(event.get("pid"), int) else None
                for index, event in enumerate(events)]
    assert [rank for (rank,) in ask(merged, "SELECT rank FROM events")] == expected
    assert len(set(expected)) == 5


def test_values_a_typed_column_cannot_hold_stay_exact(tmp_path: Path) -> None:
    """Integers beyond 64 bits and bad UTF-8: the rows hold what the reading gives (json.loads of the text
    the repair makes), not an error or a rounded number."""
    source = tmp_path / "odd.json"
    text = (b'{"traceEvents": [{"ph": "X", "cat": "kernel", "name": "k\xffx", "pid": 1, "tid": 2, "ts": 1.5, '
            b'"dur": 2, "id": 1180591620717411303424, "args": {"big": 18446744073709551616, "f": 1e-05}}]}')
    source.write_bytes(text)
    (name, flow_id, extra, args, dur), = ask(source, "SELECT name, id, extra, args, dur FROM events")
    event = json.loads(text.decode("utf-8", "replace"))["traceEvents"][0]
    assert name == event["name"] == "k\ufffdx"
    assert flow_id is None and json.loads(extra)["id"] == event["id"] == 1 << 70
    assert json.loads(args) == event["args"] and dur == 2.0


def test_an_empty_trace_is_an_empty_table(tmp_path: Path, capsys) -> None:
    source = tmp_path / "empty.json"
    source.write_text('{"traceEvents": []}')
    assert ask(source, "SELECT count(*), sum(dur) FROM events") == [(0, None)]
    assert main(["sql", str(source), "SELECT rank, name FROM events", "--csv", "-q", "-j", "1"]) == 0
    assert capsys.readouterr().out == "rank,name\n"


def test_csv_and_table_outputs(tmp_path: Path, capsys) -> None:
    events = events_of(load_json(KINETO))
    query = "SELECT name, ts, dur FROM events WHERE cat = 'cpu_op' ORDER BY ts"
    expected = sorted(((event["name"], event["ts"], event["dur"]) for event in events if event.get("cat") == "cpu_op"),
                      key=lambda row: row[1])
    out = tmp_path / "ops.csv.gz"
    assert main(["sql", str(KINETO), query, "-o", str(out), "-q", "-j", "1"]) == 0
    assert "answered  4 rows of 3 columns, from 75 events" in capsys.readouterr().out
    with gzip.open(out, "rt", newline="") as handle:
        table = list(csv.reader(handle))
    assert table[0] == ["name", "ts", "dur"]
    assert [(name, float(ts), float(dur)) for name, ts, dur in table[1:]] == expected
    assert main(["sql", str(KINETO), query, "-q", "-j", "1"]) == 0
    header, rule, *lines = capsys.readouterr().out.splitlines()
    assert header.split() == ["name", "ts", "dur"] and set(rule) <= {"-", " "}
    assert [line.split()[-2:] for line in lines] == [[repr(ts), repr(dur)] for _, ts, dur in expected]


def test_memory_limit_and_threads_are_the_commands() -> None:
    (memory, threads), = streamtrace.sql(KINETO, "SELECT current_setting('memory_limit'), current_setting('threads')",
                                         memory_mb=100, jobs=1)["rows"]
    assert (memory.replace(" ", ""), threads) in {("95.3MiB", 1), ("100.0MB", 1)}


def test_a_bad_query_is_one_line_and_leaves_nothing(tmp_path: Path, capsys) -> None:
    spool = tmp_path / "spool"
    spool.mkdir()
    out = tmp_path / "answer.csv"
    assert main(["sql", str(KINETO), "SELECT nme FROM events", "-o", str(out), "--spool-dir", str(spool), "-q"]) == 1
    error = capsys.readouterr().err
    assert error.count("\n") == 1 and "Traceback" not in error
    assert error.startswith('streamtrace: error: query: line 1, column 8: Binder Error: Referenced column "nme" not found')
    assert not out.exists() and os.listdir(spool) == [] and os.listdir(tmp_path) == ["spool"]
    with pytest.raises(TraceError, match="the query is empty"):
        streamtrace.sql(KINETO, "  ")
    with pytest.raises(TraceError, match="no SQL statement"):
        streamtrace.sql(KINETO, "-- the kernels\n;", jobs=1)


def test_a_refusal_points_into_the_query_as_written() -> None:
    """DuckDB shows a long line as a window of it: the column is still the query's own."""
    wide = "SELECT " + ", ".join(f"ts AS c{number}" for number in range(30)) + ",\n  nme FROM events"
    flat = wide.replace("\n ", "")
    for query, line, column in [(flat, 1, flat.index("nme") + 1), (wide, 2, 3)]:
        with pytest.raises(TraceError) as refused:
            streamtrace.sql(KINETO, query, jobs=1)
        assert str(refused.value).startswith(f"query: line {line}, column {column}: Binder Error:")
    with pytest.raises(TraceError, match=r"^query: line 1, column 8: Conversion Error: Could not convert string '\w+' "):
        streamtrace.sql(KINETO, "SELECT cast(name AS INT) FROM events", jobs=1)


def test_an_existing_output_is_refused_without_overwrite(tmp_path: Path, capsys) -> None:
    out = tmp_path / "answer.csv"
    out.write_text("keep me\n")
    query = "SELECT count(*) AS n FROM events"
    assert main(["sql", str(KINETO), query, "-o", str(out), "-q", "-j", "1"]) == 1
    assert "exists; pass --overwrite" in capsys.readouterr().err and out.read_text() == "keep me\n"
    spool = tmp_path / "spool"
    spool.mkdir()
    assert main(["sql", str(KINETO), query, "-o", str(out), "--overwrite", "--spool-dir", str(spool), "-q", "-j", "1"]) == 0
    assert out.read_text() == f"n\n{len(events_of(load_json(KINETO)))}\n"
    assert os.listdir(spool) == []  # the scratch directory is gone after a success too


def test_an_output_named_for_another_format_is_refused(tmp_path: Path, capsys) -> None:
    """A table or CSV answer under a name that promises JSON (or a CSV under .txt) is refused before any work."""
    query = "SELECT count(*) AS n FROM events"
    for name, flags, says in (("answer.json", [], "this writes text, not JSON"), ("answer.txt", ["--csv"], "this writes CSV")):
        assert main(["sql", str(KINETO), query, "-o", str(tmp_path / name), *flags, "-q", "-j", "1"]) == 1
        assert says in capsys.readouterr().err and not (tmp_path / name).exists()
    assert main(["sql", str(KINETO), query, "-o", str(tmp_path / "answer.txt"), "-q", "-j", "1"]) == 0
    assert "n" in (tmp_path / "answer.txt").read_text()


@pytest.mark.slow
def test_a_large_answer_is_written_as_it_is_fetched(tmp_path: Path) -> None:
    """600,000 rows of 18 columns (over 600 MB as Python tuples) written with the process under 400 MB."""
    out = tmp_path / "big.csv"
    run = subprocess.run([sys.executable, "-m", "streamtrace", "sql", str(KINETO),
                          "SELECT e.*, r.range FROM events e, range(8000) r", "-o", str(out), "--json", "-q", "-j", "1"],
                         capture_output=True, text=True, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert run.returncode == 0, run.stderr
    summary = json.loads(run.stdout)
    assert summary["row_count"] == 75 * 8000 == sum(1 for _ in open(out)) - 1
    assert summary["peak_rss_mb"] < 400


@pytest.mark.slow
@pytest.mark.parametrize("stop", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_a_stop_during_the_query_leaves_nothing(tmp_path: Path, stop: signal.Signals) -> None:
    spool = tmp_path / "spool"
    spool.mkdir()
    out = tmp_path / "answer.csv"
    run = subprocess.Popen([sys.executable, "-m", "streamtrace", "sql", str(KINETO),
                            "SELECT count(*) FROM events a, range(1000000000) r WHERE hash(a.name, r.range) % 7 = 3",
                            "-o", str(out), "--spool-dir", str(spool), "-q", "-j", "1"],
                           stderr=subprocess.PIPE, text=True, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)})
    deadline = time.monotonic() + 60
    while not list(spool.glob("*/events.parquet")) and time.monotonic() < deadline:  # the query has started
        time.sleep(0.1)
    time.sleep(0.5)
    run.send_signal(stop)
    _, error = run.communicate(timeout=30)
    assert run.returncode == 128 + stop
    assert "interrupted; no output written" in error and "Traceback" not in error
    assert os.listdir(spool) == [] and not out.exists()


def test_a_trace_on_stdin(monkeypatch, capsys) -> None:
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(gzip.compress(KINETO.read_bytes()))))
    assert main(["sql", "-", "SELECT count(*) AS n FROM events", "--csv", "-q", "-j", "1"]) == 0
    assert capsys.readouterr().out == f"n\n{len(events_of(load_json(KINETO)))}\n"


def test_csv_cells_of_every_kind(capsys) -> None:
    """Booleans as SQL writes them, lists and structs as JSON, NULL empty, decimals and big numbers exact."""
    query = ("SELECT true AS t, [1, 2] AS l, {'a': 'x'} AS s, NULL AS n, 1.50::DECIMAL(4, 2) AS d, "
             "170141183460469231731687303715884105727::HUGEINT AS h, 0.1::DOUBLE + 0.2::DOUBLE AS f")
    assert main(["sql", str(KINETO), query, "--csv", "-q", "-j", "1"]) == 0
    assert capsys.readouterr().out == \
        't,l,s,n,d,h,f\ntrue,"[1,2]","{""a"":""x""}",,1.50,170141183460469231731687303715884105727,0.30000000000000004\n'
