"""TraceLens's kernel-to-launch links (``optree.launch_links``) against the rule written as plain loops,
and the mapped columns the tables read: parked arrays keep their values, and released pages leave the
resident set."""
from __future__ import annotations

import sys

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from streamtrace.algo.optree import NO_LINK, launch_links
from streamtrace.io.scratch import is_mapped, park_arrays, release_mapped_pages


def links_by_rule(calls, call_link, call_graph, gpu_link, gpu_place, flow_starts, flow_ends, flow_end_places):
    """The rule as TraceLens states it, one event at a time: a graph launch takes every GPU event of its
    id; another call the last GPU event of its id at the place of its id's last flow end, if a flow starts
    with that id."""
    started = set(flow_starts)
    end_place = {}
    for end, place in zip(flow_ends, flow_end_places):
        end_place[end] = place  # (the last one wins)
    last_gpu = {}
    for g, (link, place) in enumerate(zip(gpu_link, gpu_place)):
        if link != NO_LINK:
            last_gpu[(link, place)] = g
    pairs = []
    for call, link, graph in zip(calls, call_link, call_graph):
        if link == NO_LINK:
            continue
        if graph:
            pairs += [(call, g) for g, of in enumerate(gpu_link) if of == link]
        elif link in started and link in end_place and (link, end_place[link]) in last_gpu:
            pairs.append((call, last_gpu[(link, end_place[link])]))
    return pairs


ids = st.sampled_from([NO_LINK, 1, 2, 3, 7, 1 << 40])


@st.composite
def launches(draw):
    calls = sorted(draw(st.sets(st.integers(0, 60), max_size=12)))
    call_link = [draw(ids) for _ in calls]
    call_graph = [draw(st.booleans()) for _ in calls]
    gpu_count = draw(st.integers(0, 16))
    gpu_link = [draw(ids) for _ in range(gpu_count)]
    gpu_place = [draw(st.integers(0, 3)) for _ in range(gpu_count)]
    flow_starts = draw(st.lists(ids.filter(lambda i: i != NO_LINK), max_size=8))
    flow_ends = draw(st.lists(ids.filter(lambda i: i != NO_LINK), max_size=8))
    flow_end_places = [draw(st.integers(0, 4)) for _ in flow_ends]  # (a place no GPU event has, too)
    return calls, call_link, call_graph, gpu_link, gpu_place, flow_starts, flow_ends, flow_end_places


@settings(max_examples=400, deadline=None)
@given(launches())
def test_launch_links_follow_tracelens_rule(case) -> None:
    calls, call_link, call_graph, gpu_link, gpu_place, flow_starts, flow_ends, flow_end_places = case
    settled = []
    run, gpu = launch_links(np.array(calls, np.int64), np.array(call_link, np.int64), np.array(call_graph, bool),
                            np.array(gpu_link, np.int64), np.array(gpu_place, np.int64),
                            np.array(flow_starts, np.int64), np.array(flow_ends, np.int64),
                            np.array(flow_end_places, np.int64), lambda: settled.append(True))
    assert list(zip(run.tolist(), gpu.tolist())) == links_by_rule(*case)
    assert run.dtype == gpu.dtype == np.int64
    assert settled  # (the caller is told when inputs were read for the last time)


class Holder:
    def __init__(self) -> None:
        self.big = np.arange(1 << 18, dtype=np.int64)  # 2 MiB: parked
        self.small = np.arange(10)  # kept as it is
        self.name = "not an array"


def test_parked_arrays_keep_their_values_read_only_in_maps(tmp_path) -> None:
    holder = Holder()
    park_arrays(holder, str(tmp_path))
    assert is_mapped(holder.big) and not is_mapped(holder.small)
    assert np.array_equal(holder.big, np.arange(1 << 18)) and holder.big.dtype == np.int64
    assert not holder.big.flags.writeable
    assert holder.name == "not an array" and list(tmp_path.iterdir()) == []  # (the files are unnamed)
    parked = holder.big
    park_arrays(holder, str(tmp_path))
    assert holder.big is parked  # (already mapped: not copied again)


def file_pages_mb() -> float:
    with open("/proc/self/status") as status:
        return next(int(line.split()[1]) for line in status if line.startswith("RssFile:")) / 1024


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self/status")
def test_released_pages_leave_the_resident_set_and_read_back_the_same(tmp_path) -> None:
    holder = Holder()
    holder.big = np.arange(16 << 17, dtype=np.int64)  # 16 MiB
    park_arrays(holder, str(tmp_path))
    total = int(holder.big.sum())  # (every page read)
    read = file_pages_mb()
    release_mapped_pages(above=1 << 40)  # (under the budget: nothing given back)
    assert file_pages_mb() > read - 4
    release_mapped_pages()
    assert file_pages_mb() < read - 12
    assert int(holder.big.sum()) == total
