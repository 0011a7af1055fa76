"""The page's ops section as figures (no browser): which inputs it draws, in which order, and what it says
when there is nothing to draw."""
from __future__ import annotations

from streamtrace.algo.opsfigures import ops_figures


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
