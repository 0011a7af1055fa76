"""Collectives matched across ranks beyond TraceLens's rule (which pairs the k-th kernel of a process
group on every rank): by Kineto's ``Seq`` arg when every kernel of a group carries one and the result
is consistent, send/recv paired with their peer (``Dst Rank``/``Src Rank``), group ranks that Kineto
truncated rebuilt from the files' ``distributedInfo.pg_config``, and the ranks' clocks aligned on
collective ends on request.  Where the inputs cannot support a match (a rank missing, a rank traced
over another window, args missing or odd) the collective or pair is left out and a note says so:
never a wrong match.  TraceLens's own tables are not touched (docs/analyze.md)."""
from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Callable, Iterable, Iterator, Sequence

import numpy as np

from . import collectives
from .collectives import (
    DTYPE,
    DTYPE_BYTES,
    GROUP_SIZE,
    IMPLICIT_SYNC,
    IN_NELEMS,
    NAME,
    OUT_NELEMS,
    PG_RANKS,
    TYPE_OF,
    Matched,
    Nodes,
    Orderer,
    RankKernels,
    Rows,
    Table,
    order_in_memory,
    same,
)
from .groupagg import MemoryColumn, ValueColumn, windowed_median

NO_VALUE = -1
"""``Seq`` and peer arrays: no usable value (absent, not a whole number, negative)."""
P2P = ("send", "recv")
SEQ, ORDER = "Seq", "order"
SYNC_ENDS = IMPLICIT_SYNC | {"alltoallv"}
"""Kinds whose kernels end together on every rank (each rank's kernel waits for every other's data)."""
TRUNCATED = re.compile(r"^\[?((?:\s*-?\d+\s*,)*)\s*\.\.\.\s*,((?:\s*-?\d+\s*,?)*)\]?$")
"""Kineto's truncated list (``[0, 1, ..., 28, ..., 63]``: its first 29 entries, ``...``, its last)."""


def whole(value: object) -> int:
    """An arg as a non-negative whole number (an int, or its text as c10d may write it), else NO_VALUE."""
    if value.__class__ is str and value.strip().isdigit():
        value = int(value.strip())
    return value if value.__class__ is int and 0 <= value < 2**62 else NO_VALUE


# ---------------------------------------------------------------- group ranks


def listed_ranks(value: object) -> tuple[int, ...] | None:
    """A whole list of ranks (a JSON list, or its text), None if it is truncated or not a list of ranks."""
    if isinstance(value, (list, tuple)):
        items = list(value)
    elif isinstance(value, str) and value.strip().startswith("[") and value.strip().endswith("]") and "..." not in value:
        items = [item.strip() for item in value.strip()[1:-1].split(",") if item.strip()]
        items = [int(item) if item.lstrip("-").isdigit() else item for item in items]
    else:
        return None
    return tuple(items) if all(item.__class__ is int and item >= 0 for item in items) else None


def truncated_ranks(value: object) -> tuple[list[int], list[int]] | None:
    """The ranks shown before and after Kineto's ``...`` (None if the value is not such a list)."""
    found = TRUNCATED.match(value.strip()) if isinstance(value, str) else None
    if found is None:
        return None
    head = [int(item) for item in found.group(1).split(",") if item.strip()]
    tail = [int(item) for item in found.group(2).split(",") if item.strip()]
    return (head, tail) if head and tail else None


def group_ranks(value: object, size: object, known: dict[str, tuple[int, ...]], name: object) -> tuple[int, ...] | None:
    """A group's ranks: its ``Process Group Ranks`` when whole; when Kineto truncated it, the ranks
    the files' pg_config or record_param_comms ops (first rank, stride) give for the group's name, if
    they agree with what is shown and with ``Group size``; else None (not guessed from the ranks shown)."""
    whole_list = listed_ranks(value)
    if whole_list is not None:
        return whole_list
    shown = truncated_ranks(value)
    listed = known.get(name) if isinstance(name, str) else None
    if shown is None or listed is None:
        return None
    head, tail = shown
    agrees = list(listed[:len(head)]) == head and list(listed[-len(tail):]) == tail
    sized = size.__class__ is not int or size == len(listed)
    return listed if agrees and sized and len(listed) > len(head) + len(tail) else None


def pg_config_ranks(info: object) -> dict[str, tuple[int, ...]]:
    """Group name -> its ranks, from a file's ``distributedInfo.pg_config`` (whole lists only)."""
    found: dict[str, tuple[int, ...]] = {}
    configs = info.get("pg_config") if isinstance(info, dict) else None
    for config in configs if isinstance(configs, list) else []:
        if isinstance(config, dict) and isinstance(config.get("pg_name"), str):
            ranks = listed_ranks(config.get("ranks"))
            if ranks is not None:
                found[config["pg_name"]] = ranks
    return found


def strided_ranks(start: int, stride: int, size: int) -> tuple[int, ...] | None:
    """A group's ranks from record_param_comms's ``Global rank start``, ``Global rank stride`` and ``Group size``."""
    return tuple(range(start, start + stride * size, stride)) if stride > 0 and 0 < size <= 2**20 else None


def known_groups(ranks: Sequence[RankKernels]) -> dict[str, tuple[int, ...]]:
    """The files' pg_config lists merged; a name listed with different ranks by two files is left out."""
    found: dict[str, tuple[int, ...]] = {}
    clashing: set[str] = set()
    for kernels in ranks:
        for name, members in kernels.groups.items():
            if found.setdefault(name, members) != members:
                clashing.add(name)
    return {name: members for name, members in found.items() if name not in clashing}


# ---------------------------------------------------------------- the kernels as the matching reads them


@dataclass
class Kernels:
    """Every rank's collective kernels, a row each in nccl_long's order (rank order, then file order): the
    report's records (:func:`.collectives.match`: a memory map when they are on disk), read a column at a
    time, each row's rank, ``Seq`` and peer among them (no row is made)."""

    matched: Matched
    rank: np.ndarray
    seq: np.ndarray
    peer: np.ndarray
    groups: list[tuple]  # per metadata row: its group as TraceLens tells groups apart (name or all, its ranks arg)

    def meta(self, row: int) -> tuple:
        return self.matched.metas[int(self.matched.records["meta"][row])]

    def group(self, row: int) -> tuple:
        return self.groups[int(self.matched.records["meta"][row])]

    def cid(self, row: int) -> str:
        """TraceLens's collective id of the row's kernel."""
        place = int(self.matched.records["index"][row])
        return str(place) if self.matched.simplified else f"{self.group(row)[0]}_{place}"

    def times(self, rows: Sequence[int]) -> tuple[list, list]:
        """The rows' starts and durations as the trace wrote them (whole numbers as ints, as nccl_long)."""
        found = self.matched.records[np.asarray(rows, dtype=np.int64)]
        return _numbers(found["ts"]), _numbers(found["dur"])


def _numbers(values: np.ndarray) -> list:
    return [int(value) if value.is_integer() else value for value in values.tolist()]


def kernels_of(matched: Matched) -> Kernels:
    """The matching's view of ``matched``'s records."""
    groups = [(matched.groups[code], None if matched.simplified else meta[PG_RANKS])
              for code, meta in zip(matched.meta_groups, matched.metas)]
    records = matched.records
    return Kernels(matched, records["rank"], records["seq"], records["peer"], groups)


def _split(values: np.ndarray, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``rows`` ordered by ``values`` (ties keep their order), and where each run of one value starts."""
    order = np.argsort(values, kind="stable")
    ordered = values[order]
    firsts = np.flatnonzero(np.r_[True, ordered[1:] != ordered[:-1]]) if len(rows) else np.zeros(0, np.int64)
    return rows[order], firsts


def _segments(kernels: Kernels, rows: np.ndarray) -> list[tuple[tuple, np.ndarray]]:
    """``rows`` by group (:attr:`Kernels.groups`), groups in order of first appearance, rows ascending."""
    groups: dict[tuple, int] = {}
    code_of = np.array([groups.setdefault(group, len(groups)) for group in kernels.groups] or [0], dtype=np.int32)
    codes = code_of[np.asarray(kernels.matched.records["meta"][rows])] if len(rows) else np.zeros(0, np.int32)
    ordered, firsts = _split(codes, rows)
    names, ends = list(groups), [*firsts[1:].tolist(), len(rows)]
    found = [(names[int(code_of[kernels.matched.records["meta"][ordered[first]]])], ordered[first:end])
             for first, end in zip(firsts.tolist(), ends)]
    return sorted(found, key=lambda item: int(item[1][0]))


# ---------------------------------------------------------------- matching


@dataclass
class Collective:
    """One collective matched across ranks: its nccl_long rows (rank order), the rule that matched them
    and the key under it (``Seq``, or TraceLens's collective id)."""

    rule: str
    key: object
    rows: list[int]


@dataclass
class Matching:
    """The matched collectives (send/recv left out: :func:`p2p_pairs`), as arrays (or memory maps: beyond a
    budget, :mod:`.collectivebuckets`): their rows, each collective's (in rank order) from ``starts[at]`` to
    ``ends[at]``, collectives in order of first appearance (the lowest rank's kernels in file order), each
    one's Seq (NO_VALUE: matched by order); and the groups whose matching can be trusted.  Iterating gives
    each as a :class:`Collective`."""

    kernels: Kernels
    rows: np.ndarray
    starts: np.ndarray
    ends: np.ndarray
    seqs: np.ndarray
    trusted: set[tuple]  # groups matched by Seq, or by order with the same count of kernels on each rank

    def __iter__(self) -> Iterator[Collective]:
        for at in range(len(self.seqs)):
            rows = self.rows[int(self.starts[at]):int(self.ends[at])].tolist()
            number = int(self.seqs[at])
            yield Collective(SEQ, number, rows) if number != NO_VALUE else \
                Collective(ORDER, self.kernels.cid(rows[0]), rows)


def p2p_flags(kernels: Kernels) -> np.ndarray:
    """Per metadata row: is it a send or recv."""
    return np.array([meta[NAME] in P2P for meta in kernels.matched.metas] or [False])


def partial_seq(have: int, count: int) -> str:
    """Why a group whose kernels do not all carry a Seq is matched by order ("" if they all do)."""
    return "" if have == count else f"Seq on {have:,} of {count:,} kernels" if have else "no Seq args"


def seq_notes(reasons: dict[str, list[str]], notes: list[str]) -> None:
    """A note per reason groups were matched by order though they carry Seqs (``reasons``: their names)."""
    for reason, names in reasons.items():
        notes.append(f"collectives: group{'s' if len(names) > 1 else ''} {', '.join(names[:5])}"
                     f"{' ...' if len(names) > 5 else ''} matched by order, not by Seq: {reason}")


def match(kernels: Kernels, notes: list[str]) -> Matching:
    """Each group's collectives by ``Seq`` where :func:`_seq_fails` finds nothing against it, else by
    order (TraceLens's ids); send/recv are not collectives here."""
    seq, records = kernels.seq, kernels.matched.records
    is_p2p = p2p_flags(kernels)[np.asarray(records["meta"])] if len(seq) else np.zeros(0, bool)
    p2p = dict(_segments(kernels, np.flatnonzero(is_p2p)))
    parts: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []  # per group: rows, each collective's size and Seq
    trusted: set[tuple] = set()
    reasons: dict[str, list[str]] = {}
    for group, rows in _segments(kernels, np.flatnonzero(~is_p2p)):
        have = int((seq[rows] != NO_VALUE).sum())
        reason = partial_seq(have, len(rows))
        if not reason:
            ordered, firsts = _split(seq[rows], rows)
            reason = _seq_fails(kernels, ordered, firsts, p2p.get(group, np.zeros(0, np.int64)))
            if not reason:
                parts.append((ordered, np.diff(np.r_[firsts, len(rows)]), seq[ordered[firsts]]))
                trusted.add(group)
                continue
        if have:
            reasons.setdefault(reason, []).append(str(group[0]))
        ordered, firsts = _split(np.asarray(records["index"][rows]), rows)
        parts.append((ordered, np.diff(np.r_[firsts, len(rows)]), np.full(len(firsts), NO_VALUE, np.int64)))
        if len(set(np.unique(kernels.rank[rows], return_counts=True)[1].tolist())) == 1:
            trusted.add(group)
    seq_notes(reasons, notes)
    return _by_first_row(kernels, parts, trusted)


def _by_first_row(kernels: Kernels, parts: list[tuple[np.ndarray, np.ndarray, np.ndarray]],
                  trusted: set[tuple]) -> Matching:
    """The groups' collectives put together, in order of their first row (the parts let go as they are:
    with one group, or groups that do not interleave, nothing is moved)."""
    rows, sizes, seqs = (_joined([part[at] for part in parts]) for at in range(3))
    parts.clear()
    starts = np.r_[0, np.cumsum(sizes)][:-1].astype(np.int64)
    order = np.argsort(rows[starts], kind="stable")
    if np.all(order[1:] > order[:-1]):  # (already in order)
        bounds = np.r_[starts, len(rows)].astype(np.int64)
        return Matching(kernels, rows, bounds[:-1], bounds[1:], seqs, trusted)
    sizes, old = sizes[order], starts[order]
    ends = np.cumsum(sizes)
    places = np.repeat(old - (ends - sizes), sizes)
    places += np.arange(len(rows))
    bounds = np.r_[0, ends].astype(np.int64)
    return Matching(kernels, rows[places], bounds[:-1], bounds[1:], seqs[order], trusted)


def _joined(arrays: list[np.ndarray]) -> np.ndarray:
    """The arrays one after another (one alone as it is)."""
    return arrays[0] if len(arrays) == 1 else np.concatenate(arrays) if arrays else np.zeros(0, np.int64)


AGREED = (PG_RANKS, NAME, GROUP_SIZE, DTYPE)
"""The args a collective's kernels agree on (and, but for all_to_allv, :data:`SIZES`)."""
SIZES = (IN_NELEMS, OUT_NELEMS)


def consistent(kernels: Kernels, rows: list[int]) -> bool:
    """Do a collective's kernels agree on its group ranks, name, group size, dtype and (but for
    all_to_allv, whose sizes are per rank) in and out elements."""
    codes = set(kernels.matched.records["meta"][rows].tolist())
    if len(codes) == 1:
        return True
    metas = [kernels.matched.metas[code] for code in codes]
    fields = AGREED if metas[0][NAME] == "all_to_allv" else AGREED + SIZES
    return all(same([meta[at] for meta in metas]) for at in fields)


def _seq_fails(kernels: Kernels, ordered: np.ndarray, firsts: np.ndarray, p2p: np.ndarray) -> str:
    """Why Seq cannot match a group's collectives ("" if it can; ``ordered``: the group's rows by Seq,
    ``firsts``: where each Seq's start): a rank holding one Seq twice, kernels of one Seq whose args
    differ across ranks (:func:`consistent`), a rank whose Seqs do not rise with its kernels' starts, or
    send/recv of the group that may be counted in the same sequence (older c10d; their number differs per
    rank, so the Seqs of later collectives do): a send/recv Seq in a gap of its rank's collective Seqs, or
    ranks holding different collective Seqs in a group with send/recv Seqs."""
    ranks, numbers = kernels.rank[ordered], kernels.seq[ordered]
    if np.any((numbers[1:] == numbers[:-1]) & (ranks[1:] == ranks[:-1])):
        return "a rank holding one Seq twice"
    codes = np.asarray(kernels.matched.records["meta"][ordered])
    differing = np.flatnonzero(np.minimum.reduceat(codes, firsts) != np.maximum.reduceat(codes, firsts))
    ends = np.r_[firsts[1:], len(ordered)]
    if not all(consistent(kernels, ordered[firsts[at]:ends[at]].tolist()) for at in differing.tolist()):
        return "kernels of one Seq whose args differ across ranks"
    by_start = np.lexsort((numbers, np.asarray(kernels.matched.records["ts"][ordered]), ranks))
    in_rank = ranks[by_start][1:] == ranks[by_start][:-1]
    if np.any(in_rank & (numbers[by_start][1:] < numbers[by_start][:-1])):
        return "Seqs that do not rise with the kernels' starts"
    counted = p2p[kernels.seq[p2p] != NO_VALUE]
    if not len(counted):
        return ""
    by_rank = np.lexsort((numbers, ranks))
    starts = np.flatnonzero(np.r_[True, ranks[by_rank][1:] != ranks[by_rank][:-1]])
    held = {int(ranks[by_rank[first]]): np.unique(numbers[by_rank[first:end]])
            for first, end in zip(starts.tolist(), [*starts[1:].tolist(), len(ordered)])}
    for rank, number in zip(kernels.rank[counted].tolist(), kernels.seq[counted].tolist()):
        found = held.get(rank)
        if found is not None and found[0] < number < found[-1] and number not in set(found.tolist()):
            return "send/recv counted in the same Seq"
    first = next(iter(held.values()))
    if any(not np.array_equal(found, first) for found in held.values()):
        return "send/recv with Seqs in the group, whose ranks hold different Seqs"
    return ""


# ---------------------------------------------------------------- clocks


@dataclass
class Span:
    """A matched collective's kernels as the clocks read them: ranks, starts and ends."""

    ranks: list[int]
    starts: list
    ends: list


def _synced(collectives: Iterable[Collective], kernels: Kernels) -> Iterator[Span]:
    """The collectives of kinds whose ranks end together, with their kernels' ranks, starts and ends (read
    as they are wanted)."""
    for collective in collectives:
        if len(collective.rows) > 1 and TYPE_OF.get(kernels.meta(collective.rows[0])[NAME]) in SYNC_ENDS:
            starts, durations = kernels.times(collective.rows)
            yield Span(kernels.rank[collective.rows].tolist(), starts,
                       [start + length for start, length in zip(starts, durations)])


def impossible(spans: Iterable[Span], shift: dict[int, float]) -> int:
    """Collectives (of kinds whose ranks end together) that end on one rank before they start on another."""
    count = 0
    for span in spans:
        starts = [start - shift.get(rank, 0.0) for rank, start in zip(span.ranks, span.starts)]
        ends = [end - shift.get(rank, 0.0) for rank, end in zip(span.ranks, span.ends)]
        count += max(starts) > min(ends)
    return count


def clock_offsets(spans: Iterable[Span], column: Callable[[], ValueColumn] = MemoryColumn) \
        -> dict[int, tuple[float, int]]:
    """Each rank's clock against the lowest rank it shares collectives with (directly or through others):
    the median, over the collectives two ranks share, of the difference of their kernels' ends (all-reduce,
    reduce-scatter, all-gather and all-to-all kernels end together on every rank; NaN left out), added
    along the shortest chain of ranks; with the number of collectives behind each rank's link.  The
    differences go where ``column`` puts them (a number per collective and rank: on disk beyond a budget
    in analyze)."""
    diffs: dict[tuple[int, int], ValueColumn] = {}
    for span in spans:
        ends = dict(zip(span.ranks, span.ends))
        first = min(ends)
        for rank, end in ends.items():
            if rank != first:
                found = diffs.get((first, rank))
                if found is None:
                    found = diffs[first, rank] = column()
                found.append(end - ends[first])
    links: dict[int, list[tuple[int, float, int]]] = {}
    for (a, b), values in diffs.items():
        middle = windowed_median(values)
        links.setdefault(a, []).append((b, middle, len(values)))
        links.setdefault(b, []).append((a, -middle, len(values)))
    offsets: dict[int, tuple[float, int]] = {}
    for root in sorted(links):
        if root in offsets:
            continue
        offsets[root] = (0.0, 0)
        queue = [root]
        for rank in queue:
            for other, diff, count in sorted(links[rank]):
                if other not in offsets:
                    offsets[other] = (offsets[rank][0] + diff, count)
                    queue.append(other)
    return offsets


# ---------------------------------------------------------------- tables


MATCH_COLUMNS = ["Process Group Name", "Process Group Ranks", "Collective name", "match", "Seq", "collective_id",
                 "ranks", "ranks missing", "missing ranks", "first arrival rank", "last arrival rank", "wait for last (us)",
                 "latency (us)", "skew in end time (us)"]


def matches_table(matching: Matching, kernels: Kernels, known: dict[str, tuple[int, ...]], shift: dict[int, float],
                  notes: list[str], rows: Rows, nodes: Nodes | None = None) -> list[str]:
    """collective_matches into ``rows`` as they are made (``nodes``: TraceLens's node_span besides), its
    columns returned: one row per collective of a trusted group whose kernels agree on its args (send/recv:
    :func:`p2p_pairs`)."""
    untrusted: set[str] = set()
    differing = 0
    for found in matching:
        group = kernels.group(found.rows[0])
        if group not in matching.trusted:
            untrusted.add(str(group[0]))
            continue
        if not consistent(kernels, found.rows):
            differing += 1
            continue
        meta = kernels.meta(found.rows[0])
        ranks = kernels.rank[found.rows].tolist()
        given, durations = kernels.times(found.rows)
        starts = [start - shift.get(rank, 0.0) for start, rank in zip(given, ranks)]
        ends = [start + length for start, length in zip(starts, durations)]
        members = group_ranks(meta[PG_RANKS], meta[GROUP_SIZE], known, group[0])
        absent = sorted(set(members) - set(ranks)) if members is not None else None
        listed = _text(members, meta[PG_RANKS])
        row = [group[0], listed, meta[NAME], found.rule, found.key if found.rule == SEQ else None,
               kernels.cid(found.rows[0]), len(ranks), None if absent is None else len(absent),
               None if absent is None else ranges(absent), ranks[starts.index(min(starts))],
               ranks[starts.index(max(starts))], max(starts) - min(starts), min(durations), max(ends) - min(ends)]
        rows.add(row if nodes is None else [*row, nodes.span(listed)])
    if differing:
        notes.append(f"collectives: {differing:,} collectives whose kernels' args differ across ranks are left out of "
                     "collective_matches")
    if untrusted:
        notes.append(f"collectives: group{'s' if len(untrusted) > 1 else ''} {', '.join(sorted(untrusted)[:5])} "
                     "(no Seq, different numbers of kernels per rank) left out of collective_matches: matching "
                     "by order there may pair different collectives")
    return MATCH_COLUMNS + (["node_span"] if nodes is not None and len(rows) else [])


def _text(members: tuple[int, ...] | None, value: object) -> object:
    """The group's ranks as a list's text when rebuilt, else the arg as it is."""
    return str(list(members)) if members is not None else value


P2P_COLUMNS = ["Process Group Name", "src rank", "dst rank", "index", "send ts", "recv ts", "send dur (us)",
               "recv dur (us)", "size (bytes)", "waiting rank", "wait (us)", "latency (us)", "bw (GB/s, 1e9)"]


def p2p_pairs(kernels: Kernels, shift: dict[int, float], notes: list[str], rows: Rows,
              gpus_per_node: int | None = None, orderer: Orderer = order_in_memory) -> list[str]:
    """p2p_pairs into ``rows`` as they are made, its columns returned: the k-th send from rank a to rank b
    (``Dst Rank``) of a group paired with the k-th recv on b from a (``Src Rank``), in start order (NCCL
    runs a pair's transfers in order); a pair of ranks whose send and recv counts differ is left out, as a
    wrong pairing could not be told apart.  With ``gpus_per_node`` (TraceLens's node rule: rank // GPUs per
    node), ``node_span`` says whether the two ranks share a node.  The sends and recvs are ordered by pair and
    start by ``orderer`` (on disk beyond a budget: :mod:`streamtrace.io.collectivesort`) and read a block at a
    time: what is held is a number per pair of ranks."""
    pairs = _Pairs(kernels)
    present = set(kernels.matched.ranks)
    uneven: list[str] = []
    absent = 0
    if pairs.ids:
        order, _ = orderer(len(kernels.matched.records), pairs.keys, pairs.sizes)
        firsts = (np.cumsum(pairs.sizes) - pairs.sizes).tolist()
        for (group, src, dst), at in sorted(pairs.ids.items(), key=lambda item: repr(item[0])):
            sent, received = int(pairs.sizes[2 * at]), int(pairs.sizes[2 * at + 1])
            if src not in present or dst not in present:
                absent += sent + received
                continue
            if sent != received:
                uneven.append(f"{src}->{dst} ({sent} sends, {received} recvs)")
                continue
            span = [] if not gpus_per_node else ["intra_node" if src // gpus_per_node == dst // gpus_per_node else "inter_node"]
            for index in range(0, sent, pairs.block):
                sends = _timed(kernels, order[firsts[2 * at] + index:firsts[2 * at] + min(index + pairs.block, sent)])
                recvs = _timed(kernels, order[firsts[2 * at + 1] + index:firsts[2 * at + 1] + min(index + pairs.block, sent)])
                for place, (send, recv) in enumerate(zip(sends, recvs), index):
                    rows.add(_pair(kernels, group, src, dst, place, send, recv, shift) + span)
    if pairs.no_peer:
        notes.append(f"collectives: {pairs.no_peer:,} send/recv kernels without a Dst Rank/Src Rank arg (older PyTorch "
                     "does not write them) are not paired with their peer")
    if absent:
        notes.append(f"collectives: {absent:,} send/recv kernels whose peer rank the inputs do not hold are not paired")
    if uneven:
        notes.append(f"collectives: send/recv between {len(uneven):,} pairs of ranks are not paired, their counts differ "
                     f"(a rank traced over another window, or a transfer missing): {', '.join(uneven[:5])}"
                     f"{' ...' if len(uneven) > 5 else ''}")
    return P2P_COLUMNS + (["node_span"] if gpus_per_node else [])


class _Pairs:
    """The send/recv kernels by pair of ranks: each (group, src, dst)'s number, a block of records at a time;
    a record's bucket is 2 x its pair's number for a send, + 1 for a recv, the last one for any other record."""

    def __init__(self, kernels: Kernels) -> None:
        self.records, self.block = kernels.matched.records, collectives.RECORD_BLOCK
        self.point = p2p_flags(kernels)
        self.send = np.array([meta[NAME] == "send" for meta in kernels.matched.metas] or [False])
        codes: dict[tuple, int] = {}
        self.code_of = np.array([codes.setdefault(group, len(codes)) for group in kernels.groups] or [0], np.int64)
        self.groups = list(codes)
        self.ids: dict[tuple, int] = {}  # (group, src, dst) -> its number
        self.no_peer = 0
        for first in range(0, len(self.records), self.block):
            self._numbers(first, first + self.block, True)
        self.sizes = np.zeros(2 * len(self.ids) + 1, np.int64)
        for first in range(0, len(self.records), self.block):
            self.sizes += np.bincount(self.keys(first, first + self.block)[0], minlength=len(self.sizes))

    def _numbers(self, first: int, end: int, survey: bool = False) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Records ``first`` to ``end``: which are sends or recvs with a peer, whether each is a send, and
        their pairs' numbers (``survey``: new pairs numbered, kernels without a peer counted)."""
        meta = np.asarray(self.records["meta"][first:end])
        peer, rank = np.asarray(self.records["peer"][first:end]), np.asarray(self.records["rank"][first:end])
        point, send = self.point[meta], self.send[meta]
        wanted = point & (peer != NO_VALUE)
        if survey:
            self.no_peer += int((point & (peer == NO_VALUE)).sum())
        triples = np.stack([self.code_of[meta], np.where(send, rank, peer), np.where(send, peer, rank)], axis=1)[wanted]
        found, inverse = np.unique(triples, axis=0, return_inverse=True)
        keys = [(self.groups[code], src, dst) for code, src, dst in found.tolist()]
        if survey:
            for key in keys:
                self.ids.setdefault(key, len(self.ids))
        numbers = np.array([self.ids[key] for key in keys] or [0], np.int64)[inverse.reshape(-1)]
        return wanted, send[wanted], numbers

    def keys(self, first: int, end: int) -> tuple[np.ndarray, np.ndarray]:
        """:class:`~.collectives.Orderer`'s keys: each record's bucket and start (0 in the last bucket)."""
        wanted, send, numbers = self._numbers(first, end)
        bucket = np.full(len(wanted), 2 * len(self.ids), np.int64)
        bucket[wanted] = 2 * numbers + ~send
        ts = np.where(wanted, np.asarray(self.records["ts"][first:end]), 0.0)
        return bucket, ts


def _timed(kernels: Kernels, rows: np.ndarray) -> list[tuple[int, object, object]]:
    """Rows with their start and duration."""
    found = np.asarray(rows, dtype=np.int64).tolist()
    starts, durations = kernels.times(found)
    return list(zip(found, starts, durations))


def _pair(kernels: Kernels, group: tuple, src: int, dst: int, index: int, send: tuple, recv: tuple,
          shift: dict[int, float]) -> list:
    """A p2p_pairs row: the rank that starts first waits for the other; the transfer takes the shorter kernel."""
    (row, send_start, send_dur), (_, recv_start, recv_dur) = send, recv
    send_ts, recv_ts = send_start - shift.get(src, 0.0), recv_start - shift.get(dst, 0.0)
    meta = kernels.meta(row)
    width = DTYPE_BYTES.get(meta[DTYPE]) if isinstance(meta[DTYPE], str) else None
    nelems = meta[IN_NELEMS]
    size = nelems * width if nelems.__class__ is int and width is not None else None
    latency = min(send_dur, recv_dur)
    bw = size / (latency / 1e6) / 1e9 if size is not None and latency > 0 else math.nan
    return [group[0], src, dst, index, send_ts, recv_ts, send_dur, recv_dur, size,
            src if send_ts < recv_ts else dst, abs(send_ts - recv_ts), latency, bw]


def offsets_table(offsets: dict[int, tuple[float, int]]) -> Table:
    """clock_offsets: the shift taken off each rank's times (us) and the collectives it rests on."""
    return Table(["rank", "clock offset (us)", "collectives"],
                 [[rank, offset, count] for rank, (offset, count) in sorted(offsets.items())])


def ranges(ranks: list[int]) -> str:
    """``0-3, 7`` for [0, 1, 2, 3, 7]."""
    spans: list[list[int]] = []
    for rank in ranks:
        if spans and rank == spans[-1][1] + 1:
            spans[-1][1] = rank
        else:
            spans.append([rank, rank])
    return ", ".join(str(a) if a == b else f"{a}-{b}" for a, b in spans)


# ---------------------------------------------------------------- put together


def _reliable(matching: Matching) -> Iterator[Collective]:
    """The collectives of collective_matches: of trusted groups, their kernels agreeing on their args."""
    return (found for found in matching if matching.kernels.group(found.rows[0]) in matching.trusted
            and consistent(matching.kernels, found.rows))


def tables(kernels: Kernels, matching: Matching, known: dict[str, tuple[int, ...]], align_clocks: bool,
           notes: list[str], rows: Callable[[str], Rows], nodes: Nodes | None = None,
           orderer: Orderer = order_in_memory, column: Callable[[], ValueColumn] = MemoryColumn) -> dict[str, Table]:
    """collective_matches (its ``match`` column names the rule), p2p_pairs (their rows into ``rows``' sinks
    as they are made) and, with ``align_clocks``, clock_offsets; ``nodes``: TraceLens's node columns; notes
    say what was left unmatched and whether the clocks needed aligning (judged, and aligned, on the
    collectives of collective_matches only: a doubtful match would mislead both); ``orderer``: what orders
    the send/recv by pair and start (:func:`p2p_pairs`); ``column``: where the clock differences go
    (:func:`clock_offsets`)."""
    before = impossible(_synced(_reliable(matching), kernels), {})
    shift: dict[int, float] = {}
    found: dict[str, Table] = {}
    if align_clocks:
        offsets = clock_offsets(_synced(_reliable(matching), kernels), column)
        shift = {rank: offset for rank, (offset, _) in offsets.items()}
        after = impossible(_synced(_reliable(matching), kernels), shift)
        alone = sorted(set(kernels.matched.ranks) - set(offsets))
        if offsets:
            rank, (largest, _) = max(offsets.items(), key=lambda item: abs(item[1][0]))
            notes.append(f"collectives: clocks aligned on collective ends for collective_matches and p2p_pairs "
                         f"(largest offset {largest:,.1f} us, rank {rank}); collectives ending on one rank before they "
                         f"start on another: {before:,} before, {after:,} after"
                         + ("" if before else " (the clocks did not need it)"))
        if alone:
            notes.append(f"collectives: the clocks of rank{'s' if len(alone) > 1 else ''} {ranges(alone)} are not aligned: "
                         "they share no matched all-reduce, reduce-scatter, all-gather or all-to-all (with a Collective "
                         "name) with another rank")
        found["clock_offsets"] = offsets_table(offsets)
    elif before:
        notes.append("collectives: --align-clocks aligns the ranks' clocks on collective ends for collective_matches "
                     "and p2p_pairs")
    found = {name: table if nodes is None else nodes.table(table) for name, table in found.items() if table.rows}
    matched, pairs = rows("collective_matches"), rows("p2p_pairs")
    columns = matches_table(matching, kernels, known, shift, notes, matched, nodes)
    if len(matched):
        found["collective_matches"] = matched.table(columns)
    columns = p2p_pairs(kernels, shift, notes, pairs, None if nodes is None else nodes.gpus_per_node, orderer)
    if len(pairs):
        found["p2p_pairs"] = pairs.table(columns)
    return found
