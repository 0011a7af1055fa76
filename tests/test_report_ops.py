"""analyze --html --ops: the page's ops section opened in headless Chromium,
its figures' numbers read back from plotly and checked against the ops CSVs
of the same run (computed here from the CSV cells, not by the report code)."""
from __future__ import annotations

import csv
import html
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import TRACES

pytestmark = pytest.mark.slow  # a browser: CI runs it, the quick loop does not

report_screenshots = pytest.importorskip("report_screenshots")
pytest.importorskip("plotly")
pytest.importorskip("playwright")
if not os.access(report_screenshots.CHROMIUM, os.X_OK):
    pytest.skip(f"no Chromium at {report_screenshots.CHROMIUM}", allow_module_level=True)

TOLERANCE = dict(rel=1e-9)


@pytest.fixture(scope="module")
def chromium():
    with report_screenshots.browser() as launched:
        yield launched


def _page(trace: str, tmp_path: Path) -> tuple[Path, Path]:
    out, page = tmp_path / "out", tmp_path / "page.html"
    run = subprocess.run([sys.executable, "-m", "streamtrace", "analyze", str(TRACES / trace), "-o", str(out), "--ops",
                          "--html", str(page), "-q"], capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    return out / "ops" / "rank0", page


def _rows(path: Path) -> list[dict]:
    with open(path, newline="") as handle:
        return list(csv.DictReader(handle))


def _captions(page: Path) -> dict[str, str]:
    text = page.read_text()
    return {html.unescape(title): html.unescape(caption)
            for title, caption in re.findall(r"<h2>(.*?)</h2><p class=\"caption\">(.*?)</p>", text)}


def test_ops_section_matches_the_csvs(chromium, tmp_path) -> None:
    """b200 (built-in B200 spec): top ops as ops_summary, one point per sheet row, the B200's roofs."""
    tables, page = _page("b200_eager.json.gz", tmp_path)
    found = report_screenshots.open_report(chromium, page)
    assert found["errors"] == [] and found["requests"] == []

    summary = _rows(tables / "ops_summary.csv")[:15]
    (bars,) = found["figures"]["ops-top-0"]["traces"]
    assert [name for name, _ in bars["customdata"]] == [row["name"] for row in summary]
    assert bars["x"] == pytest.approx([float(row["total_direct_kernel_time_ms"]) for row in summary], **TOLERANCE)
    assert [share for _, share in bars["customdata"]] == pytest.approx([float(row["Percentage (%)"]) for row in summary],
                                                                       **TOLERANCE)

    expected = []
    for sheet in sorted(tables.glob("*.csv")):
        for row in _rows(sheet):
            if "% of roofline" not in row:
                break
            intensity, gflops, mean = (float(row[c] or "nan") for c in ("FLOPS/Byte_first", "GFLOPS_first",
                                                                         "Kernel Time (µs)_mean"))
            if intensity > 0 and gflops > 0 and mean > 0:  # (NaN compares false: no point)
                expected.append((row["Compute Spec"] or "(no compute spec)", intensity, gflops * 1e9 / (mean * 1e-6) / 1e12))
    traces = found["figures"]["ops-roofline-0"]["traces"]
    points = sorted((trace["name"], x, y) for trace in traces if "peak" not in trace["name"]
                    and not trace["name"].startswith("memory") for x, y in zip(trace["x"], trace["y"]))
    expected.sort()
    assert len(points) == len(expected) >= 10
    for got, want in zip(points, expected):
        assert got[0] == want[0] and got[1:] == pytest.approx(want[1:], **TOLERANCE)

    roofs = {trace["name"]: trace for trace in traces if "peak" in trace["name"] or trace["name"].startswith("memory")}
    memory = roofs["memory 8000 GB/s"]
    assert [y / x for x, y in zip(memory["x"], memory["y"])] == pytest.approx([8.0, 8.0])  # TB/s: FLOP/s per FLOP/byte
    peak = roofs["matrix_bf16 peak 2250 TFLOP/s"]
    assert peak["y"] == [2250, 2250] and peak["x"][0] == pytest.approx(2250 / 8)
    assert memory["x"][1] == pytest.approx(peak["x"][0])  # the slope meets the highest roof at its ridge

    captions = _captions(page)
    assert "ops_summary" in captions["Which ops take the GPU time: rank0"]
    roof_caption = captions["How far from the hardware: rank0"]
    assert "arithmetic intensity" in roof_caption and "NVIDIA B200 (HGX)" in roof_caption


def test_unknown_gpu_page_says_there_is_no_roofline(chromium, tmp_path) -> None:
    _, page = _page("mi250_minitoy.json.gz", tmp_path)
    found = report_screenshots.open_report(chromium, page)
    assert found["errors"] == []
    assert "ops-top-0" in found["figures"] and "ops-roofline-0" not in found["figures"]
    missing = found["texts"]["missing-ops-roofline-0"]
    assert "no GPU spec" in missing and "AMD Radeon Graphics" in missing and "--gpu-spec" in missing
