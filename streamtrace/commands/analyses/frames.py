"""``analyze``'s tables as pandas DataFrames, shaped as HTA 0.5.0's own functions return them.

A notebook written against HTA (``TraceAnalysis(trace_dir=...)`` and its
``get_*`` methods) ports by changing the line that loads the trace:
:class:`TraceAnalysis` here reads the trace once, streamed, and answers the
same calls with frames of HTA's columns, index and dtypes.  HTA's dtypes
follow from its parser: it downcasts every integer column of a rank's
events to the smallest integer type that holds it (so ``stream`` and
``correlation`` come out as int8, int16 or int32 by the rank's values, with
-1 standing for "none"), and per-rank frames are concatenated without a
new index.  pandas is imported on first use; it is not a dependency.
"""
from __future__ import annotations

import os
import tempfile
from typing import TYPE_CHECKING, Any, Sequence

from ...errors import TraceError
from ..analyze import COLUMNS, analyze

if TYPE_CHECKING:
    import pandas as pd

FRAME_TABLES = ("temporal_breakdown", "kernel_type_breakdown", "kernel_breakdown", "comm_comp_overlap",
                "idle_time_breakdown", "kernel_launch_stats", "profiler_steps", "step_times", "stragglers", "utilization")
# Integer columns HTA takes from its downcast event columns (the rest are int64 or float64 as pandas builds them).
DOWNCAST = {"idle_time_breakdown": ("stream",), "kernel_launch_stats": ("correlation",)}
FLOAT_COLUMNS = {
    "temporal_breakdown": ("idle_time(us)", "compute_time(us)", "non_compute_time(us)", "kernel_time(us)",
                           "idle_time_pctg", "compute_time_pctg", "non_compute_time_pctg"),
    "kernel_type_breakdown": ("percentage",),
    "kernel_breakdown": ("sum (us)", "max (us)", "min (us)", "stddev", "mean (us)"),
    "comm_comp_overlap": ("comp_comm_overlap_pctg",),
    "idle_time_breakdown": ("idle_time", "idle_time_ratio"),
    "kernel_launch_stats": ("cpu_duration", "gpu_duration", "launch_delay"),
}
# HTA's defaults for the options that change a table; analyze computes the tables with these.
HTA_DEFAULTS = {"duration_ratio": 0.8, "num_kernels": 10, "include_memory_kernels": True, "consecutive_kernel_delay": 30}


def _pandas() -> Any:
    try:
        import pandas
    except ImportError:
        raise TraceError("DataFrames need pandas: pip install pandas (the tables themselves need no pandas: "
                         "streamtrace.analyze(..., out_dir=DIR) writes them as CSV)") from None
    return pandas


def read_tables(out_dir: str | os.PathLike) -> dict[str, pd.DataFrame]:
    """The CSV tables of ``analyze -o DIR`` as DataFrames in HTA's dtypes (one frame per table; launch
    statistics with a ``rank`` column: :meth:`TraceAnalysis.get_cuda_kernel_launch_stats` splits them)."""
    pd = _pandas()
    frames = {}
    for name in FRAME_TABLES:
        path = os.path.join(out_dir, f"{name}.csv")
        if not os.path.exists(path):
            continue
        frame = pd.read_csv(path, keep_default_na=False, na_values=[""])
        frames[name] = _hta_dtypes(name, frame)
    return frames


def _hta_dtypes(name: str, frame: pd.DataFrame) -> pd.DataFrame:
    """Floats where HTA has floats (a CSV column of whole numbers reads as integers)."""
    for column in FLOAT_COLUMNS.get(name, ()):
        frame[column] = frame[column].astype("float64")
    return frame


def _downcast(frame: pd.DataFrame, columns: Sequence[str]) -> pd.DataFrame:
    """HTA's parser downcast: the smallest integer type holding the values and -1 (its "none")."""
    pd = _pandas()
    for column in columns:
        values = pd.concat([frame[column], pd.Series([-1])], ignore_index=True)
        frame[column] = frame[column].astype(pd.to_numeric(values, downcast="integer").dtype)
    return frame


def analyze_frames(srcs: str | os.PathLike | Sequence[str | os.PathLike], **options: Any) -> dict[str, pd.DataFrame]:
    """Every table of :func:`streamtrace.analyze` as a DataFrame (table name -> frame); ``options`` are
    analyze's (``jobs``, ``ranks``, ``include_last_step`` ...).  The launch statistics can be long: they
    are read from the run's CSV, never held as Python rows."""
    for refused in ("out_dir", "overwrite", "html", "summary_file"):
        if refused in options:
            raise TraceError(f"analyze_frames writes no files: {refused} is streamtrace.analyze's")
    with tempfile.TemporaryDirectory(prefix="streamtrace-frames-", dir=options.get("spool_dir")) as scratch:
        out_dir = os.path.join(scratch, "tables")
        analyze(srcs, out_dir, **{"collective_rows": False, **options})  # (the rows are read from the CSVs)
        return read_tables(out_dir)


class TraceAnalysis:
    """HTA's ``TraceAnalysis``, answered from one streamed reading of the trace.

    ``TraceAnalysis(trace_dir="traces/")`` reads every rank once (any size:
    see :func:`streamtrace.analyze`, whose keyword options it takes); each
    ``get_*`` method returns what HTA 0.5.0's method of the same name returns,
    with its defaults.  Options HTA offers that change a table's numbers
    (``num_kernels`` and the like) are accepted at HTA's default values only.
    """

    def __init__(self, trace_files: dict[int, str] | None = None, trace_dir: str | os.PathLike = "./traces",
                 include_last_profiler_step: bool = False, **options: Any) -> None:
        sources: Any = [trace_files[rank] for rank in sorted(trace_files)] if trace_files else trace_dir
        self._num_candidates = options.get("num_candidates", 2)
        self.frames = analyze_frames(sources, include_last_step=bool(include_last_profiler_step), **options)

    def get_temporal_breakdown(self, visualize: bool = True) -> pd.DataFrame:
        return self.frames["temporal_breakdown"].copy()

    def get_gpu_kernel_breakdown(self, visualize: bool = True, duration_ratio: float = 0.8, num_kernels: int = 10,
                                 include_memory_kernels: bool = True, image_renderer: str = "") -> tuple[pd.DataFrame, ...]:
        _defaults_only(duration_ratio=duration_ratio, num_kernels=num_kernels, include_memory_kernels=include_memory_kernels)
        return self.frames["kernel_type_breakdown"].copy(), self.frames["kernel_breakdown"].copy()

    def get_comm_comp_overlap(self, visualize: bool = True) -> pd.DataFrame:
        return self.frames["comm_comp_overlap"].copy()

    def get_idle_time_breakdown(self, ranks: list[int] | None = None, streams: list[int] | None = None,
                                visualize: bool = True, visualize_pctg: bool = True, show_idle_interval_stats: bool = False,
                                consecutive_kernel_delay: int = 30) -> tuple[pd.DataFrame, None]:
        """Rank 0 by default, as HTA; the idle-interval statistics are not computed (HTA's default)."""
        _defaults_only(consecutive_kernel_delay=consecutive_kernel_delay)
        if show_idle_interval_stats:
            raise TraceError("show_idle_interval_stats is not computed by streamtrace: only the breakdown")
        pd = _pandas()
        table = self.frames["idle_time_breakdown"]
        parts = []
        for rank in ranks or [0]:
            mine = table[table["rank"] == rank].reset_index(drop=True)
            if streams:  # (HTA's rows then carry the caller's stream numbers: Python ints, int64)
                parts.append(mine[mine["stream"].isin(streams)].reset_index(drop=True))
            else:
                parts.append(_downcast(mine, DOWNCAST["idle_time_breakdown"]))
        return pd.concat(parts), None

    def get_cuda_kernel_launch_stats(self, ranks: list[int] | None = None, runtime_cutoff: int = 50,
                                     launch_delay_cutoff: int = 100, include_memory_events: bool = True,
                                     visualize: bool = True) -> dict[int, pd.DataFrame]:
        """Per rank (rank 0 by default, as HTA) the launches' CPU and GPU durations and delays; the
        cutoffs only shape HTA's plots."""
        _defaults_only(include_memory_events=include_memory_events)
        table = self.frames["kernel_launch_stats"]
        columns = [column for column in COLUMNS["kernel_launch_stats"] if column != "rank"]
        return {rank: _downcast(table.loc[table["rank"] == rank, columns].reset_index(drop=True),
                                DOWNCAST["kernel_launch_stats"])
                for rank in ranks or [0]}

    def get_profiler_steps(self) -> list[int]:
        return [int(step) for step in self.frames["profiler_steps"]["step"]]

    def get_potential_stragglers(self, profiler_steps: list[int] | None = None, num_candidates: int = 2,
                                 visualize: bool = False) -> list[int]:
        """HTA's late-start candidates, over every profiler step (HTA's default)."""
        if profiler_steps is not None:
            raise TraceError("profiler_steps: streamtrace finds stragglers over every profiler step (HTA's default)")
        if num_candidates != self._num_candidates:
            raise TraceError(f"num_candidates={num_candidates}: give it to TraceAnalysis(..., num_candidates=N), "
                             "which computes the candidates")
        table = self.frames["stragglers"]
        return sorted({int(rank) for rank in table.loc[table["potential_straggler"].astype(bool), "rank"]})


def _defaults_only(**given: Any) -> None:
    for name, value in given.items():
        if value != HTA_DEFAULTS.get(name, True):
            raise TraceError(f"{name}={value!r}: streamtrace computes this table with HTA's default "
                             f"({name}={HTA_DEFAULTS.get(name, True)!r})")


__all__ = ["TraceAnalysis", "analyze_frames", "read_tables"]
