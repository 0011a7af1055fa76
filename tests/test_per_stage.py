"""``merge --per-stage``: one merged file per PP stage, each what ``merge --ranks`` of that stage writes."""
from __future__ import annotations

import hashlib
import os
from pathlib import Path

import pytest

from streamtrace import cli, merge
from streamtrace.commands import merge as merge_module
from streamtrace.errors import TraceError
from streamtrace.synth import SynthConfig, write_traces

SMALL = dict(microbatches=2, steps=1, graph_kernels=8, graph_streams=4, eager_kernels=4, python_noise=1)
STAGES, REPLICAS = 4, 4
WRITE_STAGE = merge_module._write_stage


@pytest.fixture(scope="module")
def run(tmp_path_factory) -> tuple[Path, dict]:
    """A generated PP 4 x DP 4 run and its ground truth."""
    directory = tmp_path_factory.mktemp("pp4dp4")
    truth = write_traces(SynthConfig(ranks=STAGES * REPLICAS, pp_stages=STAGES, **SMALL), directory, compress="gz",
                         merged=False)
    return directory, truth


def stage_ranks(truth: dict) -> dict[int, list[int]]:
    """The generator's own statement of each rank's stage."""
    stages: dict[int, list[int]] = {}
    for rank in truth["ranks"]:
        stages.setdefault(rank["pp_stage"], []).append(rank["rank"])
    return stages


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.mark.slow
def test_each_stage_file_equals_merge_of_that_stages_ranks(run, tmp_path):
    directory, truth = run
    summary = merge(directory, tmp_path / "stages", per_stage=True, jobs=2)
    stages = stage_ranks(truth)
    assert sorted(os.listdir(tmp_path / "stages")) == [f"pp_stage{stage}.json.gz" for stage in range(STAGES)]
    for stage, ranks in stages.items():
        alone = merge(directory, tmp_path / f"ranks{stage}.json.gz", ranks=",".join(map(str, ranks)), jobs=1)
        assert digest(tmp_path / "stages" / f"pp_stage{stage}.json.gz") == digest(tmp_path / f"ranks{stage}.json.gz")
        entry = summary["stages"][stage]
        assert entry["pp_stage"] == stage and entry["events_written"] == alone["events_written"]
        assert entry["pp_compute_dependency_pairs"] == alone["pp_compute_dependency_pairs"] > 0  # kept in a stage
    sends = sum(rank["pp_action_counts"].get(op, 0) for rank in truth["ranks"] for op in ("SEND_F", "SEND_B"))
    assert summary["pp_cross_stage_arrows"] == sends > 0  # every send goes to a neighbouring stage
    assert summary["events_written"] == sum(entry["events_written"] for entry in summary["stages"])
    assert summary["output"] == [str(tmp_path / "stages" / f"pp_stage{stage}.json.gz") for stage in range(STAGES)]


@pytest.mark.slow
def test_one_process_and_the_cli_write_the_same_files(run, tmp_path, capsys):
    directory, _ = run
    merge(directory, tmp_path / "pool", per_stage=True, jobs=2, ranks="0-7")
    assert cli.main(["merge", str(directory), "--ranks", "0-7", "--per-stage", "-o", str(tmp_path / "one") + "/",
                     "-j", "1", "--compress", "zstd"]) == 0
    report = capsys.readouterr().out
    assert "2 files, one per PP stage" in report and "SEND->RECV arrows join two stages' files" in report
    assert sorted(os.listdir(tmp_path / "one")) == ["pp_stage0.json.zst", "pp_stage1.json.zst"]
    assert cli.main(["merge", str(directory), "--ranks", "0-7", "--per-stage", "-o", str(tmp_path / "gz"), "-q",
                     "-j", "1"]) == 0
    for stage in (0, 1):
        assert digest(tmp_path / "gz" / f"pp_stage{stage}.json.gz") == digest(tmp_path / "pool" / f"pp_stage{stage}.json.gz")


def test_input_without_stages_is_refused_in_one_line(tmp_path, capsys):
    write_traces(SynthConfig(ranks=2, pp_stages=1, **SMALL), tmp_path / "dp", compress="none", merged=False)
    assert cli.main(["merge", str(tmp_path / "dp"), "--per-stage", "-o", str(tmp_path / "out")]) == 1
    error = capsys.readouterr().err.strip().splitlines()
    assert len(error) == 1 and "the 2 ranks have no pipeline stages" in error[0], error
    assert not (tmp_path / "out").exists()


def test_ranks_without_a_pp_group_are_refused_naming_them(tmp_path):
    write_traces(SynthConfig(ranks=4, pp_stages=2, **SMALL), tmp_path / "run", compress="none", merged=False)
    for rank in (1, 3):  # their headers lose the PP group
        path = tmp_path / "run" / f"rank{rank}_trace.json"
        path.write_bytes(path.read_bytes().replace(b'"torchtitan_real_pp"', b'"other"').replace(b'"mesh_pp"', b'"x"'))
    with pytest.raises(TraceError, match=r"2 of the 4 ranks have none \(global ranks 1, 3\)"):
        merge(tmp_path / "run", tmp_path / "out", per_stage=True)
    assert not (tmp_path / "out").exists()


def test_destinations_are_checked_before_reading(run, tmp_path, monkeypatch):
    directory, _ = run
    monkeypatch.setattr(merge_module, "index_rank", lambda *call: pytest.fail("read before the output was checked"))
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "pp_stage2.json.gz").write_bytes(b"kept")
    with pytest.raises(TraceError, match="already holds pp_stage2.json.gz"):
        merge(directory, tmp_path / "full", per_stage=True)
    with pytest.raises(TraceError, match="named like a file"):
        merge(directory, tmp_path / "stages.json.gz", per_stage=True)
    with pytest.raises(TraceError, match="give their directory with -o DIR/"):
        merge(directory, per_stage=True)
    assert (tmp_path / "full" / "pp_stage2.json.gz").read_bytes() == b"kept"


@pytest.mark.slow
def test_stage_files_appear_all_or_none(tmp_path, monkeypatch):
    """A stage's name taken while the run writes: the run fails, none of its files appears, the other's stays."""
    write_traces(SynthConfig(ranks=4, pp_stages=2, **SMALL), tmp_path / "run", compress="none", merged=False)
    out = tmp_path / "out"
    write_stage = merge_module._write_stage

    def racing(job):
        (out / "pp_stage1.json.gz").write_bytes(b"theirs")
        return write_stage(job)

    monkeypatch.setattr(merge_module, "_write_stage", racing)
    with pytest.raises(TraceError, match="pp_stage1.json.gz.*appeared while this run was writing it"):
        merge(tmp_path / "run", out, per_stage=True, jobs=1)
    assert sorted(os.listdir(out)) == ["pp_stage1.json.gz"] and (out / "pp_stage1.json.gz").read_bytes() == b"theirs"


def failing_stage_one(job):
    """A stage task (module level: the pool's tasks go by name) that fails for stage 1."""
    if job.path.endswith("pp_stage1.json.gz"):
        raise TraceError("stage 1 failed", path=job.path)
    return WRITE_STAGE(job)


def test_a_stage_failing_leaves_nothing(tmp_path, monkeypatch):
    """One stage's task fails in a worker: no stage file, not the directory the run made, no spool left."""
    write_traces(SynthConfig(ranks=4, pp_stages=2, **SMALL), tmp_path / "run", compress="none", merged=False)
    monkeypatch.setattr(merge_module, "_write_stage", failing_stage_one)
    spool = tmp_path / "spool"
    spool.mkdir()
    with pytest.raises(TraceError, match="stage 1 failed"):
        merge(tmp_path / "run", tmp_path / "new" / "stages", per_stage=True, jobs=2, spool_dir=str(spool))
    assert not (tmp_path / "new").exists() and os.listdir(spool) == []
