"""The page's ops section as figures (no browser): which inputs it draws, in which order, and what it says
when there is nothing to draw."""
from __future__ import annotations

from streamtrace.algo.opsfigures import ops_figures, page_part
from streamtrace.algo.opstables import Table


def _part(spec: dict | None = None) -> dict:
    return {"spec": spec, "how": "the trace has no deviceProperties", "top_ops": [], "points": []}


def test_ranks_in_rank_order_and_the_rest_said() -> None:
    parts = {label: _part() for label in ("rank10", "rank2", "rank0", "merged", "rank1", "rank3")}
    figures = ops_figures({"ops": parts})
    assert [figure.title.split(": ")[1] for figure in figures[::2]] == ["rank0", "rank1", "rank2", "rank3"]
    assert figures[-1].caption.endswith("The page draws the first 4 of 6 inputs; DIR/ops/ has them all.")
    assert figures[0].missing.startswith("no op launched a kernel")
    assert figures[1].missing == "no GPU spec, so no roofs: the trace has no deviceProperties; give --gpu-spec FILE"


def test_no_ops_no_section() -> None:
    assert ops_figures({"tables": {}}) == []


def test_a_spec_file_without_a_name_is_drawn_unnamed() -> None:
    """--gpu-spec needs only mem_bw_gbps and max_achievable_tflops (TraceLens's reading)."""
    sheet = Table([["name", "FLOPS/Byte_first", "GFLOPS_first", "Kernel Time (µs)_mean", "Compute Spec",
                    "roofline time (us)", "roofline bound", "% of roofline"]],
                  [["aten::mm", 10.0, 2.0, 4.0, "matrix_bf16", 1.0, "COMPUTE_BOUND", 25.0]])
    part = page_part({"GEMM": sheet}, {"mem_bw_gbps": 1000, "max_achievable_tflops": {"matrix_bf16": 100}},
                     "from the file s.json (--gpu-spec)")
    assert part["spec"]["name"] == "(unnamed)"
    assert part["points"] == [{"sheet": "GEMM", "name": "aten::mm", "intensity": 10.0, "tflops": 2.0 / 4.0 * 1e3,
                               "compute": "matrix_bf16", "pct": 25.0}]  # 2 GFLOP in 4 us: 500 TFLOP/s
    _, roofline = ops_figures({"ops": {"rank0": part}})
    assert "(unnamed)" in roofline.caption and not roofline.missing
