"""``split``: one trace per rank out of a merged trace (SPEC 6).

Pass 1 (:class:`SplitIndex`) keeps, per event, who owns it: its own
``args.rank``, or its pid (4 bytes an event), plus the merged index the rank
rules need.  Pass 2 streams the event spool once per group of ranks, each
rank with its own open writer; the group size bounds open files and
compressor memory (``max_open``), so 1000 ranks take ceil(1000 / max_open)
spool readings.  Events of pids no rule places (``Spans``, the empty pid of
``Record Window End``) go with the closest preceding ranked event (a merged
file keeps each rank's events together), those before any ranked event to
every file.

All files are written into a hidden staging directory inside the output
directory and moved into place only when every one of them is complete.
"""
from __future__ import annotations

import json
import os
import re
import shutil
import tempfile
import time
from array import array
from contextlib import ExitStack
from operator import attrgetter
from typing import Callable

import numpy as np

from ..algo.ranks import plain_rank, rank_from_args
from ..engine.jobs import resolve_jobs
from ..engine.passes import IndexResult, index_pass, screen_of_copy
from ..errors import TraceError
from ..io.configfiles import load_rank_map
from ..io.destinations import Destinations
from ..io.formats import SUFFIXES
from ..io.jsonscan import RawMember
from ..io.progress import Progress
from ..io.projection import ProjectedChunk
from ..io.redact import RedactOptions, Redactor, pseudonymizes_hosts, redaction_summary
from ..io.sink import OutputTarget, check_level, publish_all
from ..io.source import InputSource, SourceSpec
from ..io.writer import TraceWriter
from ..resources import peak_rss_mb
from .mergedindex import NO_RANK, LinksIndex, resolve

DEFAULT_MAX_OPEN = 128
FD_RESERVE = 32
BATCH = 512


class SplitIndex(LinksIndex):
    """The merged index plus each event's owner: a pid slot (>= 0), or
    ``-2 - rank`` for an event carrying ``args.rank``."""

    part_arrays = LinksIndex.part_arrays + ("owners",)
    slot_arrays = LinksIndex.slot_arrays + ("owners",)  # (its negative codes stay as they are)

    def __init__(self) -> None:
        self.owners = array("i")
        super().__init__()

    def _make_visit(self) -> Callable[[dict], None]:
        index_visit = super()._make_visit()
        owners = self.owners.append
        slots = self.pid_slots
        slot_of = self.slot
        pids = self.pids

        def visit(event: dict) -> None:
            pid = event.get("pid")
            slot = slots.get(pid)
            if slot is None:
                slot = slot_of(pid)
            rank = rank_from_args(event.get("args"))
            if rank is None:
                owners(slot)
                pids[slot].unranked = True
            else:
                owners(-2 - rank)
                pids[slot].arg_ranks.add(rank)
            index_visit(event)

        return visit

    def visit_projected(self, chunk: ProjectedChunk) -> bool:
        """Each event's owner, as :meth:`visit` finds it (pids given slots in
        the order first met), a column at a time; then the merged index."""
        events = chunk.events
        owners = self._slots_of(list(map(_PID, events))).astype(np.int32)
        ranks = np.fromiter((NO_RANK if args is None or (rank := plain_rank(args.rank)) is None else rank
                             for args in map(_ARGS, events)), np.int64, len(events))
        ranked = ranks != NO_RANK
        for slot in set(owners[~ranked].tolist()):
            self.pids[slot].unranked = True
        for slot, rank in set(zip(owners[ranked].tolist(), ranks[ranked].tolist())):
            self.pids[slot].arg_ranks.add(rank)
        owners[ranked] = -2 - ranks[ranked]
        self.owners.frombytes(owners.tobytes())
        return super().visit_projected(chunk)


_PID, _ARGS = attrgetter("pid"), attrgetter("args")


def event_ranks(owners: array, pid_ranks: list[int]) -> array:
    """Each event's rank; -1 for the leading events that precede every ranked one.

    An event with no rank of its own or of its pid takes the rank of the
    closest ranked event before it.  Found a block of events at a time in
    numpy (its temporaries stay a few MB whatever the trace's size).
    """
    by_slot = np.array(list(pid_ranks) + [-1], np.int32)  # (the extra entry: a safe index when there is no pid)
    ranks = array("i")
    last = -1
    for start in range(0, len(owners), EVENT_BLOCK):
        owner = np.frombuffer(owners[start:start + EVENT_BLOCK], np.int32)
        rank = np.where(owner < 0, -2 - owner, by_slot[np.maximum(owner, 0)])
        known = np.where(rank >= 0, np.arange(len(rank)), -1)
        np.maximum.accumulate(known, out=known)  # the last known rank at or before each event
        filled = np.where(known >= 0, rank[np.maximum(known, 0)], last).astype(np.int32)
        if len(filled):
            last = int(filled[-1])
        ranks.frombytes(filled.tobytes())
    return ranks


EVENT_BLOCK = 1 << 20


def with_rank(members: list[RawMember], rank: int, *, add: bool) -> list[RawMember]:
    """The members with ``distributedInfo.rank`` set (added when ``add`` and absent).

    Written by the stdlib's default separators: HTA finds a file's rank with a
    regex that needs ``"rank": 3``.
    """
    out: list[RawMember] = []
    found = False
    for key, raw in members:
        if key == "distributedInfo":
            found = True
            try:
                info = json.loads(raw)
            except (ValueError, RecursionError) as exc:
                raise TraceError(f"distributedInfo cannot be read ({type(exc).__name__}), so its rank "
                                 "cannot be set") from None
            info = {**info, "rank": rank} if isinstance(info, dict) else {"rank": rank}
            raw = json.dumps(info).encode()
        out.append((key, raw))
    if add and not found:
        out.append(("distributedInfo", json.dumps({"rank": rank}).encode()))
    return out


def max_open_writers(requested: int | None) -> int:
    """Writers open at once: the request, else a default within the open-file limit."""
    if requested is not None:
        if requested < 1:
            raise TraceError("--max-open-files (max_open) must be at least 1")
        return requested
    try:
        import resource

        soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    except (ImportError, ValueError, OSError):
        return DEFAULT_MAX_OPEN
    if soft == resource.RLIM_INFINITY:
        return DEFAULT_MAX_OPEN
    return max(1, min(DEFAULT_MAX_OPEN, soft - FD_RESERVE))


def _write_group(result: IndexResult, ranks_of_events: array, group: list[int], staging: str, names: dict[int, str],
                 compress: str, level: int | None, counts: dict[int, int], redactor: Redactor | None) -> None:
    """One reading of the spool, writing the files of the ranks in ``group``."""
    stats = result.stats
    with ExitStack() as stack:
        writers: dict[int, TraceWriter] = {}
        batches: dict[int, list[bytes]] = {}
        for rank in group:
            target = OutputTarget(os.path.join(staging, names[rank]), compress=compress, level=level,
                                  background=False, redactor=redactor)  # a compressor thread per rank would cost MBs each
            out = stack.enter_context(target.open())
            writers[rank] = TraceWriter(out, with_rank(stats.header, rank, add=False), target.redactor)
            batches[rank] = []
        everyone = list(batches.values())
        position = 0
        for block in result.spool.read_blocks():
            for line in block:
                rank = ranks_of_events[position]
                position += 1
                if rank < 0:
                    for batch in everyone:
                        batch.append(line)
                    continue
                batch = batches.get(rank)
                if batch is not None:
                    batch.append(line)
                    if len(batch) >= BATCH:
                        writers[rank].events(batch)
                        batch.clear()
        if position != len(ranks_of_events):
            raise TraceError(f"validation failed: {position} events spooled, {len(ranks_of_events)} indexed")
        for rank, writer in writers.items():
            writer.events(batches[rank])
            writer.close(with_rank(stats.trailer, rank, add=not any(k == "distributedInfo" for k, _ in stats.header)))
            counts[rank] = writer.events_written


def split(
    src: SourceSpec,
    out_dir: str | os.PathLike,
    *,
    rank_map: str | dict | None = None,
    compress: str = "gzip",
    level: int | None = None,
    max_open: int | None = None,
    overwrite: bool = False,
    salvage: bool = False,
    spool_dir: str | None = None,
    reread_remote: bool = False,
    progress: bool | str | None = False,
    jobs: int | str | None = None,
    redact: RedactOptions | bool | None = None,
    summary_file: str | os.PathLike | None = None,
) -> dict:
    """Write ``rank<N>_trace.json.gz`` (or ``.json.zst`` / ``.json``) per rank into ``out_dir``.

    Returns the summary: ranks, the rule that decided each pid, files and
    their event counts, spool readings.
    """
    if compress not in SUFFIXES:
        raise TraceError(f"unknown compression {compress!r}; choose from {', '.join(SUFFIXES)}")
    check_level(compress, level)
    started = time.perf_counter()
    mapping = load_rank_map(rank_map) if isinstance(rank_map, str) else rank_map
    group_size = max_open_writers(max_open)
    processes = resolve_jobs(jobs)
    redactor = Redactor.from_options(redact)  # one for every file: pseudonyms agree across them
    with InputSource(src, spool_dir=spool_dir, reread_remote=reread_remote) as source:
        destinations = Destinations([source.location], overwrite=overwrite, summary=summary_file)
        directory = destinations.directory(out_dir, writes="per-rank files",
                                           existing=rf"rank\d+_trace{re.escape(SUFFIXES[compress])}")
        meter = Progress(source.size, enabled=progress)
        result = index_pass(source, SplitIndex, keep_events=True, spool_dir=spool_dir, salvage=salvage,
                            progress=meter, jobs=processes, learn_hosts=pseudonymizes_hosts(redactor))
        redactor = screen_of_copy(result, redactor)
        created = not os.path.isdir(directory)
        staging = None
        try:
            index: SplitIndex = result.visitor  # type: ignore[assignment]
            resolved = resolve(index, result.stats.header + result.stats.trailer, mapping)
            ranks_of_events = event_ranks(index.owners, resolved.ranks.ranks)
            ranks = sorted(set(ranks_of_events) - {-1})
            if not ranks:
                raise TraceError("no event has a rank (no args.rank, process_name, rank map, distributedInfo or "
                                 "inferable launches): nothing to split", path=source.name)
            names = {rank: f"rank{rank}_trace{SUFFIXES[compress]}" for rank in ranks}
            destinations.claim_all(os.path.join(directory, name) for name in names.values())  # before any is written
            os.makedirs(directory, exist_ok=True)
            staging = tempfile.mkdtemp(prefix=".streamtrace-split-", dir=directory)
            counts: dict[int, int] = {}
            groups = [ranks[at:at + group_size] for at in range(0, len(ranks), group_size)]
            for group in groups:
                _write_group(result, ranks_of_events, group, staging, names, compress, level, counts, redactor)
            publish_all([(os.path.join(staging, names[rank]), os.path.join(directory, names[rank])) for rank in ranks],
                        overwrite)
        finally:
            result.spool.close()
            if staging is not None:
                shutil.rmtree(staging, ignore_errors=True)
            if created and os.path.isdir(directory) and not os.listdir(directory):
                os.rmdir(directory)
    leading = sum(1 for rank in ranks_of_events if rank < 0)
    summary = resolved.summary()
    return destinations.finish({
        **source.describe(),
        "output_dir": directory,
        "ranks": ranks,
        "files": {names[rank]: counts[rank] for rank in ranks},
        "events_read": result.stats.events,
        "events_copied_to_every_file": leading,
        "spool_readings": len(groups),
        "max_open_writers": group_size,
        "rank_map": summary["rank_map"],
        "ambiguous_pids": summary["ambiguous_pids"],
        "read": result.stats.as_dict(),
        **redaction_summary(redactor),
        "wall_seconds": round(time.perf_counter() - started, 3),
        "peak_rss_mb": peak_rss_mb(),
    })
