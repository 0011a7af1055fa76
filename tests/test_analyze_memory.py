"""analyze's memory model: the work rows go to disk a block at a time, the
GPU rows are swept in time buckets and joined to their launches in batches.

Two checks that do not depend on timing: with blocks, buckets and batches
far smaller than the input (every row crosses a boundary somewhere) the
tables are the same as with the defaults; and the peak RSS of analyze on a
generated rank ten times larger stays within a few MB of the smaller one's.
"""
from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import TRACES

import streamtrace
from streamtrace.commands.analyses import buckets as buckets_module
from streamtrace.commands.analyses import index as index_module
from streamtrace.commands.analyses import launches as launches_module
from streamtrace.synth import SynthConfig, write_traces

DLRM_RANK = TRACES / "dlrm_8ranks"
MEASURE = Path(__file__).parent / "badinputs" / "measure.py"
DOCS_SETTING = dict(ranks=1, pp_stages=1, python_noise=0, graph_kernels=96, eager_kernels=2)


def _same(expected: object, found: object) -> None:
    if isinstance(expected, float) and isinstance(found, float):
        assert (math.isnan(expected) and math.isnan(found)) or found == pytest.approx(expected, rel=1e-9, abs=1e-6)
    elif isinstance(expected, dict):
        assert expected.keys() == found.keys()  # type: ignore[union-attr]
        for key in expected:
            _same(expected[key], found[key])  # type: ignore[index]
    elif isinstance(expected, list):
        assert len(expected) == len(found)  # type: ignore[arg-type]
        for one, other in zip(expected, found):  # type: ignore[call-overload]
            _same(one, other)
    else:
        assert expected == found


@pytest.fixture
def small_rank(tmp_path_factory):
    out = tmp_path_factory.mktemp("pp")
    write_traces(SynthConfig(ranks=2, pp_stages=2, microbatches=2, steps=3, graph_kernels=8, graph_streams=4,
                             eager_kernels=4, python_noise=1), out, compress="none", merged=True)
    return out


@pytest.mark.parametrize("which", ["dlrm", "merged"])
def test_tiny_blocks_buckets_and_batches_give_the_same_tables(which, small_rank, monkeypatch):
    source = str(DLRM_RANK) if which == "dlrm" else str(next(small_rank.glob("merged*")))
    expected = streamtrace.analyze(source, jobs=1)["tables"]
    for module, name, size in ((index_module, "WORK_BLOCK", 101), (buckets_module, "BUCKET_ROWS", 37),
                               (launches_module, "JOIN_ROWS", 53), (index_module, "PLAIN_BLOCK", 401)):
        monkeypatch.setattr(module, name, size)
    found = streamtrace.analyze(source, jobs=1)["tables"]
    assert sum(len(rows or ()) for rows in expected.values()) > 100
    _same(expected, found)


def test_the_index_holds_one_block_of_work_rows():
    index = index_module.AnalyzeIndex()
    count = index_module.WORK_BLOCK * 2 + 123
    for n in range(count):
        index.visit({"ph": "X", "cat": "kernel", "name": "k", "pid": 0, "tid": 7, "ts": n, "dur": 1,
                     "args": {"stream": 7, "correlation": n, "rank": n % 3} if n % 2 else {"stream": 7, "correlation": n}})
    try:
        assert len(index.ts) < index_module.WORK_BLOCK
        blocks = list(index.work_blocks())
        assert [base for base, _ in blocks] == [0, index_module.WORK_BLOCK, 2 * index_module.WORK_BLOCK]
        assert [int(ts) for _, block in blocks for ts in block["ts"]] == list(range(count))
        ranked = [(int(at), int(rank)) for _, block in blocks for at, rank in zip(block["ranked"], block["ranks"])]
        assert ranked == [(n, n % 3) for n in range(1, count, 2)]
    finally:
        index.close()


def test_kernels_without_any_launch(tmp_path):
    """No CPU row links (a GPU-only trace): HTA's launch time for them is the file's first row's."""
    path = tmp_path / "gpu_only.json"
    events = [{"ph": "X", "cat": "kernel", "name": "k", "pid": 0, "tid": 7, "ts": 10 + 5 * n, "dur": 3,
               "args": {"stream": 7, "correlation": n}} for n in range(5)]
    path.write_text(json.dumps({"traceEvents": events}))
    tables = streamtrace.analyze(str(path), jobs=1)["tables"]
    assert tables["temporal_breakdown"][0]["kernel_time(us)"] == 23 and tables["temporal_breakdown"][0]["idle_time(us)"] == 8
    assert [(row["idle_category"], row["idle_time"]) for row in tables["idle_time_breakdown"]] == [("kernel_wait", 8), ("other", 0)]
    assert tables["kernel_launch_stats"] == []


def _peak_mb(trace: Path, tmp: Path) -> float:
    report = tmp / f"{trace.parent.name}.json"
    subprocess.run([sys.executable, str(MEASURE), str(report), "600", sys.executable, "-m", "streamtrace", "analyze",
                    str(trace), "-o", str(tmp / f"{trace.parent.name}-tables"), "-q", "-j", "1"], check=True,
                   stdout=subprocess.DEVNULL)
    result = json.loads(report.read_text())
    assert result["returncode"] == 0
    return result["peak_rss_kib"] / 1024


@pytest.mark.slow
def test_peak_memory_does_not_grow_with_the_rank(tmp_path):
    """Before the rows went to disk, 10x the GPU rows cost about 170 bytes each more (~35 MB here).
    With them on disk the large rank peaks 13-16 MiB above the small one
    (measured: 66 against 79.5 MiB here, 70 against 86 MiB in a loaded
    run; the small rank no longer carries an 8 MiB copy of the tail window
    that once hid part of the difference), so the bound sits between."""
    sizes = {"small": 20_000_000, "large": 200_000_000}
    traces = {}
    for label, size in sizes.items():
        write_traces(SynthConfig(target_bytes=size, **DOCS_SETTING), tmp_path / label, compress="none", merged=False)
        traces[label] = next((tmp_path / label).glob("rank0*"))
    small, large = (_peak_mb(traces[label], tmp_path) for label in sizes)
    assert large - small < 24, (small, large)


def test_crowded_time_buckets_are_cut_again(tmp_path, monkeypatch):
    """One kernel far later than the rest: the planned equal-width buckets put every other row in the first one."""
    path = tmp_path / "crowded.json"
    events = []
    for n in range(400):
        events.append({"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 1, "tid": 1, "ts": 3 * n,
                       "dur": 2, "args": {"correlation": n}})
        events.append({"ph": "X", "cat": "kernel", "name": f"k{n % 7}", "pid": 0, "tid": 7 + n % 3,
                       "ts": 1_000_000_000 if n == 399 else 5 + 4 * n - (n % 5), "dur": 3 + n % 4,
                       "args": {"stream": 7 + n % 3, "correlation": n}})
    path.write_text(json.dumps({"traceEvents": events}))
    expected = streamtrace.analyze(str(path), jobs=1)["tables"]
    monkeypatch.setattr(buckets_module, "BUCKET_ROWS", 8)
    sizes = []
    sort = buckets_module.Buckets.sorted

    def sizes_of(buckets):
        for records in sort(buckets):
            sizes.append(len(records))
            yield records

    monkeypatch.setattr(buckets_module.Buckets, "sorted", sizes_of)
    found = streamtrace.analyze(str(path), jobs=1)["tables"]
    _same(expected, found)
    assert max(sizes) <= 4 * 8  # (the cut buckets pass through both levels: sizes holds them twice)
