"""Collectives matched across ranks beyond TraceLens's order rule (algo.collectivematch): by Kineto's
``Seq``, send/recv paired with their peer, truncated group ranks rebuilt from pg_config, clocks aligned
on collective ends, and inputs that lie (a kernel missing on a rank, args missing or odd) giving notes,
never a wrong match.  Oracles: plain code over json.load of small generated or hand-built traces."""
from __future__ import annotations

import json
import statistics
import tracemalloc
from pathlib import Path

import numpy as np
import pytest

from streamtrace.algo import collectivematch, collectivereport, groupagg
from streamtrace.algo import collectives as algo
from streamtrace.commands.analyze import analyze
from streamtrace.io import valuespill
from streamtrace.synth import SynthConfig, write_traces

SMALL = dict(steps=2, microbatches=2, eager_kernels=2, graph_kernels=4, python_noise=0, collectives=True, big_ints=False)
P2P = ("send", "recv")


def generate(directory: Path, **options) -> list[Path]:
    """A small generated run's rank files (plain JSON, so that tests can edit them)."""
    truth = write_traces(SynthConfig(**{**SMALL, **options}), directory, compress="none", merged=False)
    return [directory / rank["file"] for rank in truth["ranks"]]


def load(path: Path) -> dict:
    return json.loads(path.read_text())


def nccl(doc: dict) -> list[dict]:
    return [event for event in doc["traceEvents"] if event.get("cat") == "kernel" and "Collective name" in event["args"]]


def edit(path: Path, keep=lambda event: True, change=lambda event: None) -> None:
    """Rewrite a rank file: its NCCL kernels that ``keep`` refuses dropped, ``change`` applied to the others."""
    doc = load(path)
    events = []
    for event in doc["traceEvents"]:
        if event.get("cat") == "kernel" and "Collective name" in event.get("args", {}):
            if not keep(event):
                continue
            change(event)
        events.append(event)
    doc["traceEvents"] = events
    path.write_text(json.dumps(doc))


def by_seq(files: list[Path]) -> dict[tuple[str, int], dict[int, dict]]:
    """The oracle's matching: (group, Seq) -> rank -> kernel, send/recv left out."""
    found: dict[tuple[str, int], dict[int, dict]] = {}
    for rank, path in enumerate(files):
        for event in nccl(load(path)):
            args = event["args"]
            if args["Collective name"] not in P2P:
                found.setdefault((args["Process Group Name"], args["Seq"]), {})[rank] = event
    return found


def matches(summary: dict) -> dict[tuple[str, int], dict]:
    return {(row["Process Group Name"], row["Seq"]): row for row in summary["tables"]["collective_matches"]}


@pytest.fixture(scope="module")
def fsdp(tmp_path_factory) -> list[Path]:
    """4 ranks of one stage: all-gathers, reduce-scatters (groups of 2), all-reduces, all_to_allv (world)."""
    return generate(tmp_path_factory.mktemp("fsdp"), ranks=4, pp_stages=1, slow_rank=2, slow_factor=1.3, seed=3)


def test_seq_matching_as_the_args_say(fsdp):
    """Every generated kernel carries Seq: each collective_matches row is the kernels of one (group, Seq)."""
    oracle = by_seq(fsdp)
    rows = matches(analyze(fsdp))
    assert set(rows) == set(oracle)
    for key, kernels in oracle.items():
        row = rows[key]
        starts = {rank: event["ts"] for rank, event in kernels.items()}
        assert row["match"] == "Seq" and row["ranks"] == len(kernels) and row["ranks missing"] == 0
        assert row["wait for last (us)"] == pytest.approx(max(starts.values()) - min(starts.values()))
        assert row["last arrival rank"] == min(rank for rank, ts in starts.items() if ts == max(starts.values()))
        assert row["latency (us)"] == pytest.approx(min(event["dur"] for event in kernels.values()))


def test_a_kernel_missing_on_one_rank_shifts_nothing(fsdp, tmp_path):
    """Rank 1 loses its first all-reduce: by Seq, that collective has 3 ranks (rank 1 missing) and every later
    one still pairs the right kernels; TraceLens's order rule (its tables) pairs the following ones wrong."""
    files = [tmp_path / path.name for path in fsdp]
    for source, target in zip(fsdp, files):
        target.write_text(source.read_text())
    first = min(event["args"]["Seq"] for event in nccl(load(files[1])) if event["args"]["Collective name"] == "allreduce")
    edit(files[1], keep=lambda event: not (event["args"]["Collective name"] == "allreduce"
                                           and event["args"]["Seq"] == first))
    oracle = by_seq(files)
    summary = analyze(files)
    rows = matches(summary)
    assert set(rows) == set(oracle)
    gone = rows[("0", first)]
    assert gone["ranks"] == 3 and gone["ranks missing"] == 1 and gone["missing ranks"] == "1"
    for key, kernels in oracle.items():
        starts = [event["ts"] for event in kernels.values()]
        assert rows[key]["wait for last (us)"] == pytest.approx(max(starts) - min(starts))
    assert not any("not by Seq" in note or "--align-clocks" in note for note in summary["notes"])
    assert any("1 of 10 matched collectives end on one rank before they start on another" in note
               for note in summary["notes"])  # (TraceLens's order rule pairs an all-reduce with an all_to_allv)
    lines = dict(__import__("streamtrace.cli.analyze", fromlist=["rows"]).rows(summary))
    assert lines["matched"].startswith(f"{len(oracle)} collectives by Seq")


def test_a_rank_from_another_step_or_missing_is_never_paired_wrong(fsdp, tmp_path):
    """Rank 3 traced over a later window (its Seqs 100 further on): no collective pairs its kernels with the
    others', each of its collectives is a row of its own (the others' lack it); without rank 3 at all, every
    collective of the world and FSDP groups says rank 3 is missing."""
    files = [tmp_path / path.name for path in fsdp]
    for source, target in zip(fsdp, files):
        target.write_text(source.read_text())
    edit(files[3], change=lambda event: event["args"].update(Seq=event["args"]["Seq"] + 100))
    rows = analyze(files)["tables"]["collective_matches"]
    oracle = by_seq(fsdp)
    assert len(rows) == 2 * len(oracle)
    for row in rows:
        alone = row["Seq"] > 100
        assert (row["ranks"], row["missing ranks"]) == ((1, "0-2") if alone else (3, "3"))
    rows = analyze(fsdp[:3])["tables"]["collective_matches"]
    assert len(rows) == len(oracle) and {(row["ranks"], row["missing ranks"]) for row in rows} == {(3, "3")}


def test_without_seq_order_rows_only_where_counts_agree(fsdp, tmp_path):
    """No Seq (older traces): matched by order; a group whose ranks hold different numbers
    of kernels is left out of collective_matches with a note rather than paired wrong."""
    files = [tmp_path / path.name for path in fsdp]
    for source, target in zip(fsdp, files):
        target.write_text(source.read_text())
        edit(target, change=lambda event: event["args"].pop("Seq"))
    rows = analyze(files)["tables"]["collective_matches"]
    assert {row["match"] for row in rows} == {"order"} and len(rows) == len(by_seq(fsdp))
    edit(files[1], keep=lambda event: event["args"]["Collective name"] != "allreduce" or event["ts"] != min(
        e["ts"] for e in nccl(load(files[1])) if e["args"]["Collective name"] == "allreduce"))
    summary = analyze(files)
    groups = {row["Process Group Name"] for row in summary["tables"]["collective_matches"]}
    assert groups == {"1"}  # (the FSDP group; the world group "0" left out)
    assert any("group 0 (no Seq, different numbers of kernels per rank) left out of collective_matches" in note
               for note in summary["notes"])


def rank_kernels(rank: int, metas: list[tuple], seqs: list[int], peers: list[int] | None = None,
                 groups: dict | None = None) -> algo.RankKernels:
    count = len(seqs)
    return algo.RankKernels(rank, np.arange(count, dtype=np.float64) * 100 + rank, np.full(count, 5.0),
                            np.arange(count, dtype=np.int32), metas, np.array(seqs, dtype=np.int64),
                            np.array(peers if peers is not None else [-1] * count, dtype=np.int32), groups or {})


ALLREDUCE = ("0", "[0, 1]", "allreduce", 2, "Float", 8, 8, "[]", "[]", 7)


def test_seq_refused_where_it_would_mislead():
    """Seq is used only when it can be trusted: kernels of one Seq with different sizes, a Seq twice on a
    rank, or send/recv counted in the collectives' Seq (older PyTorch) fall back to order, with a note."""
    bigger = ALLREDUCE[:5] + (16, 16) + ALLREDUCE[7:]
    cases = {
        "kernels of one Seq whose args differ": ([ALLREDUCE, bigger], [1, 2], [bigger, ALLREDUCE], [1, 2]),
        "a rank holding one Seq twice": ([ALLREDUCE, ALLREDUCE], [1, 1], [ALLREDUCE, ALLREDUCE], [1, 2]),
        "Seq on 3 of 4 kernels": ([ALLREDUCE, ALLREDUCE], [1, 2], [ALLREDUCE, ALLREDUCE], [1, -1]),
    }
    for words, (metas0, seqs0, metas1, seqs1) in cases.items():
        report = collectivereport.report([rank_kernels(0, metas0, seqs0), rank_kernels(1, metas1, seqs1)])
        assert {row[3] for row in report.tables.get("collective_matches", algo.Table([], [])).rows} <= {"order"}
        assert any(words in note for note in report.notes), report.notes
    send = ("0", "[0, 1]", "send", 2, "Float", 8, 8, "[]", "[]", 7)
    recv = ("0", "[0, 1]", "recv", 2, "Float", 8, 8, "[]", "[]", 7)
    report = collectivereport.report([rank_kernels(0, [ALLREDUCE, send, ALLREDUCE], [1, 2, 3], [-1, 1, -1]),
                                      rank_kernels(1, [ALLREDUCE, recv, ALLREDUCE], [1, 2, 3], [-1, 0, -1])])
    assert any("send/recv counted in the same Seq" in note for note in report.notes)
    assert report.tables["p2p_pairs"].rows[0][1:4] == [0, 1, 0]
    # a shared count, the send before the first all-reduce: ranks 0 and 1 number their all-reduces 2, 3, rank 2 1, 2
    group = ("0", "[0, 1, 2]", "allreduce", 3, "Float", 8, 8, "[]", "[]", 7)
    send, recv = ("0", "[0, 1, 2]", "send") + group[3:], ("0", "[0, 1, 2]", "recv") + group[3:]
    report = collectivereport.report([rank_kernels(0, [send, group, group], [1, 2, 3], [1, -1, -1]),
                                      rank_kernels(1, [recv, group, group], [1, 2, 3], [0, -1, -1]),
                                      rank_kernels(2, [group, group], [1, 2])])
    assert {row[3] for row in report.tables["collective_matches"].rows} == {"order"}
    assert any("whose ranks hold different Seqs" in note for note in report.notes)
    separate = collectivereport.report([rank_kernels(0, [send, group, group], [1, 1, 2], [1, -1, -1]),
                                        rank_kernels(1, [recv, group, group], [1, 1, 2], [0, -1, -1]),
                                        rank_kernels(2, [group, group], [1, 2])])  # (send/recv counted apart)
    assert {row[3] for row in separate.tables["collective_matches"].rows} == {"Seq"}


@pytest.fixture(scope="module")
def pipeline(tmp_path_factory) -> list[Path]:
    """4 ranks in 2 pipeline stages: send/recv with Dst Rank / Src Rank between the stages."""
    return generate(tmp_path_factory.mktemp("pp"), ranks=4, pp_stages=2, seed=5)


def p2p_oracle(files: list[Path]) -> dict[tuple[int, int, int], tuple[dict, dict]]:
    """(src, dst, k) -> the k-th send from src to dst and the k-th recv on dst from src, by start."""
    sends: dict[tuple[int, int], list[dict]] = {}
    recvs: dict[tuple[int, int], list[dict]] = {}
    for rank, path in enumerate(files):
        for event in nccl(load(path)):
            args = event["args"]
            if args["Collective name"] == "send":
                sends.setdefault((rank, args["Dst Rank"]), []).append(event)
            elif args["Collective name"] == "recv":
                recvs.setdefault((args["Src Rank"], rank), []).append(event)
    return {(src, dst, k): pair for (src, dst), sent in sends.items()
            for k, pair in enumerate(zip(sorted(sent, key=lambda e: e["ts"]),
                                         sorted(recvs[(src, dst)], key=lambda e: e["ts"])))}


def test_send_recv_paired_with_their_peer(pipeline):
    oracle = p2p_oracle(pipeline)
    rows = analyze(pipeline)["tables"]["p2p_pairs"]
    assert len(rows) == len(oracle) > 0
    assert {row["node_span"] for row in rows} == {"intra_node"}  # (4 GPUs per node in the generated files)
    for row in rows:
        send, recv = oracle[(row["src rank"], row["dst rank"], row["index"])]
        assert (row["send ts"], row["recv ts"]) == (send["ts"], recv["ts"])
        assert row["wait (us)"] == pytest.approx(abs(send["ts"] - recv["ts"]))
        assert row["waiting rank"] == (row["src rank"] if send["ts"] < recv["ts"] else row["dst rank"])
        assert row["size (bytes)"] == send["args"]["In msg nelems"] * 2  # BFloat16
        assert row["latency (us)"] == min(send["dur"], recv["dur"])


@pytest.mark.slow
def test_send_recv_across_nodes(tmp_path):
    """16 ranks in 2 stages, 8 GPUs per file: each pipeline joins rank r and r + 8, on two nodes."""
    rows = analyze(generate(tmp_path, ranks=16, pp_stages=2, seed=4))["tables"]["p2p_pairs"]
    assert rows and all(abs(row["src rank"] - row["dst rank"]) == 8 and row["node_span"] == "inter_node" for row in rows)


def test_uneven_send_recv_left_unpaired(pipeline, tmp_path):
    """Rank 2 loses a recv from rank 0: the pair 0->2 is not paired (which recv went missing cannot be
    told), the other pairs are; a send/recv without a peer arg is counted in a note."""
    files = [tmp_path / path.name for path in pipeline]
    for source, target in zip(pipeline, files):
        target.write_text(source.read_text())
    recvs = [event["ts"] for event in nccl(load(files[2])) if event["args"]["Collective name"] == "recv"]
    edit(files[2], keep=lambda event: event["ts"] != recvs[1])
    edit(files[3], change=lambda event: event["args"].pop("Src Rank", None))
    oracle = p2p_oracle(pipeline)
    summary = analyze(files)
    pairs = {(row["src rank"], row["dst rank"]) for row in summary["tables"]["p2p_pairs"]}
    assert pairs == {(src, dst) for src, dst, _ in oracle} - {(0, 2), (1, 3)}
    notes = " ".join(summary["notes"])
    assert "send/recv between 2 pairs of ranks are not paired" in notes and "0->2" in notes
    assert "without a Dst Rank/Src Rank arg" in notes


def test_truncated_group_ranks_rebuilt_from_pg_config(tmp_path):
    """A 40-rank group whose Process Group Ranks Kineto truncated: rebuilt from distributedInfo.pg_config
    (2 ranks present, 38 missing; ranks 0-7 and 32-39 on different nodes); without pg_config, unknown."""
    members = list(range(40))
    shown = "[" + ", ".join(map(str, members[:29])) + ", ..., 39]"
    for rank in (0, 1):
        kernel = {"ph": "X", "cat": "kernel", "name": "ncclDevKernel_AllReduce_Sum_f32_RING_LL", "pid": rank, "tid": 7,
                  "ts": 10.0 + rank, "dur": 5.0,
                  "args": {"stream": 7, "correlation": 1, "Collective name": "allreduce", "Process Group Name": "0",
                           "Process Group Ranks": shown, "Group size": 40, "dtype": "Float", "In msg nelems": 1024,
                           "Out msg nelems": 1024, "In split size": "[]", "Out split size": "[]", "Seq": 1}}
        info = {"rank": rank, "world_size": 40, "pg_config": [{"pg_name": "0", "pg_size": 40, "ranks": members}]}
        (tmp_path / f"rank{rank}.json").write_text(json.dumps({
            "distributedInfo": info, "deviceProperties": [{"id": n} for n in range(8)], "traceEvents": [kernel]}))
    rows = analyze([tmp_path / "rank0.json", tmp_path / "rank1.json"])["tables"]
    row = rows["collective_matches"][0]
    assert row["Process Group Ranks"] == str(members) and row["ranks missing"] == 38 and row["missing ranks"] == "2-39"
    assert row["node_span"] == "inter_node" and rows["collective_bandwidth"][0]["ranks missing"] == 38
    assert collectivematch.group_ranks(shown, 40, {}, "0") is None
    assert collectivematch.group_ranks(shown, 40, {"0": tuple(range(1, 41))}, "0") is None  # (disagrees with the shown)
    assert collectivematch.group_ranks(shown, 41, {"0": tuple(members)}, "0") is None
    assert collectivematch.group_ranks("[3, 5]", 2, {}, "0") == (3, 5)
    known = {"0": tuple(members)}
    for odd in ("[1, 2", "[0, x]", "[-1, 2]", "[0, 1, ...]", "[..., 39]", "{'ranks': [0]}", 7, None, [0, "1"]):
        assert collectivematch.group_ranks(odd, 40, known, "0") is None, odd


@pytest.mark.parametrize("reading", ["projected", "dict"])
def test_truncated_group_ranks_rebuilt_from_global_rank_stride(tmp_path, monkeypatch, reading):
    """No pg_config: the record_param_comms op's Global rank start and stride (64 ranks 0, 2, ..., 126)
    rebuild the truncated list, whichever way the pass reads the events."""
    from streamtrace.commands.analyses import index as analyze_index

    if reading == "dict":
        monkeypatch.setattr(analyze_index, "projected_events", lambda text: None)
    members = list(range(0, 128, 2))
    shown = "[" + ", ".join(map(str, members[:29])) + ", ..., 126]"
    comms = {"Collective name": "allreduce", "Process Group Name": "7", "Process Group Ranks": shown, "Group size": 64,
             "dtype": "Float", "In msg nelems": 1024, "Out msg nelems": 1024, "In split size": "[]",
             "Out split size": "[]"}
    for rank in (0, 2):
        op = {"ph": "X", "cat": "cpu_op", "name": "record_param_comms", "pid": 100, "tid": 100, "ts": 5.0, "dur": 1.0,
              "args": {**comms, "External id": 3, "Global rank start": 0, "Global rank stride": 2, "Rank": rank}}
        kernel = {"ph": "X", "cat": "kernel", "name": "ncclDevKernel_AllReduce_Sum_f32_RING_LL", "pid": 0, "tid": 7,
                  "ts": 10.0 + rank, "dur": 5.0, "args": {**comms, "stream": 7, "correlation": 1, "External id": 3}}
        (tmp_path / f"rank{rank}.json").write_text(json.dumps({
            "distributedInfo": {"rank": rank}, "deviceProperties": [{"id": n} for n in range(8)],
            "traceEvents": [op, kernel]}))
    row = analyze([tmp_path / "rank0.json", tmp_path / "rank2.json"])["tables"]["collective_matches"][0]
    assert row["Process Group Ranks"] == str(members) and row["ranks missing"] == 62
    assert row["missing ranks"] == ", ".join(str(rank) for rank in members if rank not in (0, 2))
    assert collectivematch.strided_ranks(0, 0, 4) is None and collectivematch.strided_ranks(3, 1, 2) == (3, 4)


@pytest.mark.slow
def test_32_ranks_truncated_by_kineto_rebuilt_in_merged_and_rank_files(tmp_path):
    """32 generated ranks: Kineto's truncated lists on the kernels, the whole group rebuilt from pg_config,
    or without distributedInfo from the record_param_comms ops' stride; the merged file read by two
    processes gives the rank files' tables."""
    truth = write_traces(SynthConfig(**{**SMALL, "ranks": 32, "pp_stages": 1, "seed": 2}), tmp_path, compress="none")
    merged = tmp_path / truth["merged"]["file"]
    doc = load(merged)
    shown = {event["args"]["Process Group Ranks"] for event in nccl(doc)}
    assert all(", ..., 31]" in value for value in shown)
    tables = analyze(merged, jobs=2)["tables"]
    assert {row["Process Group Ranks"] for row in tables["collective_matches"]} == {str(list(range(32)))}
    assert {row["ranks missing"] for row in tables["collective_matches"]} == {0}
    files = [tmp_path / rank["file"] for rank in truth["ranks"]]
    assert analyze(files)["tables"]["collective_matches"] == tables["collective_matches"]
    del doc["distributedInfo"]
    merged.write_text(json.dumps(doc))
    assert analyze(merged, jobs=2)["tables"]["collective_matches"] == tables["collective_matches"]


def test_dict_reading_gives_the_same_matches(fsdp, pipeline, monkeypatch):
    """Chunks the projection refuses are read as dicts: the same Seq, peers and tables."""
    from streamtrace.commands.analyses import index as analyze_index

    projected = [analyze(files)["tables"] for files in (fsdp, pipeline)]
    monkeypatch.setattr(analyze_index, "projected_events", lambda text: None)
    read = [analyze(files)["tables"] for files in (fsdp, pipeline)]
    for ours, theirs in zip(projected, read):
        assert ours["collective_matches"] == theirs["collective_matches"] and ours.get("p2p_pairs") == theirs.get("p2p_pairs")


def test_clocks_aligned_on_collective_ends(tmp_path):
    """Ranks whose clocks start 3 ms apart (synth's --base-skew-ns: rank r's times read r x 3 ms early):
    collectives end on one rank before they start on another, a note offers --align-clocks; aligned, the
    offsets are the skew (within the few us NCCL's ends differ) and no such collective is left."""
    skew_us = 3000.0
    files = generate(tmp_path / "skew", ranks=4, pp_stages=1, seed=3, base_skew_ns=int(skew_us * 1000))
    notes = analyze(files)["notes"]
    assert any("--align-clocks aligns" in note for note in notes)
    summary = analyze(files, align_clocks=True)
    offsets = {row["rank"]: row["clock offset (us)"] for row in summary["tables"]["clock_offsets"]}
    assert offsets.keys() == {0, 1, 2, 3}
    for rank, offset in offsets.items():
        assert offset == pytest.approx(-rank * skew_us, abs=20.0)
    note = next(note for note in summary["notes"] if "clocks aligned" in note)
    assert "before, 0 after" in note and " 0 before" not in note
    same_clock = generate(tmp_path / "plain", ranks=4, pp_stages=1, seed=3)
    summary = analyze(same_clock, align_clocks=True)
    assert any("0 before, 0 after (the clocks did not need it)" in note for note in summary["notes"])
    assert max(abs(row["clock offset (us)"]) for row in summary["tables"]["clock_offsets"]) < 20.0


def _spans(count: int, rng: np.random.Generator | None = None):
    """``count`` collectives over 4 ranks whose clocks read 0, 5, 10 and 15 us late (with noise from ``rng``)."""
    for at in range(count):
        noise = rng.normal(0, 3, 4) if rng is not None else np.zeros(4)
        yield collectivematch.Span([0, 1, 2, 3], [at * 100.0] * 4, [at * 100.0 + 50 + 5 * rank + noise[rank]
                                                                     for rank in range(4)])


def test_clock_offsets_are_the_medians_wherever_the_differences_are(tmp_path):
    """The offsets are statistics.median's of the ends' differences, with the differences in memory and in a
    spilled column (every value on disk); their count of collectives beside them."""
    rng = np.random.default_rng(5)
    spans = list(_spans(1_001, rng))
    expected = {rank: statistics.median(span.ends[rank] - span.ends[0] for span in spans) for rank in range(1, 4)}
    spill = valuespill.ValueSpill(str(tmp_path), budget=0)
    try:
        for column in (groupagg.MemoryColumn, spill.column):
            offsets = collectivematch.clock_offsets(iter(spans), column)
            assert offsets == {0: (0.0, 0), **{rank: (expected[rank], 1_001) for rank in range(1, 4)}}
    finally:
        spill.close()
    assert not list(tmp_path.iterdir())


@pytest.mark.slow  # (tracemalloc)
def test_clock_offsets_hold_no_difference_in_memory(tmp_path, monkeypatch):
    """With a spilled column (8 KB in memory) read back 1,024 values at a time, 10 times the collectives do not
    grow what the offsets take (in memory, the differences grow by 2.2 MB)."""
    monkeypatch.setattr(groupagg.windowed_median, "__defaults__", (1_024,))

    def peak(count: int) -> int:
        spill = valuespill.ValueSpill(str(tmp_path), budget=8 << 10)
        tracemalloc.start()
        try:
            offsets = collectivematch.clock_offsets(_spans(count), spill.column)
            assert offsets[3] == (15.0, count)
            return tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
            spill.close()
    peak(1_000)
    assert peak(100_000) - peak(10_000) < 5e5


ODD = (None, "", "x", -3, 2.5, True, [1], {"a": 1}, 10**30, "12", "-1")


def test_odd_seq_and_peer_args_give_notes_not_tracebacks(tmp_path):
    """Any JSON value as Seq, Dst Rank or Src Rank: tables and notes, never an exception or a wrong pair."""
    assert [collectivematch.whole(value) for value in (*ODD, float("nan"))] == [-1] * 9 + [12, -1, -1]
    kernel = {"ph": "X", "cat": "kernel", "name": "ncclDevKernel_SendRecv", "pid": 0, "tid": 7, "dur": 3.0,
              "args": {"stream": 7, "Collective name": "send", "Process Group Name": "0", "Process Group Ranks": "[0, 1]",
                       "Group size": 2, "dtype": "Float", "In msg nelems": 4, "Out msg nelems": 4}}
    events = [{**kernel, "ts": 10.0 + n, "args": {**kernel["args"], "correlation": n, "Seq": value, "Dst Rank": value}}
              for n, value in enumerate(ODD)]
    (tmp_path / "rank0.json").write_text(json.dumps({"distributedInfo": {"rank": 0}, "traceEvents": events}))
    summary = analyze(tmp_path / "rank0.json")
    assert len(summary["tables"]["nccl_long"]) == len(ODD)
    assert "p2p_pairs" not in summary["tables"]
    notes = " ".join(summary["notes"])
    assert "10 send/recv kernels without a Dst Rank/Src Rank arg" in notes
    assert "1 send/recv kernels whose peer rank the inputs do not hold" in notes


@pytest.mark.parametrize("trace", ["nccl_rank0.json.gz", "b200_eager.json.gz", "dlrm_8ranks"])
def test_real_traces(trace):
    """The real traces carry no Seq (older PyTorch): matched by order, as TraceLens; DLRM's SendRecv
    kernels have no args, so no pair."""
    summary = analyze(Path(__file__).parents[2] / "shared" / "traces" / trace)
    rows = summary["tables"]["collective_matches"]
    assert rows and {row["match"] for row in rows} == {"order"}
    assert "p2p_pairs" not in summary["tables"]
    if trace == "dlrm_8ranks":
        waits = [row["wait for last (us)"] for row in rows]
        assert rows[0]["last arrival rank"] == 7 and statistics.median(waits) > 0
        summary = analyze(Path(__file__).parents[2] / "shared" / "traces" / trace, align_clocks=True)
        assert "clock_offsets" not in summary["tables"]  # (DLRM's kernels have no Collective name)
        assert any("the clocks of ranks 0-7 are not aligned" in note for note in summary["notes"])
