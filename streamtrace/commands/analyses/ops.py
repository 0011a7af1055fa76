"""``analyze --ops``: TraceLens's perf-report tables (ops and kernels), from
typed arrays (a few numbers per host or GPU event, interned names and op
signatures) rather than event dicts, collected in analyze's pass 1
(:class:`OpsCollector` in :class:`.index.AnalyzeIndex`) and split by rank
once pass 1 has found the ranks.
"""
from __future__ import annotations

import csv
import io
import math
import os
import re
import tempfile
from array import array
from collections.abc import Callable
from dataclasses import dataclass, field
from decimal import Decimal
from functools import partial
from typing import IO

import numpy as np
import orjson

from ...algo import collectives, gpuspecs, iterannotation, opsfigures, opsreport, opsroofline, opstables, optree
from ...algo.opstables import CPU_OP, KERNEL, MEMCPY, MEMSET, RUNTIME, OpsFacts, Table
from ...algo.optree import NO_LINK
from ...engine.passes import read_with_retries
from ...errors import TraceError
from ...io.configfiles import load_spec
from ...io.destinations import Destinations
from ...io.jsonscan import member_value
from ...io.projection import OP_SIGNATURE_ARGS
from ...io.reader import TraceReader
from ...io.scratch import mapped_array, park_arrays, release_mapped_pages
from ...io.source import InputSource
from ...kineto import GPU_CATEGORIES, RUNTIME_CATEGORIES
from ...resources import gc_paused, trim_heap
from .collectives import KernelCollector, csv_text

HOST_CATS = {"cpu_op": CPU_OP, "cuda_runtime": RUNTIME, "cuda_driver": RUNTIME}
GPU_CATS = {"kernel": KERNEL, "gpu_memcpy": MEMCPY, "gpu_memset": MEMSET}
MODEL_ARGS = OP_SIGNATURE_ARGS  # what the performance models read
SIGNATURE_ARGS = MODEL_ARGS[:4]  # what ops_unique_args groups by
# metadata event name -> the args member holding its value (TraceLens reads these three)
METADATA = {"process_name": "name", "process_labels": "labels", "thread_name": "name"}
RANK_EVIDENCE = GPU_CATEGORIES | RUNTIME_CATEGORIES  # the events whose own args.rank places them (analyze's rule)
# the names merge gives processes and threads (``rank 3 | process 9 | <the input's name>``), and the input's own name in them
MERGE_PROCESS_NAME = re.compile(r"(?:PP rank \d+ \(global rank \d+\)|rank \d+) \| (?:GPU|process [^|]*?)(?: \| (?P<own>.*))?",
                                re.DOTALL)
MERGE_THREAD_NAME = re.compile(r"(?:PP rank|rank) \d+ \| (?P<own>.*)", re.DOTALL)
MERGE_TRACE_NAME = "streamtrace merge of "


def _number(value: object) -> int | float | None:
    """A time as TraceLens reads it (orjson: ints stay ints); None if absent or not a number."""
    if isinstance(value, bool) or value is None:
        return None
    if isinstance(value, Decimal):
        return int(value) if value == value.to_integral_value() and "." not in str(value) else float(value)
    return value if isinstance(value, (int, float)) else None


def _tupled(value: object) -> object:
    return tuple(_tupled(item) for item in value) if isinstance(value, list) else value


def _key(value: object) -> object:
    """A hashable id (lists and dicts are no ids TraceLens could match)."""
    return value if isinstance(value, (int, str, float)) and not isinstance(value, bool) else None


NUMBERS = (int, float)
KEYS = (int, str)  # ids kept as they are (anything else by _key)
LINK_LOW, LINK_HIGH = -(1 << 62), 1 << 62  # ids kept as they are (beyond: numbered above them, by _link)


MAPPED_BUDGET = 48 << 20  # file pages the tables' process keeps resident before it gives the mapped ones back
SPILL_ROWS = 1 << 16  # rows of a group of columns held in memory before they go to its temporary files


class _Columns:
    """Typed columns appended an event at a time (8 bytes a value, or 1), held in memory up to a block
    and then appended to a temporary file per column (:meth:`spill`), so that pass 1 holds a block."""

    def __init__(self, **codes: str) -> None:
        self.arrays = {name: array(code) for name, code in codes.items()}
        self._files: dict[str, IO[bytes]] = {}  # the spilled rows of each column (unnamed files)

    def __len__(self) -> int:
        return len(next(iter(self.arrays.values())))

    def spill(self, directory: str | None) -> None:
        """Append the rows held to the columns' files: unnamed, so that no exit path leaves them behind."""
        for name, column in self.arrays.items():
            file = self._files.get(name)
            if file is None:
                file = self._files[name] = tempfile.TemporaryFile(prefix="streamtrace-ops-", dir=directory)
            column.tofile(file)
            del column[:]

    def take(self, name: str) -> np.ndarray:
        """A column as numpy, its typed array emptied: a read-only array over a map of its file once spilled
        (the file closed: it goes with the map), else a copy (one column at a time is held twice, not all)."""
        column = self.arrays[name]
        file = self._files.pop(name, None)
        if file is None:
            taken = np.frombuffer(column, dtype=column.typecode).copy() if len(column) else np.empty(0, column.typecode)
            del column[:]
            return taken
        with file:
            column.tofile(file)
            del column[:]
            file.flush()
            if not file.tell():
                return np.empty(0, column.typecode)
            return mapped_array(file, column.typecode)


_NO_RUN = object()  # (no run counted yet)
_NO_PID = object()  # (the pid of an element that is no object)


def _pid_key(pid: object) -> object:
    """A pid as analyze keys it (ints and strings as they are, anything else by its text)."""
    return pid if pid.__class__ in KEYS else str(pid)


def _ints(column: array) -> np.ndarray:
    return np.frombuffer(column, dtype=np.int64) if len(column) else np.empty(0, np.int64)


class OpsCollector:
    """What one reading of a trace keeps for the ops tables (in analyze's pass 1, in parts from its
    workers): typed columns per host and GPU event, interned names, places and op signatures, and the
    runs of events per pid that tell each event's rank."""

    def __init__(self, spool_dir: str | None = None, may_spill: Callable[[], bool] | None = None) -> None:
        self.spool_dir = spool_dir  # (where the columns' temporary files go; None: the system's)
        self._may_spill = may_spill  # whether this process keeps its columns on disk (None: yes)
        self._check_mask = (1 << min(12, SPILL_ROWS.bit_length() - 1)) - 1  # (visit looks every so many events)
        self.names: dict[str, int] = {}
        self.places: dict[tuple, int] = {}  # (pid, tid) -> number
        self.tid_places: dict[object, dict] = {}  # pid -> {tid -> its number in places}, for the projected events
        self.signatures: dict[tuple, int] = {}
        self._signature_of_text: dict[bytes, int] = {}
        self.signature_of_raw: dict[bytes, int] = {}  # (the same, by the texts of a projected event's lists)
        self.signature_values: list[list] = []
        self._other_links: dict[object, int] = {}  # ids that are no 63-bit integers -> numbers above them
        # (launch: -1 no launch call, else the id its args hold: 0 correlation, 1 External id; run: see runs)
        self.host = _Columns(thread="q", ts="d", end="d", kind="b", name="q", sig="q", uid="q", corr="q", ext="q",
                             seq="q", kernel="i", run="q", launch="b", dur="d", dur_int="b", driver="b")
        self.gpu = _Columns(ts="d", end="d", dur="d", integral="b", cat="b", name="q", stream="d", dur_int="b",
                            place="q", corr="q", ext="q", run="q")
        self._host_add = [column.append for column in self.host.arrays.values()]  # (in the order above)
        self._gpu_add = [column.append for column in self.gpu.arrays.values()]
        self.flow_starts = _Columns(id="q", run="q")
        self.flow_ends = _Columns(id="q", place="q", run="q")
        self._start_add = [column.append for column in self.flow_starts.arrays.values()]
        self._end_add = [column.append for column in self.flow_ends.arrays.values()]
        # runs of events of one pid and own args.rank (-1: none; a pid -1: no object), in event order: which
        # rank an event is of, once pass 1 has found the pids' ranks; flags 1 a cpu_op, 2 a python_func in it
        self.runs = _Columns(pid="q", own="i", count="q", flags="b", untimed="q")
        # user annotations (CPU and GPU: TraceLens gives vLLM's attention op the one enclosing it); few
        self.annotations = _Columns(ts="d", end="d", name="q", run="q")
        self._annotation_cats: dict[str, bool] = {}  # category -> whether it names an annotation
        self.pid_keys: dict[object, int] = {}  # pids as analyze keys them -> number
        self._last: object = _NO_RUN  # (pid, own rank) of the run being counted
        self._counts, self._at = self.runs.arrays["count"], -1  # (its events, its number)
        self._launch_names: dict[int, bool] = {}  # name number -> a launch call's name ("launch" in it)
        self._collective_names: dict[int, bool] = {}  # name number -> a collective kernel's (collectives.wanted)
        self.metadata: dict[tuple, object] = {}  # (pid, tid, process_name|process_labels|thread_name) -> value
        self.events = 0  # events seen: TraceLens's UID of the next one
        self._listed = (0, 0, 0, 0, 0)  # names, places, signatures, odd ids and pids already in a part
        self._part_maps: dict[int, tuple[array, ...]] = {}  # per pass-1 worker: its numbers -> ours
        self.collectives = KernelCollector()  # (TraceLens's coll_analysis; a kernel's slot is its run)

    def take_part(self) -> dict:
        """What was collected since the last part (in a pass-1 worker): the columns with this collector's
        numbers, and the names, places, signatures and odd ids it numbered since; its UIDs count from 0."""
        groups = self._groups()
        part: dict = {group: {name: column[:] for name, column in columns.arrays.items()}
                      for group, columns in groups.items()}
        for columns in groups.values():
            for column in columns.arrays.values():
                del column[:]
        names, places, signatures, links, pids = self._listed
        part["names"] = list(self.names)[names:]
        part["places"] = list(self.places)[places:]
        part["signatures"] = [(sig, self.signature_values[number]) for sig, number in
                              list(self.signatures.items())[signatures:]]
        part["links"] = list(self._other_links)[links:]
        part["pids"] = list(self.pid_keys)[pids:]
        self._listed = (len(self.names), len(self.places), len(self.signatures), len(self._other_links),
                        len(self.pid_keys))
        part["metadata"], self.metadata = self.metadata, {}
        part["events"], self.events, self._last = self.events, 0, _NO_RUN
        part["collectives"] = self.collectives.take_part()
        return part

    def spill_if_full(self) -> None:
        """Move each group of event columns that holds a block to its files (not the runs, which pass 1
        updates in place, nor in a pass-1 worker, whose columns go in parts)."""
        if self._may_spill is not None and not self._may_spill():
            return
        for columns in (self.host, self.gpu, self.flow_starts, self.flow_ends, self.annotations):
            if len(columns) >= SPILL_ROWS:
                columns.spill(self.spool_dir)

    def _groups(self) -> dict[str, _Columns]:
        return {"host": self.host, "gpu": self.gpu, "flow_starts": self.flow_starts, "flow_ends": self.flow_ends,
                "runs": self.runs, "annotations": self.annotations}

    def absorb(self, part: dict, source: int, first_event: int) -> None:
        """Append a worker's part (parts come in event order; ``first_event``: the place of its first event)."""
        maps = self._part_maps.setdefault(source, tuple(array("q") for _ in range(5)))
        for name in part["names"]:
            maps[0].append(self._name(name))
        for place in part["places"]:
            maps[1].append(self.places.setdefault(place, len(self.places)))
        for sig, values in part["signatures"]:
            number = self.signatures.setdefault(sig, len(self.signatures))
            if number == len(self.signature_values):
                self.signature_values.append(values)
            maps[2].append(number)
        for value in part["links"]:
            maps[3].append(self._link(value))
        for pid in part["pids"]:
            maps[4].append(self.pid_keys.setdefault(pid, len(self.pid_keys)))
        names, places, signatures, links, pids = (np.frombuffer(m, dtype=np.int64) if len(m) else np.zeros(1, np.int64)
                                                  for m in maps)
        run_base = len(self.runs.arrays["count"])

        def linked(column: array) -> np.ndarray:
            values = np.frombuffer(column, dtype=np.int64) if len(column) else np.empty(0, np.int64)
            odd = values >= LINK_HIGH
            return np.where(odd, links[np.where(odd, values - LINK_HIGH, 0)], values) if odd.any() else values

        host, gpu, starts, ends = part["host"], part["gpu"], part["flow_starts"], part["flow_ends"]
        kernel = np.frombuffer(host["kernel"], dtype=np.int32) if len(host["kernel"]) else np.empty(0, np.int32)
        run_pids = _ints(part["runs"]["pid"])
        converted = {
            "host": {"thread": places[_ints(host["thread"])], "name": names[_ints(host["name"])],
                     "sig": signatures[_ints(host["sig"])], "uid": _ints(host["uid"]) + first_event,
                     "corr": linked(host["corr"]), "ext": linked(host["ext"]), "seq": linked(host["seq"]),
                     "kernel": np.where(kernel >= 0, names[np.maximum(kernel, 0)], -1), "run": _ints(host["run"]) + run_base},
            "gpu": {"name": names[_ints(gpu["name"])], "place": places[_ints(gpu["place"])], "corr": linked(gpu["corr"]),
                    "ext": linked(gpu["ext"]), "run": _ints(gpu["run"]) + run_base},
            "flow_starts": {"id": linked(starts["id"]), "run": _ints(starts["run"]) + run_base},
            "flow_ends": {"id": linked(ends["id"]), "place": places[_ints(ends["place"])],
                          "run": _ints(ends["run"]) + run_base},
            "runs": {"pid": np.where(run_pids >= 0, pids[np.maximum(run_pids, 0)], -1)},
            "annotations": {"name": names[_ints(part["annotations"]["name"])],
                            "run": _ints(part["annotations"]["run"]) + run_base},
        }
        for group, columns in self._groups().items():
            for name, column in columns.arrays.items():
                values = converted[group].get(name)
                if values is None:
                    column.extend(part[group][name])
                else:
                    column.frombytes(values.astype(column.typecode, copy=False).tobytes())
        self.metadata.update(part["metadata"])
        self.collectives.absorb(part["collectives"], source, array("i", range(run_base, run_base + len(run_pids))))
        self.events = first_event + part["events"]  # (an event visited next, by this collector, has this UID)
        self._last = _NO_RUN
        self.spill_if_full()

    def _link(self, value: object) -> int:
        value = _key(value)
        if value is None:
            return NO_LINK
        if isinstance(value, int) and LINK_LOW < value < LINK_HIGH:
            return value
        return self._other_links.setdefault(value, (1 << 62) + len(self._other_links))

    def _place(self, event: dict) -> int:
        return self.places.setdefault((_key(event.get("pid")), _key(event.get("tid"))), len(self.places))

    def _signature(self, values: list) -> int:
        """The number of an op's argument lists (the first four's str() as TraceLens groups them)."""
        try:
            text = orjson.dumps(values)
        except TypeError:  # (numbers orjson cannot write: the slower way)
            text = repr(values).encode()
        number = self._signature_of_text.get(text)
        if number is None:
            sig = tuple(None if value is None else str(_tupled(value)) for value in values[:len(SIGNATURE_ARGS)])
            number = self._signature_of_text[text] = self.signatures.setdefault(sig, len(self.signatures))
            if number == len(self.signature_values):
                self.signature_values.append(values)
        return number

    def _name(self, name: object) -> int:
        text = name if isinstance(name, str) else str(name)
        return self.names.setdefault(text, len(self.names))

    def visit(self, event: object) -> None:
        uid = self.events
        self.events += 1
        if isinstance(event, dict):
            self._visit(event, uid)
        else:
            self._run(_NO_PID, -1)
        if not uid & self._check_mask:
            self.spill_if_full()

    def _run(self, pid: object, own: int) -> int:
        """The run an event of this pid and own rank is counted in (a new one where either changes)."""
        key = (pid, own)
        if key == self._last:
            self._counts[-1] += 1
            return self._at
        self._last = key
        number = -1 if pid is _NO_PID else self.pid_keys.setdefault(_pid_key(pid), len(self.pid_keys))
        for column, value in zip(self.runs.arrays.values(), (number, own, 1, 0, 0)):
            column.append(value)
        self._at = len(self._counts) - 1
        return self._at

    def _visit(self, event: dict, uid: int) -> None:
        """One event's columns (the hot loop: plain types take the short ways, the rest the helpers)."""
        get = event.get
        cat = get("cat")
        if cat.__class__ is not str:
            cat = None  # (no category TraceLens knows)
        own = -1
        if cat in RANK_EVIDENCE:  # (its own args.rank places it, as analyze places it)
            args = get("args")
            rank = args.get("rank") if isinstance(args, dict) else None
            own = rank if rank.__class__ is int and rank >= 0 else -1
        run = self._run(get("pid"), own)
        if get("ph") == "M":
            self._metadata(event)
        if cat == "ac2g":
            self._flow(event, run)
            return
        if cat == "cpu_op" or cat == "python_func":
            self.runs.arrays["flags"][run] |= 1 if cat == "cpu_op" else 2
        kind = HOST_CATS.get(cat)
        gpu_cat = GPU_CATS.get(cat)
        if kind is None and gpu_cat is None:
            if cat is not None and self.is_annotation(cat):
                self.annotate(get("ts"), get("dur"), get("name"), run)
            return
        args = get("args")
        if args.__class__ is not dict:
            args = args if isinstance(args, dict) else {}
        ts, dur = get("ts"), get("dur")
        if ts.__class__ not in NUMBERS:
            ts = _number(ts)
        if dur.__class__ not in NUMBERS:
            dur = _number(dur)
        if ts is None or dur is None:
            self.runs.arrays["untimed"][run] += 1
            return
        name = get("name", "")
        name_id = self.names.get(name) if name.__class__ is str else None
        if name_id is None:
            name_id = self._name(name)
        link = self._link
        corr, ext = args.get("correlation"), args.get("External id")
        corr = corr if corr.__class__ is int and LINK_LOW < corr < LINK_HIGH else link(corr)
        ext = ext if ext.__class__ is int and LINK_LOW < ext < LINK_HIGH else link(ext)
        place = self._place_of(event)
        if kind is not None:
            launch = -1
            if kind == RUNTIME:
                named = self._launch_names.get(name_id)
                if named is None:
                    named = self._launch_names[name_id] = "launch" in str(name).lower()
                if named:
                    launch = 0 if "correlation" in args else 1
            kernel = args.get("kernel")
            seq = args.get("Sequence number")
            seq = seq if seq.__class__ is int and LINK_LOW < seq < LINK_HIGH else link(seq)
            add = self._host_add
            add[0](place)
            add[1](ts)
            add[2](ts + dur)
            add[3](kind)
            add[4](name_id)
            add[5](self._signature([args.get(key) for key in MODEL_ARGS]))
            add[6](uid)
            add[7](corr)
            add[8](ext)
            add[9](seq)
            add[10](self._name(kernel) if kernel.__class__ is str else -1)
            add[11](run)
            add[12](launch)
            add[13](dur)
            add[14](dur.__class__ is int)
            add[15](cat == "cuda_driver")
            return
        if gpu_cat == KERNEL and self.collectives.wanted(name):
            self.collectives.add(event, ts, dur, run)
        stream = args.get("original_stream")  # (merge and compact move a slice to a lane: its stream stays here)
        stream = args.get("stream") if stream is None else stream
        stream = float(stream) if stream.__class__ in NUMBERS else math.nan
        add = self._gpu_add
        add[0](ts)
        add[1](ts + dur)
        add[2](dur)
        add[3](ts.__class__ is int and dur.__class__ is int)
        add[4](gpu_cat)
        add[5](name_id)
        add[6](stream)
        add[7](dur.__class__ is int)
        add[8](place)
        add[9](corr)
        add[10](ext)
        add[11](run)

    def is_annotation(self, cat: str) -> bool:
        """Whether events of this category are user annotations (TraceLens: it contains ``user_annotation``)."""
        found = self._annotation_cats.get(cat)
        if found is None:
            found = self._annotation_cats[cat] = iterannotation.CATEGORY in cat
        return found

    def annotate(self, ts: object, dur: object, name: object, run: int) -> None:
        """An annotation's columns (one without a numeric ts or dur left out: it encloses nothing)."""
        ts = ts if ts.__class__ in NUMBERS else _number(ts)
        dur = dur if dur.__class__ in NUMBERS else _number(dur)
        if ts is None or dur is None:
            return
        for column, value in zip(self.annotations.arrays.values(), (ts, ts + dur, self._name(name), run)):
            column.append(value)

    def _metadata(self, event: dict) -> None:
        name, args = event.get("name"), event.get("args")
        if name.__class__ is str and name in METADATA and isinstance(args, dict):
            self.metadata[(_key(event.get("pid")), _key(event.get("tid")), name)] = args.get(METADATA[name])

    def _place_of(self, event: dict) -> int:
        """:meth:`_place`, the short way for int and string ids."""
        pid, tid = event.get("pid"), event.get("tid")
        place = self.places.get((pid, tid)) if pid.__class__ in KEYS and tid.__class__ in KEYS else None
        return self._place(event) if place is None else place

    def _flow(self, event: dict, run: int) -> None:
        ph, ident = event.get("ph"), event.get("id")
        if ph != "s" and ph != "f":
            return
        ident = ident if ident.__class__ is int and LINK_LOW < ident < LINK_HIGH else self._link(ident)
        if ph == "s":
            self._start_add[0](ident)
            self._start_add[1](run)
        else:
            self._end_add[0](ident)
            self._end_add[1](self._place_of(event))
            self._end_add[2](run)

    def facts(self, merged: bool = False) -> OpsFacts:
        """The facts of every event seen (a trace of one rank); ``merged``: of a file ``merge`` wrote, whose
        process and thread names are the inputs' own again (as the rank's own file states them)."""
        columns = self._taken()
        return self._facts(columns, own_names(self.metadata) if merged else self.metadata, columns["host"]["uid"],
                           int(columns["runs"]["count"].sum()))

    def rank_facts(self, pid_ranks: dict[object, int], merged: bool = False,
                   ) -> tuple[dict[int, Callable[[], OpsFacts]], int]:
        """What makes the facts of each rank of a trace of several (``pid_ranks``: its pids' ranks, as
        analyze found them; an event's own args.rank, on a launch or GPU event, first), each rank's events
        numbered from 0 in file order as its own file numbers them (TraceLens's UIDs), one rank at a time
        (a rank's columns are copied out of the mapped ones when asked for); and how many events no rank
        holds."""
        columns = self._taken()
        metadata = own_names(self.metadata) if merged else self.metadata
        runs = columns["runs"]
        pid_rank = np.array([pid_ranks.get(key, -1) for key in self.pid_keys] + [-1], dtype=np.int64)
        run_rank = np.where(runs["own"] >= 0, runs["own"], pid_rank[runs["pid"]])  # (no pid, -1: the last, -1)
        count = runs["count"]
        first = np.cumsum(count) - count  # each run's first event
        before = np.zeros(len(count), np.int64)  # the events of the run's rank before it
        ranks = np.unique(run_rank[run_rank >= 0]).tolist()
        for rank in ranks:
            mine = run_rank == rank
            counted = np.where(mine, count, 0)
            before[mine] = (np.cumsum(counted) - counted)[mine]

        def facts_of(rank: int) -> OpsFacts:
            subset = {group: {name: values[run_rank[columns[group]["run"]] == rank] for name, values in group_columns.items()}
                      for group, group_columns in columns.items() if group != "runs"}
            subset["runs"] = {name: values[run_rank == rank] for name, values in runs.items()}
            host_runs = subset["host"]["run"]
            uid = before[host_runs] + subset["host"]["uid"] - first[host_runs]
            mine = {key: value for key, value in metadata.items() if pid_ranks.get(_pid_key(key[0]), -1) == rank}
            return self._facts(subset, mine, uid, int(count[run_rank == rank].sum()))

        return {rank: partial(facts_of, rank) for rank in ranks}, int(count[run_rank < 0].sum())

    def _taken(self) -> dict[str, dict[str, np.ndarray]]:
        return {group: {name: columns.take(name) for name in list(columns.arrays)}
                for group, columns in self._groups().items()}

    def run_ranks(self, pid_ranks: dict[object, int]) -> np.ndarray:
        """Each run's rank (-1: none), as :meth:`rank_facts` places events."""
        runs = self.runs.arrays
        own = np.frombuffer(runs["own"], dtype=np.int32) if len(runs["own"]) else np.empty(0, np.int32)
        pid_rank = np.array([pid_ranks.get(key, -1) for key in self.pid_keys] + [-1], dtype=np.int64)
        return np.where(own >= 0, own, pid_rank[_ints(runs["pid"])])

    def _facts(self, columns: dict[str, dict[str, np.ndarray]], metadata: dict, uid: np.ndarray,
               events: int) -> OpsFacts:
        h, g, runs = columns["host"], columns["gpu"], columns["runs"]
        names = list(self.names)
        flags = int(np.bitwise_or.reduce(runs["flags"])) if len(runs["flags"]) else 0
        facts = OpsFacts(
            names=names, h_thread=h["thread"], h_ts=h["ts"], h_end=h["end"], h_kind=h["kind"], h_name=h["name"],
            h_sig=h["sig"], g_ts=g["ts"], g_end=g["end"], g_dur=g["dur"], g_int=g["integral"].view(np.bool_),
            g_cat=g["cat"], g_name=g["name"], g_stream=g["stream"], g_dur_int=g["dur_int"].view(np.bool_),
            h_uid=uid, h_seq=h["seq"], h_kernel=h["kernel"], threads=list(self.places), metadata=metadata,
            signatures=list(self.signatures), signature_values=self.signature_values,
            has_cpu_ops=bool(flags & 3), python_stack=bool(flags & 2), untimed=int(runs["untimed"].sum()),
            h_dur=h["dur"], h_dur_int=h["dur_int"].view(np.bool_), h_driver=h["driver"].view(np.bool_), events=events,
            **_annotations(columns["annotations"]))
        launches = np.flatnonzero(h["launch"] >= 0)  # (the first launch call says which id links)
        key = "ext" if len(launches) and h["launch"][launches[0]] == 1 else "corr"
        graph_names = np.array([name in opstables.GRAPH_LAUNCHES for name in names] or [False])
        calls = np.flatnonzero(facts.h_kind == RUNTIME)
        call_link, call_graph = h[key][calls], graph_names[facts.h_name[calls]]
        release_mapped_pages()  # (the mapped columns read so far: the links read others)
        run, gpu = optree.launch_links(calls, call_link, call_graph, g[key], g["place"], columns["flow_starts"]["id"],
                                       columns["flow_ends"]["id"], columns["flow_ends"]["place"], release_mapped_pages)
        del calls, call_link, call_graph
        opstables.link(facts, run, gpu)
        return facts


def _annotations(columns: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The annotations' OpsFacts columns: ordered by start, ties in event order (TraceLens's stable sort)."""
    ts = columns["ts"]
    if not (ts[1:] < ts[:-1]).any():  # (already so: the columns as they are, mapped or not)
        return {"a_ts": ts, "a_end": columns["end"], "a_name": columns["name"]}
    order = np.argsort(ts, kind="stable")
    return {"a_ts": ts[order], "a_end": columns["end"][order], "a_name": columns["name"][order]}


def own_names(metadata: dict[tuple, object]) -> dict[tuple, object]:
    """A merge output's process and thread names as its inputs named them: merge names each process
    ``rank <g> | GPU`` or ``rank <g> | process <pid>`` and then `` | `` and the input's name, if it had one,
    and prefixes each thread's name with ``rank <g> | `` (``PP rank <r>`` with pipeline stages)."""
    own: dict[tuple, object] = {}
    for key, value in metadata.items():
        pattern = {"process_name": MERGE_PROCESS_NAME, "thread_name": MERGE_THREAD_NAME}.get(key[2])
        found = pattern.fullmatch(value) if pattern is not None and isinstance(value, str) else None
        if found is None:
            own[key] = value
        elif found["own"] is not None:
            own[key] = found["own"]
    return own


def read_input(path: str, *, salvage: bool = False) -> tuple[OpsFacts, object, KernelCollector]:
    """Read ``path`` on its own for the ops tables (outside analyze, whose pass 1 collects them): their
    facts, the trace's ``deviceProperties`` (the GPU the roofline is of), and its collective kernels."""
    def attempt(reader: TraceReader) -> tuple[OpsCollector, list]:
        collector = OpsCollector()
        for event in reader.events():
            collector.visit(event)
        return collector, reader.stats.header + reader.stats.trailer

    collector, members = read_with_retries(InputSource(path), attempt, salvage=salvage, label="ops")
    return collector.facts(_merged(members)), member_value(members, "deviceProperties"), collector.collectives


def _merged(members: list) -> bool:
    """Whether ``merge`` wrote the trace (its process and thread names are then merge's)."""
    name = member_value(members, "traceName")
    return isinstance(name, str) and name.startswith(MERGE_TRACE_NAME)


def coll_analysis(kernels: KernelCollector, rows: np.ndarray | None = None) -> bytes | None:
    """TraceLens's ``coll_analysis``: its collective analyser's ``nccl_summary_long`` over this one trace
    (``rows``: the kernels of one rank of a file of several), every collective kernel as rank 0 (the trace's
    place in the analyser's list of one); None without a row (no collective kernel, or every one with a
    missing key, which pandas' grouping drops)."""
    ts, dur = np.frombuffer(kernels.ts, dtype=np.float64), np.frombuffer(kernels.dur, dtype=np.float64)
    meta = np.frombuffer(kernels.meta, dtype=np.int32)
    if rows is not None:
        ts, dur, meta = ts[rows], dur[rows], meta[rows]
    if not len(ts):
        return None
    rank = collectives.RankKernels(0, ts.copy(), dur.copy(), meta.copy(), list(kernels.metas))
    summary = collectives.summary_long([rank])
    return csv_text(summary).encode("utf-8") if summary.rows else None


def collective_csv(kernels: KernelCollector, rows: np.ndarray | None, tables: dict, facts: OpsFacts) -> dict[str, bytes]:
    """``coll_analysis`` by its stem, when TraceLens writes it: not when its
    report stopped before (no tables) or the trace is GPU-only."""
    if not tables or not facts.has_cpu_ops:
        return {}
    summary = coll_analysis(kernels, rows)
    return {} if summary is None else {"coll_analysis": summary}


def _cell(value: object) -> object:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return ""
    return value


def table_csv(table: Table) -> bytes:
    """A table's CSV text as pandas' ``to_csv(index=False)`` writes it."""
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerows(table.header)
    writer.writerows([_cell(value) for value in row] for row in table.rows)
    return out.getvalue().encode("utf-8")


def ops_tables(path: str, *, salvage: bool = False, spec: dict | None = None) -> tuple[dict[str, bytes], list[str]]:
    """TraceLens's perf-report CSVs for one trace, by file stem, and notes;
    ``spec`` (TraceLens's arch JSON form) adds the roofline columns."""
    facts, _, kernels = read_input(path, salvage=salvage)
    tables, notes = opsreport.perf_tables(facts, spec)
    return {**{stem: table_csv(table) for stem, table in tables.items()}, **collective_csv(kernels, None, tables, facts)}, notes


def input_label(path: str, ranks: list[int]) -> str:
    """The folder of one input's tables: ``rank<N>`` for a rank file, else the file's name."""
    return f"rank{ranks[0]}" if len(ranks) == 1 else os.path.basename(path).split(".")[0]


@dataclass
class InputOps:
    """One input's ops tables (``{ops/<label>/<stem>.csv: CSV bytes}``), its notes, what the page draws of
    each label, and the words on each label's roofline spec (said once for all inputs that share them)."""

    files: dict[str, bytes] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    parts: dict[str, dict] = field(default_factory=dict)
    spec_words: dict[str, list[str]] = field(default_factory=dict)


@gc_paused()  # (the tables make many short-lived acyclic tuples; the collector's scans of them cost ~18% of their time)
def of_input(path: str, ranks: list[int], pid_ranks: dict[object, int], collector: OpsCollector, members: list, *,
             spec: dict | None = None) -> InputOps:
    """One input's tables, from what pass 1 collected (``members``: the trace's top-level members), made in
    its analyze task once its ranks are known.

    ``spec`` (``--gpu-spec``) gives TraceLens's roofline columns; it, or
    else the built-in spec of the GPU the input's deviceProperties names,
    gives the roofline columns appended after them (:mod:`...algo.opsroofline`).
    A file of several ranks (``pid_ranks``: its pids' ranks, as analyze
    found them) gives each rank its tables, as the rank's own file would.
    """
    out = InputOps()
    devices = member_value(members, "deviceProperties")
    kernels = collector.collectives
    if len(ranks) > 1:
        slot_ranks = collector.run_ranks(pid_ranks)[np.frombuffer(kernels.slot, dtype=np.int32)]
        by_rank, unplaced = collector.rank_facts(pid_ranks, _merged(members))
        inputs = [(f"rank{rank}", by_rank[rank], np.flatnonzero(slot_ranks == rank)) for rank in sorted(by_rank)
                  if rank in ranks]  # (each rank's facts made in its turn: one rank's columns held at a time)
        out.notes.append(f"ops, {path}: {len(ranks)} ranks in one file: tables per rank (ops/rank<N>), each rank's "
                         "events numbered from 0 in file order as its own file numbers them (TraceLens's UIDs)"
                         + (f"; {unplaced:,} events of no rank left out" if unplaced else ""))
    else:
        inputs = [(input_label(path, ranks), partial(collector.facts, _merged(members)), None)]
    for label, make_facts, rows in inputs:
        facts = make_facts()
        settle = partial(_settle, collector.spool_dir)
        settle(facts)
        tables, found = opsreport.perf_tables(facts, spec, settle=settle)
        used, how, words = _spec_for(spec, devices)
        if used is not None:
            found += opsroofline.add_roofline(tables, used)
        out.spec_words.setdefault(words, []).append(label)
        out.parts[label] = opsfigures.page_part(tables, used, how)
        out.notes += [f"ops, {label}: {note}" for note in found]
        written = {**{stem: table_csv(table) for stem, table in tables.items()},
                   **collective_csv(kernels, rows, tables, facts)}
        for stem, data in written.items():
            out.files[os.path.join("ops", label, f"{stem}.csv")] = data
        del facts, tables  # (this rank's columns and rows go before the next rank's are made)
    return out


def _settle(directory: str | None, *held: object) -> None:
    """Between two stages or blocks of the tables: the large arrays ``held`` keeps for later ones go to
    mapped files, and once the mapped pages read so far exceed the budget they leave the resident set
    (what is read next faults back in)."""
    for holder in held:
        park_arrays(holder, directory)
    if held:
        trim_heap()  # (a stage's scratch freed: its pages back to the OS)
    release_mapped_pages(MAPPED_BUDGET)


def combine(inputs: list[InputOps]) -> tuple[dict[str, bytes], list[str], dict[str, dict]]:
    """Every input's tables together (by relative path), the notes (first what each roofline is of, for
    all the labels it serves), and what the page draws (by label)."""
    spec_words: dict[str, list[str]] = {}
    for one in inputs:
        for words, labels in one.spec_words.items():
            spec_words.setdefault(words, []).extend(labels)
    notes = [f"ops, {', '.join(labels)}: {words}" for words, labels in spec_words.items()]
    return ({path: data for one in inputs for path, data in one.files.items()},
            notes + [note for one in inputs for note in one.notes], {k: v for one in inputs for k, v in one.parts.items()})


def _spec_for(spec: dict | None, devices: object) -> tuple[dict | None, str, str]:
    """The spec of an input's roofline (the given one, else the built-in one
    of its GPU, else none), how it was chosen, and the report's words on it."""
    if spec is not None:
        how = f"from {spec['source']}"
        return spec, how, f"roofline from the GPU spec {spec.get('name', '(unnamed)')!r} {how}"
    found = gpuspecs.identify(devices)
    if found.spec is None:
        return None, found.how, (f"GPU unknown: {found.how}; the sheets have no roofline columns (give --gpu-spec "
                                 "FILE, TraceLens's arch JSON form)")
    arch = found.spec.arch()
    return arch, found.how, (f"roofline columns ({', '.join(opsroofline.COLUMNS)}, after TraceLens's) from the "
                             f"built-in spec {found.spec.name!r}, picked {found.how}; figures from {arch['source']}")


def prepare(destinations: Destinations, out_dir: str | None, gpu_spec: str | None) -> dict | None:
    """Before reading: ``--ops`` writes under ``out_dir/ops/``, refused if that
    already holds files (unless overwriting); the GPU spec, if given, read."""
    if out_dir is None:
        raise TraceError("--ops writes TraceLens's tables as CSV files: give -o DIR")
    destinations.directory(os.path.join(out_dir, "ops"), writes="the ops tables", existing=r".+")
    return None if gpu_spec is None else {**load_spec(gpu_spec), "source": f"the file {gpu_spec} (--gpu-spec)"}


def write(destinations: Destinations, out_dir: str, files: dict[str, bytes]) -> list[str]:
    """Write the tables (inside the run's ``with destinations``); their paths."""
    paths = []
    for relative, data in files.items():
        path = os.path.join(out_dir, relative)
        destinations.directory(os.path.dirname(path), writes="the ops tables")
        destinations.write(path, data, role="ops table")
        paths.append(path)
    return paths
