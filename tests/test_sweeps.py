"""The chunked analyses (algo/sweeps) against the all-rows ones (algo/analysis), on random kernels cut in random chunks."""
import math

import numpy as np
import pytest

from streamtrace.algo import analysis as hta
from streamtrace.algo import sweeps, utilization


def _kernels(seed: int, count: int = 3000, fractional: bool = False):
    rng = np.random.default_rng(seed)
    start = np.sort(rng.integers(0, count * 20, count)).astype(np.float64)
    dur = rng.integers(-1, 60, count).astype(np.float64)
    if fractional:
        start += rng.random(count).round(3)
        dur += rng.random(count).round(3)
        start = np.sort(start)
    types = rng.integers(0, 4, count).astype(np.int8)
    return start, start + dur, types


def _chunks(seed: int, count: int):
    rng = np.random.default_rng(seed + 1)
    cuts = np.sort(rng.choice(np.arange(1, count), size=min(25, count - 1), replace=False))
    bounds = [0, *cuts.tolist(), count]
    return list(zip(bounds[:-1], bounds[1:]))


@pytest.mark.parametrize("seed", range(6))
def test_timeline_in_chunks_equals_the_whole(seed):
    start, end, types = _kernels(seed, fractional=seed % 2 == 1)
    runs = hta.type_runs(start, end, types)
    lo, hi = float(start.min()), float(end.max())
    _, _, edges = utilization.fine_edges(lo, hi)
    timeline = sweeps.Timeline(sweeps.BusyBins(edges))
    for a, b in _chunks(seed, len(start)):
        timeline.feed(start[a:b], end[a:b], types[a:b])
    timeline.finish()
    expected, found = hta.temporal(runs), timeline.temporal()
    for name in ("idle", "compute", "non_compute", "kernel_time"):
        assert getattr(found, name) == pytest.approx(getattr(expected, name), abs=1e-6)
    assert timeline.overlaps == hta.type_overlaps(runs)
    assert timeline.overlap_ratio() == pytest.approx(hta.overlap_ratio(runs), nan_ok=True)
    assert timeline.busy.busy == pytest.approx(utilization.fine_busy(start, end).busy, abs=1e-6)
    assert len(timeline.pending[hta.COMPUTATION]) == 0


def test_an_empty_timeline_is_zero():
    timeline = sweeps.Timeline()
    timeline.finish()
    assert timeline.temporal() == hta.Temporal(0.0, 0.0, 0.0, 0.0)
    assert math.isnan(timeline.overlap_ratio())


@pytest.mark.parametrize("seed", range(4))
def test_name_totals_in_chunks_equal_name_stats(seed):
    rng = np.random.default_rng(seed)
    names = rng.integers(0, 30, 5000).astype(np.int32)
    dur = rng.random(5000) * 1000 + 1e6 * (names == 3)  # (a large mean: deviations still exact)
    strings = [f"k{n}" for n in range(30)]
    totals = sweeps.NameTotals()
    for a, b in _chunks(seed, len(names)):
        totals.add(names[a:b], dur[a:b])
    found = {s.name: s for s in totals.stats(strings)}
    for expected in hta.name_stats(names, dur, strings):
        got = found[expected.name]
        assert (got.count, got.longest, got.shortest) == (expected.count, expected.longest, expected.shortest)
        assert got.total == pytest.approx(expected.total, rel=1e-12)
        assert got.std == pytest.approx(expected.std, rel=1e-9)


@pytest.mark.parametrize("seed", range(4))
def test_stream_idle_in_chunks_equals_idle_breakdown(seed):
    rng = np.random.default_rng(seed)
    count = 4000
    start = np.sort(rng.integers(0, count * 30, count)).astype(np.float64)
    end = start + rng.integers(0, 80, count)
    stream = rng.choice([7, 20, 24], count)
    launch = np.where(rng.random(count) < 0.1, np.nan, start - rng.integers(0, 100, count))
    idle = sweeps.StreamIdle(30)
    for a, b in _chunks(seed, count):
        idle.feed(stream[a:b], start[a:b], end[a:b], launch[a:b])
    for s in (7, 20, 24):
        mine = stream == s
        expected = hta.idle_breakdown(start[mine], end[mine], launch[mine], 30)
        found = idle.breakdown(s)
        assert [kind for kind, _ in found] == [kind for kind, _ in expected]
        assert [t for _, t in found] == pytest.approx([t for _, t in expected])
