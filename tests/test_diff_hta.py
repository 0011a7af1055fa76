"""``streamtrace diff`` against HTA 0.5.0's ``TraceDiff.compare_traces`` and ``ops_diff``.

Pairs: HTA's own test pair (tests/data/hta_trace_compare, from HTA's
repository tests/data/trace_compare), two generated runs that differ in
seed, steps, kernels and naming (fractional timestamps, many streams), and
the hand-built pair of tests/test_diff.py (every iteration and device rule).
Every device type, short names or not, default and chosen ranks and
iterations: the same rows in the same order, the same numbers, the same
changes.
"""
from __future__ import annotations

from pathlib import Path

import pytest
from hta_diff_oracle import differences, hta_diff
from test_diff import edge_events, write_trace

import streamtrace
from streamtrace.synth import SynthConfig, write_traces

pytestmark = pytest.mark.slow  # HTA loads both traces into pandas

HTA_PAIR = Path(__file__).parent / "data" / "hta_trace_compare"
RUNS = {"seed1": SynthConfig(ranks=2, steps=3, seed=1),
        "seed2": SynthConfig(ranks=2, steps=4, seed=2, eager_kernels=24, hip=True)}


@pytest.fixture(scope="module")
def pairs(tmp_path_factory) -> dict[str, tuple[Path, Path]]:
    """Each pair as two directories holding only rank files (HTA reads every trace file of a directory)."""
    runs = {}
    for label, config in RUNS.items():
        run = tmp_path_factory.mktemp(label)
        write_traces(config, run)
        ranks = run / "ranks"
        ranks.mkdir()
        for rank_file in sorted(run.glob("rank*_trace.json.gz")):
            (ranks / rank_file.name).symlink_to(rank_file)
        runs[label] = ranks
    edge = tmp_path_factory.mktemp("edge")
    return {
        "hta": (HTA_PAIR / "base", HTA_PAIR / "test"),
        "generated": (runs["seed1"], runs["seed2"]),
        "edge": (write_trace(edge / "control" / "trace.json", edge_events()).parent,
                 write_trace(edge / "test" / "trace.json", edge_events(3)).parent),
    }


OPTIONS = {
    "hta": [{}, {"control_iteration": 1010, "test_iteration": 1010}, {"control_iteration": 1009, "test_iteration": 1010},
            {"control_rank": 1, "test_rank": 1}],
    "generated": [{}, {"control_rank": 1, "test_rank": 0, "control_iteration": 2, "test_iteration": 3}],
    "edge": [{}, {"control_iteration": 2, "test_iteration": 2}, {"control_iteration": 3, "test_iteration": 1}],
}
CASES = [(pair, options, device, short) for pair, choices in OPTIONS.items() for options in choices
         for device in ("cpu", "gpu", "all") for short in (False, True)]


@pytest.mark.parametrize("pair, options, device, short", CASES,
                         ids=[f"{pair}-{'-'.join(f'{k}={v}' for k, v in options.items()) or 'defaults'}-{device}"
                              f"{'-short' if short else ''}" for pair, options, device, short in CASES])
def test_diff_equals_hta(pairs, pair, options, device, short):
    control, test = pairs[pair]
    ours = streamtrace.diff(control, test, device=device, short_names=short, **options)
    rows, changes = hta_diff(control, test, device=device, short_names=short, **options)
    assert rows, "HTA found nothing to compare: the case proves nothing"
    assert not differences(ours, rows, changes)
