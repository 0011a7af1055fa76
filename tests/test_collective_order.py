"""The collective kernels before their records: pass 1's columns and each rank's kernels on disk beyond a budget
(io/kernelfiles.py), and a rank's order by group and start made on disk beyond another (io/collectivesort.py):
the same order and the same tables as in memory, in memory that does not grow with the number of kernels."""
from __future__ import annotations

import errno
import math
import os
import subprocess
import sys
import tracemalloc
from array import array

import numpy as np
import pytest
from test_collectives_bounded import collective_csvs, tiny_budgets
from test_collectives_scale import csv_bytes
from tracelens_cases import SMALL, case_files

import streamtrace
from streamtrace.algo import collectivebuckets
from streamtrace.algo import collectives as algo
from streamtrace.commands.analyses import collectives as command
from streamtrace.commands.analyze import analyze
from streamtrace.errors import TransferError
from streamtrace.io import collectivesort, collectivespill, kernelfiles
from streamtrace.synth import SynthConfig, write_traces


def _starts(rng: np.random.Generator, count: int, kind: int) -> np.ndarray:
    """Starts with ties, rising, spread, or falling; some NaN, -0.0, 0.0 and -inf among them."""
    ts = [rng.integers(0, 20, count).astype(float), np.sort(rng.standard_normal(count)),
          rng.standard_normal(count) * 1e6, np.arange(count, dtype=float)[::-1].copy()][kind]
    for value, share in ((math.nan, 10), (-0.0, 10), (0.0, 20), (-math.inf, 30)):
        ts[rng.integers(0, count, count // share)] = value
    return ts


@pytest.mark.slow  # (60 sorts on disk)
def test_order_on_disk_is_the_sort_in_memory(tmp_path, monkeypatch):
    """Random ranks of up to 4 groups: the order by group, start and file position, and each kernel's place
    in its group, made on disk beyond a budget (blocks of 7 to 1,000 kernels, pieces split until they fit)
    equal numpy's stable sort of the whole rank; no file is left."""
    rng = np.random.default_rng(5)
    for trial in range(20):
        count, groups = int(rng.integers(1, 4_000)), int(rng.integers(1, 5))
        group, ts = rng.integers(0, groups, count).astype(np.int32), _starts(rng, count, trial % 4)
        sizes = np.bincount(group, minlength=groups)

        def keys(first: int, end: int, group: np.ndarray = group, ts: np.ndarray = ts) -> tuple:
            return group[first:end], ts[first:end]

        expected = np.lexsort((ts, group))
        order, index = algo.order_in_memory(count, keys, sizes)
        assert np.array_equal(order, expected)
        for budget, block in ((0, 7), (500, 64), (3_000, 1_000)):
            monkeypatch.setattr(algo, "RECORD_BLOCK", block)
            sorter = collectivesort.DiskOrder(str(tmp_path), budget)
            found = sorter(count, keys, sizes)
            assert sorter.spilled == (count * collectivesort.KERNEL_SORT_BYTES > budget)
            assert np.array_equal(found[0], order) and np.array_equal(found[1], index), (trial, budget)
            del found
    assert not list(tmp_path.iterdir())


def _collected(directory: str, ranks: int, count: int, part: int = 8_192) -> command.KernelCollector:
    """A file's collector after pass 1: ``ranks`` ranks (pid slot = rank) of ``count`` all-reduces each, over
    two process groups, absorbed a worker's part at a time as analyze's index does (spilling as it goes)."""
    collector = command.KernelCollector(directory)
    metas = [(name, "[0, 1]", "allreduce", 2, "Float", 8, 8, "[]", "[]", 7) for name in ("0", "1")]
    for first in range(0, count, part):
        size = min(part, count - first)
        for rank in range(ranks):
            places = np.arange(first, first + size)
            collector.absorb({"ts": array("d", (places * 10.0 + rank).tolist()), "dur": array("d", [5.0]) * size,
                              "slot": array("i", [rank]) * size, "rank": array("i", [-1]) * size,
                              "meta": array("i", (places % 2).tolist()), "seq": array("q", places.tolist()),
                              "peer": array("i", [-1]) * size, "metas": metas if first == 0 and rank == 0 else [],
                              "strides": {}}, 0, array("i", range(ranks)))
            collector.spill()
    return collector


def _matched_peak(directory: str, ranks: int, count: int) -> tuple[list, int]:
    """Pass 1's collector, each rank's kernels and the records matched (everything on disk from its first
    byte): the last records' places, and the peak traced."""
    tracemalloc.start()
    store = collectivespill.SpilledKernels(directory, budget=0)
    try:
        collector = _collected(directory, ranks, count)
        inputs = [collector.of_rank(rank, list(range(ranks)), 0) for rank in range(ranks)]
        collector.close()
        matched = algo.match([given.kernels for given in inputs], store, let_go=True,
                             orderer=collectivesort.DiskOrder(directory, budget=0))
        peak = tracemalloc.get_traced_memory()[1]
        assert all(given.path is not None for given in inputs)
        for given in inputs:
            kernelfiles.remove(given.path)
        return matched.records["index"][-2:].tolist(), peak
    finally:
        tracemalloc.stop()
        store.close()


@pytest.mark.slow  # (tracemalloc)
def test_kernels_before_their_records_hold_their_budgets(tmp_path, monkeypatch):
    """2 ranks of 20,000 and then of 200,000 kernels (40 bytes each in pass 1, 32 in a rank's arrays, about 30
    in the sort: 14 MB more for the larger in memory), with every budget at 0 and blocks of 4,096: pass 1's
    collector, each rank's kernels and their matching take no more than 250 KB more for 10 times the kernels."""
    monkeypatch.setattr(kernelfiles, "COLUMN_BYTES", 0)
    monkeypatch.setattr(algo, "RECORD_BLOCK", 4_096)
    peaks = {}
    for count in (20_000, 200_000):
        places, peaks[count] = _matched_peak(str(tmp_path), 2, count)
        assert places == [count // 2 - 1] * 2
    assert peaks[200_000] - peaks[20_000] < 250e3, peaks
    assert not list(tmp_path.iterdir())


PP4 = SynthConfig(ranks=4, pp_stages=2, slow_rank=1, seed=6, **SMALL)
"""4 generated ranks in 2 pipeline stages: send/recv between them, all_to_allv, all-reduces."""


@pytest.mark.slow  # (analyze runs)
@pytest.mark.parametrize("case", ["synth_fsdp4", "dlrm_8ranks", "synth_pp4"])
def test_kernels_on_disk_give_the_same_tables(tmp_path, monkeypatch, case):
    """Pass 1's columns, each rank's kernels, every rank's order and the matching beyond TraceLens on disk from
    the first kernel, in blocks of 5: the CSVs are the bytes of the run in memory, from rank files in one
    process and with -j 2, and (generated) from streamtrace merge's file; no temporary file is left."""
    if case == "synth_pp4":
        files = [tmp_path / "in" / rank["file"] for rank in write_traces(PP4, tmp_path / "in", compress="gz")["ranks"]]
    else:
        files = case_files(case, tmp_path / "in")
    analyze(files, tmp_path / "memory", all2allv_heatmap=True)
    expected = collective_csvs(tmp_path / "memory")
    if case == "synth_pp4":
        assert {"p2p_pairs.csv", "nccl_all2allv.csv", "collective_matches.csv"} <= set(expected)
    bounded: list[int] = []
    matched = collectivebuckets._Bounded.match
    monkeypatch.setattr(collectivebuckets._Bounded, "match", lambda self, *a: bounded.append(1) or matched(self, *a))
    tiny_budgets(monkeypatch)
    monkeypatch.setattr(kernelfiles, "COLUMN_BYTES", 0)
    monkeypatch.setattr(collectivesort, "SORT_BYTES", 0)
    monkeypatch.setattr(algo, "RECORD_BLOCK", 5)
    ranked, ordered = [], []
    append, on_disk = kernelfiles.RankFiles.append, collectivesort.DiskOrder._on_disk
    monkeypatch.setattr(kernelfiles.RankFiles, "append", lambda self, *a: ranked.append(1) or append(self, *a))
    monkeypatch.setattr(collectivesort.DiskOrder, "_on_disk", lambda self, *a: ordered.append(1) or on_disk(self, *a))
    runs = {"one process": (files, {"jobs": 1}), "jobs": (files, {"jobs": 2})}
    if case.startswith("synth"):
        merged = tmp_path / "merged.json"
        streamtrace.merge([str(path) for path in files], str(merged))
        runs["merged"] = ([merged], {"jobs": 2})
    for name, (given, options) in runs.items():
        spool = tmp_path / f"spool_{name.replace(' ', '_')}"
        spool.mkdir()
        analyze(given, tmp_path / name, all2allv_heatmap=True, spool_dir=str(spool), **options)
        assert ordered, f"{name}: no rank ordered on disk"
        assert bounded, f"{name}: the matching beyond TraceLens was not bounded"
        bounded.clear()
        assert ranked or name != "one process", f"{name}: no rank's kernels went to their file"
        assert not list(spool.iterdir()), name  # no temporary file left
        ranked.clear()
        ordered.clear()
        assert collective_csvs(tmp_path / name) == expected, name


@pytest.mark.slow  # (an analyze run)
def test_a_full_disk_while_ordering_leaves_no_file(tmp_path, monkeypatch):
    """The disk fills while a rank's kernels are ordered on disk, after every rank's kernels went to their files
    (in the worker processes of -j 2): one error naming the spool, no output, and nothing left in the spool."""
    files = case_files("synth_fsdp4", tmp_path / "in")
    monkeypatch.setattr(kernelfiles, "COLUMN_BYTES", 0)
    monkeypatch.setattr(collectivesort, "SORT_BYTES", 0)

    spool = tmp_path / "spool"
    spool.mkdir()
    ranks_on_disk: list[int] = []

    def full(self, *args) -> None:
        ranks_on_disk.append(len(list(spool.glob("*/streamtrace-rank*.collectives"))))
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(collectivesort.DiskOrder, "_on_disk", full)
    with pytest.raises(TransferError, match="disk full"):
        analyze(files, tmp_path / "out", spool_dir=str(spool), jobs=2)
    assert ranks_on_disk == [4]
    assert not list(spool.iterdir()) and not (tmp_path / "out").exists()


@pytest.mark.slow  # (analyze runs)
def test_skipped_report_collects_no_kernels(tmp_path, monkeypatch):
    """With --skip collectives pass 1 collects no collective kernel (and, past its budget, writes no rank's
    file); the other tables are the run's without the option."""
    files = case_files("synth_fsdp4", tmp_path / "in")
    monkeypatch.setattr(kernelfiles, "COLUMN_BYTES", 0)
    added, ranked = [], []
    add, append = command.KernelCollector._add, kernelfiles.RankFiles.append
    monkeypatch.setattr(command.KernelCollector, "_add", lambda self, *a: added.append(1) or add(self, *a))
    monkeypatch.setattr(kernelfiles.RankFiles, "append", lambda self, *a: ranked.append(1) or append(self, *a))
    analyze(files, tmp_path / "all", jobs=1)
    assert added and ranked
    added.clear()
    ranked.clear()
    analyze(files, tmp_path / "skipped", jobs=1, skip="collectives")
    assert not added and not ranked
    kept = {name: text for name, text in csv_bytes(tmp_path / "all").items() if name[:-4] not in algo.TABLE_NAMES}
    assert csv_bytes(tmp_path / "skipped") == kept


ORDER_ON_A_FULL_DISK = """
import sys
import numpy as np
from streamtrace.errors import TraceError
from streamtrace.io.collectivesort import DiskOrder
count = 200_000
groups, starts = np.zeros(count, dtype=np.int64), np.arange(count, 0, -1, dtype=np.float64)
try:
    DiskOrder(sys.argv[1], 0)(count, lambda first, stop: (groups[first:stop], starts[first:stop]), np.array([count]))
except TraceError as exc:
    print(exc)
"""


@pytest.fixture
def small_disk(tmp_path):
    """A 256 KiB filesystem (tmpfs, mounted for the test: root only)."""
    mounted = tmp_path / "small"
    mounted.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=256k", "tmpfs", str(mounted)], capture_output=True).returncode:
        pytest.skip("cannot mount a tmpfs here (needs root)")
    yield mounted
    subprocess.run(["umount", str(mounted)], check=True)


def test_ordering_on_a_full_disk_is_a_one_line_error_not_a_crash(small_disk):
    """The order's scratch files reserve their blocks: a write through a memory map of a sparse file on a
    full disk would kill the process with SIGBUS."""
    done = subprocess.run([sys.executable, "-c", ORDER_ON_A_FULL_DISK, str(small_disk)], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith(f"{small_disk}: disk full while writing a temporary file"), done.stdout
    assert list(small_disk.iterdir()) == []
