"""One input's ranks and HTA's framing of each: which rows are whose (relink's rules), read a block at a
time as :class:`Chunk`; HTA's filter, step spans and launches per rank (:class:`Frame`)."""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Iterator

import numpy as np

from ...algo import analysis as hta
from ...algo.rankmap import pair_by_time, resolve_ranks
from ...algo.ranks import rank_from_file_name
from ...io.jsonscan import member_value
from ...kineto import GPU_CATEGORIES, RUNTIME_CATEGORIES
from ...resources import trim_heap
from .index import NO_ID, RANK_EVIDENCE_CATEGORIES, AnalyzeIndex

SYNC_NAMES = ("Event Sync", "Context Sync")
SAMPLES_PER_GPU_PID = 4096  # as relink: enough (id, ts) pairs to pair a GPU pid with its launching pid
ID_LIMIT = 1 << 62


@dataclass
class Chunk:
    """Some of one rank's work rows (event order), HTA's times applied; ``pos``: their positions among the
    file's work rows; ``exact_ts``, ``exact_dur``: their times as the trace states them (before HTA's rounding)."""

    pos: np.ndarray
    ts: np.ndarray
    dur: np.ndarray
    stream: np.ndarray
    corr: np.ndarray
    name: np.ndarray
    cat: np.ndarray
    exact_ts: np.ndarray
    exact_dur: np.ndarray

    def __getitem__(self, rows: np.ndarray) -> Chunk:
        return Chunk(*(getattr(self, column)[rows] for column in _CHUNK_COLUMNS))


_CHUNK_COLUMNS = ("pos", "ts", "dur", "stream", "corr", "name", "cat", "exact_ts", "exact_dur")


@dataclass
class RankInput:
    """One rank's work rows, read a block at a time from the index (they may be on disk)."""

    rank: int
    index: AnalyzeIndex
    slot_rank: np.ndarray  # pid slot -> rank (-1 at the end: no slot)

    def chunks(self) -> Iterator[Chunk]:
        for base, block in self.index.work_blocks():
            mine = np.flatnonzero(_block_ranks(block, base, self.slot_rank) == self.rank)
            if not len(mine):
                continue
            exact_ts, exact_dur = block["ts"][mine], block["dur"][mine]
            ts, dur = hta.hta_times(exact_ts, exact_dur, self.index.fractional[0])
            yield Chunk(mine + base, ts, dur, *(block[column][mine] for column in ("stream", "corr", "name", "cat")),
                        exact_ts, exact_dur)
            trim_heap()  # (a chunk's scratch is freed between the few arrays kept from it: give its pages back)


def _block_ranks(block: dict, base: int, slot_rank: np.ndarray) -> np.ndarray:
    """Each row's rank: its own args.rank, else its pid's."""
    ranks = slot_rank[block["slot"]]
    if len(block["ranked"]):
        ranks[block["ranked"] - base] = block["ranks"]
    return ranks


def ranks_of_slots(path: str, index: AnalyzeIndex, members: list) -> list[int]:
    """pid slot -> rank (-1: none): relink's rules (args.rank, process_name, inference by launch
    times); a file where no pid states a rank is one rank's (distributedInfo.rank, the file name, else 0)."""
    info = member_value(members, "distributedInfo")
    file_rank = info.get("rank") if isinstance(info, dict) else None
    for facts, flag in zip(index.pids, index.unranked):
        facts.unranked = bool(flag)
    _first_work(index)
    resolution = resolve_ranks(index.pids, pairings=lambda: _pairings(index), file_rank=file_rank)
    ranks = resolution.ranks
    known = {rank for rank in ranks if rank >= 0}
    for _, block in index.work_blocks():
        known.update(np.unique(block["ranks"]).tolist())
    if len(known) > 1:
        return ranks
    if known:
        rank = known.pop()
    elif type(file_rank) is int:
        rank = file_rank
    else:
        named = rank_from_file_name(path)
        rank = named if named is not None else 0
    return [rank] * len(ranks)


def _category_ids(index: AnalyzeIndex, categories: frozenset) -> list[int]:
    return [at for cat, at in index.cats.items() if cat in categories]


def _first_work(index: AnalyzeIndex) -> None:
    """Each pid's first launch or GPU event (its position among the work rows: the same order)."""
    ids = _category_ids(index, RANK_EVIDENCE_CATEGORIES)
    first: dict[int, int] = {}
    for base, block in index.work_blocks():
        rows = np.flatnonzero(np.isin(block["cat"], ids))
        found, at = np.unique(block["slot"][rows], return_index=True)
        for slot, position in zip(found.tolist(), (rows[at] + base).tolist()):
            first.setdefault(slot, position)
    for slot, position in first.items():
        index.pids[slot].first_work = position


def _pairings(index: AnalyzeIndex) -> dict:
    """Relink's inference input: per GPU pid its first sampled (id, ts), the launches of those ids."""
    gpu_ids, launch_ids = _category_ids(index, GPU_CATEGORIES), _category_ids(index, RUNTIME_CATEGORIES)
    samples: dict[int, list[tuple[int, float]]] = {}
    for _, block in index.work_blocks():
        corr = block["corr"]
        gpu = np.flatnonzero(np.isin(block["cat"], gpu_ids) & (corr >= 0) & (corr < ID_LIMIT))
        slots = block["slot"][gpu]
        for slot in np.unique(slots).tolist():
            have = samples.setdefault(slot, [])
            mine = gpu[slots == slot][:SAMPLES_PER_GPU_PID - len(have)]
            have.extend(zip(corr[mine].tolist(), block["ts"][mine].tolist()))
    wanted = np.array(sorted({c for pairs in samples.values() for c, _ in pairs}), dtype=np.int64)
    launches_by_id: dict[int, list[tuple[int, float]]] = {}
    for _, block in index.work_blocks():
        corr = block["corr"]
        launches = np.flatnonzero(np.isin(block["cat"], launch_ids) & (corr >= 0) & (corr < ID_LIMIT) & np.isin(corr, wanted))
        for slot, c, ts in zip(block["slot"][launches].tolist(), corr[launches].tolist(), block["ts"][launches].tolist()):
            launches_by_id.setdefault(c, []).append((slot, ts))
    return pair_by_time(samples, launches_by_id)


def first_row_times(index: AnalyzeIndex, ranks: list[int]) -> dict[int, float]:
    """Per rank, the HTA time of the row HTA's index 0 stands for (a kernel without a launch is joined to
    it).  A rank's own file: its first event, when HTA keeps it as a row.  A file of several ranks: each
    rank's first row, the first event of its own file had it been one."""
    if len({rank for rank in ranks if rank >= 0}) > 1:
        firsts: dict[int, tuple[float, float]] = {}
        for slot, ts, dur in index.first_rows:
            if ranks[slot] >= 0:
                firsts.setdefault(ranks[slot], (ts, dur))
        return {rank: _hta_start(index, ts, dur) for rank, (ts, dur) in firsts.items()}
    event = index.first_event[0]
    if event.__class__ is not dict or event.get("ph") == "M":
        return {}
    ts, dur, cat = event.get("ts"), event.get("dur"), event.get("cat")
    if ts.__class__ not in (int, float) or dur.__class__ not in (int, float) or cat.__class__ is not str or cat == "Trace":
        return {}
    slot = index.pid_slots.get(event.get("pid")) if event.get("pid").__class__ in (int, str) else None
    return {} if slot is None or ranks[slot] < 0 else {ranks[slot]: _hta_start(index, ts, dur)}


def _hta_start(index: AnalyzeIndex, ts: float, dur: float) -> float:
    start, _ = hta.hta_times(np.array([ts], dtype=np.float64), np.array([dur], dtype=np.float64), index.fractional[0])
    return float(start[0])


def split_by_rank(index: AnalyzeIndex, ranks: list[int]) -> tuple[list[tuple[int, RankInput]], int]:
    """Each rank's work rows (an event's own args.rank, else its pid's), and how many rows no rank has."""
    slot_rank = np.array(ranks + [-1], dtype=np.int64)
    found: set[int] = set()
    unplaced = 0
    for base, block in index.work_blocks():
        row_ranks = _block_ranks(block, base, slot_rank)
        found.update(np.unique(row_ranks[row_ranks >= 0]).tolist())
        unplaced += int((row_ranks < 0).sum())
    return [(rank, RankInput(rank, index, slot_rank)) for rank in sorted(found)], unplaced


@dataclass
class Frame:
    """One rank's reading as HTA frames it: kernels, step spans, what its filter keeps, its launches."""

    sync_ids: np.ndarray
    step_ids: dict  # name id -> step number (None: a ProfilerStep name without one)
    step_of: hta.StepOf  # HTA's iteration of a time: from every ProfilerStep row, in event order
    kept_ids: np.ndarray | None  # sorted ids of the kept CPU rows (None: no filter)
    cutoff: float | None  # rows kept start before it (at or before with inclusive)
    inclusive: bool
    filtered: bool  # (the run's decision: several ProfilerStep names)
    notes: list
    linked: tuple  # (id, start, stream) of the CPU rows with an id (not kernels): the launches a kernel may link to
    gpu_range: tuple[float, float, int]  # first start, last start, count of the rows on a stream

    def is_kernel(self, chunk: Chunk) -> np.ndarray:
        return ((chunk.stream >= 0) & (chunk.corr >= 0)) | np.isin(chunk.name, self.sync_ids)

    def keep(self, chunk: Chunk, is_kernel: np.ndarray) -> np.ndarray:
        """HTA's filter: CPU rows by time, kernels by the ids of the kept CPU rows."""
        if self.kept_ids is None:
            return np.ones(len(chunk.ts), dtype=bool)
        return np.where(is_kernel, np.isin(chunk.corr, self.kept_ids), kept_times(self, chunk.ts))


def frame_of(data: RankInput, strings: list[str], filtered: bool, include_last_step: bool) -> Frame:
    """HTA's filter: with several ProfilerStep names in the run, CPU rows that
    start before the latest ProfilerStep row (GPU copies included) starts
    (with the last step: ends), and the kernels whose correlation such a row has."""
    sync_ids = np.array([at for at, name in enumerate(strings) if name in SYNC_NAMES], dtype=np.int32)
    step_ids = {at: hta.step_number(name) for at, name in enumerate(strings) if name.startswith("ProfilerStep")}
    numbered = [at for at, n in step_ids.items() if n is not None]
    any_step = [at for at, name in enumerate(strings) if "ProfilerStep" in name]
    spans: list[tuple[np.ndarray, ...]] = []  # (start, end, name) of the ProfilerStep rows
    linked: list[tuple[np.ndarray, ...]] = []
    lo, hi, count = math.inf, -math.inf, 0
    cutoff = -math.inf  # the latest start (with the last step: end) of a CPU step row
    no_steps = hta.StepOf(np.empty(0), np.empty(0), np.empty(0, np.int64))
    probe = Frame(sync_ids, step_ids, no_steps, None, None, include_last_step, filtered, [], (), (0.0, 0.0, 0))
    for chunk in data.chunks():
        is_kernel = probe.is_kernel(chunk)
        rows = np.flatnonzero(np.isin(chunk.name, numbered))
        spans.append((chunk.ts[rows], chunk.ts[rows] + chunk.dur[rows], chunk.name[rows]))
        rows = np.flatnonzero(np.isin(chunk.name, any_step) & ~is_kernel)
        if len(rows):
            cutoff = max(cutoff, float((chunk.ts[rows] + chunk.dur[rows] if include_last_step else chunk.ts[rows]).max()))
        rows = np.flatnonzero(~is_kernel & (chunk.corr != NO_ID))
        linked.append((chunk.corr[rows], chunk.ts[rows], chunk.stream[rows]))
        on_stream = chunk.ts[chunk.stream != NO_ID]
        if len(on_stream):
            lo, hi, count = min(lo, float(on_stream.min())), max(hi, float(on_stream.max())), count + len(on_stream)
    starts, ends, names = joined_columns(spans, (np.float64, np.float64, np.int32))
    links = joined_columns(linked, (np.int64, np.float64, np.int64))
    frame = dataclasses.replace(probe, step_of=hta.StepOf(starts, ends, np.array([step_ids[at] for at in names.tolist()],
                                                                                  dtype=np.int64)),
                                linked=links, gpu_range=(lo, hi, count))
    if filtered:
        if cutoff > -math.inf:
            frame.cutoff = cutoff
            frame.kept_ids = np.unique(links[0][kept_times(frame, links[1])])
        else:
            frame.notes.append(f"rank {data.rank}: no ProfilerStep while other ranks have some: all its events kept")
    return frame


def joined_columns(parts: list[tuple[np.ndarray, ...]], dtypes: tuple) -> tuple[np.ndarray, ...]:
    """Columns collected chunk by chunk, joined."""
    return tuple(np.concatenate([part[n] for part in parts]) if parts else np.empty(0, dtype) for n, dtype in enumerate(dtypes))


def kept_times(frame: Frame, ts: np.ndarray) -> np.ndarray:
    """Which CPU rows of these start times the filter keeps."""
    if frame.cutoff is None:
        return np.ones(len(ts), dtype=bool)
    return ts <= frame.cutoff if frame.inclusive else ts < frame.cutoff


@dataclass
class PlainFacts:
    """What a rank's plain rows contribute: the earliest start, per step the first start and last end."""

    min_ts: float = math.inf
    extents: dict = field(default_factory=dict)
    unplaced: int = 0  # rows of a pid no rule places in a rank (or of a rank without GPU work or steps)


def plain_facts(index: AnalyzeIndex, ranks: list[int], frames: dict[int, Frame]) -> dict[int, PlainFacts]:
    """One pass over the plain rows (spilled in blocks) for every rank."""
    slot_rank = np.array(ranks + [-1], dtype=np.int64)
    facts: dict[int, PlainFacts] = {}
    for ts, dur, slot in index.plain_blocks():
        ts, dur = hta.hta_times(ts, dur, index.fractional[0])
        row_rank = slot_rank[slot]
        for rank in np.unique(row_rank).tolist():
            frame = frames.get(rank)
            if frame is None:
                facts.setdefault(rank, PlainFacts()).unplaced += int((row_rank == rank).sum())
                continue
            mine = row_rank == rank
            start, end = ts[mine], ts[mine] + dur[mine]
            fact = facts.setdefault(rank, PlainFacts())
            fact.min_ts = min(fact.min_ts, float(start.min()))
            kept = kept_times(frame, start)
            merge_extents(fact.extents, step_extents(start[kept], end[kept], frame.step_of(start[kept])))
    return facts


def step_extents(starts: np.ndarray, ends: np.ndarray, steps: np.ndarray) -> dict:
    return {step: (float(starts[mine].min()), float(ends[mine].max())) for step, mine in by_step(steps)}


def merge_extents(into: dict, more: dict) -> None:
    for step, (first, last) in more.items():
        known = into.get(step)
        into[step] = (first, last) if known is None else (min(known[0], first), max(known[1], last))


def by_step(steps: np.ndarray) -> list[tuple[int, np.ndarray]]:
    """Positions of the rows of each step (steps >= 0), one sort for all steps."""
    rows = np.flatnonzero(steps >= 0)
    rows = rows[np.argsort(steps[rows], kind="stable")]
    ordered = steps[rows]
    cuts = np.flatnonzero(ordered[1:] != ordered[:-1]) + 1
    return [(int(ordered[group[0]]), rows[group]) for group in np.split(np.arange(len(rows)), cuts) if len(group)]
