"""GPU busy time is the union of the GPU's slices, exact whatever the order
the slices come in, checked against a plain union over ``json.load``."""
from __future__ import annotations

import json
import random
from array import array
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import streamtrace
from streamtrace import cli
from streamtrace.algo.busy import BusyTime, MemoryRuns, union_length
from streamtrace.io.runspill import RunSpill, SpilledRuns

GPU_CATS = {"kernel", "Kernel", "gpu_memcpy", "gpu_memset"}


def plain_union(intervals: list[tuple[float, float]]) -> float:
    """Length of the union of intervals, the obvious way."""
    total, run = 0.0, None
    for start, end in sorted(intervals):
        if run is None or start > run[1]:
            total += 0.0 if run is None else run[1] - run[0]
            run = [start, end]
        else:
            run[1] = max(run[1], end)
    return total + (0.0 if run is None else run[1] - run[0])


def slices_of(path: Path) -> dict[str, list[tuple[float, float]]]:
    """Each GPU pid's slices, from the loaded document."""
    found: dict[str, list[tuple[float, float]]] = {}
    for event in json.loads(path.read_text())["traceEvents"]:
        if event.get("cat") in GPU_CATS and event.get("ph") == "X":
            found.setdefault(str(event["pid"]), []).append((event["ts"], event["ts"] + event["dur"]))
    return found


def kernel(pid: object, tid: int, ts: float, dur: float, cat: str = "kernel") -> dict:
    return {"ph": "X", "cat": cat, "name": "k", "pid": pid, "tid": tid, "ts": ts, "dur": dur}


def write(path: Path, events: list[dict], **members: object) -> Path:
    path.write_text(json.dumps({**members, "traceEvents": events}))
    return path


def streams_written_one_after_the_other(path: Path, count: int) -> Path:
    """A GPU whose two streams overlap all along, the second stream's slices
    written after all of the first's (thousands of slices out of order, as
    in HTA's ``trace_diff/test`` trace): kernels [10i, 10i+8], copies
    [10i+4, 10i+12], so the GPU is busy without a gap."""
    events = [{"ph": "X", "cat": "cpu_op", "name": "ProfilerStep#1", "pid": 1, "tid": 1, "ts": 0, "dur": 10 * count}]
    events += [kernel(0, 7, 10 * i, 8) for i in range(count)]
    events += [kernel(0, 8, 10 * i + 4, 8, "gpu_memcpy") for i in range(count)]
    return write(path, events)


@pytest.mark.parametrize("jobs", [1, 2])
def test_busy_time_is_the_union_when_a_stream_comes_after_the_window(tmp_path, jobs):
    trace = streams_written_one_after_the_other(tmp_path / "late.json", 12_000)
    summary = streamtrace.inspect(trace, jobs=jobs)
    expected = plain_union(slices_of(trace)["0"])
    busy = summary["gpu_busy"]["0"]
    assert busy["busy_us"] == pytest.approx(expected, abs=1e-3)
    assert busy["busy_percent"] == 100.0 and busy["slices"] == 24_000
    assert summary["by_rank"][0]["gpu_busy"] == {key: busy[key] for key in ("busy_us", "span_us", "busy_percent")}


def test_busy_time_is_exact_for_slices_in_any_order_and_several_gpus(tmp_path):
    rng = random.Random(46)
    events = []
    for pid in (0, "GPU 2"):
        at = 0.0
        for _ in range(10_000):  # beyond the reorder window
            at += rng.choice((0.5, 3.0, 40.0))
            events.append(kernel(pid, rng.randint(7, 9), at, rng.choice((0.0, 1.0, 2.5, 30.0))))
    rng.shuffle(events)  # hostile: no order at all
    trace = write(tmp_path / "shuffled.json", events)
    summary = streamtrace.inspect(trace)
    for pid, slices in slices_of(trace).items():
        assert summary["gpu_busy"][pid]["busy_us"] == pytest.approx(plain_union(slices), abs=1e-3)
        assert summary["gpu_busy"][pid]["busy_percent"] <= 100


def test_a_rank_with_two_gpus_shows_their_union_not_their_sum(tmp_path, capsys):
    """One rank (``args.rank``) whose two GPU pids work at the same time."""
    events = [{**kernel(pid, 7, 10 * i, 9), "args": {"rank": 3}} for i in range(100) for pid in (0, 1)]
    trace = write(tmp_path / "two_gpus.json", events)
    entry, = streamtrace.inspect(trace)["by_rank"]
    every = [interval for slices in slices_of(trace).values() for interval in slices]
    assert entry["rank"] == 3
    assert entry["gpu_busy"]["busy_us"] == pytest.approx(plain_union(every), abs=1e-3)
    assert entry["gpu_busy"]["busy_percent"] <= 100 and entry["gpu_busy"]["gpu_pids"] == 2
    assert cli.main(["inspect", str(trace)]) == 0
    assert "rank 3: GPU busy (one of 2 GPUs at least) 900.000 us of 999.000 us (90.1%)" in capsys.readouterr().out


intervals = st.lists(st.tuples(st.integers(0, 2000), st.integers(0, 40)), max_size=400)


@settings(max_examples=80, deadline=None)
@given(intervals, st.integers(1, 16), st.integers(1, 64), st.randoms(use_true_random=False), st.booleans())
def test_busy_time_equals_the_plain_union_in_any_order(raw, window, late_limit, rng, spilled):
    """Shuffled slices, a small window and few slices set aside per segment;
    runs kept in memory or (budget 0) all on disk."""
    slices = [(float(start), float(start + length)) for start, length in raw]
    rng.shuffle(slices)
    spill = RunSpill()
    runs = (lambda budget: SpilledRuns(spill, 0)) if spilled else MemoryRuns
    busy = BusyTime(window=window, runs=runs, late_limit=late_limit)
    for start, end in slices:
        busy.add(start, end)
    assert busy.total() == pytest.approx(plain_union(slices)) and busy.slices == len(slices)
    spill.close()


@settings(max_examples=60, deadline=None)
@given(st.lists(intervals, min_size=1, max_size=4), st.integers(1, 8), st.lists(st.integers(1, 50), min_size=1))
def test_union_over_gpus_and_parts_equals_the_plain_union(gpus, window, sizes):
    """A rank's GPUs merged into one union; each GPU's slices handed over in
    parts (:meth:`BusyTime.take_part`, as pass-1 workers do), out of order."""
    joined = []
    for raw in gpus:
        slices = sorted(((float(start), float(start + length)) for start, length in raw), reverse=True)
        busy, worker = BusyTime(window=window, late_limit=8), BusyTime(window=window, late_limit=8)
        done, turn = 0, 0
        while done < len(slices):
            piece = slices[done:done + sizes[turn % len(sizes)]]
            for start, end in piece:
                worker.add(start, end)
            busy.extend(*worker.take_part())
            done, turn = done + len(piece), turn + 1
        assert busy.total() == pytest.approx(plain_union(slices)) and busy.slices == len(slices)
        joined.append(busy)
    every = [(float(start), float(start + length)) for raw in gpus for start, length in raw]
    assert union_length([segment for busy in joined for segment in busy.segments()]) == \
        pytest.approx(plain_union(every))


def test_extend_takes_what_the_parts_stand_for():
    busy = BusyTime()
    busy.extend(array("d", [0.0, 5.0]), array("d", [10.0, 20.0]), slices=7)
    assert (busy.total(), busy.slices, busy.first, busy.last) == (20.0, 7, 0.0, 20.0)


def test_spilled_runs_read_back_in_blocks(tmp_path):
    spill = RunSpill(str(tmp_path))
    store = SpilledRuns(spill, 3)
    for first in range(0, 20, 2):
        store.append(np.array([first, first + 1.0]), np.array([first + 0.5, first + 1.5]))
    read = [(float(start), float(end)) for starts, ends in store.blocks(3) for start, end in zip(starts, ends)]
    assert read == [(float(n), n + 0.5) for n in range(20)] and store.pieces
    spill.close()
    assert list(tmp_path.iterdir()) == []  # the spill file never has a name to leave behind



def test_dense_gpu_slices_are_all_counted(tmp_path):
    """Short events: a 1 MB part of the pass holds more slices than the
    reorder window, and the part's worker must hand over all of them."""
    trace = tmp_path / "dense.json"
    events = [kernel(0, 7, 10 * i, 5) for i in range(60_000)]
    trace.write_text(json.dumps({"traceEvents": events}, separators=(",", ":")))
    for jobs in (1, 2):
        busy = streamtrace.inspect(trace, jobs=jobs)["gpu_busy"]["0"]
        assert (busy["slices"], busy["busy_us"], busy["span_us"]) == (60_000, 300_000.0, 599_995.0)
