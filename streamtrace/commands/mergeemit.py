"""``merge``'s second phase: :class:`MergePlan` rewrites one rank's events (pids, ids, times,
names) after compaction's patch; the ranks written in this process, in workers, in chunks or as objects."""
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
from dataclasses import dataclass
from decimal import Decimal
from typing import BinaryIO, Callable, Iterable, Iterator

import zstandard

from ..algo.mergeplan import (
    EventRewrite,
)
from ..algo.pparrows import (
    Arrow,
    arrow_events,
)
from ..engine.executors import TaskRunner, Work
from ..engine.passes import SPOOL_BATCH, batches, emit_events
from ..engine.plan import EmitPlan, patched_lines
from ..io.eventtext import dumps_event, event_loader
from ..io.jsonscan import RawMember
from ..io.objectstore import RunStore, assemble_s3, join_objects, part_groups, same_s3_store, scratch
from ..io.progress import Meter
from ..io.remote import RemoteReader, is_url
from ..io.sink import OutputTarget, compressed, remove_quietly
from ..io.textfields import INTEGER, NUMBER, Convert, field_pattern, positions, swap_fields, swap_in_lines, swap_one
from ..io.writer import JoinedLines, TraceWriter
from .compactemit import CompactPlan, MovedBlock
from .mergerank import Parked, RankIndex

CHUNK_LEVEL = 1
CHUNK_PIECE = 1 << 20
_FLOW_PHASE = re.compile(rb'"ph":"[stf]"')

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

    def __init__(self, parked: Parked, rewrite: EventRewrite, extra_events: Iterable[dict]) -> None:
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



@dataclass
class OutputPlan:
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



def close_output(writer: TraceWriter, arrows: Iterable[bytes], trailer: list[RawMember]) -> None:
    """The arrows after every rank's events, then the trailer."""
    for lines in batches(arrows, SPOOL_BATCH):
        writer.events(lines)
    writer.close(trailer)



def emit_rank(state_path: str, rewrite: EventRewrite, extra: list[dict], writer: TraceWriter,
               meter: Meter | None = None, *, keep: bool = False, spool_path: str | None = None) -> int:
    """Pass 2 of one rank into ``writer``; returns the events written.  The
    rank's state and spool are deleted, unless ``keep`` (they go with the run's directory).
    ``spool_path``: where the rank's spool is now, when it moved since phase 1."""
    with open(state_path, "rb") as state:
        parked: Parked = pickle.load(state)
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
            count = emit_rank(state_path, rewrite, extra, writer, progress, keep=keep, spool_path=spool_path)
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


def emit_ranks_in_workers(calls: list[tuple], writer: TraceWriter, runner: TaskRunner, work: Work | None = None) -> None:
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


def assembles_in_store(runner: TaskRunner, target: OutputTarget) -> bool:
    """Can the output be made from the fragments inside the bucket (S3 to S3,
    nothing to redact on the way), without their bytes coming here?"""
    return (runner.store is not None and target.url is not None and target.redactor is None
            and same_s3_store(runner.store.url, target.url))


def assemble_in_store(plan: OutputPlan, target: OutputTarget, runner: TaskRunner) -> tuple[int, dict]:
    """Pass 2 as pieces of the output, one per rank (the first with the
    header, the last with the arrows and the trailer), made into the output
    object inside the store; returns the events written and how the output
    was made.  Pieces too small to be parts of a multipart upload are first
    joined by a task."""
    opening, ending = io.BytesIO(), io.BytesIO()
    TraceWriter(opening, plan.header)
    closer = TraceWriter(ending, None, continues=True)
    close_output(closer, plan.arrow_lines(), plan.trailer)
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
