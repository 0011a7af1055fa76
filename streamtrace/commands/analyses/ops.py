"""``analyze --ops``: TraceLens's perf-report tables (ops and kernels), one
reading of each input, kept as typed arrays (a few numbers per host or GPU
event, interned names and op signatures) rather than event dicts.
"""
from __future__ import annotations

import csv
import io
import math
import os
from decimal import Decimal

import numpy as np

from ...algo import opstables
from ...algo.opstables import CPU_OP, KERNEL, MEMCPY, MEMSET, RUNTIME, OpsFacts, Table
from ...engine.passes import read_with_retries
from ...errors import TraceError
from ...io.destinations import Destinations
from ...io.reader import TraceReader
from ...io.source import InputSource

HOST_CATS = {"cpu_op": CPU_OP, "cuda_runtime": RUNTIME, "cuda_driver": RUNTIME}
GPU_CATS = {"kernel": KERNEL, "gpu_memcpy": MEMCPY, "gpu_memset": MEMSET}
SIGNATURE_ARGS = ("Input Dims", "Input type", "Input Strides", "Concrete Inputs")
# metadata event name -> the args member holding its value (TraceLens reads these three)
METADATA = {"process_name": "name", "process_labels": "labels", "thread_name": "name"}
LINK_KEYS = ("correlation", "External id")


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


class OpsCollector:
    """What one reading of a trace keeps for the ops tables."""

    def __init__(self) -> None:
        self.names: dict[str, int] = {}
        self.threads: dict[tuple, int] = {}
        self.signatures: dict[tuple, int] = {}
        self.host: list[tuple] = []  # (thread, ts, end, kind, name, signature, event number)
        self.host_links: list[tuple] = []  # per host event: its (correlation, External id)
        self.gpu: list[tuple] = []  # (ts, end, dur, ts and dur integers, cat, name, stream, dur an integer)
        self.metadata: dict[tuple, str] = {}  # (pid, tid, process_name|process_labels|thread_name) -> value
        self.events = 0  # events seen: TraceLens's UID of the next one
        self.gpu_at: list[dict] = [{}, {}]  # per link key: (pid, tid, id) -> GPU event (the last wins)
        self.gpu_by_id: list[dict] = [{}, {}]  # per link key: id -> its GPU events (graph launches)
        self.flow_starts: set = set()
        self.flow_ends: dict = {}
        self.link_key: int | None = None  # 0 correlation, 1 External id: as the first launch call says
        self.has_cpu_ops = False
        self.python_stack = False
        self.untimed = 0

    def _name(self, name: object) -> int:
        text = name if isinstance(name, str) else str(name)
        return self.names.setdefault(text, len(self.names))

    def visit(self, event: object) -> None:
        uid = self.events
        self.events += 1
        if isinstance(event, dict):
            self._visit(event, uid)

    def _visit(self, event: dict, uid: int) -> None:
        cat = event.get("cat")
        if event.get("ph") == "M" and event.get("name") in METADATA and isinstance(event.get("args"), dict):
            member = METADATA[event["name"]]
            self.metadata[(_key(event.get("pid")), _key(event.get("tid")), event["name"])] = event["args"].get(member)
        if cat == "ac2g":
            if event.get("ph") == "s":
                self.flow_starts.add(_key(event.get("id")))
            elif event.get("ph") == "f":
                self.flow_ends[_key(event.get("id"))] = (_key(event.get("pid")), _key(event.get("tid")))
            return
        if cat in ("cpu_op", "python_func"):
            self.has_cpu_ops = True
            self.python_stack = self.python_stack or cat == "python_func"
        kind = HOST_CATS.get(cat)
        gpu_cat = GPU_CATS.get(cat)
        if kind is None and gpu_cat is None:
            return
        args = event.get("args")
        args = args if isinstance(args, dict) else {}
        ts, dur = _number(event.get("ts")), _number(event.get("dur"))
        if ts is None or dur is None:
            self.untimed += 1
            return
        links = tuple(_key(args.get(key)) for key in LINK_KEYS)
        name = event.get("name", "")
        if kind is not None:
            if kind == RUNTIME and self.link_key is None and "launch" in str(name).lower():
                self.link_key = 0 if "correlation" in args else 1
            thread = self.threads.setdefault((_key(event.get("pid")), _key(event.get("tid"))), len(self.threads))
            sig = tuple(None if args.get(key) is None else str(_tupled(args[key])) for key in SIGNATURE_ARGS)
            signature = self.signatures.setdefault(sig, len(self.signatures))
            self.host.append((thread, ts, ts + dur, kind, self._name(name), signature, uid))
            self.host_links.append(links)
            return
        g = len(self.gpu)
        stream = args.get("stream")
        stream = float(stream) if isinstance(stream, (int, float)) and not isinstance(stream, bool) else math.nan
        self.gpu.append((ts, ts + dur, dur, isinstance(ts, int) and isinstance(dur, int), gpu_cat, self._name(name),
                         stream, isinstance(dur, int)))
        where = (_key(event.get("pid")), _key(event.get("tid")))
        for k, link in enumerate(links):
            if link is not None:
                self.gpu_at[k][(*where, link)] = g
                self.gpu_by_id[k].setdefault(link, []).append(g)

    def _runtime_links(self, names: list[str]) -> list[list[int]]:
        """Each host event's GPU events: a graph launch takes every GPU event
        of its id, another call the one its flow's end points at."""
        key = self.link_key or 0
        links: list[list[int]] = []
        for (_, _, _, kind, name, _, _), ids in zip(self.host, self.host_links):
            link = ids[key]
            found: list[int] = []
            if kind == RUNTIME and link is not None:
                if names[name] in opstables.GRAPH_LAUNCHES:
                    found = self.gpu_by_id[key].get(link, [])
                elif link in self.flow_starts and link in self.flow_ends:
                    g = self.gpu_at[key].get((*self.flow_ends[link], link))
                    found = [] if g is None else [g]
            links.append(found)
        return links

    def facts(self) -> OpsFacts:
        names = list(self.names)
        host = np.array(self.host, dtype=np.float64).reshape(-1, 7)
        gpu = np.array(self.gpu, dtype=np.float64).reshape(-1, 8)
        facts = OpsFacts(
            names=names, h_thread=host[:, 0].astype(np.int64), h_ts=host[:, 1], h_end=host[:, 2],
            h_kind=host[:, 3].astype(np.int8), h_name=host[:, 4].astype(np.int64), h_sig=host[:, 5].astype(np.int64),
            g_ts=gpu[:, 0], g_end=gpu[:, 1], g_dur=gpu[:, 2], g_int=gpu[:, 3].astype(bool),
            g_cat=gpu[:, 4].astype(np.int8), g_name=gpu[:, 5].astype(np.int64), g_stream=gpu[:, 6],
            g_dur_int=gpu[:, 7].astype(bool), h_uid=host[:, 6].astype(np.int64), threads=list(self.threads),
            metadata=self.metadata, signatures=list(self.signatures), has_cpu_ops=self.has_cpu_ops,
            python_stack=self.python_stack)
        opstables.link(facts, self._runtime_links(names))
        return facts


def collect(path: str, *, salvage: bool = False) -> OpsFacts:
    """Read ``path`` once for the ops tables."""
    def attempt(reader: TraceReader) -> OpsCollector:
        collector = OpsCollector()
        for event in reader.events():
            collector.visit(event)
        return collector

    return read_with_retries(InputSource(path), attempt, salvage=salvage, label="ops").facts()


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


def ops_tables(path: str, *, salvage: bool = False) -> tuple[dict[str, bytes], list[str]]:
    """TraceLens's perf-report CSVs for one trace, by file stem, and notes."""
    facts = collect(path, salvage=salvage)
    tables, notes = opstables.perf_tables(facts)
    return {stem: table_csv(table) for stem, table in tables.items()}, notes


def input_label(path: str, ranks: list[int]) -> str:
    """The folder of one input's tables: ``rank<N>`` for a rank file, else the file's name."""
    return f"rank{ranks[0]}" if len(ranks) == 1 else os.path.basename(path).split(".")[0]


def run(files: list[str], ranks_of_files: list[list[int]], *, salvage: bool = False) -> tuple[dict, list[str]]:
    """Every input's tables as ``{relative path: CSV bytes}`` (``ops/<label>/<stem>.csv``), and notes.

    TraceLens reads one trace: a merged multi-rank file gets one set of
    tables over all its ranks, as TraceLens would give (noted).
    """
    files_out: dict[str, bytes] = {}
    notes: list[str] = []
    for path, ranks in zip(files, ranks_of_files):
        label = input_label(path, ranks)
        tables, found = ops_tables(path, salvage=salvage)
        if len(ranks) > 1:
            found.append(f"{len(ranks)} ranks in one file: one set of tables over all of them, as TraceLens reads it")
        notes += [f"ops, {label}: {note}" for note in found]
        for stem, data in tables.items():
            files_out[os.path.join("ops", label, f"{stem}.csv")] = data
    return files_out, notes


def claim(destinations: Destinations, out_dir: str | None) -> None:
    """Before reading: ``--ops`` writes under ``out_dir/ops/``, refused if that
    already holds files (unless overwriting)."""
    if out_dir is None:
        raise TraceError("--ops writes TraceLens's tables as CSV files: give -o DIR")
    destinations.directory(os.path.join(out_dir, "ops"), writes="the ops tables", existing=r".+")


def write(destinations: Destinations, out_dir: str, files: dict[str, bytes]) -> list[str]:
    """Write the tables (inside the run's ``with destinations``); their paths."""
    paths = []
    for relative, data in files.items():
        path = os.path.join(out_dir, relative)
        destinations.directory(os.path.dirname(path), writes="the ops tables")
        destinations.write(path, data, role="ops table")
        paths.append(path)
    return paths
