"""The summary's long collective tables streamed: ``analyze --json``, ``--summary`` and ``--html`` read their
rows back from the tables' temporary files as they write them, holding no row per kernel or collective, and
write what the rows as dicts would give."""
from __future__ import annotations

import csv
import io
import json
import math
import sys
import tracemalloc

import orjson
import pytest
from tracelens_cases import case_files

from streamtrace.cli import main
from streamtrace.commands.analyses import collectives as command
from streamtrace.commands.analyze import analyze
from streamtrace.io import report

LONG = ("nccl_long", "nccl_implicit_sync", "nccl_all2allv", "collective_bandwidth", "collective_matches", "p2p_pairs")


def run_cli(arguments: list[str], stdout_path, monkeypatch) -> int:
    """``streamtrace analyze ...``, its stdout into a file (not held by the test)."""
    with open(stdout_path, "w", encoding="utf-8") as out:
        monkeypatch.setattr(sys, "stdout", out)
        return main(["analyze", *arguments])


def traced_peak(directory, monkeypatch) -> int:
    """The traced peak of ``analyze DIR/rank* --json --summary FILE --html FILE`` from the collective report on."""
    made = command.collective_report
    monkeypatch.setattr(command, "collective_report", lambda *given: tracemalloc.start() or made(*given))
    try:
        assert run_cli([*map(str, sorted(directory.glob("rank*_trace.json"))), "-o", str(directory / "out"), "--json",
                        "--summary", str(directory / "summary.json"), "--html", str(directory / "page.html"),
                        "-j", "1", "-q"], directory / "stdout.json", monkeypatch) == 0
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


@pytest.mark.slow  # (two generated runs, 15 s)
def test_json_summary_and_page_hold_no_row_per_collective(tmp_path, monkeypatch):
    """--json, --summary and --html: from the collective report on, the traced peak grows by less than 3.5 MB
    from 200 to 2,000 collective kernels on each of 4 ranks (every long table within JSON_ROWS, so in the
    JSON; 0.4 MB here); with the rows built as dicts for the summary it grew by 11 MB.  The JSON printed and the
    summary file are the same bytes, and hold every row."""
    import plotly.io

    from streamtrace.synth import SynthConfig, write_traces

    assert plotly.io.templates["plotly_white"]  # (the page's modules imported before either run is traced)
    peaks = []
    for steps in (40, 400):
        write_traces(SynthConfig(ranks=4, pp_stages=1, microbatches=1, steps=steps, graph_kernels=0, eager_kernels=1,
                                 python_noise=0, collectives=True, slow_rank=2, slow_factor=1.5),
                     tmp_path / str(steps), compress="none", merged=False)
        peaks.append(traced_peak(tmp_path / str(steps), monkeypatch))
    assert peaks[1] - peaks[0] < 3.5e6, peaks
    directory = tmp_path / "400"
    printed = (directory / "stdout.json").read_bytes()
    assert printed == (directory / "summary.json").read_bytes()
    summary = json.loads(printed)
    assert len(summary["tables"]["nccl_long"]) == 4 * 2_000 == summary["collectives"]["rows"]["nccl_long"]
    assert b"Who waits for whom" in (directory / "page.html").read_bytes()


def csv_cells(value: object) -> str:
    """A JSON value as the csv module writes it (None as an empty cell)."""
    return "" if value is None else str(value)


@pytest.mark.parametrize("case", ["synth_fsdp4", pytest.param("dlrm_8ranks", marks=pytest.mark.slow)])
def test_streamed_json_is_the_csvs_rows_as_orjson_writes_them(tmp_path, monkeypatch, case):
    """The JSON printed: orjson's own indented text of its content (the rows streamed in as the whole dump
    would write them), each long table's rows those of its CSV (read with csv: header, then each row's cells),
    and the tables the library returns as lists."""
    files = case_files(case, tmp_path / "in")
    out = tmp_path / "out"
    assert run_cli([*map(str, files), "-o", str(out), "--json", "--all2allv-heatmap", "-j", "1", "-q"],
                   tmp_path / "stdout.json", monkeypatch) == 0
    printed = (tmp_path / "stdout.json").read_bytes()
    summary = json.loads(printed)
    assert orjson.dumps(summary, option=orjson.OPT_INDENT_2) + b"\n" == printed
    streamed = [name for name in LONG if name in summary["tables"]]
    assert "nccl_long" in streamed and "nccl_implicit_sync" in streamed
    for name in streamed:
        with open(out / f"{name}.csv", newline="", encoding="utf-8") as table:
            header, *rows = list(csv.reader(table))
        found = summary["tables"][name]
        assert len(found) == len(rows), name
        for row, line in zip(found, rows):
            assert list(row) == header and [csv_cells(value) for value in row.values()] == line, name
    listed = analyze(files, None, all2allv_heatmap=True, jobs=1)["tables"]
    for name in streamed:
        assert json.loads(orjson.dumps(listed[name])) == summary["tables"][name], name


def test_page_figures_from_streamed_rows_are_those_from_lists(tmp_path):
    """The page made while reading the long tables back from their files is the page of the same summary with
    the rows as lists."""
    from streamtrace.io import streamjson

    files = case_files("synth_fsdp4", tmp_path / "in")
    listed = analyze(files, None, jobs=1)
    streamed = analyze(files, None, jobs=1, collective_rows="streamed")
    try:
        assert isinstance(streamed["tables"]["nccl_implicit_sync"], command.SummaryRows)
        for key in ("wall_seconds", "peak_rss_mb", "pass1_seconds"):
            streamed[key] = listed[key]
        names = list(map(str, files))
        assert report.render(streamed, names, "cmd") == report.render(listed, names, "cmd")
        held = io.BytesIO()
        streamjson.write(streamed, held)
        assert held.getvalue() == orjson.dumps(listed, option=orjson.OPT_INDENT_2) + b"\n"
    finally:
        streamjson.close(streamed)


def test_placeholders_replaced_at_any_depth(monkeypatch):
    """Lists streamed at several depths, empty or not, beside plain values: the bytes orjson writes for lists."""
    from streamtrace.io import streamjson

    class Items(streamjson.Streamed):
        def __init__(self, items: list) -> None:
            self.items = items

        def __iter__(self):
            return iter(self.items)

    rows = [{"a": 1, "b": [1.5, None], "c": "x\ny\u0000"}, {}, {"a": {"d": []}}]
    plain = {"top": rows, "nested": {"empty": [], "more": [rows, [], rows[:1]]}, "text": "\u0000streamed 0"}
    made = {"top": Items(rows), "nested": {"empty": Items([]), "more": [Items(rows), Items([]), Items(rows[:1])]},
            "text": "\u0000streamed 0"}
    for block in (1, 1_000):
        monkeypatch.setattr(streamjson, "BLOCK_ITEMS", block)
        held = io.BytesIO()
        streamjson.write(made, held)
        assert held.getvalue() == orjson.dumps(plain, option=orjson.OPT_INDENT_2) + b"\n"


def test_sorted_rows_read_back_one_at_a_time(tmp_path):
    """A sorted long table (nccl_all2allv's form) read back for the summary in its order: the rows in order of
    their key, greatest first (ties and missing keys as made), and never all held: reading 20,000 back takes
    under 1 MB traced; read whole and reordered they took 5.3."""
    from streamtrace.io.collectivespill import RowPart

    part = RowPart(str(tmp_path), keep=100_000)
    made = [[at, at % 97 or None, f"row {at}"] for at in range(20_000)]
    for row in made:
        part.add(row, key=math.nan if row[1] is None else row[1])
    try:
        table = part.table(["at", "key", "text"], by_key=True)
        keyed = sorted((row for row in made if row[1] is not None), key=lambda row: -row[1])
        expected = iter(keyed + [row for row in made if row[1] is None])
        tracemalloc.start()
        try:
            found = sum(row == next(expected) for row in table.each_row())
            peak = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
        assert found == len(made) and next(expected, None) is None
        assert peak < 1e6, peak
    finally:
        part.close()
