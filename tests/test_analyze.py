"""``analyze``: CLI behaviour, merged files, the executor seam, many ranks.

Equality with HTA itself is tests/test_analyze_hta.py's; here the oracles
are independent computations over small traces read whole, the same tables
from another form of the same run (per-rank files and their merged file;
-j 1, -j 2 and a Dask cluster), and what the CLI promises (exit status, files).
"""
from __future__ import annotations

import csv
import html
import json
import math
import shlex
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from conftest import TRACES, events_of, load_json

import streamtrace
from streamtrace.algo import analysis as hta
from streamtrace.commands.analyses import index as index_module
from streamtrace.commands.analyze import COLUMNS, TABLES
from streamtrace.errors import TraceError
from streamtrace.synth import SynthConfig, write_merged, write_traces

DLRM = TRACES / "dlrm_8ranks"
SMALL = dict(microbatches=2, steps=3, graph_kernels=8, graph_streams=4, eager_kernels=4, python_noise=1)


@pytest.fixture(scope="module")
def generated(tmp_path_factory) -> Path:
    """4 ranks (PP 2 x DP 2), 3 steps, their naive merged file beside them."""
    directory = tmp_path_factory.mktemp("analyze4")
    write_traces(SynthConfig(ranks=4, pp_stages=2, **SMALL), directory, compress="gz", merged=True)
    return directory


def rank_files(directory: Path) -> list[Path]:
    return sorted(directory.glob("rank*_trace.json*"))


def comparable(tables: dict) -> dict:
    """Tables with NaN made comparable (NaN != NaN)."""
    return json.loads(json.dumps(tables).replace("NaN", "null"))


def test_dlrm_temporal_breakdown_against_a_whole_file_reading():
    """Kernel time is the span of the rank's events on a stream, idle the span minus their union,
    compute the union of kernels HTA calls computation (names neither NCCL, memory nor *Sync)."""
    summary = streamtrace.analyze(DLRM, jobs=1)
    rows = {row["rank"]: row for row in summary["tables"]["temporal_breakdown"]}
    assert sorted(rows) == list(range(8))
    for path in sorted(DLRM.iterdir()):
        document = load_json(path)
        rank = document["distributedInfo"]["rank"]
        gpu = [e for e in events_of(document) if "dur" in e and e.get("args", {}).get("stream") is not None]
        spans = sorted((e["ts"], e["ts"] + e["dur"]) for e in gpu)
        compute = sorted((e["ts"], e["ts"] + e["dur"]) for e in gpu if not e["name"].startswith(("nccl", "Memcpy", "Memset"))
                         and "Memcpy" not in e["name"] and "Sync" not in e["name"])
        row = rows[rank]
        assert row["kernel_time(us)"] == spans[-1][1] - spans[0][0]
        assert row["idle_time(us)"] == row["kernel_time(us)"] - brute_union(*zip(*spans))
        assert row["compute_time(us)"] == brute_union(*zip(*compute))
        assert math.isclose(row["idle_time(us)"] + row["compute_time(us)"] + row["non_compute_time(us)"],
                            row["kernel_time(us)"])


def test_dlrm_launch_stats_cover_every_rank_and_launch():
    """One row per (launch call, kernel) pair of every rank: the launches counted from the files."""
    summary = streamtrace.analyze(DLRM, jobs=1)
    rows = summary["tables"]["kernel_launch_stats"]
    by_rank: dict[int, int] = {}
    for row in rows:
        by_rank[row["rank"]] = by_rank.get(row["rank"], 0) + 1
        assert row["launch_delay"] >= 0
    for path in sorted(DLRM.iterdir()):
        document = load_json(path)
        launches = {e["args"]["correlation"] for e in events_of(document)
                    if e.get("name") in ("cudaLaunchKernel", "cudaMemcpyAsync", "cudaMemsetAsync")}
        kernels = [e for e in events_of(document) if e.get("args", {}).get("stream") is not None
                   and e["args"].get("correlation") in launches]
        assert by_rank[document["distributedInfo"]["rank"]] == len(kernels)


def test_cli_writes_one_csv_per_table_and_refuses_to_overwrite(tmp_path):
    out = tmp_path / "tables"
    run = subprocess.run([sys.executable, "-m", "streamtrace", "analyze", str(DLRM), "-o", str(out), "-j", "2"],
                         capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    assert "rank 7" in run.stdout and "top kernels" in run.stdout
    collective = {"nccl_long", "nccl_implicit_sync", "nccl_summary_long", "nccl_summary_implicit_sync", "straggler_summary",
                  "straggler_causes", "collective_matches"}
    assert sorted(path.name for path in out.iterdir()) == sorted(f"{name}.csv" for name in (*TABLES, *collective))
    summary = streamtrace.analyze(DLRM, jobs=1)
    for name in TABLES:
        with (out / f"{name}.csv").open(newline="") as text:
            rows = list(csv.reader(text))
        assert tuple(rows[0]) == COLUMNS[name]
        assert len(rows) - 1 == len(summary["tables"][name])
    again = subprocess.run([sys.executable, "-m", "streamtrace", "analyze", str(DLRM), "-o", str(out)],
                           capture_output=True, text=True)
    assert again.returncode == 1
    assert again.stderr.count("\n") == 1 and "exists; pass --overwrite" in again.stderr
    assert not [path for path in out.iterdir() if path.name.startswith(".")]


def test_cli_json_carries_every_table():
    run = subprocess.run([sys.executable, "-m", "streamtrace", "analyze", str(DLRM), "--json", "-j", "1"],
                         capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    summary = json.loads(run.stdout)
    assert set(summary["tables"]) == set(TABLES) | {"nccl_long", "nccl_implicit_sync", "nccl_summary_long",
                                                    "nccl_summary_implicit_sync", "straggler_summary", "straggler_causes",
                                                    "collective_matches"}
    assert summary["tables"]["profiler_steps"] == [{"step": 10}]


def test_input_hta_stops_on_gives_tables():
    """kineto_small: nanosecond times, which HTA rounds (starts up, ends down) so that sub-microsecond
    kernels get negative durations; its temporal breakdown then asserts.  analyze gives the row."""
    summary = streamtrace.analyze(TRACES / "kineto_small.json", jobs=1)
    events = events_of(load_json(TRACES / "kineto_small.json"))
    kernel = next(e for e in events if e.get("cat") == "kernel")
    rounded = math.floor(kernel["ts"] + kernel["dur"]) - math.ceil(kernel["ts"])
    assert rounded < 0
    (row,) = [row for row in summary["tables"]["kernel_breakdown"] if row["name"] == kernel["name"]]
    assert row["sum (us)"] == rounded
    assert any("HTA's rounding" in note for note in summary["notes"])  # said, not silent
    (row,) = summary["tables"]["temporal_breakdown"]
    assert row["idle_time(us)"] > row["kernel_time(us)"]  # what HTA's first assertion refuses
    assert math.isclose(row["idle_time(us)"] + row["compute_time(us)"] + row["non_compute_time(us)"],
                        row["kernel_time(us)"])


def test_merged_file_gives_the_tables_of_its_rank_files(generated):
    per_rank = streamtrace.analyze(rank_files(generated), jobs=1)
    merged = streamtrace.analyze(generated / "merged_trace.json.gz", jobs=1)
    assert merged["ranks"] == per_rank["ranks"] == [0, 1, 2, 3]
    for name in TABLES:
        if name != "step_times":  # its start is from each input's first event
            assert comparable(merged["tables"][name]) == comparable(per_rank["tables"][name]), name


def test_merged_file_with_process_names(generated, tmp_path):
    """Ranks stated by process_name ('rank 3') instead of args.rank: the same tables."""
    path = tmp_path / "merged.json"
    with path.open("wb") as out:
        write_merged(SynthConfig(ranks=4, pp_stages=2, **SMALL), out, merged_style="process-name")
    merged = streamtrace.analyze(path, jobs=1)
    per_rank = streamtrace.analyze(rank_files(generated), jobs=1)
    assert comparable(merged["tables"]["kernel_breakdown"]) == comparable(per_rank["tables"]["kernel_breakdown"])
    assert comparable(merged["tables"]["temporal_breakdown"]) == comparable(per_rank["tables"]["temporal_breakdown"])


def test_events_no_rule_places_are_counted_not_lost_silently(tmp_path):
    """A merged file stating no rank whose ranks run in lockstep: GPU pids pair with no launching pid."""
    path = tmp_path / "merged.json"
    with path.open("wb") as out:
        write_merged(SynthConfig(ranks=4, pp_stages=2, **SMALL), out, merged_style="none")
    summary = streamtrace.analyze(path, jobs=1)
    assert any("no rule places in a rank" in note for note in summary["notes"])


def test_the_last_step_is_cut_where_hta_cuts_it(generated):
    """HTA keeps CPU events that start before the latest ProfilerStep event, GPU annotations included: the
    GPU copies of the last step start after its CPU span does, so its span stays, its later launches go."""
    default = streamtrace.analyze(rank_files(generated), jobs=1)
    whole = streamtrace.analyze(rank_files(generated), jobs=1, include_last_step=True)
    assert default["tables"]["profiler_steps"] == whole["tables"]["profiler_steps"] == [{"step": n} for n in range(3)]
    rows: dict[int, int] = {}
    for row in default["tables"]["kernel_launch_stats"]:
        rows[row["rank"]] = rows.get(row["rank"], 0) + 1
    for path in rank_files(generated):
        events = events_of(load_json(path))
        cutoff = max(e["ts"] for e in events if "ProfilerStep" in e.get("name", "") and "dur" in e)
        launched = {e["args"]["correlation"] for e in events if e.get("cat") == "cuda_runtime"
                    and e["name"] in ("cudaLaunchKernel", "cudaMemcpyAsync", "cudaMemsetAsync") and e["ts"] < cutoff}
        kernels = [e for e in events if "stream" in e.get("args", {}) and e["args"].get("correlation") in launched]
        assert rows[load_json(path)["distributedInfo"]["rank"]] == len(kernels)


def test_jobs_and_ranks_options(generated):
    one = streamtrace.analyze(generated, jobs=1)
    two = streamtrace.analyze(generated, jobs=2)
    assert comparable(one["tables"]) == comparable(two["tables"])
    some = streamtrace.analyze(generated, jobs=1, ranks={1, 3})
    for name in ("temporal_breakdown", "kernel_breakdown", "idle_time_breakdown", "kernel_launch_stats", "step_times"):
        assert {row["rank"] for row in some["tables"][name]} == {1, 3}, name


def test_a_rank_given_twice_is_refused(generated, tmp_path):
    copy = tmp_path / "rank0_again.json.gz"
    copy.write_bytes(rank_files(generated)[0].read_bytes())
    with pytest.raises(TraceError, match="rank 0 is in"):
        streamtrace.analyze([rank_files(generated)[0], copy], jobs=1)


MANY = 1024


@pytest.fixture(scope="module")
def many(tmp_path_factory) -> Path:
    directory = tmp_path_factory.mktemp("many")
    config = SynthConfig(ranks=MANY, pp_stages=1, microbatches=1, steps=2, graph_kernels=0, eager_kernels=1,
                         python_noise=0, graph_streams=1, big_ints=False)
    write_traces(config, directory, compress="none", merged=False)
    return directory


@pytest.mark.slow
def test_1024_ranks_in_processes_and_on_a_dask_cluster(many, tmp_path):
    distributed = pytest.importorskip("distributed")
    local = streamtrace.analyze(many, jobs=2)
    assert local["ranks"] == list(range(MANY))
    with distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True, host="127.0.0.1",
                                  dashboard_address=None, worker_dashboard_address=None) as cluster:
        remote = streamtrace.analyze(many, dask=cluster.scheduler_address, spool_dir=str(tmp_path))
    assert comparable(remote["tables"]) == comparable(local["tables"])
    assert list(tmp_path.iterdir()) == []  # the run's directory and the launch parts are gone


def brute_union(starts, ends) -> float:
    """Length of a union of integer intervals, by marking unit cells."""
    cells = set()
    for start, end in zip(starts, ends):
        cells.update(range(int(start), int(end)))
    return float(len(cells))


def test_interval_algorithms_against_unit_cells():
    """Unions, HTA's temporal split, type overlaps and the comm/comp overlap, on random integer intervals."""
    rng = np.random.default_rng(7)
    for _ in range(200):
        count = int(rng.integers(1, 30))
        start = rng.integers(0, 200, count).astype(float)
        end = start + rng.integers(0, 40, count)
        types = rng.choice([hta.COMMUNICATION, hta.MEMORY, hta.COMPUTATION, hta.OTHER], count)
        assert hta.covered(start, end) == brute_union(start, end)
        runs = hta.type_runs(start, end, types)
        t = hta.temporal(runs)
        assert t.kernel_time == end.max() - start.min()
        assert t.idle == t.kernel_time - brute_union(start, end)
        assert t.compute == brute_union(start[types == hta.COMPUTATION], end[types == hta.COMPUTATION])
        cells: dict[int, set] = {}
        for s, e, kind in zip(start, end, types):
            if kind != hta.OTHER:
                for cell in range(int(s), int(e)):
                    cells.setdefault(cell, set()).add(kind)
        expected: dict[str, int] = {}
        for kinds in cells.values():
            name = " overlapping ".join(hta.TYPE_NAMES[k] for k in hta.BREAKDOWN_TYPES if k in kinds)
            expected[name] = expected.get(name, 0) + 1
        assert hta.type_overlaps(runs) == expected
        comm = sum(1 for kinds in cells.values() if hta.COMMUNICATION in kinds)
        both = sum(1 for kinds in cells.values() if {hta.COMMUNICATION, hta.COMPUTATION} <= kinds)
        ratio = hta.overlap_ratio(runs)
        assert (math.isnan(ratio) and comm == 0) or ratio == both / comm


def test_steps_are_placed_as_hta_places_them():
    """The last span in event order that holds a time wins; a span holds [start, end)."""
    rng = np.random.default_rng(3)
    for _ in range(300):
        count = int(rng.integers(0, 8))
        starts = rng.integers(0, 50, count).astype(float)
        ends = starts + rng.integers(0, 20, count)
        numbers = rng.integers(0, 5, count)
        ts = rng.integers(-5, 80, 100).astype(float)
        expected = [next((int(n) for s, e, n in reversed(list(zip(starts, ends, numbers))) if s <= t < e), -1) for t in ts]
        assert hta.step_of(ts, starts, ends, numbers).tolist() == expected


def test_kernel_names_grouped_as_hta_groups_them():
    """Past 10 names, HTA puts those beyond the 10th or past the 80% quantile of the running total in 'others',
    then takes every row's statistics over the names' totals."""
    stats = [hta.NameStats(f"k{n:02d}", 1, float(100 - n), float(100 - n), float(100 - n), 0.0) for n in range(12)]
    rows = {row["name"]: row for row in hta.aggregate_names(stats)}
    totals = np.cumsum([100 - n for n in range(12)])
    threshold = np.quantile(totals, 0.8)
    kept = [f"k{n:02d}" for n in range(10) if totals[n] <= threshold]
    assert sorted(rows) == sorted(kept + ["others"])
    others = [100 - n for n in range(12) if f"k{n:02d}" not in kept]
    assert rows["others"]["sum"] == sum(others) and rows["others"]["max"] == max(others)
    assert math.isclose(rows["others"]["std"], float(np.std(others, ddof=1)))


@pytest.mark.slow
def test_ranges_projection_and_spilled_rows_give_the_same_tables(tmp_path, monkeypatch):
    """A 17 MB rank: pass 1 by ranges (-j 2, msgspec projections) == one process; rows spilled in small blocks."""
    write_traces(SynthConfig(ranks=1, pp_stages=1, target_bytes=17 << 20, **{**SMALL, "steps": 1}), tmp_path,
                 compress="none", merged=False)
    (path,) = rank_files(tmp_path)
    assert path.stat().st_size >= 16 << 20  # large enough for pass-1 workers
    one = streamtrace.analyze(path, jobs=1)
    two = streamtrace.analyze(path, jobs=2)
    monkeypatch.setattr(index_module, "PLAIN_BLOCK", 64)
    spilled = streamtrace.analyze(path, jobs=2)
    assert comparable(one["tables"]) == comparable(two["tables"]) == comparable(spilled["tables"])
    assert one["read"]["events"] == two["read"]["events"]


def test_the_page_names_the_command_that_made_it(tmp_path, capsys):
    """The command as given to main() (a program calling it, not the process's own argv)."""
    from streamtrace import cli

    page = tmp_path / "report.html"
    argv = ["analyze", str(DLRM), "-o", str(tmp_path / "tables"), "--html", str(page), "-j", "1", "-q"]
    assert cli.main(argv) == 0
    assert html.escape(shlex.join(["streamtrace", *argv])) in page.read_text(encoding="utf-8")


def test_no_straggler_candidates_is_refused_before_reading(tmp_path):
    with pytest.raises(streamtrace.TraceError, match="--candidates .* at least 1, not 0"):
        streamtrace.analyze(tmp_path / "no such input", num_candidates=0)


@pytest.fixture(scope="module")
def dlrm_merged(tmp_path_factory) -> Path:
    """The 8 DLRM ranks merged by ``merge`` (streams compacted into lanes, each moved slice's stream kept
    as args.original_stream, correlation ids made unique)."""
    path = tmp_path_factory.mktemp("dlrm_merged") / "merged.json.gz"
    streamtrace.merge(DLRM, path, jobs=1)
    return path


@pytest.mark.slow
def test_a_merge_output_gives_the_tables_of_its_ranks(dlrm_merged):
    """Streams are the ones kernels ran on (args.original_stream), not merge's lanes: the per-stream idle
    table and HTA's straggler metric (one communication stream and name compared across ranks) come out
    as from the rank files; kernels without a launch take their own rank's first event."""
    per_rank = streamtrace.analyze(DLRM, jobs=1)
    merged = streamtrace.analyze(dlrm_merged, jobs=1)
    for name in TABLES:
        if name != "kernel_launch_stats":  # (its correlation column: the merged file's ids)
            assert comparable(merged["tables"][name]) == comparable(per_rank["tables"][name]), name
    assert [row["normalized_start_time"] is not None for row in merged["tables"]["stragglers"]] == [True] * 8
    # the one table that differs says so, once, naming the ids it lists; the rank files need no such word
    assert sum("kernel_launch_stats lists the correlation ids" in note for note in merged["notes"]) == 1
    assert not any("correlation ids" in note for note in per_rank["notes"])
    raw = {(row["rank"], row["correlation"] % 10**9) for row in merged["tables"]["kernel_launch_stats"]}
    assert raw == {(row["rank"], row["correlation"]) for row in per_rank["tables"]["kernel_launch_stats"]}


def test_the_summary_says_whose_last_step_the_tables_leave_out(real_trace):
    """HTA's cut applies to a rank with two or more distinct ProfilerStep names (json.load's count); the summary
    lists it, the short report says so, and --include-last-step empties the list."""
    names = {event.get("name") for event in events_of(load_json(real_trace))
             if isinstance(event, dict) and "ProfilerStep" in str(event.get("name"))}
    summary = streamtrace.analyze(real_trace, jobs=1)
    assert summary["last_step_left_out"] == (summary["ranks"] if len(names) > 1 else [])
    assert streamtrace.analyze(real_trace, jobs=1, include_last_step=True)["last_step_left_out"] == []
    shown = subprocess.run([sys.executable, "-m", "streamtrace", "analyze", str(real_trace), "-j", "1"],
                           capture_output=True, text=True, check=True).stdout
    said = [line for line in shown.splitlines() if line.startswith("last step ")]
    assert len(said) == (len(names) > 1) and all("left out on every rank" in line for line in said), shown
