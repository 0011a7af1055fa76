"""analyze --html's lead on collectives: who arrives last, what the others lose waiting, the figures.

Every number is checked against a reading of the CSV files ``analyze -o`` writes, made here with ``csv``:
each matched collective (the ids of nccl_implicit_sync.csv) gathered from nccl_long.csv's kernels, a
rank's wait = the latest start minus its own (TraceLens's definition), the rank waited for = the one
starting last (the lowest on ties), latency = the least duration. Ground truth: the DLRM ranks (rank 7
arrives last; ranks 2 and 6 arrive late too; ranks 1 and 3 wait longest) and synth's slow rank.
"""
from __future__ import annotations

import csv
import json
import math
import os
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pytest
from conftest import TRACES

import streamtrace
from streamtrace.algo import collectivefigures
from streamtrace.synth import SynthConfig, write_traces

DLRM = TRACES / "dlrm_8ranks"
SLOW_RANK = 5
DTYPE_BYTES = {"Float": 4, "BFloat16": 2}  # the dtypes synth writes on its collectives
TOLERANCE = dict(rel=1e-9, abs=1e-6)


@dataclass
class Collective:
    label_id: str
    name: str
    ts: dict[int, float] = field(default_factory=dict)
    dur: dict[int, float] = field(default_factory=dict)
    row: dict = field(default_factory=dict)  # one nccl_long row (the args)

    @property
    def wait(self) -> dict[int, float]:
        latest = max(self.ts.values())
        return {rank: latest - ts for rank, ts in self.ts.items()}

    @property
    def last(self) -> int:
        latest = max(self.ts.values())
        return min(rank for rank, ts in self.ts.items() if ts == latest)

    @property
    def lost(self) -> float:
        return sum(self.wait.values())


def read_csv(path: Path) -> list[dict]:
    with open(path, newline="") as handle:
        return list(csv.DictReader(handle))


def collectives_of(out: Path) -> list[Collective]:
    """The matched collectives, in nccl_implicit_sync's order, from nccl_long's kernels."""
    found: dict[tuple[str, str], Collective] = {}
    for row in read_csv(out / "nccl_long.csv"):
        key = (row["collective_id"], row["Process Group Ranks"])
        collective = found.setdefault(key, Collective(row["collective_id"], row["Collective name"], row=row))
        collective.ts[int(row["rank"])] = float(row["ts"])
        collective.dur[int(row["rank"])] = float(row["dur"])
    return [found[(row["collective_id"], row["Process Group Ranks"])] for row in read_csv(out / "nccl_implicit_sync.csv")]


def costs_of(collectives: list[Collective]) -> dict[int, float]:
    costs: dict[int, float] = {}
    for collective in collectives:
        if collective.lost > 0:
            costs[collective.last] = costs.get(collective.last, 0.0) + collective.lost
    return costs


def label(collective: Collective) -> str:
    return f"{collective.label_id} {collective.name}".strip()


def nan_equal(got: list, expected: list) -> bool:
    return len(got) == len(expected) and all(
        (b is None or math.isnan(b)) and (a is None or math.isnan(a)) if (b is None or math.isnan(b))
        else a is not None and a == pytest.approx(b, **TOLERANCE) for a, b in zip(got, expected))


def run(inputs: Path | list[Path], out: Path) -> tuple[dict, str, dict]:
    summary = streamtrace.analyze(inputs, out_dir=str(out), jobs=1)
    lead, shown = collectivefigures.page(summary)
    return summary, lead, {figure.key: figure for figure in shown}


@pytest.fixture(scope="module")
def slow_run(tmp_path_factory) -> Path:
    """8 ranks in 2 pipeline stages with Kineto's collective args, rank 5 running 1.5x slower."""
    directory = tmp_path_factory.mktemp("slow")
    config = SynthConfig(ranks=8, pp_stages=2, microbatches=2, steps=3, graph_kernels=4, eager_kernels=3, python_noise=0,
                         graph_streams=2, big_ints=False, slow_rank=SLOW_RANK, slow_factor=1.5, collectives=True)
    write_traces(config, directory, compress="none", merged=True)
    assert json.loads((directory / "truth.json").read_text())["slow_rank"]["rank"] == SLOW_RANK
    return directory


def trace_ranks(trace: dict, axis: str) -> list[int]:
    """The ranks of a rank axis (labels ``5`` or ``5 · PP1``); [] for another axis."""
    labels = trace[axis]
    return [int(text.split()[0]) for text in labels] if labels and isinstance(labels, list) and all(
        text.split()[0].isdigit() and (len(text.split()) == 1 or text.split()[1] == "·") for text in labels) else []


def rank_files(directory: Path) -> list[Path]:
    return sorted(directory.glob("rank*_trace.json"))


def check_figures(summary: dict, out: Path, shown: dict, collectives: list[Collective]) -> None:
    """Heat map, wait bars, slowest collectives and why-table against the CSV reading (``out``: analyze's -o)."""
    order = [int(text.split()[0]) for text in shown["collective-waits"].traces[0]["y"]]
    assert sorted(order) == summary["ranks"]
    (heat,) = shown["collective-waits"].traces
    by_label = {label(collective): collective for collective in collectives}
    assert heat["x"] == [label(collective) for collective in collectives]  # (all of them, in the order they ran)
    for column, text in enumerate(heat["x"]):
        wait = by_label[text].wait
        assert nan_equal([row[column] for row in heat["z"].tolist()],
                         [wait[rank] / 1e3 if rank in wait else math.nan for rank in order]), text

    totals = {rank: sum(c.wait.get(rank, 0.0) for c in collectives) for rank in order}
    stacked = [sum(trace["y"][at] for trace in shown["collective-wait-ranks"].traces if not math.isnan(trace["y"][at]))
               for at in range(len(order))]
    assert stacked == pytest.approx([totals[rank] / 1e3 for rank in order], **TOLERANCE)
    tracelens = {int(row["rank"]): float(row["total_wait_time_us"]) for row in read_csv(out / "straggler_summary.csv")}
    assert all(tracelens[rank] == pytest.approx(totals[rank], abs=0.05) for rank in order)  # (TraceLens rounds to 0.1)
    costs = costs_of(collectives)
    for trace in shown["collective-wait-ranks"].traces:
        if trace["name"].startswith("waiting for rank "):
            waited = int(trace["name"].split()[-1])
            expected = [sum(c.wait.get(rank, 0.0) for c in collectives if c.last == waited) / 1e3 for rank in order]
            assert trace["y"].tolist() == pytest.approx(expected, **TOLERANCE)
    named = [int(trace["name"].split()[-1]) for trace in shown["collective-wait-ranks"].traces
             if trace["name"].startswith("waiting for rank ")]
    assert named == sorted(costs, key=lambda rank: (-costs[rank], rank))[:len(named)]

    bars = shown["collective-slowest"].traces[0]
    latency = sorted(((min(c.dur.values()), label(c)) for c in collectives), key=lambda item: -item[0])[:20]
    assert bars["y"] == [text for _, text in latency]
    assert bars["x"].tolist() == pytest.approx([value for value, _ in latency], **TOLERANCE)
    cut = f"The 20 of {len(collectives)} matched" if len(collectives) > 20 else f"The {len(collectives)} matched"
    assert shown["collective-slowest"].caption.startswith(cut + " collectives with the longest latency")

    table = shown["collective-why"].table
    assert [int(row[0]) for row in table[1:]] == sorted(costs, key=lambda rank: (-costs[rank], rank))
    assert [row[2] for row in table[1:]] == [f"{costs[int(row[0])] / 1e3:,.1f} ms" for row in table[1:]]


def test_dlrm_page_names_rank_7_and_what_the_others_lose(tmp_path):
    summary, lead, shown = run(DLRM, tmp_path)
    collectives = collectives_of(tmp_path)
    assert len(collectives) == 8
    costs = costs_of(collectives)
    assert max(costs, key=costs.get) == 7
    total = sum(c.lost for c in collectives)
    assert lead.startswith(f"Rank 7 arrives last at {sum(c.last == 7 for c in collectives)} of 8 matched collectives, "
                           f"and the other ranks lose {costs[7] / 1e3:,.1f} ms waiting for it there "
                           f"({100 * costs[7] / total:.0f}% of the {total / 1e3:,.1f} ms")
    own = {rank: sum(c.wait[rank] for c in collectives) for rank in range(8)}
    latest = sorted(own, key=lambda rank: (own[rank], rank))[:3]
    assert latest == [7, 2, 6]  # (the reading of these ranks)
    latest_words = lead.split("Least total wait (they arrive latest): ")[1].split(";")[0]
    assert [int(part.split()[1]) for part in latest_words.split(", ")] == latest
    assert lead.split("; most: ")[1].startswith("rank 1 (")  # rank 1 waits longest (7.6 ms at the first collective)
    assert "host-bound" in lead
    check_figures(summary, tmp_path, shown, collectives)
    assert "size" in shown["collective-slowest"].callout  # DLRM's kernels carry no collective args: no bandwidth
    assert len(shown["collective-slowest"].traces) == 1


@pytest.mark.slow
def test_slow_rank_is_named_first_with_its_cause(slow_run, tmp_path):
    summary, lead, shown = run(rank_files(slow_run), tmp_path)
    collectives = collectives_of(tmp_path)
    assert lead.startswith(f"Rank {SLOW_RANK} arrives last at ")
    assert f"lose {costs_of(collectives)[SLOW_RANK] / 1e3:,.1f} ms waiting for it" in lead
    assert "slower GPU" in lead
    check_figures(summary, tmp_path, shown, collectives)
    table = shown["collective-why"].table
    assert table[1][0] == str(SLOW_RANK) and table[1][-1].startswith("slower GPU")

    bars, dots = shown["collective-slowest"].traces
    by_label = {label(c): c for c in collectives}
    for text, bus in zip(dots["y"], dots["x"].tolist()):
        c = by_label[text]
        n = int(c.row["Group size"])
        gathers = "allgather" in c.name
        size = int(c.row["Out msg nelems" if gathers else "In msg nelems"]) * DTYPE_BYTES[c.row["dtype"]]
        factor = 2 * (n - 1) / n if "allreduce" in c.name else (n - 1) / n  # nccl-tests' bus factors
        assert bus == pytest.approx(size / (min(c.dur.values()) / 1e6) / 1e9 * factor, rel=1e-9), text

    _, merged_lead, merged = run(slow_run / "merged_trace.json", tmp_path / "merged")  # the same run in one file
    assert merged_lead == lead
    for key, figure in shown.items():
        assert (merged[key].caption, merged[key].table, len(merged[key].traces)) == (figure.caption, figure.table,
                                                                                     len(figure.traces)), key
        for mine, theirs in zip(figure.traces, merged[key].traces):
            assert set(mine) == set(theirs), key
            for name, value in mine.items():
                if hasattr(value, "tolist"):
                    np.testing.assert_array_equal(value, theirs[name])
                elif name in ("x", "y") and trace_ranks(mine, name):  # (a merged file states no pipeline stages)
                    assert trace_ranks(mine, name) == trace_ranks(theirs, name), key
                else:
                    assert value == theirs[name], (key, name)


@pytest.mark.slow
def test_heat_map_keeps_the_collectives_with_the_most_wait(slow_run, tmp_path, monkeypatch):
    monkeypatch.setattr(collectivefigures, "HEATMAP_COLLECTIVES", 5)
    summary, _, shown = run(rank_files(slow_run), tmp_path)
    collectives = collectives_of(tmp_path)
    most = sorted(range(len(collectives)), key=lambda at: -collectives[at].lost)[:5]
    assert shown["collective-waits"].traces[0]["x"] == [label(collectives[at]) for at in sorted(most)]
    assert f"The 5 of {len(collectives)} collectives with the most wait" in shown["collective-waits"].caption


def test_one_rank_and_no_collectives(tmp_path):
    """One rank's collectives: said, nothing drawn; an input without collectives: no section."""
    summary = streamtrace.analyze(TRACES / "nccl_rank0.json.gz", jobs=1)
    lead, shown = collectivefigures.page(summary)
    assert lead == "" and [figure.key for figure in shown] == ["collective-waits"]
    assert "one rank's (rank 0)" in shown[0].missing and not shown[0].traces
    plain = tmp_path / "plain.json"
    plain.write_text(json.dumps({"traceEvents": [{"ph": "X", "cat": "kernel", "name": "gemm", "pid": 1, "tid": 7, "ts": 10,
                                                  "dur": 5, "args": {"stream": 7, "correlation": 1}}]}))
    assert collectivefigures.page(streamtrace.analyze(plain, jobs=1)) == ("", [])


@pytest.mark.slow
def test_the_page_opens_with_the_lead_and_its_numbers(slow_run, tmp_path):
    """The page in Chromium: the lead above the header's facts, the collective figures first, their data as
    plotly holds it equal to the CSV reading."""
    pytest.importorskip("plotly")
    pytest.importorskip("playwright")
    report_screenshots = pytest.importorskip("report_screenshots")
    if not os.access(report_screenshots.CHROMIUM, os.X_OK):
        pytest.skip(f"no Chromium at {report_screenshots.CHROMIUM}")
    page = tmp_path / "page.html"
    summary = streamtrace.analyze(rank_files(slow_run), out_dir=str(tmp_path / "out"), html=str(page), jobs=1)
    collectives = collectives_of(tmp_path / "out")
    with report_screenshots.browser() as chromium:
        found = report_screenshots.open_report(chromium, page)
    assert found["errors"] == [] and found["requests"] == []
    assert found["texts"]["lead-collectives"].startswith(f"Rank {SLOW_RANK} arrives last at ")
    html = page.read_text()
    assert html.index('id="lead-collectives"') < html.index('class="facts"')
    assert list(found["figures"])[:3] == ["collective-waits", "collective-wait-ranks", "collective-slowest"]
    order = [int(text.split()[0]) for text in found["figures"]["collective-waits"]["traces"][0]["y"]]
    heat = found["figures"]["collective-waits"]["traces"][0]
    by_label = {label(c): c for c in collectives}
    for column, text in enumerate(heat["x"]):
        wait = by_label[text].wait
        assert nan_equal([row[column] for row in heat["z"]], [wait[rank] / 1e3 if rank in wait else math.nan
                                                             for rank in order]), text
    (table,) = found["tables"].values()
    assert table[1][0] == str(SLOW_RANK) and table[1][-1].startswith("slower GPU")
    assert len(table) - 1 == len(costs_of(collectives)) == 1  # (rank 5 alone makes the others wait)
    assert summary["tables"]["straggler_summary"][0]["rank"] == SLOW_RANK


def test_ranks_that_start_together_are_said_to(tmp_path):
    """Data-parallel ranks in lockstep (synth without a slow rank): no rank waits, said in the lead and instead
    of the per-rank and why figures; the heat map is all zeros."""
    config = SynthConfig(ranks=4, pp_stages=1, microbatches=1, steps=3, graph_kernels=0, eager_kernels=2, python_noise=0,
                         graph_streams=1, big_ints=False)
    write_traces(config, tmp_path / "dp", compress="none", merged=False)
    _, lead, shown = run(tmp_path / "dp", tmp_path / "out")
    collectives = collectives_of(tmp_path / "out")
    assert collectives and all(c.lost == 0 for c in collectives)
    assert lead == f"At the {len(collectives)} matched collectives, no rank waits for another: every rank starts each " \
                   "matched collective at the same time."
    assert shown["collective-waits"].traces[0]["z"].tolist() == [[0.0] * len(collectives)] * 4
    for key in ("collective-wait-ranks", "collective-why"):
        assert shown[key].missing.startswith("no rank waits for another") and not shown[key].traces


def test_what_the_matching_cannot_vouch_for_is_said_over_the_heat_map(tmp_path):
    """Pipeline send/recv without collective args, matched by order alone (TraceLens's rule): some pairs end on
    one rank before they start on another, which the summary's note says; the heat map says it too."""
    config = SynthConfig(ranks=4, pp_stages=2, microbatches=2, steps=3, graph_kernels=0, eager_kernels=2, python_noise=0,
                         graph_streams=1, big_ints=False, slow_rank=1, slow_factor=1.6)
    write_traces(config, tmp_path / "pp", compress="none", merged=False)
    summary, _, shown = run(tmp_path / "pp", tmp_path / "out")
    collectives = collectives_of(tmp_path / "out")
    crossed = [c for c in collectives if max(c.ts.values()) > min(ts + c.dur[rank] for rank, ts in c.ts.items())]
    assert crossed
    callout = shown["collective-waits"].callout
    assert callout.startswith(f"Collectives: {len(crossed)} of {len(collectives)} matched collectives end on one rank "
                              "before they start on another")
    assert "waits and skews carry that error" in callout
