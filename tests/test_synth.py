"""Tests of the synthetic Kineto trace generator and its ground truth."""
from __future__ import annotations

import csv
import gzip
import io
import json
import os
import re
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

import pytest

from streamtrace.synth import (
    BIG_COMMS_ID,
    SynthConfig,
    pp_group_of,
    pp_rank_of,
    stage_actions,
    write_rank_trace,
    write_traces,
)

GPU_CATS = {"kernel", "gpu_memcpy", "gpu_memset"}
PP_RE = re.compile(r"^PP:(\d+)(SEND_F|RECV_F|SEND_B|RECV_B|UNSHARD|RESHARD|REDUCE_GRAD|F|B|I|W)(\d*)$")
SMALL = dict(ranks=4, pp_stages=2, microbatches=3, steps=2, eager_kernels=4, graph_kernels=40, python_noise=2)


def load(path: Path) -> dict:
    with open(path, "rb") as f:
        data = f.read()
    if path.suffix == ".gz":
        data = gzip.decompress(data)
    elif path.suffix == ".zst":
        import zstandard

        data = zstandard.ZstdDecompressor().decompressobj().decompress(data)
    return json.loads(data)


def ns(us: float) -> int:
    return round(us * 1000)


def links(path: Path) -> list[tuple[int, int, int]]:
    with open(path, newline="") as f:
        rows = list(csv.reader(f))
    assert rows[0] == ["gpu_index", "launch_index", "correlation"]
    return [tuple(map(int, r)) for r in rows[1:]]


@pytest.fixture(scope="module")
def small(tmp_path_factory):
    out = tmp_path_factory.mktemp("synth")
    truth = write_traces(SynthConfig(**SMALL), out, compress="gz")
    ranks = [load(out / r["file"]) for r in truth["ranks"]]
    merged = load(out / truth["merged"]["file"])
    return out, truth, ranks, merged


def test_files_load_and_layout(small):
    out, truth, ranks, merged = small
    assert json.loads((out / "truth.json").read_text()) == truth
    for r, doc in enumerate(ranks):
        keys = list(doc)
        assert keys[:4] == ["schemaVersion", "deviceProperties", "baseTimeNanoseconds", "traceEvents"]
        assert keys.index("distributedInfo") > keys.index("traceEvents")
        assert keys[-1] == "traceName"
        info = doc["distributedInfo"]
        assert info["rank"] == r and info["world_size"] == 4
        pp = [g for g in info["pg_config"] if g["pg_name"] == "torchtitan_real_pp"]
        assert pp and pp[0]["pg_desc"] == "mesh_pp" and pp[0]["ranks"] == pp_group_of(SynthConfig(**SMALL), r)
        assert pp[0]["ranks"].index(r) == truth["ranks"][r]["pp_rank"]
        last = doc["traceEvents"][-1]
        assert last["name"] == "Record Window End" and last["pid"] == "" and last["tid"] == ""
        assert len(doc["traceEvents"]) == truth["ranks"][r]["events"]
        assert isinstance(doc["baseTimeNanoseconds"], int)
    raw = gzip.decompress((out / "rank3_trace.json.gz").read_bytes())
    assert b'"rank": 3' in raw  # HTA's regex wants the space


def test_timestamps_have_ns_resolution(small):
    out = small[0]
    raw = gzip.decompress((out / "rank1_trace.json.gz").read_bytes()).decode()
    values = re.findall(r'"(?:ts|dur)":(-?[0-9.]+)', raw)
    assert values
    for v in values:
        assert not v.startswith("-")
        assert len(v.partition(".")[2]) <= 3, v


def test_deterministic(tmp_path):
    cfg = SynthConfig(**SMALL, base_skew_ns=1234)
    a = write_traces(cfg, tmp_path / "a", compress="gz", merged_style="process-name")
    b = write_traces(cfg, tmp_path / "b", compress="gz", merged_style="process-name")
    assert a == b
    names = sorted(p.name for p in (tmp_path / "a").iterdir())
    assert names == sorted(p.name for p in (tmp_path / "b").iterdir())
    for name in names:
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes(), name
    c = write_traces(SynthConfig(**{**SMALL, "seed": 5}), tmp_path / "c", compress="none", merged=False)
    assert (tmp_path / "c" / "rank0_trace.json").read_bytes() != gzip.decompress(
        (tmp_path / "a" / "rank0_trace.json.gz").read_bytes())
    assert c["merged"] is None


def _check_links(events: list[dict], rows, offset: int = 0, rank: int | None = None, count: int | None = None) -> None:
    """Every GPU event of the rank has one truth row naming its launch."""
    stop = len(events) if count is None else offset + count
    gpu_idx = {i for i in range(offset, stop) if events[i].get("cat") in GPU_CATS}
    assert {g + offset for g, _, _ in rows} == gpu_idx
    assert len(rows) == len(gpu_idx)
    for g, launch, corr in rows:
        ge, le = events[g + offset], events[launch + offset]
        assert ge["cat"] in GPU_CATS and ge["args"]["correlation"] == corr
        assert le["cat"] == "cuda_runtime" and le["args"]["correlation"] == corr
        assert ns(le["ts"]) < ns(ge["ts"])
        if rank is not None:
            assert ge["args"]["rank"] == le["args"]["rank"] == rank


def test_launch_truth_per_rank_and_merged(small):
    out, truth, ranks, merged = small
    mev = merged["traceEvents"]
    for r, doc in enumerate(ranks):
        rows = links(out / truth["ranks"][r]["links_file"])
        assert len(rows) == truth["ranks"][r]["gpu_events"]
        _check_links(doc["traceEvents"], rows)
        _check_links(mev, rows, truth["ranks"][r]["merged_offset"], rank=r, count=truth["ranks"][r]["events"])


def test_graph_launch_truth(small):
    truth, ranks = small[1], small[2]
    for r, doc in enumerate(ranks):
        ev = doc["traceEvents"]
        launches = {e["args"]["correlation"] for e in ev if e.get("name") == "cudaGraphLaunch"}
        assert len(launches) == truth["ranks"][r]["graph_launches"] > 0
        by_corr = defaultdict(list)
        for e in ev:
            if e.get("cat") == "kernel" and e["args"]["correlation"] in launches:
                by_corr[e["args"]["correlation"]].append(e)
        for corr in launches:
            ks = by_corr[corr]
            assert len(ks) == truth["ranks"][r]["gpu_events_per_graph_launch"] == 40
            assert len({k["tid"] for k in ks}) >= 24  # default graph_streams = 32
            names = [k["args"].get("name") for k in ks]
            assert any(names) and not all(names)
            assert any(a == b for a, b in zip(names, names[1:]) if a)  # runs share a name


def test_merged_counts_collisions_and_pids(small):
    out, truth, ranks, merged = small
    mev = merged["traceEvents"]
    assert len(mev) == sum(len(d["traceEvents"]) for d in ranks) == truth["merged"]["events"]
    assert merged["distributedInfo"] == ranks[0]["distributedInfo"]
    assert merged["baseTimeNanoseconds"] == ranks[0]["baseTimeNanoseconds"]
    corrs = defaultdict(set)
    for e in mev:
        assert e["args"]["rank"] in range(4)
        if e.get("cat") == "cuda_runtime":
            corrs[e["args"]["rank"]].add(e["args"]["correlation"])
    assert min(corrs[0]) == min(corrs[1]) and len(corrs[0] & corrs[1]) > 10
    gpu_pids = defaultdict(set)
    for e in mev:
        if e.get("cat") in GPU_CATS:
            gpu_pids[e["args"]["rank"]].add(e["pid"])
    assert dict(gpu_pids) == {r: {r} for r in range(4)}
    for r, doc in enumerate(ranks):  # same events, only pid/rank/ts base may differ
        off = truth["ranks"][r]["merged_offset"]
        for i in (0, 57, len(doc["traceEvents"]) - 1):
            a, b = doc["traceEvents"][i], mev[off + i]
            assert a["name"] == b["name"] and a.get("cat") == b.get("cat")


def test_flows_bind_to_events(small):
    for doc in small[2]:
        ev = doc["traceEvents"]
        gpu = {(e["pid"], e["tid"], e["ts"]) for e in ev if e.get("cat") in GPU_CATS}
        rt = {(e["pid"], e["tid"], e["ts"], e["args"]["correlation"]) for e in ev if e.get("cat") == "cuda_runtime"}
        f = [e for e in ev if e.get("ph") == "f"]
        s = [e for e in ev if e.get("ph") == "s"]
        assert len(f) == len(gpu) and s
        for e in f:
            assert e["cat"] == "ac2g" and e["bp"] == "e" and (e["pid"], e["tid"], e["ts"]) in gpu
        for e in s:
            assert (e["pid"], e["tid"], e["ts"], e["id"]) in rt


def test_streams_and_threads_never_overlap(small):
    for doc in small[2]:
        lanes = defaultdict(list)
        for e in doc["traceEvents"]:
            if e.get("ph") != "X":
                continue
            assert e["dur"] >= 0
            if e["cat"] in GPU_CATS:
                lanes[("gpu", e["pid"], e["tid"])].append((ns(e["ts"]), ns(e["ts"]) + ns(e["dur"])))
            elif e["cat"] in ("user_annotation", "cpu_op", "cuda_runtime", "python_function"):
                lanes[("cpu", e["pid"], e["tid"])].append((ns(e["ts"]), ns(e["ts"]) + ns(e["dur"])))
        for key, spans in lanes.items():
            spans.sort(key=lambda x: (x[0], -x[1]))
            if key[0] == "gpu":
                for (_, a1), (b0, _) in zip(spans, spans[1:]):
                    assert b0 >= a1, key
            else:  # CPU slices nest properly
                stack: list[int] = []
                for a0, a1 in spans:
                    while stack and stack[-1] <= a0:
                        stack.pop()
                    assert not stack or a1 <= stack[-1], key
                    stack.append(a1)
        assert sum(1 for k in lanes if k[0] == "gpu") > 24


def test_pp_annotations_follow_spec(small):
    out, truth, ranks, _ = small
    cfg = SynthConfig(**SMALL)
    for r, doc in enumerate(ranks):
        counts = defaultdict(int)
        gpu_names = set()
        for e in doc["traceEvents"]:
            if e.get("cat") == "user_annotation" and e["name"].startswith("PP:"):
                m = PP_RE.match(e["name"])
                assert m, e["name"]
                assert int(m.group(1)) == pp_rank_of(cfg, r)
                assert (m.group(3) == "") == (m.group(2) in ("UNSHARD", "RESHARD", "REDUCE_GRAD"))
                counts[m.group(2)] += 1
            if e.get("cat") == "gpu_user_annotation" and e["name"].startswith("PP:"):
                gpu_names.add(e["name"])
        assert dict(counts) == truth["ranks"][r]["pp_action_counts"]
        assert counts["F"] == counts["B"] == 3 * 2
        step0 = [a[0] for a in truth["ranks"][r]["pp_actions_per_step"]]
        assert gpu_names == set(step0) - {f"PP:{pp_rank_of(cfg, r)}RESHARD"}


def _annotation_spans(doc: dict) -> dict[str, list[tuple[int, int]]]:
    spans = defaultdict(list)
    for e in doc["traceEvents"]:
        if e.get("cat") == "gpu_user_annotation" and e["name"].startswith("PP:"):
            spans[e["name"]].append((ns(e["ts"]), ns(e["ts"]) + ns(e["dur"])))
    return spans


def test_send_recv_consistent_across_ranks(small):
    ranks = small[2]
    stage0, stage1 = _annotation_spans(ranks[0]), _annotation_spans(ranks[2])  # pipeline [0, 2]
    pairs = 0
    for name, spans in stage0.items():
        if "SEND_F" in name:
            mb = name.split("SEND_F")[1]
            recv = stage1[f"PP:1RECV_F{mb}"]
            assert len(spans) == len(recv) == 2  # one per step
            for (s0, _), (_, r1) in zip(sorted(spans), sorted(recv)):
                assert s0 < r1
                pairs += 1
    assert pairs == 6


@pytest.mark.parametrize("schedule", ["zb", "gpipe"])
def test_schedules(tmp_path, schedule):
    cfg = SynthConfig(ranks=3, pp_stages=3, microbatches=4, steps=1, eager_kernels=2, graph_kernels=8,
                      python_noise=0, schedule=schedule, hip=True)
    truth = write_traces(cfg, tmp_path, compress="zst", merged_style="process-name")
    doc = load(tmp_path / "rank1_trace.json.zst")
    names = [e["name"] for e in doc["traceEvents"] if e.get("cat") == "user_annotation"]
    runtime = {e["name"] for e in doc["traceEvents"] if e.get("cat") == "cuda_runtime"}
    assert "hipGraphLaunch" in runtime and "hipLaunchKernel" in runtime and not any("cuda" in n for n in runtime)
    if schedule == "zb":
        ops = [PP_RE.match(n).group(2) for n in names if n.startswith("PP:")]
        assert ops.count("F") == ops.count("I") == ops.count("W") == 4 and "B" not in ops
        assert truth["ranks"][1]["pp_action_counts"]["W"] == 4
    else:
        assert not any(n.startswith("PP:") for n in names)
        assert [n for n in names if n.startswith(("Forward", "Backward"))] == \
            [f"Forward {m}" for m in range(4)] + [f"Backward {m}" for m in range(4)]
    merged = load(tmp_path / "merged_trace.json.zst")
    pnames = {(e["pid"], e["args"]["name"]) for e in merged["traceEvents"]
              if e.get("ph") == "M" and e["name"] == "process_name"}
    assert (2, "RANK 2 - GPU") in pnames and (truth["ranks"][2]["cpu_pid"], "RANK 2 - CPU") in pnames
    assert not any("rank" in e.get("args", {}) for e in merged["traceEvents"])


def test_stage_actions_pair_up():
    cfg = SynthConfig(ranks=4, pp_stages=4, microbatches=6, schedule="1f1b")
    acts = [stage_actions(cfg, s) for s in range(4)]
    for s in range(3):
        sends = [m for op, m in acts[s] if op == "SEND_F"]
        assert sends == [m for op, m in acts[s + 1] if op == "RECV_F"] == list(range(6))
    assert acts[0][0] == ("UNSHARD", None) and acts[0][-1] == ("REDUCE_GRAD", None)


def test_big_ints_and_skew(tmp_path):
    cfg = SynthConfig(ranks=2, pp_stages=2, microbatches=1, steps=1, eager_kernels=1, graph_kernels=0,
                      base_skew_ns=5_000_000_123)
    buf, csv_buf = io.BytesIO(), io.StringIO()
    t = write_rank_trace(cfg, 1, buf, links=csv_buf)
    doc = json.loads(buf.getvalue())
    assert doc["baseTimeNanoseconds"] == cfg.base_time_ns + 5_000_000_123 == t.base_time_ns
    ids = [e["args"]["Comms Id"] for e in doc["traceEvents"] if "Comms Id" in e.get("args", {})]
    assert ids and all(i >= 2**63 for i in ids) and BIG_COMMS_ID in ids
    assert t.graph_launches == 0 and len(csv_buf.getvalue().splitlines()) == t.gpu_events + 1
    buf2 = io.BytesIO()
    write_rank_trace(SynthConfig(**{**cfg.__dict__, "big_ints": False}), 1, buf2)
    assert b"Comms Id" not in buf2.getvalue()


def test_target_bytes_reached(tmp_path):
    cfg = SynthConfig(ranks=2, pp_stages=2, microbatches=2, eager_kernels=4, graph_kernels=16,
                      target_bytes=2_000_000)
    truth = write_traces(cfg, tmp_path, compress="none", merged=False)
    sizes = [(tmp_path / r["file"]).stat().st_size for r in truth["ranks"]]
    assert all(s >= 2_000_000 for s in sizes)
    assert sizes == [r["bytes"] for r in truth["ranks"]]
    assert {r["steps"] for r in truth["ranks"]} == {truth["steps"]} and truth["steps"] > 2
    assert not (tmp_path / "merged_trace.json").exists()


def test_cli(tmp_path):
    script = Path(__file__).resolve().parents[1] / "scripts" / "synth_trace.py"
    res = subprocess.run([sys.executable, str(script), str(tmp_path / "new"), "--ranks", "2", "--pp-stages", "2",
                          "--microbatches", "1", "--steps", "1", "--compress", "none", "--no-merged",
                          "--graph-kernels", "4", "--eager-kernels", "1"],
                         capture_output=True, text=True, check=True)
    summary = json.loads(res.stdout)
    assert summary["ranks"][0]["events"] > 0 and "pp_actions_per_step" not in summary["ranks"][0]
    assert (tmp_path / "new" / "rank1_trace.json").exists()


@pytest.mark.slow
def test_memory_stays_flat(tmp_path):
    code = (
        "from streamtrace.resources import peak_rss_mb\n"
        "from streamtrace.synth import SynthConfig, write_traces\n"
        f"write_traces(SynthConfig(ranks=2, target_bytes=25_000_000), {str(tmp_path)!r}, compress='gz')\n"
        "print(peak_rss_mb())\n"
    )
    root = str(Path(__file__).resolve().parents[1])
    result = subprocess.run([sys.executable, "-c", code], cwd=root, capture_output=True, text=True, check=True,
                            env={**os.environ, "PYTHONPATH": root})
    assert float(result.stdout.split()[-1]) < 100
    assert sum(p.stat().st_size for p in tmp_path.glob("rank*_trace.json.gz")) > 2_000_000


def test_collective_args(tmp_path):
    """--collectives: each NCCL kernel carries the collective args of the record_param_comms op that
    launched it; one name per process group across ranks, as distributedInfo lists them; all_to_allv
    splits agree between senders and receivers."""
    truth = write_traces(SynthConfig(**SMALL, collectives=True), tmp_path, compress="gz", merged=False)
    keys = ("Collective name", "In msg nelems", "Out msg nelems", "Group size", "dtype", "In split size",
            "Out split size", "Process Group Name", "Process Group Description", "Process Group Ranks")
    groups: dict[str, str] = {}
    splits: dict[tuple[int, int], tuple[list, list]] = {}
    for rank, rank_truth in enumerate(truth["ranks"]):
        trace = load(tmp_path / rank_truth["file"])
        assert trace["distributedInfo"]["rank"] == rank
        configured = {pg["pg_name"]: str(pg["ranks"]) for pg in trace["distributedInfo"]["pg_config"]}
        ops = {e["args"]["External id"]: e["args"] for e in trace["traceEvents"] if e.get("name") == "record_param_comms"}
        kernels = [e for e in trace["traceEvents"] if e.get("cat") == "kernel" and e["name"].startswith("ncclDevKernel")]
        assert len(kernels) == rank_truth["collective_kernels"] == len(ops)
        step = 0
        for kernel in kernels:
            args = kernel["args"]
            op = ops[args["External id"]]
            assert {key: op[key] for key in keys} == {key: args[key] for key in keys}
            members = json.loads(args["Process Group Ranks"])
            assert rank in members and args["Group size"] == len(members)
            assert configured[args["Process Group Name"]] == args["Process Group Ranks"]
            assert groups.setdefault(args["Process Group Name"], args["Process Group Ranks"]) == args["Process Group Ranks"]
            assert (op["Global rank start"], op["Rank"]) == (members[0], rank)
            if args["Collective name"] == "all_to_allv":
                sent, received = json.loads(args["In split size"]), json.loads(args["Out split size"])
                assert (sum(sent), sum(received)) == (args["In msg nelems"], args["Out msg nelems"])
                splits[(rank, step)] = (sent, received)
                step += 1
    assert len(set(groups)) == 1 + 2 + 2  # world, a DP group per stage, a pipeline per DP rank
    for (rank, step), (_, received) in splits.items():
        for peer in range(4):
            assert received[peer] == splits[(peer, step)][0][rank]
    assert len({tuple(sent) for sent, _ in splits.values()}) > 1


def test_collectives_wait_for_the_slow_rank(tmp_path):
    """--collectives with a slow rank: the other ranks' collective kernels last until the slow rank has
    arrived (NCCL's ranks finish a collective together), so the k-th collective of a group never ends
    on one rank before it starts on another."""
    config = SynthConfig(ranks=4, pp_stages=1, steps=3, eager_kernels=2, graph_kernels=4, python_noise=0,
                         collectives=True, slow_rank=2, slow_factor=1.5)
    truth = write_traces(config, tmp_path, compress="gz", merged=False)
    kernels: dict[tuple[str, int], list[tuple[int, float, float]]] = defaultdict(list)
    for rank, rank_truth in enumerate(truth["ranks"]):
        seen: dict[str, int] = defaultdict(int)
        events = [e for e in load(tmp_path / rank_truth["file"])["traceEvents"]
                  if e.get("cat") == "kernel" and e["name"].startswith("ncclDevKernel")]
        for e in sorted(events, key=lambda e: e["ts"]):
            group = e["args"]["Process Group Name"]
            kernels[(group, seen[group])].append((rank, e["ts"], e["ts"] + e["dur"]))
            seen[group] += 1
    assert len(kernels) == 3 * 5  # per step: 2 all-gathers and a reduce-scatter (DP group), an all-reduce and an all_to_allv
    for members in kernels.values():
        assert len(members) == 4
        assert min(end for _, _, end in members) >= max(start for _, start, _ in members)
        assert max(members, key=lambda member: member[1])[0] == 2  # the slow rank arrives last
