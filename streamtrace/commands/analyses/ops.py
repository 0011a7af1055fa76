"""``analyze --ops``: TraceLens's perf-report tables (ops and kernels), one
reading of each input, kept as typed arrays (a few numbers per host or GPU
event, interned names and op signatures) rather than event dicts.
"""
from __future__ import annotations

import csv
import io
import math
import os
from array import array
from decimal import Decimal

import numpy as np
import orjson

from ...algo import collectives, gpuspecs, opsfigures, opsreport, opsroofline, opstables, optree
from ...algo.opstables import CPU_OP, KERNEL, MEMCPY, MEMSET, RUNTIME, OpsFacts, Table
from ...algo.optree import NO_LINK
from ...engine.passes import read_with_retries
from ...errors import TraceError
from ...io.configfiles import load_spec
from ...io.destinations import Destinations
from ...io.jsonscan import member_value
from ...io.reader import TraceReader
from ...io.source import InputSource
from .collectives import KernelCollector, csv_text

HOST_CATS = {"cpu_op": CPU_OP, "cuda_runtime": RUNTIME, "cuda_driver": RUNTIME}
GPU_CATS = {"kernel": KERNEL, "gpu_memcpy": MEMCPY, "gpu_memset": MEMSET}
SIGNATURE_ARGS = ("Input Dims", "Input type", "Input Strides", "Concrete Inputs")
MODEL_ARGS = (*SIGNATURE_ARGS, "Output type")  # what the performance models read
# metadata event name -> the args member holding its value (TraceLens reads these three)
METADATA = {"process_name": "name", "process_labels": "labels", "thread_name": "name"}


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


class _Columns:
    """Typed columns appended an event at a time (8 bytes a value, or 1)."""

    def __init__(self, **codes: str) -> None:
        self.arrays = {name: array(code) for name, code in codes.items()}

    def add(self, **values: object) -> None:
        for name, value in values.items():
            self.arrays[name].append(value)

    def numpy(self, name: str) -> np.ndarray:
        return np.frombuffer(self.arrays[name], dtype=self.arrays[name].typecode).copy() if len(self.arrays[name]) \
            else np.empty(0, dtype=self.arrays[name].typecode)


class OpsCollector:
    """What one reading of a trace keeps for the ops tables: typed columns per
    host and GPU event, interned names, places and op signatures."""

    def __init__(self) -> None:
        self.names: dict[str, int] = {}
        self.places: dict[tuple, int] = {}  # (pid, tid) -> number
        self.signatures: dict[tuple, int] = {}
        self._signature_of_text: dict[bytes, int] = {}
        self.signature_values: list[list] = []
        self._other_links: dict[object, int] = {}  # ids that are no 63-bit integers -> numbers above them
        self.host = _Columns(thread="q", ts="d", end="d", kind="b", name="q", sig="q", uid="q", corr="q", ext="q",
                             seq="q", kernel="i", dur="d", dur_int="b", driver="b")
        self.gpu = _Columns(ts="d", end="d", dur="d", integral="b", cat="b", name="q", stream="d", dur_int="b",
                            place="q", corr="q", ext="q")
        self.flow_starts = array("q")
        self.flow_ends = _Columns(id="q", place="q")
        self.metadata: dict[tuple, object] = {}  # (pid, tid, process_name|process_labels|thread_name) -> value
        self.events = 0  # events seen: TraceLens's UID of the next one
        self.link_key: int | None = None  # 0 correlation, 1 External id: as the first launch call says
        self.has_cpu_ops = False
        self.python_stack = False
        self.untimed = 0
        self.collectives = KernelCollector()  # (for TraceLens's coll_analysis)

    def _link(self, value: object) -> int:
        value = _key(value)
        if value is None:
            return NO_LINK
        if isinstance(value, int) and -(1 << 62) < value < (1 << 62):
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

    def _visit(self, event: dict, uid: int) -> None:
        cat = event.get("cat")
        if event.get("ph") == "M" and event.get("name") in METADATA and isinstance(event.get("args"), dict):
            member = METADATA[event["name"]]
            self.metadata[(_key(event.get("pid")), _key(event.get("tid")), event["name"])] = event["args"].get(member)
        if cat == "ac2g":
            if event.get("ph") == "s":
                self.flow_starts.append(self._link(event.get("id")))
            elif event.get("ph") == "f":
                self.flow_ends.add(id=self._link(event.get("id")), place=self._place(event))
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
        name = event.get("name", "")
        corr, ext = self._link(args.get("correlation")), self._link(args.get("External id"))
        if kind is not None:
            if kind == RUNTIME and self.link_key is None and "launch" in str(name).lower():
                self.link_key = 0 if "correlation" in args else 1
            self.host.add(thread=self._place(event), ts=ts, end=ts + dur, kind=kind, name=self._name(name),
                          sig=self._signature([args.get(key) for key in MODEL_ARGS]), uid=uid, corr=corr, ext=ext,
                          seq=self._link(args.get("Sequence number")),
                          kernel=self._name(args["kernel"]) if isinstance(args.get("kernel"), str) else -1,
                          dur=dur, dur_int=isinstance(dur, int), driver=cat == "cuda_driver")
            return
        if gpu_cat == KERNEL and self.collectives.wanted(name):
            self.collectives.add(event, ts, dur, 0)
        stream = args.get("stream")
        stream = float(stream) if isinstance(stream, (int, float)) and not isinstance(stream, bool) else math.nan
        self.gpu.add(ts=ts, end=ts + dur, dur=dur, integral=isinstance(ts, int) and isinstance(dur, int), cat=gpu_cat,
                     name=self._name(name), stream=stream, dur_int=isinstance(dur, int), place=self._place(event),
                     corr=corr, ext=ext)

    def facts(self) -> OpsFacts:
        names = list(self.names)
        h, g = self.host.numpy, self.gpu.numpy
        facts = OpsFacts(
            names=names, h_thread=h("thread"), h_ts=h("ts"), h_end=h("end"), h_kind=h("kind"), h_name=h("name"),
            h_sig=h("sig"), g_ts=g("ts"), g_end=g("end"), g_dur=g("dur"), g_int=g("integral").astype(bool),
            g_cat=g("cat"), g_name=g("name"), g_stream=g("stream"), g_dur_int=g("dur_int").astype(bool),
            h_uid=h("uid"), h_seq=h("seq"), h_kernel=h("kernel"), threads=list(self.places), metadata=self.metadata,
            signatures=list(self.signatures),
            signature_values=self.signature_values,
            has_cpu_ops=self.has_cpu_ops, python_stack=self.python_stack, untimed=self.untimed, h_dur=h("dur"),
            h_dur_int=h("dur_int").astype(bool), h_driver=h("driver").astype(bool), events=self.events)
        key = "ext" if self.link_key == 1 else "corr"
        graph_names = np.array([name in opstables.GRAPH_LAUNCHES for name in names] or [False])
        runtime = facts.h_kind == RUNTIME
        run_link = np.where(runtime, h(key), NO_LINK)
        flow_starts = np.frombuffer(self.flow_starts, dtype=np.int64) if len(self.flow_starts) else np.empty(0, np.int64)
        run, gpu = optree.launch_links(run_link, runtime & graph_names[facts.h_name], g(key), g("place"), flow_starts,
                                       self.flow_ends.numpy("id"), self.flow_ends.numpy("place"))
        opstables.link(facts, run, gpu)
        return facts


def read_input(path: str, *, salvage: bool = False) -> tuple[OpsCollector, object]:
    """Read ``path`` once for the ops tables: what they are made of, and the
    trace's ``deviceProperties`` (the GPU the roofline is of)."""
    def attempt(reader: TraceReader) -> tuple[OpsCollector, object]:
        collector = OpsCollector()
        for event in reader.events():
            collector.visit(event)
        return collector, member_value(reader.stats.header + reader.stats.trailer, "deviceProperties")

    return read_with_retries(InputSource(path), attempt, salvage=salvage, label="ops")


def collect(path: str, *, salvage: bool = False) -> OpsCollector:
    """Read ``path`` once for the ops tables."""
    return read_input(path, salvage=salvage)[0]


def coll_analysis(kernels: KernelCollector) -> bytes | None:
    """TraceLens's ``coll_analysis``: its collective analyser's ``nccl_summary_long`` over this one trace,
    every collective kernel as rank 0 (the trace's place in the analyser's list of one); None without a row
    (no collective kernel, or every one with a missing key, which pandas' grouping drops)."""
    if not len(kernels.ts):
        return None
    rank = collectives.RankKernels(0, np.frombuffer(kernels.ts, dtype=np.float64).copy(),
                                   np.frombuffer(kernels.dur, dtype=np.float64).copy(),
                                   np.frombuffer(kernels.meta, dtype=np.int32).copy(), list(kernels.metas))
    summary = collectives.summary_long([rank])
    return csv_text(summary).encode("utf-8") if summary.rows else None


def collective_csv(collector: OpsCollector, tables: dict, facts: OpsFacts) -> dict[str, bytes]:
    """``coll_analysis`` by its stem, when TraceLens writes it: not when its
    report stopped before (no tables) or the trace is GPU-only."""
    if not tables or not facts.has_cpu_ops:
        return {}
    summary = coll_analysis(collector.collectives)
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
    collector = collect(path, salvage=salvage)
    facts = collector.facts()
    tables, notes = opsreport.perf_tables(facts, spec)
    return {**{stem: table_csv(table) for stem, table in tables.items()}, **collective_csv(collector, tables, facts)}, notes


def input_label(path: str, ranks: list[int]) -> str:
    """The folder of one input's tables: ``rank<N>`` for a rank file, else the file's name."""
    return f"rank{ranks[0]}" if len(ranks) == 1 else os.path.basename(path).split(".")[0]


def run(files: list[str], ranks_of_files: list[list[int]], *, salvage: bool = False,
        spec: dict | None = None) -> tuple[dict, list[str], dict]:
    """Every input's tables as ``{relative path: CSV bytes}`` (``ops/<label>/<stem>.csv``), notes, and
    what the page draws of each input (by label).

    ``spec`` (``--gpu-spec``) gives TraceLens's roofline columns; it, or
    else the built-in spec of the GPU the input's deviceProperties names,
    gives the roofline columns appended after them (:mod:`...algo.opsroofline`).
    TraceLens reads one trace: a merged multi-rank file gets one set of
    tables over all its ranks, as TraceLens would give (noted).
    """
    files_out: dict[str, bytes] = {}
    notes: list[str] = []
    parts: dict[str, dict] = {}
    spec_words: dict[str, list[str]] = {}  # what each input's roofline is of -> its labels
    for path, ranks in zip(files, ranks_of_files):
        label = input_label(path, ranks)
        collector, devices = read_input(path, salvage=salvage)
        facts = collector.facts()
        tables, found = opsreport.perf_tables(facts, spec)
        used, how, words = _spec_for(spec, devices)
        if used is not None:
            found += opsroofline.add_roofline(tables, used)
        spec_words.setdefault(words, []).append(label)
        parts[label] = opsfigures.page_part(tables, used, how)
        if len(ranks) > 1:
            found.append(f"{len(ranks)} ranks in one file: one set of tables over all of them, as TraceLens reads it")
        notes += [f"ops, {label}: {note}" for note in found]
        written = {**{stem: table_csv(table) for stem, table in tables.items()}, **collective_csv(collector, tables, facts)}
        for stem, data in written.items():
            files_out[os.path.join("ops", label, f"{stem}.csv")] = data
    notes = [f"ops, {', '.join(labels)}: {words}" for words, labels in spec_words.items()] + notes
    return files_out, notes, parts


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
