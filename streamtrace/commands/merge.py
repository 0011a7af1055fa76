"""``merge``: per-rank traces into one aligned, rank-correct timeline (SPEC 5, 6).

Phase 1, per input (in ``jobs`` worker processes): the index pass with
:class:`MergeIndex` (compact's index plus the pids and the largest id), then
the rank's compaction plan.  The heavy part (indexes, plan, event spool) is
parked in a temporary file so the coordinating process holds only small
facts.  Between the phases: ranks, PP order, time offsets, fresh pids, one
id multiplier, and every PP arrow.  Phase 2 streams the ranks one after the
other, in PP order, into one output.
"""
from __future__ import annotations

import dataclasses
import functools
import gc
import io
import os
import pickle
import re
import tempfile
import time
from array import array
from bisect import bisect_left
from contextlib import closing, contextmanager
from dataclasses import dataclass, field
from decimal import Decimal
from typing import BinaryIO, Callable, Iterable, Iterator, Sequence

import orjson
import zstandard

from ..algo.mergeplan import (
    NAMING_METADATA,
    EventRewrite,
    RankFacts,
    check_unique_ranks,
    fresh_pids,
    pp_order,
    process_metadata,
    shared_multiplier,
    time_offsets_ns,
)
from ..algo.pp import parse_pp_name
from ..algo.pparrows import (
    FLOW_ID_BASE,
    PEER_ABSENT,
    Arrow,
    ArrowMaker,
    Span,
    arrow_events,
    find_blocks,
    local_arrows,
    send_recv_arrows,
)
from ..algo.ranks import pp_group_ranks, rank_from_file_name
from ..algo.secrets import Findings
from ..algo.steps import parse_int_list
from ..engine.executors import TaskRunner, Work, shared_path
from ..engine.jobs import resolve_jobs
from ..engine.passes import SPOOL_BATCH, IndexResult, batches, emit_events, index_pass
from ..engine.plan import EmitPlan, patched_lines
from ..errors import TraceError
from ..io.archive import outer_path
from ..io.configfiles import load_rules
from ..io.destinations import Destinations
from ..io.eventtext import dumps_event, event_loader
from ..io.inputs import expand_inputs, trace_names_in
from ..io.jsonscan import RawMember, member_value
from ..io.objectstore import RunStore, assemble_s3, join_objects, part_groups, same_s3_store, scratch
from ..io.progress import Meter, Progress
from ..io.reader import ReadStats, header_members
from ..io.redact import (
    RedactOptions,
    Redactor,
    copy_redactor,
    pseudonymizes_hosts,
    redaction_summary,
    summed_redaction,
)
from ..io.remote import RemoteReader, is_url
from ..io.sink import OutputTarget, SinkSpec, compressed, remove_quietly
from ..io.source import InputSource, directory_glob
from ..io.textfields import INTEGER, NUMBER, Convert, field_pattern, positions, swap_fields, swap_in_lines, swap_one
from ..io.writer import JoinedLines, TraceWriter
from ..kineto import NUMBER_TYPES
from ..resources import peak_rss_mb
from .batch import staged
from .compactemit import CompactPlan, MovedBlock
from .compactindex import CompactIndex
from .compactplan import Compaction, plan_compaction
from .mergedindex import MergedIndex, resolve

STAGE_FILE = re.compile(r"pp_stage\d+\.json(\.gz|\.zst)?")  # merge --per-stage's files
STAGE_SUFFIX = {None: ".json.gz", "gzip": ".json.gz", "zstd": ".json.zst", "none": ".json"}
CHUNK_LEVEL = 1
CHUNK_PIECE = 1 << 20
_FLOW_PHASE = re.compile(rb'"ph":"[stf]"')
_FLOW_PHASES = ("s", "t", "f")  # a tuple: a list-valued ph compares unequal instead of failing to hash


def discover_inputs(specs: Sequence[str | os.PathLike]) -> list[str]:
    """Trace files named by ``specs``: files, directories (their rank trace
    files) and glob patterns, in the order given."""
    return expand_inputs(specs, rank_files_in)


def rank_files_in(directory: str) -> list[str]:
    """The traces in ``directory`` whose rank is known: from the name
    (``rank<N>``, ``worker<N>``), else from ``distributedInfo.rank`` in the
    file's header; when none is, the error lists what was there."""
    found = [os.path.join(directory, name) for name in trace_names_in(directory)
             if rank_from_file_name(name) is not None or header_rank(os.path.join(directory, name)) is not None]
    if not found:
        seen = ", ".join(sorted(os.listdir(directory))[:8]) or "nothing"
        raise TraceError(f"no trace here states its rank (rank<N> or worker<N> in the name, or distributedInfo.rank); "
                         f"seen: {seen}; give the files or a glob, e.g. {directory_glob(directory)}", path=directory)
    return found


def header_rank(path: str) -> int | None:
    """``distributedInfo.rank`` when the file's header states it (None for anything unreadable)."""
    try:
        with InputSource(path) as source:
            info = member_value(header_members(source.open()), "distributedInfo")
    except (TraceError, OSError):
        return None
    rank = info.get("rank") if isinstance(info, dict) else None
    return rank if type(rank) is int else None


def parse_rank_list(text: str) -> set[int]:
    """``0-7,12`` -> {0, ..., 7, 12}."""
    return parse_int_list(text, "--ranks")


class MergeIndex(CompactIndex):
    """Compact's index plus what merging needs: every pid and the largest
    correlation or flow id (to size the rank-unique ids), and what lets
    pass 2 rewrite whole blocks of lines as text: one byte per event for
    "has an integer ``args.correlation``" and for "is a flow with an integer
    id", how many non-metadata events lack a pid or a ts, and where the
    events are that must be decoded (metadata, ``correlation_raw`` present).
    """

    splits_by_ranges = False  # its own per-event arrays are not in compact's parts (merge runs one process per rank)

    def __init__(self, rules) -> None:
        super().__init__(rules)
        self.pids: dict = {}  # pid -> has events other than metadata
        self.process_names: dict = {}
        self.named_pids: set = set()  # pids with a process_name or thread_name
        self.correlated = bytearray()
        self.flows_with_id = bytearray()
        self.decode_at = array("q")
        self._largest = [0]
        self._irregular = [0]
        self._first_ts: list = [None]
        self.rank_evidence: MergedIndex | None = MergedIndex()  # as relink sees it: one file, one rank?
        self.visit = self._with_ids(self.visit)

    @property
    def max_id(self) -> int:
        return self._largest[0]

    @property
    def first_ts(self) -> float | None:
        """The ts of the first event that has a number as ts."""
        return self._first_ts[0]

    @property
    def regular(self) -> bool:
        """Does every non-metadata event have a pid and a ts (of any type)?"""
        return not self._irregular[0]

    def _with_ids(self, compact_visit: Callable[[dict], None]) -> Callable[[dict], None]:
        pids, largest, irregular, correlated = self.pids, self._largest, self._irregular, self.correlated
        first_ts, process_names, named_pids = self._first_ts, self.process_names, self.named_pids
        # the rank evidence's handlers called directly (its own visit would cost a call per event and
        # record pass-2 actions merge does not use)
        rank_handlers, rank_metadata = self.rank_evidence.handlers, self.rank_evidence.metadata
        mark_correlated, mark_flow, mark_decode = correlated.append, self.flows_with_id.append, self.decode_at.append

        def visit(event: dict) -> None:
            compact_visit(event)
            get = event.get
            pid = get("pid")
            phase = get("ph")
            rank_handler = rank_handlers.get(get("cat"))
            if rank_handler is not None:
                rank_handler(event)
            if first_ts[0] is None and get("ts").__class__ in NUMBER_TYPES:
                first_ts[0] = get("ts")
            if phase == "M":
                mark_decode(len(correlated))
                rank_metadata(event)
                if pid not in pids:
                    pids[pid] = False
                if get("name") in NAMING_METADATA:
                    named_pids.add(pid)
                if get("name") == "process_name" and (args := get("args")).__class__ is dict:
                    process_names[pid] = args.get("name")
            elif pids.get(pid) is not True:
                pids[pid] = True
            if phase != "M" and (pid is None or get("ts") is None) and ("pid" not in event or "ts" not in event):
                irregular[0] += 1
            args = get("args")
            correlation = args.get("correlation") if args.__class__ is dict else None
            if correlation.__class__ is int:
                if "correlation_raw" in args:
                    mark_decode(len(correlated))
                mark_correlated(1)
                if correlation > largest[0]:
                    largest[0] = correlation
            else:
                mark_correlated(0)
            if phase in _FLOW_PHASES and (flow_id := get("id")).__class__ is int:
                mark_flow(1)
                if flow_id > largest[0]:
                    largest[0] = flow_id
            else:
                mark_flow(0)

        return visit


@dataclass
class RankIndex:
    """Phase 1's result for one input: small facts kept by the coordinator,
    and the path of the parked heavy state (index, plan, spool)."""

    facts: RankFacts
    rank_source: str
    header: list[RawMember]
    trailer: list[RawMember]
    compaction_summary: dict | None
    pp_spans: list[Span]
    pp_tracks: tuple[set, set]
    state_path: str
    spool_path: str
    pass1_seconds: float
    plan_seconds: float
    backend: object
    read: dict  # the reading's stats
    secrets: Findings = field(default_factory=Findings)  # what pass 1's screen found (see ``copy_redactor``)

    @property
    def events(self) -> int:
        return self.read["events"]


@dataclass
class _Parked:
    index: CompactIndex
    compaction: Compaction | None
    spool: object
    stats: ReadStats = field(repr=False)


@dataclass(frozen=True)
class _PhaseOneOptions:
    compact: bool
    original_stream: bool
    pp_flows: bool
    rules: str | None
    spool_dir: str | None
    salvage: bool
    reread_remote: bool
    learn_hosts: bool = False  # the output pseudonymizes host names: pass 1 learns the input's


def index_rank(path: str, options: _PhaseOneOptions, progress: Meter | None = None) -> RankIndex:
    """Phase 1 for one input (runs in a worker process when jobs > 1)."""
    rules = load_rules(options.rules)
    with InputSource(path, spool_dir=options.spool_dir, reread_remote=options.reread_remote) as source:
        result: IndexResult = index_pass(source, lambda: MergeIndex(rules), keep_events=True,
                                         spool_dir=options.spool_dir, salvage=options.salvage, progress=progress,
                                         jobs=1, learn_hosts=options.learn_hosts)  # -j N = N busy processes: one per rank
    try:
        return _plan_rank(path, result, options)
    except BaseException:
        result.spool.close()
        raise
    finally:
        del result
        gc.collect()  # the index's hot-loop closure makes a cycle: free this rank's arrays before the next


def _index_rank_in_store(path: str, options: _PhaseOneOptions, store: RunStore) -> RankIndex:
    """Phase 1 on a worker that shares only a bucket with the others: the
    rank's parked state and spool are made on the worker's disk, then kept
    as objects of the run (phase 2 may run on another worker)."""
    with scratch() as local:
        entry = index_rank(path, dataclasses.replace(options, spool_dir=local))
        entry.state_path = store.put(entry.state_path)
        entry.spool_path = store.put(entry.spool_path)
    return entry


def _plan_rank(path: str, result: IndexResult, options: _PhaseOneOptions) -> RankIndex:
    index: MergeIndex = result.visitor  # type: ignore[assignment]
    members = result.stats.header + result.stats.trailer
    _refuse_several_ranks(path, index, members)
    planned = time.perf_counter()
    compaction = None
    if options.compact and index.slice_start:
        try:
            compaction = plan_compaction(index, members, pp_flows=options.pp_flows, local_arrows=False,
                                         original_stream=options.original_stream, scratch=options.spool_dir)
        except TraceError as exc:
            raise exc.located(path)
    spans, tracks = _pp_spans(index, compaction) if options.pp_flows else ([], (set(), set()))
    info = member_value(members, "distributedInfo")
    rank, rank_source = _rank_of(path, info)
    base = member_value(members, "baseTimeNanoseconds")
    gpu_pids = {index.stream_keys[stream][0] for stream in set(index.slice_stream)}
    # a pid with metadata only stays when the input names it (tools find tracks by those names)
    kept = [pid for pid, has_events in index.pids.items() if has_events or pid in index.named_pids]
    facts = RankFacts(path, rank, base if type(base) is int else None, pp_group_ranks(info), kept,
                      gpu_pids, index.max_id, index.first_ts, index.process_names,
                      {pid for pid, has_events in index.pids.items() if not has_events})
    handle, state_path = tempfile.mkstemp(prefix="streamtrace-rank-", suffix=".pickle", dir=options.spool_dir)
    with os.fdopen(handle, "wb") as state:
        pickle.dump(_Parked(index, compaction, result.spool, result.stats), state, protocol=pickle.HIGHEST_PROTOCOL)
    return RankIndex(
        facts, rank_source, result.stats.header, result.stats.trailer,
        None if compaction is None else compaction.summary, spans, tracks, state_path, result.spool.path,
        round(result.seconds, 3), round(time.perf_counter() - planned, 3),
        info.get("backend") if isinstance(info, dict) else None, result.stats.as_dict(), result.secrets,
    )


def _refuse_several_ranks(path: str, index: MergeIndex, members: list[RawMember]) -> None:
    """A file that already merges ranks would enter the merge as one rank
    (its ranks' ids colliding, a rank twice): refuse it."""
    found = resolve(index.rank_evidence, members).ranks_for_certain()
    index.rank_evidence = None  # not parked: only this answer was needed
    if len(found) > 1:
        raise TraceError(f"holds several ranks ({', '.join(map(str, found))}), found per pid as relink finds them; "
                         "merge takes one file per rank: run 'streamtrace split' on it first", path=path)


def _rank_of(path: str, info: object) -> tuple[int, str]:
    if isinstance(info, dict) and type(info.get("rank")) is int:
        return info["rank"], "distributedInfo.rank"
    rank = rank_from_file_name(path)
    if rank is None:
        raise TraceError("no distributedInfo.rank and no rank<N> in the file name", path=path)
    return rank, "file name"


def _pp_spans(index: CompactIndex, compaction: Compaction | None) -> tuple[list[Span], tuple[set, set]]:
    """The PP spans arrows are made from: after compaction its spans, else
    every PP-named annotation where it stands (every track counts)."""
    if compaction is not None:
        return compaction.pp_spans, compaction.pp_tracks
    spans = []
    for n, label in enumerate(index.note_name):
        if label >= 0 and parse_pp_name(index.label_names[label]):
            pid, tid = index.stream_keys[index.note_stream[n]]
            spans.append(Span(pid, tid, index.label_names[label], index.note_start[n], index.note_end[n]))
    tracks = {(span.pid, span.tid) for span in spans}
    return spans, (tracks, tracks)


class _KeyedTexts(dict):
    """Old number text -> key and new number text; a number not in the map
    keeps its text (the key is prefixed all the same)."""

    def __init__(self, key: bytes, pairs: Iterable[tuple[bytes, bytes]]) -> None:
        super().__init__((old, key + new) for old, new in pairs)
        self.key = key

    def __missing__(self, number: bytes) -> bytes:
        return self.key + number


class MergePlan(EmitPlan):
    """Pass 2 for one rank: compaction's patch (when compacting), then the
    merge rewrite of every event; the rank's appended events follow."""

    def __init__(self, parked: _Parked, rewrite: EventRewrite, extra_events: Iterable[dict]) -> None:
        index, compaction = parked.index, parked.compaction
        self.rewrite = rewrite
        self.extra_events = extra_events
        self._index = index
        self._loads = event_loader(parked.stats.exact_numbers)
        self._compact = CompactPlan(index, compaction, parked.stats.exact_numbers) if compaction is not None else None
        if self._compact is not None:
            self.actions, self.patchers = index.actions, self._compact.patchers
        else:
            self.actions = bytearray(len(index.actions))  # every line as it is, before the rewrite
        self._pid_texts = _KeyedTexts(b'"pid":', ((b"%d" % old, b"%d" % new) for old, new in rewrite.pid_map.items()
                                                if old.__class__ is int))
        self._id_offset = rewrite.unique(0)  # a rank-unique id is the raw id plus this
        self._patterns = {key: field_pattern(key, number) for key, number in
                          ((b'"pid":', INTEGER), (b'"tid":', INTEGER), (b'"ts":', NUMBER),
                           (b'"correlation":', INTEGER), (b'"id":', INTEGER))}
        dense = rb'"pid":(' + INTEGER.pattern + rb')?(?:,"tid":(' + INTEGER.pattern + rb'))?'
        if rewrite.offset_ns:
            dense += rb'(?:,"ts":(' + NUMBER.pattern + rb'))?'
        self._dense = re.compile(dense)

    def lines(self, block: list[bytes], first_index: int) -> list[bytes] | JoinedLines:
        """Compaction's moves and the merge rewrite, on the whole block at once when that is exact."""
        if self._compact is None:
            moved = MovedBlock(list(block), None, None, lambda: None)
        else:
            moved = self._compact.moved_block(block, first_index)
        if moved is not None and self._index.regular:
            rewritten = self._rewrite_block(moved, first_index, first_index + len(block))
            if rewritten is not None:
                moved.commit()
                return rewritten
        out = []
        for line in patched_lines(self, block, first_index):
            line = self._rewrite_line(line)
            if line is not None:
                out.append(line)
        return out

    def _rewrite_block(self, moved: MovedBlock, first: int, end: int) -> JoinedLines | None:
        """The block rewritten as one text, or None when that is not exact.

        The ids some events carry (an integer ``args.correlation``, a flow's
        integer id: pass 1 marked which) are changed in the lines that have
        them, joined for one split.  The fields every event has (pid, tid, ts)
        are changed in the joined block by one split on ``"pid":`` that also
        takes the ``"tid":`` and ``"ts":`` right after it (their order in
        Kineto's events), from ``map`` over C functions, with no Python step
        per line; every event has one ``"pid":`` key, so as many matches as
        lines, each with its numbers, is exact (else each field is split on
        its own, with the same count check).  Blocks with events pass 1
        marked for decoding (metadata, whose names get prefixed; a
        ``correlation_raw`` already there) go line by line.
        """
        decode_at = self._index.decode_at
        marked = bisect_left(decode_at, first)
        if marked < len(decode_at) and decode_at[marked] < end:
            return None
        lines = moved.lines
        for marks, pattern, convert in ((self._index.correlated, self._patterns[b'"correlation":'], self._correlations),
                                        (self._index.flows_with_id, self._patterns[b'"id":'], self._flow_ids)):
            if not swap_in_lines(lines, positions(marks[first:end], 1), pattern, convert):
                return None
        kept, tids = moved.kept()
        if not kept:
            return None
        joined = b"\n".join(kept) if self._compact is None else self._compact.streams_swapped(moved, kept)
        if joined is not None:
            joined = self._swap_dense(joined, len(kept), tids)
        return None if joined is None else JoinedLines(joined, len(kept))

    def _swap_dense(self, joined: bytes, count: int, tids: array | None) -> bytes | None:
        """pid, tid (``tids``: compaction's, or None) and the shifted ts of every line of ``joined``."""
        parts = self._dense.split(joined)
        stride = self._dense.groups + 1
        found = [parts[group::stride] for group in range(1, stride)]
        if len(found[0]) == count and not any(None in numbers for numbers in found):
            parts[1::stride] = self._pids(found[0])
            parts[2::stride] = self._tids(tids, b',"tid":')(found[1])
            if self.rewrite.offset_ns:
                parts[3::stride] = map(b",".__add__, self._times(found[2]))
            return b"".join(parts)
        patterns = self._patterns
        fields = [(patterns[b'"pid":'], self._pids, count)]
        if tids is not None:
            fields.append((patterns[b'"tid":'], self._tids(tids, b'"tid":'), count))
        if self.rewrite.offset_ns:
            fields.append((patterns[b'"ts":'], self._times, count))
        return swap_fields(joined, fields)

    def _tids(self, tids: array | None, prefix: bytes) -> Convert:
        if tids is None:
            return lambda numbers: map(prefix.__add__, numbers)
        return self._compact.tid_swap(tids, prefix)

    def _rewrite_line(self, line: bytes) -> bytes | None:
        """The merged form of one event line (blocks that cannot be rewritten whole).

        Most lines change only numeric fields (pid, ts, correlation, flow
        id): those are swapped in the text, a fraction of the cost of
        decoding and re-encoding, with the same result (a time shift is the
        same decimal sum).  Anything else (metadata names, a field found
        twice or not a number, an ``id`` outside a flow) takes
        :meth:`_decoded`.
        """
        if b'"ph":"M"' in line or b'"correlation_raw"' in line:
            return self._decoded(line)
        patterns = self._patterns
        swapped = swap_one(line, patterns[b'"pid":'], self._pids)
        if swapped is not None and self.rewrite.offset_ns and b'"ts":' in swapped:
            swapped = swap_one(swapped, patterns[b'"ts":'], self._times)
        if swapped is not None and b'"correlation":' in swapped:
            swapped = swap_one(swapped, patterns[b'"correlation":'], self._correlations)
        if swapped is not None and b'"id":' in swapped:
            swapped = swap_one(swapped, patterns[b'"id":'], self._flow_ids) if _FLOW_PHASE.search(swapped) else None
        return self._decoded(line) if swapped is None else swapped

    def _pids(self, numbers: list[bytes]) -> Iterable[bytes]:
        return map(self._pid_texts.__getitem__, numbers)

    def _times(self, numbers: list[bytes]) -> Iterable[bytes]:
        """Shifted by the rank's offset as a decimal sum, like :meth:`EventRewrite.apply`."""
        shifted = map(self.rewrite.offset_us.__add__, map(Decimal, map(bytes.decode, numbers)))
        return map(str.encode, map('"ts":{}'.format, shifted))

    def _correlations(self, numbers: list[bytes]) -> Iterable[bytes]:
        """The rank-unique id, then the original as ``correlation_raw``."""
        return map(b'"correlation":%d,"correlation_raw":%s'.__mod__,
                   zip(map(self._id_offset.__add__, map(int, numbers)), numbers))

    def _flow_ids(self, numbers: list[bytes]) -> Iterable[bytes]:
        return map(b'"id":%d'.__mod__, map(self._id_offset.__add__, map(int, numbers)))

    def _decoded(self, line: bytes) -> bytes | None:
        event = self.rewrite.apply(self._loads(line))
        return None if event is None else dumps_event(event)

    def appended(self) -> Iterator[bytes]:
        if self._compact is not None:
            self._compact.check_slices_written()
            for event in self._compact.compaction.new_events():
                event = self.rewrite.apply(event)
                if event is not None:
                    yield dumps_event(event)
        for event in self.extra_events:
            yield dumps_event(event)


def _merged_output_name(files: list[str], has_pp: bool) -> str:
    directory = os.path.dirname(os.path.abspath(outer_path(files[0])))
    name = "pp_traces_merged_compacted.json.gz" if has_pp else "merged_compacted.json.gz"
    return os.path.join(directory, name)


def merge(
    srcs: Sequence[str | os.PathLike] | str | os.PathLike,
    dst: SinkSpec | None = None,
    *,
    compact: bool = True,
    original_stream: bool = True,
    pp_flows: bool = True,
    jobs: int | str | None = None,
    ranks: str | set[int] | None = None,
    overwrite: bool = False,
    rules: str | None = None,
    compress: str | None = None,
    level: int | None = None,
    salvage: bool = False,
    spool_dir: str | None = None,
    reread_remote: bool = False,
    progress: bool | str | None = False,
    dask: str | None = None,
    redact: RedactOptions | bool | None = None,
    summary_file: str | os.PathLike | None = None,
    per_stage: bool = False,
) -> dict:
    """Merge per-rank traces into one aligned timeline (the ``merge`` command); returns the summary.

    ``dask``: the address of a Dask scheduler to run the per-rank tasks on
    (default ``$STREAMTRACE_DASK``, else ``jobs`` processes here); it needs a
    ``spool_dir`` that every worker shares: a directory, or a bucket URL
    (``s3://bucket/prefix``) where the tasks keep their files as objects.
    ``per_stage``: ``dst`` is a directory that receives one merge per PP
    stage (see :func:`_per_stage`).
    """
    started = time.perf_counter()
    redactor = Redactor.from_options(redact)
    files = discover_inputs([srcs] if isinstance(srcs, (str, os.PathLike)) else list(srcs))
    wanted = parse_rank_list(ranks) if isinstance(ranks, str) else ranks
    if wanted is not None:
        files = [path for path in files if rank_from_file_name(path) in (wanted | {None})]
    if len(files) < 2:
        raise TraceError(f"merge needs at least two rank traces, got {len(files)}")
    destinations = Destinations(files, overwrite=overwrite, summary=summary_file)
    if per_stage:
        if not isinstance(dst, (str, os.PathLike)):
            raise TraceError("--per-stage writes one file per PP stage: give their directory with -o DIR/")
        destinations.directory(dst, writes="--per-stage's files", existing=STAGE_FILE.pattern)
    elif dst is not None:  # refuse a bad output now, not after reading every input
        destinations.check(dst, compress=compress)
    with TaskRunner(resolve_jobs(jobs), dask=dask, spool_dir=spool_dir, progress=progress, objects=True) as runner:
        if runner.distributed:
            files = [shared_path(path) for path in files]
        if per_stage and runner.store is not None:
            raise TraceError("--per-stage's tasks write the stages' files into the output directory: give --spool-dir "
                             "a directory every worker shares, not a bucket URL")
        options = _PhaseOneOptions(compact, original_stream, pp_flows, rules, runner.work_dir, salvage, reread_remote,
                                   pseudonymizes_hosts(redactor))
        # every rank's files are in the run's directory (or prefix), removed with it whatever happens
        if runner.store is None:
            indexed = list(runner.ordered(index_rank, [(path, options) for path in files], label="ranks indexed",
                                          work=Work.reading(files)))
        else:
            indexed = list(runner.ordered(_index_rank_in_store, [(path, options, runner.store) for path in files],
                                          label="ranks indexed"))
        if wanted is not None:
            for dropped in [entry for entry in indexed if entry.facts.rank not in wanted]:
                _discard(dropped)
            indexed = [entry for entry in indexed if entry.facts.rank in wanted]
            if len(indexed) < 2:
                raise TraceError(f"--ranks leaves {len(indexed)} trace(s); merge needs at least two")
        if per_stage:
            return destinations.finish(_per_stage(indexed, os.fspath(dst), destinations, compress=compress,  # type: ignore[arg-type]
                                                  level=level, pp_flows=pp_flows, runner=runner, redact=redact,
                                                  started=started))
        return destinations.finish(_phase_two(indexed, dst, destinations, compress=compress, level=level,
                                              pp_flows=pp_flows, runner=runner, progress=progress,
                                              started=started, redactor=copy_redactor(redactor, _found(indexed))))


def _found(indexed: list[RankIndex]) -> Findings:
    """What pass 1 found in these ranks' inputs, together: secrets (counted,
    for whether their copy is screened) and host names (for their pseudonyms)."""
    found = Findings()
    for entry in indexed:
        found.absorb(entry.secrets, 0)
    return found


def _discard(entry: RankIndex) -> None:
    """Delete a rank's parked state and its spool now (a rank left out frees its disk before the others' pass 2;
    objects stay until the run's prefix goes)."""
    if is_url(entry.state_path):
        return
    remove_quietly(entry.state_path)
    remove_quietly(entry.spool_path)


@dataclass
class _OutputPlan:
    """Everything the coordinator decides for one merged output, from the ranks' small facts."""

    indexed: list[RankIndex]
    order: list[int]  # positions in ``indexed``, in PP order
    pp_ranks: list[int]
    order_source: str
    rewrites: dict[int, EventRewrite]
    extras: dict[int, list[dict]]
    offsets: list[int]
    alignment: str
    warnings: list[str]
    multiplier: int
    arrows: list[Arrow]
    arrow_counts: dict
    header: list[RawMember]
    trailer: list[RawMember]
    has_pp: bool

    def rank_events(self) -> list[int]:
        """Per rank, in output order, the events its pass 2 reads."""
        return [self.indexed[n].events for n in self.order]

    def rank_calls(self, chunk_dir: str | None = None) -> list[tuple]:
        """Per rank, in output order, what its pass 2 needs (state, rewrite, added events[, fragment folder])."""
        tail = () if chunk_dir is None else (chunk_dir,)
        return [(self.indexed[n].state_path, self.rewrites[n], self.extras[n], *tail) for n in self.order]

    def object_calls(self, store: RunStore, pieces: list[_Piece | None] | None = None) -> list[tuple]:
        """Per rank, in output order, what its pass 2 on a worker that shares
        only the bucket needs (the objects of its state and spool; ``pieces``:
        how each writes its fragment, default the zstd one spliced here)."""
        pieces = pieces or [None] * len(self.order)
        return [(self.indexed[n].state_path, self.indexed[n].spool_path, self.rewrites[n], self.extras[n], store, piece)
                for n, piece in zip(self.order, pieces)]

    def arrow_lines(self) -> Iterator[bytes]:
        return (dumps_event(event) for event in arrow_events(self.arrows))


def _plan_output(indexed: list[RankIndex], pp_flows: bool) -> _OutputPlan:
    """Order, clocks, pids, ids and arrows of the merge of ``indexed`` (what ``merge --ranks`` of them decides)."""
    facts = [entry.facts for entry in indexed]
    check_unique_ranks(facts)
    pp_ranks, pipelines, order_source = pp_order(facts)
    offsets, common_base, warnings, alignment = time_offsets_ns(facts)
    order = sorted(range(len(indexed)), key=lambda n: (pp_ranks[n], facts[n].rank))
    pid_maps = dict(zip(order, fresh_pids([facts[n] for n in order])))
    multiplier = shared_multiplier(facts)
    has_pp = any(entry.pp_spans for entry in indexed) or any(fact.pp_group for fact in facts)
    rewrites = {
        n: EventRewrite(facts[n].rank, pid_maps[n], offsets[n],
                        f"PP rank {pp_ranks[n]} | " if has_pp else f"rank {facts[n].rank} | ", multiplier)
        for n in order
    }
    arrows, arrow_counts = _arrows(indexed, rewrites, pp_ranks, pipelines, multiplier) if pp_flows else ([], {})
    first = indexed[order[0]]
    merged_info = {"backend": first.backend, "ranks": [facts[n].rank for n in order], "pp_rank_count": len(order)}
    replacements = {"baseTimeNanoseconds": common_base, "distributedInfo": merged_info,
                    "traceName": "streamtrace merge of " + ", ".join(str(facts[n].rank) for n in order)}
    extras = {n: process_metadata(facts[n], pid_maps[n], pp_ranks[n] if has_pp else None) for n in order}
    return _OutputPlan(indexed, order, pp_ranks, order_source, rewrites, extras, offsets, alignment, warnings,
                       multiplier, arrows, arrow_counts, _replace_members(first.header, replacements),
                       _replace_members(first.trailer, replacements, add_missing=first.header), has_pp)


def _phase_two(indexed: list[RankIndex], dst: SinkSpec | None, destinations: Destinations, *, compress: str | None,
               level: int | None, pp_flows: bool, runner: TaskRunner, progress: bool | str | None,
               started: float, redactor: Redactor | None = None) -> dict:
    plan = _plan_output(indexed, pp_flows)
    dst = _merged_output_name([entry.facts.path for entry in indexed], plan.has_pp) if dst is None else dst
    target = destinations.target(dst, compress=compress, level=level, redactor=redactor)
    pass2_started = time.perf_counter()
    assembly = None
    if _assembles_in_store(runner, target):
        written, assembly = _assemble_in_store(plan, target, runner)
    else:
        with target.open() as out:
            writer = TraceWriter(out, plan.header, target.redactor)
            work = Work("pass 2", "events", plan.rank_events())
            if runner.inline:
                meter = Progress(None, enabled=progress)
                calls = plan.rank_calls()
                for done, call in enumerate(calls):
                    _emit_rank(*call, writer, work.share(meter, done, f"ranks written: {done}/{len(calls)}"))
                    meter.count("ranks written", done + 1, len(calls))
                meter.done()
            elif runner.store is None:
                _emit_ranks_in_workers(plan.rank_calls(runner.work_dir), writer, runner, work)
            else:
                _emit_ranks_in_workers(plan.object_calls(runner.store), writer, runner)
            _close_output(writer, plan.arrow_lines(), plan.trailer)
        written = writer.events_written
    return {**_output_summary(plan, target.name, written, pass2_started), "assembled_in_store": assembly,
            **redaction_summary(redactor), "wall_seconds": round(time.perf_counter() - started, 3),
            "peak_rss_mb": peak_rss_mb()}


def _close_output(writer: TraceWriter, arrows: Iterable[bytes], trailer: list[RawMember]) -> None:
    """The arrows after every rank's events, then the trailer."""
    for lines in batches(arrows, SPOOL_BATCH):
        writer.events(lines)
    writer.close(trailer)


def _output_summary(plan: _OutputPlan, output: str, written: int, pass2_started: float) -> dict:
    indexed, order, pp_ranks = plan.indexed, plan.order, plan.pp_ranks
    facts = [entry.facts for entry in indexed]
    return {
        "input": [fact.path for fact in facts],
        "output": output,
        "ranks": len(indexed),
        "events_read": sum(entry.events for entry in indexed),
        "events_written": written,
        "time_alignment": plan.alignment,
        "time_offsets_us": {str(facts[n].rank): plan.offsets[n] / 1000 for n in range(len(indexed))},
        "pp_order": plan.order_source,
        "pp_ranks": [{"pp_rank": pp_ranks[n], "global_rank": facts[n].rank, "file": facts[n].path,
                      "rank_from": indexed[n].rank_source} for n in order],
        "id_multiplier": plan.multiplier,
        **plan.arrow_counts,
        "pp_ranks_not_merged": sorted({rank for fact in facts for rank in fact.pp_group or ()}
                                      - {fact.rank for fact in facts}),
        "per_rank_compaction": {str(facts[n].rank): indexed[n].compaction_summary for n in order},
        "warnings": plan.warnings,
        "read": {str(facts[n].rank): indexed[n].read for n in order},
        "pass1_seconds": {str(facts[n].rank): indexed[n].pass1_seconds for n in order},
        "plan_seconds": {str(facts[n].rank): indexed[n].plan_seconds for n in order},
        "pass2_seconds": round(time.perf_counter() - pass2_started, 3),
    }


def _per_stage(indexed: list[RankIndex], directory: str, destinations: Destinations, *, compress: str | None,
               level: int | None, pp_flows: bool, runner: TaskRunner, redact: RedactOptions | bool | None,
               started: float) -> dict:
    """One merged file per PP stage, written at once by as many tasks.

    Each stage's file is what ``merge --ranks`` of that stage's ranks writes
    (its own clock base, pids, ids and arrows); the SEND->RECV arrows that
    join two stages have no file to live in and are counted instead (from
    the plan of the whole merge).  The files are written into a hidden
    folder in ``directory`` and appear together, or none does.
    """
    stages = _stages([entry.facts for entry in indexed])
    whole = _plan_output(indexed, pp_flows)
    finals = {stage: os.path.join(directory, f"pp_stage{stage}{STAGE_SUFFIX[compress]}") for stage in stages}
    for stage, final in finals.items():
        destinations.claim(final, compress=compress, role=f"file of PP stage {stage}")
    plans = {stage: _plan_output([indexed[n] for n in members], pp_flows) for stage, members in stages.items()}
    pass2_started = time.perf_counter()
    with staged(list(finals.values()), destinations.overwrite) as paths:
        jobs = [_StageWrite(path, compress, level, redact, _found(plan.indexed), plan.rank_calls(), plan.header,
                            plan.trailer, list(plan.arrow_lines())) for path, plan in zip(paths, plans.values())]
        written = list(runner.ordered(_write_stage, [(job,) for job in jobs], label="stages written"))
    per_stage = [{"pp_stage": stage, **_output_summary(plans[stage], finals[stage], events, pass2_started), **redaction}
                 for stage, (events, redaction) in zip(plans, written)]
    summed = {key: sum(entry[key] for entry in per_stage) for key in whole.arrow_counts}
    return {
        **_output_summary(whole, "", sum(entry["events_written"] for entry in per_stage), pass2_started),
        **summed,
        "output": list(finals.values()),
        "time_offsets_us": {rank: offset for entry in per_stage for rank, offset in entry["time_offsets_us"].items()},
        **({"pp_cross_stage_arrows": sum(1 for arrow in whole.arrows if arrow[5] != arrow[6])} if pp_flows else {}),
        "stages": per_stage,
        **summed_redaction(per_stage),
        "wall_seconds": round(time.perf_counter() - started, 3),
        "peak_rss_mb": peak_rss_mb(),
    }


def _stages(facts: list[RankFacts]) -> dict[int, list[int]]:
    """Input positions by PP stage (each rank's index in its PP process
    group), stages in order; refused when the ranks have no stages."""
    pp_ranks, pipelines, _ = pp_order(facts)
    if pipelines[0] is None:
        without = [fact.rank for fact in facts if fact.pp_group is None or fact.rank not in fact.pp_group]
        raise TraceError(f"--per-stage needs every rank's PP stage (its PP process group in distributedInfo); "
                         f"{len(without)} of the {len(facts)} ranks have none (global ranks "
                         f"{', '.join(map(str, sorted(without)[:8]))}{', ...' if len(without) > 8 else ''}): "
                         "merge them without --per-stage")
    if max(len(pipeline) for pipeline in pipelines) < 2:
        raise TraceError(f"--per-stage: the {len(facts)} ranks have no pipeline stages (PP process groups of one "
                         "rank); merge them without --per-stage")
    stages: dict[int, list[int]] = {}
    for n in sorted(range(len(facts)), key=pp_ranks.__getitem__):
        stages.setdefault(pp_ranks[n], []).append(n)
    return stages


@dataclass(frozen=True)
class _StageWrite:
    """What a task needs to write one stage's file alone: the ranks' pass 2
    calls, the merged header and trailer, the arrows as event lines."""

    path: str
    compress: str | None
    level: int | None
    redact: RedactOptions | bool | None
    found: Findings  # what pass 1 found in the stage's ranks
    ranks: list[tuple]
    header: list[RawMember]
    trailer: list[RawMember]
    arrows: list[bytes]


def _write_stage(job: _StageWrite) -> tuple[int, dict]:
    """One stage's file (a task); returns its events written and its redaction summary.

    The task can run again (Dask reruns a task whose worker died): it keeps
    the ranks' states and spools, and replaces a file an earlier attempt left."""
    target = OutputTarget(job.path, overwrite=True, compress=job.compress, level=job.level,
                          redactor=copy_redactor(Redactor.from_options(job.redact), job.found))
    with target.open() as out:
        writer = TraceWriter(out, job.header, target.redactor)
        for call in job.ranks:
            _emit_rank(*call, writer, keep=True)
        _close_output(writer, job.arrows, job.trailer)
    return writer.events_written, redaction_summary(target.redactor)


def _emit_rank(state_path: str, rewrite: EventRewrite, extra: list[dict], writer: TraceWriter,
               meter: Meter | None = None, *, keep: bool = False, spool_path: str | None = None) -> int:
    """Pass 2 of one rank into ``writer``; returns the events written.  The
    rank's state and spool are deleted, unless ``keep`` (they go with the run's directory).
    ``spool_path``: where the rank's spool is now, when it moved since phase 1."""
    with open(state_path, "rb") as state:
        parked: _Parked = pickle.load(state)
    if spool_path is not None:
        parked.spool.path = spool_path
    before = writer.events_written
    emit_events(parked.spool, MergePlan(parked, rewrite, extra), writer, progress=meter, keep=keep)
    if not keep:
        os.unlink(state_path)
    del parked
    gc.collect()  # the plan's patcher closures make cycles holding this rank's arrays
    return writer.events_written - before


@dataclass(frozen=True)
class _Piece:
    """A rank's fragment written as a piece of the output as it is (the
    output's compression; the first one opens the trace, the last one closes
    it), so that the pieces joined in order are the output."""

    compression: str
    level: int | None
    opening: bytes
    closing: bytes
    continues: bool  # events came before: begin with the separator


def _emit_rank_to_chunk(state_path: str, rewrite: EventRewrite, extra: list[dict], chunk_dir: str | None,
                        spool_path: str | None = None, piece: _Piece | None = None,
                        progress: Meter | None = None, *, keep: bool = False) -> tuple[str, int]:
    """Pass 2 of one rank in a worker: its events as a zstd fragment file (or as ``piece``).
    ``keep``: leave the rank's state and spool to the run's directory (a cluster may run the task again)."""
    handle, chunk_path = tempfile.mkstemp(prefix="streamtrace-chunk-", suffix=".zst", dir=chunk_dir)
    try:
        with os.fdopen(handle, "wb") as raw, _fragment_stream(raw, piece) as out:
            writer = TraceWriter(out, None, continues=piece is not None and piece.continues)
            count = _emit_rank(state_path, rewrite, extra, writer, progress, keep=keep, spool_path=spool_path)
            writer.flush()
            if piece is not None:
                out.write(piece.closing)
    except BaseException:
        remove_quietly(chunk_path)
        raise
    return chunk_path, count


@contextmanager
def _fragment_stream(raw: BinaryIO, piece: _Piece | None) -> Iterator[BinaryIO]:
    if piece is None:
        with zstandard.ZstdCompressor(level=CHUNK_LEVEL).stream_writer(raw, closefd=False) as out:
            yield out
        return
    with compressed(raw, piece.compression, piece.level, background=False) as out:
        out.write(piece.opening)
        yield out


def _emit_rank_to_object(state_url: str, spool_url: str, rewrite: EventRewrite, extra: list[dict], store: RunStore,
                         piece: _Piece | None) -> tuple[str, int, int]:
    """Pass 2 of one rank on a worker that shares only a bucket: the rank's
    state and spool fetched from the run's objects, its fragment kept as one;
    returns the fragment's URL, events and bytes."""
    with scratch() as local:
        state_path, spool_path = store.get(state_url, local), store.get(spool_url, local)
        chunk_path, count = _emit_rank_to_chunk(state_path, rewrite, extra, local, spool_path, piece)
        return store.put(chunk_path), count, os.path.getsize(chunk_path)


def _emit_ranks_in_workers(calls: list[tuple], writer: TraceWriter, runner: TaskRunner, work: Work | None = None) -> None:
    """Pass 2 of every rank as tasks, spliced into ``writer`` in order as each
    rank's fragment is ready; fragments never outlive the call (objects: the run)."""
    emit: Callable[..., tuple] = _emit_rank_to_object
    if runner.store is None:  # on a cluster sharing a directory a task may run again: its inputs stay till the end
        emit = functools.partial(_emit_rank_to_chunk, keep=runner.distributed)
    fragments = runner.ordered(emit, calls, label="ranks written", work=work if runner.store is None else None)
    with closing(fragments):  # a failed splice stops the tasks at once
        for chunk_path, count, *_ in fragments:
            try:
                writer.splice(_chunk_pieces(chunk_path), count)
            finally:
                if runner.store is None:
                    remove_quietly(chunk_path)


def _chunk_pieces(path: str) -> Iterator[bytes]:
    with closing(RemoteReader(path)) if is_url(path) else open(path, "rb") as raw:
        reader = zstandard.ZstdDecompressor().stream_reader(raw)
        while piece := reader.read(CHUNK_PIECE):
            yield piece


def _assembles_in_store(runner: TaskRunner, target: OutputTarget) -> bool:
    """Can the output be made from the fragments inside the bucket (S3 to S3,
    nothing to redact on the way), without their bytes coming here?"""
    return (runner.store is not None and target.url is not None and target.redactor is None
            and same_s3_store(runner.store.url, target.url))


def _assemble_in_store(plan: _OutputPlan, target: OutputTarget, runner: TaskRunner) -> tuple[int, dict]:
    """Pass 2 as pieces of the output, one per rank (the first with the
    header, the last with the arrows and the trailer), made into the output
    object inside the store; returns the events written and how the output
    was made.  Pieces too small to be parts of a multipart upload are first
    joined by a task."""
    opening, ending = io.BytesIO(), io.BytesIO()
    TraceWriter(opening, plan.header)
    closer = TraceWriter(ending, None, continues=True)
    _close_output(closer, plan.arrow_lines(), plan.trailer)
    last = len(plan.order) - 1
    tasks = plan.object_calls(runner.store, [
        _Piece(target.compression, target.level, opening.getvalue() if k == 0 else b"",
               ending.getvalue() if k == last else b"", k > 0) for k in range(last + 1)])
    pieces = list(runner.ordered(_emit_rank_to_object, tasks, label="ranks written"))
    first = next((k for k, (_, count, _) in enumerate(pieces) if count), 0)
    if first > 0:  # the ranks before it wrote no event: its piece must not begin with a separator
        state_url, spool_url, rewrite, extra, store, piece = tasks[first]
        again = (state_url, spool_url, rewrite, extra, store, dataclasses.replace(piece, continues=False))
        pieces[first] = next(iter(runner.ordered(_emit_rank_to_object, [again], label="ranks written again")))
    groups = part_groups([size for _, _, size in pieces])
    joins = [[pieces[n][0] for n in group] for group in groups if len(group) > 1]
    joined = iter(list(runner.ordered(join_objects, [(urls, runner.store) for urls in joins], label="parts joined")))
    parts = [(pieces[group[0]][0] if len(group) == 1 else next(joined), sum(pieces[n][2] for n in group))
             for group in groups]
    copying = time.perf_counter()
    assemble_s3(target.url, parts, overwrite=target.overwrite)
    made = {"pieces": len(pieces), "parts": len(parts), "pieces_joined_first": sum(map(len, joins)),
            "copy_seconds": round(time.perf_counter() - copying, 3)}
    return sum(count for _, count, _ in pieces) + closer.events_written, made


def _arrows(indexed: list[RankIndex], rewrites: dict, pp_ranks: list[int], pipelines: list[object],
            multiplier: int) -> tuple[list[Arrow], dict]:
    """Every PP arrow, on the merged pids and clock, with ids above all rank ids."""
    spans, compute_tracks, unshard_tracks, pp_rank_of, pipeline_of = [], set(), set(), {}, {}
    for n, entry in enumerate(indexed):
        rewrite = rewrites[n]
        move = rewrite.pid_map.get
        for span in entry.pp_spans:
            spans.append(Span(move(span.pid, span.pid), span.tid, span.name, rewrite.shift_us(span.start),
                              rewrite.shift_us(span.end)))
        compute, unshard = entry.pp_tracks
        compute_tracks.update((move(pid, pid), tid) for pid, tid in compute)
        unshard_tracks.update((move(pid, pid), tid) for pid, tid in unshard)
        pp_rank_of.update((new_pid, pp_ranks[n]) for new_pid in rewrite.pid_map.values())
        pipeline_of.update((new_pid, pipelines[n]) for new_pid in rewrite.pid_map.values())
    first_id = max(FLOW_ID_BASE, (max(entry.facts.rank for entry in indexed) + 2) * multiplier)
    maker = ArrowMaker(pp_rank_of, next_id=first_id)
    blocks = find_blocks(spans, compute_tracks, unshard_tracks)
    send_recv_arrows(blocks, maker, pipeline_of)
    local_arrows(blocks, maker)
    counts = {
        "pp_send_recv_pairs": maker.pairs["pp_send_recv"],
        "pp_send_recv_unmatched": maker.unmatched["pp_send_recv"],
        "pp_send_recv_peer_stage_absent": maker.unmatched[PEER_ABSENT],
        "pp_compute_dependency_pairs": maker.pairs["pp_compute_dependency"],
        "pp_compute_dependency_unmatched": maker.unmatched["pp_compute_dependency"],
        "pp_unshard_compute_pairs": maker.pairs["pp_unshard_dependency"],
        "pp_unshard_compute_unmatched": maker.unmatched["pp_unshard_dependency"],
    }
    return maker.arrows, counts


def _replace_members(members: list[RawMember], replacements: dict, *, add_missing: list[RawMember] | None = None
                     ) -> list[RawMember]:
    """Top-level members with the merge's values; keys found in neither the
    header nor the trailer are added to the trailer."""
    out = []
    for key, raw in members:
        if key in replacements:
            value = replacements[key]
            out.append((key, b"null" if value is None else orjson.dumps(value)))
        else:
            out.append((key, raw))
    if add_missing is not None:
        present = {key for key, _ in members} | {key for key, _ in add_missing}
        out.extend((key, orjson.dumps(value)) for key, value in replacements.items()
                   if key not in present and value is not None)
    return out
