"""The ops sheets' roofline without flags: the built-in GPU spec picked from
the trace's deviceProperties, the roofline columns appended after
TraceLens's (checked by hand against the vendors' figures), --gpu-spec
overriding it, and the report saying which spec (or that the GPU is
unknown)."""
from __future__ import annotations

import csv
import gzip
import io
import json
import re
import subprocess
import sys

import pytest
from conftest import ROOT, TRACES, load_json
from tracelens_perf_reference import SPEC

from streamtrace.algo import gpuspecs, perfmodel

REFERENCE = ROOT / "tests" / "reference" / "tracelens_perf"
EXTRA = ["roofline time (us)", "roofline bound", "% of roofline"]


@pytest.mark.parametrize(("trace", "name"), [
    ("b200_eager.json.gz", "NVIDIA B200 (HGX)"),
    ("kineto_small.json", "NVIDIA H100 SXM5"),
    ("cupti_profiler.json.gz", "NVIDIA A100 40GB"),  # 'NVIDIA A100-PG509-200', 40 GiB
    ("nccl_rank0.json.gz", "NVIDIA A100 40GB"),
    ("dlrm_8ranks/worker0_step_12.1694128201545.pt.trace.json.gz", "NVIDIA V100 SXM2"),
    ("mi210_gpu_only.json.gz", "AMD Instinct MI210"),
    ("sglang_decode_qwen3.json.gz", "AMD Instinct MI300X"),
    ("vllm_decode_graph_replay_mi300.json.gz", "AMD Instinct MI300X"),  # no name: gfx942, 304 CUs, 192 GiB
    ("mi250_minitoy.json.gz", None),  # 'AMD Radeon Graphics' with 104 CUs: an MI210 or an MI250 GCD
    ("sampled_rank-0.json.gz", None),  # no deviceProperties
])
def test_spec_from_real_traces_device_properties(trace: str, name: str | None) -> None:
    found = gpuspecs.identify(load_json(TRACES / trace).get("deviceProperties"))
    assert (found.spec.name if found.spec else None) == name, found.how
    if trace.startswith("vllm"):
        assert "by its properties" in found.how and "304 CUs" in found.how
    if trace.startswith("kineto_small"):  # 95 GiB: not the 80 GB SXM5 whose bandwidth the entry gives
        assert "not the 80 GB" in found.how
    if name is None:
        assert ("104 CUs" in found.how and "MI210" in found.how) or "no deviceProperties" in found.how


def _device(name: str, sms: int | None = None, gib: float | None = None, **more: object) -> dict:
    entry: dict = {"id": 0, "name": name, **more}
    if sms is not None:
        entry["numSms"] = sms
    if gib is not None:
        entry["totalGlobalMem"] = int(gib * (1 << 30))
    return entry


@pytest.mark.parametrize(("devices", "name"), [
    ([_device("NVIDIA H100 80GB HBM3", 132, 79.1)], "NVIDIA H100 SXM5"),
    ([_device("NVIDIA H100 PCIe", 114, 79.6)], "NVIDIA H100 PCIe"),
    ([_device("NVIDIA H100 NVL", 132, 93.6)], "NVIDIA H100 NVL"),
    ([_device("NVIDIA H200", 132, 139.8)], "NVIDIA H200 SXM"),
    ([_device("NVIDIA H200 NVL", 132, 139.8)], "NVIDIA H200 NVL"),
    ([_device("NVIDIA A100-SXM4-80GB", 108, 79.2)], "NVIDIA A100 80GB SXM"),
    ([_device("NVIDIA A100 80GB PCIe", 108, 79.2)], "NVIDIA A100 80GB PCIe"),
    ([_device("NVIDIA A100-SXM4-40GB", 108, 39.4)], "NVIDIA A100 40GB"),
    ([_device("Tesla V100-PCIE-16GB", 80, 15.8)], "NVIDIA V100 PCIe"),
    ([_device("Tesla V100S-PCIE-32GB", 80, 31.7)], "NVIDIA V100S PCIe"),
    ([_device("AMD Instinct MI250X", 110, 64, gcnArchName="gfx90a:sramecc+:xnack-")], "AMD Instinct MI250X (one GCD)"),
    ([_device("AMD Instinct MI250X/MI250", 104, 64, gcnArchName="gfx90a:sramecc+:xnack-")],
     "AMD Instinct MI250 (one GCD)"),
    ([_device("", 110, 64, gcnArchName="gfx90a:sramecc+:xnack-")], "AMD Instinct MI250X (one GCD)"),
    ([_device("AMD Instinct MI300X VF", 304, 191.5)], "AMD Instinct MI300X"),
    ([_device("AMD Instinct MI325X", 304, 256)], "AMD Instinct MI325X"),
    ([_device("", 304, 256, warpSize=64, computeMajor=9, computeMinor=4)], "AMD Instinct MI325X"),
    ([_device("AMD Instinct MI355X", 256, 288)], "AMD Instinct MI355X"),
    ([_device("NVIDIA B200", 148, 178.4)] * 8, "NVIDIA B200 (HGX)"),
    ([_device("NVIDIA H100 80GB HBM3", 132, 79.1), _device("NVIDIA A100-SXM4-80GB", 108, 79.2)], None),
    ([_device("NVIDIA GeForce RTX 4090", 128, 23.6)], None),
    ([_device("", 228, 128, gcnArchName="gfx942")], None),  # an MI300A: not in the table
])
def test_spec_by_name_and_properties(devices: list[dict], name: str | None) -> None:
    found = gpuspecs.identify(devices)
    assert (found.spec.name if found.spec else None) == name, found.how
    if len(devices) > 1 and name is None:
        assert "different GPUs" in found.how


def test_every_entry_names_its_source_and_tracelens_keys() -> None:
    keys = {f"{kind}_{precision}" for kind in ("matrix", "vector")
            for precision in {*perfmodel.PRECISION.values(), "int8"}}
    for rule in gpuspecs.RULES:
        spec = rule.spec
        assert spec.document and all(url.startswith("https://") for url in spec.url.split(", ")), spec.name
        assert set(spec.peaks) <= keys, (spec.name, set(spec.peaks) - keys)
        assert spec.mem_bw_gbps > 0 and all(value > 0 for value in spec.peaks.values())
        assert spec.url in spec.arch()["source"]
    # the figures the roofline tests below use, as the datasheets state them
    assert gpuspecs.BY_NAME["AMD Instinct MI300X"].peaks["matrix_bf16"] == 1307.4
    assert gpuspecs.BY_NAME["NVIDIA H100 SXM5"].peaks["matrix_bf16"] == 1979 / 2  # stated with sparsity


def _csv(text: str) -> list[list[str]]:
    return list(csv.reader(io.StringIO(text)))


def _reference(case: str, stem: str) -> list[list[str]]:
    return _csv(gzip.decompress((REFERENCE / case / f"{stem}.csv.gz").read_bytes()).decode("utf-8"))


def _analyze(trace: str, out, *more: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "streamtrace", "analyze", str(TRACES / trace), "-o", str(out),
                           "--ops", "-q", *more], capture_output=True, text=True)


def _roofline_by_hand(row: dict, peak_tflops: float | None, bandwidth_gbps: float) -> list[str]:
    """The three extra cells, computed here from the row's own columns."""
    if peak_tflops is None or not row["Data Moved (MB)_first"] or float(row["GFLOPS_first"]) <= 0:
        return ["", "", ""]
    compute_us = float(row["GFLOPS_first"]) * 1e9 / (peak_tflops * 1e12) * 1e6
    memory_us = float(row["Data Moved (MB)_first"]) * 1024 * 1024 / (bandwidth_gbps * 1e9) * 1e6
    bound = max(compute_us, memory_us)
    return [bound, "COMPUTE_BOUND" if compute_us >= memory_us else "MEMORY_BOUND",
            bound / float(row["Kernel Time (µs)_mean"]) * 100]


def _check_sheet(got: list[list[str]], want: list[list[str]], peaks: dict, bandwidth: float) -> int:
    """TraceLens's columns exactly as its CSV, then the extra ones by hand; the rows with a roofline."""
    assert len(got) == len(want)
    width = len(want[0])
    assert got[0] == want[0] + EXTRA
    with_roofline = 0
    for row, expected in zip(got[1:], want[1:]):
        assert row[:width] == expected
        named = dict(zip(got[0], row))
        by_hand = _roofline_by_hand(named, peaks.get(named["Compute Spec"]), bandwidth)
        assert row[width + 1] == by_hand[1]
        for cell, value in (row[width], by_hand[0]), (row[width + 2], by_hand[2]):
            assert (cell == value == "") or float(cell) == pytest.approx(value, rel=1e-12)
        with_roofline += by_hand[1] != ""
    return with_roofline


def test_built_in_spec_adds_roofline_columns_after_tracelens_ones(tmp_path) -> None:
    """vllm on an MI300X (named by its properties): GEMM rows bf16 at 1307.4 TFLOP/s, 5300 GB/s."""
    run = _analyze("vllm_decode_graph_replay_mi300.json.gz", tmp_path / "out", "--json")
    assert run.returncode == 0, run.stderr
    peaks = {"matrix_bf16": 1307.4, "matrix_fp16": 1307.4, "matrix_fp32": 163.4, "vector_fp32": 163.4}
    rows = 0
    for stem in ("GEMM", "UnaryElementwise"):
        got = _csv((tmp_path / "out" / "ops" / "rank0" / f"{stem}.csv").read_text())
        rows += _check_sheet(got, _reference("vllm_graph_mi300", stem), peaks, 5300)
    assert rows >= 2  # (the trace's two GEMM rows; its elementwise ones are bf16 vector ops: no peak)
    notes = json.loads(run.stdout)["notes"]
    said = [note for note in notes if "built-in spec 'AMD Instinct MI300X'" in note]
    assert len(said) == 1 and "amd-instinct-mi300x-data-sheet.pdf" in said[0] and "by its properties" in said[0]


def test_gpu_spec_file_overrides_the_built_in_one(tmp_path) -> None:
    """b200 with the fixture spec: TraceLens's roofline columns as TraceLens writes them with that file, and
    the extra columns from the file's figures, not the B200's."""
    run = _analyze("b200_eager.json.gz", tmp_path / "out", "--gpu-spec", SPEC, "--json")
    assert run.returncode == 0, run.stderr
    fixture = json.loads(open(SPEC).read())
    got = _csv((tmp_path / "out" / "ops" / "rank0" / "GEMM.csv").read_text())
    assert _check_sheet(got, _reference("b200_eager_spec", "GEMM"), fixture["max_achievable_tflops"],
                        fixture["mem_bw_gbps"]) > 0
    notes = json.loads(run.stdout)["notes"]
    assert any("test fixture" in note and SPEC in note and "--gpu-spec" in note for note in notes)
    assert not any("B200" in note and "built-in" in note for note in notes)


def test_text_report_names_the_spec_or_says_the_gpu_is_unknown(tmp_path) -> None:
    known = _analyze("b200_eager.json.gz", tmp_path / "b200")
    assert known.returncode == 0, known.stderr
    report = re.sub(r"\s+", " ", known.stdout)
    assert "built-in spec 'NVIDIA B200 (HGX)'" in report and "https://www.nvidia.com/en-us/data-center/hgx/" in report
    unknown = _analyze("mi250_minitoy.json.gz", tmp_path / "mi250")
    assert unknown.returncode == 0, unknown.stderr
    report = re.sub(r"\s+", " ", unknown.stdout)
    assert "GPU unknown: 'AMD Radeon Graphics'" in report and "--gpu-spec" in report
    header = (tmp_path / "mi250" / "ops" / "rank0" / "GEMM.csv").read_text().split("\n")[0]
    assert "roofline" not in header.lower()  # no spec: TraceLens's columns only


def test_docs_table_is_the_built_in_table() -> None:
    """docs/analyze.md lists every entry with its figures and source, as the code has them."""
    text = (ROOT / "docs" / "analyze.md").read_text()
    header = next(line for line in text.splitlines() if line.startswith("| GPU | GB/s |"))
    keys = [cell.strip().replace(" ", "_") for cell in header.strip("|").split("|")[2:]]
    sources = dict(re.findall(r"^(\d+)\. (.+)$", text.split("\nSources:\n")[1].split("\n\n#")[0], re.MULTILINE))
    listed = {}
    for line in text.splitlines():
        match = re.match(r"\| (.+?) \[(\d+)\] \| ([\d.]+) \|(.*)\|$", line)
        if match:
            cells = [cell.strip() for cell in match.group(4).split("|")]
            listed[match.group(1)] = (float(match.group(3)), {k: float(c) for k, c in zip(keys, cells) if c},
                                      sources[match.group(2)])
    assert set(listed) == set(gpuspecs.BY_NAME)
    for name, spec in gpuspecs.BY_NAME.items():
        bandwidth, peaks, source = listed[name]
        assert (bandwidth, peaks) == (spec.mem_bw_gbps, dict(spec.peaks)), name
        assert source.startswith(spec.document) and all(url in source for url in spec.url.split(", ")), name
