"""``attribute``: a CSV of every GPU event with its rank, launch and CPU ops.

Pass 1 (:class:`AttributeIndex`) records launches and GPU events like
``relink``'s index, plus: each GPU event's own columns as text, spooled to
disk in input order; each CPU op (``cpu_op``, ``user_annotation``) as a
25-byte record in a disk spill, never in memory.  Between the passes the
ranks and links are resolved, then the op spill is streamed past the
launches that have GPU work (:mod:`streamtrace.enclosure`).  Pass 2 reads
the GPU spool back and writes one row per GPU event.
"""
from __future__ import annotations

import csv
import os
import re
import struct
import tempfile
import time
from array import array
from collections import defaultdict
from decimal import Decimal
from itertools import repeat
from operator import attrgetter
from typing import IO, Callable, Iterator, Sequence

import numpy as np
import orjson

from ..algo.columns import PLAIN_NUMBERS, as_floats
from ..algo.enclosure import ANNOTATION, CPU_OP, NO_OP, Enclosure
from ..algo.links import NO_LAUNCH
from ..algo.parts import extend_converted, translated
from ..algo.ranks import plain_rank, rank_from_args
from ..engine.jobs import resolve_jobs
from ..engine.passes import index_pass
from ..io.configfiles import load_rank_map
from ..io.destinations import Destinations
from ..io.eventtext import decimal_as_json
from ..io.progress import Progress
from ..io.projection import ProjectedChunk, Projection
from ..io.redact import Redactor, copied_secrets, copy_screen, screen_csv
from ..io.sink import SinkSpec
from ..io.source import InputSource, SourceSpec
from ..io.spool import EventSpool
from ..kineto import NUMBER_TYPES
from ..resources import peak_rss_mb
from .mergedindex import GPU, KEEP, LAUNCH, LinksIndex, Resolved, resolve

COLUMNS = ("rank", "pid", "tid", "ts", "dur", "cat", "name", "correlation", "launch_name", "launch_pid",
           "launch_tid", "launch_ts", "cpu_op", "root_op")
GROUP_COLUMNS = ("rank", "cpu_op", "gpu_events", "gpu_time_us")
OP_KINDS = {"cpu_op": CPU_OP, "user_annotation": ANNOTATION}
OP_RECORD = struct.Struct("<iddiB")
SPILL_FLUSH = 1 << 20
GPU_BATCH = 512
_NEEDS_QUOTES = re.compile(r'[,"\r\n]')


def cell(value: object) -> str:
    """A JSON value as its CSV text: numbers as the trace writes them, strings quoted when needed."""
    if value is None:
        return ""
    kind = value.__class__
    if kind is str:
        text = value
    elif kind is int or kind is Decimal:
        text = str(value)
    else:
        text = orjson.dumps(value, default=decimal_as_json).decode()
    if _NEEDS_QUOTES.search(text):
        return '"' + text.replace('"', '""') + '"'
    return text


class CellTexts:
    """Columns of values as their CSV cells (:func:`cell`, UTF-8), a column
    at a time: numbers in one orjson call (its text is the cell's), strings
    through a bounded cache (names repeat), other values one by one."""

    CACHE_LIMIT = 1 << 16

    def __init__(self) -> None:
        self._strings: dict[str, bytes] = {}

    def column(self, values: Sequence) -> list[bytes]:
        if not values:
            return []
        kinds = set(map(type, values))
        if kinds <= PLAIN_NUMBERS:
            try:
                return orjson.dumps(values)[1:-1].split(b",")
            except orjson.JSONEncodeError:  # an integer beyond 64 bits
                pass
        elif kinds == _STRINGS:
            known = self._strings
            cells = list(map(known.get, values))
            if None in cells:
                if len(known) > self.CACHE_LIMIT:
                    known.clear()
                for at, found in enumerate(cells):
                    if found is None:
                        cells[at] = known[values[at]] = cell(values[at]).encode()
            return cells
        return [cell(value).encode() for value in values]


_STRINGS = frozenset({str})
ESCAPED = b"\0"  # starts a spooled row that is a JSON string: its cells hold a line break
_ESCAPED_LINE = re.compile(ESCAPED).match


def row_lines(cells: CellTexts, columns: Sequence[Sequence]) -> list[bytes]:
    """GPU events' own columns (pid .. correlation) as spool lines: each
    event's cells joined by commas, or, when that text would not stay one
    line (a quoted cell with a line break), NUL and the text as a JSON string."""
    lines = list(map(b",".join, zip(*map(cells.column, columns))))
    joined = b"\n".join(lines)
    if joined.count(b"\n") + 1 == len(lines) and ESCAPED not in joined:
        return lines
    return [ESCAPED + orjson.dumps(line.decode()) if b"\n" in line or line.startswith(ESCAPED) else line
            for line in lines]


def own_cells(lines: list[bytes]) -> list[bytes]:
    """Spooled rows (:func:`row_lines`) back as each event's cells joined by commas."""
    if not any(map(_ESCAPED_LINE, lines)):
        return lines
    return [orjson.loads(line[1:]).encode() if line.startswith(ESCAPED) else line for line in lines]


class OpSpill:
    """CPU op intervals on disk, in file order: the index never holds them.
    The file is made at the first flush; ``hold`` (a pass-1 worker) keeps
    the records for :meth:`take` instead."""

    def __init__(self, directory: str | None) -> None:
        self._directory = directory
        self._file: IO[bytes] | None = None
        self.path: str | None = None
        self._buffer = bytearray()
        self.count = 0
        self.hold = False

    def add(self, thread: int, start: float, end: float, name: int, kind: int) -> None:
        self._buffer += OP_RECORD.pack(thread, start, end, name, kind)
        self.count += 1
        if len(self._buffer) >= SPILL_FLUSH and not self.hold:
            self._flush()

    def add_records(self, records: bytes) -> None:
        """Add records packed as :meth:`add` packs them."""
        self._buffer += records
        self.count += len(records) // OP_RECORD.size
        if len(self._buffer) >= SPILL_FLUSH and not self.hold:
            self._flush()

    def take(self) -> bytes:
        """The records held, which this then forgets."""
        taken = bytes(self._buffer)
        self._buffer.clear()
        self.count = 0
        return taken

    def _flush(self) -> None:
        if self._file is None:
            handle, self.path = tempfile.mkstemp(prefix="streamtrace-ops-", suffix=".bin", dir=self._directory)
            self._file = os.fdopen(handle, "w+b")
        self._file.write(self._buffer)
        self._buffer.clear()

    def records(self) -> Iterator[tuple[int, float, float, int, int]]:
        if self._file is None:
            yield from OP_RECORD.iter_unpack(bytes(self._buffer))
            return
        self._flush()
        self._file.seek(0)
        size = OP_RECORD.size * (SPILL_FLUSH // OP_RECORD.size)
        while True:
            block = self._file.read(size)
            if not block:
                return
            yield from OP_RECORD.iter_unpack(block)

    def close(self) -> None:
        """Delete the spill, also when flushing it fails (disk full)."""
        if self._file is None:
            return
        try:
            self._file.close()
        finally:
            try:
                os.unlink(self.path)  # type: ignore[arg-type]
            except FileNotFoundError:
                pass


OP_FIELDS = np.dtype([("thread", "<i4"), ("start", "<f8"), ("end", "<f8"), ("name", "<i4"), ("kind", "u1")])


class AttributeIndex(LinksIndex):
    """Pass-1 visitor for ``attribute``: the merged index plus launch details,
    the GPU events' own columns (spooled) and the CPU ops (spilled).

    Chunks are read as projections (:meth:`visit_projected`) a column at a
    time, or as dicts event by event (:meth:`visit`), to the same records."""

    projection = Projection({"ph": None, "cat": None, "name": None, "pid": None, "tid": None, "ts": None,
                             "dur": None, "args": {"correlation": None, "rank": None}})

    def __init__(self, spool_dir: str | None) -> None:
        self.thread_slots: dict[tuple, int] = {}
        self.thread_keys: list[tuple] = []
        self.name_ids: dict[str, int] = {}
        self.names: list[str] = []
        self.launch_thread = array("i")
        self.launch_name = array("i")
        self.launch_end = array("d")
        self.launch_ts_int = bytearray()  # the input wrote this launch's ts as an integer
        self.launch_ts_text: dict[int, str] = {}  # only for ts values a float cannot spell back (exact mode)
        self.spool_dir = spool_dir
        self._gpu_rows: EventSpool | None = None  # made at the first batch of rows
        self._rows: list[bytes] = []
        self._pending: list[tuple] = []  # GPU events' own values read event by event, not yet rows
        self._cells = CellTexts()
        self.ops = OpSpill(spool_dir)
        self._listed = (0, 0)  # threads and names already in a part
        self._part_maps: dict[int, tuple[array, array]] = {}  # per pass-1 worker: its thread and name ids -> ours
        super().__init__()
        for category, kind in OP_KINDS.items():
            self.handlers[category] = self._op_handler(kind)

    _PART_LAUNCHES = ("launch_thread", "launch_name", "launch_end", "launch_ts_int")

    def take_part(self) -> dict:
        """The merged index's part, plus the launch details, GPU rows and CPU ops
        since the last part (see :mod:`streamtrace.engine.indexworkers`); threads
        and names keep their numbers, the new ones are listed."""
        self._rows_of_pending()
        part = super().take_part()
        for name in self._PART_LAUNCHES:
            part[name] = getattr(self, name)[:]
            del getattr(self, name)[:]
        part["launch_ts_text"], self.launch_ts_text = self.launch_ts_text, {}
        part["rows"], self._rows = self._rows, []
        part["ops"] = self.ops.take()
        part["threads"] = self.thread_keys[self._listed[0]:]
        part["names"] = self.names[self._listed[1]:]
        self._listed = (len(self.thread_keys), len(self.names))
        return part

    def absorb(self, part: dict, source: int, first_event: int) -> None:
        """Append a worker's part, its thread and name ids translated."""
        super().absorb(part, source, first_event)
        threads, names = self._part_maps.setdefault(source, (array("i"), array("i")))
        for key in part["threads"]:
            threads.append(self._thread_slot(key))
        for text in part["names"]:
            names.append(self._name(text))
        base = len(self.launch_end)
        self.launch_ts_text.update((base + at, text) for at, text in part["launch_ts_text"].items())
        extend_converted(self.launch_thread, translated(part["launch_thread"], threads))
        extend_converted(self.launch_name, translated(part["launch_name"], names))
        self.launch_end.extend(part["launch_end"])
        self.launch_ts_int += part["launch_ts_int"]
        self._rows += part["rows"]
        if len(self._rows) >= GPU_BATCH:
            self._spool_rows()
        if part["ops"]:
            ops = np.frombuffer(part["ops"], dtype=OP_FIELDS).copy()
            ops["thread"] = np.frombuffer(threads, dtype=np.int32)[ops["thread"]]
            ops["name"] = np.frombuffer(names, dtype=np.int32)[ops["name"]]
            self.ops.add_records(ops.tobytes())

    @property
    def partial(self) -> bool:
        """True in a pass-1 worker: rows and ops go to the joined index in parts, never to files."""
        return self.ops.hold

    @partial.setter
    def partial(self, value: bool) -> None:
        self.ops.hold = value

    @property
    def gpu_rows(self) -> EventSpool:
        if self._gpu_rows is None:
            self._gpu_rows = EventSpool(self.spool_dir)
        return self._gpu_rows

    def _spool_rows(self) -> None:
        if not self.partial:
            self.gpu_rows.add_lines(self._rows)
            self._rows.clear()

    def close(self) -> None:
        try:
            if self._gpu_rows is not None:
                self._gpu_rows.close()
        finally:
            self.ops.close()

    def _thread(self, event: dict, args: object) -> int:
        return self._thread_slot((event.get("pid"), event.get("tid"), rank_from_args(args)))

    def _thread_slot(self, key: tuple) -> int:
        found = self.thread_slots.get(key)
        if found is None:
            found = self.thread_slots[key] = len(self.thread_keys)
            self.thread_keys.append(key)
        return found

    def _name(self, name: object) -> int:
        text = name if name.__class__ is str else cell(name)
        found = self.name_ids.get(text)
        if found is None:
            found = self.name_ids[text] = len(self.names)
            self.names.append(text)
        return found

    def _op_handler(self, kind: int):
        spill = self.ops.add

        def handle(event: dict) -> int:
            ts, dur = event.get("ts"), event.get("dur")
            if event.get("ph") == "X" and ts.__class__ in NUMBER_TYPES and dur.__class__ in NUMBER_TYPES:
                start = float(ts)
                spill(self._thread(event, event.get("args")), start, start + float(dur), self._name(event.get("name")),
                      kind)
            return KEEP

        return handle

    def _launch(self, event: dict) -> int:
        action = super()._launch(event)
        if action == LAUNCH:
            ts, dur = event["ts"], event.get("dur")
            self.launch_thread.append(self._thread(event, event.get("args")))
            self.launch_name.append(self._name(event.get("name")))
            self.launch_end.append(float(ts) + (float(dur) if dur.__class__ in NUMBER_TYPES else 0.0))
            self.launch_ts_int.append(ts.__class__ is int)
            if ts.__class__ is Decimal:
                self.launch_ts_text[len(self.launch_end) - 1] = str(ts)
        return action

    def _gpu(self, event: dict) -> int:
        action = super()._gpu(event)
        if action == GPU:
            args = event.get("args")
            self._pending.append((event.get("pid"), event.get("tid"), event.get("ts"), event.get("dur"),
                                  event.get("cat"), event.get("name"),
                                  args.get("correlation") if args.__class__ is dict else None))
            if len(self._pending) >= GPU_BATCH:
                self._rows_of_pending()
        return action

    def _rows_of_pending(self) -> None:
        if self._pending:
            self._add_rows(list(zip(*self._pending)))
            self._pending.clear()

    def _add_rows(self, columns: Sequence[Sequence]) -> None:
        self._rows += row_lines(self._cells, columns)
        if len(self._rows) >= GPU_BATCH:
            self._spool_rows()

    def visit_projected(self, chunk: ProjectedChunk) -> bool:
        """Index a chunk as :meth:`visit` would: the merged index from the
        projections (:class:`LinksIndex`), then the launches' details, the
        CPU ops and the GPU rows a column at a time; threads and names are
        numbered in event order, as met.  Refused (False, nothing recorded)
        when a pid or tid is not a scalar: the ordinary reading says which."""
        events = chunk.events
        if not set(map(type, map(_PID, events))) | set(map(type, map(_TID, events))) <= _SCALARS:
            return False
        first = len(self.actions)
        if not super().visit_projected(chunk):
            return False
        self._rows_of_pending()
        codes = np.frombuffer(bytes(self.actions[first:]), np.uint8)
        op_kinds = np.frombuffer(bytes(map(OP_KINDS.get, map(_CAT, events), repeat(0))), np.uint8)
        ops = [at for at in np.flatnonzero(op_kinds).tolist() if _timed_slice(events[at])]
        launches = np.flatnonzero(codes == LAUNCH)
        order = np.sort(np.concatenate([launches, np.array(ops, np.int64)])).tolist()
        picked = [events[at] for at in order]
        ranks = [None if args is None else plain_rank(args.rank) for args in map(_ARGS, picked)]
        threads = np.array(_numbered(list(zip(map(_PID, picked), map(_TID, picked), ranks)), self.thread_slots,
                                     self._thread_slot), np.int32)
        names = np.array(_numbered(list(map(_NAME, picked)), self.name_ids, self._name), np.int32)
        starts = as_floats(list(map(_TS, picked)), 0.0)
        ends = starts + as_floats(list(map(_DUR, picked)), 0.0)
        is_launch = codes[order] == LAUNCH
        self.launch_thread.frombytes(threads[is_launch].tobytes())
        self.launch_name.frombytes(names[is_launch].tobytes())
        self.launch_end.frombytes(ends[is_launch].tobytes())
        launch_ts = [picked[at].ts for at in np.flatnonzero(is_launch).tolist()]
        self.launch_ts_int += bytes(map(_INTEGER.__contains__, map(type, launch_ts)))
        if ops:
            records = np.zeros(len(ops), OP_FIELDS)
            is_op = ~is_launch
            for field, values in (("thread", threads), ("start", starts), ("end", ends), ("name", names)):
                records[field] = values[is_op]
            records["kind"] = op_kinds[ops]
            self.ops.add_records(records.tobytes())
        gpu = [events[at] for at in np.flatnonzero(codes == GPU).tolist()]
        self._add_rows([*(list(map(member, gpu)) for member in (_PID, _TID, _TS, _DUR, _CAT, _NAME)),
                        [None if args is None else args.correlation for args in map(_ARGS, gpu)]])
        return True

    def finish(self) -> None:
        self._rows_of_pending()
        self.gpu_rows.add_lines(self._rows)
        self._rows.clear()


_PID, _TID, _TS, _DUR, _CAT, _NAME, _ARGS = map(attrgetter, ("pid", "tid", "ts", "dur", "cat", "name", "args"))
_SCALARS = frozenset({int, float, str, bool, type(None)})
_INTEGER = frozenset({int})


def _timed_slice(event: object) -> bool:
    """A CPU op the spill keeps (as :meth:`AttributeIndex._op_handler` tells): a slice with a numeric start and length."""
    return event.ph == "X" and event.ts.__class__ in PLAIN_NUMBERS and event.dur.__class__ in PLAIN_NUMBERS


def _numbered(keys: list, known: dict, number: Callable[[object], int]) -> list[int]:
    """Each key's number in ``known``; ``number`` gives (and records) the new ones, in order."""
    try:
        found = list(map(known.get, keys))
    except TypeError:  # a key that is no dict key: ``number`` finds it by its text
        found = [None] * len(keys)
    for at, got in enumerate(found):
        if got is None:
            found[at] = number(keys[at])
    return found



class Attribution:
    """Pass 2: the row of each GPU event, from its spooled cells and the links,
    a block of rows at a time (columns gathered with numpy, joined in C calls)."""

    def __init__(self, index: AttributeIndex, resolved: Resolved, enclosure: Enclosure) -> None:
        self.index = index
        self.resolved = resolved
        self._name_cells = np.array([cell(name).encode() for name in index.names] + [b""], object)  # [NO_OP]: b""
        self._thread_cells = np.array([cell(pid).encode() + b"," + cell(tid).encode()
                                       for pid, tid, _ in index.thread_keys], object)
        self._launch_name, self._launch_thread, self._inner, self._outer = (
            np.frombuffer(column, column.typecode)
            for column in (index.launch_name, index.launch_thread, enclosure.inner, enclosure.outer))
        self._launch_ts = np.frombuffer(index.launch_ts, np.float64)
        self._launch_ts_int = np.frombuffer(bytes(index.launch_ts_int), np.bool_)

    def blocks(self) -> Iterator[tuple[np.ndarray, np.ndarray, list[bytes]]]:
        """(ranks, launch ordinals, own cells joined by commas) a block of GPU events at a time, in input order."""
        buckets = np.array(self.resolved.gpu_bucket, np.int32)
        launches = np.array(self.resolved.links.launch_of_gpu, np.int32)
        done = 0
        for block in self.index.gpu_rows.read_blocks():
            yield buckets[done:done + len(block)], launches[done:done + len(block)], own_cells(block)
            done += len(block)

    def _rank_cells(self, ranks: np.ndarray) -> list[bytes]:
        texts = {rank: str(rank).encode() if rank >= 0 else b"" for rank in np.unique(ranks).tolist()}
        return list(map(texts.__getitem__, ranks.tolist()))

    def _launch_cells(self, launches: np.ndarray) -> np.ndarray:
        """launch_name .. root_op of each launch, joined by commas (empty cells for NO_LAUNCH)."""
        texts = np.full(len(launches), b",,,,,", object)
        linked = launches != NO_LAUNCH
        at = launches[linked]
        if len(at):
            cells = self._name_cells
            texts[linked] = list(map(b",".join, zip(cells[self._launch_name[at]],
                                                     self._thread_cells[self._launch_thread[at]],
                                                     self._launch_ts_cells(at), cells[self._inner[at]],
                                                     cells[self._outer[at]])))
        return texts

    def _launch_ts_cells(self, at: np.ndarray) -> list[bytes]:
        """Each launch's ts as the input wrote it: an integer as one, a float as orjson spells it."""
        values, integral = self._launch_ts[at], self._launch_ts_int[at]
        if np.abs(values[integral]).max(initial=0) < INT64_SAFE:
            objects = values.astype(object)
            objects[integral] = values[integral].astype(np.int64).astype(object)
            cells = orjson.dumps(objects.tolist())[1:-1].split(b",")
        else:
            cells = [str(int(value)).encode() if whole else cell(value).encode()
                     for value, whole in zip(values.tolist(), integral.tolist())]
        exact = self.index.launch_ts_text
        if exact:
            cells = [exact[launch].encode() if launch in exact else text for launch, text in zip(at.tolist(), cells)]
        return cells

    def write_csv(self, out: IO[bytes], screen: Redactor) -> int:
        """The rows, which copy the input's names: ``screen`` counts the secrets among them."""
        out.write(",".join(COLUMNS).encode() + b"\n")
        written = 0
        for ranks, launches, own in self.blocks():
            text = b"\n".join(map(b",".join, zip(self._rank_cells(ranks), own, self._launch_cells(launches))))
            screen_csv(screen, text, written)
            out.write(text + b"\n")
            written += len(own)
        return written

    def write_groups(self, out: IO[bytes], screen: Redactor) -> int:
        """GPU time per (rank, innermost cpu op), largest first within a rank."""
        totals: dict[tuple[int, int], list] = defaultdict(lambda: [0, 0.0])
        inner = self._inner
        for ranks, launches, own in self.blocks():
            ops = np.where(launches != NO_LAUNCH, inner[np.maximum(launches, 0)] if len(inner) else NO_OP, NO_OP)
            for rank, op, cells in zip(ranks.tolist(), ops.tolist(), csv.reader(line.decode() for line in own)):
                entry = totals[(rank, op)]
                entry[0] += 1
                dur = cells[3]
                entry[1] += float(dur) if dur else 0.0
        ordered = sorted(totals.items(), key=lambda item: (item[0][0], -item[1][1]))
        lines = [",".join(GROUP_COLUMNS)]
        for (rank, op), (events, time_us) in ordered:
            name = cell(self.index.names[op]) if op != NO_OP else ""
            lines.append(f"{rank if rank >= 0 else ''},{name},{events},{round(time_us, 3)}")
        text = "\n".join(lines).encode()
        screen_csv(screen, text, -1)  # (the header is row -1)
        out.write(text + b"\n")
        return len(ordered)


INT64_SAFE = float(1 << 62)  # launch times below this convert to int64 exactly


def attribute(
    src: SourceSpec,
    dst: SinkSpec = "-",
    *,
    group_by: str | None = None,
    rank_map: str | dict | None = None,
    overwrite: bool = False,
    compress: str | None = None,
    salvage: bool = False,
    spool_dir: str | None = None,
    reread_remote: bool = False,
    progress: bool | str | None = False,
    jobs: int | str | None = None,
    summary_file: str | os.PathLike | None = None,
) -> dict:
    """Write the GPU-event attribution CSV (or, with ``group_by="op"``, GPU time per rank and cpu op).

    Columns: ``rank,pid,tid,ts,dur,cat,name,correlation,launch_name,launch_pid,
    launch_tid,launch_ts,cpu_op,root_op``; see the README.  Returns the summary.
    """
    if group_by not in (None, "op"):
        raise ValueError("group_by must be None or 'op'")
    started = time.perf_counter()
    mapping = load_rank_map(rank_map) if isinstance(rank_map, str) else rank_map
    processes = resolve_jobs(jobs)
    visitors: list[AttributeIndex] = []

    def make_visitor() -> AttributeIndex:
        for old in visitors:
            old.close()
        visitors.append(AttributeIndex(spool_dir))
        return visitors[-1]

    with InputSource(src, spool_dir=spool_dir, reread_remote=reread_remote) as source:
        destinations = Destinations([source.location], overwrite=overwrite, summary=summary_file)
        target = destinations.target(dst, compress=compress, holds="CSV")
        meter = Progress(source.size, enabled=progress)
        try:
            result = index_pass(source, make_visitor, keep_events=False, spool_dir=spool_dir, salvage=salvage,
                                progress=meter, jobs=processes)
            index: AttributeIndex = result.visitor  # type: ignore[assignment]
            index.finish()
            resolved = resolve(index, result.stats.header + result.stats.trailer, mapping)
            resolved.require_links("attribute")
            enclosure = Enclosure(index.launch_thread, index.launch_ts, index.launch_end,
                                  resolved.launches_with_gpu_work())
            enclosure.offer(index.ops.records())
            index.ops.close()
            attribution = Attribution(index, resolved, enclosure)
            screen = copy_screen()
            with target.open() as out:
                rows = (attribution.write_groups if group_by else attribution.write_csv)(out, screen)
        finally:
            for visitor in visitors:
                visitor.close()
    summary = resolved.summary()
    return destinations.finish({
        **source.describe(),
        "output": target.name,
        "rows": rows,
        "group_by": group_by,
        **summary,
        "cpu_ops_spilled": index.ops.count,
        "read": result.stats.as_dict(),
        **copied_secrets(screen.findings),
        "wall_seconds": round(time.perf_counter() - started, 3),
        "peak_rss_mb": peak_rss_mb(),
    })
