"""``inspect`` tells a merged file's ranks apart by the rules relink, split
and attribute use (SPEC 6), so its busy time per rank is per real rank."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import TRACES, load_json
from test_inspect_busy import GPU_CATS, plain_union

import streamtrace
from streamtrace.synth import SynthConfig, write_traces


@pytest.fixture(scope="module")
def concatenated(tmp_path_factory) -> Path:
    """The 8 DLRM ranks' events in one file, as naive tools merge them: no
    process name states a rank, and the header is rank 0's."""
    documents = [load_json(path) for path in sorted((TRACES / "dlrm_8ranks").iterdir())]
    merged = {**documents[0], "traceEvents": [event for document in documents for event in document["traceEvents"]]}
    path = tmp_path_factory.mktemp("concat") / "dlrm_concatenated.json"
    path.write_text(json.dumps(merged))
    return path


@pytest.mark.parametrize("jobs", [1, 2])
def test_inspect_finds_the_ranks_split_finds(concatenated, tmp_path, jobs):
    summary = streamtrace.inspect(concatenated, jobs=jobs)
    split = streamtrace.split(concatenated, tmp_path / f"ranks{jobs}")
    decided = {entry["pid"]: (entry["rank"], entry["rank_source"]) for entry in summary["pids"]}
    for row in split["rank_map"]:
        if row["pid"] in decided:
            assert decided[row["pid"]] == (row["rank"], row["rule"]), row
    assert summary["ranks"] == split["ranks"] == list(range(8))


def test_busy_per_rank_is_each_rank_gpu_union(concatenated):
    summary = streamtrace.inspect(concatenated)
    rank_of = {entry["pid"]: entry["rank"] for entry in summary["pids"]}
    slices: dict[int, list] = {}
    for event in json.loads(concatenated.read_text())["traceEvents"]:
        if event.get("cat") in GPU_CATS and event.get("ph") == "X":
            slices.setdefault(rank_of[event["pid"]], []).append((event["ts"], event["ts"] + event["dur"]))
    shown = {entry["rank"]: entry["gpu_busy"] for entry in summary["by_rank"] if "gpu_busy" in entry}
    assert sorted(shown) == list(range(8))
    for rank, busy in shown.items():
        assert busy["busy_us"] == pytest.approx(plain_union(slices[rank]), abs=1e-3)
        assert busy["busy_percent"] <= 100 and "gpu_pids" not in busy


@pytest.fixture(scope="module", params=["rank-arg", "none"])
def merged(request, tmp_path_factory) -> tuple[Path, dict]:
    """A generated merged file with more GPU events per rank than inference samples (4096)."""
    directory = tmp_path_factory.mktemp(request.param)
    truth = write_traces(SynthConfig(ranks=2, pp_stages=1, microbatches=2, steps=3, eager_kernels=20,
                                     graph_kernels=400, python_noise=0), directory, merged_style=request.param)
    return directory / truth["merged"]["file"], truth


@pytest.mark.parametrize("jobs", [1, 2])
def test_inspect_ranks_agree_with_relink_past_the_samples(merged, tmp_path, jobs):
    """Every pid that launches or runs GPU work (those relink decides) has relink's rank and rule."""
    path, truth = merged
    summary = streamtrace.inspect(path, jobs=jobs)
    relinked = streamtrace.relink(path, tmp_path / "relinked.json", jobs=jobs)
    decided = {entry["pid"]: (entry["rank"], entry["rank_source"]) for entry in summary["pids"]}
    assert {row["pid"]: (row["rank"], row["rule"]) for row in relinked["rank_map"]} == \
        {pid: decided[pid] for pid in (row["pid"] for row in relinked["rank_map"])}
    gpu_events = {entry["pid"]: entry["events"] for entry in summary["pids"] if entry["role"] == "GPU"}
    assert min(gpu_events.values()) > 4096
    for rank in truth["ranks"]:  # (ranks in lockstep may tie, as relink says: then no rank, never a wrong one)
        assert {decided[rank["merged_gpu_pid"]][0], decided[rank["cpu_pid"]][0]} - {None} == {rank["rank"]}
