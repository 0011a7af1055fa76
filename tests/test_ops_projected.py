"""analyze --ops in pass 1: a chunk's projected events give the columns their dicts give
(:mod:`streamtrace.commands.analyses.opsprojected` against ``OpsCollector.visit``), odd fields
included; the chunks a projection could read differently go the dict way."""
from __future__ import annotations

import json
import random

import pytest

from streamtrace.commands.analyses.ops import OpsCollector
from streamtrace.commands.analyses.opsprojected import accepts_chunk, collect_chunk
from streamtrace.io.projection import projected_events

LAUNCH = {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 1, "tid": 2, "ts": 5, "dur": 2,
          "args": {"correlation": 7, "External id": 3}}
EVENTS = [
    {"ph": "M", "name": "process_name", "pid": 1, "tid": 0, "args": {"name": "python"}},
    {"ph": "M", "name": "process_labels", "pid": 1, "tid": 0, "args": {"labels": ["a", 1]}},
    {"ph": "M", "name": "thread_name", "pid": "gpu", "tid": 7, "args": {"name": "stream 7"}},
    {"ph": "X", "cat": "python_func", "name": "f", "pid": 1, "tid": 2, "ts": 0, "dur": 50},
    {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 1, "tid": 2, "ts": 1, "dur": 20.5,
     "args": {"Input Dims": [[2, 3], [3, 4]], "Input type": ["float", "float"], "Input Strides": [[3, 1], [4, 1]],
              "Concrete Inputs": ["", ""], "Output type": ["float"], "Sequence number": 9, "External id": 3}},
    {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 1, "tid": 2, "ts": 30, "dur": 2,
     "args": {"Input Dims": [[2, 3], [3, 4]], "Input type": ["float", "float"], "Input Strides": [[3, 1], [4, 1]],
              "Concrete Inputs": ["", ""], "Output type": ["float"], "Sequence number": 1 << 63}},
    {"ph": "X", "cat": "cpu_op", "name": "aten::add", "pid": 1, "tid": 2, "ts": 33, "dur": 1, "args": None},
    {"ph": "X", "cat": "cpu_op", "name": "aten::odd", "pid": 1, "tid": 2, "ts": "34", "dur": 1},
    {"ph": "X", "cat": "cpu_op", "name": "aten::odd", "pid": 1, "tid": 2, "ts": 35, "dur": True},
    LAUNCH,
    {"ph": "X", "cat": "cuda_driver", "name": "cuLaunchKernel", "pid": 1, "tid": 2, "ts": 8, "dur": 1,
     "args": {"correlation": "c8", "kernel": "k2"}},
    {"ph": "X", "cat": "cuda_runtime", "name": "cudaGraphLaunch", "pid": 1, "tid": 2, "ts": 9, "dur": 1,
     "args": {"correlation": 11}},
    {"ph": "s", "cat": "ac2g", "name": "ac2g", "id": 7, "pid": 1, "tid": 2, "ts": 5},
    {"ph": "f", "cat": "ac2g", "name": "ac2g", "id": "7", "pid": "gpu", "tid": 7, "ts": 100, "bp": "e"},
    {"ph": "t", "cat": "ac2g", "name": "ac2g", "id": 7, "pid": 1, "tid": 2, "ts": 5},
    {"ph": "X", "cat": "kernel", "name": "k1", "pid": "gpu", "tid": 7, "ts": 100, "dur": 5,
     "args": {"correlation": 7, "stream": 7, "rank": 3}},
    {"ph": "X", "cat": "kernel", "name": "k1", "pid": "gpu", "tid": 7, "ts": 106.5, "dur": 5,
     "args": {"correlation": 8, "original_stream": 9, "stream": 2, "rank": 3}},
    {"ph": "X", "cat": "kernel", "name": "ncclDevKernel_AllReduce_Sum_f32_RING_LL", "pid": "gpu", "tid": 7,
     "ts": 120, "dur": 9, "args": {"correlation": 9, "stream": "s", "Collective name": "allreduce",
                                   "In msg nelems": 4, "Process Group Name": "0", "Group size": 2}},
    {"ph": "X", "cat": "gpu_memcpy", "name": "Memcpy HtoD", "pid": "gpu", "tid": 8, "ts": 130, "dur": 1,
     "args": {"correlation": 10}},
    {"ph": "X", "cat": "gpu_memset", "name": "Memset", "pid": 2.5, "tid": None, "ts": 131, "dur": 1, "args": {}},
    {"ph": "X", "cat": ["kernel"], "name": "odd", "pid": "gpu", "tid": 7, "ts": 200, "dur": 5, "args": {}},
    {"ph": "X", "cat": "user_annotation", "name": "step", "pid": 1, "tid": 2, "ts": 0, "dur": 300},
    {"ph": "X", "cat": "gpu_user_annotation", "name": "step", "pid": "gpu", "tid": 7, "ts": 99, "dur": 40.5},
    {"ph": "X", "cat": "user_annotation", "pid": 1, "tid": 2, "ts": 0, "dur": 3},  # (no name: "None", as TraceLens)
    {"ph": "X", "cat": "user_annotation", "name": "untimed", "pid": 1, "tid": 2, "ts": 2},
    {"ph": "X", "cat": "user_annotation", "name": ["odd"], "pid": 1, "tid": 2, "ts": 4, "dur": 1},  # (named by its text)
]


def _view(collector: OpsCollector) -> dict:
    """What the tables read of a collector, its numbers (of names, places, signatures, odd ids) resolved
    to what they stand for, the rest as bytes (NaN equals NaN there)."""
    runs = {name: column.tolist() for name, column in collector.runs.arrays.items()}
    pids = list(collector.pid_keys) + [None]
    runs["pid"] = [pids[number] for number in runs["pid"]]
    kernels = collector.collectives
    collectives = {name: getattr(kernels, name).tobytes() for name in ("ts", "dur", "slot", "rank", "seq", "peer")}
    collectives["meta"] = [list(kernels.metas)[at] for at in kernels.meta]
    odd = {number: value for value, number in collector._other_links.items()}
    facts = collector.facts()
    names, signatures = facts.names, facts.signatures
    view: dict = {"runs": runs, "collectives": collectives, "metadata": facts.metadata, "events": facts.events}
    for field, values in vars(facts).items():
        if field.startswith(("h_", "g_", "link_", "a_")):
            view[field] = values.tobytes()
    view["h_name"] = [names[at] for at in facts.h_name]
    view["g_name"] = [names[at] for at in facts.g_name]
    view["h_kernel"] = [names[at] if at >= 0 else None for at in facts.h_kernel]
    view["a_name"] = [names[at] for at in facts.a_name]
    view["h_thread"] = [facts.threads[at] for at in facts.h_thread]
    view["h_sig"] = [(signatures[at], facts.signature_values[at]) for at in facts.h_sig]
    view["h_seq"] = [odd.get(at, at) for at in facts.h_seq.tolist()]
    return view


def _chunk(events: list[dict]) -> bytes:
    return ",".join(json.dumps(event, indent=1) for event in events).encode()


def _both(events: list[dict]) -> tuple[dict, dict]:
    by_dicts, projected = OpsCollector(), OpsCollector()
    for event in events:
        by_dicts.visit(event)
    decoded = projected_events(_chunk(events), ops=True)
    assert decoded is not None and accepts_chunk(decoded)
    half = len(decoded) // 2  # (two chunks: the runs and names carry over)
    collect_chunk(projected, decoded[:half])
    collect_chunk(projected, decoded[half:])
    return _view(by_dicts), _view(projected)


def test_projected_events_give_the_columns_their_dicts_give() -> None:
    by_dicts, projected = _both(EVENTS)
    assert len(by_dicts["h_name"]) == 6 and len(by_dicts["g_name"]) == 5
    assert by_dicts["a_name"] == ["step", "None", "['odd']", "step"]  # (by start, ties in event order)
    assert projected == by_dicts


def test_runs_of_alternating_pids_and_ranks_are_counted_alike() -> None:
    events = [{**event, "pid": pid} for event in EVENTS for pid in (1, 2)]
    by_dicts, projected = _both(events)
    assert len(by_dicts["runs"]["count"]) > 30
    assert projected == by_dicts


@pytest.mark.parametrize("odd", [
    {"ph": "X", "cat": "cpu_op", "pid": 1, "tid": 2, "ts": 1, "dur": 1},  # no name: the dict way names it ""
    {"ph": "X", "cat": "kernel", "name": None, "pid": 1, "tid": 2, "ts": 1, "dur": 1},
    {**LAUNCH, "args": {"External id": 3}},  # a launch without a correlation: absent and null project alike
])
def test_a_chunk_the_projection_could_read_otherwise_goes_the_dict_way(odd: dict) -> None:
    decoded = projected_events(_chunk([EVENTS[4], odd]), ops=True)
    assert decoded is not None
    assert not accepts_chunk(decoded)


def test_chunks_of_one_kind_of_value_give_the_columns_their_dicts_give() -> None:
    """Each event its own chunk, and runs of one event repeated: the columns whose values are then all of
    one type (integer or bool durations, integer streams, original streams, no kernel member, driver calls
    only) take their short ways, and give what the dicts give."""
    for event in EVENTS:
        by_dicts, projected = _both([event, {**event, "ts": 400}, event])
        assert projected == by_dicts, event
    by_dicts, projected = _both([{**event, "pid": pid} for event in EVENTS for pid in (1 << 63, 1)])  # (beyond int64)
    assert projected == by_dicts


def test_ends_beyond_two_to_the_53_are_summed_as_the_dicts_sum_them() -> None:
    """An end is ``ts + dur`` as the dict way sums it (integers exactly, then one rounding to a float):
    beyond 2**53, where float sums round twice, for host, GPU and annotation events alike, in chunks of
    integer times and of mixed integer and fractional ones."""
    big = (1 << 53) + 1
    events = [{**EVENTS[5], "ts": big, "dur": 1}, {**LAUNCH, "ts": big + 2, "dur": 3},
              {**EVENTS[15], "ts": big, "dur": 1}, {**EVENTS[22], "ts": big, "dur": 1}]
    for chunk in (events, [*events, {**EVENTS[16], "ts": 2.5, "dur": 1}]):
        by_dicts, projected = _both(chunk)
        assert projected == by_dicts
        assert float(big + 1) != float(big) + 1.0  # (the case the test is about)


ODD_EVENTS = [
    {"ph": "X", "cat": "kernel", "name": "k9", "pid": 3, "tid": 7, "ts": (1 << 53) + 3, "dur": 2,
     "args": {"correlation": 1 << 62, "stream": 7}},
    {"ph": "X", "cat": "cpu_op", "name": "aten::x", "pid": 1, "tid": 2, "ts": 1.25, "dur": 2,
     "args": {"External id": "e", "Sequence number": -5}},
    {"ph": "f", "cat": "ac2g", "name": "ac2g", "id": 1 << 63, "pid": 0, "tid": 7, "ts": 5, "bp": "e"},
    {"ph": "s", "cat": "ac2g", "name": "ac2g", "id": [1], "pid": "p", "tid": 2, "ts": 5},
    {"ph": "X", "cat": "gpu_user_annotation", "name": 5, "pid": 0, "tid": 7, "ts": 9, "dur": 1.5},
    {"ph": "X", "cat": "cuda_driver", "name": "cuLaunchKernel", "pid": 1, "tid": 2, "ts": 8, "dur": 1,
     "args": {"correlation": 9, "rank": 2}},
    {"ph": "X", "cat": "Kernel", "name": "K", "pid": 5, "tid": 1, "ts": 8, "dur": 1, "args": {"rank": 1}},
    {"ph": "X", "cat": 7, "name": "odd", "pid": 5, "tid": 1, "ts": 8, "dur": 1},
]


def test_random_mixtures_of_odd_events_give_the_columns_their_dicts_give() -> None:
    """Chunks drawn at random from the events above (pids and starts changed now and then): runs that
    change within a chunk and carry over, ids beyond 63 bits, names and categories of other types,
    integer and fractional times mixed, ends beyond 2**53."""
    rng = random.Random(7)
    pool = EVENTS + ODD_EVENTS
    for _ in range(150):
        events = [dict(rng.choice(pool)) for _ in range(rng.randint(1, 30))]
        for event in events:
            if rng.random() < 0.3:
                event["pid"] = rng.choice([0, 1, 2, "gpu", 1 << 40])
            if rng.random() < 0.1 and "ts" in event:
                event["ts"] = rng.choice([0, 3.5, 1 << 54, 7])
        by_dicts, projected = _both(events)
        assert projected == by_dicts, events


INDEX_EVENTS = [  # (with EVENTS and ODD_EVENTS: what analyze's index reads differently)
    {"ph": "X", "name": "no category", "pid": 1, "tid": 2, "ts": 3, "dur": 1, "args": {"correlation": 4}},
    {"ph": "X", "cat": "Trace", "name": "PyTorch Profiler (0)", "pid": "Spans", "tid": 1, "ts": 0, "dur": 100},
    {"ph": "X", "cat": "cpu_op", "name": "record_param_comms", "pid": 1, "tid": 2, "ts": 4, "dur": 1,
     "args": {"Process Group Name": "0", "Global rank start": 0, "Global rank stride": 1, "Group size": 2}},
    {"ph": "X", "cat": "kernel", "name": "ncclDevKernel_SendRecv", "pid": "gpu", "tid": 7, "ts": 3,
     "args": {"correlation": 3, "stream": 7}},  # (no dur: untimed)
    {"ph": "X", "cat": "kernel", "name": "ncclDevKernel_AllReduce_Sum_f32_RING_LL", "pid": "gpu", "tid": 7, "ts": 50,
     "dur": 3, "args": {"correlation": 12, "stream": 7, "Collective name": "allreduce", "In msg nelems": 4,
                        "Process Group Name": "0", "Group size": 2, "rank": 1}},
    {"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#3", "pid": 1, "tid": 2, "ts": 0, "dur": 90},
    {"ph": "X", "cat": "python_function", "name": "f", "pid": 1, "tid": 2, "ts": 1, "dur": 5},
]


def test_analyze_indexes_a_chunk_alike_with_ops_and_without() -> None:
    """With ops, analyze's index takes the kernels, CPU ops, pids and the events it leaves out (no category,
    "Trace", categories that are no strings) from what the ops read of a chunk: its part is the one it gives
    without ops, in random mixtures of chunks (timed and untimed events, runs carried over)."""
    from streamtrace.commands.analyses.index import AnalyzeIndex

    rng = random.Random(11)
    pool = EVENTS + ODD_EVENTS + INDEX_EVENTS
    for _ in range(120):
        plain, with_ops = AnalyzeIndex(), AnalyzeIndex(ops=True)
        plain.partial = with_ops.partial = True
        for _ in range(2):
            events = [dict(rng.choice(pool)) for _ in range(rng.randint(1, 30))]
            for event in events:
                if rng.random() < 0.2:
                    event["pid"] = rng.choice([0, 1, "gpu", 1 << 40])
            text = _chunk(events)
            assert plain.visit_chunk(text) == with_ops.visit_chunk(text), events
            ours, theirs = plain.take_part(), with_ops.take_part()
            assert ours.pop("ops") is None and theirs.pop("ops") is not None
            assert ours == theirs, events
