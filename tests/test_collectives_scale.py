"""The collective report at scale: its kernel records and long tables' rows on disk (forced here by a
small budget) give the same bytes; the report's memory follows the collective being matched, not the
number of kernels; 1,024 ranks against plain code over json.load, in processes and on a Dask cluster."""
from __future__ import annotations

import csv
import json
import math
import re
import tracemalloc
from pathlib import Path

import numpy as np
import pytest
from test_collectives import assert_tables_match
from tracelens_cases import HEATMAP, case_files

from streamtrace.algo import collectives as algo
from streamtrace.commands.analyses import collectives as command
from streamtrace.commands.analyze import analyze
from streamtrace.io import collectivespill
from streamtrace.synth import SynthConfig, write_traces


def csv_bytes(directory: Path) -> dict[str, bytes]:
    return {path.name: path.read_bytes() for path in sorted(directory.glob("*.csv"))}


@pytest.mark.parametrize("case", [pytest.param(case, marks=pytest.mark.slow) if case == "synth_pp16" else case
                                  for case in HEATMAP])
def test_spilled_records_and_rows_give_the_same_tables(tmp_path, monkeypatch, case):
    """Records on disk from the first kernel (the kernels' and the all_to_allv summary's), every long table's
    rows through its file, none kept for the summary: the CSVs are the bytes of the run in memory, and
    TraceLens's."""
    files = case_files(case, tmp_path / "in")
    analyze(files, tmp_path / "memory", all2allv_heatmap=True)
    spilled = []
    seal = collectivespill.SpilledKernels.seal
    monkeypatch.setattr(collectivespill.SpilledKernels, "seal",
                        lambda self: spilled.append((self.dtype.names[0], self.spilled)) or seal(self))
    monkeypatch.setattr(collectivespill, "SPILL_BYTES", 0)
    monkeypatch.setattr(command, "JSON_ROWS", 2)
    summary = analyze(files, tmp_path / "disk", all2allv_heatmap=True, spool_dir=str(tmp_path))
    assert spilled == [("ts", True), ("labels", True)]
    assert summary["tables"]["nccl_long"] is None and summary["tables"]["nccl_all2allv"] is not None
    assert csv_bytes(tmp_path / "disk") == csv_bytes(tmp_path / "memory")
    assert_tables_match(tmp_path / "disk", case)
    assert sorted(path.name for path in tmp_path.iterdir()) == ["disk", "in", "memory"]  # no temporary file left


def allreduces(rank: int, count: int) -> algo.RankKernels:
    """``count`` all-reduces of one group of 4 ranks, rank 3 arriving last."""
    meta = ("0", "[0, 1, 2, 3]", "allreduce", 4, "Float", 1 << 20, 1 << 20, "[]", "[]", 7)
    return algo.RankKernels(rank, np.arange(count) * 100.0 + rank, np.full(count, 50.0 - rank), np.zeros(count, np.int32),
                            [meta])


def traced_report(ranks: int, count: int) -> tuple:
    """The collective report of ``ranks`` ranks of ``count`` all-reduces each, and its traced peak in bytes."""
    inputs = [command.CollectiveInput(allreduces(rank, count), 0) for rank in range(ranks)]
    tracemalloc.start()
    try:
        report = command.collective_report(inputs, False)
        return report, tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


@pytest.mark.slow  # (tracemalloc)
def test_report_memory_follows_the_collective_not_the_kernels(monkeypatch):
    """8,000 kernels (2,000 collectives): the report's peak (records, the summaries' columns, one collective)
    stays under 4.5 MB; nccl_long's rows and nccl_implicit_sync's as Python lists and dicts took 7.6."""
    monkeypatch.setattr(command, "JSON_ROWS", 10)
    report, peak = traced_report(4, 2_000)
    try:
        assert len(report.tables["nccl_long"]) == 8_000 and report.tables["nccl_long"].rows is None
        assert report.tables["straggler_summary"].rows[0][:4] == [3, 0, 0.0, 2_000]
        assert peak < 4.5e6, peak
    finally:
        command.close(report)


RANKS = 1024


def oracle(directory: Path) -> tuple[int, dict[tuple[str, int], dict[int, tuple[float, float]]]]:
    """Plain code over json.load: every rank's NCCL kernels (with a correlation id) by process group, the
    k-th by start time of each group: collective id -> rank -> (start, duration)."""
    found: dict[tuple[str, int], dict[int, tuple[float, float]]] = {}
    kernels = 0
    for path in directory.glob("rank*_trace.json"):
        trace = json.loads(path.read_text())
        rank = trace["distributedInfo"]["rank"]
        groups: dict[str, list] = {}
        for event in trace["traceEvents"]:
            if event.get("cat") == "kernel" and re.search("nccl", event["name"], re.IGNORECASE) and \
                    "correlation" in event.get("args", {}):
                groups.setdefault(event["args"]["Process Group Name"], []).append(event)
                kernels += 1
        for group, events in groups.items():
            for place, event in enumerate(sorted(events, key=lambda event: event["ts"])):
                found.setdefault((f"{group}_{place}", event["args"]["Collective name"]), {})[rank] = (event["ts"], event["dur"])
    return kernels, found


@pytest.fixture(scope="module")
def thousand(tmp_path_factory) -> Path:
    directory = tmp_path_factory.mktemp("ranks1024")
    config = SynthConfig(ranks=RANKS, pp_stages=1, microbatches=1, steps=1, graph_kernels=0, eager_kernels=1,
                         python_noise=0, graph_streams=1, collectives=True, slow_rank=700, slow_factor=1.5)
    write_traces(config, directory, compress="none", merged=False)
    return directory


@pytest.mark.slow
def test_1024_ranks_against_json_load_in_processes_and_on_dask(thousand, tmp_path):
    """Every rank's wait, the latency and the straggler of each all-reduce, all-gather and reduce-scatter
    over 1,024 rank files are plain code's; a Dask cluster writes the same bytes."""
    distributed = pytest.importorskip("distributed")
    summary = analyze(thousand, tmp_path / "local", only="collectives", jobs=2)
    kernels, expected = oracle(thousand)
    assert len(summary["tables"]["nccl_long"]) == kernels
    with open(tmp_path / "local" / "nccl_implicit_sync.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    implicit = {key: ranks for key, ranks in expected.items()
                if algo.TYPE_OF.get(key[1]) in ("allreduce", "allgather", "reducescatter")}
    assert sorted(row["collective_id"] for row in rows) == sorted(cid for cid, _ in implicit)
    for row in rows:
        ranks = next(ranks for (cid, _), ranks in implicit.items() if cid == row["collective_id"])
        assert len(ranks) == RANKS
        latest = max(start for start, _ in ranks.values())
        for rank, (start, _) in ranks.items():
            assert math.isclose(float(row[f"rank_{rank}_wait_time"]), latest - start, abs_tol=1e-6)
        assert math.isclose(float(row["comm_latency"]), min(length for _, length in ranks.values()))
        waits = {rank: latest - start for rank, (start, _) in ranks.items()}
        assert int(row["earliest arrival rank"]) == max((wait, rank) for rank, wait in waits.items())[1]
    assert summary["tables"]["straggler_summary"][0]["rank"] == 700
    with distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True, host="127.0.0.1",
                                  dashboard_address=None, worker_dashboard_address=None) as cluster:
        (tmp_path / "spool").mkdir()
        analyze(thousand, tmp_path / "dask", only="collectives", dask=cluster.scheduler_address,
                spool_dir=str(tmp_path / "spool"))
    assert csv_bytes(tmp_path / "dask") == csv_bytes(tmp_path / "local")
