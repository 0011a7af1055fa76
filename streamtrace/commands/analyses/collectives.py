"""``analyze``'s collective report (SPEC 16): TraceLens's multi-rank tables
(:mod:`streamtrace.algo.collectives`) from the collective kernels pass 1
finds.

Pass 1 keeps, per NCCL/RCCL kernel, its start, duration, pid slot, own
``args.rank`` and an index into the distinct collective args seen (40
bytes a kernel, in a temporary file beyond a budget:
:mod:`streamtrace.io.kernelfiles`); once the file's ranks are known each
rank's kernels become a :class:`RankKernels` (a file of its own when they
were on disk), and the
coordinator makes the tables from every rank's, collective by collective:
the kernels' records on disk beyond a budget and the long tables' rows
written to temporary files as they are made, then copied into the CSVs
(:mod:`streamtrace.io.collectivespill`).
"""
from __future__ import annotations

import csv
import dataclasses
import io
import math
import os
from array import array
from dataclasses import dataclass
from typing import Iterable, Iterator

import numpy as np

from ...algo import collectivefigures, collectivematch, collectivereport
from ...algo import collectives as tables
from ...algo.collectives import META, RankKernels, Report, Table
from ...algo.collectivetables import ALL2ALLV_RECORD
from ...io import kernelfiles, streamjson
from ...io.collectivesort import DiskOrder
from ...io.collectivespill import PartTable, RowPart, SpilledKernels
from ...io.destinations import Destinations
from ...io.kernelfiles import COLUMNS, RankFiles, opened, packed, remove
from ...io.projection import attribute
from ...io.valuespill import ValueSpill

NO_RANK = -1
JSON_ROWS = 100_000  # beyond this a table is left to -o DIR (as dicts 100,000 rows take about 100 MB)
_ATTRIBUTES = [attribute(key) for key in META]  # the projected args' attributes, in META's order
PEER_ARGS = {"send": "Dst Rank", "recv": "Src Rank"}  # the arg naming a send's or recv's peer (global rank)
_PEER_ATTRIBUTES = {name: attribute(key) for name, key in PEER_ARGS.items()}
STREAM_AT = META.index("stream")
COMMS_OP = "record_param_comms"  # the CPU op c10d wraps a collective's launch in
STRIDE_ARGS = ("Process Group Name", "Global rank start", "Global rank stride", "Group size")  # its args naming its group
_STRIDE_ATTRIBUTES = [attribute(key) for key in STRIDE_ARGS]


def _on_own_stream(values: list, original_stream: object) -> list:
    """A kernel's args in META's order, its stream the one it ran on where compact or merge moved it
    to a display lane (``args.original_stream``): a merged file's tables are its rank files'."""
    if original_stream is not None:
        values[STREAM_AT] = original_stream
    return values


@dataclass
class CollectiveInput:
    """One rank's collective kernels (with its file's pg_config) and its file's deviceProperties count
    (TraceLens's GPUs per node); ``path``: the file holding the kernels (memory maps), if pass 1 put them on
    disk: pickled, the input names it rather than holding its kernels."""

    kernels: RankKernels
    devices: int
    path: str | None = None

    def __getstate__(self) -> dict:
        state = dict(self.__dict__)
        if self.path is not None:
            state["count"] = len(self.kernels.ts)
            state["kernels"] = dataclasses.replace(self.kernels, ts=None, dur=None, meta=None, seq=None, peer=None)
        return state

    def __setstate__(self, state: dict) -> None:
        count = state.pop("count", 0)
        self.__dict__.update(state)
        if self.path is not None:
            self.kernels = _on_file(self.kernels, self.path, count)


def _on_file(kernels: RankKernels, path: str, count: int) -> RankKernels:
    """A rank's kernels read from their file (memory maps of its columns)."""
    found = opened(path, count)
    return dataclasses.replace(kernels, ts=found["ts"], dur=found["dur"], meta=found["meta"], seq=found["seq"],
                               peer=found["peer"])


class KernelCollector:
    """Pass 1's collective kernels: TraceLens's (category ``kernel``, a NCCL/RCCL name, a correlation or
    External id), each with its start, duration, pid slot, own ``args.rank``, collective args, ``Seq``
    and a send's or recv's peer."""

    def __init__(self, directory: str | None = None, collect: bool = True) -> None:
        self.collect = collect  # (False: no kernel is wanted)
        self.directory = directory  # where the columns go beyond kernelfiles.COLUMN_BYTES (None: they stay in memory)
        self._file: SpilledKernels | None = None  # (the columns on disk, as records)
        self._ranks: RankFiles | None = None  # each rank's kernels, once the columns are on disk
        self.ts, self.dur = array("d"), array("d")
        self.slot, self.rank, self.meta, self.peer = array("i"), array("i"), array("i"), array("i")
        self.seq = array("q")
        self.strides: dict[str, tuple | None] = {}  # group name -> (first rank, stride, size) its comms ops state
        self.metas: dict[tuple, int] = {}
        self._listed = 0  # metadata rows already in a part
        self._names: dict[object, bool] = {}
        self._part_metas: dict[int, array] = {}  # per pass-1 worker: its metadata rows -> ours

    def wanted(self, name: object) -> bool:
        """Is a kernel of this name a collective kernel (cached per name)."""
        found = self._names.get(name)
        if found is None:
            found = self._names[name] = self.collect and tables.is_collective_kernel(name)
        return found

    def add(self, event: dict, ts: float, dur: float, slot: int) -> None:
        """A kernel whose name :meth:`wanted`, as parsed (a dict)."""
        args = event.get("args")
        if args.__class__ is dict and (args.get("correlation") is not None or args.get("External id") is not None):
            self._add(_on_own_stream([args.get(key) for key in META], args.get("original_stream")), event.get("name"),
                      ts, dur, slot, args.get("rank"), args.get("Seq"),
                      {name: args.get(key) for name, key in PEER_ARGS.items()})

    def add_comms_op(self, event: dict) -> None:
        """A record_param_comms op, as parsed: its group's first global rank, stride and size."""
        args = event.get("args")
        if args.__class__ is dict:
            self._stride([args.get(key) for key in STRIDE_ARGS])

    def add_projected_comms_ops(self, events: list, cats: list) -> None:
        """The record_param_comms ops among a chunk's projected events (``cats``: their categories)."""
        self.add_comms_ops_among([events[at] for at, cat in enumerate(cats) if cat == "cpu_op"])

    def add_comms_ops_among(self, cpu_ops: list) -> None:
        """The record_param_comms ops among projected ``cpu_op`` events."""
        for event in cpu_ops:
            if event.name == COMMS_OP and event.args is not None:
                self._stride([getattr(event.args, name) for name in _STRIDE_ATTRIBUTES])

    def _stride(self, values: list) -> None:
        name, found = values[0], tuple(collectivematch.whole(value) for value in values[1:])
        if name.__class__ is str and collectivematch.NO_VALUE not in found:
            self._merge({name: found})

    def _merge(self, strides: dict) -> None:
        """Groups' strides; a name stated with two strides is dropped (None): its ranks are not known."""
        for name, found in strides.items():
            if self.strides.setdefault(name, found) != found:
                self.strides[name] = None

    def kernels(self, events: list, cats: list) -> list:
        """The collective kernels among a chunk's projected events (``cats``: their categories)."""
        return self.kernels_among([events[at] for at, cat in enumerate(cats) if cat == "kernel"])

    def kernels_among(self, kernels: list) -> list:
        """The collective kernels among projected ``kernel`` events."""
        wanted = self.wanted
        return [event for event in kernels if wanted(event.name)]

    def add_projected(self, kernels: list, slot_of) -> None:
        """Projected collective kernels (:meth:`kernels`; their args projected: io.projection.COLLECTIVE_ARGS)."""
        for event in kernels:
            args = event.args
            if args is None or (args.correlation is None and args.External_id is None):
                continue
            ts, dur = event.ts, event.dur
            if ts.__class__ in (int, float) and dur.__class__ in (int, float):
                self._add(_on_own_stream([getattr(args, name) for name in _ATTRIBUTES], args.original_stream),
                          event.name, float(ts), float(dur),
                          slot_of(event.pid), args.rank, args.Seq,
                          {name: getattr(args, key) for name, key in _PEER_ATTRIBUTES.items()})

    def _add(self, values: list, name: str, ts: float, dur: float, slot: int, rank: object, seq: object,
             peers: dict) -> None:
        values = [tables.hashable(value) for value in values]
        values[tables.NAME] = tables.collective_name(values[tables.NAME], name)
        meta = tuple(values)
        at = self.metas.get(meta)
        if at is None:
            at = self.metas[meta] = len(self.metas)
        self.ts.append(ts)
        self.dur.append(dur)
        self.slot.append(slot)
        self.rank.append(rank if rank.__class__ is int and 0 <= rank < 2**31 else NO_RANK)
        self.meta.append(at)
        self.seq.append(collectivematch.whole(seq))
        self.peer.append(collectivematch.whole(peers.get(values[tables.NAME])) if values[tables.NAME] in peers
                         else collectivematch.NO_VALUE)

    def take_part(self) -> dict:
        """What was collected since the last part; metadata rows new since then are listed."""
        part = {name: getattr(self, name)[:] for name in ("ts", "dur", "slot", "rank", "meta", "seq", "peer")}
        for name in part:
            del getattr(self, name)[:]
        part["metas"] = list(self.metas)[self._listed:]
        part["strides"], self.strides = self.strides, {}
        self._listed = len(self.metas)
        return part

    def absorb(self, part: dict, source: int, slots: array) -> None:
        """Worker ``source``'s part, its pid slots mapped by ``slots``."""
        metas = self._part_metas.setdefault(source, array("i"))
        self._merge(part["strides"])
        for meta in part["metas"]:
            metas.append(self.metas.setdefault(meta, len(self.metas)))
        self.ts.extend(part["ts"])
        self.dur.extend(part["dur"])
        self.rank.extend(part["rank"])
        self.seq.extend(part["seq"])
        self.peer.extend(part["peer"])
        self.slot.extend(array("i", [slots[slot] for slot in part["slot"]]))
        self.meta.extend(array("i", [metas[meta] for meta in part["meta"]]))

    def _columns(self) -> dict[str, np.ndarray]:
        return {name: np.frombuffer(getattr(self, name), dtype=COLUMNS[name]) for name in COLUMNS.names}

    def spill(self) -> None:
        """The columns held to disk, once they are more than :data:`~streamtrace.io.kernelfiles.COLUMN_BYTES`
        (with a directory only; analyze's joined index calls it, not its pass-1 workers, whose parts it absorbs)."""
        held = len(self.ts) * COLUMNS.itemsize
        if self.directory is None or not held or (self._file is None and held <= kernelfiles.COLUMN_BYTES):
            return
        if self._file is None:
            self._file = SpilledKernels(self.directory, budget=0, dtype=COLUMNS)
        self._file.append(packed(self._columns(), COLUMNS))
        for name in COLUMNS.names:
            del getattr(self, name)[:]

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None

    def of_rank(self, rank: int, slot_ranks: list[int], devices: int, groups: dict | None = None) -> CollectiveInput:
        """A rank's kernels (a kernel's own args.rank, else its pid's), in file order; ``groups``: its
        file's pg_config (group name -> ranks), with the groups the comms ops state by stride besides.
        Columns on disk give each rank's kernels a file (made for every rank at the first call)."""
        groups = {**self._strided(), **(groups or {})}
        self.spill()
        if self._file is not None or self._ranks is not None:
            if self._ranks is None:
                self._ranks = self._by_rank(slot_ranks)
            path, count = self._ranks.files.get(rank, (None, 0))
            kernels = RankKernels(rank, np.empty(0), np.empty(0), np.empty(0, np.int32), list(self.metas), groups=groups)
            return CollectiveInput(kernels if path is None else _on_file(kernels, path, count), devices, path)
        columns = self._columns()
        rows = np.flatnonzero(_ranks_of(columns, slot_ranks) == rank)
        return CollectiveInput(RankKernels(rank, *(columns[name][rows] for name in ("ts", "dur", "meta")),
                                           list(self.metas), columns["seq"][rows], columns["peer"][rows], groups),
                               devices)

    def _by_rank(self, slot_ranks: list[int]) -> RankFiles:
        """Every rank's kernels to its file, the columns read back a block at a time."""
        found = RankFiles(self.directory)  # type: ignore[arg-type]
        held = self._file.seal()  # type: ignore[union-attr]
        for start in range(0, len(held), tables.RECORD_BLOCK):
            block = np.array(held[start:start + tables.RECORD_BLOCK])
            ranks = _ranks_of(block, slot_ranks)
            order = np.argsort(ranks, kind="stable")  # (file order within a rank)
            ranks, block = ranks[order], block[order]
            firsts = np.flatnonzero(np.r_[True, ranks[1:] != ranks[:-1]])
            for first, end in zip(firsts.tolist(), [*firsts[1:].tolist(), len(ranks)]):
                found.append(int(ranks[first]), block[first:end])
        self.close()
        return found

    def _strided(self) -> dict[str, tuple[int, ...]]:
        """Group name -> its ranks, from the comms ops' first rank, stride and size."""
        return {name: found for name, found in ((name, collectivematch.strided_ranks(*value))
                for name, value in self.strides.items() if value is not None) if found is not None}


def _ranks_of(columns, slot_ranks: list[int]) -> np.ndarray:
    """Each kernel's rank: its own args.rank, else its pid's."""
    own = columns["rank"]
    return np.where(own >= 0, own, np.array(slot_ranks + [NO_RANK], dtype=np.int64)[columns["slot"]])


def device_count(members: list, member_value) -> int:
    """How many GPUs the file's deviceProperties lists (0 without it)."""
    devices = member_value(members, "deviceProperties")
    return len(devices) if isinstance(devices, list) else 0


def pg_config(members: list, member_value) -> dict[str, tuple[int, ...]]:
    """The file's ``distributedInfo.pg_config``: group name -> its ranks (whole lists only)."""
    return collectivematch.pg_config_ranks(member_value(members, "distributedInfo"))


def collective_report(inputs: list[CollectiveInput], heatmap: bool = False, align_clocks: bool = False,
                      spool_dir: str | None = None, keep: int | None = None) -> Report:
    """TraceLens's tables for the ranks' kernels (every rank's, in rank order); GPUs per node from the
    first rank's file, as TraceLens takes them from its first file; ``align_clocks``: the tables beyond
    TraceLens's on clocks aligned on collective ends.  The kernels' records, the long tables' rows, the
    summaries' kept columns and the sort ordering each rank's kernels go to temporary files in ``spool_dir``
    beyond a budget (:mod:`streamtrace.io.collectivespill`, :mod:`streamtrace.io.valuespill`,
    :mod:`streamtrace.io.collectivesort`), a long table's rows kept for the summary while at most ``keep``
    (:data:`JSON_ROWS` by default; 0: none; the report's lines read its ``figures``, :class:`Gathered`);
    the inputs' kernel arrays are emptied as their records are made, and their files (pass 1's beyond its
    budget) removed; :func:`close` lets the rows go."""
    if not inputs:
        return Report({}, [])
    keep = JSON_ROWS if keep is None else keep
    store = SpilledKernels(spool_dir)
    all2allv = SpilledKernels(spool_dir, dtype=ALL2ALLV_RECORD)
    values = ValueSpill(spool_dir)
    parts: list[RowPart] = []
    gathered = Gathered()
    order = DiskOrder(spool_dir)

    def rows(name: str) -> tables.Rows:
        parts.append(RowPart(spool_dir, keep))
        watch = gathered.watches.get(name)
        return parts[-1] if watch is None else Watched(parts[-1], watch)

    try:
        found = collectivereport.report([given.kernels for given in inputs], gpus_per_node=inputs[0].devices or None,
                                        world_size=inputs[-1].kernels.rank + 1, heatmap=heatmap,
                                        align_clocks=align_clocks, store=store, rows=rows, column=values.column,
                                        let_go=True, orderer=order, spill=order, all2allv_store=all2allv)
    except BaseException:
        for part in parts:
            part.close()
        raise
    finally:
        store.close()
        all2allv.close()
        values.close()
        for given in inputs:
            if given.path is not None:
                remove(given.path)
    found.sinks = parts
    found.figures = gathered.figures(found, keep)
    return found


_RULE_AT = collectivematch.MATCH_COLUMNS.index("match")
_WAIT_AT = collectivereport.BANDWIDTH_COLUMNS.index("wait for last (us)")


class Gathered:
    """What the report's lines say of collective_matches and collective_bandwidth (a row per collective),
    gathered as their rows are made, so that no row need be read back for them: the collectives matched by
    each rule, and the one whose first rank waited longest for the last."""

    def __init__(self) -> None:
        self.rules: dict[str, int] = {}
        self.longest: list | None = None
        self.watches = {"collective_matches": self._match, "collective_bandwidth": self._bandwidth}

    def _match(self, row: list) -> None:
        self.rules[row[_RULE_AT]] = self.rules.get(row[_RULE_AT], 0) + 1

    def _bandwidth(self, row: list) -> None:
        if self.longest is None or row[_WAIT_AT] > self.longest[_WAIT_AT]:  # (the first of the longest)
            self.longest = row

    def figures(self, report: Report, keep: int) -> dict:
        """The summary's ``collectives``: each table's rows, the most rows of a table its ``tables`` carry,
        the collectives matched per rule, the longest wait's collective_bandwidth row."""
        bandwidth = report.tables.get("collective_bandwidth")
        return {"rows": {name: _length(table) for name, table in report.tables.items()}, "rows_in_summary": keep,
                "matched": dict(self.rules),
                "longest_wait": None if self.longest is None or bandwidth is None else
                _records(bandwidth.columns, [self.longest])[0]}


class Watched(tables.Rows):
    """A table's rows on their way to ``part``, each shown to ``watch`` first."""

    def __init__(self, part: RowPart, watch) -> None:
        super().__init__()
        self.part, self.watch = part, watch

    def add(self, row: list | dict, key: object = None) -> None:
        self.watch(row)
        self.part.add(row, key)

    def __len__(self) -> int:
        return len(self.part)

    def table(self, columns: list[str], by_key: bool = False) -> PartTable:  # type: ignore[override]
        return self.part.table(columns, by_key)


def close(report: Report) -> None:
    """Let go of the files holding the report's long tables."""
    for part in report.sinks:
        part.close()


def add_causes(report: Report, hta_tables: dict) -> None:
    """The report's straggler_causes, from its straggler summary and HTA's kernel and temporal breakdowns."""
    stragglers = report.tables.get("straggler_summary")
    if stragglers is not None:
        report.tables["straggler_causes"] = collectivereport.straggler_causes(
            _records(stragglers.columns, stragglers.rows), hta_tables.get("kernel_breakdown") or [],
            hta_tables.get("temporal_breakdown") or [])


def claim(destinations: Destinations, out_dir: str | os.PathLike | None) -> dict[str, str]:
    """Reserve the report's CSV files (written only for the tables the inputs give)."""
    if out_dir is None:
        return {}
    directory = destinations.directory(out_dir, writes="the tables' CSV files")
    targets = {name: os.path.join(directory, f"{name}.csv") for name in tables.TABLE_NAMES}
    destinations.claim_all(targets.values(), role="table")
    return targets


def write(destinations: Destinations, report: Report, targets: dict[str, str]) -> list[str]:
    """One CSV per table the report holds (a long table copied from its file); returns the paths written."""
    written = []
    for name, table in report.tables.items():
        if name in targets:
            with destinations.open(targets[name], role="table") as out:
                if isinstance(table, PartTable):
                    table.write(out)
                else:
                    out.write(csv_text(table).encode())
            written.append(targets[name])
    return written


def csv_text(table: Table) -> str:
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(table.columns)
    writer.writerows([[_cell(value) for value in row] for row in table.rows])
    return out.getvalue()


def _cell(value: object) -> object:
    return "" if _missing(value) else value


def as_records(report: Report, keep: int | None = None) -> dict[str, list[dict] | None]:
    """The tables as lists of rows (column -> value), for the summary (NaN as None); a table is None there
    when longer than :data:`JSON_ROWS` (its CSV has it), as analyze's launch statistics, a long table (its
    rows in a file, read back) when longer than ``keep`` (default :data:`JSON_ROWS`)."""
    keep = JSON_ROWS if keep is None else keep
    found: dict[str, list[dict] | None] = {}
    for name, table in report.tables.items():
        if isinstance(table, PartTable):
            rows = table.each_row() if len(table) <= keep else None
        else:
            rows = table.rows if len(table.rows) <= JSON_ROWS else None
        found[name] = None if rows is None else _records(table.columns, rows)
    return found


def streamed_records(report: Report) -> dict[str, SummaryRows | None]:
    """The long tables as :func:`as_records` gives them (None where it gives None), each read back from its files
    as the summary is written (:class:`SummaryRows`), so that no table's rows are held; the short tables as lists."""
    found: dict[str, SummaryRows | None] = {}
    for name, table in report.tables.items():
        if isinstance(table, PartTable):
            found[name] = SummaryRows(table) if table.part.typed else None
        else:
            found[name] = _records(table.columns, table.rows) if len(table.rows) <= JSON_ROWS else None
    return found


class SummaryRows(streamjson.Streamed):
    """A long table's rows in the summary: dicts (column -> value, NaN as None) read back from its files one at a
    time whenever iterated, until the report is closed (:func:`close`)."""

    def __init__(self, table: PartTable) -> None:
        self.table = table

    def __iter__(self) -> Iterator[dict]:
        columns = self.table.columns
        return (_record(columns, row) for row in self.table.each_row() or ())

    def __len__(self) -> int:
        return len(self.table)

    def close(self) -> None:
        self.table.part.close()


def _length(table: Table | PartTable) -> int:
    return len(table) if isinstance(table, PartTable) else len(table.rows)


def _records(columns: list[str], rows: Iterable[list]) -> list[dict]:
    return [_record(columns, row) for row in rows]


def _record(columns: list[str], row: list) -> dict:
    return {name: value if value == value else None for name, value in zip(columns, row)}  # (NaN as None)


def _missing(value: object) -> bool:
    return value is None or (isinstance(value, float) and math.isnan(value))


def report_rows(summary: dict) -> list[tuple[str, str]]:
    """The default report's lines on collectives: who arrives last and what the others lose waiting,
    how the collectives were matched (collective_matches), why, and the collective waited on longest."""
    found = summary["tables"]
    stragglers = found.get("straggler_summary")
    if not stragglers:
        return []
    last = stragglers[0]
    if len(stragglers) == 1:
        count = last["num_collectives"]
        return [("collectives", f"{count:,} collective{'' if count == 1 else 's'}, all on rank {last['rank']}: "
                                f"{collectivefigures.ONE_RANK}")]
    waited = sum(row["total_wait_time_us"] for row in stragglers[1:])
    rows = [("collectives", f"rank {last['rank']} arrives last at {last['times_arrived_last']} of "
                            f"{last['num_collectives']} collectives; the other ranks wait {waited / 1e3:,.1f} ms in all")]
    figures = summary.get("collectives") or {}
    rules = figures.get("matched") or {}
    if rules:
        rows.append(("matched", ", ".join(f"{rules[rule]:,} collectives by {rule}" for rule in ("Seq", "order")
                                          if rules.get(rule)) + " (TraceLens's tables: by order)"))
    causes = {row["rank"]: row["why"] for row in found.get("straggler_causes") or []}
    if causes.get(last["rank"]):
        rows.append(("why", causes[last["rank"]].split(": ", 1)[1]))
    worst = figures.get("longest_wait")
    if worst:
        rows.append(("longest wait", f"{worst['wait for last (us)']:,.0f} us for rank {worst['last arrival rank']} at "
                                     f"{worst['Collective name']} {worst['collective_id']} (latency "
                                     f"{worst['latency (us)']:,.0f} us, bus {_number_text(worst['bus bw (GB/s, 1e9)'])} GB/s)"))
    return rows


def _number_text(value: object) -> str:
    return "n/a" if _missing(value) else f"{value:,.1f}"
