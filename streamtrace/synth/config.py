"""What a synthetic run looks like (:class:`SynthConfig`), the fixed ids and streams every rank uses,
and where each rank stands in its pipeline."""
from __future__ import annotations

from dataclasses import dataclass

import orjson

dumps = orjson.dumps

SCHEDULES = ("1f1b", "zb", "gpipe")
MERGED_STYLES = ("rank-arg", "process-name", "none")
COMPRESSIONS = {"gz": ".gz", "zst": ".zst", "none": ""}
KERNEL_ANNOTATIONS = ("module", "pp", "none")
LAYOUTS = ("lines", "kineto")

# Streams (GPU tids).  Graph replays use GRAPH_STREAM_BASE .. + graph_streams - 1.
STREAM_COMPUTE = 7
STREAM_ALLGATHER = 20
STREAM_REDUCE_SCATTER = 24
STREAM_ALLREDUCE = 28
STREAM_P2P_NEXT = 40  # peer = next stage: SEND_F, RECV_B
STREAM_P2P_PREV = 44  # peer = previous stage: RECV_F, SEND_B
STREAM_ALLTOALL = 32  # all_to_allv (with --collectives)
GRAPH_STREAM_BASE = 100

CORRELATION_START = 16  # every rank starts here, so merged files collide
CPU_PID_BASE = 100_003  # cpu pid of rank r = CPU_PID_BASE + 37 * r
CPU_PID_STRIDE = 37
BWD_TID_OFFSET = 7  # autograd thread tid = cpu pid + 7

# Timing model (ns).
T0_NS = 1_365_627_000_000_000  # first step, relative to base_time_ns (~15.8 days, like real traces)
PAD = 2_000  # CPU padding at both ends of an action
LAUNCH_LAT = 1_500  # minimum launch -> GPU start latency
MIN_GPU_DUR = 800
RECV_AFTER_SEND = 15_000  # a RECV's kernel ends at least this long after the SEND kernel started
BIG_COMMS_ID = 2**64 - 12345

COMPUTE_OPS = ("F", "B", "I", "W")
P2P_OPS = ("SEND_F", "RECV_F", "SEND_B", "RECV_B")


@dataclass
class SynthConfig:
    """Shape and size of a synthetic multi-rank training trace."""

    ranks: int = 2  # world size K
    pp_stages: int = 2  # pipeline stages, one per rank of a PP group; ranks % pp_stages == 0
    microbatches: int = 4
    schedule: str = "1f1b"  # "1f1b" (F/B), "zb" (F/I/W), "gpipe" ("Forward <mb>"/"Backward <mb>")
    steps: int = 2  # ProfilerStep#N count (ignored when target_bytes is set)
    target_bytes: int | None = None  # add steps until every rank file is >= this (uncompressed)
    graph_streams: int = 32  # streams a CUDA-graph replay spreads its kernels over
    graph_kernels: int = 64  # kernels per graph replay (0: no graph replays)
    eager_kernels: int = 20  # eager kernels per PP compute action
    python_noise: int = 4  # nested python_function frames around every cpu_op
    seed: int = 0
    base_time_ns: int = 1_767_189_312_000_000_000
    base_skew_ns: int = 0  # baseTimeNanoseconds of rank r = base_time_ns + r * base_skew_ns
    hip: bool = False  # AMD naming: hip* runtime calls
    big_ints: bool = True  # NCCL kernels carry "Comms Id" >= 2**63
    kernel_annotations: str = "module"  # graph kernels' args.name: "module" runs, "pp" (action name), "none"
    slow_rank: int = -1  # this rank's timeline runs slow_factor times slower (-1: none): a straggler
    slow_factor: float = 1.0
    layout: str = "lines"  # event text: compact JSON an event a line, or Kineto's own (indented lines, spaces)
    collectives: bool = False  # collective args as PyTorch writes them, collectives run as NCCL runs them: see "collective args"

    def validate(self) -> None:
        """Reject configs the generator cannot honour, with a plain message."""
        if self.ranks < 1 or self.pp_stages < 1 or self.ranks % self.pp_stages:
            raise ValueError("ranks must be a positive multiple of pp_stages")
        if self.ranks >= 100_000:
            raise ValueError("ranks must be < 100000 (pids stay unique and < 2**31)")
        if self.schedule not in SCHEDULES:
            raise ValueError(f"schedule must be one of {SCHEDULES}")
        if self.kernel_annotations not in KERNEL_ANNOTATIONS:
            raise ValueError(f"kernel_annotations must be one of {KERNEL_ANNOTATIONS}")
        if self.layout not in LAYOUTS:
            raise ValueError(f"layout must be one of {LAYOUTS}")
        if self.microbatches < 1 or self.steps < 1:
            raise ValueError("microbatches and steps must be >= 1")
        if self.graph_streams < 1 or min(self.graph_kernels, self.eager_kernels, self.python_noise) < 0:
            raise ValueError("graph_streams must be >= 1 and kernel/noise counts >= 0")
        if not -1 <= self.slow_rank < self.ranks or self.slow_factor < 1:
            raise ValueError("slow_rank must be a rank (or -1 for none) and slow_factor >= 1")

    @property
    def dp_degree(self) -> int:
        return self.ranks // self.pp_stages


def pp_rank_of(cfg: SynthConfig, rank: int) -> int:
    """PP rank (= stage) of a global rank: ``rank // (ranks // pp_stages)``."""
    return rank // cfg.dp_degree


def pp_group_of(cfg: SynthConfig, rank: int) -> list[int]:
    """Global ranks of ``rank``'s pipeline, in PP order."""
    d = cfg.dp_degree
    return [rank % d + p * d for p in range(cfg.pp_stages)]


def rank_base_ns(cfg: SynthConfig, rank: int) -> int:
    return cfg.base_time_ns + rank * cfg.base_skew_ns
