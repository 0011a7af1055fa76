"""analyze --ops: TraceLens's perf-report tables, compared row by row with
TraceLens's own CSVs (tests/reference/tracelens_perf, made by
scripts/tracelens_perf_reference.py), and the rules behind them on
hand-built cases."""
from __future__ import annotations

import csv
import gzip
import io
import json
import subprocess
import sys

import numpy as np
import pytest
from conftest import ROOT, TRACES
from tracelens_perf_reference import CASES, SPEC, SPEC_CASES, trace_of

from streamtrace.algo import opsheets, optree, perfmodel, unifiedperf
from streamtrace.algo import perfmodels_attention as attention
from streamtrace.algo import perfmodels_conv as conv
from streamtrace.algo import perfmodels_norm as norm
from streamtrace.algo.opcategories import CATEGORY_OF_OP, op_category
from streamtrace.algo.opsheets import SHEET_OPS
from streamtrace.commands.analyses.ops import ops_tables
from streamtrace.io.configfiles import load_spec

REFERENCE = ROOT / "tests" / "reference" / "tracelens_perf"
STEMS = ("gpu_timeline", "ops_summary_by_category", "ops_summary", "kernel_summary", "short_kernel_histogram",
         "short_kernels_summary", "ops_unique_args", "GEMM", "UnaryElementwise", "BinaryElementwise",
         "Reduce_fwd", "Reduce_bwd", "SDPA_fwd", "SDPA_bwd", "CONV_fwd", "CONV_bwd", "Normalization", "RMSNorm_fwd",
         "RMSNorm_bwd", "RoPE_fwd", "RoPE_bwd", "CrossEntropy_fwd", "CrossEntropy_bwd", "GroupedGEMM_fwd",
         "GroupedGEMM_bwd", "MoE_fused_fwd", "MoE_fused_bwd", "MoE_unfused_fwd", "MoE_unfused_bwd", "MoE_aux_fwd",
         "MoE_aux_bwd", "MoE_comm_fwd", "MoE_comm_bwd", "InferenceAttention_fwd", "InferenceAttention_bwd", "SSM_fwd",
         "SSM_bwd", "mHC_fwd", "mHC_bwd", "GroupQuant_fwd", "GroupQuant_bwd", "FusedRoPE_fwd", "FusedRoPE_bwd",
         "elementwise_fwd", "elementwise_bwd", "CustomCollective_fwd", "CustomCollective_bwd",
         "coll_analysis", "unified_perf_summary")
SLOW_CASES = {"b200_eager", "nccl_rank0", "b200_eager_spec"}  # the two largest traces: a few seconds each


def _trace(case: str, tmp_path_factory: pytest.TempPathFactory) -> str:
    return trace_of(case, str(tmp_path_factory.mktemp(case)))


def _reference(case: str, stem: str) -> list[str] | None:
    path = REFERENCE / case / f"{stem}.csv.gz"
    return gzip.decompress(path.read_bytes()).decode("utf-8").split("\n") if path.exists() else None


@pytest.mark.parametrize("case", [pytest.param(c, marks=pytest.mark.slow) if c in SLOW_CASES else c
                                  for c in [*CASES, *SPEC_CASES]])
def test_tables_equal_tracelens_row_by_row(case: str, tmp_path_factory: pytest.TempPathFactory) -> None:
    spec = load_spec(SPEC) if case in SPEC_CASES else None  # (TraceLens run with --gpu_arch_json_path: roofline)
    tables, notes = ops_tables(_trace(case, tmp_path_factory), spec=spec)
    assert {path.name[:-len(".csv.gz")] for path in (REFERENCE / case).glob("*.csv.gz")} <= set(STEMS)
    for stem in STEMS:
        expected = _reference(case, stem)
        if expected is None:  # TraceLens writes no such table for this trace
            assert stem not in tables, stem
            continue
        assert stem in tables, stem
        got = tables[stem].decode("utf-8").split("\n")
        assert len(got) == len(expected), (stem, len(got), len(expected))
        for number, (row, want) in enumerate(zip(got, expected)):
            assert row == want, (stem, number)


def test_op_categories_are_tracelens_registry() -> None:
    registry = json.loads((REFERENCE / "op_categories.json").read_text())
    assert CATEGORY_OF_OP == registry


def test_sheet_op_names_are_tracelens_sheets() -> None:
    sheets = json.loads((REFERENCE / "op_sheets.json").read_text())
    assert {sheet: sorted(names) for sheet, names in SHEET_OPS.items()} == {sheet: sheets[sheet] for sheet in SHEET_OPS}


@pytest.mark.parametrize(("name", "kernel", "category"), [
    ("aten::mm", None, "GEMM"),
    ("triton_poi_fused_add_0", None, "triton"),
    ("record_param_comms", "ncclKernel_AllReduce", "record_param_comms"),
    ("aten::fill_", "void at::native::vectorized_elementwise_kernel<4, at::native::FillFunctor<float>>", "elementwise"),
    ("aten::fill_", "elementwise_kernel (not at::native)", "other"),
    ("my::op", None, "other"),
])
def test_op_category_rules(name: str, kernel: str | None, category: str) -> None:
    assert op_category(name, kernel) == category


def test_nesting_by_time_per_thread_with_tracelens_bleed_rule() -> None:
    # thread 0: A [0,10) holds B [1,5); C [4.5,6) starts 0.5 us before B ends: hung beside B, under A;
    # D [5.5,20) starts 0.5 us before C ends: under A too, though it outlasts A (TraceLens's accident);
    # F [9,30) starts 11 us before D ends: left out of the tree; thread 1: E alone
    thread = np.array([0, 0, 0, 0, 1, 0])
    ts = np.array([0.0, 1.0, 4.5, 5.5, 2.0, 9.0])
    end = np.array([10.0, 5.0, 6.0, 20.0, 3.0, 30.0])
    parent, in_tree, _ = optree.host_tree(thread, ts, end)
    assert parent.tolist() == [-1, 0, 0, 0, -1, -1]
    assert in_tree.tolist() == [True, True, True, True, True, False]  # F: no parent and not a root either


def test_bleed_at_the_top_level_leaves_the_event_out() -> None:
    parent = optree.host_tree(np.array([0, 0, 0]), np.array([0.0, 9.5, 11.0]), np.array([10.0, 12.0, 13.0]))[0]
    assert parent.tolist() == [-1, -1, -1]


def test_busy_time_is_the_union_summed_left_to_right() -> None:
    starts = np.array([5.0, 0.0, 1.0, 10.0])
    ends = np.array([6.0, 2.0, 3.0, 10.5])
    assert optree.busy_of(starts.tolist(), ends.tolist()) == 4.5
    assert optree.busy_of([0.0, 2.0], [2.0, 3.0]) == 3.0  # touching intervals merge
    assert optree.busy_of([1.0, 1.0], [4.0, 4.0]) == 3.0  # a kernel linked twice counts once


def test_subtract_intervals() -> None:
    cut = (np.array([1.0, 4.0]), np.array([2.0, 6.0]))
    base = (np.array([0.0, 5.0]), np.array([3.0, 8.0]))
    s, e = optree.subtract(cut, base)
    assert list(zip(s.tolist(), e.tolist())) == [(0.0, 1.0), (2.0, 3.0), (6.0, 8.0)]


@pytest.mark.parametrize("monotonic", [True, False])
def test_group_sums_are_pandas_sums(monotonic: bool) -> None:
    """As pandas 3 sums groups: the version TraceLens's reference CSVs were made with (pandas 2 sums rows
    that come in group order another way; the reference tables above check the sums whatever is installed)."""
    pandas = pytest.importorskip("pandas", minversion="3")
    rng = np.random.default_rng(5)
    values = np.round(rng.uniform(0, 5000, 400) * rng.choice([1, 1e-3], 400), 3)
    labels = np.sort(rng.integers(0, 4, 400)) if monotonic else rng.integers(0, 4, 400)
    frame = pandas.DataFrame({"g": labels, "v": values})
    expected = frame.groupby("g")["v"].sum()
    got = optree.group_sums(labels, values, 4)
    assert got.tolist() == expected.tolist()
    naive = [float(sum(values[labels == g].tolist())) for g in range(4)]
    assert got.tolist() != naive  # (a plain sum differs: the test can tell)


def test_descending_order_is_pandas_quicksort_order() -> None:
    pandas = pytest.importorskip("pandas")
    values = [3.0, 1.0, 3.0, 2.0] * 10 + [5.0]  # over 16 rows: ties not kept in order
    expected = pandas.Series(values).sort_values(ascending=False).index.tolist()
    assert optree.descending(values) == expected


def _write(path, events: list) -> str:
    path.write_text(json.dumps({"traceEvents": events}))
    return str(path)


def _launch(corr: int, ts: float, name: str = "cudaLaunchKernel", tid: int = 1) -> list[dict]:
    return [{"ph": "X", "cat": "cuda_runtime", "name": name, "pid": 1, "tid": tid, "ts": ts, "dur": 1,
             "args": {"correlation": corr}},
            {"ph": "s", "cat": "ac2g", "name": "ac2g", "id": corr, "pid": 1, "tid": tid, "ts": ts}]


def _kernel(corr: int, ts: float, dur: float, name: str = "k", stream: int = 7) -> list[dict]:
    return [{"ph": "X", "cat": "kernel", "name": name, "pid": 0, "tid": stream, "ts": ts, "dur": dur,
             "args": {"correlation": corr, "stream": stream}},
            {"ph": "f", "cat": "ac2g", "name": "ac2g", "id": corr, "pid": 0, "tid": stream, "ts": ts, "bp": "e"}]


def _csv(tables: dict, stem: str) -> list[list[str]]:
    return [line.split(",") for line in tables[stem].decode().strip().split("\n")]


def test_kernel_time_is_the_union_of_an_ops_kernels(tmp_path) -> None:
    events = [{"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 1, "tid": 1, "ts": 0, "dur": 10,
               "args": {"Input Dims": [[2, 3], [3, 4]], "Input Strides": [[3, 1], [4, 1]], "Concrete Inputs": ["", ""]}},
              *_launch(1, 1), *_launch(2, 3), *_kernel(1, 100, 5), *_kernel(2, 103, 5, stream=8),
              *_kernel(9, 200, 1)]  # a kernel with no launch: left out of every op and of the timeline
    tables, notes = ops_tables(_write(tmp_path / "t.json", events))
    assert notes == []
    summary = _csv(tables, "ops_summary")
    assert summary[1][:6] == ["aten::mm", "8", "8", "0.008", "0.008", "1"]  # [100,105) U [103,108), not 10
    timeline = dict((row[0], row[1]) for row in _csv(tables, "gpu_timeline")[1:])
    assert timeline["total_time"] == "0.008"
    kernels = _csv(tables, "kernel_summary")
    assert [row[:4] for row in kernels[1:]] == [["GEMM", "aten::mm", "k", "7"], ["GEMM", "aten::mm", "k", "8"],
                                                ["", "", "k", "7"]]  # the unlinked kernel still counts here


def test_no_linked_gpu_event_is_said_not_a_traceback(tmp_path) -> None:
    events = [{"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 1, "tid": 1, "ts": 0, "dur": 10, "args": {}}]
    tables, notes = ops_tables(_write(tmp_path / "t.json", events))
    assert tables == {}
    assert notes and "No GPU events" in notes[0]


def test_analyze_ops_writes_the_tables_per_rank(tmp_path) -> None:
    out = tmp_path / "out"
    run = subprocess.run([sys.executable, "-m", "streamtrace", "analyze", str(TRACES / "mi250_minitoy.json.gz"),
                          "-o", str(out), "--ops", "-q"], capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    written = sorted(path.name for path in (out / "ops" / "rank0").iterdir())
    assert written == sorted(f"{stem}.csv" for stem in STEMS if _reference("mi250_minitoy", stem) is not None)
    for name in written:
        assert (out / "ops" / "rank0" / name).read_text().split("\n") == _reference("mi250_minitoy", name[:-4])
    assert (out / "temporal_breakdown.csv").exists()  # the HTA tables as before


def test_analyze_ops_with_a_gpu_spec_says_which(tmp_path) -> None:
    out = tmp_path / "out"
    run = subprocess.run([sys.executable, "-m", "streamtrace", "analyze", str(TRACES / "mi250_minitoy.json.gz"),
                          "-o", str(out), "--ops", "--gpu-spec", SPEC, "--json", "-q"], capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    assert any("test fixture" in note and "--gpu-spec" in note for note in json.loads(run.stdout)["notes"])
    got = (out / "ops" / "rank0" / "GEMM.csv").read_text().split("\n")
    reference = _reference("mi250_minitoy_spec", "GEMM")  # TraceLens's columns, then the roofline ones beyond them
    assert len(got) == len(reference) and "Roofline Bound_first" in got[0]
    assert all(line == want or line.startswith(want + ",") for line, want in zip(got, reference))


def test_analyze_ops_needs_an_output_directory() -> None:
    run = subprocess.run([sys.executable, "-m", "streamtrace", "analyze", str(TRACES / "kineto_small.json"), "--ops"],
                         capture_output=True, text=True)
    assert run.returncode == 1
    assert "-o DIR" in run.stderr and "Traceback" not in run.stderr


def test_unique_args_groups_by_the_text_of_odd_shapes(tmp_path) -> None:
    def op(ts: int, corr: int, dims: object) -> list[dict]:
        return [{"ph": "X", "cat": "cpu_op", "name": "aten::add", "pid": 1, "tid": 1, "ts": ts, "dur": 5,
                 "args": {"Input Dims": dims}}, *_launch(corr, ts + 1), *_kernel(corr, 100 + ts, 2)]

    events = [{"ph": "M", "name": "thread_name", "pid": 1, "tid": 1, "args": {"name": "main"}},
              *op(0, 1, [[[2, 3]], []]), *op(10, 2, "weird"), *op(20, 3, [[[2, 3]], []]), *op(30, 4, None)]
    tables, _ = ops_tables(_write(tmp_path / "t.json", events))
    rows = _csv_rows(tables["ops_unique_args"])
    header = rows[0]
    by_dims = {row[header.index("Input Dims")]: row for row in rows[1:]}
    assert set(by_dims) == {"(((2, 3),), ())", "weird", ""}
    assert by_dims["(((2, 3),), ())"][header.index("operation_count")] == "2"
    assert by_dims["(((2, 3),), ())"][header.index("thread_name")] == "main"
    assert by_dims["(((2, 3),), ())"][header.index("ex_UID")] == "1"  # the first of the group, by its place


def _csv_rows(data: bytes) -> list[list[str]]:
    return list(csv.reader(io.StringIO(data.decode())))


def test_events_without_times_are_left_out_and_counted(tmp_path) -> None:
    events = [{"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 1, "tid": 1, "ts": 0, "dur": 10, "args": {}},
              *_launch(1, 1), *_kernel(1, 100, 5), {"ph": "X", "cat": "kernel", "name": "k", "pid": 0, "tid": 7,
                                                    "ts": 120, "args": {"correlation": 2}}]
    tables, notes = ops_tables(_write(tmp_path / "t.json", events))
    assert notes == ["1 host or GPU events without a numeric ts or dur left out (TraceLens fails on them)"]
    assert _csv(tables, "kernel_summary")[1][4] == "5"  # the timed kernel alone


def test_gemm_model_flops_and_bytes_by_hand() -> None:
    args = {"Input Dims": [[128], [5, 128], [128, 64], [], []], "Input type": ["float", "float", "float", "Scalar", "Scalar"],
            "Input Strides": [[1], [128, 1], [1, 128], [], []]}
    params = perfmodel.gemm_params("aten::addmm", args, ["x", "Cijk_Alik_Bljk_SB_MT64x16x32"])
    assert (params["M"], params["N"], params["K"], params["bias"], params["B"]) == (5, 64, 128, True, 1)
    assert params["transpose"] == (True, False) and params["stride_A"] == (128, 1)
    assert perfmodel.gemm_flops(params) == 2 * 5 * 64 * 128 + 5 * 64
    assert perfmodel.gemm_bytes(params) == 4 * (5 * 128 + 128 * 64 + 5 * 64 + 64)
    assert perfmodel.compute_spec(params) == "matrix_fp32"
    batched = perfmodel.gemm_params("aten::bmm", {"Input Dims": [[3, 4, 8], [3, 8, 2]], "Input type": ["c10::BFloat16"] * 2},
                                    ["nvjet_tst_128x64_64x4_1x1_v_bz_TN"])
    assert perfmodel.gemm_flops(batched) == 3 * 2 * 4 * 2 * 8 and perfmodel.gemm_bytes(batched) == 3 * 2 * (32 + 16 + 8)
    assert batched["transpose"] == (True, False) and batched["stride_A"] is None
    assert list(batched)[0] == "B"  # (bmm's batch comes first among its parameters, as TraceLens orders them)


def test_gemm_sheet_rows_from_a_hand_built_trace(tmp_path) -> None:
    def mm(ts: int, corr: int, dims: object) -> list[dict]:
        return [{"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 1, "tid": 1, "ts": ts, "dur": 5,
                 "args": {"Input Dims": dims, "Input type": ["float", "float"]}}, *_launch(corr, ts + 1),
                *_kernel(corr, 100 + ts, 4)]

    events = [*mm(0, 1, [[16, 32], [32, 8]]), *mm(10, 2, [[16, 32], [32, 8]]), *mm(20, 3, [[16]])]  # the last: odd
    tables, _ = ops_tables(_write(tmp_path / "t.json", events))
    rows = _csv_rows(tables["GEMM"])
    row = dict(zip(rows[0], rows[1]))
    assert len(rows) == 2  # the op whose shapes the model cannot read gets no row, and no traceback
    assert row["GFLOPS_first"] == repr(2 * 16 * 8 * 32 / 1e9) and row["name_count"] == "2"
    assert row["TFLOPS/s_mean"] == repr((2 * 16 * 8 * 32 / 1e9 / 1e3) / (4 / 1e6))
    assert row["Data Moved (MB)_first"] == repr(4 * (16 * 32 + 32 * 8 + 16 * 8) / (1024 * 1024))
    assert row["Kernel Time (µs)_sum"] == "8" and row["UID_first"] == "0"


def test_elementwise_models_by_hand() -> None:
    args = {"Input Dims": [[4, 1, 3], [2, 1], []], "Input type": ["c10::BFloat16", "float", "Scalar"],
            "Input Strides": [[3, 3, 1], [1, 1], []]}
    params, flops, moved, spec = perfmodel.binary("aten::add", args, [])
    assert flops == 4 * 2 * 3  # the broadcast output (4, 2, 3)
    assert moved == 12 * 2 + 2 * 4 + 24 * 4  # both tensors: the output at the larger size
    assert spec == "vector_bf16" and params["dtype_in1_in2_out"] == ("c10::BFloat16", "float", None)
    with pytest.raises(ValueError):
        perfmodel.binary("aten::add", {**args, "Input Dims": [[4, 3], [2]]}, [])
    params, flops, moved, spec = perfmodel.unary("aten::copy_", {"Input Dims": [[5, 128], [5, 128], []],
                                                                 "Input type": ["float", "c10::Half", "Scalar"],
                                                                 "Input Strides": [[128, 1], [128, 1], []]}, [])
    assert (flops, moved, spec) == (640, 640 * 4 + 640 * 2, "vector_fp32")


def test_roofline_columns_by_hand() -> None:
    spec = {"mem_bw_gbps": 1000, "max_achievable_tflops": {"matrix_bf16": 100}}
    compute_bound = opsheets.roofline(spec, "matrix_bf16", gflops=1000.0, moved=10**6, busy=20_000.0)
    assert compute_bound == {"Roofline Time (µs)": 10_000.0, "Roofline Bound": "COMPUTE_BOUND", "Pct Roofline": 50.0}
    memory_bound = opsheets.roofline(spec, "matrix_bf16", gflops=1e-3, moved=10**9, busy=2000.0)
    assert memory_bound["Roofline Bound"] == "MEMORY_BOUND" and memory_bound["Roofline Time (µs)"] == 1000.0
    assert opsheets.roofline(spec, "vector_fp32", 1.0, 10, 1.0) == {}  # no peak for that kind: no roofline


@pytest.mark.parametrize(("text", "words"), [("{", "no JSON"), ('{"mem_bw_gbps": 0, "max_achievable_tflops": {}}',
                                                               "mem_bw_gbps (a positive number)")])
def test_bad_gpu_spec_is_one_line_before_reading(tmp_path, text: str, words: str) -> None:
    spec = tmp_path / "spec.json"
    spec.write_text(text)
    run = subprocess.run([sys.executable, "-m", "streamtrace", "analyze", str(TRACES / "kineto_small.json"), "-o",
                          str(tmp_path / "out"), "--ops", "--gpu-spec", str(spec)], capture_output=True, text=True)
    assert run.returncode == 1 and words in run.stderr and "spec.json" in run.stderr
    assert len(run.stderr.strip().splitlines()) == 1 and not (tmp_path / "out").exists()


def test_gpu_spec_needs_ops(tmp_path) -> None:
    run = subprocess.run([sys.executable, "-m", "streamtrace", "analyze", str(TRACES / "kineto_small.json"), "-o",
                          str(tmp_path / "out"), "--gpu-spec", SPEC], capture_output=True, text=True)
    assert run.returncode == 1 and "add --ops" in run.stderr


def test_reduce_model_by_hand() -> None:
    args = {"Input Dims": [[4, 6, 5], [], [], []], "Input type": ["c10::Half", "", "", ""]}
    full = perfmodel.reduce("aten::sum", {**args, "Concrete Inputs": ["", "[1]", "False", ""]}, [])
    assert full[0]["num_output_elems"] == 1  # Kineto's dims are strings: TraceLens models a full reduction
    over_dim = perfmodel.reduce("aten::mean", {**args, "Concrete Inputs": ["", [1, -1], True, None]}, [])
    assert over_dim[0]["num_output_elems"] == 4 and over_dim[0]["reduce_type"] == "mean"
    assert over_dim[1:] == (120, 120 * 2 + 4 * 2, "vector_fp16")
    assert perfmodel.reduce("aten::amax", {"Input Dims": []}, [])[0] == {
        "num_input_elems": 0, "num_output_elems": 0, "dtype_in_out": (None, None)}


def test_backward_sheet_takes_the_kernels_of_the_linked_backward_op(tmp_path) -> None:
    def op(name: str, ts: int, tid: int, seq: int, corr: int, dur: int) -> list[dict]:
        return [{"ph": "X", "cat": "cpu_op", "name": name, "pid": 1, "tid": tid, "ts": ts, "dur": 5,
                 "args": {"Input Dims": [[8, 4]], "Input type": ["float"], "Sequence number": seq}},
                *_launch(corr, ts + 1, tid=tid), *_kernel(corr, 100 + ts, dur)]

    events = [*op("aten::sum", 0, 1, 7, 1, 3), *op("autograd::engine::evaluate_function: SumBackward0", 50, 2, 7, 2, 6),
              *op("aten::mean", 10, 1, 8, 3, 2)]  # no backward op for the mean: no backward row
    tables, notes = ops_tables(_write(tmp_path / "t.json", events))
    forward, backward = _csv_rows(tables["Reduce_fwd"]), _csv_rows(tables["Reduce_bwd"])
    assert [row[0] for row in forward[1:]] == ["aten::sum", "aten::mean"] and notes == []
    row = dict(zip(backward[0], backward[1]))
    assert len(backward) == 2 and row["name"] == "aten::sum" and row["Kernel Time (µs)_sum"] == "6"  # SumBackward0's
    assert row["UID_first"] == "0" and row["thread_name_first"] == "Unknown"


def test_a_sheet_with_an_op_not_modelled_here_is_left_out_and_said(tmp_path) -> None:
    events = [{"ph": "X", "cat": "cpu_op", "name": name, "pid": 1, "tid": 1, "ts": ts, "dur": 5,
               "args": {"Input Dims": [[16, 32], [32, 8]], "Input type": ["float", "float"]}}
              for name, ts in (("aiter::ck_moe_stage1", 0), ("pseudo_op::moe_gptq_awq_down", 10))]
    events += [*_launch(1, 1), *_kernel(1, 100, 4), *_launch(2, 11), *_kernel(2, 110, 4)]
    tables, notes = ops_tables(_write(tmp_path / "t.json", events))
    assert "MoE_unfused_fwd" not in tables and "ops_summary" in tables
    assert notes == ["unified_perf_summary not written: no model here yet for pseudo_op::moe_gptq_awq_down",
                     "MoE_unfused sheet not written: no model here yet for pseudo_op::moe_gptq_awq_down"]


def test_attention_models_by_hand() -> None:
    shape = [2, 8, 128, 64]
    args = {"Input Dims": [shape, [2, 2, 128, 64], [2, 2, 128, 64], [], [], [], []],
            "Input type": ["c10::Half", "c10::Half", "c10::Half", "Scalar", "Scalar", "Scalar", ""],
            "Concrete Inputs": ["", "", "", "0.1", "True", "False", ""]}
    params, flops, moved, spec = attention.sdpa("aten::_scaled_dot_product_flash_attention", args, [])
    assert (params["H_Q"], params["H_KV"], params["dropout"], params["causal"]) == (8, 2, 0.1, True)
    assert flops == 2 * 8 * (2 * 128 * 128 * 64) * 2 / 2  # QK^T and PV, halved: causal
    assert moved == 2 * (2 * 8 * 128 * 64 * 2 + 2 * 2 * 128 * 64 * 2)  # 2 bytes an element whatever the dtype
    assert spec == "matrix_fp16"
    _, backward, moved_backward, _ = attention.sdpa_backward("aten::_scaled_dot_product_flash_attention", args, [])
    gqa = 2 * 128 * 64 * (8 // 2 - 1)
    assert backward == (5 * 2 * 8 * (2 * 128 * 128 * 64) + 2 * gqa) / 2  # recompute, dV, dP, dQ, dK
    assert moved_backward == 2 * (3 * 2 * 8 * 128 * 64 + 4 * 2 * 2 * 128 * 64)
    with pytest.raises(ValueError):  # causal with lengths that differ: TraceLens leaves the op out
        attention.sdpa("aten::_scaled_dot_product_flash_attention",
                       {**args, "Input Dims": [[2, 8, 64, 64], shape, shape]}, [])


def test_convolution_models_by_hand() -> None:
    args = {"Input Dims": [[8, 3, 32, 32], [16, 3, 3, 3], [16], [], [], [], [], [], []],
            "Input type": ["float", "float", "float", "ScalarList", "ScalarList", "ScalarList", "Scalar", "ScalarList",
                           "Scalar"], "Input Strides": [[3072, 1024, 32, 1], [27, 9, 3, 1], [1], [], [], [], [], [], []],
            "Concrete Inputs": ["", "", "", "[2]", "[0, 1]", "[1, 1]", "False", "[0, 0]", "1"]}
    params, flops, moved, spec = conv.conv("aten::convolution", args, [])
    assert params["stride"] == (2, 2) and params["bias"] is False  # nine inputs: never a bias (TraceLens's test)
    out = (8, 16, 15, 16)  # int((32 - 2 - 1) / 2 + 1), int((32 + 2 - 2 - 1) / 2 + 1)
    assert conv.output_shape(params) == out
    assert flops == 8 * 16 * 15 * 16 * 2 * 27 and spec == "matrix_fp32"
    assert moved == 4 * (8 * 3 * 32 * 32 + 16 * 27 + 8 * 16 * 15 * 16)
    with pytest.raises(SyntaxError):  # no concrete inputs: TraceLens's eval of "" fails, no row
        conv.conv("aten::convolution", {**args, "Concrete Inputs": [""] * 9}, [])


def test_norm_models_by_hand() -> None:
    args = {"Input Dims": [[4, 16, 8], [], [8], [8], []], "Input type": ["c10::BFloat16", "", "c10::BFloat16",
                                                                        "c10::BFloat16", "Double"],
            "Input Strides": [[128, 8, 1], [], [1], [1], []], "Concrete Inputs": ["", "[8]", "", "", "1e-05"]}
    params, flops, moved, spec = norm.norm("aten::native_layer_norm", args, [])
    assert params["num_channels"] == 8 and params["is_affine"] and params["has_bias"]
    assert flops == 8 * 3 + 512 * 3 + 8 * 3 + 2 * 512  # statistics (training), per channel, the elements
    assert moved == 512 * 2 * 2 + 6 * 8 * 2 and spec == "vector_bf16"  # mean, var, weight, bias, running stats
    batch = {"Input Dims": [[4, 16, 8], [16], [16], [16], [16], [], [], []], "Input type": ["float"] * 8,
             "Input Strides": [[128, 8, 1]] + [[1]] * 7, "Concrete Inputs": ["", "", "", "", "", "False", "0.1", ""]}
    assert norm.norm("aten::native_batch_norm", batch, [])[0]["is_training"]  # bool("False"): TraceLens's test
    with pytest.raises(NotImplementedError):  # TraceLens's instance-norm backward model declines: no row
        norm.norm("aten::native_instance_norm_backward", batch, [])


def test_unified_summary_rows_from_a_hand_built_trace(tmp_path) -> None:
    def op(name: str, ts: int, corr: int, kernel: str, dur: int, args: dict | None = None) -> list[dict]:
        return [{"ph": "X", "cat": "cpu_op", "name": name, "pid": 1, "tid": 1, "ts": ts, "dur": 5, "args": args or {}},
                *_launch(corr, ts + 1), *_kernel(corr, 100 + ts, dur, name=kernel)]

    events = [*op("my::op", 0, 1, "k1", 4), *op("nccl:all_reduce", 10, 2, "ncclDevKernel_AllReduce_Sum_f32", 6),
              *op("aten::mm", 20, 3, "gemm", 3, {"Input Dims": [[16]], "Input type": ["float"]}),  # odd: the model fails
              *_launch(4, 40), *_kernel(4, 140, 2, name="k4")]  # a launch with no cpu op above
    tables, notes = ops_tables(_write(tmp_path / "t.json", events))
    rows = _csv_rows(tables["unified_perf_summary"])
    got = [dict(zip(rows[0], row)) for row in rows[1:]]
    assert notes == []
    assert [(r["name"], r["op category"], r["Kernel Time (µs)_sum"], r["has_perf_model"]) for r in got] == [
        ("my::op", "other", "4", "False"), ("aten::mm", "GEMM", "3", "True"),
        ("cudaLaunchKernel->k4 (Synthetic Op)", "other", "2", "False")]  # the collective's op: no row
    assert got[2]["ex_UID"] == str(len(events))  # synthetic ops numbered after the trace's events
    assert got[1]["perf_params"] == "" and got[1]["total_duration_us"] == "5"
    assert got[0]["Percentage (%)"] == repr(4 / 9 * 100)



def test_every_tracelens_sheet_is_written_or_said() -> None:
    """Each of TraceLens's sheets is known here with all its ops: modelled, or named in a note when a trace
    holds it (then neither the sheet nor the unified summary is written)."""
    sheets = json.loads((REFERENCE / "op_sheets.json").read_text())
    assert set(SHEET_OPS) == set(sheets)
    assert unifiedperf.UNKNOWN == set().union(*SHEET_OPS.values()) - set(unifiedperf.KNOWN)


def _kahan_rows(codes: np.ndarray, values: np.ndarray, groups: int) -> list[float]:
    """pandas' Kahan-compensated grouped sum, one row at a time as its Cython kernel runs."""
    total, comp = [0.0] * groups, [0.0] * groups
    for code, value in zip(codes.tolist(), values.tolist()):
        if code >= 0:
            y = value - comp[code]
            t = total[code] + y
            c = t - total[code] - y
            comp[code] = 0.0 if c != c else c
            total[code] = t
    return total


@pytest.mark.parametrize("groups, rows", [(3, 500), (40, 3000), (300, 2000), (25, 400)])
def test_group_sums_kahan_matches_the_row_by_row_kernel(groups: int, rows: int) -> None:
    """The grouped Kahan sum, taken column-wise over groups then per long group, gives the digits of the
    row-by-row kernel (skewed group sizes, dropped rows, NaN, values of very different magnitudes)."""
    rng = np.random.default_rng(groups)
    codes = np.minimum(rng.geometric(1 / groups, rows) - 1, groups - 1) - (rng.random(rows) < 0.05)
    values = rng.uniform(0, 5000, rows) * rng.choice([1, 1e-3, 1e9], rows)
    values[rng.random(rows) < 0.01] = np.nan
    got = optree.group_sums_kahan(codes, values, groups)
    expected = _kahan_rows(codes, values, groups)
    assert np.array_equal(got, np.array(expected), equal_nan=True)
    plain = [float(np.sum(values[codes == g])) for g in range(groups)]
    assert not np.array_equal(got, np.array(plain), equal_nan=True)  # (the compensation shows)


def test_a_kernels_launcher_skips_execute_ops(tmp_path) -> None:
    """A launch call's op is the nearest cpu op above it that is not ``execute`` (TorchScript's wrapper), or
    the call itself when only ``execute`` ops enclose it, however many levels of them there are."""
    def op(name: str, ts: float, dur: float) -> dict:
        return {"ph": "X", "cat": "cpu_op", "name": name, "pid": 1, "tid": 1, "ts": ts, "dur": dur, "args": {}}

    events = [op("aten::linear", 0, 20), op("execute", 1, 18), *_launch(1, 2),
              op("execute", 30, 10), *_launch(2, 31),
              op("execute", 50, 10), op("execute", 51, 8), *_launch(3, 52),
              *_kernel(1, 100, 5), *_kernel(2, 110, 3), *_kernel(3, 120, 2)]
    tables, notes = ops_tables(_write(tmp_path / "t.json", events))
    assert notes == []
    rows = [row[:6] for row in _csv(tables, "ops_summary")[1:]]
    assert rows == [["aten::linear", "5", "5", "0.005", "0.005", "1"],
                    ["cudaLaunchKernel", "5", "5", "0.005", "0.005", "2"]]  # (3 + 2 µs, two calls)


def test_an_op_not_modelled_here_below_another_op_is_said(tmp_path) -> None:
    """The walk meets the op whose model is not here while looking below the op around it: no table, a note."""
    events = [{"ph": "X", "cat": "cpu_op", "name": name, "pid": 1, "tid": 1, "ts": ts, "dur": dur,
               "args": {"Input Dims": [[16, 32], [32, 8]], "Input type": ["float", "float"]}}
              for name, ts, dur in (("outer", 0, 30), ("pseudo_op::moe_gptq_awq_down", 10, 5))]
    events += [*_launch(1, 1), *_kernel(1, 100, 4), *_launch(2, 11), *_kernel(2, 110, 4)]
    tables, notes = ops_tables(_write(tmp_path / "t.json", events))
    assert "unified_perf_summary" not in tables and "ops_summary" in tables
    assert "unified_perf_summary not written: no model here yet for pseudo_op::moe_gptq_awq_down" in notes


def test_the_unified_rows_raise_the_first_row_s_missing_model() -> None:
    """A block's model tests run once per distinct key, yet the note names what TraceLens's row-by-row walk
    meets first: the earliest row whose test raises, its own model's test before its parent's."""
    own = ([False, unifiedperf.UnknownModel("b"), unifiedperf.UnknownModel("c")], np.array([0, 0, 2, 1]))
    parent = ([None, unifiedperf.UnknownModel("p")], np.array([0, 0, 1, 0]))
    with pytest.raises(unifiedperf.UnknownModel, match="^c$"):  # (row 2: its own test raises first)
        unifiedperf._raise_first(own, parent)
    with pytest.raises(unifiedperf.UnknownModel, match="^p$"):
        unifiedperf._raise_first(([False], np.zeros(4, dtype=np.int64)), parent)
    unifiedperf._raise_first(([False, True], np.array([1, 0])), ([None], np.zeros(2, dtype=np.int64)))


@pytest.mark.slow
def test_each_model_runs_once_per_distinct_input(monkeypatch: pytest.MonkeyPatch,
                                                 tmp_path_factory: pytest.TempPathFactory) -> None:
    """On a real trace whose ops repeat their shapes, each performance model is called once per distinct
    (op name, arguments, kernel names) across every sheet and the unified table (the tables themselves are
    compared with TraceLens's above)."""
    calls: dict[tuple, int] = {}
    wrapped: dict[int, object] = {}

    def counting(model):
        def counted(name: str, args: dict, kernels: list[str]):
            key = (id(model), name, repr(args), tuple(kernels))
            calls[key] = calls.get(key, 0) + 1
            return model(name, args, kernels)
        return wrapped.setdefault(id(model), counted)

    for table in (*opsheets.MODELS.values(), opsheets.BACKWARD_MODELS, unifiedperf.KNOWN):
        for name, model in list(table.items()):
            monkeypatch.setitem(table, name, counting(model))
    tables, _ = ops_tables(_trace("b200_eager", tmp_path_factory))
    assert "unified_perf_summary" in tables and "GEMM" in tables
    assert len(calls) > 5 and set(calls.values()) == {1}
