"""What an analysis of ``analyze`` is: a declaration (:class:`Analysis`) and what the shared reading gives it.

Each rank is read once, a chunk of rows at a time (see :mod:`.task`); every
analysis a run asks for gets a part per rank (:class:`RankPart`), fed each
chunk as a :class:`ChunkView` (HTA's rules already applied: which rows are
kernels, which the step filter keeps, each row's step and launch), then
finished with what the shared time sweep found (:class:`Swept`): its result
is small and picklable (it travels from a worker).  The coordinator gives
every rank's results to the analysis's ``combine``, which returns its tables.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Protocol

import numpy as np

from ...algo import sweeps, utilization
from .collectives import CollectiveInput
from .ranks import Chunk, Frame, PlainFacts

SWEEPS = frozenset({"hta", "exact", "bins", "steps", "idle"})
"""What the shared time sweep can feed: HTA's timeline (HTA's times and rows), the trace's own timeline of
kernels, copies and sets ("exact"), its busy time in fine bins ("bins"), one such timeline per step, each
stream's idle time (HTA's)."""


@dataclass
class RankContext:
    """What a rank's parts may read besides the chunks: its names, its framing, where to spool."""

    rank: int
    strings: list[str]  # name id -> name
    cats: list[str]  # category id -> category
    name_type: np.ndarray  # name id -> HTA's kernel type
    frame: Frame
    plain: PlainFacts
    spool_dir: str | None


@dataclass
class ChunkView:
    """A chunk of a rank's rows with what every analysis reads of it (computed once per chunk)."""

    chunk: Chunk
    is_kernel: np.ndarray  # HTA's kernels (on a stream with an id, or a sync)
    keep: np.ndarray  # what HTA's step filter keeps
    iteration: np.ndarray  # HTA's step of each row (-1: none)
    gpu: np.ndarray  # positions of the kept rows on a stream
    rows: Chunk  # those rows
    idle: np.ndarray  # of those, the kernels, copies and sets (what idle time and the trace's own timeline count)


@dataclass
class Swept:
    """What the shared sweep through a rank's kept GPU rows in start order found (None: no analysis asked)."""

    timeline: sweeps.Timeline | None = None  # HTA's
    exact: sweeps.Timeline | None = None  # the trace's own times, kernels, copies and sets
    busy: utilization.FineBusy | None = None
    step_lines: dict = field(default_factory=dict)  # step -> timeline of its kernels (the trace's own times)
    stream_idle: sweeps.StreamIdle | None = None
    rounded: bool = False  # HTA's rounding moves the times of some GPU row


class RankPart(Protocol):
    """An analysis's share of one rank's reading."""

    def feed(self, view: ChunkView) -> None: ...

    def finish(self, swept: Swept) -> object:
        """The rank's result (small, picklable); the part's files, if any, are closed."""
        ...

    def close(self) -> None:
        """Let go of what the part holds on disk (also when the reading fails)."""
        ...


@dataclass
class RankResult:
    """What one rank contributes to the tables: facts every analysis shares, and each analysis's result."""

    rank: int
    source: str
    min_ts: float  # its earliest start (HTA's times)
    step_names: set
    last_step_left_out: bool  # HTA's cut applied: its events from the last ProfilerStep's start on are not counted
    results: dict  # analysis name -> its result for this rank
    notes: list = field(default_factory=list)
    pp_stage: int | None = None  # its place in its PP group (distributedInfo)
    collectives: CollectiveInput | None = None  # its collective kernels, read in pass 1 (TraceLens's report)


@dataclass
class Run:
    """What ``combine`` reads: every rank's results (by rank) and the run's options."""

    ranks: list[RankResult]
    num_candidates: int
    utilization_bins: int

    @property
    def base(self) -> float:
        """The run's earliest start: tables' times count from it."""
        return min((r.min_ts for r in self.ranks), default=0.0)

    def results(self, name: str) -> list:
        """Each rank's result of one analysis, by rank."""
        return [r.results[name] for r in self.ranks]


class NoPart:
    """The part of an analysis that reads only what the sweep found (nothing per chunk)."""

    def __init__(self, context: RankContext, finish: Callable[[RankContext, Swept], object]) -> None:
        self.context, self._finish = context, finish

    def feed(self, view: ChunkView) -> None:
        pass

    def finish(self, swept: Swept) -> object:
        return self._finish(self.context, swept)

    def close(self) -> None:
        pass


@dataclass(frozen=True)
class Analysis:
    """One analysis, declared: its name, its tables (with their columns, in the order written), what of the
    shared sweep it reads, which other analyses' results it reads, its per-rank part and how the ranks combine."""

    name: str
    tables: dict[str, tuple[str, ...]]
    part: Callable[[RankContext], RankPart]
    combine: Callable[[Run], dict[str, list[dict]]]
    sweeps: frozenset[str] = frozenset()
    needs: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if not self.sweeps <= SWEEPS:
            raise ValueError(f"analysis {self.name}: the sweep feeds {', '.join(sorted(SWEEPS))}, "
                             f"not {', '.join(sorted(self.sweeps - SWEEPS))}")
