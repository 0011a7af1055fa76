"""inspect against the generator's ground truth: single ranks and merged files."""
from __future__ import annotations

import json
from collections import Counter

import pytest

import streamtrace
from streamtrace.synth import SynthConfig, write_traces

CONFIG = dict(ranks=4, pp_stages=2, microbatches=3, steps=2, eager_kernels=4, graph_kernels=40, python_noise=1)


@pytest.fixture(scope="module", params=["rank-arg", "process-name"])
def generated(request, tmp_path_factory):
    directory = tmp_path_factory.mktemp(request.param)
    truth = write_traces(SynthConfig(**CONFIG), directory, compress="zst", merged_style=request.param)
    return directory, truth


def test_single_rank_summary_matches_truth(generated):
    directory, truth = generated
    for rank in truth["ranks"]:
        summary = streamtrace.inspect(directory / rank["file"])
        assert summary["events"] == rank["events"]
        assert summary["ranks"] == [rank["rank"]]
        assert {p["rank_source"] for p in summary["pids"]} == {"distributedInfo.rank"}
        gpu = [p for p in summary["pids"] if p["role"] == "GPU"]
        assert [p["pid"] for p in gpu] == [rank["gpu_pid"]]
        assert gpu[0]["gpu_streams"] == len(rank["gpu_streams"])
        assert summary["runtime_launches"] == rank["runtime_calls"]
        graphs = summary["graph_launches"]
        assert graphs["count"] == rank["graph_launches"]
        assert graphs["gpu_events_per_launch_min"] == graphs["gpu_events_per_launch_max"] == rank["gpu_events_per_graph_launch"]
        cpu_pp = {key.split("/")[1]: n for key, n in summary["pp_annotations"].items() if key.startswith("cpu/")}
        assert cpu_pp == rank["pp_action_counts"]
        assert summary["correlation_collisions"] == {"ids_shared_across_pids": 0, "ids_shared_across_ranks": 0}
        assert summary["base_time_ns"] == rank["base_time_ns"]
        assert summary["top_level_keys"][-2:] == ["distributedInfo", "traceName"]


def test_merged_summary_sees_every_rank_and_the_collisions(generated):
    directory, truth = generated
    summary = streamtrace.inspect(directory / truth["merged"]["file"])
    ranks = truth["ranks"]
    assert summary["events"] == truth["merged"]["events"] == sum(r["events"] for r in ranks)
    assert summary["ranks"] == [r["rank"] for r in ranks]
    expected_source = "args.rank" if truth["merged"]["style"] == "rank-arg" else "process_name"
    by_pid = {p["pid"]: p for p in summary["pids"]}
    for rank in ranks:
        assert by_pid[rank["cpu_pid"]]["rank"] == rank["rank"]
        assert by_pid[rank["merged_gpu_pid"]]["rank"] == rank["rank"]
        assert by_pid[rank["merged_gpu_pid"]]["rank_source"] == expected_source
    overlap = min(r["correlation_max"] for r in ranks) - max(r["correlation_min"] for r in ranks) + 1
    assert summary["correlation_collisions"]["ids_shared_across_ranks"] == overlap > 0
    graphs = summary["graph_launches"]
    assert graphs["count"] == sum(r["graph_launches"] for r in ranks)
    assert graphs["gpu_events_per_launch_max"] == max(r["gpu_events_per_graph_launch"] for r in ranks)
    cpu_pp = Counter()
    for rank in ranks:
        cpu_pp.update(rank["pp_action_counts"])
    assert {k.split("/")[1]: n for k, n in summary["pp_annotations"].items() if k.startswith("cpu/")} == dict(cpu_pp)


def test_convert_merged_round_trip_keeps_every_event(generated, tmp_path):
    directory, truth = generated
    merged = directory / truth["merged"]["file"]
    out = tmp_path / "m.json"
    summary = streamtrace.convert(merged, out, drop_categories=["python_function"])
    doc = json.loads(out.read_bytes())
    assert summary["events_written"] == len(doc["traceEvents"])
    assert not any(e.get("cat") == "python_function" for e in doc["traceEvents"])
    assert summary["events_written"] + summary["events_dropped"] == truth["merged"]["events"]
