"""Collectives matched across ranks (:func:`.collectivematch.match`'s rules, its result exactly) in memory that
does not grow with the number of kernels: beyond a budget the whole-run sorts become sorts by group and key
made by an :class:`~.collectives.Orderer` that works on disk (:mod:`streamtrace.io.collectivesort`), every
check reads a group's kernels in that order a block of whole collectives at a time, and the matched
collectives are written to scratch arrays (memory maps of temporary files) rather than held.

A group whose kernels all carry a ``Seq`` is read in (Seq, send/recv last, file) order: a collective is a run
of one Seq, its send/recv after it; a rank holding a Seq twice is two neighbours of one run, a rank's Seqs
rise with its starts when, in Seq order, its starts do not fall (its Seqs are then distinct), and a send/recv
Seq lies in a gap of its rank's Seqs when its rank has no collective kernel in its run but has smaller and
larger Seqs.  Any other group is read in (place, file) order, a collective a run of one place."""
from __future__ import annotations

from typing import Callable, Iterator, Protocol

import numpy as np

from . import collectives
from .collectivematch import NO_VALUE, Kernels, Matching, consistent, p2p_flags, partial_seq, seq_notes
from .collectivematch import match as match_in_memory
from .collectives import Orderer

MATCH_KERNEL_BYTES = 40
"""A kernel in :func:`.collectivematch.match`'s sorts in memory at their peak (tens of bytes); beyond the
orderer's budget, the matching is bounded."""


class Spill(Orderer, Protocol):
    """An orderer with a budget (bytes of sort in memory) and arrays of its own beyond memory."""

    budget: int

    def scratch(self, count: int, dtype: type) -> np.ndarray:
        """A writable array of ``count`` items (a memory map of a temporary file, let go with the array)."""
        ...


def match(kernels: Kernels, notes: list[str], spill: Spill | None = None) -> Matching:
    """:func:`.collectivematch.match`: in memory within ``spill``'s budget (always without one), else bounded."""
    if spill is None or len(kernels.matched.records) * MATCH_KERNEL_BYTES <= spill.budget:
        return match_in_memory(kernels, notes)
    return _Bounded(kernels, spill).match(notes)


def _later(first: np.ndarray, then: np.ndarray) -> np.ndarray:
    """Does a start come after the next one (NaN last, as numpy sorts)."""
    return (first > then) | (np.isnan(first) & ~np.isnan(then))


class _Bounded:
    """The matching of a run's records a block at a time (:func:`match`)."""

    def __init__(self, kernels: Kernels, spill: Spill) -> None:
        self.kernels, self.spill = kernels, spill
        self.records = kernels.matched.records
        self.block = collectives.RECORD_BLOCK
        codes: dict[tuple, int] = {}
        self.code_of = np.array([codes.setdefault(group, len(codes)) for group in kernels.groups] or [0], np.int64)
        self.groups = list(codes) or [None]
        self.point = p2p_flags(kernels)
        self._survey()

    def _read(self, first: int, end: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Records ``first`` to ``end``: each one's group code, whether it is a send/recv, its Seq."""
        meta = np.asarray(self.records["meta"][first:end])
        return self.code_of[meta], self.point[meta], np.asarray(self.records["seq"][first:end])

    def _survey(self) -> None:
        """Per group (collective kernels only): how many, how many carry a Seq, the first's row, how many per
        rank; and how many send/recv carry a Seq."""
        groups, world = len(self.groups), max(self.kernels.matched.ranks, default=0) + 1
        self.count, self.have, self.p2p_seqs = (np.zeros(groups, np.int64) for _ in range(3))
        self.per_rank = np.zeros(groups * world, np.int64)
        self.first = np.full(groups, len(self.records), np.int64)
        for first in range(0, len(self.records), self.block):
            end = min(first + self.block, len(self.records))
            codes, p2p, seq = self._read(first, end)
            ranks = np.asarray(self.records["rank"][first:end])
            own = codes[~p2p]
            self.count += np.bincount(own, minlength=groups)
            self.have += np.bincount(own[seq[~p2p] != NO_VALUE], minlength=groups)
            self.p2p_seqs += np.bincount(codes[p2p & (seq != NO_VALUE)], minlength=groups)
            self.per_rank += np.bincount(own * world + ranks[~p2p], minlength=groups * world)
            found, at = np.unique(own, return_index=True)
            self.first[found] = np.minimum(self.first[found], first + np.flatnonzero(~p2p)[at])
        self.per_rank = self.per_rank.reshape(groups, world)
        self.longest = max(self.block, 2 * world)

    # A run of one key longer than ``longest`` rows comes in pieces of more than twice the ranks (so a
    # rank holding a Seq twice shows within the first piece, its rows being neighbours there): a run of one Seq
    # on every kernel of a group is never held whole.  Its collectives come first in their run, so a piece
    # after the first holds send/recv only, and :meth:`_in_gap` carries a run's ranks across its pieces.

    def _order(self, bucket: Callable[[int, int], tuple[np.ndarray, np.ndarray]]) -> tuple[np.ndarray, np.ndarray]:
        """Every record ordered by ``bucket``'s (bucket, key) (the last bucket: records not wanted), file order
        among equals; and where each bucket starts."""
        sizes = np.zeros(len(self.groups) + 1, np.int64)
        for first in range(0, len(self.records), self.block):
            sizes += np.bincount(bucket(first, first + self.block)[0], minlength=len(sizes))
        order, _ = self.spill(len(self.records), bucket, sizes)
        return order, np.cumsum(sizes) - sizes

    def _runs(self, order: np.ndarray, low: int, high: int, key: Callable[[np.ndarray], np.ndarray]) \
            -> Iterator[tuple[np.ndarray, np.ndarray, np.ndarray]]:
        """``order[low:high]`` a block of whole runs (of one ``key``) at a time, a run longer than ``longest`` in
        pieces: rows, keys, each run's (or piece's) first."""
        carry = np.zeros(0, np.int64)
        for first in range(low, high, self.block):
            end = min(first + self.block, high)
            rows = np.concatenate([carry, np.asarray(order[first:end], dtype=np.int64)])
            keys = key(rows)
            firsts = np.flatnonzero(np.r_[True, keys[1:] != keys[:-1]])
            cut = len(rows) if end == high else int(firsts[-1])
            if cut == 0 and len(rows) > self.longest:
                cut = len(rows)  # (a run longer than ``longest``: handed on in pieces)
            carry = rows[cut:]
            if cut:
                yield rows[:cut], keys[:cut], firsts[firsts < cut]

    def match(self, notes: list[str]) -> Matching:
        groups = np.flatnonzero(self.count).tolist()
        groups.sort(key=lambda code: int(self.first[code]))
        seq_groups = [code for code in groups if self.have[code] == self.count[code]]
        bucket_of = np.full(len(self.groups), len(self.groups), np.int64)  # (the last bucket: not wanted)
        bucket_of[seq_groups] = seq_groups
        order, starts = self._order(lambda first, end: self._by_seq(bucket_of, first, end)) if seq_groups else \
            (np.zeros(0, np.int32), np.zeros(0, np.int64))
        reasons: dict[str, list[str]] = {}
        by_seq: list[int] = []
        for code in groups:
            reason = partial_seq(int(self.have[code]), int(self.count[code]))
            if not reason:
                reason = self._seq_fails(code, order, int(starts[code]), int(starts[code + 1]))
                if not reason:
                    by_seq.append(code)
                    continue
            if self.have[code]:
                reasons.setdefault(reason, []).append(str(self.groups[code][0]))
        seq_notes(reasons, notes)
        self.rows = self.spill.scratch(int(self.count.sum()), np.int32)
        self.found = [self.spill.scratch(int(self.count.sum()), np.int64) for _ in range(4)]  # first row, start, size, Seq
        self.placed = self.made = 0
        for code in by_seq:
            self._write(order, int(starts[code]), int(starts[code + 1]), self._seq_key, True)
        del order
        by_order = [code for code in groups if code not in set(by_seq)]
        if by_order:
            bucket_of[:] = len(self.groups)
            bucket_of[by_order] = by_order
            order, starts = self._order(lambda first, end: self._by_place(bucket_of, first, end))
            for code in by_order:
                self._write(order, int(starts[code]), int(starts[code + 1]),
                            lambda rows: np.asarray(self.records["index"][rows], np.int64), False)
            del order
        trusted = {self.groups[code] for code in by_seq}
        trusted |= {self.groups[code] for code in by_order if len(set(self.per_rank[code][self.per_rank[code] > 0])) == 1}
        return self._by_first_row(trusted)

    def _by_seq(self, bucket_of: np.ndarray, first: int, end: int) -> tuple[np.ndarray, np.ndarray]:
        """Records of Seq groups (send/recv without a Seq left out) by Seq, send/recv after a Seq's collectives."""
        codes, p2p, seq = self._read(first, end)
        bucket = bucket_of[codes]
        bucket[p2p & (seq == NO_VALUE)] = len(self.groups)
        keys = np.where(bucket == len(self.groups), 0, seq).astype(np.uint64) * np.uint64(2) + p2p.astype(np.uint64)
        return bucket, keys

    def _by_place(self, bucket_of: np.ndarray, first: int, end: int) -> tuple[np.ndarray, np.ndarray]:
        """Collective kernels of groups matched by order, by place."""
        codes, p2p, _ = self._read(first, end)
        bucket = bucket_of[codes]
        bucket[p2p] = len(self.groups)
        keys = np.asarray(self.records["index"][first:end]).astype(np.uint64)
        keys[bucket == len(self.groups)] = 0
        return bucket, keys

    def _seq_key(self, rows: np.ndarray) -> np.ndarray:
        return np.asarray(self.records["seq"][rows])

    def _seq_fails(self, code: int, order: np.ndarray, low: int, high: int) -> str:
        """:func:`.collectivematch._seq_fails` over the group's records in Seq order, a block of runs at a time."""
        twice = differ = falls = False
        last: dict[int, float] = {}  # per rank: the start of its last kernel in Seq order
        held: dict[int, list[int]] = {}  # per rank: its least and greatest Seq
        members = int((self.per_rank[code] > 0).sum())
        unequal = False  # a Seq some rank of the group does not hold
        for rows, seqs, firsts in self._runs(order, low, high, self._seq_key):
            own = ~self.point[np.asarray(self.records["meta"][rows])]
            rows, seqs = rows[own], seqs[own]
            if not len(rows):
                continue
            firsts = np.flatnonzero(np.r_[True, seqs[1:] != seqs[:-1]])
            ranks = np.asarray(self.records["rank"][rows])
            twice = twice or bool(np.any((seqs[1:] == seqs[:-1]) & (ranks[1:] == ranks[:-1])))
            unequal = unequal or bool(np.any(np.diff(np.r_[firsts, len(rows)]) != members))
            metas = np.asarray(self.records["meta"][rows])
            ends = np.r_[firsts[1:], len(rows)]
            mixed = np.flatnonzero(np.minimum.reduceat(metas, firsts) != np.maximum.reduceat(metas, firsts))
            differ = differ or not all(consistent(self.kernels, rows[firsts[at]:ends[at]].tolist()) for at in mixed.tolist())
            by_rank = np.argsort(ranks, kind="stable")
            ranks, starts, seqs = ranks[by_rank], np.asarray(self.records["ts"][rows[by_rank]]), seqs[by_rank]
            falls = falls or bool(np.any(_later(starts[:-1], starts[1:]) & (ranks[:-1] == ranks[1:])))
            for first, end in _spans(ranks):
                rank = int(ranks[first])
                if rank in last:
                    falls = falls or bool(_later(np.float64(last[rank]), starts[first]))
                    held[rank][1] = int(seqs[end - 1])
                else:
                    held[rank] = [int(seqs[first]), int(seqs[end - 1])]
                last[rank] = float(starts[end - 1])
        if twice:
            return "a rank holding one Seq twice"
        if differ:
            return "kernels of one Seq whose args differ across ranks"
        if falls:
            return "Seqs that do not rise with the kernels' starts"
        if not self.p2p_seqs[code]:
            return ""
        if self._in_gap(order, low, high, held):
            return "send/recv counted in the same Seq"
        return "send/recv with Seqs in the group, whose ranks hold different Seqs" if unequal else ""

    def _in_gap(self, order: np.ndarray, low: int, high: int, held: dict[int, list[int]]) -> bool:
        """Does a send/recv's Seq fall between its rank's least and greatest collective Seqs, on none of them."""
        holding: set[int] = set()
        run = None  # (the Seq whose collectives' ranks ``holding`` are: a run may come in pieces)
        for rows, seqs, firsts in self._runs(order, low, high, self._seq_key):
            p2p = self.point[np.asarray(self.records["meta"][rows])]
            ranks = np.asarray(self.records["rank"][rows])
            for first, end in zip(firsts.tolist(), [*firsts[1:].tolist(), len(rows)]):
                number = int(seqs[first])
                if number != run:
                    holding, run = set(), number
                holding.update(ranks[first:end][~p2p[first:end]].tolist())
                for rank in ranks[first:end][p2p[first:end]].tolist():
                    found = held.get(rank)
                    if found is not None and found[0] < number < found[1] and rank not in holding:
                        return True
        return False

    def _write(self, order: np.ndarray, low: int, high: int, key: Callable[[np.ndarray], np.ndarray],
               seq: bool) -> None:
        """A group's collectives (runs of one key, send/recv left out) to the scratch arrays."""
        rows_out, (first_row, start, size, number) = self.rows, self.found
        for rows, keys, _ in self._runs(order, low, high, key):
            own = ~self.point[np.asarray(self.records["meta"][rows])]
            rows, keys = rows[own], keys[own]
            if not len(rows):
                continue
            firsts = np.flatnonzero(np.r_[True, keys[1:] != keys[:-1]])
            made = slice(self.made, self.made + len(firsts))
            first_row[made], start[made] = rows[firsts], self.placed + firsts
            size[made] = np.diff(np.r_[firsts, len(rows)])
            number[made] = keys[firsts] if seq else NO_VALUE
            rows_out[self.placed:self.placed + len(rows)] = rows
            self.placed += len(rows)
            self.made += len(firsts)

    def _by_first_row(self, trusted: set[tuple]) -> Matching:
        """The collectives in order of their first row."""
        first_row, start, size, number = self.found
        made = self.made
        order, _ = self.spill(made, lambda first, end: (np.zeros(len(first_row[first:min(end, made)]), np.int64),
                                                        np.asarray(first_row[first:min(end, made)]).astype(np.uint64)),
                              np.array([made]))
        starts, ends, seqs = (self.spill.scratch(made, np.int64) for _ in range(3))
        for first in range(0, made, self.block):
            at = np.asarray(order[first:first + self.block], dtype=np.int64)
            part = slice(first, first + len(at))
            starts[part], seqs[part] = start[at], number[at]
            ends[part] = starts[part] + size[at]
        del order, self.found
        return Matching(self.kernels, self.rows, starts, ends, seqs, trusted)


def _spans(values: np.ndarray) -> Iterator[tuple[int, int]]:
    """Where each run of one value starts and ends."""
    firsts = np.flatnonzero(np.r_[True, values[1:] != values[:-1]]).tolist() if len(values) else []
    return zip(firsts, [*firsts[1:], len(values)])
