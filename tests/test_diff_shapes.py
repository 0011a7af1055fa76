"""``streamtrace diff`` on every shape of input: a merged multi-rank file compared
rank by rank (its ranks told apart as analyze tells them), archives, URLs,
globs; runs that differ in ranks or steps compared on what they share, with
a note; the issue's bad inputs (one side empty, no steps, an iteration that
does not exist, identical inputs, the same file twice)."""
from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest
from bucket_servers import object_server
from conftest import TRACES
from test_diff import edge_events, write_trace

import streamtrace
from streamtrace import cli
from streamtrace.commands.diff import DiffIndex
from streamtrace.engine import indexworkers, parseproc
from streamtrace.errors import TraceError
from streamtrace.io.spool import ColumnSpill
from streamtrace.synth import SynthConfig, write_traces

DLRM = TRACES / "dlrm_8ranks"
DLRM_FILES = sorted(DLRM.glob("*.json.gz"))


@pytest.fixture(scope="module")
def merged_dlrm(tmp_path_factory) -> Path:
    """``streamtrace merge`` of the 8 DLRM ranks (pids renumbered, correlation ids shifted per rank,
    GPU streams moved to lanes with their original_stream kept, events in time order)."""
    out = tmp_path_factory.mktemp("merged") / "dlrm_merged.json"
    streamtrace.merge(DLRM, str(out))
    return out


def totals(summary: dict, side: str) -> dict[str, tuple]:
    return {row["name"]: (row[f"{side}_counts"], row[f"{side}_total_duration"]) for row in summary["trace_diff"]
            if row[f"{side}_counts"]}


def only_unchanged(summary: dict) -> bool:
    changes = summary["changes"]
    return changes["unchanged"] > 0 and not any(count for change, count in changes.items() if change != "unchanged")


@pytest.mark.parametrize("device", ["all", "gpu"])
def test_a_merged_file_against_its_rank_files_is_unchanged_rank_by_rank(merged_dlrm, device):
    """Every rank of the merged file has the counts and durations of its own rank file (read alone)."""
    for rank, path in enumerate(DLRM_FILES):
        summary = streamtrace.diff(merged_dlrm, DLRM, device=device, control_rank=rank, test_rank=rank)
        assert (summary["control"]["rank"], summary["test"]["rank"]) == (rank, rank)
        assert summary["control"]["ranks"] == list(range(8))
        alone = streamtrace.diff(path, path, device=device)
        assert totals(summary, "Control") == totals(alone, "Control") == totals(summary, "Test")
        assert only_unchanged(summary)


def test_a_merged_file_defaults_to_its_first_rank_and_its_step_times_per_rank(merged_dlrm):
    summary = streamtrace.diff(merged_dlrm, DLRM, tables=True)
    assert (summary["control"]["rank"], summary["test"]["rank"]) == (0, 0)
    assert only_unchanged(summary)
    steps = summary["tables"]["step_time_per_rank"]
    assert [row["rank"] for row in steps] == list(range(8))
    assert all(row["present"] == "both" and row["mean_step(us)__diff"] == 0 for row in steps)
    assert summary["notes"] == []


def test_a_rank_inside_a_merged_file_from_the_command_line(merged_dlrm, capsys):
    assert cli.main(["diff", str(merged_dlrm), str(DLRM_FILES[3]), "--control-rank", "3", "-q"]) == 0
    report = capsys.readouterr().out
    assert f"control  {merged_dlrm} rank 3 iteration" in report
    assert "0 added, 0 deleted, 0 increased, 0 decreased, 256 unchanged" in report
    assert "note     ranks 0, 1, 2, 4, 5, 6, 7 only in the control run" in report
    with pytest.raises(TraceError, match=r"no rank 9 in the control trace \(its ranks: 0, 1, 2, 3, 4, 5, 6, 7\)"):
        streamtrace.diff(merged_dlrm, DLRM, control_rank=9)


@pytest.mark.parametrize("style", ["rank-arg", "process-name"])
def test_a_generated_merged_file_by_each_rank_rule(tmp_path, style):
    """Ranks stated by args.rank on the events, or by the process_name of each pid."""
    write_traces(SynthConfig(ranks=3, pp_stages=1, steps=2, graph_kernels=3, eager_kernels=2), tmp_path,
                 compress="none", merged_style=style)
    for rank in range(3):
        summary = streamtrace.diff(tmp_path / "merged_trace.json", tmp_path / f"rank{rank}_trace.json", control_rank=rank)
        assert only_unchanged(summary), (rank, summary["changes"])


def test_events_no_rule_places_are_left_out_and_said(tmp_path):
    """Ranks stated by nothing: the GPU pids are paired with their CPU pids by launch times; the CPU pids
    without launches stay without a rank, as in analyze (which says the same)."""
    write_traces(SynthConfig(ranks=3, pp_stages=1, steps=2, graph_kernels=3, eager_kernels=2), tmp_path,
                 compress="none", merged_style="none")
    merged = tmp_path / "merged_trace.json"
    summary = streamtrace.diff(merged, tmp_path / "rank1_trace.json", control_rank=1)
    left_out = summary["control"]["read"]["rows_without_rank"]
    assert f"{left_out:,} events on pids that no rule places in a rank are left out" in summary["notes"][-1]
    (said,) = [note for note in streamtrace.analyze(merged, only="steps")["notes"] if "no rule places" in note]
    assert said.startswith(f"{merged}: {left_out} events")


def _archive(kind: str, path: Path) -> Path:
    if kind == "tar":
        with tarfile.open(path, "w") as tar:
            for file in DLRM_FILES:
                tar.add(file, arcname=f"dlrm/{file.name}")
    else:
        with zipfile.ZipFile(path, "w") as archive:
            for file in DLRM_FILES:
                archive.write(file, file.name)
    return path


@pytest.mark.parametrize("kind", ["tar", "zip"])
def test_an_archive_of_rank_files_is_rank_files(tmp_path, kind):
    archive = _archive(kind, tmp_path / f"dlrm.{kind}")
    summary = streamtrace.diff(archive, DLRM, control_rank=5, test_rank=5, tables=True)
    assert summary["control"]["file"].endswith(DLRM_FILES[5].name) and "!" in summary["control"]["file"]
    assert summary["control"]["ranks"] == list(range(8))
    assert only_unchanged(summary)
    assert all(row["mean_step(us)__diff"] == 0 for row in summary["tables"]["step_time_per_rank"])


def test_urls_of_a_merged_file_and_of_a_rank_file(merged_dlrm):
    pytest.importorskip("aiohttp", reason="the http extra")
    with object_server() as server:
        server.objects["/merged.json"] = merged_dlrm.read_bytes()
        server.objects["/rank2.json.gz"] = DLRM_FILES[2].read_bytes()
        summary = streamtrace.diff(server.url("/merged.json"), server.url("/rank2.json.gz"), control_rank=2)
        assert only_unchanged(summary) and summary["control"]["ranks"] == list(range(8))
        assert summary["test"]["rank"] == 2


def test_a_glob_of_rank_files(tmp_path):
    for file in DLRM_FILES[:3]:
        shutil.copy(file, tmp_path / file.name)
    summary = streamtrace.diff(str(tmp_path / "worker*.json.gz"), DLRM, control_rank=1, test_rank=1)
    assert summary["control"]["ranks"] == [0, 1, 2] and only_unchanged(summary)
    assert summary["notes"] == ["ranks 3, 4, 5, 6, 7 only in the test run"]


def test_runs_of_other_rank_and_step_counts_are_compared_on_what_they_share(tmp_path, capsys):
    for name, ranks, steps in (("small", 2, 2), ("large", 4, 3)):
        write_traces(SynthConfig(ranks=ranks, pp_stages=1, steps=steps, graph_kernels=3, eager_kernels=2),
                     tmp_path / name, compress="none", merged=False)
    summary = streamtrace.diff(tmp_path / "small", tmp_path / "large", test_rank=1)
    assert (summary["control"]["rank"], summary["test"]["rank"]) == (0, 1)
    assert summary["control"]["iterations"] != summary["test"]["iterations"]
    only = sorted(set(summary["test"]["iterations"]) - set(summary["control"]["iterations"]))
    assert summary["notes"] == ["ranks 2, 3 only in the test run",
                                f"iterations {', '.join(map(str, only))} only in the test run (control rank 0, test rank 1)"]
    assert cli.main(["diff", str(tmp_path / "small"), str(tmp_path / "large"), "-q"]) == 0
    assert "note     ranks 2, 3 only in the test run" in capsys.readouterr().out


def test_identical_copies_are_all_unchanged(tmp_path):
    """Two files with the same bytes (each read): every row unchanged, no duration moved."""
    first = write_trace(tmp_path / "a" / "trace.json", edge_events())
    second = tmp_path / "b.json"
    second.write_bytes(first.read_bytes())
    summary = streamtrace.diff(first, second)
    assert only_unchanged(summary) and summary["changes"]["unchanged"] == len(summary["trace_diff"])
    assert all(row["diff_duration"] == 0 and row["diff_counts"] == 0 for row in summary["trace_diff"])
    assert summary["control"]["file"] != summary["test"]["file"]


@pytest.mark.parametrize("content", [b"", json.dumps({"traceEvents": []}).encode()], ids=["zero-bytes", "no-events"])
def test_an_empty_control_is_one_line(tmp_path, content, capsys):
    empty = tmp_path / "empty.json"
    empty.write_bytes(content)
    good = write_trace(tmp_path / "good.json", edge_events())
    out = tmp_path / "out"
    assert cli.main(["diff", str(empty), str(good), "-o", str(out), "-q"]) == 1
    error = capsys.readouterr().err.strip().splitlines()
    assert len(error) == 1 and str(empty) in error[0] and not out.exists()


def test_a_merged_rank_without_steps_or_that_iteration_is_named(tmp_path, merged_dlrm):
    """A rank of a merged file: its own iterations, said with its rank."""
    with pytest.raises(TraceError, match=r"no iteration 3 in the test trace \(rank 4\) \(its iterations: 10\)"):
        streamtrace.diff(DLRM_FILES[4], merged_dlrm, test_rank=4, test_iteration=3)
    events = [{**event, "pid": rank, "args": {**event.get("args", {}), "rank": rank}}
              for rank in (0, 1) for event in edge_events()
              if rank == 0 or not event["name"].startswith("ProfilerStep")]
    for event in events:
        if event.get("ph") == "M":
            event["args"] = {"name": f"rank {event['pid']}"}
    two = write_trace(tmp_path / "two.json", events, rank=None)
    assert streamtrace.diff(two, two)["control"]["ranks"] == [0, 1]
    with pytest.raises(TraceError, match="the test trace has no iteration to compare on rank 1"):
        streamtrace.diff(two, two, test_rank=1)



def test_the_index_holds_one_block_of_rows_and_gives_analyze_blocks():
    """Memory: pass 1 keeps at most one block of rows in memory (the rest on disk), each row's own
    args.rank beside it, as analyze's work blocks."""
    index = DiffIndex()
    block = ColumnSpill.CHUNK
    count = 2 * block + 123
    for n in range(count):
        index.visit({"ph": "X", "cat": "kernel", "name": f"k{n % 5}", "pid": n % 2, "tid": 7, "ts": n, "dur": 1,
                     "args": {"stream": 7, "correlation": n, "rank": n % 3} if n % 2 else {"stream": 7, "correlation": n}})
    try:
        assert len(index.rows.columns[0]) < block and len(index.names) == 5 and len(index.pids) == 2
        blocks = list(index.work_blocks())
        assert [base for base, _ in blocks] == [0, block, 2 * block]
        assert [int(ts) for _, columns in blocks for ts in columns["ts"]] == list(range(count))
        ranked = [(int(at), int(rank)) for _, columns in blocks for at, rank in zip(columns["ranked"], columns["ranks"])]
        assert ranked == [(n, n % 3) for n in range(1, count, 2)]
        assert index.pids[1].arg_ranks == {0, 1, 2} and index.unranked[0] == 1
    finally:
        index.rows.close()


def test_small_blocks_give_the_same_diff(merged_dlrm, monkeypatch):
    """A merged file read in blocks far smaller than a rank: the same rows."""
    expected = streamtrace.diff(merged_dlrm, DLRM, control_rank=6, test_rank=6, jobs=1)
    monkeypatch.setattr(ColumnSpill, "CHUNK", 97)
    found = streamtrace.diff(merged_dlrm, DLRM, control_rank=6, test_rank=6, jobs=1)
    assert found["trace_diff"] == expected["trace_diff"] and only_unchanged(found)


@pytest.mark.parametrize("style", ["process-name", "rank-arg"])
def test_pass1_workers_read_a_merged_file_as_the_ordinary_reading(tmp_path, monkeypatch, style):
    """A merged file cut into 4 KiB ranges read by two workers (names, categories and pids sent in parts,
    process_name events among the chunks) against the event-by-event reading (--salvage) and the rank file."""
    write_traces(SynthConfig(ranks=2, pp_stages=1, steps=2, graph_kernels=3, eager_kernels=2), tmp_path,
                 compress="none", merged_style=style)
    monkeypatch.setattr(parseproc, "MIN_BYTES", 0)
    monkeypatch.setattr(indexworkers, "CHUNK_BYTES", 4 << 10)
    merged, rank_file = tmp_path / "merged_trace.json", tmp_path / "rank1_trace.json"
    ranges = streamtrace.diff(merged, rank_file, control_rank=1, jobs=2)
    events = streamtrace.diff(merged, rank_file, control_rank=1, salvage=True)
    assert ranges["trace_diff"] == events["trace_diff"] and only_unchanged(ranges)


def test_a_rank_file_is_the_rank_it_was_picked_as(tmp_path):
    """Among rank files, a file is its named rank even where its events' args.rank say another
    (one rank per file: nothing to tell apart)."""
    for rank in (0, 1):
        events = [{**event, "args": {**event["args"], "rank": 0}} if event.get("cat") == "cuda_runtime" else event
                  for event in edge_events(extra=rank)]
        write_trace(tmp_path / "run" / f"rank{rank}_trace.json", events, rank=None)
    summary = streamtrace.diff(tmp_path / "run", tmp_path / "run", test_rank=1, device="cpu")
    assert (summary["control"]["rank"], summary["test"]["rank"]) == (0, 1)
    assert summary["ops_diff"]["increased"] == ["aten::mm", "cudaLaunchKernel"]


MEASURE = Path(__file__).parent / "badinputs" / "measure.py"


@pytest.mark.slow
def test_peak_memory_does_not_grow_with_the_trace(tmp_path):
    """Two iterations of a generated rank, 10 MB and 100 MB: the peak RSS stays within a few MB
    (measured 63.7 and 67.1 MiB on a shared machine), as analyze's does."""
    peaks = []
    for size in (10_000_000, 100_000_000):
        write_traces(SynthConfig(ranks=1, pp_stages=1, target_bytes=size), tmp_path / str(size), compress="none",
                     merged=False)
        trace, report = str(tmp_path / str(size) / "rank0_trace.json"), tmp_path / f"{size}.json"
        subprocess.run([sys.executable, str(MEASURE), str(report), "600", sys.executable, "-m", "streamtrace", "diff",
                        trace, trace, "--control-iteration", "1", "--test-iteration", "2", "-q", "-j", "1"],
                       check=True, stdout=subprocess.DEVNULL)
        result = json.loads(report.read_text())
        assert result["returncode"] == 0
        peaks.append(result["peak_rss_kib"] / 1024)
    assert peaks[1] - peaks[0] < 16, peaks
