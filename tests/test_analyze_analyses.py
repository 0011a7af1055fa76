"""``analyze``'s analyses: the registry, ``--only``/``--skip``, and the worked example of CONTRIBUTING.md.

A selection gives exactly its tables, each equal to the one a full run gives;
a skipped analysis costs nothing (its join, or the time sweep, does not run);
an analysis written outside the package (CONTRIBUTING.md's ``kernel_count``)
runs through ``analyze`` and matches plain code over ``json.load``.
"""
from __future__ import annotations

import csv
import dataclasses
import re
from pathlib import Path

import pytest
from conftest import TRACES, events_of, load_json

import streamtrace
from streamtrace.cli import analyze as analyze_cli
from streamtrace.cli import main
from streamtrace.commands.analyses import buckets, launches, registry
from streamtrace.commands.analyze import TABLES
from streamtrace.errors import TraceError

DLRM = TRACES / "dlrm_8ranks"
ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def full() -> dict:
    return streamtrace.analyze(DLRM, jobs=1)["tables"]


@pytest.mark.parametrize("only", ["steps", "stragglers", "kernels,idle", "temporal", "utilization", "launches"])
def test_only_gives_its_tables_as_a_full_run_does(only, full, tmp_path):
    summary = streamtrace.analyze(DLRM, str(tmp_path / "out"), jobs=1, only=only)
    expected = [table for table in TABLES
                if any(table in registry.ANALYSES[name].tables for name in only.split(","))]
    assert list(summary["tables"]) == [t for t in expected if t != "kernel_launch_stats"] + \
        (["kernel_launch_stats"] if "kernel_launch_stats" in expected else [])
    assert sorted(path.name for path in (tmp_path / "out").iterdir()) == sorted(f"{table}.csv" for table in expected)
    for table, rows in summary["tables"].items():
        assert rows == full[table], table


def test_skip_leaves_out_its_tables_and_its_join(full, monkeypatch):
    def no_join(*args, **kwargs):
        raise AssertionError("the launch join ran for a skipped analysis")

    monkeypatch.setattr(launches, "_launch_stats", no_join)
    summary = streamtrace.analyze(DLRM, jobs=1, skip=["launches"])
    assert "kernel_launch_stats" not in summary["tables"] and summary["kernel_launch_rows"] == 0
    assert summary["tables"] == {table: rows for table, rows in full.items() if table != "kernel_launch_stats"}


def test_analyses_that_read_no_sweep_skip_it(full, monkeypatch):
    def no_buckets(*args, **kwargs):
        raise AssertionError("the time buckets were written though no analysis asked for the sweep")

    monkeypatch.setattr(buckets.Buckets, "add", no_buckets)
    summary = streamtrace.analyze(DLRM, jobs=1, only="kernels,launches")
    assert summary["tables"]["kernel_totals"] == full["kernel_totals"]
    assert summary["tables"]["kernel_launch_stats"] == full["kernel_launch_stats"]


def test_unknown_names_are_refused_in_one_line_listing_the_known(capsys, tmp_path):
    with pytest.raises(TraceError, match="no analysis named 'bogus'; the analyses are temporal, kernels, idle"):
        streamtrace.analyze(DLRM, only="steps,bogus")
    code = main(["analyze", str(DLRM), "--skip", "stepz", "-o", str(tmp_path / "out")])
    err = capsys.readouterr().err.strip()
    assert code == 1 and "\n" not in err and "--skip: no analysis named 'stepz'" in err
    assert ", ".join(registry.ANALYSES) in err
    assert not (tmp_path / "out").exists()
    with pytest.raises(TraceError, match="leave no analysis"):
        streamtrace.analyze(DLRM, only="steps", skip="steps")


def test_the_page_needs_the_analyses_it_draws(tmp_path):
    with pytest.raises(TraceError, match="--html draws the tables of .* utilization is left out"):
        streamtrace.analyze(DLRM, html=str(tmp_path / "page.html"), skip="utilization")
    assert not list(tmp_path.iterdir())


def test_the_command_line_names_every_analysis():
    assert analyze_cli.ANALYSIS_NAMES == (*registry.ANALYSES, *registry.REPORTS)


def _worked_example() -> dict:
    """The python block of CONTRIBUTING.md's "Adding an analysis", run as a module."""
    text = (ROOT / "CONTRIBUTING.md").read_text(encoding="utf-8")
    section = text.split("## Adding an analysis", 1)[1].split("\n## ", 1)[0]
    (code,) = re.findall(r"```python\n(.*?)```", section, flags=re.S)
    namespace: dict = {"__name__": "kernel_count"}
    exec(compile(code, "CONTRIBUTING.md", "exec"), namespace)
    return namespace


def test_the_worked_example_runs_through_analyze(tmp_path, monkeypatch):
    example = _worked_example()["ANALYSIS"]
    monkeypatch.setitem(registry.ANALYSES, "kernel_count", example)
    files = sorted(DLRM.iterdir())
    expected = []
    for path in files:
        document = load_json(path)
        kernels = sum(1 for event in events_of(document)
                      if event.get("cat") == "kernel" and "dur" in event and "ts" in event)
        expected.append({"rank": document["distributedInfo"]["rank"], "kernels": kernels})
    expected.sort(key=lambda row: row["rank"])
    assert len(expected) == 8 and all(row["kernels"] > 100 for row in expected)
    summary = streamtrace.analyze(files, str(tmp_path / "out"), jobs=1, only="kernel_count")
    assert summary["tables"] == {"kernel_count": expected}
    with open(tmp_path / "out" / "kernel_count.csv", newline="") as handle:
        assert [{k: int(v) for k, v in row.items()} for row in csv.DictReader(handle)] == expected
    everything = streamtrace.analyze(files, jobs=1)
    assert "kernel_count" in everything["tables"]  # a registered analysis runs by default too


def test_a_declaration_naming_what_the_sweep_does_not_feed_is_refused():
    example = _worked_example()["ANALYSIS"]
    with pytest.raises(ValueError, match="kernel_count: the sweep feeds .* not stream_gaps"):
        dataclasses.replace(example, sweeps=frozenset({"idle", "stream_gaps"}))


def test_the_collective_report_is_chosen_by_name_too(full, tmp_path):
    """TraceLens's collective report (its own tables beside the registry's) runs, or not, as --only/--skip say."""
    collective_tables = [table for table in full if table not in TABLES]
    assert "nccl_long" in collective_tables  # the DLRM ranks hold NCCL kernels
    alone = streamtrace.analyze(DLRM, str(tmp_path / "alone"), jobs=1, only="collectives")
    assert list(alone["tables"]) == collective_tables
    assert sorted(path.name for path in (tmp_path / "alone").iterdir()) == sorted(f"{t}.csv" for t in collective_tables
                                                                                 if full[t] is not None)
    skipped = streamtrace.analyze(DLRM, jobs=1, skip="collectives")
    assert list(skipped["tables"]) == [table for table in full if table in TABLES]
