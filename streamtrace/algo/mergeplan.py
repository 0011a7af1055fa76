"""Merge decisions (pure functions over small per-rank facts, SPEC 5).

Which rank a file is, the PP order, the time offsets, the fresh pids, the
rank-unique ids, and the rewrite of one event into the merged timeline.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from decimal import Decimal

from ..errors import TraceError
from ..kineto import NUMBER_TYPES
from .ids import check_id_space, id_multiplier, rank_unique_id

FLOW_PHASES = frozenset({"s", "t", "f"})
EPOCH_US = 1e14  # a ts this large is epoch microseconds (1973 on); Kineto's relative ts stay below 1e13
REPLACED_METADATA = frozenset({"process_name", "process_sort_index"})
NAMING_METADATA = frozenset({"process_name", "thread_name"})


@dataclass
class RankFacts:
    """What the merge decisions need to know about one input."""

    path: str
    rank: int
    base_time: int | None
    pp_group: list[int] | None
    pids: list  # in first-seen order
    gpu_pids: set
    max_id: int  # largest raw correlation or flow id
    first_ts: float | None = None  # of the first timed event: tells absolute from relative timestamps
    process_names: dict = field(default_factory=dict)  # pid -> the input's process_name
    metadata_only: set = field(default_factory=set)  # pids with no event but metadata

    @property
    def clock(self) -> str:
        """'base' (ts relative to baseTimeNanoseconds), 'absolute' (epoch us), or 'relative' (no base)."""
        if self.base_time is not None:
            return "base"
        return "absolute" if self.first_ts is not None and self.first_ts >= EPOCH_US else "relative"


def check_unique_ranks(facts: list[RankFacts]) -> None:
    seen: dict[int, str] = {}
    for fact in facts:
        if fact.rank in seen:
            raise TraceError(f"global rank {fact.rank} appears twice: {seen[fact.rank]} and {fact.path}")
        seen[fact.rank] = fact.path


def pp_order(facts: list[RankFacts]) -> tuple[list[int], list[object], str]:
    """Each input's PP rank and pipeline (by input position), and how they were found.

    A rank's PP rank is its index in its PP process group; ranks of several
    pipelines (data-parallel replicas) each keep their own group as pipeline.
    Without a group for every rank, the global-rank order stands in (right
    only when the two agree) and all ranks form one pipeline.
    """
    ranks = [fact.rank for fact in facts]
    groups = [fact.pp_group for fact in facts]
    if all(group is not None and rank in group for group, rank in zip(groups, ranks)):
        return [group.index(rank) for group, rank in zip(groups, ranks)], [tuple(group) for group in groups], \
            "pp process group"
    order = sorted(ranks)
    return [order.index(rank) for rank in ranks], [None] * len(ranks), \
        "global rank order (no PP process group for every rank)"


def time_offsets_ns(facts: list[RankFacts]) -> tuple[list[int], int | None, list[str], str]:
    """Per input, ns to add to its timestamps; the common base; warnings; how it was aligned.

    Kineto's ``ts`` are relative to ``baseTimeNanoseconds``; shifting by the
    difference to the smallest base puts every rank on one clock.  Older
    traces have no base and absolute epoch-microsecond ``ts``: they are on
    that clock already (shifted by minus the common base when other ranks
    have one).  Only files with neither can be misaligned: one warning says
    how many.
    """
    clocks = [fact.clock for fact in facts]
    bases = [fact.base_time for fact in facts if fact.base_time is not None]
    common = min(bases) if bases else None
    offsets = [fact.base_time - common if clock == "base" else -common if clock == "absolute" and common else 0
               for fact, clock in zip(facts, clocks)]
    unaligned = clocks.count("relative")
    warnings = [f"{unaligned} of {len(facts)} files have neither baseTimeNanoseconds nor absolute timestamps; "
                "their times are taken as they are and may not line up with the other ranks"] if unaligned else []
    kinds = [name for clock, name in (("base", "baseTimeNanoseconds"), ("absolute", "absolute timestamps"))
             if clock in clocks]
    alignment = " and ".join(kinds) + (" (some files: none)" if unaligned else "") if kinds else \
        "none (no baseTimeNanoseconds, relative timestamps)"
    return offsets, common, warnings, alignment


def fresh_pids(facts_in_pp_order: list[RankFacts]) -> list[dict]:
    """Per rank (in PP order) ``{old pid: new pid}``: consecutive from 1;
    within a rank the CPU processes with events, then the processes with
    metadata only, then the GPU last (torchtitan's order: a rank's CPU
    process sits above its GPU); only int pids."""
    next_pid = 1
    maps = []
    for fact in facts_in_pp_order:
        int_pids = [pid for pid in fact.pids if type(pid) is int]
        ordered = sorted(int_pids, key=lambda pid: (pid in fact.gpu_pids, pid in fact.metadata_only, pid))
        maps.append({pid: next_pid + n for n, pid in enumerate(ordered)})
        next_pid += len(ordered)
    if next_pid >= 2**31:
        raise TraceError("too many processes for 32-bit pids")
    return maps


def shared_multiplier(facts: list[RankFacts]) -> int:
    """One id multiplier for every rank, checked against the 2^53 limit."""
    multiplier = id_multiplier(max(fact.max_id for fact in facts))
    problem = check_id_space(max(fact.rank for fact in facts), multiplier)
    if problem is not None:
        raise TraceError(problem)
    return multiplier


@dataclass
class EventRewrite:
    """How one rank's events change in the merged file (applied to decoded events)."""

    rank: int
    pid_map: dict
    offset_ns: int
    prefix: str
    multiplier: int
    offset_us: Decimal = field(init=False)

    def __post_init__(self) -> None:
        self.offset_us = Decimal(self.offset_ns) / 1000

    def apply(self, event: dict) -> dict | None:
        """The merged form of ``event`` (changed in place), or None to drop it."""
        if event.get("ph") == "M":
            name = event.get("name")
            if name in REPLACED_METADATA:
                return None  # the merge names and orders every process itself (process_metadata)
            pid = event.get("pid")
            if pid.__class__ is int and pid not in self.pid_map:
                return None  # a process with neither events nor a name: nothing to show
            args = event.get("args")
            if name == "thread_name" and isinstance(args, dict) and isinstance(args.get("name"), str):
                args["name"] = self.prefix + args["name"]
        pid = event.get("pid")
        if pid.__class__ is int:
            event["pid"] = self.pid_map.get(pid, pid)
        if self.offset_ns:
            ts = event.get("ts")
            if ts.__class__ in NUMBER_TYPES:
                event["ts"] = _shifted(ts, self.offset_us)
        args = event.get("args")
        if isinstance(args, dict):
            correlation = args.get("correlation")
            if correlation.__class__ is int:
                args["correlation"] = self.unique(correlation)
                args["correlation_raw"] = correlation
        if event.get("ph") in FLOW_PHASES:
            flow_id = event.get("id")
            if flow_id.__class__ is int:
                event["id"] = self.unique(flow_id)
            elif flow_id is not None:
                event["id"] = f"rank{self.rank}:{flow_id}"
        return event

    def unique(self, raw_id: int) -> int:
        """This rank's form of a correlation or flow id."""
        return rank_unique_id(self.rank, raw_id, self.multiplier)

    def shift_us(self, ts: float) -> float:
        """A float time (PP spans, appended events) on the merged clock."""
        return ts + self.offset_ns / 1000


def _shifted(value: object, offset_us: Decimal) -> Decimal:
    """``value + offset`` in decimal, so the result is exactly what a person
    adding the numbers would write (no binary rounding noise)."""
    return Decimal(repr(value)) + offset_us if value.__class__ is float else Decimal(value) + offset_us


def process_metadata(fact: RankFacts, pid_map: dict, pp_rank: int | None) -> list[dict]:
    """The one ``process_name`` (the input's name as a suffix) and the
    ``process_sort_index`` of each of a rank's processes."""
    events = []
    who = f"PP rank {pp_rank} (global rank {fact.rank})" if pp_rank is not None else f"rank {fact.rank}"
    order = pp_rank if pp_rank is not None else fact.rank
    for index, (old_pid, new_pid) in enumerate(sorted(pid_map.items(), key=lambda item: item[1])):
        name = f"{who} | " + ("GPU" if old_pid in fact.gpu_pids else f"process {old_pid}")
        own = fact.process_names.get(old_pid)
        if isinstance(own, str) and own:
            name += f" | {own}"
        events.append({"name": "process_name", "ph": "M", "pid": new_pid, "tid": 0, "args": {"name": name}})
        events.append({"name": "process_sort_index", "ph": "M", "pid": new_pid, "tid": 0,
                       "args": {"sort_index": order * 1000 + index}})
    return events
