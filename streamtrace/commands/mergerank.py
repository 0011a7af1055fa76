"""``merge``'s first phase, one rank at a time: which files are ranks, each rank's index
(compact's plus its pids, ids and rank evidence) and its own compaction plan."""
from __future__ import annotations

import dataclasses
import gc
import os
import pickle
import tempfile
import time
from array import array
from dataclasses import dataclass, field
from typing import Callable, Sequence

from ..algo.mergeplan import (
    NAMING_METADATA,
    RankFacts,
)
from ..algo.pp import parse_pp_name
from ..algo.pparrows import (
    Span,
)
from ..algo.ranks import pp_group_ranks, rank_from_file_name
from ..algo.secrets import Findings
from ..algo.steps import parse_int_list
from ..engine.passes import IndexResult, index_pass
from ..errors import TraceError
from ..io.configfiles import load_rules
from ..io.inputs import expand_inputs, trace_names_in
from ..io.jsonscan import RawMember, member_value
from ..io.objectstore import RunStore, scratch
from ..io.progress import Meter
from ..io.reader import ReadStats, header_members
from ..io.source import InputSource, directory_glob
from ..kineto import NUMBER_TYPES
from .compactindex import CompactIndex
from .compactplan import Compaction, plan_compaction
from .mergedindex import MergedIndex, resolve

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
class Parked:
    index: CompactIndex
    compaction: Compaction | None
    spool: object
    stats: ReadStats = field(repr=False)


@dataclass(frozen=True)
class PhaseOneOptions:
    compact: bool
    original_stream: bool
    pp_flows: bool
    rules: str | None
    spool_dir: str | None
    salvage: bool
    reread_remote: bool
    learn_hosts: bool = False  # the output pseudonymizes host names: pass 1 learns the input's


def index_rank(path: str, options: PhaseOneOptions, progress: Meter | None = None) -> RankIndex:
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


def index_rank_in_store(path: str, options: PhaseOneOptions, store: RunStore) -> RankIndex:
    """Phase 1 on a worker that shares only a bucket with the others: the
    rank's parked state and spool are made on the worker's disk, then kept
    as objects of the run (phase 2 may run on another worker)."""
    with scratch() as local:
        entry = index_rank(path, dataclasses.replace(options, spool_dir=local))
        entry.state_path = store.put(entry.state_path)
        entry.spool_path = store.put(entry.spool_path)
    return entry


def _plan_rank(path: str, result: IndexResult, options: PhaseOneOptions) -> RankIndex:
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
        pickle.dump(Parked(index, compaction, result.spool, result.stats), state, protocol=pickle.HIGHEST_PROTOCOL)
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
