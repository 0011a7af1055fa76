"""The pass-1 visitor of ``analyze``: per event HTA reads, a few typed-array entries (spilled in blocks)."""
from __future__ import annotations

import os
import struct
import tempfile
from array import array
from decimal import Decimal
from typing import IO, Callable, Iterator

import numpy as np

from ...algo.parts import extend_converted, shifted, translated
from ...algo.rankmap import PidEvidence
from ...io.chunkcut import chunk_events
from ...io.projection import projected_events
from ...kineto import GPU_CATEGORIES, RUNTIME_CATEGORIES
from ..mergedindex import note_process_name
from . import collectives  # TraceLens's collective report (SPEC 16): its pass-1 hooks are marked "collectives"
from .chunktimes import Times, chunk_times
from .ops import OpsCollector  # TraceLens's perf report (SPEC 17, --ops): its pass-1 hooks are marked "ops"
from .opsprojected import Coded, chunk_codes, collect_chunk  # ops

RANK_EVIDENCE_CATEGORIES = GPU_CATEGORIES | RUNTIME_CATEGORIES  # the events relink reads args.rank on
NUMBERS = (int, float)
PLAIN_BLOCK = 1 << 16  # plain rows held before they go to the temporary file
WORK_BLOCK = 1 << 16  # work rows held before they go to their temporary file (44 bytes each)
_BLOCK_HEAD = struct.Struct("<Q")
_WORK_HEAD = struct.Struct("<QQ")
_WORK_COLUMNS = (("ts", np.float64), ("dur", np.float64), ("stream", np.int64), ("corr", np.int64), ("name", np.int32),
                 ("cat", np.int32), ("slot", np.int32))
ID_LOW, ID_HIGH = -(1 << 63), 1 << 63  # what a stream or correlation id array holds
NO_ID = -1


def _plain_event(event: object) -> dict:
    """The fields of an event that :func:`_first_row` reads, as a small dict (a projection or a dict)."""
    get = event.get if isinstance(event, dict) else lambda key: getattr(event, key, None)
    return {key: get(key) for key in ("ph", "ts", "dur", "cat", "pid")}


def _both(first: Callable[[object], None], second: Callable[[object], None]) -> Callable[[object], None]:
    """A visit that is two (each event to both, in this order)."""
    def visit(event: object) -> None:
        first(event)
        second(event)
    return visit


def stream_of(value: object) -> int:
    """HTA's ``int(stream)``; what int() refuses counts as no stream (-1)."""
    if value.__class__ is int:
        return value  # type: ignore[return-value]
    try:
        return int(value)  # type: ignore[call-overload]
    except (TypeError, ValueError, OverflowError):
        return NO_ID


def _stream_arg(original: object, stream: object) -> object:
    """The stream an event ran on: ``args.original_stream`` where compact or merge
    moved it to a lane (the lane is a drawing aid), else ``args.stream`` (None: no stream)."""
    found = stream if original is None else original
    return NO_ID if found is None else found


def _id_of(value: object) -> int:
    """A correlation id: an integer (or a whole float); anything else is no id."""
    if value.__class__ is int:
        return value if ID_LOW <= value < ID_HIGH else NO_ID  # type: ignore[return-value, operator]
    if value.__class__ is float and value.is_integer():  # type: ignore[union-attr]
        return int(value)  # type: ignore[arg-type]
    return NO_ID


def absorb_ids(index: AnalyzeIndex, part: dict, maps: tuple[array, array, array]) -> None:
    """A pass-1 worker's new names, categories and pids made the joined index's
    (``maps``: the worker's name, category and pid ids -> ours), with its pids' rank evidence."""
    for name in part["names"]:
        maps[0].append(index.names.setdefault(name, len(index.names)))
    for cat in part["cats"]:
        maps[1].append(index.cats.setdefault(cat, len(index.cats)))
    for local, facts in enumerate(part["pids"]):
        if local == len(maps[2]):
            maps[2].append(index.slot_of(facts.pid))
        slot = maps[2][local]
        index.pids[slot].arg_ranks |= facts.arg_ranks
        index.pids[slot].name_ranks |= facts.name_ranks
        if part["unranked"][local]:
            index.unranked[slot] = 1


class AnalyzeIndex:
    """Pass-1 visitor: per event HTA reads, a few typed-array entries.

    "Work" events (on a stream, with a correlation id, or a profiler step)
    keep start, duration, stream, id, name, category and pid slot; every
    other event only start, duration and pid slot.  Per pid, the rank
    evidence relink uses (``args.rank`` of its launches and GPU events, the
    rank its ``process_name`` states); an event's own ``args.rank`` is kept
    for the few events that have one.
    """

    def __init__(self, spool_dir: str | None = None, owner: int | None = None, ops: bool = False,
                 with_collectives: bool = True) -> None:
        self.pid_slots: dict[object, int] = {}
        self.pids: list[PidEvidence] = []
        self.unranked = bytearray()  # per pid slot: some launch or GPU event lacks args.rank
        self.names: dict[object, int] = {}
        self.cats: dict[object, int] = {}
        self.ts, self.dur = array("d"), array("d")
        self.stream, self.corr = array("q"), array("q")
        self.name, self.cat, self.slot = array("i"), array("i"), array("i")
        self.ranked_rows, self.row_ranks = array("q"), array("i")
        self.plain_ts, self.plain_dur, self.plain_slot = array("d"), array("d"), array("i")
        self.fractional = [False]  # some ts is not an integer (or missing): HTA rounds every event's times
        self.skipped = [0]
        self.first_event: list = [None]  # HTA joins kernels without a launch to the row of index 0: the first event
        self.row_seen = bytearray()  # per pid slot: a row of it was read
        self.first_rows: list[tuple[int, float, float]] = []  # (slot, ts, dur) of each pid's first row, in file order
        self.collectives = collectives.KernelCollector(spool_dir, with_collectives)  # collectives (none if skipped)
        self._listed = (0, 0)  # names and categories already in a part
        self._first_sent = False
        self._part_maps: dict[int, tuple[array, array, array]] = {}  # per pass-1 worker: its ids -> ours
        self._spilled: IO[bytes] | None = None  # plain rows, in blocks, in an unnamed temporary file
        self._work: IO[bytes] | None = None  # work rows, in blocks, in another
        self.spilled_rows = [0]  # work rows in that file (row positions count from the first work row)
        self._owner = os.getpid() if owner is None else owner  # the process that spills (pass-1 workers send theirs in parts)
        self.spool_dir = spool_dir
        self.visit = self._make_visit()
        self.ops = OpsCollector(spool_dir, self._holds_all) if ops else None  # ops: TraceLens's perf report (--ops)
        if self.ops is not None:
            self.visit = _both(self.ops.visit, self.visit)

    def _holds_all(self) -> bool:
        """Whether this is the index that keeps every row (not a pass-1 worker's, nor one beside the joined
        index): it spills them to disk in blocks; the others send theirs in parts."""
        return not self.partial and os.getpid() == self._owner

    splits_by_ranges = True  # pass-1 workers may index ranges of events: take_part / absorb / visit_chunk
    partial = False  # True where it indexes parts (in a worker, or beside the joined index): its rows go in parts, unspilled
    _PART_ARRAYS = ("ts", "dur", "stream", "corr", "row_ranks", "plain_ts", "plain_dur")  # copied as they are
    _PART_IDS = (("name", 0), ("cat", 1), ("slot", 2), ("plain_slot", 2))  # translated: names, categories, pid slots

    def take_part(self) -> dict:
        """What was indexed since the last part (see :mod:`streamtrace.engine.indexworkers`);
        names, categories and pids keep their numbers, the new ones are listed."""
        part: dict = {name: getattr(self, name)[:] for name in (*self._PART_ARRAYS, "name", "cat", "slot",
                                                                  "plain_slot", "ranked_rows")}
        for name in part:
            del getattr(self, name)[:]
        part["names"] = list(self.names)[self._listed[0]:]
        part["cats"] = list(self.cats)[self._listed[1]:]
        self._listed = (len(self.names), len(self.cats))
        part["pids"] = self.pids[:]
        self.pids[:] = [PidEvidence(facts.pid) for facts in self.pids]  # in place: the hot loop holds the list
        part["unranked"] = bytes(self.unranked)
        self.unranked[:] = bytes(len(self.unranked))
        part["fractional"], self.fractional[0] = self.fractional[0], False
        part["skipped"], self.skipped[0] = self.skipped[0], 0
        first = self.first_event[0]
        part["first_event"] = None if first is None or self._first_sent else _plain_event(first)
        part["first_rows"], self.first_rows[:] = self.first_rows[:], []
        self._first_sent = first is not None
        part["collectives"] = self.collectives.take_part()  # collectives
        part["ops"] = None if self.ops is None else self.ops.take_part()  # ops
        return part

    def absorb(self, part: dict, source: int, first_event: int) -> None:
        """Append a worker's part (parts come in event order)."""
        maps = self._part_maps.setdefault(source, (array("i"), array("i"), array("i")))
        absorb_ids(self, part, maps)
        extend_converted(self.ranked_rows, shifted(part["ranked_rows"], self.spilled_rows[0] + len(self.ts)))
        for name in self._PART_ARRAYS:
            getattr(self, name).extend(part[name])
        for name, kind in self._PART_IDS:
            extend_converted(getattr(self, name), translated(part[name], maps[kind]))
        if len(self.plain_ts) >= PLAIN_BLOCK:
            self.spill()
        if len(self.ts) >= WORK_BLOCK:
            self.spill_work()
        self.fractional[0] = self.fractional[0] or part["fractional"]
        self.skipped[0] += part["skipped"]
        if self.first_event[0] is None and part["first_event"] is not None:
            self.first_event[0] = part["first_event"]
        for local, ts, dur in part["first_rows"]:
            self._first_row_of(maps[2][local], ts, dur)
        self.collectives.absorb(part["collectives"], source, maps[2])  # collectives
        if self.ops is not None:  # ops
            self.ops.absorb(part["ops"], source, first_event)

    def visit_chunk(self, text: bytes) -> int | None:
        """Index a chunk's events as :meth:`visit` would, from a projection
        decoded with msgspec and a pass over each field; None (refused, nothing
        kept) when the projection cannot read the chunk or a field has an
        unusual type.  With ops, the same projection (with the members they
        read) goes to them too, after the index took the chunk (a refused chunk
        leaves nothing); or the chunk's events as dicts, where the projection
        could read them differently (:func:`.opsprojected.chunk_codes`)."""
        events = projected_events(text, ops=self.ops is not None)
        if events is None:
            return None
        times = chunk_times(events)
        if times is None:
            return None  # (missing or fractional times are fine; strings, bools and the like go the dict way)
        dicts = coded = None
        if self.ops is not None:
            coded = chunk_codes(events)
            if coded is None:
                dicts = chunk_events(text)
                if dicts is None:
                    return None
        count = self._index_chunk(events, times, coded)
        if self.ops is None:
            return count
        if dicts is None:
            collect_chunk(self.ops, events, coded, times)
        else:
            visit = self.ops.visit
            for event in dicts:
                visit(event)
        return count

    def _index_chunk(self, events: list, times: Times, coded: Coded | None = None) -> int:
        """Index a chunk's projected events (``times``: their :func:`.chunktimes.chunk_times`; ``coded``: with
        ops, what :func:`.opsprojected.chunk_codes` read of them, which tells the kernels, CPU ops, pids and the
        events left out (no category, or "Trace") without passes of the index's own)."""
        if self.first_event[0] is None and events:
            self.first_event[0] = _plain_event(events[0])
        if times.ts_kinds != {int}:
            self.fractional[0] = True
        timed_mask = ~np.isnan(times.dur_float) & ~np.isnan(times.ts_float)
        timed = np.flatnonzero(timed_mask)
        if len(timed) != len(events):
            phases = [event.ph for event in events] if coded is None else coded.phases  # (ops)
            if "M" in phases:
                untimed = set(range(len(events))) - set(timed.tolist())
                for at in sorted(untimed):
                    if phases[at] == "M":
                        event = events[at]
                        args = event.args
                        self.metadata({"name": event.name, "pid": event.pid,
                                       "args": None if args is None else {"name": args.name, "rank": args.rank}})
        listed = timed.tolist()
        timed_events = [events[at] for at in listed]
        if coded is None:
            self._index_rows(timed_events, [event.cat for event in timed_events])
            return len(events)
        # ops: the kernels, CPU ops, categories left out and pids as chunk_codes read them
        kernels = self.collectives.kernels_among(coded.of_category("kernel", timed_mask))  # collectives
        self.collectives.add_comms_ops_among(coded.of_category("cpu_op", timed_mask))  # collectives
        left_out = coded.left_out(timed)
        if left_out is None:  # (a category that is no string: the index reads them itself)
            self._index_rows(timed_events, [event.cat for event in timed_events], kernels)
            return len(events)
        if left_out.any():
            timed = timed[~left_out]
            timed_events = [event for event, out in zip(timed_events, left_out.tolist()) if not out]
        self._rows(timed_events, coded.pids_of(timed))
        self.collectives.add_projected(kernels, self.slot_of)  # collectives
        return len(events)

    def _index_rows(self, timed_events: list, cats: list, kernels: list | None = None) -> None:
        """The rows of a chunk's timed events (``cats``: their categories; ``kernels``: their collective
        kernels, when found)."""
        if kernels is None:
            kernels = self.collectives.kernels(timed_events, cats)  # collectives
            self.collectives.add_projected_comms_ops(timed_events, cats)  # collectives
        if set(map(type, cats)) - {str}:
            self.skipped[0] += sum(1 for cat in cats if cat is not None and cat.__class__ is not str)
            timed_events = [event for event, cat in zip(timed_events, cats) if cat.__class__ is str]
        if "Trace" in cats:
            timed_events = [event for event in timed_events if event.cat != "Trace"]
        self._rows(timed_events)
        self.collectives.add_projected(kernels, self.slot_of)  # collectives

    def _rows(self, events: list, pids: list | None = None) -> None:
        """The rows of a chunk (events HTA reads), in order: work rows and plain rows (``pids``: theirs, if read)."""
        pid_slots, slot_of = self.pid_slots, self.slot_of
        slots = [pid_slots.get(event.pid) for event in events] if pids is None else list(map(pid_slots.get, pids))
        if None in slots:
            slots = [slot_of(event.pid) for event in events]
        for slot in dict.fromkeys(slots):
            if not self.row_seen[slot]:
                event = events[slots.index(slot)]
                self._first_row_of(slot, float(event.ts), float(event.dur))
        streams = [NO_ID if event.args is None else _stream_arg(event.args.original_stream, event.args.stream)
                   for event in events]
        corrs = [NO_ID if event.args is None or event.args.correlation is None else event.args.correlation
                 for event in events]
        if set(map(type, streams)) - {int}:
            streams = [value if value.__class__ is int else stream_of(value) for value in streams]
        if set(map(type, corrs)) - {int}:
            corrs = [value if value.__class__ is int else _id_of(value) for value in corrs]
        if events and not (ID_LOW <= min(streams) and max(streams) < ID_HIGH and ID_LOW <= min(corrs) and max(corrs) < ID_HIGH):
            streams = [value if ID_LOW <= value < ID_HIGH else NO_ID for value in streams]
            corrs = [value if ID_LOW <= value < ID_HIGH else NO_ID for value in corrs]
        work = [at for at, (stream, corr, event) in enumerate(zip(streams, corrs, events))
                if stream != NO_ID or corr != NO_ID or (event.name.__class__ is str and "ProfilerStep" in event.name)]
        chosen = set(work)
        plain = [at for at in range(len(events)) if at not in chosen] if len(work) != len(events) else []
        self.plain_ts.extend([float(events[at].ts) for at in plain])
        self.plain_dur.extend([float(events[at].dur) for at in plain])
        self.plain_slot.extend([slots[at] for at in plain])
        if len(self.plain_ts) >= PLAIN_BLOCK:
            self.spill()
        names, cats, first_row = self.names, self.cats, self.spilled_rows[0] + len(self.ts)
        for row, at in enumerate(work):
            event = events[at]
            if event.cat in RANK_EVIDENCE_CATEGORIES:
                rank = None if event.args is None else event.args.rank
                if rank.__class__ is int and rank >= 0:
                    self.pids[slots[at]].arg_ranks.add(rank)
                    self.ranked_rows.append(first_row + row)
                    self.row_ranks.append(rank)
                else:
                    self.unranked[slots[at]] = 1
        self.ts.extend([float(events[at].ts) for at in work])
        self.dur.extend([float(events[at].dur) for at in work])
        self.stream.extend([streams[at] for at in work])
        self.corr.extend([corrs[at] for at in work])
        self.name.extend([names.setdefault(events[at].name, len(names)) for at in work])
        self.cat.extend([cats.setdefault(events[at].cat, len(cats)) for at in work])
        self.slot.extend([slots[at] for at in work])
        if len(self.ts) >= WORK_BLOCK:
            self.spill_work()

    def spill(self) -> None:
        """Move the plain rows held to the temporary file (in the joined index only)."""
        if self.partial or os.getpid() != self._owner or not self.plain_ts:
            return
        if self._spilled is None:
            self._spilled = tempfile.TemporaryFile(prefix="streamtrace-rows-", dir=self.spool_dir)
        self._spilled.write(_BLOCK_HEAD.pack(len(self.plain_ts)))
        for rows in (self.plain_ts, self.plain_dur, self.plain_slot):
            self._spilled.write(rows.tobytes())
            del rows[:]

    def spill_work(self) -> None:
        """Move the work rows held (and their ranks) to their temporary file (in the joined index only)."""
        if self.partial or os.getpid() != self._owner:
            return
        self.collectives.spill()  # collectives
        if not self.ts:
            return
        if self._work is None:
            self._work = tempfile.TemporaryFile(prefix="streamtrace-work-", dir=self.spool_dir)
        self._work.write(_WORK_HEAD.pack(len(self.ts), len(self.ranked_rows)))
        self.spilled_rows[0] += len(self.ts)
        for name in (*(name for name, _ in _WORK_COLUMNS), "ranked_rows", "row_ranks"):
            rows = getattr(self, name)
            self._work.write(rows.tobytes())
            del rows[:]

    def work_blocks(self) -> Iterator[tuple[int, dict[str, np.ndarray]]]:
        """The work rows, a block at a time in event order: (position of the block's first row, its columns;
        ``ranked`` and ``ranks``: the rows with their own args.rank, by position)."""
        base = 0
        if self._work is not None:
            self._work.seek(0)
            while head := self._work.read(_WORK_HEAD.size):
                count, ranked = _WORK_HEAD.unpack(head)
                block = {name: np.frombuffer(self._work.read(np.dtype(dtype).itemsize * count), dtype=dtype)
                         for name, dtype in _WORK_COLUMNS}
                block["ranked"] = np.frombuffer(self._work.read(8 * ranked), dtype=np.int64)
                block["ranks"] = np.frombuffer(self._work.read(4 * ranked), dtype=np.int32)
                yield base, block
                base += count
        if self.ts:
            block = {name: np.frombuffer(getattr(self, name), dtype=dtype) for name, dtype in _WORK_COLUMNS}
            block["ranked"] = np.frombuffer(self.ranked_rows, dtype=np.int64) if self.ranked_rows else np.empty(0, np.int64)
            block["ranks"] = np.frombuffer(self.row_ranks, dtype=np.int32) if self.row_ranks else np.empty(0, np.int32)
            yield base, block

    @property
    def work_rows(self) -> int:
        return self.spilled_rows[0] + len(self.ts)

    def plain_blocks(self) -> Iterator[tuple[np.ndarray, np.ndarray, np.ndarray]]:
        """The plain rows (start, duration, pid slot), a block at a time, in event order."""
        if self._spilled is not None:
            self._spilled.seek(0)
            while head := self._spilled.read(_BLOCK_HEAD.size):
                (count,) = _BLOCK_HEAD.unpack(head)
                yield (np.frombuffer(self._spilled.read(8 * count), dtype=np.float64),
                       np.frombuffer(self._spilled.read(8 * count), dtype=np.float64),
                       np.frombuffer(self._spilled.read(4 * count), dtype=np.int32))
        if self.plain_ts:
            yield (np.frombuffer(self.plain_ts, dtype=np.float64), np.frombuffer(self.plain_dur, dtype=np.float64),
                   np.frombuffer(self.plain_slot, dtype=np.int32))

    def close(self) -> None:
        self.collectives.close()  # collectives
        for name in ("_spilled", "_work"):
            if getattr(self, name) is not None:
                getattr(self, name).close()
                setattr(self, name, None)

    def slot_of(self, pid: object) -> int:
        found = self.pid_slots.get(pid)
        if found is None:
            if pid.__class__ not in (int, str):  # as relink: pids are ints or strings, anything else by its text
                return self.slot_of(str(pid))
            found = self.pid_slots[pid] = len(self.pids)
            self.pids.append(PidEvidence(pid))
            self.unranked.append(0)
            self.row_seen.append(0)
        return found

    def _first_row_of(self, slot: int, ts: float, dur: float) -> None:
        """Note a pid's first row (the first seen of it, since rows come in file order)."""
        if not self.row_seen[slot]:
            self.row_seen[slot] = 1
            self.first_rows.append((slot, ts, dur))

    def metadata(self, event: dict) -> None:
        """A ``process_name`` event: the rank it states."""
        note_process_name(event, self.pids, self.slot_of)

    def _make_visit(self) -> Callable[[dict], None]:
        pid_slots, slot_of, metadata, pids, unranked = self.pid_slots, self.slot_of, self.metadata, self.pids, self.unranked
        names, cats = self.names, self.cats
        fractional, skipped, first_event = self.fractional, self.skipped, self.first_event
        row_seen, first_row_of = self.row_seen, self._first_row_of
        add_ts, add_dur, add_stream, add_corr = self.ts.append, self.dur.append, self.stream.append, self.corr.append
        add_name, add_cat, add_slot = self.name.append, self.cat.append, self.slot.append
        add_ranked, add_rank, rows = self.ranked_rows.append, self.row_ranks.append, self.ts
        spilled_rows, spill_work = self.spilled_rows, self.spill_work
        plain_ts, plain_dur, plain_slot = self.plain_ts.append, self.plain_dur.append, self.plain_slot.append
        plain_rows, spill = self.plain_ts, self.spill
        collective, add_collective = self.collectives.wanted, self.collectives.add  # collectives
        add_comms_op = self.collectives.add_comms_op  # collectives
        evidence_cats = RANK_EVIDENCE_CATEGORIES

        def visit(event: dict) -> None:
            if first_event[0] is None:
                first_event[0] = event
            get = event.get
            ts = get("ts")
            if ts.__class__ is not int:
                fractional[0] = True
                if ts.__class__ is not float:
                    if ts.__class__ is Decimal:  # exact mode reads every fraction as a Decimal
                        ts = float(ts)
                    else:
                        if get("ph") == "M":
                            metadata(event)
                        return
            dur = get("dur")
            if dur is None:
                if get("ph") == "M":
                    metadata(event)
                return
            if dur.__class__ is Decimal:
                dur = float(dur)
            cat = get("cat")
            if cat.__class__ is not str or cat == "Trace" or dur.__class__ not in NUMBERS:
                if cat is not None and cat != "Trace":
                    skipped[0] += 1
                return
            pid = get("pid")
            slot = pid_slots.get(pid)
            if slot is None:
                slot = slot_of(pid)
            if not row_seen[slot]:
                first_row_of(slot, ts, dur)
            name = get("name")
            if cat == "kernel" and collective(name):  # collectives
                add_collective(event, ts, dur, slot)
            elif cat == "cpu_op" and name == collectives.COMMS_OP:  # collectives
                add_comms_op(event)
            args = get("args")
            stream = corr = NO_ID
            if args.__class__ is dict:
                value = args.get("original_stream")
                if value is None:
                    value = args.get("stream")
                if value is not None:
                    stream = value if value.__class__ is int else stream_of(value)
                value = args.get("correlation")
                if value is not None:
                    corr = value if value.__class__ is int else _id_of(value)
            if not (ID_LOW <= stream < ID_HIGH and ID_LOW <= corr < ID_HIGH):  # (integers beyond 64 bits: no id)
                stream, corr = (stream if ID_LOW <= stream < ID_HIGH else NO_ID), (corr if ID_LOW <= corr < ID_HIGH else NO_ID)
            if stream == NO_ID and corr == NO_ID and not (name.__class__ is str and "ProfilerStep" in name):
                plain_ts(ts)
                plain_dur(dur)
                plain_slot(slot)
                if len(plain_rows) >= PLAIN_BLOCK:
                    spill()
                return
            if cat in evidence_cats:
                rank = args.get("rank") if args.__class__ is dict else None
                if rank.__class__ is int and rank >= 0:
                    pids[slot].arg_ranks.add(rank)
                    add_ranked(spilled_rows[0] + len(rows))
                    add_rank(rank)
                else:
                    unranked[slot] = 1
            name_id = names.get(name)
            if name_id is None:
                name_id = names[name] = len(names)
            cat_id = cats.get(cat)
            if cat_id is None:
                cat_id = cats[cat] = len(cats)
            add_ts(ts)
            add_dur(dur)
            add_stream(stream)
            add_corr(corr)
            add_name(name_id)
            add_cat(cat_id)
            add_slot(slot)
            if len(rows) >= WORK_BLOCK:
                spill_work()

        return visit
