"""A merged trace of 1,024 ranks (a few dozen events each): the merged-file
commands handle that many ranks, and split keeps within --max-open-files."""
from __future__ import annotations

import csv
import gzip
import json
from collections import Counter

import pytest

import streamtrace
from streamtrace.synth import SynthConfig, write_merged

RANKS = 1024


@pytest.fixture(scope="module")
def merged(tmp_path_factory):
    """The generated merged file and, read whole (small per rank), its events."""
    path = tmp_path_factory.mktemp("many") / "merged_trace.json"
    config = SynthConfig(ranks=RANKS, pp_stages=1, microbatches=1, steps=1, graph_kernels=0, eager_kernels=1,
                         python_noise=0, graph_streams=1, big_ints=False)
    with path.open("wb") as out:
        write_merged(config, out)
    return path, json.loads(path.read_bytes())["traceEvents"]


def _rank_of(event: dict) -> int | None:
    return event.get("args", {}).get("rank")


@pytest.mark.slow
def test_inspect_relink_split_attribute_take_1024_ranks(merged, tmp_path):
    path, events = merged
    per_rank = Counter(_rank_of(event) for event in events)
    assert sorted(rank for rank in per_rank if rank is not None) == list(range(RANKS))

    assert streamtrace.inspect(path, jobs=1)["events"] == len(events)

    summary = streamtrace.relink(path, tmp_path / "relinked.json", jobs=1)
    assert summary["ranks"] == list(range(RANKS))
    relinked = json.loads((tmp_path / "relinked.json").read_bytes())["traceEvents"]
    assert len(relinked) == len(events)
    flow_ids = Counter((event["id"], event["ph"]) for event in relinked if event.get("cat") == "ac2g")
    assert set(flow_ids.values()) == {1}  # every rank reused the same ids: relinked, each flow end is unique

    assert streamtrace.split(path, tmp_path / "all", jobs=1)["max_open_writers"] == 128  # the default
    assert streamtrace.split(path, tmp_path / "few", jobs=1, max_open=64)["max_open_writers"] == 64
    written = sorted((tmp_path / "all").iterdir())
    assert len(written) == RANKS
    for rank_file in written:
        assert rank_file.read_bytes() == (tmp_path / "few" / rank_file.name).read_bytes()
    for rank in (0, 511, 1023):
        rank_file = next(item for item in written if f"rank{rank}_" in item.name)
        kept = json.loads(gzip.decompress(rank_file.read_bytes()))["traceEvents"]  # split gzips by default
        assert Counter(_rank_of(event) for event in kept)[rank] == per_rank[rank]

    streamtrace.attribute(path, tmp_path / "kernels.csv", jobs=1)
    with (tmp_path / "kernels.csv").open(newline="") as handle:
        rows = list(csv.DictReader(handle))
    gpu_slices = [event for event in events if event.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")]
    assert len(rows) == len(gpu_slices)
    assert {row["rank"] for row in rows} == {str(rank) for rank in range(RANKS)}
