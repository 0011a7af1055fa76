"""``streamtrace diff`` against HTA 0.5.0's ``TraceDiff.compare_traces`` and ``ops_diff``.

Pairs: HTA's own test pair (tests/data/hta_trace_compare, from HTA's
repository tests/data/trace_compare), two generated runs that differ in
seed, steps, kernels and naming (fractional timestamps, many streams), the
hand-built pair of tests/test_diff.py (every iteration and device rule),
and real traces: two ranks of one run (sampled_rank-0/1, DLRM's ranks 0
and 5) and two iterations of one trace (nccl_rank0, mi250_minitoy).
Every device type, short names or not, default and chosen ranks and
iterations: the same rows in the same order, the same numbers, the same
changes.
"""
from __future__ import annotations

from pathlib import Path

import pytest
from conftest import TRACES
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
    runs = {label: tmp_path_factory.mktemp(label) for label in RUNS}
    for label, run in runs.items():
        write_traces(RUNS[label], run, merged=False)
        (run / "truth.json").unlink()  # (a .json file HTA would read as a trace)
    edge = tmp_path_factory.mktemp("edge")
    singles = {}
    for name in ("sampled_rank-0", "sampled_rank-1", "nccl_rank0", "mi250_minitoy"):
        singles[name] = tmp_path_factory.mktemp(name)
        (singles[name] / f"{name}.json.gz").symlink_to(TRACES / f"{name}.json.gz")
    return {
        "sampled": (singles["sampled_rank-0"], singles["sampled_rank-1"]),
        "nccl": (singles["nccl_rank0"], singles["nccl_rank0"]),
        "mi250": (singles["mi250_minitoy"], singles["mi250_minitoy"]),
        "dlrm": (TRACES / "dlrm_8ranks", TRACES / "dlrm_8ranks"),
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
    "sampled": [{}, {"control_iteration": 552, "test_iteration": 551}],
    "nccl": [{"control_iteration": 4, "test_iteration": 5}],
    "mi250": [{"control_iteration": 1, "test_iteration": 2}],
    "dlrm": [{"test_rank": 5}],
}
NOTHING = {("mi250", "gpu")}  # mi250_minitoy's kernels run on stream 0, which HTA gives no iteration: nothing to compare
CASES = [(pair, options, device, short) for pair, choices in OPTIONS.items() for options in choices
         for device in ("cpu", "gpu", "all") for short in (False, True)]


@pytest.mark.parametrize("pair, options, device, short", CASES,
                         ids=[f"{pair}-{'-'.join(f'{k}={v}' for k, v in options.items()) or 'defaults'}-{device}"
                              f"{'-short' if short else ''}" for pair, options, device, short in CASES])
def test_diff_equals_hta(pairs, pair, options, device, short):
    control, test = pairs[pair]
    ours = streamtrace.diff(control, test, device=device, short_names=short, **options)
    rows, changes = hta_diff(control, test, device=device, short_names=short, **options)
    assert bool(rows) != ((pair, device) in NOTHING), "HTA's rows are not what the case expects"
    assert not differences(ours, rows, changes)
