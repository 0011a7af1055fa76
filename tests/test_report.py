"""analyze --html: the page opened in a real headless Chromium.

Each page is checked for console errors and requests to any host, for every
figure drawn, and for each figure's data (read back from plotly in the page)
against the analyze tables of the same input, computed here from the rows
(not by the report code).  The utilization table is checked against an
independent figure: its busy time summed over bins is the rank's GPU busy
time of gpu_time.
"""
from __future__ import annotations

import math
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import ROOT, TRACES

import streamtrace
from streamtrace.synth import SynthConfig, write_traces

pytestmark = pytest.mark.slow  # a browser: CI runs it, the quick loop does not

report_screenshots = pytest.importorskip("report_screenshots")
pytest.importorskip("plotly")
pytest.importorskip("playwright")

if not os.access(report_screenshots.CHROMIUM, os.X_OK):
    if os.environ.get("CI") == "true":
        raise RuntimeError(f"{report_screenshots.CHROMIUM} is missing: .ci/run installs Debian's chromium")
    pytest.skip(f"no Chromium at {report_screenshots.CHROMIUM} (apt-get install chromium)", allow_module_level=True)

DLRM = TRACES / "dlrm_8ranks"
SLOW_RANK = 37
TOLERANCE = dict(rel=1e-6, abs=1e-6)  # the heat maps carry float32 fractions; everything else float64


@pytest.fixture(scope="module")
def chromium():
    with report_screenshots.browser() as launched:
        yield launched


@pytest.fixture(scope="module")
def pp_run(tmp_path_factory) -> Path:
    """64 ranks, 4 PP stages, rank 37 running 1.6 times slower; and the merged file."""
    directory = tmp_path_factory.mktemp("pp64")
    config = SynthConfig(ranks=64, pp_stages=4, microbatches=2, steps=4, graph_kernels=4, eager_kernels=3,
                         python_noise=0, graph_streams=2, big_ints=False, slow_rank=SLOW_RANK, slow_factor=1.6)
    write_traces(config, directory, compress="none")
    return directory


def rank_order(summary: dict) -> list[int]:
    stage = {row["rank"]: row["pp_stage"] for row in summary["rank_info"]}
    ranks = summary["ranks"]
    return sorted(ranks, key=lambda rank: (stage[rank] is None, stage[rank] or 0, rank))


def per_rank(rows: list[dict], order: list[int], key: str, scale: float = 1e-3) -> list[float]:
    totals: dict[int, float] = {}
    for row in rows:
        totals[row["rank"]] = totals.get(row["rank"], 0.0) + row[key] * scale
    return [totals.get(rank, math.nan) for rank in order]


def same(got: list, expected: list) -> bool:
    """Equal within float32 precision, NaN (or None: a gap) where expected is NaN."""
    if len(got) != len(expected):
        return False
    for a, b in zip(got, expected):
        if isinstance(b, float) and math.isnan(b):
            if not (a is None or (isinstance(a, float) and math.isnan(a))):
                return False
        elif a is None or a != pytest.approx(b, **TOLERANCE):
            return False
    return True


def check_page(found: dict, summary: dict) -> None:
    """The page against the summary's tables."""
    assert found["errors"] == []
    assert found["requests"] == []
    tables = summary["tables"]
    order = rank_order(summary)
    figures = found["figures"]
    for key, figure in figures.items():
        assert figure["svgs"] >= 1, key
        assert figure["bars"] + figure["images"] >= 1, f"{key}: nothing drawn"

    breakdown = {trace["name"]: trace["y"] for trace in figures["breakdown"]["traces"]}
    for kind, column in (("computation", "compute_time(us)"), ("communication", "communication(us)"),
                         ("memory", "memory(us)"), ("idle", "idle_time(us)")):
        assert same(breakdown[kind], per_rank(tables["gpu_time"], order, column))
    assert figures["breakdown"]["traces"][0]["x"] == [label for label in figures["overlap"]["traces"][0]["x"]]
    assert [int(label.split()[0]) for label in figures["breakdown"]["traces"][0]["x"]] == order

    assert same(figures["overlap"]["traces"][0]["y"], per_rank(tables["gpu_time"], order, "comp_comm_overlap_pctg", 1.0))
    idle = {trace["name"]: trace for trace in figures["idle"]["traces"]}  # one bar per (rank, stream): never summed
    streams = sorted(dict.fromkeys((row["rank"], row["stream"]) for row in tables["idle_time_breakdown"]),
                     key=lambda key: order.index(key[0]))[:256]  # the first 256 streams, in the table's order per rank
    for kind in ("host_wait", "kernel_wait", "other"):
        shown = dict(zip(idle[kind.replace("_", " ")]["x"], idle[kind.replace("_", " ")]["y"]))
        assert len(shown) == len(streams)
        for row in tables["idle_time_breakdown"]:
            if row["idle_category"] == kind and (row["rank"], row["stream"]) in streams:
                (label,) = [label for label in shown if label.split()[0] == str(row["rank"])
                            and label.endswith(f"stream {row['stream']}")]
                assert shown[label] == pytest.approx(row["idle_time"] * 1e-3, **TOLERANCE)

    totals = {row["name"]: row["sum (us)"] for row in tables["kernel_totals"] if row["kernel_type"] != "OTHER"}
    top = sorted(totals, key=lambda name: -totals[name])[:20]
    shown = {name: x for trace in figures["kernels"]["traces"] for name, x in zip(trace["customdata"], trace["x"])}
    assert set(shown) == set(top)
    assert all(shown[name] == pytest.approx(totals[name] / 1e3, **TOLERANCE) for name in top)

    utilization = figures["utilization"]["traces"][0]["z"]
    bins = 1 + max(row["bin"] for row in tables["utilization"])
    expected = [[math.nan] * bins for _ in order]
    for row in tables["utilization"]:
        expected[order.index(row["rank"])][row["bin"]] = row["busy_fraction"]
    assert len(utilization) == len(order)
    assert all(same(got, want) for got, want in zip(utilization, expected))

    if tables["profiler_steps"]:
        steps = [row["step"] for row in tables["profiler_steps"]]
        longest: dict[tuple[int, int], dict] = {}
        for row in tables["step_times"]:
            key = (row["rank"], row["step"])
            if key not in longest or row["duration(us)"] > longest[key]["duration(us)"]:
                longest[key] = row
        for figure, column in (("step-duration", "duration(us)"), ("step-idle", "idle(us)")):
            z = figures[figure]["traces"][0]["z"]
            want = [[longest[(rank, step)][column] / 1e3 if (rank, step) in longest else math.nan for step in steps]
                    for rank in order]
            assert all(same(got, row) for got, row in zip(z, want)), figure


def check_utilization_table(summary: dict) -> None:
    """Bins contiguous, at most 200; per rank the busy time sums to its busy time (gpu_time)."""
    rows = summary["tables"]["utilization"]
    first = [row for row in rows if row["rank"] == rows[0]["rank"]]
    assert 100 <= len(first) <= 200
    assert all(a["end(us)"] == b["start(us)"] for a, b in zip(first, first[1:]))
    for exact in summary["tables"]["gpu_time"]:
        busy = sum(row["gpu_busy(us)"] for row in rows if row["rank"] == exact["rank"])
        assert busy == pytest.approx(exact["busy(us)"], abs=0.01 * len(first))
        assert all(0 <= row["busy_fraction"] <= 1 for row in rows)


def test_dlrm_page_matches_the_tables_and_screenshots(chromium, tmp_path):
    page = tmp_path / "report.html"
    summary = report_screenshots.build_dlrm_page(DLRM, page)
    shots = {"page": tmp_path / "page.png", "#fig-utilization": tmp_path / "utilization.png"}
    found = report_screenshots.open_report(chromium, page, shots)
    check_page(found, summary)
    check_utilization_table(summary)
    assert found["facts"]["ranks"] == "8 (0-7)"
    assert found["facts"]["devices"] == "Tesla V100-SXM2-32GB"
    assert found["facts"]["made by"] == f"streamtrace analyze dlrm_8ranks/ --html {page.name}"
    assert "ranks 2, 7" in found["texts"]["callout-step-duration"]  # HTA's candidates, as the table has them
    assert found["texts"]["lead-collectives"].startswith("Rank 7 arrives last at 5 of 8 matched collectives")
    assert list(found["figures"])[0] == "collective-waits" and found["tables"]["table-collective-why"][1][0] == "7"
    for shot in shots.values():
        assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and shot.stat().st_size > 5_000


def test_pp_run_with_a_slow_rank_names_it(chromium, pp_run, tmp_path):
    page = tmp_path / "pp.html"
    files = sorted(pp_run.glob("rank*_trace.json"))
    summary = streamtrace.analyze(files, html=str(page), jobs=2)
    found = report_screenshots.open_report(chromium, page)
    check_page(found, summary)
    check_utilization_table(summary)
    callout = found["texts"]["callout-step-duration"]
    assert callout.startswith("Which rank arrives last cannot be told here")  # (no ncclKernel... kernels)
    assert f"Longest mean step time (a waiting rank's steps are long too): rank {SLOW_RANK} (" in callout
    assert "Longest steps: step" in callout and f"on rank {SLOW_RANK} (" in callout.split("Longest steps:")[1][:40]
    labels = found["figures"]["step-duration"]["traces"][0]["y"]
    assert labels[:2] == ["0 · PP0", "1 · PP0"] and labels[-1] == "63 · PP3"  # grouped by stage (rank // 16)
    durations = found["figures"]["step-duration"]["traces"][0]["z"]
    slowest_row = max(range(len(labels)), key=lambda at: sum(durations[at]))
    assert labels[slowest_row] == f"{SLOW_RANK} · PP{SLOW_RANK // 16}"


def test_merged_file_page_equals_its_tables(chromium, pp_run, tmp_path):
    page = tmp_path / "merged.html"
    summary = streamtrace.analyze(pp_run / "merged_trace.json", html=str(page))
    assert summary["ranks"] == list(range(64))
    found = report_screenshots.open_report(chromium, page)
    check_page(found, summary)
    assert found["figures"]["utilization"]["traces"][0]["y"][:3] == ["0", "1", "2"]  # no stages stated: by rank


def test_single_rank_without_steps_says_what_needs_steps(chromium, tmp_path):
    page = tmp_path / "eager.html"
    summary = streamtrace.analyze(TRACES / "b200_eager.json.gz", html=str(page))
    assert summary["tables"]["profiler_steps"] == []
    found = report_screenshots.open_report(chromium, page)
    check_page(found, summary)
    assert set(found["figures"]) == {"breakdown", "utilization", "kernels", "overlap", "idle"}
    for key in ("step-duration", "step-idle"):
        assert "no profiler steps" in found["texts"][f"missing-{key}"]
    assert found["facts"]["steps"] == "no profiler steps"


def test_cli_html_refusals(tmp_path, pp_run):
    files = [str(path) for path in sorted(pp_run.glob("rank*_trace.json"))[:2]]
    page = tmp_path / "report.html"
    page.write_text("mine")
    run = [sys.executable, "-m", "streamtrace", "analyze", *files, "--html"]
    done = subprocess.run([*run, str(page)], capture_output=True, text=True)
    assert done.returncode == 1 and "exists; pass --overwrite" in done.stderr and page.read_text() == "mine"
    done = subprocess.run([*run, files[0]], capture_output=True, text=True)
    assert done.returncode == 1 and len(done.stderr.splitlines()) == 1
    done = subprocess.run([*run, str(page), "--overwrite"], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert page.read_bytes().startswith(b"<!DOCTYPE html>")
    assert list(tmp_path.iterdir()) == [page]  # no temporary file left beside it


def test_without_plotly_html_names_the_extra(tmp_path, pp_run):
    """The extra missing: one line naming it, before any work (a path hiding plotly)."""
    hide = tmp_path / "hide"
    (hide / "plotly").mkdir(parents=True)
    (hide / "plotly" / "__init__.py").write_text("raise ImportError('hidden for the test')\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(hide), str(ROOT)])}
    done = subprocess.run([sys.executable, "-m", "streamtrace", "analyze", str(pp_run / "rank0_trace.json"),
                           "--html", str(tmp_path / "r.html")], capture_output=True, text=True, env=env)
    assert done.returncode == 1
    assert done.stderr.strip().splitlines() == ["streamtrace: error: --html needs plotly (the report extra): "
                                                "pip install 'streamtrace[report]'"]
    assert not (tmp_path / "r.html").exists()


MANY = 1024


def test_1024_ranks_page_is_small_and_opens_quickly(chromium, tmp_path):
    traces = tmp_path / "many"
    config = SynthConfig(ranks=MANY, pp_stages=1, microbatches=1, steps=3, graph_kernels=0, eager_kernels=2,
                         python_noise=0, graph_streams=1, big_ints=False)
    write_traces(config, traces, compress="none", merged=False)
    page = tmp_path / "many.html"
    summary = streamtrace.analyze(traces, html=str(page), jobs=2)
    shutil.rmtree(traces)
    assert page.stat().st_size <= 15_000_000
    found = report_screenshots.open_report(chromium, page)
    assert found["seconds"] < 10
    check_page(found, summary)
    assert len(found["figures"]["utilization"]["traces"][0]["z"]) == MANY
