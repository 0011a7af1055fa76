"""The collective report's memory: the summary's rows of its long tables are read back from their temporary
files at the end, none held while the kernels are walked (the same values, of the same types, as rows made in
memory); a rank's records are made and stored a block at a time."""
from __future__ import annotations

import csv
import io
import math
import tracemalloc
from collections import Counter

import numpy as np
import pytest
from test_collectives_scale import traced_report
from tracelens_cases import CASES, case_files

from streamtrace.algo import collectives as algo
from streamtrace.commands.analyses import collectives as command
from streamtrace.commands.analyze import analyze
from streamtrace.io import collectivespill

CELLS = [0, -7, 1 << 70, 0.1 + 0.2, 1e-300, -0.0, math.inf, 5e15 + 0.5, "", "12", "1.5", 'a, "b"\nc', "None", None, True, ("Float", 2)]


def same(found: list, made: list) -> bool:
    """Equal values of the same types (floats by their text, NaN as NaN)."""
    return len(found) == len(made) and all(type(a) is type(b) and repr(a) == repr(b) for a, b in zip(found, made))


@pytest.mark.parametrize("pending_cells", [1, collectivespill.PENDING_CELLS])
def test_rows_read_back_are_the_rows_made(tmp_path, monkeypatch, pending_cells):
    """Plain rows, rows of named columns (missing ones None) and rows sorted by a key: read back with their
    values and types, written a row at a time or held until the end; NaN comes back NaN;
    beyond ``keep`` rows, none."""
    monkeypatch.setattr(collectivespill, "PENDING_CELLS", pending_cells)
    plain = collectivespill.RowPart(str(tmp_path), keep=100)
    rows = [CELLS[at:] + CELLS[:at] + [math.nan] for at in range(len(CELLS))]
    for row in rows:
        plain.add(row)
    found = list(plain.table(list("x" * len(rows[0]))).each_row())
    assert all(same(a, b) for a, b in zip(found, rows)) and len(found) == len(rows)
    named = collectivespill.RowPart(str(tmp_path), keep=100)
    columns = [f"c{at}" for at in range(len(CELLS) + 1)]
    for at in range(len(CELLS)):
        named.add({f"c{n}": CELLS[(n + at) % len(CELLS)] for n in range(at, len(CELLS))}, key=[3.0, math.nan, 7, 3][at % 4])
    table = named.table(columns, by_key=True)
    made = [[None] * at + [CELLS[(n + at) % len(CELLS)] for n in range(at, len(CELLS))] + [None] for at in range(len(CELLS))]
    keys = [[3.0, math.nan, 7, 3][at % 4] for at in range(len(CELLS))]
    expected = [made[at] for at in algo.descending_order(keys)]
    assert all(same(a, b) for a, b in zip(table.rows, expected)) and len(table.rows) == len(expected)
    short = collectivespill.RowPart(str(tmp_path), keep=3)
    for row in rows:
        short.add(row)
    assert short.table(["x"]).rows is None and len(short) == len(rows)
    for part in (plain, named, short):
        part.close()
    assert not list(tmp_path.iterdir())


def test_sorted_and_unsorted_rows_never_mix_in_one_table(tmp_path):
    """A row without its key in a sorted table (or with one in an unsorted table) would pair each later key
    with the wrong row: refused at once."""
    sorted_part = collectivespill.RowPart(str(tmp_path), keep=100)
    sorted_part.add([1], key=2.0)
    with pytest.raises(ValueError, match="sort key"):
        sorted_part.add([2])
    unsorted_part = collectivespill.RowPart(str(tmp_path), keep=100)
    unsorted_part.add([1])
    with pytest.raises(ValueError, match="sort key"):
        unsorted_part.add([2], key=1.0)
    for part in (sorted_part, unsorted_part):
        part.close()


@pytest.mark.parametrize("pending_cells", [1, 7, collectivespill.PENDING_CELLS])
def test_sorted_rows_copied_from_their_places(tmp_path, monkeypatch, pending_cells):
    """Rows sorted by a key, with texts of several bytes a character, written in blocks or one by one: the
    CSV is that of the rows put in order by plain code."""
    monkeypatch.setattr(collectivespill, "PENDING_CELLS", pending_cells)
    part = collectivespill.RowPart(str(tmp_path), keep=0)
    rows = [[f"r{at}", "é" * (at % 3), "日本" if at % 2 else "x", at * 0.5] for at in range(40)]
    keys = [float((at * 7) % 11) for at in range(40)]
    for row, key in zip(rows, keys):
        part.add(row, key=key)
    out = tmp_path / "t.csv"
    with open(out, "wb") as raw:
        part.table(list("abcd"), by_key=True).write(raw)
    part.close()
    expected = io.StringIO()
    writer = csv.writer(expected, lineterminator="\n")
    writer.writerow(list("abcd"))
    writer.writerows(row for _, _, row in sorted(((-key, at, row) for at, (row, key) in enumerate(zip(rows, keys)))))
    assert out.read_text(encoding="utf-8") == expected.getvalue()


@pytest.mark.slow  # (tracemalloc)
def test_no_summary_row_held_during_the_walk():
    """4 ranks of 2,000 all-reduces, every table under JSON_ROWS (its rows in the summary): the report's peak
    stays under 4.5 MB (3.4 here), as with no row kept; holding them as lists until the end took 11.4."""
    report, peak = traced_report(4, 2_000)
    try:
        records = command.as_records(report)
        assert len(records["nccl_long"]) == 8_000 and len(records["nccl_implicit_sync"]) == 2_000
        assert peak < 4.5e6, peak
    finally:
        command.close(report)


@pytest.mark.parametrize("case", [pytest.param(case, marks=pytest.mark.slow) if case in ("synth_pp16", "dlrm_8ranks")
                                  else case for case in CASES])
def test_summary_rows_read_back_are_those_made_in_memory(tmp_path, monkeypatch, case):
    """The summary's tables (values, types, floats' text, None) are those of the rows made in memory
    (:class:`~streamtrace.algo.collectives.Rows`, the library's own)."""
    files = case_files(case, tmp_path / "in")
    read_back = analyze(files, None, all2allv_heatmap=True)["tables"]
    monkeypatch.setattr(command, "RowPart", lambda directory, keep: algo.Rows())
    monkeypatch.setattr(command, "close", lambda report: None)
    in_memory = analyze(files, None, all2allv_heatmap=True)["tables"]
    assert read_back.keys() == in_memory.keys() and read_back["nccl_long"]
    for name, rows in in_memory.items():
        assert repr(read_back[name]) == repr(rows), name


def test_records_made_a_block_at_a_time(tmp_path, monkeypatch):
    """Groups of kernels with tied and unordered starts: each record's place in its group is its place by
    (start, file order), and ``sorted`` lists the file positions in (group, place) order (plain sorted() here),
    with blocks of 7 records."""
    monkeypatch.setattr(algo, "RECORD_BLOCK", 7)
    rng = np.random.default_rng(5)
    count = 100
    metas = [(name, "[0, 1]", "allreduce", 2, "Float", 8, 8, "[]", "[]", 7) for name in ("0", "1", "2")]
    ts = rng.integers(0, 20, count).astype(float)
    meta = rng.integers(0, 3, count).astype(np.int32)
    kernels = algo.RankKernels(1, ts, np.ones(count), meta, metas, np.arange(count), np.full(count, -1, np.int32))
    records = algo.match([kernels]).records
    by_place = sorted(range(count), key=lambda at: (metas[meta[at]][0], ts[at], at))
    assert records["sorted"].tolist() == by_place and records["ts"].tolist() == ts.tolist()
    assert records["seq"].tolist() == list(range(count))
    for at in range(count):
        same_group = [other for other in by_place if meta[other] == meta[at]]
        assert records["index"][at] == same_group.index(at)


@pytest.mark.slow  # (tracemalloc)
def test_a_ranks_records_never_whole_in_memory(tmp_path):
    """One rank of 400,000 kernels over 4 groups, its records to disk from the first: matching them takes under
    20 MB (15.4 here: the sort's positions, each kernel's group and place); the records made whole (48 bytes a
    kernel) beside the sort's 64-bit positions took 34.8."""
    count = 400_000
    metas = [(name, "[0, 1]", "allreduce", 2, "Float", 8, 8, "[]", "[]", 7) for name in ("0", "1", "2", "3")]
    kernels = algo.RankKernels(0, np.arange(count, dtype=float), np.ones(count), (np.arange(count) % 4).astype(np.int32),
                               metas, np.arange(count), np.full(count, -1, np.int32))
    store = collectivespill.SpilledKernels(str(tmp_path), budget=0)
    tracemalloc.start()
    try:
        matched = algo.match([kernels], store)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    try:
        assert store.spilled and matched.records["index"][-4:].tolist() == [count // 4 - 1] * 4
        assert peak < 20e6, peak
    finally:
        del matched
        store.close()


def report_peak(directory, monkeypatch, capsys) -> tuple[int, str]:
    """The traced peak of ``streamtrace analyze DIR/rank*`` (no --json) from the collective report on, and its
    report's lines on collectives."""
    from streamtrace.cli import main

    made = command.collective_report
    monkeypatch.setattr(command, "collective_report", lambda *given: tracemalloc.start() or made(*given))
    capsys.readouterr()
    try:
        assert main(["analyze", *map(str, sorted(directory.glob("rank*_trace.json"))), "-o", str(directory / "out"),
                     "-j", "1", "-q"]) == 0
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    lines = capsys.readouterr().out
    return peak, "\n".join(" ".join(line.split()) for line in lines.splitlines())


@pytest.mark.slow  # (two generated runs, 12 s)
def test_report_without_json_holds_no_row_per_collective(tmp_path, monkeypatch, capsys):
    """analyze's human report: from the collective report on, its traced peak grows by less than 3.5 MB from
    200 to 2,000 collective kernels on each of 4 ranks (about 2 MB here: the kernels' records and sorts, tens of
    bytes a kernel), its lines from figures gathered as the rows are made; with the long tables' rows built as
    dicts for the summary it grew by 18 MB."""
    from streamtrace.synth import SynthConfig, write_traces

    peaks, lines = [], []
    for steps in (40, 400):
        write_traces(SynthConfig(ranks=4, pp_stages=1, microbatches=1, steps=steps, graph_kernels=0, eager_kernels=1,
                                 python_noise=0, collectives=True, slow_rank=2, slow_factor=1.5),
                     tmp_path / str(steps), compress="none", merged=False)
        peak, said = report_peak(tmp_path / str(steps), monkeypatch, capsys)
        peaks.append(peak)
        lines.append(said)
    assert peaks[1] - peaks[0] < 3.5e6, peaks
    out = tmp_path / "400" / "out"
    with open(out / "collective_matches.csv", newline="") as matches:
        rules = Counter(row["match"] for row in csv.DictReader(matches))
    with open(out / "collective_bandwidth.csv", newline="") as bandwidth:
        longest = max(csv.DictReader(bandwidth), key=lambda row: float(row["wait for last (us)"]))
    assert f"matched {rules['Seq']:,} collectives by Seq (TraceLens's tables: by order)" in lines[1]
    assert (f"longest wait {float(longest['wait for last (us)']):,.0f} us for rank {longest['last arrival rank']} at "
            f"{longest['Collective name']} {longest['collective_id']} (latency") in lines[1]
    assert "collectives rank 2 arrives last at" in lines[1]
