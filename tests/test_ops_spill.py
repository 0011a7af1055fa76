"""analyze --ops keeps its pass-1 columns (a few numbers per host op, GPU
event, flow and annotation) in memory up to a block, then in temporary
files handed to the tables as read-only maps: what the ops collector holds
after pass 1 does not grow with the trace, and the tables are the same byte
for byte whether the columns went to disk or stayed in memory."""
from __future__ import annotations

import gc
import os
import subprocess
import sys
import tracemalloc

import pytest
from tracelens_perf_reference import CASES, trace_of

from streamtrace.algo import opsreport, opstables, optree, unifiedperf
from streamtrace.algo.opstables import OpsFacts, OpTree
from streamtrace.commands.analyses import ops
from streamtrace.commands.analyses.index import AnalyzeIndex
from streamtrace.commands.analyses.task import Options, analyze_file, discard
from streamtrace.engine import indexworkers, parseproc
from streamtrace.engine.passes import index_pass
from streamtrace.io.scratch import is_mapped
from streamtrace.io.source import InputSource

SMALL_CASES = [case for case in CASES if case not in {"b200_eager", "nccl_rank0"}]  # (the two largest: slow)
COLLECTOR_FILES = (os.path.join("analyses", "ops.py"), os.path.join("analyses", "opsprojected.py"))


def _held_after_pass_1(path: str) -> int:
    """Bytes the ops collector's code allocated and still holds once pass 1 (analyze's, in this process,
    the chunks projected as analyze reads them) has read ``path``."""
    tracemalloc.start()
    try:
        with InputSource(path) as source:
            result = index_pass(source, lambda: AnalyzeIndex(ops=True), keep_events=False, jobs=1)
        snapshot = tracemalloc.take_snapshot()
    finally:
        tracemalloc.stop()
    held = sum(stat.size for stat in snapshot.statistics("filename")
               if stat.traceback[0].filename.endswith(COLLECTOR_FILES))
    result.visitor.close()
    return held


def _synth(directory: str, steps: int) -> str:
    subprocess.run([sys.executable, "-m", "streamtrace", "synth", directory, "--ranks", "1", "--pp-stages", "1",
                    "--steps", str(steps), "--no-merged", "--compress", "none", "-q"], check=True)
    return os.path.join(directory, "rank0_trace.json")


@pytest.mark.slow
def test_what_pass_1_holds_for_the_ops_does_not_grow_with_the_trace(tmp_path, monkeypatch) -> None:
    monkeypatch.setattr(ops, "SPILL_ROWS", 512, raising=False)  # (a small block, so that small traces show the bound)
    small, large = (_synth(str(tmp_path / f"s{steps}"), steps) for steps in (1, 10))
    assert os.path.getsize(large) > 9 * os.path.getsize(small)
    held_small, held_large = _held_after_pass_1(small), _held_after_pass_1(large)
    assert held_large < 2 * held_small, (held_small, held_large)


def _ops_tables(path: str, rows: int, monkeypatch: pytest.MonkeyPatch) -> dict[str, bytes]:
    monkeypatch.setattr(ops, "SPILL_ROWS", rows)
    tables, _ = ops.ops_tables(path)
    return tables


@pytest.mark.parametrize("case", SMALL_CASES)
def test_tables_are_the_same_from_disk_and_from_memory(case: str, tmp_path, monkeypatch) -> None:
    path = trace_of(case, str(tmp_path))
    held = _ops_tables(path, 1 << 40, monkeypatch)
    spilled = _ops_tables(path, 7, monkeypatch)
    assert held and spilled == held


@pytest.mark.parametrize("jobs", [1, 2])
def test_analyze_tables_are_the_same_from_disk_and_from_memory(jobs: int, tmp_path, monkeypatch) -> None:
    """Through analyze's pass 1: projected chunks, and with -j 2 the parts of its workers, absorbed."""
    monkeypatch.setattr(parseproc, "MIN_BYTES", 0)  # (a small input read by the -j workers too,
    monkeypatch.setattr(indexworkers, "CHUNK_BYTES", 1 << 15)  # in many parts)
    path = trace_of("synth_rank0", str(tmp_path))
    spool = tmp_path / "spool"
    spool.mkdir()
    options = Options(include_last_step=False, salvage=False, spool_dir=str(spool), jobs=jobs, ops=True)
    files = {}
    for rows in (1 << 40, 5):
        monkeypatch.setattr(ops, "SPILL_ROWS", rows)
        result = analyze_file(path, options)
        discard(result)  # (the rest of analyze's parts: what its caller removes)
        files[rows] = result.ops.files
    assert len(files[5]) > 5 and files[5] == files[1 << 40]
    assert os.listdir(spool) == []  # (the columns' files are unnamed: nothing left behind)


def test_spilled_columns_reach_the_tables_as_maps(tmp_path, monkeypatch) -> None:
    monkeypatch.setattr(ops, "SPILL_ROWS", 1)
    facts = ops.read_input(trace_of("kineto_small", str(tmp_path)))[0]
    assert is_mapped(facts.h_ts) and is_mapped(facts.g_dur)
    assert not facts.h_ts.flags.writeable


@pytest.mark.slow
def test_a_file_of_several_ranks_holds_one_ranks_facts_at_a_time(tmp_path, monkeypatch) -> None:
    """Each rank's columns are taken out of the file's when its tables are made, and let go after."""
    held = []
    perf_tables = ops.opsreport.perf_tables

    def counting(facts: OpsFacts, spec: dict | None = None, **stages) -> tuple:
        held.append(sum(isinstance(one, OpsFacts) for one in gc.get_objects()))
        return perf_tables(facts, spec, **stages)

    monkeypatch.setattr(ops.opsreport, "perf_tables", counting)
    options = Options(include_last_step=False, salvage=False, spool_dir=None, jobs=1, ops=True)
    subprocess.run([sys.executable, "-m", "streamtrace", "synth", str(tmp_path), "--ranks", "3", "--pp-stages", "1",
                    "--steps", "1", "--python-noise", "0", "--compress", "none", "-q"], check=True)
    files = analyze_file(str(tmp_path / "merged_trace.json"), options).ops.files
    assert {path.split(os.sep)[1] for path in files} == {"rank0", "rank1", "rank2"}
    assert held == [1, 1, 1]


@pytest.mark.slow
def test_the_op_tree_keeps_no_list_of_each_launchers_gpu_events_in_event_order(tmp_path) -> None:
    """The tree keeps each launcher's GPU events once (by start, as the tables read them), in typed arrays:
    what it holds per GPU event stays under 60 bytes on a generated rank (about 33; 150 with a Python list
    per launcher, 178 with a second one in event order)."""
    facts = ops.read_input(_synth(str(tmp_path), 10))[0]
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        tree = OpTree(facts)
        held = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert len(tree.launchers) and held / len(facts.g_ts) < 60, held / len(facts.g_ts)


def _tables_peak(path: str, monkeypatch) -> tuple[int, int, dict]:
    """The most the tables of ``path`` allocate at once (tracemalloc's peak, the columns read first, in
    small blocks so that a small trace shows the bound), its GPU events, and the tables' CSV bytes."""
    for module, name in ((optree, "TREE_BLOCK"), (optree, "SUM_BLOCK"), (optree, "KAHAN_BLOCK"), (opstables, "STD_BLOCK"),
                         (opstables, "LAUNCHER_BLOCK"), (opstables, "BUSY_BLOCK"), (unifiedperf, "ROW_BLOCK"),
                         (unifiedperf, "KERNEL_BLOCK"),
                         (getattr(opstables, "blockunique", opstables), "BLOCK")):
        monkeypatch.setattr(module, name, 256, raising=False)  # (absent in code without blocks)
    facts = ops.read_input(path)[0]
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        tables, _ = opsreport.perf_tables(facts)
        peak = tracemalloc.get_traced_memory()[1] - before
    finally:
        tracemalloc.stop()
    return peak, len(facts.g_ts), {stem: ops.table_csv(table) for stem, table in tables.items()}


@pytest.mark.slow
def test_what_the_tables_hold_per_op_is_a_few_numbers(tmp_path, monkeypatch) -> None:
    """The tables hold typed columns indexed by op row, not a dict or list per op: on generated ranks of N
    and 4N steps (every table made), the peak grows by under 200 bytes per added GPU event (about 110; 543
    with a dict per row and a list per launcher); the tables made in blocks of 256 rows are the ones made in
    one block."""
    small, large = (_synth(str(tmp_path / f"s{steps}"), steps) for steps in (2, 8))
    expected = ops.ops_tables(small)[0]  # (blocks of the usual size: one block here)
    (peak_small, gpu_small, tables), (peak_large, gpu_large, _) = (_tables_peak(path, monkeypatch)
                                                                   for path in (small, large))
    assert {"unified_perf_summary", "ops_unique_args", "kernel_summary"} <= set(tables)
    assert tables == {stem: data for stem, data in expected.items() if stem in tables}  # (many blocks: the same)
    assert gpu_large > 3.5 * gpu_small
    per_event = (peak_large - peak_small) / (gpu_large - gpu_small)
    assert 0 < per_event < 200, (peak_small, peak_large, per_event)
