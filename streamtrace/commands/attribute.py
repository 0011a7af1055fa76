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

import io
import os
import re
import struct
import tempfile
import time
from array import array
from collections import defaultdict
from decimal import Decimal
from typing import IO, Iterator

import numpy as np
import orjson

from ..algo.enclosure import ANNOTATION, CPU_OP, NO_OP, Enclosure
from ..algo.links import NO_LAUNCH
from ..algo.parts import extend_converted, translated
from ..algo.ranks import rank_from_args
from ..engine.jobs import resolve_jobs
from ..engine.passes import index_pass
from ..io.configfiles import load_rank_map
from ..io.destinations import Destinations
from ..io.progress import Progress
from ..io.reader import decimal_as_json
from ..io.sink import SinkSpec
from ..io.source import InputSource, SourceSpec
from ..io.spool import EventSpool
from ..kineto import NUMBER_TYPES
from ..resources import peak_rss_mb
from .mergedindex import GPU, KEEP, LAUNCH, MergedIndex, Resolved, resolve

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
        if len(self._buffer) >= SPILL_FLUSH:
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


class AttributeIndex(MergedIndex):
    """Pass-1 visitor for ``attribute``: the merged index plus launch details,
    the GPU events' own columns (spooled) and the CPU ops (spilled)."""

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
        self.ops = OpSpill(spool_dir)
        self._listed = (0, 0)  # threads and names already in a part
        self._part_maps: dict[int, tuple[array, array]] = {}  # per pass-1 worker: its thread and name ids -> ours
        super().__init__()
        for category, kind in OP_KINDS.items():
            self.handlers[category] = self._op_handler(kind)

    _PART_LAUNCHES = ("launch_thread", "launch_name", "launch_end", "launch_ts_int")
    projection = None  # its own work is per event: chunks are read as dicts, whatever the merged index reads

    def take_part(self) -> dict:
        """The merged index's part, plus the launch details, GPU rows and CPU ops
        since the last part (see :mod:`streamtrace.engine.indexworkers`); threads
        and names keep their numbers, the new ones are listed."""
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
            correlation = args.get("correlation") if args.__class__ is dict else None
            self._rows.append(orjson.dumps([cell(event.get(key)) for key in ("pid", "tid", "ts", "dur", "cat", "name")]
                                           + [cell(correlation)]))
            if len(self._rows) >= GPU_BATCH:
                self._spool_rows()
        return action

    def finish(self) -> None:
        self.gpu_rows.add_lines(self._rows)
        self._rows.clear()


class Attribution:
    """Pass 2: the row of each GPU event, from its spooled columns and the links."""

    def __init__(self, index: AttributeIndex, resolved: Resolved, enclosure: Enclosure) -> None:
        self.index = index
        self.resolved = resolved
        self.enclosure = enclosure

    def _launch_cells(self, launch: int) -> list[str]:
        index, enclosure = self.index, self.enclosure
        pid, tid, _ = index.thread_keys[index.launch_thread[launch]]
        ts = index.launch_ts_text.get(launch)
        if ts is None:
            value = index.launch_ts[launch]
            ts = str(int(value)) if index.launch_ts_int[launch] else cell(value)
        inner, outer = enclosure.inner[launch], enclosure.outer[launch]
        return [cell(index.names[index.launch_name[launch]]), cell(pid), cell(tid), ts,
                cell(index.names[inner]) if inner != NO_OP else "",
                cell(index.names[outer]) if outer != NO_OP else ""]

    def rows(self) -> Iterator[tuple[int, int, list[str]]]:
        """(rank, launch ordinal, the GPU event's own cells) per GPU event, in input order."""
        buckets, launches = self.resolved.gpu_bucket, self.resolved.links.launch_of_gpu
        ordinal = 0
        for block in self.index.gpu_rows.read_blocks():
            for line in block:
                yield buckets[ordinal], launches[ordinal], orjson.loads(line)
                ordinal += 1

    def write_csv(self, out: io.TextIOBase) -> int:
        out.write(",".join(COLUMNS) + "\n")
        empty = [""] * 6
        written = 0
        batch: list[str] = []
        for rank, launch, own in self.rows():
            launch_cells = self._launch_cells(launch) if launch != NO_LAUNCH else empty
            batch.append(",".join([str(rank) if rank >= 0 else "", *own, *launch_cells]))
            if len(batch) >= GPU_BATCH:
                out.write("\n".join(batch) + "\n")
                batch.clear()
            written += 1
        if batch:
            out.write("\n".join(batch) + "\n")
        return written

    def write_groups(self, out: io.TextIOBase) -> int:
        """GPU time per (rank, innermost cpu op), largest first within a rank."""
        totals: dict[tuple[int, int], list] = defaultdict(lambda: [0, 0.0])
        inner = self.enclosure.inner
        for rank, launch, own in self.rows():
            op = inner[launch] if launch != NO_LAUNCH else NO_OP
            entry = totals[(rank, op)]
            entry[0] += 1
            dur = own[3]
            entry[1] += float(dur) if dur else 0.0
        out.write(",".join(GROUP_COLUMNS) + "\n")
        ordered = sorted(totals.items(), key=lambda item: (item[0][0], -item[1][1]))
        for (rank, op), (events, time_us) in ordered:
            name = cell(self.index.names[op]) if op != NO_OP else ""
            out.write(f"{rank if rank >= 0 else ''},{name},{events},{round(time_us, 3)}\n")
        return len(ordered)


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
        target = destinations.target(dst, compress=compress)
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
            with target.open() as raw:
                text = io.TextIOWrapper(raw, encoding="utf-8", newline="", write_through=False)
                rows = attribution.write_groups(text) if group_by else attribution.write_csv(text)
                text.flush()
                text.detach()
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
        "wall_seconds": round(time.perf_counter() - started, 3),
        "peak_rss_mb": peak_rss_mb(),
    })
