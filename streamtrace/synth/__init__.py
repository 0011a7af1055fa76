"""Deterministic generator of realistic synthetic Kineto (PyTorch profiler) traces.

Real traces are small, private, or lack the features streamtrace must get
right (pipeline-parallel ``PP:`` annotations, CUDA-graph replays over dozens
of streams, merged multi-rank files with colliding correlation ids, multi-GB
sizes).  This module writes such traces, with a ground truth to test against.

Design points:

* Streaming: events are encoded one by one with orjson and written through a
  small buffer; no trace is ever held in memory, so ``target_bytes`` can reach
  several GB with constant memory.
* Deterministic: same config => byte-identical files (``random.Random`` seeded
  from strings, gzip ``mtime=0``, no clocks, no uuids).
* Coherent across ranks: every rank simulates the same pipeline plan (GPU time
  of every PP action of every stage) from a shared seed, then fills in its own
  details, so a RECV on stage s+1 really ends after the matching SEND on
  stage s started.

Mapping of ranks (torchtitan's device mesh with ``pp`` outermost): with
``D = ranks // pp_stages``, global rank ``r`` has PP rank = stage =
``r // D`` and DP rank ``r % D``; its pipeline is
``[r % D + p * D for p in range(pp_stages)]`` (in PP order).  Each rank owns
one stage.

Internal times are integer ns relative to ``base_time_ns``; a file's ``ts`` is
``(t - (its baseTimeNanoseconds - base_time_ns)) / 1000`` microseconds, which
prints with at most 3 decimals and round-trips to the exact ns.
"""
from __future__ import annotations

import gzip
import json
from dataclasses import asdict
from pathlib import Path
from typing import BinaryIO, TextIO

from .config import (
    BIG_COMMS_ID,
    COMPRESSIONS,
    CORRELATION_START,
    KERNEL_ANNOTATIONS,
    LAYOUTS,
    MERGED_STYLES,
    SCHEDULES,
    SynthConfig,
    pp_group_of,
    pp_rank_of,
    rank_base_ns,
)
from .plan import CUDA_DEVICE, HIP_DEVICE, process_groups, stage_actions
from .rank import RankGen
from .sinks import Links, RankTruth, Sink

# ---------------------------------------------------------------- the files of a run


def _device_properties(cfg: SynthConfig) -> list[dict]:
    proto = HIP_DEVICE if cfg.hip else CUDA_DEVICE
    return [{"id": i, **proto} for i in range(min(8, cfg.ranks))]


def distributed_info(cfg: SynthConfig, rank: int) -> dict:
    """Kineto's distributedInfo: default, DP-shard and PP (``torchtitan_real_pp``) groups."""
    if cfg.collectives:
        pgs = [{"pg_name": g["pg_name"], "pg_desc": g["pg_desc"], "backend_config": "cuda:nccl",
                "pg_size": g["pg_size"], "ranks": g["ranks"]} for g in process_groups(cfg, rank).values()]
        return {"backend": "nccl", "rank": rank, "world_size": cfg.ranks, "pg_count": len(pgs),
                "pg_config": pgs, "nccl_version": "2.21.5"}
    d = cfg.dp_degree
    stage = pp_rank_of(cfg, rank)
    pp = pp_group_of(cfg, rank)
    dp = [stage * d + i for i in range(d)]
    pgs = [
        {"pg_name": "0", "pg_desc": "default_pg", "backend_config": "cuda:nccl", "pg_size": cfg.ranks,
         "ranks": list(range(cfg.ranks))},
        {"pg_name": "1", "pg_desc": "mesh_dp_shard", "backend_config": "cuda:nccl", "pg_size": d, "ranks": dp},
        {"pg_name": "torchtitan_real_pp", "pg_desc": "mesh_pp", "backend_config": "cuda:nccl",
         "pg_size": cfg.pp_stages, "ranks": pp},
    ]
    return {"backend": "nccl", "rank": rank, "world_size": cfg.ranks, "pg_count": len(pgs),
            "pg_config": pgs, "nccl_version": "2.21.5"}


def _header(cfg: SynthConfig, rank: int) -> bytes:
    # stdlib json with its default ", " / ": " separators: HTA's rank regex wants '"rank": 3'.
    return ("{\n"
            f'  "schemaVersion": 1,\n'
            f'  "deviceProperties": {json.dumps(_device_properties(cfg))},\n'
            f'  "baseTimeNanoseconds": {rank_base_ns(cfg, rank)},\n'
            '  "traceEvents": [').encode()


def _trailer(cfg: SynthConfig, rank: int, name: str) -> bytes:
    return ("\n  ],\n"
            f'  "distributedInfo": {json.dumps(distributed_info(cfg, rank))},\n'
            f'  "traceName": {json.dumps(name)}\n'
            "}\n").encode()


class _RankFile:
    """One rank file being written: header, steps on demand, trailer."""

    def __init__(self, cfg: SynthConfig, rank: int, out: BinaryIO, links: TextIO | None, name: str) -> None:
        self.cfg, self.rank, self.name = cfg, rank, name
        self.sink = Sink(out, cfg.layout)
        self.sink.raw(_header(cfg, rank))
        self.gen = RankGen(cfg, rank, self.sink, links=Links(links))

    def finish(self) -> RankTruth:
        truth = self.gen.finish()
        self.sink.raw(_trailer(self.cfg, self.rank, self.name))
        self.sink.flush()
        truth.bytes = self.sink.bytes
        return truth


def write_rank_trace(cfg: SynthConfig, rank: int, out: BinaryIO, *, links: TextIO | None = None,
                     steps: int | None = None, name: str | None = None) -> RankTruth:
    """Write one rank's Kineto trace (uncompressed JSON bytes) to ``out``.

    ``links`` (optional text stream) receives the launch truth CSV.  The step
    count is ``steps`` if given, else enough steps to reach ``cfg.target_bytes``
    for this rank alone, else ``cfg.steps``.
    """
    cfg.validate()
    rf = _RankFile(cfg, rank, out, links, name or f"rank{rank}_trace.json")
    n = 0
    while True:
        rf.gen.step(n)
        n += 1
        if steps is not None:
            done = n >= steps
        elif cfg.target_bytes is not None:
            rf.sink.flush()
            done = rf.sink.bytes >= cfg.target_bytes
        else:
            done = n >= cfg.steps
        if done:
            break
    return rf.finish()


def _open_compressed(path: Path, compress: str):
    """A binary writer for ``path``, compressed deterministically (gzip level 1, mtime 0)."""
    raw = open(path, "wb")
    if compress == "gz":
        return raw, gzip.GzipFile(filename="", mode="wb", fileobj=raw, compresslevel=1, mtime=0)
    if compress == "zst":
        import zstandard

        return raw, zstandard.ZstdCompressor(level=3).stream_writer(raw, closefd=False)
    return raw, None


def _close(pair) -> None:
    raw, comp = pair
    if comp is not None:
        comp.close()
    raw.close()


TRUTH_FILE = "truth.json"


def file_names(cfg: SynthConfig, compress: str = "gz", merged: bool = True) -> tuple[list[str], list[str], str | None]:
    """What :func:`write_traces` writes beside :data:`TRUTH_FILE`: the rank
    files, their links CSVs, and the merged file (None without one)."""
    suffix = ".json" + COMPRESSIONS[compress]
    return ([f"rank{r}_trace{suffix}" for r in range(cfg.ranks)], [f"truth_links_rank{r}.csv" for r in range(cfg.ranks)],
            f"merged_trace{suffix}" if merged else None)


def write_traces(cfg: SynthConfig, outdir, *, compress: str = "gz", merged: bool = True,
                 merged_style: str = "rank-arg") -> dict:
    """Write every rank file, the optional merged file and truth.json; return the truth dict.

    Ranks are generated in lockstep, one step each at a time, so that with
    ``target_bytes`` they all stop after the same step (the first at which every
    rank file reached the target): the pipeline stays consistent across ranks.
    """
    cfg.validate()
    if compress not in COMPRESSIONS:
        raise ValueError(f"compress must be one of {tuple(COMPRESSIONS)}")
    if merged_style not in MERGED_STYLES:
        raise ValueError(f"merged_style must be one of {MERGED_STYLES}")
    outdir = Path(outdir)
    outdir.mkdir(parents=True, exist_ok=True)
    rank_names, links_names, merged_name = file_names(cfg, compress, merged)
    files, link_files, writers = [], [], []
    try:
        for r in range(cfg.ranks):
            pair = _open_compressed(outdir / rank_names[r], compress)
            files.append(pair)
            lf = open(outdir / links_names[r], "w", newline="")
            link_files.append(lf)
            writers.append(_RankFile(cfg, r, pair[1] or pair[0], lf, f"rank{r}_trace.json"))
        n = 0
        while True:
            for w in writers:
                w.gen.step(n)
            n += 1
            if cfg.target_bytes is not None:
                for w in writers:
                    w.sink.flush()
                if all(w.sink.bytes >= cfg.target_bytes for w in writers):
                    break
            elif n >= cfg.steps:
                break
        truths = [w.finish() for w in writers]
    finally:
        for pair in files:
            _close(pair)
        for lf in link_files:
            lf.close()
    offset = 0
    for r, t in enumerate(truths):
        t.file = rank_names[r]
        t.links_file = links_names[r]
        t.merged_offset = offset
        offset += t.events
    truth: dict = {
        "generator": "streamtrace.synth",
        "config": asdict(cfg),
        "world_size": cfg.ranks,
        "pp_stages": cfg.pp_stages,
        "dp_degree": cfg.dp_degree,
        "schedule": cfg.schedule,
        "steps": n,
        "slow_rank": None if cfg.slow_rank < 0 else {"rank": cfg.slow_rank, "factor": cfg.slow_factor},
        "rank_mapping": "pp_rank = stage = rank // dp_degree; pp group of r = [r % dp_degree + p * dp_degree]",
        "links_columns": ["gpu_index", "launch_index", "correlation"],
        "total_events": offset,
        "ranks": [t.to_dict() for t in truths],
        "merged": None,
    }
    if merged_name:
        pair = _open_compressed(outdir / merged_name, compress)
        try:
            written = write_merged(cfg, pair[1] or pair[0], steps=n, merged_style=merged_style)
        finally:
            _close(pair)
        for r, (got, t) in enumerate(zip(written["rank_events"], truths)):
            if got != t.events:
                raise AssertionError(f"rank {r}: merged stream has {got} events, rank file {t.events}")
        truth["merged"] = {
            "file": merged_name,
            "style": merged_style,
            "events": written["events"],
            "bytes": written["bytes"],
            "header_from_rank": 0,
            "base_time_ns": rank_base_ns(cfg, 0),
            "ts_rule": "ts re-expressed relative to rank 0's baseTimeNanoseconds",
            "pid_rule": "cpu pid unchanged (CPU_PID_BASE + 37 * rank); gpu pid = global rank",
            "index_rule": "merged index = rank index + ranks[r].merged_offset",
            "correlations": "unchanged: every rank starts at %d, so they collide" % CORRELATION_START,
            "merged_offset": [t.merged_offset for t in truths],
        }
    (outdir / TRUTH_FILE).write_text(json.dumps(truth, indent=1) + "\n")
    return truth


def write_merged(cfg: SynthConfig, out: BinaryIO, *, steps: int | None = None,
                 merged_style: str = "rank-arg") -> dict:
    """Write only the merged file of all ranks (uncompressed JSON bytes) to ``out``.

    Each rank is generated whole in turn, so any number of ranks needs one
    open file (:func:`write_traces` keeps every rank file open).  Returns the
    event count per rank, the total and the bytes written.
    """
    cfg.validate()
    if merged_style not in MERGED_STYLES:
        raise ValueError(f"merged_style must be one of {MERGED_STYLES}")
    sink = Sink(out, cfg.layout)
    sink.raw(_header(cfg, 0))
    origin = rank_base_ns(cfg, 0) - cfg.base_time_ns
    rank_events = []
    for r in range(cfg.ranks):
        gen = RankGen(cfg, r, sink, origin_ns=origin, gpu_pid=r, merged_style=merged_style)
        for i in range(cfg.steps if steps is None else steps):
            gen.step(i)
        rank_events.append(gen.finish().events)
    sink.raw(_trailer(cfg, 0, "merged_trace.json"))
    sink.flush()
    return {"rank_events": rank_events, "events": sink.count, "bytes": sink.bytes}


def summary(truth: dict) -> dict:
    """The truth without its per-step/per-stream lists, for printing."""
    drop = ("pp_actions_per_step", "gpu_streams")
    out = {k: v for k, v in truth.items() if k != "ranks"}
    out["ranks"] = [{k: v for k, v in r.items() if k not in drop} for r in truth["ranks"]]
    return out


__all__ = ["BIG_COMMS_ID", "KERNEL_ANNOTATIONS", "LAYOUTS", "MERGED_STYLES", "SCHEDULES", "TRUTH_FILE", "SynthConfig",
           "file_names", "pp_group_of", "pp_rank_of", "stage_actions", "summary", "write_merged", "write_rank_trace",
           "write_traces"]
