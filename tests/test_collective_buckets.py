"""The matching beyond TraceLens (by Seq, else by order) made a block at a time beyond a budget
(algo/collectivebuckets.py, its sorts on disk through io/collectivesort.py): the collectives, their order,
the trusted groups and the notes of the whole-run sorts in memory, in memory that does not grow with the
number of kernels."""
from __future__ import annotations

import tracemalloc
from typing import Callable

import numpy as np
import pytest

from streamtrace.algo import collectivebuckets, collectivematch, collectivetables, groupagg
from streamtrace.algo import collectives as algo
from streamtrace.io import collectivesort, collectivespill, valuespill


def _meta(group: str, name: str, nelems: int = 8) -> tuple:
    return (group, "[0, 1, 2, 3]", name, 4, "Float", nelems, nelems, "[]", "[]", 7)


def _ranks(rng: np.random.Generator, trial: int) -> list[algo.RankKernels]:
    """2 to 4 ranks over up to 3 groups, Seqs rising with starts but, by trial: some missing, one held twice,
    starts that fall against Seqs (ties and NaN among them), args differing on a rank, send/recv with Seqs in
    or beside the collectives', a kernel missing on a rank."""
    world = int(rng.integers(2, 5))
    groups = ["0", "1", "2"][:int(rng.integers(1, 4))]
    metas = [_meta(group, name) for group in groups for name in ("allreduce", "send", "recv")]
    metas += [_meta(group, "allreduce", 16) for group in groups]
    count = int(rng.integers(1, 300))
    ranks = []
    for rank in range(world):
        meta = rng.integers(0, len(groups), count) * 3
        if trial % 7 == 1:  # send/recv among them
            meta[rng.random(count) < 0.2] += rng.integers(1, 3)
        seq = np.zeros(count, np.int64)
        for code in range(0, len(metas), 3):
            mine = np.flatnonzero(meta // 3 == code // 3)
            seq[mine] = np.arange(len(mine)) * (2 if trial % 7 == 1 else 1)
        ts = np.arange(count, dtype=float) * 10
        if trial % 7 == 2:
            seq[rng.integers(0, count)] = -1
        if trial % 7 == 3 and count > 2:
            seq[1] = seq[0]
        if trial % 7 == 4:
            ts = rng.integers(0, count // 3 + 1, count).astype(float)
            ts[rng.random(count) < 0.05] = np.nan
        if trial % 7 == 5 and rank == 1:  # (the same group's all-reduce of another size)
            other = (meta % 3 == 0) & (rng.random(count) < 0.1)
            meta[other] = len(groups) * 3 + meta[other] // 3
        keep = rng.random(count) > (0.02 if trial % 7 == 6 else 0)
        send = np.isin(meta % 3, (1, 2)) & (rng.random(count) < 0.5)
        seq[send & (trial % 2 == 0)] = -1
        peer = np.where(np.isin(meta % 3, (1, 2)), (rank + 1) % world, -1)
        ranks.append(algo.RankKernels(rank, ts[keep], np.full(keep.sum(), 5.0), meta[keep].astype(np.int32), metas,
                                      seq[keep], peer[keep].astype(np.int32)))
    return ranks


def _seen(matching: collectivematch.Matching) -> list:
    return [(found.rule, found.key, found.rows) for found in matching]


@pytest.mark.slow  # (140 matchings on disk)
def test_bounded_matching_is_the_matching_in_memory(tmp_path, monkeypatch):
    """Random runs of each kind of Seq trouble: with blocks of 5 to 64 kernels and every sort on disk, the
    collectives (rule, key, rows, in order), the trusted groups and the notes equal the matching in memory;
    no file is left."""
    rng = np.random.default_rng(11)
    kinds = set()
    for trial in range(70):
        ranks = _ranks(rng, trial)
        kernels = collectivematch.kernels_of(algo.match(ranks))
        notes: list[str] = []
        expected = collectivematch.match(kernels, notes)
        kinds.update(note.split(": ")[-1] for note in notes)
        for block in (5, 64):
            monkeypatch.setattr(algo, "RECORD_BLOCK", block)
            found_notes: list[str] = []
            found = collectivebuckets.match(kernels, found_notes, collectivesort.DiskOrder(str(tmp_path), 0))
            assert isinstance(found.rows, np.memmap)
            assert _seen(found) == _seen(expected), (trial, block)
            assert found.trusted == expected.trusted and found_notes == notes, (trial, block)
            del found
        monkeypatch.setattr(algo, "RECORD_BLOCK", 65_536)
    assert not list(tmp_path.iterdir())
    assert {"a rank holding one Seq twice", "kernels of one Seq whose args differ across ranks",
            "Seqs that do not rise with the kernels' starts", "send/recv counted in the same Seq"} <= kinds, kinds


def _peak_growth(measure: Callable[[int], int], small: int, large: int) -> int:
    """How much higher ``measure``'s traced peak is for ``large`` than for ``small``, measured after a first run
    (whose peak holds what its first calls set up once)."""
    measure(small)
    return measure(large) - measure(small)


def _matching_peak(directory: str, count: int, one_seq: bool = False) -> int:
    """4 ranks of ``count`` all-reduces over two groups, with Seqs (``one_seq``: every kernel the same one), their
    records on disk: the peak traced while they are matched beyond TraceLens with every sort on disk (after the
    records are made)."""
    metas = [_meta(group, "allreduce") for group in ("0", "1")]
    seqs = np.zeros(count, np.int64) if one_seq else np.arange(count) // 2
    ranks = [algo.RankKernels(rank, np.arange(count, dtype=float), np.full(count, 5.0),
                              (np.arange(count) % 2).astype(np.int32), metas, seqs,
                              np.full(count, -1, np.int32)) for rank in range(4)]
    store = collectivespill.SpilledKernels(directory, budget=0)
    try:
        kernels = collectivematch.kernels_of(algo.match(ranks, store, let_go=True))
        del ranks
        notes: list[str] = []
        tracemalloc.start()
        matching = collectivebuckets.match(kernels, notes, collectivesort.DiskOrder(directory, 0))
        assert len(matching.seqs) == count and matching.trusted == {("0", "[0, 1, 2, 3]"), ("1", "[0, 1, 2, 3]")}
        assert ("a rank holding one Seq twice" in " ".join(notes)) == one_seq, notes
        last = next(found for at, found in enumerate(matching) if at == count - 1)
        assert last.rows == [count - 1 + rank * count for rank in range(4)]
        del matching
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
        store.close()


@pytest.mark.slow  # (tracemalloc)
def test_bounded_matching_holds_its_budget(tmp_path, monkeypatch):
    """4 ranks of 20,000 and then 200,000 kernels (the matching in memory takes tens of bytes a kernel at its
    peak: some 20 MB more for the larger): with blocks of 4,096 the peak grows by less than 1 MB."""
    monkeypatch.setattr(algo, "RECORD_BLOCK", 4_096)
    growth = _peak_growth(lambda count: _matching_peak(str(tmp_path), count), 20_000, 200_000)
    assert growth < 1e6, growth
    assert not list(tmp_path.iterdir())


@pytest.mark.slow  # (tracemalloc)
def test_one_seq_on_every_kernel_is_never_held_whole(tmp_path, monkeypatch):
    """A hostile input whose kernels all carry one Seq (a run of one Seq as long as the group): read in pieces, so
    the peak grows by less than 1 MB from 20,000 to 200,000 kernels a rank, and the matching falls back to order
    with the note it gives in memory."""
    monkeypatch.setattr(algo, "RECORD_BLOCK", 4_096)
    growth = _peak_growth(lambda count: _matching_peak(str(tmp_path), count, one_seq=True), 20_000, 200_000)
    assert growth < 1e6, growth
    assert not list(tmp_path.iterdir())


class _Counted:
    """A long table's sink that keeps no row (what is measured is the summary's inputs)."""

    def __init__(self) -> None:
        self.count = 0

    def add(self, row: dict, key: object = None) -> None:
        self.count += 1

    def __len__(self) -> int:
        return self.count


def _summary(consumer: collectivetables.All2allv, count: int) -> list:
    """nccl_summary_all2allv's rows over ``count`` all_to_allv of 4 ranks in two groups, sizes drawn at random
    (ties among them), durations whole or not."""
    sizes = np.random.default_rng(count).integers(1, 50, count) / 4
    for at in range(count):
        group = str(at % 2)
        rows = [[f"{group}_{at}", at, rank, group, "[0, 1, 2, 3]", "all_to_allv", 4, "Float", 8, float(sizes[at]),
                 8, 1.0, "[2, 2, 2, 2]", "[2, 2, 2, 2]", 7, 100 * at + rank, 10 + rank + (at % 3) / 2]
                for rank in range(4)]
        consumer.collective(algo.Collective((rows[0][0], rows[0][4]), rows, [0] * 4))
    return consumer.summary().rows


def _all2allv_peak(directory: str, count: int) -> tuple[list, int]:
    """:func:`_summary` with the records' and the sort's budgets at 0, the kept values' at 8 KB (at 0 each value
    is a piece of 16 bytes' bookkeeping): its rows, and the peak traced while it is made."""
    tracemalloc.start()
    spill = valuespill.ValueSpill(directory, budget=8 << 10)
    store = collectivespill.SpilledKernels(directory, budget=0, dtype=collectivetables.ALL2ALLV_RECORD)
    try:
        rows = _summary(collectivetables.All2allv(_Counted(), None, spill.column, store,
                                                  collectivesort.DiskOrder(directory, 0)), count)
        assert store.spilled
        return rows, tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
        spill.close()
        store.close()


@pytest.mark.slow  # (tracemalloc)
def test_all2allv_summary_inputs_hold_their_budget(tmp_path, monkeypatch):
    """2,000 and then 20,000 all_to_allv (a few hundred bytes each as Python tuples in memory): with budgets at 0
    and blocks of 1,024 the summary's inputs are records on disk, ordered there, and its peak grows
    by less than 1 MB (the kept values read back 1,024 at a time); the summary is the one made in memory, cell
    for cell (ints as ints)."""
    monkeypatch.setattr(algo, "RECORD_BLOCK", 1_024)
    for read in (groupagg.windowed_median, groupagg.windowed_sum):
        monkeypatch.setattr(read, "__defaults__", (1_024,))
    _all2allv_peak(str(tmp_path), 2_000)  # (a first run's peak holds what its first calls set up once)
    peaks = {}
    for count in (2_000, 20_000):
        rows, peaks[count] = _all2allv_peak(str(tmp_path), count)
        assert repr(rows) == repr(_summary(collectivetables.All2allv(_Counted(), None), count))
    assert peaks[20_000] - peaks[2_000] < 1e6, peaks  # (in memory: about 7 MB more)
    assert not list(tmp_path.iterdir())


def _p2p_ranks(count: int, rng: np.random.Generator | None = None) -> list[algo.RankKernels]:
    """4 ranks in a ring, each sending ``count`` times to the next and receiving as often from the one before,
    over two groups (starts drawn at random with ties when ``rng`` is given, else rising); rank 3 sends one
    more to rank 0, and a send without a peer."""
    metas = [_meta(group, name) for group in ("0", "1") for name in ("send", "recv")]
    ranks = []
    for rank in range(4):
        sends = count + (rank == 3)
        meta = np.r_[np.arange(sends) % 2 * 2, np.arange(count) % 2 * 2 + 1, 0].astype(np.int32)
        peer = np.r_[np.full(sends, (rank + 1) % 4), np.full(count, (rank - 1) % 4), -1].astype(np.int32)
        ts = rng.integers(0, count, len(meta)).astype(float) if rng is not None else np.arange(len(meta), dtype=float)
        ranks.append(algo.RankKernels(rank, ts, ts % 7 + 1, meta, metas, np.full(len(meta), -1), peer))
    return ranks


def _pairs_of(ranks: list[algo.RankKernels]) -> list[tuple]:
    """The oracle: per (group, src, dst) with as many sends as recvs, the k-th send by start (ties in file
    order) with the k-th recv, as (group, src, dst, index, send ts, recv ts)."""
    found: dict[tuple, list[list]] = {}
    for kernels in ranks:
        for at in range(len(kernels.ts)):
            group, name = kernels.metas[kernels.meta[at]][0], kernels.metas[kernels.meta[at]][2]
            peer = int(kernels.peer[at])
            if peer >= 0:
                key = (group, kernels.rank, peer) if name == "send" else (group, peer, kernels.rank)
                found.setdefault(key, [[], []])[name == "recv"].append(kernels.ts[at])
    return [(*key, index, send, recv) for key, (sent, received) in sorted(found.items()) if len(sent) == len(received)
            for index, (send, recv) in enumerate(zip(sorted(sent), sorted(received)))]


class _Kept(_Counted):
    def __init__(self) -> None:
        super().__init__()
        self.rows: list = []

    def add(self, row: list, key: object = None) -> None:
        self.rows.append(row)


def test_p2p_pairs_on_disk_are_the_pairs(tmp_path, monkeypatch):
    """Sends and recvs with tied and shuffled starts, ordered by pair and start on disk in blocks of 5: the
    pairs are the oracle's, the uneven pair and the send without a peer are noted."""
    monkeypatch.setattr(algo, "RECORD_BLOCK", 5)
    ranks = _p2p_ranks(40, np.random.default_rng(2))
    expected = _pairs_of(ranks)
    kernels = collectivematch.kernels_of(algo.match(ranks))
    for orderer in (algo.order_in_memory, collectivesort.DiskOrder(str(tmp_path), 0)):
        rows, notes = _Kept(), []
        collectivematch.p2p_pairs(kernels, {}, notes, rows, orderer=orderer)
        assert [tuple(row[:6]) for row in rows.rows] == expected
        assert len(notes) == 2 and "4 send/recv kernels without" in notes[0] and "3->0 (21 sends, 20 recvs)" in notes[1]
    assert not list(tmp_path.iterdir())


def _p2p_peak(directory: str, count: int) -> int:
    """:func:`_p2p_ranks` with its records on disk and every sort on disk: the peak traced while p2p_pairs is
    made (its rows counted, not kept)."""
    store = collectivespill.SpilledKernels(directory, budget=0)
    try:
        kernels = collectivematch.kernels_of(algo.match(_p2p_ranks(count), store, let_go=True))
        tracemalloc.start()
        rows = _Counted()
        collectivematch.p2p_pairs(kernels, {}, [], rows, orderer=collectivesort.DiskOrder(directory, 0))
        assert len(rows) == 7 * count // 2  # (3->0 in group 0 is uneven)
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
        store.close()


@pytest.mark.slow  # (tracemalloc)
def test_p2p_pairs_hold_their_budget(tmp_path, monkeypatch):
    """4 ranks of 2 x 20,000 and then 2 x 200,000 sends and recvs (a list entry per kernel by pair in memory):
    with blocks of 1,024 the peak grows by less than 1 MB."""
    monkeypatch.setattr(algo, "RECORD_BLOCK", 1_024)
    growth = _peak_growth(lambda count: _p2p_peak(str(tmp_path), count), 20_000, 200_000)
    assert growth < 1e6, growth
    assert not list(tmp_path.iterdir())
