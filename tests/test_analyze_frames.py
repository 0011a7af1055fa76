"""analyze's tables as pandas DataFrames shaped as HTA 0.5.0 returns them (streamtrace.TraceAnalysis).

The oracle is HTA itself, run on the same ranks: every ``get_*`` method's
frame must have HTA's columns, dtypes and index, and values within the
tolerances of tests/hta_oracle.py; the notebook example of docs/analyze.md
runs as written.
"""
from __future__ import annotations

import os
import re
import runpy
import sys
from pathlib import Path

import pytest
from conftest import TRACES
from hta_oracle import TIME_ABSOLUTE, _quiet

import streamtrace
from streamtrace.commands.analyses import frames as frames_module

pd = pytest.importorskip("pandas")
DLRM = TRACES / "dlrm_8ranks"
DOCS = Path(__file__).resolve().parents[1] / "docs" / "analyze.md"


@pytest.fixture(scope="module")
def dlrm_pair():
    """HTA's TraceAnalysis and ours on the eight DLRM ranks."""
    with _quiet():
        from hta.common.trace import Trace
        from hta.common.trace_file import get_trace_files
        from hta.trace_analysis import TraceAnalysis

        hta = TraceAnalysis.__new__(TraceAnalysis)  # (as hta_oracle: parsed in this process, no pool)
        hta.t = Trace(trace_files=get_trace_files(str(DLRM)), trace_dir=str(DLRM))
        hta.t.load_traces(False, use_multiprocessing=False)
    return hta, streamtrace.TraceAnalysis(trace_dir=str(DLRM), jobs=1)


def _assert_same_frame(theirs, ours) -> None:
    assert ours.dtypes.to_dict() == theirs.dtypes.to_dict()
    assert type(ours.index) is type(theirs.index) and ours.index.equals(theirs.index)
    pd.testing.assert_frame_equal(ours, theirs, check_exact=False, atol=TIME_ABSOLUTE, rtol=1e-4)


CALLS = {
    "temporal": lambda a: a.get_temporal_breakdown(visualize=False),
    "kernels": lambda a: a.get_gpu_kernel_breakdown(visualize=False),
    "overlap": lambda a: a.get_comm_comp_overlap(visualize=False),
    "idle_default": lambda a: a.get_idle_time_breakdown(visualize=False),
    "idle_ranks": lambda a: a.get_idle_time_breakdown(ranks=[0, 3, 7], visualize=False),
    "idle_streams": lambda a: a.get_idle_time_breakdown(ranks=[1], streams=[7], visualize=False),
    "launches": lambda a: a.get_cuda_kernel_launch_stats(ranks=list(range(8)), visualize=False),
    "launches_default": lambda a: a.get_cuda_kernel_launch_stats(visualize=False),
    "steps": lambda a: a.get_profiler_steps(),
    "stragglers": lambda a: a.get_potential_stragglers(),
}


@pytest.mark.slow
@pytest.mark.parametrize("call", CALLS)
def test_methods_return_what_hta_returns(dlrm_pair, call):
    hta, ours = dlrm_pair
    with _quiet():
        theirs = CALLS[call](hta)
    mine = CALLS[call](ours)
    assert type(mine) is type(theirs)
    if isinstance(theirs, list):
        assert mine == [int(value) for value in theirs]
        return
    pairs = zip(theirs, mine) if isinstance(theirs, tuple) else (
        ((theirs[rank], mine[rank]) for rank in theirs) if isinstance(theirs, dict) else [(theirs, mine)])
    if isinstance(theirs, dict):
        assert list(mine) == list(theirs)
    for frame_theirs, frame_mine in pairs:
        if frame_theirs is None:
            assert frame_mine is None
        else:
            _assert_same_frame(frame_theirs, frame_mine)


def test_integer_columns_take_htas_smallest_type():
    """HTA's parser keeps a stream or correlation in the smallest integer type holding the rank's values and -1."""
    frame = pd.DataFrame({"stream": [7, 20], "correlation": [40772, 1 << 40]})
    frames_module._downcast(frame, ("stream", "correlation"))
    assert (frame["stream"].dtype, frame["correlation"].dtype) == (pd.Series([0], dtype="int8").dtype,
                                                                   pd.Series([0], dtype="int64").dtype)
    wide = frames_module._downcast(pd.DataFrame({"stream": [128]}), ("stream",))
    assert str(wide["stream"].dtype) == "int16"


def test_frames_of_a_generated_run_have_every_rank(tmp_path):
    """analyze_frames: one frame per table, every rank of a merged file, launch rows as the CSV has them."""
    from streamtrace.synth import SynthConfig, write_traces

    write_traces(SynthConfig(ranks=2, pp_stages=1, steps=2, seed=3), tmp_path / "gen")
    merged = next((tmp_path / "gen").glob("*merged*"))
    spool = tmp_path / "spool"
    spool.mkdir()
    tables = streamtrace.analyze_frames(str(merged), jobs=1, spool_dir=str(spool))
    assert sorted(tables["temporal_breakdown"]["rank"].tolist()) == [0, 1]
    summary = streamtrace.analyze(str(merged), str(tmp_path / "out"), jobs=1)
    launches = pd.read_csv(tmp_path / "out" / "kernel_launch_stats.csv")
    assert len(tables["kernel_launch_stats"]) == summary["kernel_launch_rows"] == len(launches) > 0
    assert tables["temporal_breakdown"]["idle_time(us)"].dtype == "float64"
    assert not os.listdir(spool)  # the CSVs went with their scratch directory


def test_options_that_change_numbers_are_refused(tmp_path):
    """An HTA option streamtrace does not compute is an error, never a table computed another way."""
    from streamtrace.synth import SynthConfig, write_traces

    write_traces(SynthConfig(ranks=1, pp_stages=1, steps=2, seed=1), tmp_path, merged=False)
    analysis = streamtrace.TraceAnalysis(trace_dir=str(next(tmp_path.glob("rank0*"))), jobs=1)
    for call in (lambda: analysis.get_gpu_kernel_breakdown(num_kernels=5),
                 lambda: analysis.get_idle_time_breakdown(consecutive_kernel_delay=100),
                 lambda: analysis.get_idle_time_breakdown(show_idle_interval_stats=True),
                 lambda: analysis.get_potential_stragglers(num_candidates=3)):
        with pytest.raises(streamtrace.TraceError):
            call()
    with pytest.raises(streamtrace.TraceError, match="writes no files"):
        streamtrace.analyze_frames(str(tmp_path), out_dir=str(tmp_path / "x"))


def test_without_pandas_one_clear_error(monkeypatch):
    monkeypatch.setitem(sys.modules, "pandas", None)
    with pytest.raises(streamtrace.TraceError, match="pip install pandas"):
        frames_module.read_tables(".")


@pytest.mark.slow
def test_docs_notebook_example_runs(tmp_path, capsys):
    """The python block under docs/analyze.md's example marker, run with the DLRM ranks as traces/."""
    text = DOCS.read_text()
    block = re.search(r"<!-- example: dlrm/ as traces/ -->\n```python\n(.*?)```", text, re.S)
    assert block, "docs/analyze.md lost its runnable notebook example"
    os.symlink(DLRM, tmp_path / "traces")
    script = tmp_path / "example.py"
    script.write_text(block.group(1))
    cwd = os.getcwd()
    os.chdir(tmp_path)
    try:
        runpy.run_path(str(script), run_name="__main__")
    finally:
        os.chdir(cwd)
    printed = capsys.readouterr().out
    assert "idle_time_pctg" in printed and "host_wait" in printed and "correlation" in printed
