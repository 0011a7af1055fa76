"""analyze --ops on a file of several ranks: one set of tables per rank
(ops/rank<N>), each equal to what the rank's own file gives, whether the
ranks were merged by ``streamtrace merge`` or concatenated with args.rank."""
from __future__ import annotations

import csv
import io
import json
import subprocess
import sys
from pathlib import Path

import annotated_attention_trace
import pytest
from conftest import TRACES

import streamtrace
from streamtrace.commands.analyses.ops import ops_tables, own_names
from streamtrace.engine import indexworkers, parseproc

DLRM = TRACES / "dlrm_8ranks"
UID_COLUMNS = ("ex_UID", "UID_first")  # TraceLens's UIDs: an event's place in its file


def _ops(inputs: list, out: Path) -> dict[str, dict[str, str]]:
    """analyze --ops of ``inputs``: each ops folder's CSV texts by name."""
    streamtrace.analyze(inputs, str(out), ops=True, only="temporal")
    return {folder.name: {table.name: table.read_text() for table in sorted(folder.iterdir())}
            for folder in sorted((out / "ops").iterdir())}


def _synth(tmp_path: Path, *flags: str) -> Path:
    work = tmp_path / "synth"
    subprocess.run([sys.executable, "-m", "streamtrace", "synth", str(work), "--ranks", "2", "--pp-stages", "1",
                    "--steps", "1", "--python-noise", "1", "--graph-kernels", "8", "--graph-streams", "4",
                    "--eager-kernels", "6", "--compress", "none", "--seed", "5", *flags, "-q"], check=True)
    return work


def _without(text: str, columns: tuple[str, ...]) -> list[list[str]]:
    rows = list(csv.reader(io.StringIO(text)))
    kept = [n for n, name in enumerate(rows[0]) if name not in columns] if rows else []
    return [[row[n] for n in kept] for row in rows]


def _synthetic_uids_blank(tables: dict[str, dict[str, str]]) -> dict[str, dict[str, str]]:
    """The tables with unified_perf_summary's ``ex_UID`` of synthetic ops left blank: TraceLens numbers
    those after the trace's last event, and merge leaves each input's process_name and
    process_sort_index events out, so a merged rank holds fewer events than its file."""
    out = {}
    for label, files in tables.items():
        out[label] = dict(files)
        rows = list(csv.reader(io.StringIO(files["unified_perf_summary.csv"])))
        at = rows[0].index("ex_UID")
        for row in rows[1:]:
            row[at] = "" if row[0].endswith("(Synthetic Op)") else row[at]
        out[label]["unified_perf_summary.csv"] = rows
    return out


@pytest.mark.slow
def test_merged_dlrm_ranks_give_each_rank_its_own_files_tables(tmp_path: Path) -> None:
    merged = tmp_path / "merged.json"
    streamtrace.merge(str(DLRM), str(merged))
    by_rank = _ops([str(DLRM)], tmp_path / "ranks")
    assert sorted(by_rank) == [f"rank{rank}" for rank in range(8)]
    from_merged = _ops([str(merged)], tmp_path / "merged")
    assert {label: {name: text for name, text in files.items() if name != "unified_perf_summary.csv"}
            for label, files in from_merged.items()} == \
        {label: {name: text for name, text in files.items() if name != "unified_perf_summary.csv"}
         for label, files in by_rank.items()}  # every other table, byte for byte
    assert _synthetic_uids_blank(from_merged) == _synthetic_uids_blank(by_rank)


def test_concatenated_ranks_give_each_rank_its_own_files_tables(tmp_path: Path) -> None:
    """Ranks concatenated, each event with its args.rank (synth's naive merge)."""
    work = _synth(tmp_path, "--merged-style", "rank-arg")
    by_rank = _ops([str(work / "rank0_trace.json"), str(work / "rank1_trace.json")], tmp_path / "ranks")
    assert sorted(by_rank) == ["rank0", "rank1"] and "ops_unique_args.csv" in by_rank["rank0"]
    assert _ops([str(work / "merged_trace.json")], tmp_path / "merged") == by_rank


def test_ranks_told_by_process_names_give_each_rank_its_tables(tmp_path: Path) -> None:
    """Ranks concatenated, their processes renamed ``RANK 0 - CPU``: the ranks
    found by the names, the tables the rank files' but for the names the file states."""
    work = _synth(tmp_path, "--merged-style", "process-name")
    by_rank = _ops([str(work / "rank0_trace.json"), str(work / "rank1_trace.json")], tmp_path / "ranks")
    merged = _ops([str(work / "merged_trace.json")], tmp_path / "merged")
    assert sorted(merged) == sorted(by_rank) == ["rank0", "rank1"]
    for label, tables in by_rank.items():
        assert sorted(merged[label]) == sorted(tables)
        for name, text in tables.items():
            assert _without(merged[label][name], ("process_name",)) == _without(text, ("process_name",)), (label, name)
    assert "RANK 1 - CPU" in merged["rank1"]["ops_unique_args.csv"]


@pytest.mark.slow
def test_merge_output_equals_the_rank_files_but_for_uids_where_compaction_coalesced(tmp_path: Path) -> None:
    """merge --no-compact keeps every event of a rank: the tables are the rank
    files'; compaction coalesces gpu_user_annotation spans, which moves the
    later events' places, so only the UID columns differ."""
    work = _synth(tmp_path, "--no-merged")
    ranks = [str(work / "rank0_trace.json"), str(work / "rank1_trace.json")]
    by_rank = _ops(ranks, tmp_path / "ranks")
    streamtrace.merge(ranks, str(tmp_path / "kept.json"), compact=False)
    assert _ops([str(tmp_path / "kept.json")], tmp_path / "kept") == by_rank
    streamtrace.merge(ranks, str(tmp_path / "compacted.json"))
    compacted = _ops([str(tmp_path / "compacted.json")], tmp_path / "compacted")
    assert sorted(compacted) == sorted(by_rank)
    differ = set()
    for label, tables in by_rank.items():
        assert sorted(compacted[label]) == sorted(tables)
        for name, text in tables.items():
            assert _without(compacted[label][name], UID_COLUMNS) == _without(text, UID_COLUMNS), (label, name)
            if compacted[label][name] != text:
                differ.add(name)
    assert "ops_unique_args.csv" in differ  # (the case this test is about happens)


def test_merge_names_are_the_inputs_own_again() -> None:
    metadata = {(1, 0, "process_name"): "rank 3 | process 59811 | python3",
                (2, 0, "process_name"): "PP rank 1 (global rank 3) | GPU",
                (3, 0, "process_name"): "PP rank 1 (global rank 3) | GPU | a | b",
                (1, 7, "thread_name"): "PP rank 1 | thread 7 (pt_main_thread)",
                (1, 0, "process_labels"): "CPU", (4, 0, "process_name"): "python3"}
    assert own_names(metadata) == {(1, 0, "process_name"): "python3", (3, 0, "process_name"): "a | b",
                                   (1, 7, "thread_name"): "thread 7 (pt_main_thread)",
                                   (1, 0, "process_labels"): "CPU", (4, 0, "process_name"): "python3"}


@pytest.mark.parametrize("jobs", [1, 2])
def test_ranks_split_from_pass_1_parts(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, jobs: int) -> None:
    """Pass 1 in 8 KiB chunks (workers with -j 2): the runs of each pid that number a rank's events
    are joined across parts, and each rank's tables are still its own file's."""
    monkeypatch.setattr(parseproc, "MIN_BYTES", 0)
    monkeypatch.setattr(indexworkers, "CHUNK_BYTES", 8 << 10)
    work = _synth(tmp_path, "--merged-style", "rank-arg")
    by_rank = {f"rank{rank}": ops_tables(str(work / f"rank{rank}_trace.json"))[0] for rank in (0, 1)}
    streamtrace.analyze([str(work / "merged_trace.json")], str(tmp_path / "out"), ops=True, only="temporal",
                        jobs=jobs)
    for label, tables in by_rank.items():
        folder = tmp_path / "out" / "ops" / label
        assert {path.name[:-4]: path.read_bytes() for path in folder.iterdir()} == tables


def test_merged_ranks_attention_reads_its_own_ranks_annotations(tmp_path: Path) -> None:
    """vLLM's attention under user annotations (scripts/annotated_attention_trace.py), rank 1's with other
    sums: each merged rank's attention rows read its own annotations, as its file's do (UIDs aside: merge
    leaves the inputs' process_name events out)."""
    document = annotated_attention_trace.build()
    ranks = [tmp_path / "rank0.json", tmp_path / "rank1.json"]
    ranks[0].write_text(json.dumps(document))
    for event in document["traceEvents"]:
        if "user_annotation" in event.get("cat", ""):
            event["name"] = event["name"].replace("sq64sk192", "sq60sk180")
    ranks[1].write_text(json.dumps(document))
    merged = tmp_path / "merged.json"
    streamtrace.merge([str(path) for path in ranks], str(merged))
    from_merged = _ops([str(merged)], tmp_path / "merged")
    for rank, path in enumerate(ranks):
        expected, _ = ops_tables(str(path))
        for stem in ("InferenceAttention_fwd", "unified_perf_summary"):
            got = from_merged[f"rank{rank}"][f"{stem}.csv"]
            assert _without(got, UID_COLUMNS) == _without(expected[stem].decode(), UID_COLUMNS), (rank, stem)
    assert ",60,180," in from_merged["rank1"]["InferenceAttention_fwd.csv"]
    assert ",60,180," not in from_merged["rank0"]["InferenceAttention_fwd.csv"]
