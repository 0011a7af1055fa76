"""analyze --ops: TraceLens's extension models (grouped GEMMs, mixture of
experts, inference attention, Apex's fused convolutions, Inductor's
kernels), by hand and on hand-built traces, and every model on odd
arguments; the row-by-row comparison with TraceLens's CSVs of
scripts/extension_ops_trace.py is in tests/test_ops.py."""
from __future__ import annotations

import gzip
import json

import pytest
from conftest import ROOT, TRACES
from test_ops import _csv_rows, _kernel, _launch, _write

from streamtrace.algo import opsheets, perfmodels_inductor, perfmodels_moe
from streamtrace.algo import perfmodels_conv as conv
from streamtrace.algo import perfmodels_inference as inference
from streamtrace.algo.atenops import ATEN_OPS
from streamtrace.commands.analyses.ops import ops_tables

REFERENCE = ROOT / "tests" / "reference" / "tracelens_perf"
BF16 = "c10::BFloat16"


def test_aten_ops_are_tracelens_registry() -> None:
    assert ATEN_OPS == set(json.loads((REFERENCE / "aten_ops.json").read_text()))


def test_grouped_gemm_models_by_hand() -> None:
    weights_n_k = {"Input Dims": [[96, 64], [4, 32, 64], [4]], "Input type": [BF16, BF16, "long int"]}
    params, flops, moved, spec = perfmodels_moe.grouped_gemm("primus_turbo::grouped_gemm", weights_n_k, [])
    assert (params["M"], params["K"], params["N"], params["G"]) == (96, 64, 32, 4)
    assert flops == 2 * 96 * 64 * 32 and spec == "matrix_bf16"
    assert moved == (96 * 64 + 4 * 64 * 32) * 2 + 96 * 32 * 2  # X and the G weights, then Y
    lists = {"Input Dims": [[[10, 64], [30, 64]], [[64, 32], [64, 32]]], "Input type": ["TensorList", "TensorList"]}
    assert perfmodels_moe.grouped_gemm_variable_k("x", {**lists, "Input type": [BF16, BF16]}, [])[2] == \
        (10 * 64 + 64 * 32) * 2 + 10 * 32 * 2 + (30 * 64 + 64 * 32) * 2 + 30 * 32 * 2  # each group its own weight
    with pytest.raises(TypeError):  # a tensor list has no size: TraceLens's bytes fail (no row)
        perfmodels_moe.grouped_gemm("x", lists, [])
    assert perfmodels_moe.grouped_gemm_variable_k("x", lists, [])[2] is None  # ... the variable-K model says none
    with pytest.raises(ValueError):  # K found in neither layout of W, and no tensor lists
        perfmodels_moe.grouped_gemm("x", {**weights_n_k, "Input Dims": [[96, 64], [4, 32, 16]]}, [])


def test_fused_moe_model_by_hand() -> None:
    tokens, hidden, inter, experts, topk = 4, 256, 128, 16, 2
    args = {"Input Dims": [[tokens, hidden], [tokens, hidden], [experts, 2 * inter, hidden], [experts, hidden, inter]],
            "Input type": [BF16, "c10::Float8_e4m3fnuz", "c10::Float8_e4m3fnuz", "c10::Float8_e4m3fnuz"],
            "Concrete Inputs": ["", "", "", "", "", "", "", "", str(topk)]}
    params, flops, moved, spec = perfmodels_moe.fused_blockscale("aiter::fmoe_g1u1", args, [])
    assert params["gated"] and spec == "matrix_fp8"
    assert flops == 2 * 2 * tokens * hidden * inter * topk + 2 * tokens * hidden * inter * topk \
        + tokens * hidden * (2 * topk - 1)  # gated up, down, the weighted sum of the experts' outputs
    active = experts * (1 - (1 - topk / experts) ** tokens)  # experts a uniform routing touches
    assert moved == pytest.approx(tokens * hidden * 1 + 3 * active * inter * hidden * 1 + tokens * hidden * 2)
    with pytest.raises(ValueError):  # top-k not recorded: no row
        perfmodels_moe.fused_blockscale("aiter::fmoe_g1u1", {**args, "Concrete Inputs": [""] * 9}, [])


def test_dispatch_moves_bytes_and_no_flops_both_ways() -> None:
    args = {"Input Dims": [[512, 1024], [512, 2]], "Input type": [BF16, "long int"]}
    assert perfmodels_moe.moe_comm("MoEDispatch", args, [])[1:] == (0, 512 * 1024 * 2, "")
    assert opsheets.BACKWARD_MODELS["MoEDispatch"] is perfmodels_moe.moe_comm


def test_inference_attention_without_annotation_fails_as_tracelens() -> None:
    args = {"Input Dims": [[16, 8, 128], [16, 2, 128], [16, 2, 128]], "Input type": [BF16] * 3}
    with pytest.raises(TypeError):  # no annotation, no FLOPs: TraceLens's division fails (kernel time only)
        inference.MODELS["aiter::mha_varlen_fwd"]("aiter::mha_varlen_fwd", args, [])
    with pytest.raises(NotImplementedError):  # the gated delta net's model declines (no unified row)
        inference.MODELS["vllm::gdn_attention_core"]("vllm::gdn_attention_core", args, [])
    cache = {"Input Dims": [[16, 1024], [16, 1024]], "Input type": ["weird", BF16]}
    assert inference.store_cache("sglang::store_cache", cache, [])[2] == 4 * 16 * 1024 * 2  # no size: 2 bytes


def test_inductor_kernel_names_cut_into_aten_ops() -> None:
    assert perfmodels_inductor.fused_ops("triton_poi_fused__to_copy_add_mul_silu_0") == (
        "aten._to_copy", "aten.add", "aten.mul", "aten.silu")
    assert perfmodels_inductor.fused_ops("triton_per_fused_native_layer_norm_12") == ("aten.native_layer_norm",)
    assert perfmodels_inductor.fused_ops("triton_poi_fused_zzz_unknown_3") == ()  # a word no op name covers
    assert perfmodels_inductor.fused_ops("triton_poi_fused_cat") == ()  # no kernel number


def test_inductor_model_by_hand() -> None:
    args = {"Input Dims": [[8, 4096], [4096], [8, 4096], []], "Input type": [BF16, "float", BF16, "Scalar"],
            "Concrete Inputs": ["", "", "", "8", "4096"]}
    params, flops, moved, spec = perfmodels_inductor.triton_compiled("triton_red_fused_add_mean_mul_1", args, [])
    assert (params["fused_ops"], params["xnumel"], params["rnumel"]) == ("aten.add, aten.mean, aten.mul", 8, 4096)
    assert flops == 3.0 * 8 * 4096 and spec == "vector_bfloat16"
    assert moved == 8 * 4096 * 2 + 0 + 8 * 4096 * 2  # 'float' is not a c10:: name: 0 bytes (TraceLens's table)
    pointwise = perfmodels_inductor.triton_compiled("triton_poi_fused_add_0", {**args, "Concrete Inputs": ["9"]}, [])
    assert pointwise[2] == moved + 2 * 9  # the output at the first buffer's size, per element
    assert not perfmodels_inductor.has_model("triton_poi_fused_add_0", {**args, "Concrete Inputs": ["", "x"]})


@pytest.mark.slow
def test_inductor_rows_of_a_real_trace_equal_tracelens() -> None:
    """The shared B200 trace's unified summary (an Inductor kernel among its rows; vLLM's attention
    under a native annotation, without the query and key sums its model reads: no FLOPs)."""
    tables, _ = ops_tables(str(TRACES / "b200_eager.json.gz"))
    expected = gzip.decompress((REFERENCE / "b200_eager" / "unified_perf_summary.csv.gz").read_bytes()).decode()
    assert "triton_poi_" in expected and tables["unified_perf_summary"].decode() == expected


def test_inductor_arguments_tracelens_cannot_read_are_said(tmp_path) -> None:
    events = [{"ph": "X", "cat": "cpu_op", "name": "triton_poi_fused_add_0", "pid": 1, "tid": 1, "ts": 0, "dur": 5,
               "args": {"Input Dims": [[4]], "Input type": [["float"]], "Concrete Inputs": ["", "4"]}},
              *_launch(1, 1), *_kernel(1, 100, 4)]
    tables, notes = ops_tables(_write(tmp_path / "t.json", events))
    assert "unified_perf_summary" not in tables and "ops_summary" in tables
    assert notes == ["unified_perf_summary not written: TraceLens's Inductor model fails on the arguments of "
                     "triton_poi_fused_add_0"]


def _conv_bias_step(backward_first: bool) -> list[dict]:
    """A ConvBias_ on the main thread and its backward op on the autograd thread, sequence number 7."""
    args = {"Input Dims": [[2, 8, 16, 16], [8, 8, 3, 3], [1, 8, 1, 1], [], []],
            "Input type": ["c10::Half"] * 3 + ["Scalar"] * 2, "Concrete Inputs": ["", "", "", "1", "1"]}
    forward = [{"ph": "X", "cat": "cpu_op", "name": "ConvBias_", "pid": 1, "tid": 1, "ts": 0, "dur": 10,
                "args": {**args, "Sequence number": 7}}, *_launch(1, 2), *_kernel(1, 100, 4)]
    backward = [{"ph": "X", "cat": "cpu_op", "name": "autograd::engine::evaluate_function: ConvBias_Backward",
                 "pid": 1, "tid": 2, "ts": 50, "dur": 12, "args": {"Sequence number": 7}},
                {"ph": "X", "cat": "cpu_op", "name": "ConvBias_Backward", "pid": 1, "tid": 2, "ts": 51, "dur": 10,
                 "args": {"Sequence number": 7}}, *_launch(2, 53, tid=2), *_kernel(2, 200, 6)]
    return backward + forward if backward_first else forward + backward


def test_fused_convolution_backward_reads_what_its_forward_cached_before_it(tmp_path) -> None:
    """TraceLens's backward model reads the forward's parameters from a cache its forward model fills: in
    the sheets, only a forward op earlier in the file counts; in the unified summary, made last, any does."""
    in_order, _ = ops_tables(_write(tmp_path / "a.json", _conv_bias_step(False)))
    backward = dict(zip(*_csv_rows(in_order["CONV_bwd"])[:2]))
    params = conv.conv_bias_params({"Input Dims": [[2, 8, 16, 16], [8, 8, 3, 3]], "Input type": ["c10::Half"] * 2,
                                    "Concrete Inputs": ["", "", "", "1", "1"]})
    assert backward["name"] == "ConvBias_Backward" and backward["param: input_shape"] == "(2, 8, 16, 16)"
    assert float(backward["GFLOPS_first"]) == conv.conv_flops_backward(params) / 1e9
    out_of_order, _ = ops_tables(_write(tmp_path / "b.json", _conv_bias_step(True)))
    assert "CONV_bwd" not in out_of_order and "CONV_fwd" in out_of_order
    unified = [dict(zip(_csv_rows(out_of_order["unified_perf_summary"])[0], row))
               for row in _csv_rows(out_of_order["unified_perf_summary"])[1:]]
    row = next(r for r in unified if r["name"] == "ConvBias_Backward")
    assert row["op category"] == "CONV_bwd" and row["GFLOPS"] == backward["GFLOPS_first"]


ODD_VALUES = [None, "weird", 7, [], [[]], [None], [[2, "x"]], [[1, 2, 3, 4]] * 12, [[0, 0, 0, 0]] * 12, [["[1]"]] * 12,
              ["", "[", "1e9999", "None", "[[1]", "()", "True"] * 2, [[2, 2], [2]], [[1.5, 2], [2, 0.5]]]
MODELS = sorted((sheet, name) for sheet, models in opsheets.MODELS.items() for name in models)


@pytest.mark.parametrize(("sheet", "name"), [*MODELS, ("Inductor", "triton_red_fused_add_sum_0")])
def test_models_on_odd_arguments_fail_as_a_model_or_give_a_row(sheet: str, name: str) -> None:
    """Shapes missing, strings, nested or empty lists, zeros: a model failure (no row, as TraceLens's), or
    numbers; never another exception."""
    model = perfmodels_inductor.triton_compiled if sheet == "Inductor" else opsheets.MODELS[sheet][name]
    models = [model, *([opsheets.BACKWARD_MODELS[name]] if name in opsheets.BACKWARD_MODELS else [])]
    keys = ("Input Dims", "Input type", "Input Strides", "Concrete Inputs")
    for model in models:
        for n, value in enumerate(ODD_VALUES):
            for key in keys:
                args = {k: ODD_VALUES[(n + i) % len(ODD_VALUES)] for i, k in enumerate(keys)}
                args[key] = value
                for given in (args, {k: v for k, v in args.items() if k != key},
                              {**args, conv.FORWARD_ARGS: {k: v for k, v in args.items() if k != key}}):
                    try:
                        model(name, given, [])
                    except opsheets.MODEL_FAILURES:
                        pass

