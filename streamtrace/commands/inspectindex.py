"""``inspect``'s one pass: :class:`InspectVisitor` counts what a trace holds (kinds, pids,
steps, kernels, ids, secrets) and the GPU busy time per pid, event by event or a chunk's columns at a time."""
from __future__ import annotations

import math
from array import array
from collections import Counter, defaultdict
from functools import partial
from itertools import compress, repeat
from operator import add, attrgetter, is_not, not_
from typing import Any, Callable, Iterable, Optional, Union

import msgspec
import numpy as np

from ..algo.busy import BusyTime
from ..algo.columns import in_sorted
from ..algo.corrset import CorrelationSet
from ..algo.pp import parse_pp_name
from ..algo.ranks import rank_from_args
from ..algo.secrets import Findings, SecretFinder
from ..algo.steps import STEP_NAME
from ..io.projection import ProjectedChunk, Projection
from ..io.redact import Redactor
from ..io.runspill import RunSpill, SpilledRuns
from ..kineto import GPU_CATEGORIES, NUMBER_TYPES, RUNTIME_CATEGORIES
from .mergedindex import RankIndex

CPU_CATEGORIES = frozenset({"cpu_op", "user_annotation", "python_function", "cuda_runtime", "cuda_driver"})
ANNOTATION_CATEGORIES = frozenset({"user_annotation", "gpu_user_annotation"})

GPU_SIDE_CATEGORIES = GPU_CATEGORIES | {"gpu_user_annotation"}
PP_PREFIXES = ("PP:", "Forward ", "Backward ")
KERNEL_CATEGORIES = frozenset({"kernel", "Kernel"})
KERNEL_NAMES = 100_000
OTHER_KERNELS = "(other kernel names)"
TOP_KERNELS = 10
STEP_PREFIX = "ProfilerStep#"
TIME_SCALE = float(1 << 72)


class ChunkArgs(msgspec.Struct, gc=False):
    """The members of ``args`` inspect reads."""

    correlation: Optional[int] = None
    rank: Any = None


class ChunkEvent(msgspec.Struct, gc=False):
    """The members of an event inspect reads, in the types the plain events
    have: an event without one of the first four, or with a member of
    another type, makes the decoder refuse the chunk (it goes the dict way)."""

    ph: str
    cat: str
    pid: Union[int, str]
    ts: Union[int, float]
    dur: Union[int, float, None] = None
    name: Optional[str] = None
    tid: Union[int, str, None] = None
    args: Optional[ChunkArgs] = None



class InspectVisitor:
    """Pass-1 visitor for ``inspect``.

    ``visit`` runs once per event, so it is a closure over local variables
    with one dict update on the common path; rarer work (GPU events,
    launches, annotations, metadata, a pid's first events) is dispatched.

    Pass-1 workers may index ranges of events (:meth:`take_part`,
    :meth:`absorb`): counts add up, sets join, GPU slices reach the busy-time
    sweep in event order, and a GPU event's graph launch is judged against
    what the events before its range launched.
    """

    splits_by_ranges = True
    partial = False  # True where it indexes parts: keep what only the joined index can decide
    projection = Projection(ChunkEvent)  # what visit_projected reads

    def __init__(self, secrets: SecretFinder | None = None, spool_dir: str | None = None) -> None:
        self.busy_spill = RunSpill(spool_dir)  # busy time's runs beyond what memory keeps
        self.rank_evidence = RankIndex()  # what relink, split and attribute decide ranks by (SPEC 6)
        self.secrets = Redactor(secrets, replace=False) if secrets is not None else None
        if self.secrets is not None:
            self.scan_batch = self.secrets.scan_batch  # the engine hands it each batch's text
            self.screen_batch = self.secrets.finder.suspicious  # ... and may run this first test elsewhere
        self.counts: dict[tuple, int] = {}
        self.span = [float("inf"), float("-inf")]
        self._sent_keys: set[tuple] = set()  # keys counted in parts already taken
        self._clear()
        handlers = {cat: self._gpu for cat in GPU_CATEGORIES}
        handlers.update({cat: self._runtime for cat in RUNTIME_CATEGORIES})
        handlers.update({cat: self._annotation for cat in ANNOTATION_CATEGORIES})
        handlers["cpu_op"] = self._cpu_op
        handlers[None] = self._metadata
        self.visit = self._make_visit(handlers)

    def _clear(self) -> None:
        """Everything but the counts and the span, which the hot loop holds, as before the first event."""
        self.key_ranks: dict[tuple, int] = {}  # the args.rank of each (ph, cat, pid)'s first event, if any
        self.pid_names: dict[object, str] = {}
        self.pid_rank_args: dict[object, int] = {}
        self.streams: dict[object, set] = defaultdict(set)
        self.launches: dict[object, CorrelationSet] = defaultdict(CorrelationSet)
        self.any_launch = CorrelationSet()
        self.launch_count = 0
        self.graph_launches: dict[tuple, int] = {}
        self.graph_correlations: set = set()
        self.graph_gpu: dict[tuple, int] = defaultdict(int)
        self.undecided = _Undecided()  # GPU events whose launch is not known to be a graph launch (yet)
        self.pp_counts: dict[tuple, int] = defaultdict(int)
        self.bad_ts = 0
        self.busy: dict[object, BusyTime] = {}
        self.kernels: dict[object, list] = {}  # name -> [count, total dur in units of 2**-72 us, odd total]
        self.steps: dict[object, tuple[array, array, array]] = {}  # pid -> ProfilerStep numbers, starts, ends
        self._graph_ids = np.zeros(0, dtype=np.int64)  # the graph correlations that are 64-bit integers, sorted
        self._graph_fresh: list = []  # graph correlations added since that array was made
        if self.secrets is not None:
            self.secrets.findings = Findings()

    def _make_visit(self, handlers: dict) -> Callable[[dict], None]:
        counts = self.counts
        span = self.span
        count_kind = self._count_kind
        odd_event = self._odd_event

        def visit(event: dict) -> None:
            try:
                ph = event["ph"]
                cat = event["cat"]
                key = (ph, cat, event["pid"])
                ts = event["ts"]
                end = ts + event["dur"] if ph == "X" else ts
                if ts < span[0]:
                    span[0] = ts
                if end > span[1]:
                    span[1] = end
            except (KeyError, TypeError):
                odd_event(event)
                return
            count = counts.get(key)
            counts[key] = count_kind(key, event) if count is None else count + 1
            if cat in handlers:
                handlers[cat](event)

        self._handlers = handlers
        return visit

    def _count_kind(self, key: tuple, event: dict) -> int:
        """First event of a (ph, cat, pid): look for ``args.rank`` (on all events or none)."""
        rank = rank_from_args(event.get("args"))
        if rank is not None:
            self.key_ranks[key] = rank
            self.pid_rank_args.setdefault(key[2], rank)
        return 1

    def _odd_event(self, event: dict) -> None:
        """The careful path, for events lacking a field the fast path reads."""
        ph, cat = event.get("ph"), event.get("cat")
        key = (ph, cat, event.get("pid"))
        count = self.counts.get(key)
        self.counts[key] = self._count_kind(key, event) if count is None else count + 1
        ts = event.get("ts")
        if type(ts) in NUMBER_TYPES:
            dur = event.get("dur") if ph == "X" else None
            end = ts + dur if type(dur) in NUMBER_TYPES else ts
            self.span[0] = min(self.span[0], ts)
            self.span[1] = max(self.span[1], end)
        elif ph != "M":
            self.bad_ts += 1
        handler = self._handlers.get(cat)
        if handler is not None:
            handler(event)

    def _gpu(self, event: dict) -> None:
        self._rank_evidence(event)
        pid = event.get("pid")
        self.streams[pid].add(event.get("tid"))
        ts, dur = event.get("ts"), event.get("dur")
        if event.get("ph") == "X" and ts.__class__ in NUMBER_TYPES and dur.__class__ in NUMBER_TYPES and dur >= 0:
            self._time_slice(pid, event, float(ts), float(dur))
        correlation = _correlation(event)
        if correlation is None:
            return
        if correlation in self.graph_correlations:
            self.graph_gpu[(pid, correlation)] += 1
        else:
            launched = correlation in self.any_launch
            if self.partial or not launched:  # (launched, and not by a graph launch: not a graph's event)
                self.undecided.add(pid, correlation, launched)

    def _time_slice(self, pid: object, event: dict, ts: float, dur: float) -> None:
        """Busy time of the pid; count and total time of a kernel's name."""
        self._busy_of(pid).add(ts, ts + dur)
        if event.get("cat") in KERNEL_CATEGORIES:
            name = event.get("name")
            self._add_kernels(name if name.__class__ is str else str(name), 1, *_exact_total(dur))

    def _busy_of(self, pid: object) -> BusyTime:
        """The busy time of a GPU pid, whose runs go to disk beyond what memory keeps."""
        busy = self.busy.get(pid)
        if busy is None:
            busy = self.busy[pid] = BusyTime(runs=partial(SpilledRuns, self.busy_spill))
        return busy

    def _add_kernels(self, name: str, count: int, total: int, odd: float) -> None:
        """Count and total time of a kernel name (totals add exactly, in any order)."""
        stats = self.kernels.get(name)
        if stats is None:
            if len(self.kernels) >= KERNEL_NAMES:  # hostile input: one name per kernel
                name = OTHER_KERNELS
            stats = self.kernels.setdefault(name, [0, 0, 0.0])
        stats[0] += count
        stats[1] += total
        stats[2] += odd

    def _runtime(self, event: dict) -> None:
        self._rank_evidence(event)
        correlation = _correlation(event)
        if correlation is None:
            return
        pid = event.get("pid")
        self.launch_count += 1
        self.launches[pid].add(correlation)
        self.any_launch.add(correlation)
        name = event.get("name")
        if name.__class__ is str and "GraphLaunch" in name:
            self.graph_launches[(pid, correlation)] = self.graph_launches.get((pid, correlation), 0) + 1
            self._add_graph_correlations((correlation,))

    def _annotation(self, event: dict) -> None:
        name = event.get("name")
        if name.__class__ is str and name.startswith(PP_PREFIXES):
            side = "gpu" if event.get("cat") == "gpu_user_annotation" else "cpu"
            for action in parse_pp_name(name):
                self.pp_counts[(side, action.op)] += 1
        elif name.__class__ is str and name.startswith(STEP_PREFIX) and event.get("cat") == "user_annotation":
            self._step(event.get("pid"), name, event.get("ph"), event.get("ts"), event.get("dur"))

    def _cpu_op(self, event: dict) -> None:
        name = event.get("name")
        if name.__class__ is str and name.startswith(STEP_PREFIX):
            self._step(event.get("pid"), name, event.get("ph"), event.get("ts"), event.get("dur"))

    def _step(self, pid: object, name: str, ph: object, ts: object, dur: object) -> None:
        """A ``ProfilerStep#N`` span of a pid (as ``slice`` reads steps)."""
        match = STEP_NAME.match(name)
        if match is None or ph != "X" or ts.__class__ not in NUMBER_TYPES or dur.__class__ not in NUMBER_TYPES \
                or not dur >= 0 or len(match.group(1)) > 18:
            return
        steps = self.steps.get(pid)
        if steps is None:
            steps = self.steps[pid] = (array("q"), array("d"), array("d"))
        start = float(ts)
        steps[0].append(int(match.group(1)))
        steps[1].append(start)
        steps[2].append(start + float(dur))

    def _rank_evidence(self, event: dict) -> None:
        """A launch or GPU event as rank evidence; the first of its pid's is
        numbered as relink numbers it (events visited before it)."""
        evidence = self.rank_evidence
        pid = event.get("pid")
        slot = evidence.pid_slots.get(pid if pid.__class__ in (int, str) else str(pid))
        first = slot is None or evidence.pids[slot].first_work is None
        evidence.handlers[event.get("cat")](event)
        if first:
            slot = evidence.pid_slots.get(pid if pid.__class__ in (int, str) else str(pid))
            if slot is not None and evidence.pids[slot].first_work is not None:
                evidence.pids[slot].first_work = sum(self.counts.values()) - 1

    def _metadata(self, event: dict) -> None:
        self.rank_evidence.metadata(event)
        if event.get("ph") == "M" and event.get("name") == "process_name":
            args = event.get("args")
            if isinstance(args, dict) and isinstance(args.get("name"), str):
                self.pid_names[event.get("pid")] = args["name"]

    def visit_projected(self, chunk: ProjectedChunk) -> bool:
        """Index a chunk's events as :meth:`visit` would, from a projection
        (:class:`ChunkEvent`) and a pass over each field with C-level loops
        and numpy; False (having changed nothing) for a chunk to visit as
        dicts: odd members, or text the secret rules flag."""
        if self.secrets is not None and self.screen_batch(chunk.text, chunk.folded):
            return False
        return self._visit_projected(chunk.events)

    def _visit_projected(self, events: list["ChunkEvent"]) -> bool:
        """Index projected events; False (having changed nothing) when one of
        them is not plain: the caller then visits the chunk's dicts."""
        phs, cats, ts = list(map(_PH, events)), list(map(_CAT, events)), list(map(_TS, events))
        try:
            first, last = (min(ts), _last_end(phs, ts, events)) if ts else (math.inf, -math.inf)
        except TypeError:  # an "X" event without a duration
            return False
        kinds = {cat: _HANDLED.get(cat, 0) for cat in set(cats)}
        codes = np.fromiter(map(kinds.__getitem__, cats), dtype=np.int8, count=len(cats)) \
            if any(kinds.values()) else np.zeros(0, dtype=np.int8)
        gpu, runtime, notes, ops = (np.flatnonzero(codes == kind).tolist() for kind in (_GPU, _RUNTIME, _NOTE, _OP))
        gpu_events = list(map(events.__getitem__, gpu))
        launched = self._launched(events, gpu, gpu_events, runtime)
        if launched is None:
            return False
        if gpu or runtime:
            self._chunk_rank_evidence(events, gpu, gpu_events, runtime, codes)
        self._count_chunk(events, phs, cats)
        if first < self.span[0]:
            self.span[0] = first
        if last > self.span[1]:
            self.span[1] = last
        if gpu:
            self._gpu_chunk(gpu_events, launched)
        if runtime:
            self._runtime_chunk(events, runtime, launched)
        if notes and self._notes_chunk(events, notes, cats):
            ops = sorted(ops + [at for at in notes if cats[at] == "user_annotation"])
        for at in ops:
            event = events[at]
            if event.name.__class__ is str and event.name.startswith(STEP_PREFIX):
                self._step(event.pid, event.name, event.ph, event.ts, event.dur)
        return True

    def _chunk_rank_evidence(self, events: list["ChunkEvent"], gpu: list[int], gpu_events: list["ChunkEvent"],
                             runtime: list[int], codes: np.ndarray) -> None:
        """A chunk's launches and GPU events as rank evidence; of the GPU pids
        whose samples are complete, only the ranks (most GPU events)."""
        evidence = self.rank_evidence
        full = evidence.sampled_pids()
        if full and gpu:
            done = list(map(full.__contains__, map(_PID, gpu_events)))
            evidence.record_sampled_gpu(list(compress(gpu_events, done)))
            gpu = list(compress(gpu, map(not_, done)))
        work = sorted(gpu + runtime) if gpu and runtime else gpu or runtime
        if work:
            evidence.record_chunk_work(list(map(events.__getitem__, work)), codes[work] == _RUNTIME,
                                       np.array(work, dtype=np.int64), sum(self.counts.values()))

    def _notes_chunk(self, events: list["ChunkEvent"], notes: list[int], categories: list) -> bool:
        """Pipeline actions of a chunk's annotations, each distinct (category,
        name) parsed once; True when a user annotation may be a step."""
        steps = False
        named = Counter(zip(map(categories.__getitem__, notes), map(_NAME, map(events.__getitem__, notes))))
        for (category, name), count in named.items():
            if name.__class__ is not str:
                continue
            if name.startswith(PP_PREFIXES):
                side = "gpu" if category == "gpu_user_annotation" else "cpu"
                for action in parse_pp_name(name):
                    self.pp_counts[(side, action.op)] += count
            elif category == "user_annotation" and name.startswith(STEP_PREFIX):
                steps = True
        return steps

    def _count_chunk(self, events: list["ChunkEvent"], phases: list, categories: list) -> None:
        """Events per (ph, cat, pid); ``args.rank`` of a new key's first event
        (the keys are listed only then: most chunks bring no new key)."""
        counts, sent = self.counts, self._sent_keys
        found = Counter(zip(phases, categories, map(_PID, events)))
        firsts = None
        for key, count in found.items():
            have = counts.get(key)
            if have is not None:
                counts[key] = have + count
                continue
            counts[key] = count
            if key in sent:  # the joined index knows it from an earlier part: its first event is not here
                continue
            if firsts is None:
                keys = list(zip(phases, categories, map(_PID, events)))
                firsts = dict(zip(reversed(keys), range(len(keys) - 1, -1, -1)))
            args = events[firsts[key]].args
            rank = None if args is None else args.rank
            if type(rank) is int and rank >= 0:
                self.key_ranks[key] = rank
                self.pid_rank_args.setdefault(key[2], rank)

    def _launched(self, events: list["ChunkEvent"], gpu: list[int], gpu_events: list["ChunkEvent"],
                  runtime: list[int]) -> dict | None:
        """For the GPU events (at ``gpu``: ``gpu_events``) with a correlation
        id: their positions, pids and ids, and whether a graph launch
        (``graph``), or any launch (``launched``), of their id came before
        them; the same for the launches.  None when an id is not a 64-bit
        integer."""
        def ids(positions: list[int], chosen: list["ChunkEvent"]) -> tuple[list[int], list, np.ndarray] | None:
            args = list(map(_ARGS, chosen))
            if None in args:  # (GPU annotations have no args: events without an id are left out)
                kept = list(map(is_not, args, repeat(None)))
                positions, chosen, args = (list(compress(column, kept)) for column in (positions, chosen, args))
            values = list(map(_CORRELATION, args))
            if None in values:
                kept = list(map(is_not, values, repeat(None)))
                positions, chosen, values = (list(compress(column, kept)) for column in (positions, chosen, values))
            if values and (min(values) < -(1 << 63) or max(values) >= 1 << 63):
                return None
            return positions, list(map(_PID, chosen)), np.array(values, dtype=np.int64)

        kernels, launches = ids(gpu, gpu_events), ids(runtime, list(map(events.__getitem__, runtime)))
        if kernels is None or launches is None:
            return None
        at, _, correlation = kernels
        at = np.array(at, dtype=np.int64)
        graph = in_sorted(correlation, self._graph_array())
        launched = self.any_launch.contains_each(correlation)
        graph_positions = [position for position in launches[0]
                           if events[position].name.__class__ is str and "GraphLaunch" in events[position].name]
        for positions, known in ((launches[0], launched), (graph_positions, graph)):
            if positions and len(at):
                values = np.array([events[position].args.correlation for position in positions], dtype=np.int64)
                keys, first = np.unique(values, return_index=True)  # each id's first launch in the chunk
                place = np.minimum(np.searchsorted(keys, correlation), len(keys) - 1)
                known |= (keys[place] == correlation) & (np.array(positions, dtype=np.int64)[first][place] < at)
        return {"gpu": kernels, "graph": graph, "launched": launched, "launches": launches,
                "graph_positions": graph_positions}

    def _add_graph_correlations(self, correlations: Iterable) -> None:
        """Graph launches' ids; the new ones wait to be merged into :meth:`_graph_array`."""
        fresh = [value for value in correlations if value not in self.graph_correlations]
        self.graph_correlations.update(fresh)
        self._graph_fresh += fresh

    def _graph_array(self) -> np.ndarray:
        """The graph launches' ids that are 64-bit integers, sorted: the ids
        that came since the last call merged in (parts bring a few each,
        and a rebuild per part would sort them all again)."""
        if self._graph_fresh:
            fresh = np.unique(np.array([value for value in self._graph_fresh if type(value) is int
                                        and -(1 << 63) <= value < (1 << 63)], dtype=np.int64))
            self._graph_ids = np.insert(self._graph_ids, np.searchsorted(self._graph_ids, fresh), fresh)
            self._graph_fresh = []
        return self._graph_ids

    def _gpu_chunk(self, chosen: list["ChunkEvent"], launched: dict) -> None:
        """Streams, busy time, kernel names and graph launches of a chunk's GPU events."""
        streams = self.streams
        for pid, tid in dict.fromkeys(zip(map(_PID, chosen), map(_TID, chosen))):
            streams[pid].add(tid)
        timed = np.array(list(map("X".__eq__, map(_PH, chosen))), dtype=bool)
        if timed.all():
            slices = chosen
        else:  # (the "X" events all have a numeric dur: _visit_projected checked)
            slices = list(compress(chosen, timed))
        starts = np.array(list(map(_TS, slices)), dtype=np.float64)
        durations = np.array(list(map(_DUR, slices)), dtype=np.float64)
        if not (durations >= 0).all():
            kept = durations >= 0
            slices, starts, durations = list(compress(slices, kept)), starts[kept], durations[kept]
        ends = starts + durations
        pids = list(map(_PID, slices))
        owners = dict.fromkeys(pids)
        for pid in owners:
            mine = slice(None) if len(owners) == 1 else np.array([other == pid for other in pids], dtype=bool)
            self._busy_of(pid).extend(array("d", starts[mine].tobytes()), array("d", ends[mine].tobytes()))
        is_kernel = list(map(KERNEL_CATEGORIES.__contains__, map(_CAT, slices)))
        names = list(compress(map(_NAME, slices), is_kernel))
        if not set(map(type, names)) <= _STRINGS:
            names = [name if name.__class__ is str else str(name) for name in names]
        self._add_kernel_totals(names, durations[np.array(is_kernel, dtype=bool)] * TIME_SCALE)
        _, pids, correlation = launched["gpu"]
        if not len(correlation):
            return
        kinds, codes = _pid_codes(pids)
        graph = launched["graph"]
        if graph.any():
            self._count_graph_gpu(kinds, codes[graph], correlation[graph])
        kept = ~graph if self.partial else ~graph & ~launched["launched"]
        self.undecided.add_each(kinds, codes[kept], correlation[kept], launched["launched"][kept])

    def _add_kernel_totals(self, names: list[str], scaled: np.ndarray) -> None:
        """Count and exact total (a sum of whole 2**-72 us) of each kernel name,
        from the names and durations (scaled by TIME_SCALE) of a chunk's
        kernels: grouped by numpy, summed as Python integers in C calls."""
        if not names:
            return
        distinct = {name: number for number, name in enumerate(dict.fromkeys(names))}
        codes = np.fromiter(map(distinct.__getitem__, names), dtype=np.intp, count=len(names))
        order = np.argsort(codes, kind="stable")
        counts = np.bincount(codes)
        ends = np.cumsum(counts).tolist()
        fixed = list(map(int, scaled[order].tolist()))
        start = 0
        for name, count, end in zip(distinct, counts.tolist(), ends):
            self._add_kernels(name, count, sum(fixed[start:end]), 0.0)
            start = end

    def _runtime_chunk(self, events: list["ChunkEvent"], runtime: list[int], launched: dict) -> None:
        """Launch counts and ids of a chunk's launches, its graph launches."""
        _, pids, correlation = launched["launches"]
        self.launch_count += len(pids)
        kinds, codes = _pid_codes(pids)
        for code, pid in enumerate(kinds):
            self.launches[pid].add_each(correlation if len(kinds) == 1 else correlation[codes == code])
        self.any_launch.add_each(correlation)
        for at in launched["graph_positions"]:
            key = (events[at].pid, events[at].args.correlation)
            self.graph_launches[key] = self.graph_launches.get(key, 0) + 1
            self._add_graph_correlations((key[1],))

    def take_part(self) -> dict:
        """What was indexed since the last part (see :mod:`streamtrace.engine.indexworkers`)."""
        part = {"counts": dict(self.counts), "key_ranks": self.key_ranks, "pid_names": self.pid_names,
                "streams": dict(self.streams), "launches": {pid: ids.export() for pid, ids in self.launches.items()},
                "launch_count": self.launch_count, "graph_launches": self.graph_launches,
                "graph_correlations": self.graph_correlations, "graph_gpu": dict(self.graph_gpu),
                "undecided": self.undecided, "pp_counts": dict(self.pp_counts), "span": tuple(self.span),
                "bad_ts": self.bad_ts, "busy": {pid: busy.take_part() for pid, busy in self.busy.items()},
                "kernels": self.kernels, "steps": self.steps, "rank_evidence": self.rank_evidence.take_part(),
                "findings": self.secrets.findings if self.secrets is not None else None}
        self._sent_keys.update(self.counts)
        self.counts.clear()  # (in place: the hot loop holds them)
        self.span[:] = [float("inf"), float("-inf")]
        self._clear()
        self.partial = True
        return part

    def absorb(self, part: dict, source: int, first_event: int) -> None:
        """Add a worker's part; parts come in event order."""
        counts, key_ranks = self.counts, part["key_ranks"]
        for key, count in part["counts"].items():
            have = counts.get(key)
            if have is None:
                counts[key] = count
                if key in key_ranks:
                    self.key_ranks[key] = key_ranks[key]
                    self.pid_rank_args.setdefault(key[2], key_ranks[key])
            else:
                counts[key] = have + count
        self._judge(part["undecided"])  # against the launches before the part, so first
        self.rank_evidence.absorb(part["rank_evidence"], source, first_event)
        self.pid_names.update(part["pid_names"])
        for pid, tids in part["streams"].items():
            self.streams[pid] |= tids
        for pid, exported in part["launches"].items():
            self.launches[pid].update_exported(exported)
            self.any_launch.update_exported(exported)
        self.launch_count += part["launch_count"]
        for key, count in part["graph_launches"].items():
            self.graph_launches[key] = self.graph_launches.get(key, 0) + count
        self._add_graph_correlations(part["graph_correlations"])
        for key, count in part["graph_gpu"].items():
            self.graph_gpu[key] += count
        for key, count in part["pp_counts"].items():
            self.pp_counts[key] += count
        first, last = part["span"]
        if first < self.span[0]:
            self.span[0] = first
        if last > self.span[1]:
            self.span[1] = last
        self.bad_ts += part["bad_ts"]
        for pid, (starts, ends, slices) in part["busy"].items():
            self._busy_of(pid).extend(starts, ends, slices)
        for name, (count, total, odd) in part["kernels"].items():
            self._add_kernels(name, count, total, odd)
        for pid, columns in part["steps"].items():
            steps = self.steps.setdefault(pid, (array("q"), array("d"), array("d")))
            for mine, theirs in zip(steps, columns):
                mine.extend(theirs)
        if self.secrets is not None:
            self.secrets.findings.absorb(part["findings"], first_event)

    def _judge(self, undecided: "_Undecided") -> None:
        """A part's GPU events without a graph launch before them in the part:
        counted when one came before the part, dropped when a launch that is
        not a graph launch did, else left for :meth:`settle`."""
        correlations = np.frombuffer(undecided.correlations, dtype=np.int64)
        in_graph = in_sorted(correlations, self._graph_array())
        positions = np.frombuffer(undecided.positions, dtype=np.int32)
        if in_graph.any():
            self._count_graph_gpu(undecided.pids, positions[in_graph], correlations[in_graph])
        waiting = ~in_graph & (np.frombuffer(undecided.launched, dtype=np.uint8) == 0)
        waiting &= ~self.any_launch.contains_each(correlations)
        for at in np.flatnonzero(waiting).tolist():
            self.undecided.add(undecided.pids[positions[at]], int(correlations[at]), False)
        for pid, correlation, launched in undecided.odd:
            if correlation in self.graph_correlations:
                self.graph_gpu[(pid, correlation)] += 1
            elif not launched and correlation not in self.any_launch:
                self.undecided.add(pid, correlation, False)

    def _count_graph_gpu(self, pids: list, codes: np.ndarray, correlations: np.ndarray) -> None:
        """Count GPU events of graph launches: ``pids[codes[n]]``, ``correlations[n]``."""
        for code in np.unique(codes).tolist():
            values, times = np.unique(correlations[codes == code], return_counts=True)
            pid = pids[code]
            for value, count in zip(values.tolist(), times.tolist()):
                self.graph_gpu[(pid, value)] += count

    def settle(self) -> None:
        """Count the undecided GPU events whose graph launch came later."""
        graph = self.graph_correlations
        pids = self.undecided.pids
        for position, correlation in zip(self.undecided.positions, self.undecided.correlations):
            if correlation in graph:
                self.graph_gpu[(pids[position], correlation)] += 1
        for pid, correlation, _ in self.undecided.odd:
            if correlation in graph:
                self.graph_gpu[(pid, correlation)] += 1


class _Undecided:
    """GPU events (pid, correlation id) whose fate waits on launches not
    seen yet, and whether a launch that is not a graph launch came first."""

    def __init__(self) -> None:
        self.pids: list = []
        self.positions = array("i")  # in pids
        self.correlations = array("q")
        self.launched = bytearray()
        self.odd: list[tuple] = []  # ids that are not 64-bit integers: (pid, id, launched)
        self._last = (None, -1)

    def add_each(self, pids: list, codes: np.ndarray, correlations: np.ndarray, launched: np.ndarray) -> None:
        """:meth:`add` for each event: ``pids[codes[n]]``, ``correlations[n]`` (int64), ``launched[n]``."""
        if not len(codes):
            return
        positions = []
        for pid in pids:
            if pid not in self.pids:
                self.pids.append(pid)
            positions.append(self.pids.index(pid))
        self.positions.frombytes(np.array(positions, dtype=np.int32)[codes].tobytes())
        self.correlations.frombytes(correlations.tobytes())
        self.launched += launched.astype(np.uint8).tobytes()

    def add(self, pid: object, correlation: object, launched: bool) -> None:
        if type(correlation) is not int or not -(1 << 63) <= correlation < (1 << 63):
            self.odd.append((pid, correlation, launched))
            return
        if self._last[0] != pid or self._last[1] < 0:
            try:
                self._last = (pid, self.pids.index(pid))
            except ValueError:
                self._last = (pid, len(self.pids))
                self.pids.append(pid)
        self.positions.append(self._last[1])
        self.correlations.append(correlation)
        self.launched.append(launched)


def _correlation(event: dict) -> object:
    """A parsed event's ``args.correlation`` (None without an args object or that member)."""
    args = event.get("args")
    return args.get("correlation") if args.__class__ is dict else None


def _last_end(phases: list, starts: list, events: list["ChunkEvent"]) -> object:
    """The latest end of projected events (ts + dur of an "X" event, the ts
    of another) as one max() over them all gives it, from C-level maxima of
    the two kinds (a tie between them is taken the long way: the first in
    event order wins); TypeError for an "X" event without a duration."""
    timed = list(map("X".__eq__, phases))
    durations = map(_DUR, events)
    if all(timed):
        return max(map(add, starts, durations))
    ends = max(map(add, compress(starts, timed), compress(durations, timed)), default=None)
    others = max(compress(starts, map(not_, timed)), default=None)
    if ends is None or others is None:
        return others if ends is None else ends
    if ends == others:
        return max(start + event.dur if slice_ else start for slice_, start, event in zip(timed, starts, events))
    return ends if ends > others else others


def _pid_codes(pids: list) -> tuple[list, np.ndarray]:
    """The distinct pids in the order they first come, and each pid's number
    among them (a chunk's GPU events or launches mostly share one pid)."""
    kinds = list(dict.fromkeys(pids))
    if len(kinds) == 1:
        return kinds, np.zeros(len(pids), dtype=np.int32)
    return kinds, np.array(_codes(pids), dtype=np.int32)


def _codes(values: list) -> list[int]:
    """Each value's number, in the order values first come."""
    numbers: dict = {}
    return [numbers.setdefault(value, len(numbers)) for value in values]


_GPU, _RUNTIME, _NOTE, _OP = 1, 2, 3, 4
_STRINGS = {str}
_PH, _CAT, _TS, _DUR, _PID, _TID, _NAME, _ARGS, _CORRELATION = map(
    attrgetter, ("ph", "cat", "ts", "dur", "pid", "tid", "name", "args", "correlation"))
_HANDLED = {**{cat: _GPU for cat in GPU_CATEGORIES}, **{cat: _RUNTIME for cat in RUNTIME_CATEGORIES},
            **{cat: _NOTE for cat in ANNOTATION_CATEGORIES}, "cpu_op": _OP}


def _exact_total(dur: float) -> tuple[int, float]:
    """A duration as a whole number of 2**-72 us (exact from 2**-20 us up, so
    totals add the same in any order), or as an odd float when not finite."""
    return (int(dur * TIME_SCALE), 0.0) if dur < math.inf else (0, dur)
