"""diff --html: the page opened in a real headless Chromium.

Each page is checked for console errors and requests to any host, for
every figure drawn, and for each figure's data (read back from plotly in
the page) against the CSV files the same run wrote, read here with the
csv module: the step-time shift against step_time_per_rank.csv, both runs'
bars against temporal_breakdown.csv, the top changes against trace_diff.csv
and the kernels that moved against kernel_breakdown.csv summed here.
"""
from __future__ import annotations

import csv
import math
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import TRACES
from test_report import report_screenshots  # (skips where test_report skips: no plotly, Playwright or Chromium)

import streamtrace
from streamtrace.errors import TraceError
from streamtrace.synth import SynthConfig, write_traces

pytestmark = pytest.mark.slow  # a browser: CI runs it, the quick loop does not

SLOW_RANK = 2
TOLERANCE = dict(rel=1e-9, abs=1e-9)
DLRM = TRACES / "dlrm_8ranks"


@pytest.fixture(scope="module")
def chromium():
    with report_screenshots.browser() as launched:
        yield launched


@pytest.fixture(scope="module")
def slow_pair(tmp_path_factory) -> tuple[Path, Path]:
    """Two 4-rank runs of the same seed; in the test run rank 2 is 1.5 times slower."""
    root = tmp_path_factory.mktemp("pair")
    for name, slow in (("control", -1), ("test", SLOW_RANK)):
        config = SynthConfig(ranks=4, pp_stages=2, microbatches=2, steps=3, graph_kernels=4, eager_kernels=3,
                             python_noise=0, big_ints=False, slow_rank=slow, slow_factor=1.5)
        write_traces(config, root / name, compress="none", merged=False)
    return root / "control", root / "test"


def read_csv(path: Path) -> list[dict]:
    with open(path, newline="") as file:
        return list(csv.DictReader(file))


def number(text: str) -> float:
    return math.nan if text == "" else float(text)


def same(got: list, expected: list) -> bool:
    """Equal, a gap (None or NaN) where expected is NaN."""
    if len(got) != len(expected):
        return False
    for a, b in zip(got, expected):
        if math.isnan(b):
            if not (a is None or (isinstance(a, float) and math.isnan(a))):
                return False
        elif a is None or a != pytest.approx(b, **TOLERANCE):
            return False
    return True


def moved_most(changes: dict[str, float], count: int = 20) -> list[str]:
    return sorted((name for name, value in changes.items() if value), key=lambda name: -abs(changes[name]))[:count]


def check_page(found: dict, out: Path) -> None:
    """The page against the CSV files of the same run."""
    assert found["errors"] == [] and found["requests"] == []
    figures = found["figures"]
    for key, figure in figures.items():
        assert figure["svgs"] >= 1 and figure["bars"] >= 1, key

    steps = read_csv(out / "step_time_per_rank.csv")
    (shift,) = figures["step-shift"]["traces"]
    assert shift["x"] == [row["rank"] for row in steps]
    assert same(shift["y"], [number(row["mean_step(us)__diff"]) / 1e3 if row["present"] == "both" else math.nan
                             for row in steps])

    temporal = sorted(read_csv(out / "temporal_breakdown.csv"), key=lambda row: int(row["rank"]))
    bars = {trace["name"]: trace for trace in figures["ranks"]["traces"]}
    for column, name in (("compute_time(us)", "computation"), ("non_compute_time(us)", "communication and memory"),
                         ("idle_time(us)", "idle")):
        assert bars[name]["x"] == [[row["rank"] for row in temporal for _ in (1, 2)], ["Control", "Test"] * len(temporal)]
        assert same(bars[name]["y"], [number(row[f"{column}__{run}"]) / 1e3 for row in temporal
                                      for run in ("Control", "Test")])

    if "top-changes" in figures:
        durations = {row["name"]: float(row["diff_duration"]) for row in read_csv(out / "trace_diff.csv")}
        (top,) = figures["top-changes"]["traces"]
        shown = {data[0]: x for data, x in zip(top["customdata"], top["x"])}
        assert list(shown) == moved_most(durations)
        assert all(shown[name] == pytest.approx(durations[name] / 1e3, **TOLERANCE) for name in shown)

    if "kernel-changes" in figures:
        kernels: dict[str, float] = {}
        for row in read_csv(out / "kernel_breakdown.csv"):
            moved = (number(row["sum (us)__Test"]) if row["sum (us)__Test"] else 0.0) - \
                    (number(row["sum (us)__Control"]) if row["sum (us)__Control"] else 0.0)
            kernels[row["name"]] = kernels.get(row["name"], 0.0) + moved
        (top,) = figures["kernel-changes"]["traces"]
        shown = {data[0]: x for data, x in zip(top["customdata"], top["x"])}
        assert list(shown) == moved_most(kernels)
        assert all(shown[name] == pytest.approx(kernels[name] / 1e3, rel=1e-6) for name in shown)


def test_a_slower_rank_page_matches_the_csv_files(chromium, slow_pair, tmp_path):
    page, out = tmp_path / "diff.html", tmp_path / "out"
    command = f"streamtrace diff control test --control-rank {SLOW_RANK} --test-rank {SLOW_RANK} --html diff.html"
    summary = streamtrace.diff(*slow_pair, out, control_rank=SLOW_RANK, test_rank=SLOW_RANK, html=page,
                               command=command)
    assert summary["output"][-1] == str(page) and "step_time_per_rank" in summary["tables"]
    found = report_screenshots.open_report(chromium, page, {"page": tmp_path / "page.png"})
    check_page(found, out)
    assert set(found["figures"]) == {"step-shift", "ranks", "top-changes", "kernel-changes"}
    assert found["texts"]["callout-step-shift"].startswith(f"Moved most: rank {SLOW_RANK} +")
    shift = found["figures"]["step-shift"]["traces"][0]["y"]
    assert max(range(4), key=lambda at: shift[at]) == SLOW_RANK and shift[SLOW_RANK] > 0
    assert found["facts"]["made by"] == command
    collectives = found["texts"]["callout-kernel-changes"]
    assert collectives.startswith("Collectives that moved most") and "ncclDevKernel" in collectives
    assert found["facts"]["control"].endswith(f"rank {SLOW_RANK} of 4 · iteration {summary['control']['iteration']}")
    assert (tmp_path / "page.png").stat().st_size > 5_000


def test_a_merged_file_against_its_rank_files_shows_no_change(chromium, tmp_path):
    merged, page, out = tmp_path / "merged.json", tmp_path / "same.html", tmp_path / "out"
    streamtrace.merge(DLRM, str(merged))
    streamtrace.diff(merged, DLRM, out, html=page)
    found = report_screenshots.open_report(chromium, page)
    check_page(found, out)
    assert set(found["figures"]) == {"step-shift", "ranks"}
    assert found["texts"] == {"missing-top-changes": "no operator or kernel duration moved.",
                              "missing-kernel-changes": "no kernel's GPU time moved."}
    assert found["figures"]["step-shift"]["traces"][0]["y"] == [0] * 8


def test_runs_of_other_rank_counts_show_what_they_share(chromium, tmp_path):
    for name, ranks in (("two", 2), ("four", 4)):
        write_traces(SynthConfig(ranks=ranks, pp_stages=1, steps=2, graph_kernels=3, eager_kernels=2, seed=ranks),
                     tmp_path / name, compress="none", merged=False)
    page, out = tmp_path / "ranks.html", tmp_path / "out"
    streamtrace.diff(tmp_path / "two", tmp_path / "four", out, html=page)
    found = report_screenshots.open_report(chromium, page)
    check_page(found, out)
    assert found["texts"]["callout-step-shift"].endswith("Ranks 2, 3 only in the test run.")
    assert found["facts"]["note"] == "ranks 2, 3 only in the test run"
    bars = found["figures"]["ranks"]["traces"][0]["y"]
    assert math.isnan(bars[4]) and bars[5] > 0  # rank 2: no control bar, a test bar


def test_cli_html_refusals(slow_pair, tmp_path):
    page = tmp_path / "diff.html"
    page.write_text("mine")
    run = [sys.executable, "-m", "streamtrace", "diff", *map(str, slow_pair), "--html", str(page)]
    done = subprocess.run(run, capture_output=True, text=True)
    assert done.returncode == 1 and "exists; pass --overwrite" in done.stderr and page.read_text() == "mine"
    assert len(done.stderr.splitlines()) == 1
    done = subprocess.run([*run, "--overwrite", "-q"], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert page.read_bytes().startswith(b"<!DOCTYPE html>") and "step time" in done.stdout
    assert list(tmp_path.iterdir()) == [page]  # no temporary file left beside it


def test_without_plotly_html_names_the_extra_before_reading(tmp_path, slow_pair, monkeypatch):
    monkeypatch.setitem(sys.modules, "plotly", None)  # (import plotly then fails)
    with pytest.raises(TraceError, match=r"--html needs plotly \(the report extra\)"):
        streamtrace.diff(*slow_pair, tmp_path / "out", html=tmp_path / "d.html", test_iteration=99)
    assert list(tmp_path.iterdir()) == []  # (refused before the missing iteration is found)
