"""Pass 1 for the merged-trace commands (relink, split, attribute), and the
rank map and links computed from it between the passes.

The visitor keeps, per launch (runtime call with a correlation id) and per
GPU event, a few typed-array entries; per pid, the rank evidence; per GPU
pid, a bounded sample of (id, ts) for rank inference.  Nothing grows with
CPU ops.  :func:`resolve` then decides every pid's rank (:mod:`rankmap`)
and links GPU events to launches by (rank, correlation) (:mod:`links`).
"""
from __future__ import annotations

from array import array
from dataclasses import dataclass
from itertools import compress, repeat
from operator import attrgetter, contains, eq, is_not
from typing import Callable

import numpy as np

from ..algo.columns import PLAIN_NUMBERS, as_floats, plain_ints_below, rank_column
from ..algo.corrset import CorrelationSet, count_shared
from ..algo.links import NO_LAUNCH, Links, ambiguous_collisions, build_tables, link
from ..algo.parts import extend_converted, translated
from ..algo.rankmap import AMBIGUOUS, UNKNOWN, PidEvidence, RankResolution, pair_by_time, resolve_ranks
from ..algo.ranks import rank_from_args, rank_from_process_name
from ..errors import TraceError
from ..io.jsonscan import RawMember, member_value
from ..io.projection import ProjectedChunk, Projection
from ..kineto import GPU_CATEGORIES, NUMBER_TYPES, RUNTIME_CATEGORIES

KEEP, LAUNCH, GPU, AC2G = range(4)
NO_ID = -(1 << 63)  # a GPU event without a usable correlation id
ID_LIMIT = 1 << 62
SAMPLES_PER_GPU_PID = 4096
NO_RANK = -1


def _id_of(args: object) -> int:
    """The event's correlation id, or NO_ID when absent or not a plain integer."""
    return _usable_id(args.get("correlation")) if args.__class__ is dict else NO_ID


def _usable_id(correlation: object) -> int:
    """``correlation`` when a plain integer in the id space, else NO_ID."""
    return correlation if correlation.__class__ is int and 0 <= correlation < ID_LIMIT else NO_ID


class MergedIndex:
    """Pass-1 visitor: launches, GPU events and rank evidence, in typed arrays.

    ``actions`` holds one byte per event (KEEP, LAUNCH, GPU, AC2G) for the
    commands that patch events in pass 2.
    """

    splits_by_ranges = True  # pass-1 workers may index ranges of events: take_part / absorb
    part_arrays = ("actions", "launch_pid", "launch_id", "launch_ts", "launch_rank", "launch_graph", "gpu_pid",
                   "gpu_id", "gpu_rank")  # what pass 1 records per event
    slot_arrays = ("launch_pid", "gpu_pid")  # ... of those, pid slots

    def __init__(self) -> None:
        self.pid_slots: dict[object, int] = {}
        self.pids: list[PidEvidence] = []
        self.actions = bytearray()
        self.launch_pid = array("i")
        self.launch_id = array("q")
        self.launch_ts = array("d")
        self.launch_rank = array("i")
        self.launch_graph = bytearray()
        self.gpu_pid = array("i")
        self.gpu_id = array("q")
        self.gpu_rank = array("i")
        self.samples: dict[int, list[tuple[int, float]]] = {}
        self._samples_taken: dict[int, int] = {}  # per GPU pid slot: samples in the parts taken
        self.ac2g_flows = 0
        self.handlers: dict[object, Callable[[dict], int]] = {cat: self._gpu for cat in GPU_CATEGORIES}
        self.handlers.update({cat: self._launch for cat in RUNTIME_CATEGORIES})
        self.handlers["ac2g"] = self._flow
        self._part_slots: dict[int, array] = {}  # per pass-1 worker: its pid slots -> ours
        self.visit = self._make_visit()

    def take_part(self) -> dict:
        """What was indexed since the last part: the per-event arrays, the
        evidence of every pid (in slot order) and the samples; the index then
        starts empty again, keeping its pid slots (see
        :mod:`streamtrace.engine.indexworkers`)."""
        part: dict = {name: getattr(self, name)[:] for name in self.part_arrays}
        for name in self.part_arrays:
            del getattr(self, name)[:]
        part["pids"] = self.pids[:]
        self.pids[:] = [PidEvidence(facts.pid) for facts in self.pids]  # in place: the hot loop holds the list
        for slot, samples in self.samples.items():
            self._samples_taken[slot] = self._samples_taken.get(slot, 0) + len(samples)
        part["samples"], self.samples = self.samples, {}
        part["ac2g_flows"], self.ac2g_flows = self.ac2g_flows, 0
        return part

    def absorb(self, part: dict, source: int, first_event: int) -> None:
        """Append a worker's part whose first event is ``first_event``."""
        slot_map = self._part_slots.setdefault(source, array("i"))
        for local, facts in enumerate(part["pids"]):
            if local == len(slot_map):
                slot_map.append(self.slot(facts.pid))
            mine = self.pids[slot_map[local]]
            mine.arg_ranks |= facts.arg_ranks
            mine.name_ranks |= facts.name_ranks
            mine.unranked = mine.unranked or facts.unranked
            if mine.first_work is None and facts.first_work is not None:
                mine.first_work = facts.first_work + first_event
        for name in self.part_arrays:
            if name in self.slot_arrays:
                extend_converted(getattr(self, name), translated(part[name], slot_map))
            else:
                getattr(self, name).extend(part[name])
        for local, samples in part["samples"].items():
            mine = self.samples.setdefault(slot_map[local], [])
            mine.extend(samples[:SAMPLES_PER_GPU_PID - len(mine)])
        self.ac2g_flows += part["ac2g_flows"]

    def _make_visit(self) -> Callable[[dict], None]:
        """The per-event hot loop: one dict lookup and one byte for most events."""
        handlers = self.handlers
        record = self.actions.append
        metadata = self.metadata

        def visit(event: dict) -> None:
            handler = handlers.get(event.get("cat"))
            if handler is not None:
                record(handler(event))
            elif event.get("ph") == "M":
                record(metadata(event))
            else:
                record(KEEP)

        return visit

    def slot(self, pid: object) -> int:
        found = self.pid_slots.get(pid)
        if found is None:
            if pid.__class__ not in (int, str):  # pids are ints or strings; anything else by its text
                return self.slot(str(pid))
            found = self.pid_slots[pid] = len(self.pids)
            self.pids.append(PidEvidence(pid))
        return found

    def _work(self, pid: object, rank: int | None, at: int) -> tuple[int, int]:
        """Pid slot and rank (``args.rank``, or NO_RANK) of the launch or GPU event at index ``at``."""
        slot = self.slot(pid)
        facts = self.pids[slot]
        if facts.first_work is None:
            facts.first_work = at
        if rank is None:
            facts.unranked = True
            return slot, NO_RANK
        facts.arg_ranks.add(rank)
        return slot, rank

    def _launch(self, event: dict) -> int:
        args = event.get("args")
        return self.launch(event.get("pid"), event.get("ts"), event.get("name"), _id_of(args), rank_from_args(args),
                           len(self.actions))

    def launch(self, pid: object, ts: object, name: object, correlation: int, rank: int | None, at: int) -> int:
        """Record a runtime call (a launch when it has an id and a time); its action."""
        if correlation == NO_ID or ts.__class__ not in NUMBER_TYPES:
            return KEEP
        slot, rank = self._work(pid, rank, at)
        self.launch_pid.append(slot)
        self.launch_id.append(correlation)
        self.launch_ts.append(float(ts))
        self.launch_rank.append(rank)
        self.launch_graph.append(name.__class__ is str and "GraphLaunch" in name)
        return LAUNCH

    def _gpu(self, event: dict) -> int:
        if event.get("ph") != "X":
            return KEEP
        args = event.get("args")
        return self.gpu(event.get("pid"), event.get("ts"), _id_of(args), rank_from_args(args), len(self.actions))

    def gpu(self, pid: object, ts: object, correlation: int, rank: int | None, at: int) -> int:
        """Record a GPU slice (``ph`` X), and sample its id and time for rank inference; its action."""
        slot, rank = self._work(pid, rank, at)
        self._add_gpu(slot, correlation, rank)
        if correlation != NO_ID and ts.__class__ in NUMBER_TYPES:
            samples = self.samples.setdefault(slot, [])
            if len(samples) < SAMPLES_PER_GPU_PID:
                samples.append((correlation, float(ts)))
        return GPU

    def _add_gpu(self, slot: int, correlation: int, rank: int) -> None:
        self.gpu_pid.append(slot)
        self.gpu_id.append(correlation)
        self.gpu_rank.append(rank)

    def record_chunk_work(self, picked: list, is_launch: np.ndarray, at: np.ndarray, first: int,
                          named: list[int] = (), metadata: list[dict] = ()) -> np.ndarray:
        """Record a projected chunk's launches and GPU events (``picked``, at
        positions ``at`` of a chunk whose first event is number ``first``;
        its ``process_name`` events at ``named``, decoded whole:
        ``metadata``) as :meth:`visit` would; which of them it recorded."""
        columns = _WorkColumns(picked, is_launch)
        valid = columns.valid
        pids = list(map(_PID, compress(picked, valid.tolist())))
        provisional = {pid: number for number, pid in enumerate(dict.fromkeys(pids))}
        pid_codes = np.fromiter(map(provisional.__getitem__, pids), np.int64, len(pids))
        _, firsts = np.unique(pid_codes, return_index=True)
        slots = np.array(self._slots_as_met(list(provisional), at[valid][firsts].tolist(), first, named, metadata),
                         np.int64)[pid_codes]
        self._record_work(slots, columns.masked(valid), is_launch[valid])
        return valid

    def _slots_as_met(self, pids: list, positions: list[int], first: int, named: list[int],
                      metadata: list[dict]) -> list[int]:
        """The slots of ``pids`` (first met as work at ``positions``), given
        in event order with the ``process_name`` events at ``named``; each
        new pid's first work noted."""
        slots = [0] * len(pids)
        met = sorted([(position, False, number) for number, position in enumerate(positions)]
                     + [(position, True, number) for number, position in enumerate(named)])
        for position, is_metadata, number in met:
            if is_metadata:
                note_process_name(metadata[number], self.pids, self.slot)
                continue
            slot = slots[number] = self.slot(pids[number])
            facts = self.pids[slot]
            if facts.first_work is None:
                facts.first_work = first + position
        return slots

    def _record_work(self, slots: np.ndarray, columns: "_WorkColumns", is_launch: np.ndarray) -> None:
        """The launches' and GPU slices' arrays, rank evidence and samples."""
        ranks = columns.ranks
        self._note_ranks(slots, ranks)
        for name, values in (("launch_pid", slots), ("launch_id", columns.ids), ("launch_ts", columns.ts),
                             ("launch_rank", ranks)):
            column = getattr(self, name)
            column.frombytes(values[is_launch].astype(column.typecode).tobytes())
        self.launch_graph += columns.graph[is_launch].tobytes()
        gpu = ~is_launch
        self._add_gpu_columns(slots[gpu], columns.ids[gpu], ranks[gpu])
        sampled = gpu & (columns.ids != NO_ID) & columns.timed
        sample_slots = slots[sampled]
        for slot in dict.fromkeys(sample_slots.tolist()):
            samples = self.samples.setdefault(slot, [])
            room = SAMPLES_PER_GPU_PID - len(samples)
            if room > 0:
                at = np.flatnonzero(sample_slots == slot)[:room]
                samples += zip(columns.ids[sampled][at].tolist(), columns.ts[sampled][at].tolist())

    def _slots_of(self, pids: list) -> np.ndarray:
        """Each of ``pids``' slot, a new pid numbered where first met (one :meth:`slot` call per distinct pid)."""
        slot_of = {pid: self.slot(pid) for pid in dict.fromkeys(pids)}
        return np.fromiter(map(slot_of.__getitem__, pids), np.int64, len(pids))

    def _note_ranks(self, slots: np.ndarray, ranks: np.ndarray) -> None:
        """Rank evidence of work: each event's ``args.rank`` (or NO_RANK) for its pid slot."""
        ranked = ranks != NO_RANK
        for slot in set(slots[~ranked].tolist()):
            self.pids[slot].unranked = True
        for slot, rank in set(zip(slots[ranked].tolist(), ranks[ranked].tolist())):
            self.pids[slot].arg_ranks.add(rank)

    def sampled_pids(self) -> set:
        """The GPU pids whose samples are complete (in this index, or in the
        index joining its parts, which absorbs the parts in event order): of
        their GPU events only the ranks count (:meth:`record_sampled_gpu`)."""
        return {self.pids[slot].pid for slot in self.samples.keys() | self._samples_taken.keys()
                if len(self.samples.get(slot, ())) + self._samples_taken.get(slot, 0) >= SAMPLES_PER_GPU_PID}

    def record_sampled_gpu(self, events: list) -> None:
        """Record projected GPU events of :meth:`sampled_pids` as :meth:`record_chunk_work` would, when
        no GPU arrays are kept (:class:`RankIndex`): their ranks, a C-level pass or two each."""
        arguments = list(map(_ARGS, events))
        if None in arguments or any(map(is_not, map(_RANK, arguments), repeat(None))):  # (most traces: no rank)
            sliced = list(compress(events, map(eq, map(_PH, events), repeat("X"))))
            slots = self._slots_of(list(map(_PID, sliced)))
            self._note_ranks(slots, rank_column(list(map(_ARGS, sliced)), NO_RANK))
            return
        for pid in set(map(_PID, compress(events, map(eq, map(_PH, events), repeat("X"))))):
            self.pids[self.slot(pid)].unranked = True

    def _add_gpu_columns(self, slots: np.ndarray, ids: np.ndarray, ranks: np.ndarray) -> None:
        """:meth:`_add_gpu` for GPU events given as arrays."""
        for column, values in ((self.gpu_pid, slots), (self.gpu_id, ids), (self.gpu_rank, ranks)):
            column.frombytes(values.astype(column.typecode).tobytes())

    def _flow(self, event: dict) -> int:
        self.ac2g_flows += 1
        return AC2G

    def metadata(self, event: dict) -> int:
        """A metadata event: the rank a ``process_name`` states."""
        note_process_name(event, self.pids, self.slot)
        return KEEP


class RankIndex(MergedIndex):
    """What :func:`resolve_pid_ranks` needs of :class:`MergedIndex`, no more:
    the rank evidence per pid, the launches and the GPU samples that
    inference pairs; no byte per event and no arrays per GPU event."""

    part_arrays = ("launch_pid", "launch_id", "launch_ts", "launch_rank", "launch_graph")
    slot_arrays = ("launch_pid",)

    def _make_visit(self) -> Callable[[dict], None]:
        handlers = self.handlers
        metadata = self.metadata

        def visit(event: dict) -> None:
            handler = handlers.get(event.get("cat"))
            if handler is not None:
                handler(event)
            elif event.get("ph") == "M":
                metadata(event)

        return visit

    def _add_gpu(self, slot: int, correlation: int, rank: int) -> None:
        """Not kept: ranks need only the samples."""

    def _add_gpu_columns(self, slots: np.ndarray, ids: np.ndarray, ranks: np.ndarray) -> None:
        """Not kept either."""


class LinksIndex(MergedIndex):
    """:class:`MergedIndex` (relink's pass 1) reading chunks decoded into the
    few members it reads, whose spool lines are then the events' own text.
    A class of its own: an index that extends ``visit`` must extend
    :meth:`visit_projected` alike (split's, attribute's and slice's do),
    or it would be passed by."""

    projection = Projection({"ph": None, "cat": None, "name": None, "pid": None, "ts": None,
                             "args": {"correlation": None, "rank": None}})
    """The members :meth:`visit` reads, but metadata's (those events are decoded whole)."""

    def visit_projected(self, chunk: ProjectedChunk) -> bool:
        """Index a chunk's events as :meth:`visit` would, a column at a time:
        kinds from the categories, then the launches' and GPU events' ids,
        ranks and times as arrays; per-pid Python, in event order (pid slots
        are numbered as met), for each pid's first work and for
        ``process_name`` metadata, decoded whole."""
        events = chunk.events
        first = len(self.actions)
        codes = np.frombuffer(bytes(map(_KINDS.get, map(_CAT, events), repeat(KEEP))), np.uint8)
        metadata = np.frombuffer(bytes(map(_METADATA_PHASE.get, map(_PH, events), repeat(0))), np.uint8)
        named = [position for position in np.flatnonzero((codes == KEEP) & (metadata == 1)).tolist()
                 if events[position].name == "process_name"]
        work = np.flatnonzero((codes == LAUNCH) | (codes == GPU))
        picked = list(map(events.__getitem__, work.tolist()))
        valid = self.record_chunk_work(picked, codes[work] == LAUNCH, work, first, named, chunk.whole(named))
        kinds = codes.copy()
        kinds[work[~valid]] = KEEP
        self.ac2g_flows += int(np.count_nonzero(kinds == AC2G))
        self.actions += kinds.tobytes()
        return True


class _WorkColumns:
    """What the index reads of launches (runtime calls) and GPU events, as
    arrays over them: correlation id (NO_ID if unusable), ``args.rank``
    (NO_RANK if none), time (NaN if not a number), graph launch, and
    whether the index records the event (``valid``)."""

    def __init__(self, events: list, is_launch: np.ndarray) -> None:
        count = len(events)
        arguments = list(map(_ARGS, events))
        self.ids = _id_column(arguments)
        self.ranks = rank_column(arguments, NO_RANK)
        times = list(map(_TS, events))
        self.timed = np.fromiter(map(PLAIN_NUMBERS.__contains__, map(type, times)), bool, count)
        self.ts = as_floats(times, np.nan)
        names = list(map(_NAME, events))
        if set(map(type, names)) <= _TEXT:
            self.graph = np.fromiter(map(contains, names, repeat("GraphLaunch")), bool, count)
        else:
            self.graph = np.fromiter((name.__class__ is str and "GraphLaunch" in name for name in names), bool, count)
        sliced = np.fromiter(map(eq, map(_PH, events), repeat("X")), bool, count)
        self.valid = np.where(is_launch, (self.ids != NO_ID) & self.timed, sliced)

    def masked(self, keep: np.ndarray) -> "_WorkColumns":
        """The columns of the events ``keep`` selects."""
        kept = object.__new__(_WorkColumns)
        for name in ("ids", "ranks", "timed", "ts", "graph", "valid"):
            setattr(kept, name, getattr(self, name)[keep])
        return kept


_CAT, _PH, _TS, _NAME, _ARGS, _CORRELATION, _PID, _RANK = map(
    attrgetter, ("cat", "ph", "ts", "name", "args", "correlation", "pid", "rank"))
_TEXT = frozenset({str})


def _id_column(arguments: list) -> np.ndarray:
    """Each event's usable correlation id (:func:`_usable_id`), else NO_ID,
    from the events' decoded ``args`` (None for none): C-level passes when
    every id given is a plain integer in range, as in a plain trace."""
    present = list(map(is_not, arguments, repeat(None)))
    ids = list(map(_CORRELATION, compress(arguments, present)))
    if plain_ints_below(ids, ID_LIMIT):
        column = np.full(len(arguments), NO_ID, np.int64)
        column[np.array(present, bool)] = ids
        return column
    return np.fromiter((NO_ID if args is None else _usable_id(args.correlation) for args in arguments),
                       np.int64, len(arguments))


_METADATA_PHASE = {"M": 1}
_KINDS = {**dict.fromkeys(GPU_CATEGORIES, GPU), **dict.fromkeys(RUNTIME_CATEGORIES, LAUNCH), "ac2g": AC2G}


def note_process_name(event: dict, pids: list[PidEvidence], slot_of: Callable[[object], int]) -> None:
    """The rank a ``process_name`` metadata event states (in its name or ``args.rank``), as evidence of its pid."""
    if event.get("name") == "process_name":
        args = event.get("args")
        rank = rank_from_process_name(args.get("name") if args.__class__ is dict else None)
        if rank is not None:
            pids[slot_of(event.get("pid"))].name_ranks.add(rank)
        rank = rank_from_args(args)
        if rank is not None:
            pids[slot_of(event.get("pid"))].arg_ranks.add(rank)


@dataclass
class Resolved:
    """Ranks and links of a merged trace, ready for pass 2 and the summary."""

    index: MergedIndex
    ranks: RankResolution
    launch_bucket: array  # per launch: rank, UNKNOWN or AMBIGUOUS
    gpu_bucket: array  # per GPU event: rank (its launch's for an ambiguous pid), UNKNOWN or AMBIGUOUS
    links: Links
    collisions: dict
    clashes: dict[int, list[int]]  # ambiguous pid slot -> ids that several launches carry

    def rank_table(self) -> list[dict]:
        """Every pid with its rank and the rule that decided it."""
        return rank_table(self.index, self.ranks)

    def summary(self) -> dict:
        """The rank map, collisions, links, orphans and graph launches."""
        index, links = self.index, self.links
        ambiguous = [{"pid": index.pids[slot].pid, "ranks": ranks} for slot, ranks in self.ranks.ambiguous.items()]
        return {
            "ranks": sorted(set(_ranks_among(np.frombuffer(self.gpu_bucket, dtype=np.int32))) | set(self.ranks.known())),
            "rank_map": self.rank_table(),
            "ambiguous_pids": ambiguous,
            "correlation_collisions": self.collisions,
            "runtime_launches": len(index.launch_id),
            "gpu_events": len(index.gpu_id),
            "links": len(index.gpu_id) - links.orphans,
            "orphans": links.orphans,
            "duplicate_launch_ids": links.duplicate_launch_ids,
            "graph_launches": self.graph_summary(),
        }

    def ranks_for_certain(self) -> list[int]:
        """The ranks the file certainly holds: stated on a pid (``args.rank``,
        ``process_name``), or found for launches whose GPU work is linked to
        them (a stray CPU process or an unpaired GPU pid alone proves no rank)."""
        stated = {rank for rank, rule in zip(self.ranks.ranks, self.ranks.rules)
                  if rank >= 0 and rule in ("args.rank", "process_name")}
        linked = np.frombuffer(self.launch_bucket, dtype=np.int32)[self._linked_launches()]
        return sorted(stated | set(_ranks_among(linked)))

    def launches_with_gpu_work(self) -> bytearray:
        """1 for each launch that some GPU event links to."""
        flags = np.zeros(len(self.index.launch_id), dtype=np.uint8)
        flags[self._linked_launches()] = 1
        return bytearray(flags.tobytes())

    def graph_summary(self) -> dict:
        """Graph launches per rank with the GPU events each one got."""
        per_launch = np.bincount(self._linked_launches(), minlength=len(self.index.launch_id))
        graph = np.flatnonzero(np.frombuffer(self.index.launch_graph, dtype=np.uint8))
        graph_buckets = np.frombuffer(self.launch_bucket, dtype=np.int32)[graph]
        buckets, rank_of_launch = np.unique(np.maximum(graph_buckets, -1), return_inverse=True)  # -1: unknown
        grouped = per_launch[graph[np.argsort(rank_of_launch, kind="stable")]]  # each rank's launches together
        ends = np.cumsum(np.bincount(rank_of_launch, minlength=len(buckets))).tolist()
        by_rank: dict[str, dict] = {}
        for bucket, start, end in zip(buckets.tolist(), [0, *ends], ends):
            counts = grouped[start:end]
            by_rank[str(bucket) if bucket >= 0 else "unknown"] = {
                "launches": end - start, "gpu_events": int(counts.sum()), "min": int(counts.min()),
                "max": int(counts.max())}
        return {"count": len(graph), "by_rank": by_rank}

    def _linked_launches(self) -> np.ndarray:
        """The launch of each GPU event that has one, in GPU event order."""
        launches = np.frombuffer(self.links.launch_of_gpu, dtype=np.int32)
        return launches[launches != NO_LAUNCH]

    def require_links(self, command: str) -> None:
        """Stop when an ambiguous pid's ids collide: linking would guess."""
        for slot, clashing in self.clashes.items():
            raise TraceError(
                f"pid {self.index.pids[slot].pid!r} holds events of ranks {self.ranks.ambiguous[slot]} "
                f"({self.ranks.rules[slot]}) and their correlation ids collide (e.g. "
                f"{', '.join(map(str, clashing))}): {command} cannot tell which launch is whose; "
                "give --rank-map, or args.rank on the events")


def _buckets(event_pid: array, event_rank: array, pid_ranks: list[int]) -> array:
    """Each event's rank: its own ``args.rank``, else its pid's (or UNKNOWN/AMBIGUOUS)."""
    ranks = np.frombuffer(event_rank, dtype=np.int32)
    by_pid = np.array(pid_ranks, dtype=np.int32)[np.frombuffer(event_pid, dtype=np.int32)]
    return array("i", np.where(ranks != NO_RANK, ranks, by_pid).tobytes())


def _ranks_among(buckets: np.ndarray) -> list[int]:
    """The ranks that occur among ``buckets`` (UNKNOWN and AMBIGUOUS left out)."""
    found = np.unique(buckets)
    return found[found >= 0].tolist()


def _take_launch_ranks(gpu_bucket: array, launch_of_gpu: array, launch_bucket: array) -> None:
    """An ambiguous pid's GPU event takes the rank of the launch it linked to, when that has one (in place)."""
    buckets = np.frombuffer(gpu_bucket, dtype=np.int32)
    launches = np.frombuffer(launch_of_gpu, dtype=np.int32)
    ambiguous = np.flatnonzero((buckets == AMBIGUOUS) & (launches != NO_LAUNCH))
    ranks = np.frombuffer(launch_bucket, dtype=np.int32)[launches[ambiguous]]
    ranked = ranks >= 0
    buckets[ambiguous[ranked]] = ranks[ranked]


def _pairings(index: MergedIndex) -> dict:
    """Rank inference input: the launches of the sampled ids, then the pairing."""
    wanted = {correlation for samples in index.samples.values() for correlation, _ in samples}
    launches_by_id: dict[int, list[tuple[int, float]]] = {}
    for slot, correlation, ts in zip(index.launch_pid, index.launch_id, index.launch_ts):
        if correlation in wanted:
            launches_by_id.setdefault(correlation, []).append((slot, ts))
    return pair_by_time(index.samples, launches_by_id)


def _collisions(buckets: array, ids: array) -> dict:
    """How many correlation ids launches of more than one rank share (the merged-trace hazard)."""
    per_rank: dict[int, CorrelationSet] = {}
    for bucket, correlation in zip(buckets, ids):
        if bucket >= 0:
            found = per_rank.get(bucket)
            if found is None:
                found = per_rank[bucket] = CorrelationSet()
            found.add(correlation)
    return {"ids_shared_across_ranks": count_shared(per_rank.values())}


def resolve_pid_ranks(index: MergedIndex, members: list[RawMember], rank_map: dict | None = None) -> RankResolution:
    """Decide every pid's rank (:mod:`rankmap`'s rules), and nothing else."""
    distributed = member_value(members, "distributedInfo")
    file_rank = distributed.get("rank") if isinstance(distributed, dict) else None
    return resolve_ranks(index.pids, rank_map=rank_map, pairings=lambda: _pairings(index), file_rank=file_rank)


def rank_table(index: MergedIndex, ranks: RankResolution) -> list[dict]:
    """Every pid with its rank and the rule that decided it."""
    rows = []
    for slot, facts in enumerate(index.pids):
        rank = ranks.ranks[slot]
        row = {"pid": facts.pid, "rank": rank if rank >= 0 else None, "rule": ranks.rules[slot]}
        if slot in ranks.ambiguous:
            row["claimed_by_ranks"] = ranks.ambiguous[slot]
        pairing = ranks.pairings.get(slot)
        if pairing is not None and pairing.cpu is not None and ranks.rules[slot] == "inferred":
            row["paired_with_pid"] = index.pids[pairing.cpu].pid
            row["ids_consistent_in_time"] = pairing.consistent
            row["ids_inconsistent_in_time"] = pairing.inconsistent
        rows.append(row)
    return rows


def resolve(index: MergedIndex, members: list[RawMember], rank_map: dict | None = None) -> Resolved:
    """Decide every pid's rank, then link every GPU event to its launch."""
    ranks = resolve_pid_ranks(index, members, rank_map)
    launch_bucket = _buckets(index.launch_pid, index.launch_rank, ranks.ranks)
    gpu_bucket = _buckets(index.gpu_pid, index.gpu_rank, ranks.ranks)
    tables = build_tables(launch_bucket, index.launch_id)
    links = link(tables, gpu_bucket, index.gpu_id, NO_ID)
    clashes = {}
    for slot in ranks.ambiguous:
        ids = array("q", (c for s, b, c in zip(index.launch_pid, launch_bucket, index.launch_id)
                          if s == slot and b == AMBIGUOUS))
        ids.extend(c for s, b, c in zip(index.gpu_pid, gpu_bucket, index.gpu_id)
                   if s == slot and b == AMBIGUOUS and c != NO_ID)
        clashing = ambiguous_collisions(tables, ids)
        if clashing:
            clashes[slot] = clashing
    _take_launch_ranks(gpu_bucket, links.launch_of_gpu, launch_bucket)
    return Resolved(index, ranks, launch_bucket, gpu_bucket, links, _collisions(launch_bucket, index.launch_id),
                    clashes)


__all__ = ["AC2G", "GPU", "KEEP", "LAUNCH", "LinksIndex", "MergedIndex", "NO_ID", "RankIndex", "Resolved", "UNKNOWN",
           "note_process_name", "rank_table", "resolve", "resolve_pid_ranks"]
