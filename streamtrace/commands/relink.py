"""``relink``: repair a merged multi-rank trace's launch -> GPU links (SPEC 6).

Pass 1 (:class:`~streamtrace.mergedindex.MergedIndex`) records launches and
GPU events; between the passes every pid gets its rank and every GPU event
its launch, keyed by (rank, correlation).  Pass 2 rewrites correlation ids
into the rank-unique form of :mod:`streamtrace.ids` (the original kept as
``args.correlation_raw``) and replaces every ``ac2g`` flow: the input's may
pair ranks up by their shared ids, so each is dropped and a correct pair is
written beside the events it binds (an ``s`` after each launch that has GPU
work, an ``f`` after each linked GPU event), exactly where Kineto puts them.
"""
from __future__ import annotations

import itertools
import os
import re
import time
from typing import Callable

import numpy as np

from ..algo.ids import check_id_space, existing_multiplier, id_multiplier, rank_unique_id
from ..algo.links import NO_LAUNCH
from ..engine.jobs import resolve_jobs
from ..engine.passes import emit_pass, index_pass
from ..engine.plan import EmitPlan, consume, patched_lines
from ..errors import TraceError
from ..io.configfiles import load_rank_map
from ..io.destinations import Destinations
from ..io.eventtext import dumps_event, event_loader
from ..io.progress import Progress
from ..io.redact import RedactOptions, Redactor, pseudonymizes_hosts, redaction_summary
from ..io.sink import SinkSpec, default_output
from ..io.source import InputSource, SourceSpec
from ..io.textfields import field_pattern, positions, swap_one
from ..resources import peak_rss_mb
from .mergedindex import AC2G, GPU, LAUNCH, NO_ID, LinksIndex, MergedIndex, Resolved, resolve

ID_KEY = b'"correlation":'
_CORRELATION = field_pattern(ID_KEY, spaced=True)


def with_new_id(line: bytes, raw: int, new: int) -> bytes | None:
    """The event line with ``args.correlation`` rewritten and ``correlation_raw`` added,
    by changing its text; None when the line does not hold the key once,
    before the raw id (then decode it instead).

    ``"correlation":`` can only be a key (a quote inside a string is
    escaped); spaces may stand after the colon, as Kineto writes them.
    """
    found = []
    swapped = swap_one(line, _CORRELATION, lambda numbers: found.extend(numbers) or
                       (b'"correlation":%d,"correlation_raw":%d' % (new, raw),))
    return swapped if swapped is not None and int(found[0]) == raw else None


_ID_NAME = b'"correlation"'
_VALUE = rb'[ \t]*(-?[0-9][0-9.eE+-]*|"(?:[^"\\]|\\.)*")[ \t]*'  # a pid, tid or ts: a number or a string
_POSITION = tuple((key, re.compile(rb'"%s":%s[,}]' % (key, _VALUE))) for key in (b"pid", b"tid", b"ts"))
_DENSE_POSITION = re.compile(rb'"pid":%s,[ \t]*"tid":%s,[ \t]*"ts":%s[,}]' % ((_VALUE,) * 3))  # Kineto's order


def position_text(line: bytes) -> bytes | None:
    """``"pid":..,"tid":..,"ts":..`` copied from an event line; None if any is not there exactly once."""
    parts = []
    for key, pattern in _POSITION:
        found = pattern.findall(line)
        if len(found) != 1:
            return None
        parts.append(b'"%s":%s' % (key, found[0]))
    return b",".join(parts)


class RelinkPlan(EmitPlan):
    """Pass 2: new ids on launches and GPU events, ac2g flows regenerated.

    Patchers count their own kind of event, so the k-th launch line of pass 2
    is the k-th launch of pass 1; each checks that its id agrees.
    """

    tally_names = ("flows_written", "ids_rewritten")

    def __init__(self, resolved: Resolved, exact: bool) -> None:
        index = resolved.index
        self.actions = index.actions
        self._resolved = resolved
        self._loads = event_loader(exact)
        existing = self._existing_multiplier()
        self.ids_already_rank_unique = existing is not None  # then every id stays as it is
        raw_ids = [max(index.launch_id, default=0), max(index.gpu_id, default=0)]
        self.multiplier = existing or id_multiplier(max(raw_ids))
        problem = check_id_space(max(resolved.launch_bucket, default=0), self.multiplier)
        if problem is None:
            problem = check_id_space(max(resolved.gpu_bucket, default=0), self.multiplier)
        if problem is not None:
            raise TraceError(f"cannot relink: {problem}")
        self.has_gpu_work = resolved.launches_with_gpu_work()
        self.flows_written = 0
        self.ids_rewritten = 0
        self.counters = {LAUNCH: itertools.count(), GPU: itertools.count()}
        patchers: dict[int, Callable[[bytes], bytes | None]] = {
            LAUNCH: self._launch_patcher(), GPU: self._gpu_patcher(), AC2G: lambda line: None}
        self.patchers = [patchers.get(action) for action in range(max(patchers) + 1)]
        self._launch_id, self._gpu_id = (np.frombuffer(ids, dtype=np.int64) for ids in (index.launch_id, index.gpu_id))
        self._launch_bucket, self._gpu_bucket, self._launch_of_gpu = (
            np.frombuffer(column, dtype=np.int32) for column in (resolved.launch_bucket, resolved.gpu_bucket,
                                                                 resolved.links.launch_of_gpu))
        self._has_gpu_work = np.frombuffer(self.has_gpu_work, dtype=np.uint8)
        self._cursor = (0, 0, 0)  # an event, the launch and GPU ordinals there

    def lines(self, block: list[bytes], first_index: int) -> list[bytes]:
        """The block rewritten a kind of change at a time over all its lines
        (:meth:`_rewritten_block`), else line by line through the patchers."""
        rewritten = self._rewritten_block(block, first_index)
        return patched_lines(self, block, first_index) if rewritten is None else rewritten

    def _rewritten_block(self, block: list[bytes], first: int) -> list[bytes] | None:
        """The lines with new ids and flows as the patchers would write them,
        with no Python step per line; None when a line holds a key other
        than once or where this cannot look (then the patchers decide).

        Every event's new id and flow kind comes from numpy over the
        block's ordinals, the text changes from ``map`` over C calls."""
        end = first + len(block)
        kinds = self.actions[first:end]
        launch_at, gpu_at = positions(kinds, LAUNCH), positions(kinds, GPU)
        launch_base, gpu_base = self._bases(first)
        self._cursor = (end, launch_base + len(launch_at), gpu_base + len(gpu_at))
        launches = np.arange(launch_base, launch_base + len(launch_at))
        gpus = np.arange(gpu_base, gpu_base + len(gpu_at))
        gpu_raw = self._gpu_id[gpus]
        with_id = gpu_raw != NO_ID
        gpus, gpu_raw, gpu_lines = gpus[with_id], gpu_raw[with_id], np.array(gpu_at, dtype=np.intp)[with_id]
        gpu_launch = self._launch_of_gpu[gpus]
        linked = gpu_launch != NO_LAUNCH
        linked_launch = gpu_launch[linked]
        gpu_new = np.where(linked, 0, self._new_ids(self._gpu_bucket[gpus], gpu_raw))
        gpu_new[linked] = self._new_ids(self._launch_bucket[linked_launch], self._launch_id[linked_launch])
        launch_raw = self._launch_id[launches]
        launch_new = self._new_ids(self._launch_bucket[launches], launch_raw)
        at = np.concatenate((np.array(launch_at, dtype=np.intp), gpu_lines))
        raw, new = np.concatenate((launch_raw, gpu_raw)), np.concatenate((launch_new, gpu_new))
        flow = np.concatenate((self._has_gpu_work[launches] != 0, linked))
        phases = np.concatenate((np.full(len(launch_at), ord("s"), np.uint8), np.full(len(gpu_lines), ord("f"), np.uint8)))
        by_line = np.argsort(at, kind="stable")
        at, raw, new, flow, phases = at[by_line], raw[by_line], new[by_line], flow[by_line], phases[by_line]
        lines = list(block)
        changed = new != raw
        if not _swap_ids(lines, at[changed].tolist(), raw[changed].tolist(), new[changed].tolist()):
            return None
        flowing = at[flow].tolist()
        places = _positions(list(map(block.__getitem__, flowing)))
        if places is None:
            return None
        flows = map(bytes.__mod__, map(_FLOW_LINE.__getitem__, phases[flow].tolist()), zip(new[flow].tolist(), places))
        consume(map(lines.__setitem__, flowing, map(bytes.__add__, map(lines.__getitem__, flowing), flows)), len(flowing))
        self.ids_rewritten += int(np.count_nonzero(changed))
        self.flows_written += len(flowing)
        consume(self.counters[LAUNCH], len(launch_at))
        consume(self.counters[GPU], len(gpu_at))
        if AC2G in kinds:
            return list(itertools.compress(lines, kinds.translate(_NOT_AC2G)))
        return lines

    def _bases(self, first: int) -> tuple[int, int]:
        """The launch and GPU ordinals at event ``first``, counted on from
        the last block (blocks come in order; other workers' are skipped)."""
        event, launches, gpus = self._cursor if self._cursor[0] <= first else (0, 0, 0)
        return launches + self.actions.count(LAUNCH, event, first), gpus + self.actions.count(GPU, event, first)

    def _new_ids(self, ranks: np.ndarray, raw: np.ndarray) -> np.ndarray:
        """:meth:`_new_id` of many events at once."""
        if self.ids_already_rank_unique:
            return raw.copy()
        return np.where(ranks < 0, raw, (ranks.astype(np.int64) + 1) * self.multiplier + raw)

    def _existing_multiplier(self) -> int | None:
        """The multiplier of a file whose ids are rank-unique already (as merge and relink write them)."""
        resolved, index = self._resolved, self._resolved.index
        gpu_ids = np.frombuffer(index.gpu_id, dtype=np.int64)
        with_id = gpu_ids != NO_ID
        ids = np.concatenate((np.frombuffer(index.launch_id, dtype=np.int64), gpu_ids[with_id]))
        ranks = np.concatenate((np.frombuffer(resolved.launch_bucket, dtype=np.int32),
                                np.frombuffer(resolved.gpu_bucket, dtype=np.int32)[with_id]))
        return existing_multiplier(ids, ranks)

    def _new_id(self, rank: int, raw: int) -> int:
        """Rank-unique id; events of no known rank, and ids already rank-unique, stay as they are."""
        return raw if rank < 0 or self.ids_already_rank_unique else rank_unique_id(rank, raw, self.multiplier)

    def _rewrite(self, line: bytes, kind: str, ordinal: int, raw: int, new: int, flow: str | None) -> bytes:
        """The patched line, followed by its ac2g flow when ``flow`` ("s" or "f") is given.

        Text splicing when unambiguous (no decoding: exact-mode lines decode
        slowly), else decode, check, change and re-encode.
        """
        patched = line if new == raw else with_new_id(line, raw, new)
        position = position_text(line) if flow is not None and patched is not None else b""
        if patched is None or position is None:
            event = self._loads(line)
            args = event.get("args")
            if not isinstance(args, dict) or args.get("correlation") != raw:
                raise TraceError(f"validation failed: {kind} {ordinal} differs between the passes")
            if new != raw:
                args["correlation"] = new
                args["correlation_raw"] = raw
            patched = dumps_event(event)
            position = dumps_event({key: event.get(key) for key in ("pid", "tid", "ts")})[1:-1]
        if new != raw:
            self.ids_rewritten += 1
        if flow is None:
            return patched
        self.flows_written += 1
        finish = b',"bp":"e"' if flow == "f" else b""
        return patched + b',\n{"ph":"%s","id":%d,%s,"cat":"ac2g","name":"ac2g"%s}' % (
            flow.encode(), new, position, finish)

    def _launch_patcher(self) -> Callable[[bytes], bytes]:
        index, buckets, counter = self._resolved.index, self._resolved.launch_bucket, self.counters[LAUNCH]

        def patch(line: bytes) -> bytes:
            ordinal = next(counter)
            raw = index.launch_id[ordinal]
            flow = "s" if self.has_gpu_work[ordinal] else None
            return self._rewrite(line, "launch", ordinal, raw, self._new_id(buckets[ordinal], raw), flow)

        return patch

    def _gpu_patcher(self) -> Callable[[bytes], bytes]:
        resolved, counter = self._resolved, self.counters[GPU]
        index, launch_of_gpu = resolved.index, resolved.links.launch_of_gpu

        def patch(line: bytes) -> bytes:
            ordinal = next(counter)
            raw = index.gpu_id[ordinal]
            if raw == NO_ID:
                return line
            launch = launch_of_gpu[ordinal]
            if launch == NO_LAUNCH:
                return self._rewrite(line, "GPU event", ordinal, raw, self._new_id(resolved.gpu_bucket[ordinal], raw),
                                     None)
            new = self._new_id(resolved.launch_bucket[launch], index.launch_id[launch])
            return self._rewrite(line, "GPU event", ordinal, raw, new, "f")

        return patch


_FLOW_LINE = {phase: b',\n{"ph":"%s","id":%%d,%%s,"cat":"ac2g","name":"ac2g"%s}' % (bytes((phase,)), finish)
              for phase, finish in ((ord("s"), b""), (ord("f"), b',"bp":"e"'))}
_NOT_AC2G = bytes(0 if kind == AC2G else 1 for kind in range(256))


def _swap_ids(lines: list[bytes], at: list[int], raw: list[int], new: list[int]) -> bool:
    """``args.correlation`` of each of ``lines[at]`` made ``new`` with the
    ``raw`` one kept beside it, as :func:`with_new_id` does; False (lines
    unchanged) unless each holds the key once, before its raw id.

    Per line only C calls: find the key, match the id right there, replace
    that text; the key counted in all the lines at once (as many as lines,
    each holding one where it matched: once in each)."""
    if not at:
        return True
    chosen = list(map(lines.__getitem__, at))
    found = list(map(_CORRELATION.match, chosen, map(bytes.find, chosen, itertools.repeat(_ID_NAME))))
    if None in found or b"\n".join(chosen).count(_ID_NAME) != len(chosen):  # one a line, as each has one
        return False
    numbers = list(map(re.Match.group, found, itertools.repeat(1)))
    if None in numbers or list(map(int, numbers)) != raw:
        return False
    texts = map(b'"correlation":%d,"correlation_raw":%d'.__mod__, zip(new, raw))
    consume(map(lines.__setitem__, at, map(bytes.replace, chosen, map(re.Match.group, found), texts,
                                           itertools.repeat(1))), len(at))
    return True


def _positions(lines: list[bytes]) -> list[bytes] | None:
    """:func:`position_text` of each line, by one match where its pid, tid
    and ts stand together in Kineto's order (each key once in the line, as
    counted in all the lines at once); None when a line has them otherwise."""
    starts = list(map(bytes.find, lines, itertools.repeat(b'"pid":')))
    found = list(map(_DENSE_POSITION.match, lines, starts))
    if None in found:
        return None
    joined = b"\n".join(lines)
    if any(joined.count(key) != len(lines) for key in (b'"pid":', b'"tid":', b'"ts":')):  # one a line, as each has one
        return None
    return list(map(b'"pid":%s,"tid":%s,"ts":%s'.__mod__, map(re.Match.groups, found)))


def relink(
    src: SourceSpec,
    dst: SinkSpec | None = None,
    *,
    rank_map: str | dict | None = None,
    overwrite: bool = False,
    compress: str | None = None,
    level: int | None = None,
    salvage: bool = False,
    spool_dir: str | None = None,
    reread_remote: bool = False,
    progress: bool | str | None = False,
    jobs: int | str | None = None,
    redact: RedactOptions | bool | None = None,
    summary_file: str | os.PathLike | None = None,
) -> dict:
    """Rewrite a merged trace with rank-unique correlation ids and correct ac2g flows.

    ``rank_map`` is a JSON file path or a dict {pid: rank} for pids no other
    rule decides.  Returns the summary (ranks and the rule that decided each
    pid, collisions, links, orphans, graph launches, flows).
    """
    started = time.perf_counter()
    processes = resolve_jobs(jobs)
    mapping = load_rank_map(rank_map) if isinstance(rank_map, str) else rank_map
    dst = default_output(src, "_relinked") if dst is None else dst
    with InputSource(src, spool_dir=spool_dir, reread_remote=reread_remote) as source:
        destinations = Destinations([source.location], overwrite=overwrite, summary=summary_file)
        target = destinations.target(dst, compress=compress, level=level, redactor=Redactor.from_options(redact))
        meter = Progress(source.size, enabled=progress)
        result = index_pass(source, LinksIndex, keep_events=True, spool_dir=spool_dir, salvage=salvage,
                            progress=meter, jobs=processes, learn_hosts=pseudonymizes_hosts(target.redactor))
        try:
            resolved = resolve(result.visitor, result.stats.header + result.stats.trailer, mapping)
            resolved.require_links("relink")
            plan = RelinkPlan(resolved, result.stats.exact_numbers)
        except BaseException:
            result.spool.close()
            raise
        planned = time.perf_counter()
        emit_pass(result, plan, target, progress=meter, jobs=processes)
    index: MergedIndex = result.visitor  # type: ignore[assignment]
    return destinations.finish({
        **source.describe(),
        "output": target.name,
        **resolved.summary(),
        "id_multiplier": plan.multiplier,
        "ids_already_rank_unique": plan.ids_already_rank_unique,
        "ids_rewritten": plan.ids_rewritten,
        "ac2g_flows_replaced": index.ac2g_flows,
        "ac2g_flows_written": plan.flows_written,
        "events_read": result.stats.events,
        "events_written": result.stats.events - index.ac2g_flows + plan.flows_written,
        "read": result.stats.as_dict(),
        "pass1_seconds": round(result.seconds, 3),
        "plan_seconds": round(planned - started - result.seconds, 3),
        **redaction_summary(target.redactor),
        "wall_seconds": round(time.perf_counter() - started, 3),
        "peak_rss_mb": peak_rss_mb(),
    })

