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
import random
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import BinaryIO, TextIO

import orjson

_dumps = orjson.dumps

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


# ---------------------------------------------------------------- names

# (cpu_op name, kernel name, registers, shared mem, grid, block)
_EAGER_KERNELS = (
    ("aten::mm", "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x256x64_warpgroupsize2x1x1_execute_segment_k_off_kernel__5x_cublas", 168, 213248, [132, 1, 1], [384, 1, 1]),
    ("aten::add", "void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add<c10::BFloat16>, std::array<char*, 3ul> >(int, at::native::CUDAFunctor_add<c10::BFloat16>, std::array<char*, 3ul>)", 26, 0, [8192, 1, 1], [128, 1, 1]),
    ("aten::_fused_rms_norm", "void at::native::(anonymous namespace)::vectorized_layer_norm_kernel<c10::BFloat16, float, true>(int, float, c10::BFloat16 const*, c10::BFloat16 const*, c10::BFloat16 const*, float*, float*, c10::BFloat16*)", 40, 0, [8192, 1, 1], [256, 1, 1]),
    ("aten::_scaled_dot_product_flash_attention", "void pytorch_flash::flash_fwd_kernel<Flash_fwd_kernel_traits<128, 128, 64, 4, false, false, cutlass::bfloat16_t, Flash_kernel_traits<128, 128, 64, 4, cutlass::bfloat16_t> >, false, true, false, false, true, true, false, false>(pytorch_flash::Flash_fwd_params)", 255, 49152, [16, 32, 8], [128, 1, 1]),
    ("aten::silu", "void at::native::vectorized_elementwise_kernel<4, at::native::(anonymous namespace)::silu_kernel(at::TensorIteratorBase&)::{lambda()#1}::operator()() const::{lambda()#5}::operator()() const::{lambda(c10::BFloat16)#1}, std::array<char*, 2ul> >(int, at::native::(anonymous namespace)::silu_kernel(at::TensorIteratorBase&)::{lambda()#1}::operator()() const::{lambda()#5}::operator()() const::{lambda(c10::BFloat16)#1}, std::array<char*, 2ul>)", 24, 0, [21504, 1, 1], [128, 1, 1]),
    ("aten::mul", "void at::native::vectorized_elementwise_kernel<4, at::native::binary_internal::MulFunctor<c10::BFloat16>, std::array<char*, 3ul> >(int, at::native::binary_internal::MulFunctor<c10::BFloat16>, std::array<char*, 3ul>)", 28, 0, [21504, 1, 1], [128, 1, 1]),
    ("aten::copy_", "void at::native::elementwise_kernel<128, 4, at::native::gpu_kernel_impl_nocast<at::native::direct_copy_kernel_cuda(at::TensorIteratorBase&)::{lambda()#3}::operator()() const::{lambda()#12}::operator()() const::{lambda(c10::BFloat16)#1}>(at::TensorIteratorBase&, at::native::direct_copy_kernel_cuda(at::TensorIteratorBase&)::{lambda()#3}::operator()() const::{lambda()#12}::operator()() const::{lambda(c10::BFloat16)#1} const&)::{lambda(int)#1}>(int, at::native::gpu_kernel_impl_nocast<at::native::direct_copy_kernel_cuda(at::TensorIteratorBase&)::{lambda()#3}::operator()() const::{lambda()#12}::operator()() const::{lambda(c10::BFloat16)#1}>(at::TensorIteratorBase&, at::native::direct_copy_kernel_cuda(at::TensorIteratorBase&)::{lambda()#3}::operator()() const::{lambda()#12}::operator()() const::{lambda(c10::BFloat16)#1} const&)::{lambda(int)#1})", 30, 0, [4096, 1, 1], [128, 1, 1]),
    ("aten::mean", "void at::native::reduce_kernel<512, 1, at::native::ReduceOp<float, at::native::MeanOps<float, float, float, float>, unsigned int, float, 4, 4> >(at::native::ReduceOp<float, at::native::MeanOps<float, float, float, float>, unsigned int, float, 4, 4>)", 32, 16, [264, 1, 1], [32, 16, 1]),
)
_BWD_OP_PREFIX = "autograd::engine::evaluate_function: "
_BWD_OPS = ("MmBackward0", "AddBackward0", "FusedRmsNormBackward0", "ScaledDotProductFlashAttentionBackward0",
            "SiluBackward0", "MulBackward0", "ToCopyBackward0", "MeanBackward1")
_GRAPH_KERNELS = (
    "triton_red_fused__to_copy_add_mean_mul_pow_rsqrt_0",
    "nvjet_tst_192x192_64x4_2x1_v_bz_coopA_TNT",
    "triton_poi_fused_mul_silu_1",
    "void cutlass::device_kernel<flash::enable_sm90_or_later<flash::FlashAttnFwdSm90<flash::CollectiveMainloopFwdSm90<2, cute::tuple<cute::C<1>, cute::C<1>, cute::C<1> >, cute::tuple<cute::C<128>, cute::C<128>, cute::C<128> >, 128, cutlass::bfloat16_t, float, cutlass::arch::Sm90, true, false, false, false, false, true, true, false, true, false, false>, flash::CollectiveEpilogueFwd<cute::tuple<cute::C<128>, cute::C<128>, cute::C<128> >, cute::tuple<cute::C<1>, cute::C<1>, cute::C<1> >, cutlass::bfloat16_t, cutlass::arch::Sm90, 256, true, false, false, false>, flash::DynamicPersistentTileScheduler<256, 128, false, true, false> > > >(flash::FlashAttnFwdSm90<...>::Params)",
    "triton_poi_fused__to_copy_add_2",
    "nvjet_tst_128x256_64x4_1x2_h_bz_coopA_NNT",
    "triton_per_fused__to_copy_mul_sum_3",
)
_PY_FRAMES = (
    "torch/nn/modules/module.py(1784): _call_impl",
    "torch/nn/modules/module.py(1773): _wrapped_call_impl",
    "torchtitan/models/llama3/model.py(321): forward",
    "torch/distributed/pipelining/stage.py(702): forward_one_chunk",
    "torch/_dynamo/eval_frame.py(655): _fn",
    "torchtitan/models/llama3/model.py(235): forward",
    "<built-in method linear of type object at 0x7f3a91c2e8a0>",
)
_PY_FRAMES_COMM = (
    "torch/distributed/pipelining/schedules.py(1987): _step_microbatches",
    "torch/distributed/c10d_logger.py(81): wrapper",
    "torch/distributed/distributed_c10d.py(2561): batch_isend_irecv",
    "torch/distributed/fsdp/_fully_shard/_fsdp_collectives.py(242): foreach_all_gather",
    "torch/distributed/distributed_c10d.py(4012): all_gather_into_tensor",
)
_NCCL_KERNEL = {
    "allgather": "ncclDevKernel_AllGather_RING_LL(ncclDevKernelArgsStorage<4096ul>)",
    "reducescatter": "ncclDevKernel_ReduceScatter_Sum_bf16_RING_LL(ncclDevKernelArgsStorage<4096ul>)",
    "allreduce": "ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevKernelArgsStorage<4096ul>)",
    "sendrecv": "ncclDevKernel_SendRecv(ncclDevKernelArgsStorage<4096ul>)",
    "alltoall": "ncclDevKernel_SendRecv(ncclDevKernelArgsStorage<4096ul>)",
}
# runtime kind -> (cuda name, cbid, hip name, cid)
_RUNTIME = {
    "kernel": ("cudaLaunchKernel", 211, "hipLaunchKernel", 185),
    "memcpy": ("cudaMemcpyAsync", 41, "hipMemcpyAsync", 110),
    "memset": ("cudaMemsetAsync", 51, "hipMemsetAsync", 132),
    "graph": ("cudaGraphLaunch", 311, "hipGraphLaunch", 215),
    "wait": ("cudaStreamWaitEvent", 147, "hipStreamWaitEvent", 175),
}
_NO_GPU_WORK = ("wait",)

_CUDA_DEVICE = {
    "name": "NVIDIA H100 80GB HBM3", "totalGlobalMem": 85029158912, "computeMajor": 9, "computeMinor": 0,
    "maxThreadsPerBlock": 1024, "maxThreadsPerMultiprocessor": 2048, "regsPerBlock": 65536, "warpSize": 32,
    "sharedMemPerBlock": 49152, "numSms": 132, "regsPerMultiprocessor": 65536,
    "sharedMemPerBlockOptin": 232448, "sharedMemPerMultiprocessor": 233472,
}
_HIP_DEVICE = {
    "name": "AMD Instinct MI300X", "totalGlobalMem": 206141652992, "computeMajor": 9, "computeMinor": 4,
    "maxThreadsPerBlock": 1024, "maxThreadsPerMultiprocessor": 2048, "regsPerBlock": 65536, "warpSize": 64,
    "sharedMemPerBlock": 65536, "numSms": 304, "maxSharedMemoryPerMultiProcessor": 65536,
}


def pp_action_name(stage: int, op: str, mb: int | None) -> str:
    """``PP:<stage><op><mb>`` as torch.distributed.pipelining names it."""
    return f"PP:{stage}{op}" if mb is None else f"PP:{stage}{op}{mb}"


# ---------------------------------------------------------------- pipeline plan


def stage_actions(cfg: SynthConfig, stage: int) -> list[tuple[str, int | None]]:
    """One step's actions of a stage, in execution order (1F1B / ZB-H1-like / GPipe)."""
    S, M = cfg.pp_stages, cfg.microbatches
    compute: list[tuple[str, int]] = []
    if cfg.schedule == "gpipe":
        compute = [("F", m) for m in range(M)] + [("B", m) for m in range(M)]
    else:
        zb = cfg.schedule == "zb"
        lag = S - stage - 1  # W may trail I by this many microbatches
        warm = min(lag, M)
        pending: list[int] = []

        def backward(m: int) -> None:
            compute.append(("I" if zb else "B", m))
            if zb:
                pending.append(m)
                if len(pending) > lag:
                    compute.append(("W", pending.pop(0)))

        compute.extend(("F", m) for m in range(warm))
        for i in range(M - warm):
            compute.append(("F", warm + i))
            backward(i)
        for m in range(M - warm, M):
            backward(m)
        compute.extend(("W", m) for m in pending)

    acts: list[tuple[str, int | None]] = [("UNSHARD", None)]
    for op, m in compute:
        if op == "F":
            if stage > 0:
                acts.append(("RECV_F", m))
            acts.append(("F", m))
            if stage < S - 1:
                acts.append(("SEND_F", m))
        elif op in ("B", "I"):
            if stage < S - 1:
                acts.append(("RECV_B", m))
            acts.append((op, m))
            if stage > 0:
                acts.append(("SEND_B", m))
        else:
            acts.append((op, m))
    acts += [("RESHARD", None), ("REDUCE_GRAD", None)]
    return acts


class _Costs:
    """CPU slots per action and nominal GPU durations, from the config only."""

    def __init__(self, cfg: SynthConfig) -> None:
        self.slot = 8_000 + 1_500 * cfg.python_noise  # one cpu_op with its python frames
        graph = 1 if cfg.graph_kernels else 0
        slots = {
            "F": cfg.eager_kernels + graph + 1, "B": cfg.eager_kernels + graph + 1,
            "I": cfg.eager_kernels + graph + 1, "W": cfg.eager_kernels + graph,
            "UNSHARD": 2, "RESHARD": 1, "REDUCE_GRAD": 3 + cfg.collectives,
        }
        for op in P2P_OPS:
            slots[op] = 2
        self.cpu = {op: 2 * PAD + max(n, 1) * self.slot for op, n in slots.items()}
        self.lead = PAD + self.slot + 5_000  # CPU annotation starts this long before the GPU plan
        f = int(2.5 * self.cpu["F"])
        nominal = {"F": f, "B": 2 * f, "I": f, "W": int(0.8 * f), "UNSHARD": 250_000,
                   "RESHARD": 0, "REDUCE_GRAD": 350_000}
        for op in P2P_OPS:
            nominal[op] = 40_000
        self.gpu = {op: max(nominal[op], int(1.3 * self.cpu[op])) for op in self.cpu}


@dataclass(slots=True)
class _Act:
    op: str
    mb: int | None
    g0: int  # planned GPU start (ns, internal)
    g1: int  # planned GPU end


def _plan_step(cfg: SynthConfig, lists: list[list[tuple[str, int | None]]], costs: _Costs,
               step: int, t0: int) -> tuple[list[list[_Act]], int]:
    """Simulate one step of the pipeline (all stages) in GPU time; returns the plan and next step start."""
    rng = random.Random(f"{cfg.seed}:plan:{step}")
    S = len(lists)
    out: list[list[_Act]] = [[] for _ in range(S)]
    pos = [0] * S
    free = [t0] * S
    sends: dict[tuple[str, int, int | None], int] = {}
    left = sum(map(len, lists))
    while left:
        moved = False
        for s in range(S):
            lst = lists[s]
            while pos[s] < len(lst):
                op, m = lst[pos[s]]
                peer = None
                if op == "RECV_F":
                    peer = sends.get(("SEND_F", s - 1, m))
                elif op == "RECV_B":
                    peer = sends.get(("SEND_B", s + 1, m))
                if op in ("RECV_F", "RECV_B") and peer is None:
                    break  # the sender has not got there yet
                start = free[s] + rng.randint(2_000, 8_000)
                dur = max(int(costs.gpu[op] * (0.92 + 0.16 * rng.random())), costs.cpu[op] + PAD)
                end = start + dur
                if peer is not None:
                    end = max(end, peer + RECV_AFTER_SEND)
                if op in ("SEND_F", "SEND_B"):
                    sends[(op, s, m)] = start
                out[s].append(_Act(op, m, start, end))
                free[s] = end
                pos[s] += 1
                left -= 1
                moved = True
        if not moved:
            raise RuntimeError("pipeline schedule deadlocked")  # a bug in stage_actions
    return out, max(free) + rng.randint(100_000, 200_000)


def _stretched(acts: list[_Act], t0: int, t_next: int, factor: float) -> tuple[list[_Act], int]:
    """A slow rank's step: its plan's times from the step start ``t0`` scaled by
    ``factor`` (its GPU work and its step last longer; it drifts later step by
    step; its P2P peers do not wait for it, its collective peers only with
    ``collectives``)."""
    def at(t: int) -> int:
        return t0 + int((t - t0) * factor)
    return [_Act(a.op, a.mb, at(a.g0), at(a.g1)) for a in acts], at(t_next)


# ---------------------------------------------------------------- collective args (SynthConfig.collectives)

ALL_TO_ALLV_UNIT = 1 << 16  # all_to_allv split sizes are 1 to 4 of these elements


def process_groups(cfg: SynthConfig, rank: int) -> dict[str, dict]:
    """A rank's process groups with ``collectives``, named as PyTorch names them (one name per group,
    counting from the default group "0"): ``world``, ``fsdp`` (its stage's DP ranks), ``pp`` (its pipeline)."""
    d, stage = cfg.dp_degree, pp_rank_of(cfg, rank)
    return {
        "fsdp": {"pg_name": str(1 + stage), "pg_desc": "mesh_dp_shard", "pg_size": d,
                 "ranks": [stage * d + i for i in range(d)]},
        "pp": {"pg_name": str(1 + cfg.pp_stages + rank % d), "pg_desc": "mesh_pp", "pg_size": cfg.pp_stages,
               "ranks": pp_group_of(cfg, rank)},
        "world": {"pg_name": "0", "pg_desc": "default_pg", "pg_size": cfg.ranks, "ranks": list(range(cfg.ranks))},
    }


def collective_sizes(coll: str, size: int, i: int) -> tuple[int, int, str]:
    """In and out element counts and dtype of a collective: an all-gather's input is a shard of its output,
    a reduce-scatter's output a shard of its input; the i-th all-gather of an unshard is bigger."""
    if coll == "_allgather_base":
        return (1 + i) << 18, size * ((1 + i) << 18), "BFloat16"
    if coll == "_reduce_scatter_base":
        return size << 19, 1 << 19, "Float"
    if coll == "allreduce":
        return 3 << 19, 3 << 19, "Float"
    return 1 << 20, 1 << 20, "BFloat16"  # send, recv (PP activations), all_to_allv (its splits decide)


def all_to_allv_splits(cfg: SynthConfig, rank: int, step: int) -> tuple[list[int], list[int]]:
    """Elements ``rank`` sends to each rank and receives from each (what each sender sends it) in an
    all_to_allv of step ``step``: ``(1 + (2 * sender + receiver + step) % 4)`` units, uneven on purpose."""
    def sent(sender: int, receiver: int) -> int:
        return ALL_TO_ALLV_UNIT * (1 + (2 * sender + receiver + step) % 4)
    return ([sent(rank, peer) for peer in range(cfg.ranks)], [sent(peer, rank) for peer in range(cfg.ranks)])


# ---------------------------------------------------------------- output plumbing


class _Sink:
    """Encoded events -> one JSON array body (one event per line), buffered.

    ``bytes`` counts what was flushed; call :meth:`flush` before reading it.
    """

    BATCH = 256  # orjson output objects carry ~4 KB of allocation each: keep few alive

    def __init__(self, out: BinaryIO, layout: str = "lines") -> None:
        self._out = out
        self._encode = _kineto_text if layout == "kineto" else _dumps
        self._buf: list[bytes] = []
        self._sep = b"\n"
        self.bytes = 0
        self.count = 0

    def raw(self, data: bytes) -> None:
        self.flush()
        self._out.write(data)
        self.bytes += len(data)

    def event(self, ev: dict) -> int:
        """Queue one event; return its index in the array."""
        buf = self._buf
        buf.append(self._encode(ev))
        n = self.count
        self.count = n + 1
        if len(buf) >= self.BATCH:
            self.flush()
        return n

    def flush(self) -> None:
        if self._buf:
            chunk = self._sep + b",\n".join(self._buf)
            self._sep = b",\n"
            self._buf.clear()
            self._out.write(chunk)
            self.bytes += len(chunk)


_KINETO_FIRST_LINE = ("ph", "cat", "name", "pid", "tid")
_KINETO_TIMES = ("ts", "dur")


def _kineto_text(event: dict) -> bytes:
    """An event laid out as Kineto's JSON writer lays it out: indented lines
    (kind and place, times, the rest, then ``args`` a line of its own), a
    space after every colon and comma: what real traces look like to a reader."""
    groups = ([(key, value) for key, value in event.items() if key in _KINETO_FIRST_LINE],
              [(key, value) for key, value in event.items() if key in _KINETO_TIMES],
              [(key, value) for key, value in event.items()
               if key not in _KINETO_FIRST_LINE and key not in _KINETO_TIMES and key != "args"])
    lines = [_members(group) for group in groups if group]
    if "args" in event:
        args = event["args"]
        lines.append(f'"args": {{\n      {_members(args.items())}\n    }}' if args else '"args": {}')
    return ("  {\n    " + ",\n    ".join(lines) + "\n  }").encode()


def _members(pairs) -> str:
    return ", ".join(f"{_dumps(key).decode()}: {_dumps(value).decode()}" for key, value in pairs)


class _Links:
    """Streams ``gpu_index,launch_index,correlation`` rows of the launch truth."""

    def __init__(self, out: TextIO | None) -> None:
        self._out = out
        self._buf: list[str] = []
        if out is not None:
            out.write("gpu_index,launch_index,correlation\n")

    def row(self, gpu: int, launch: int, corr: int) -> None:
        if self._out is not None:
            self._buf.append(f"{gpu},{launch},{corr}\n")
            if len(self._buf) >= 16384:
                self.flush()

    def flush(self) -> None:
        if self._out is not None and self._buf:
            self._out.write("".join(self._buf))
            self._buf.clear()


@dataclass
class RankTruth:
    """What one rank's event stream contains (indexes are 0-based positions in its traceEvents)."""

    rank: int
    file: str | None
    pp_rank: int
    pp_stage: int
    pp_group: list[int]
    dp_rank: int
    cpu_pid: int
    cpu_tids: list[int]
    gpu_pid: int  # in the rank file (= local device index)
    merged_gpu_pid: int  # in the merged file (= global rank)
    base_time_ns: int
    steps: int = 0
    events: int = 0
    bytes: int = 0  # uncompressed size of the rank file
    gpu_events: int = 0  # kernel + gpu_memcpy + gpu_memset
    kernels: int = 0
    gpu_memcpy: int = 0
    gpu_memset: int = 0
    runtime_calls: int = 0
    runtime_launches: int = 0  # runtime calls that launched GPU work
    graph_launches: int = 0
    gpu_events_per_graph_launch: int = 0
    flow_starts: int = 0
    flow_finishes: int = 0
    gpu_user_annotations: int = 0
    pp_annotations: int = 0  # CPU user_annotations named by the PP (or GPipe) pattern
    pp_action_counts: dict[str, int] = field(default_factory=dict)
    pp_actions_per_step: list[list] = field(default_factory=list)  # [name, op, stage, mb]; same every step
    gpu_streams: list[int] = field(default_factory=list)
    collective_kernels: int = 0  # NCCL kernels (every one carries the collective args)
    correlation_min: int | None = None
    correlation_max: int | None = None
    links_file: str | None = None
    merged_offset: int | None = None

    def to_dict(self) -> dict:
        return asdict(self)


# ---------------------------------------------------------------- one rank's events


class _RankGen:
    """Emits one rank's events step by step into a sink (a rank file or the merged file)."""

    def __init__(self, cfg: SynthConfig, rank: int, sink: _Sink, *, links: _Links | None = None,
                 origin_ns: int | None = None, gpu_pid: int | None = None,
                 merged_style: str | None = None) -> None:
        self.cfg = cfg
        self.rank = rank
        self.sink = sink
        self.links = links or _Links(None)
        self.base_index = sink.count
        self.origin = rank_base_ns(cfg, rank) - cfg.base_time_ns if origin_ns is None else origin_ns
        self.merged_style = merged_style
        self.rank_arg = merged_style == "rank-arg"
        self._event = sink.event
        self.rng = random.Random(f"{cfg.seed}:rank:{rank}")
        self.costs = _Costs(cfg)
        self.lists = [stage_actions(cfg, s) for s in range(cfg.pp_stages)]
        self.stage = pp_rank_of(cfg, rank)
        self.group = pp_group_of(cfg, rank)
        self.gpus_per_node = min(8, cfg.ranks)
        self.device = rank % self.gpus_per_node
        self.cpu_pid = CPU_PID_BASE + CPU_PID_STRIDE * rank
        self.main_tid = self.cpu_pid
        self.bwd_tid = self.cpu_pid + BWD_TID_OFFSET
        self.gpu_pid = self.device if gpu_pid is None else gpu_pid
        rt = _RUNTIME
        self.rt = {k: (v[2], "cid", v[3]) if cfg.hip else (v[0], "cbid", v[1]) for k, v in rt.items()}
        self.corr = CORRELATION_START
        self.ext = 1
        self.py_id = 1
        self.free: dict[int, int] = {}
        self.spans: dict[int, list[int]] = {}  # current annotation group: stream -> [start, end]
        self.step_spans: dict[int, list[int]] = {}
        self.t_step = T0_NS + max(0, (cfg.ranks - 1) * cfg.base_skew_ns)
        self.t_first: int | None = None
        self.t_last = self.t_step
        d = cfg.dp_degree
        dp_group = [self.stage * d + i for i in range(d)]
        self.pg = {
            "fsdp": ("1", "mesh_dp_shard", d, str(dp_group), 0),
            "pp": ("torchtitan_real_pp", "mesh_pp", cfg.pp_stages, str(self.group), 1),
            "world": ("0", "default_pg", cfg.ranks, str(list(range(cfg.ranks))), 2),
        }
        if cfg.collectives:
            self.pg = {kind: (g["pg_name"], g["pg_desc"], g["pg_size"], str(g["ranks"]), at)
                       for at, (kind, g) in enumerate(process_groups(cfg, rank).items())}
        self.truth = RankTruth(
            rank=rank, file=None, pp_rank=self.stage, pp_stage=self.stage, pp_group=self.group,
            dp_rank=rank % d, cpu_pid=self.cpu_pid, cpu_tids=[self.main_tid, self.bwd_tid],
            gpu_pid=self.device, merged_gpu_pid=rank, base_time_ns=rank_base_ns(cfg, rank),
            gpu_events_per_graph_launch=cfg.graph_kernels,
        )
        self.steps_done = 0
        self.seq: dict[str, int] = {}  # process group kind -> collectives issued (record_param_comms's Seq)
        self.step_t0 = self.slow_t0 = self.t_slow = self.t_step  # this step's start, and the slow rank's
        self.normal_t0 = self.t_normal = self.t_step  # the other ranks' step start
        self.reduce_grad: list[tuple[int, int]] = []  # per stage: its REDUCE_GRAD's GPU times from the step start
        self.pg_free: dict[str, int] = {}  # process group kind -> end of its last collective on this rank

    # -- primitives

    def _emit(self, ev: dict) -> int:
        """Write an event; return its index within this rank's events."""
        if self.rank_arg:
            args = ev.get("args")
            ev["args"] = {**args, "rank": self.rank} if args else {"rank": self.rank}
        return self._event(ev) - self.base_index

    def _ts(self, t: int) -> float:
        return (t - self.origin) / 1000

    def _x(self, cat: str, name: str, pid, tid, t0: int, t1: int, args: dict) -> int:
        return self._emit({"ph": "X", "cat": cat, "name": name, "pid": pid, "tid": tid,
                           "ts": (t0 - self.origin) / 1000, "dur": (t1 - t0) / 1000, "args": args})

    def _op(self, tid: int, t0: int, name: str, rt: str | None, frames: tuple[str, ...] = _PY_FRAMES_COMM,
            comms: dict | None = None) -> tuple[int, int, int, int]:
        """A cpu_op in a CPU slot, wrapped in python frames, with one runtime call inside.

        Returns (external id, correlation, runtime event index, runtime end); the last
        three are -1/-1/end-of-op when ``rt`` is None.  ``comms``: the op launches
        through a ``record_param_comms`` op with these args, as c10d's ops do.
        """
        rng = self.rng
        n = self.cfg.python_noise
        w = int(self.costs.slot * (0.8 + 0.15 * rng.random()))
        e = w // (4 * n + 8)
        pid = self.cpu_pid
        parent = 0
        for j in range(n):
            self.py_id += 1
            self._x("python_function", frames[(j + tid) % len(frames)], pid, tid,
                    t0 + j * e, t0 + w - j * e, {"Python parent id": parent, "Python id": self.py_id})
            parent = self.py_id
        o0, o1 = t0 + n * e + e, t0 + w - n * e - e
        ext = self.ext
        self.ext += 1
        self._x("cpu_op", name, pid, tid, o0, o1, {"External id": ext, "Record function id": 0})
        if rt is None:
            return ext, -1, -1, o1
        ow = o1 - o0
        r0 = o0 + ow // 5 + int(ow * 0.1 * rng.random())
        r1 = o1 - ow // 10 - int(ow * 0.1 * rng.random())
        if comms is not None:
            ext = self._record_param_comms(tid, o0 + ow // 10, o1 - ow // 20, comms)
        corr = self.corr
        self.corr += 1
        rname, key, code = self.rt[rt]
        idx = self._x("cuda_runtime", rname, pid, tid, r0, r1,
                      {"External id": ext, key: code, "correlation": corr})
        self.truth.runtime_calls += 1
        if rt not in _NO_GPU_WORK:
            self._emit({"ph": "s", "id": corr, "pid": pid, "tid": tid, "ts": (r0 - self.origin) / 1000,
                        "cat": "ac2g", "name": "ac2g"})
            self.truth.runtime_launches += 1
            self.truth.flow_starts += 1
            if rt == "graph":
                self.truth.graph_launches += 1
        return ext, corr, idx, r1

    def _place(self, stream: int, want: int, dur: int, launch_end: int) -> tuple[int, int]:
        """Start/end of a GPU event: not before its launch, never overlapping its stream."""
        start = max(want, launch_end + LAUNCH_LAT + int(1000 * self.rng.random()), self.free.get(stream, 0))
        end = start + max(dur, MIN_GPU_DUR)
        self.free[stream] = end
        return start, end

    def _gpu(self, cat: str, name: str, stream: int, start: int, end: int, corr: int,
             launch_idx: int, args: dict) -> None:
        """Emit a GPU event, its ac2g finish, and its truth row."""
        idx = self._x(cat, name, self.gpu_pid, stream, start, end, args)
        self._emit({"ph": "f", "id": corr, "pid": self.gpu_pid, "tid": stream,
                    "ts": (start - self.origin) / 1000, "cat": "ac2g", "name": "ac2g", "bp": "e"})
        self.links.row(idx, launch_idx, corr)
        t = self.truth
        t.gpu_events += 1
        t.flow_finishes += 1
        if cat == "kernel":
            t.kernels += 1
        elif cat == "gpu_memcpy":
            t.gpu_memcpy += 1
        else:
            t.gpu_memset += 1
        for spans in (self.spans, self.step_spans):
            sp = spans.get(stream)
            if sp is None:
                spans[stream] = [start, end]
            else:
                if start < sp[0]:
                    sp[0] = start
                if end > sp[1]:
                    sp[1] = end
        if end > self.t_last:
            self.t_last = end

    def _gpu_base(self, ext: int, stream: int, corr: int) -> dict:
        return {"External id": ext, "queued": 0, "device": self.device, "context": 1,
                "stream": stream, "correlation": corr}

    def _nccl(self, kind: str, comm: dict, pg: str, ext: int, stream: int, corr: int, launch_idx: int,
              start: int, end: int, peer: dict | None = None) -> None:
        args = self._gpu_base(ext, stream, corr)
        args.update({"registers per thread": 96, "shared memory": 87568, "blocks per SM": 0.121212,
                     "warps per SM": 2.060606, "grid": [16, 1, 1], "block": [544, 1, 1],
                     "est. achieved occupancy %": 0})
        args.update(comm)
        if peer:
            args.update(peer)
        if self.cfg.big_ints:
            args["Comms Id"] = BIG_COMMS_ID - self.pg[pg][4]
        self.truth.collective_kernels += 1
        self._gpu("kernel", _NCCL_KERNEL[kind], stream, start, end, corr, launch_idx, args)

    # -- actions

    def _compute(self, a: _Act, tid: int, ann_name: str) -> None:
        cfg, rng, slot = self.cfg, self.rng, self.costs.slot
        t = a.g0 - self.costs.lead + PAD
        d = a.g1 - a.g0
        eager_end = a.g0 + d * 2 // 5
        pre = {"F": "memcpy", "B": "memset", "I": "memset"}.get(a.op)
        n_e = cfg.eager_kernels + (1 if pre else 0)
        step_e = (eager_end - a.g0) // max(n_e, 1)
        k = 0
        if pre:
            name = "aten::copy_" if pre == "memcpy" else "aten::zero_"
            ext, corr, idx, rend = self._op(tid, t, name, pre, _PY_FRAMES)
            t += slot
            start, end = self._place(STREAM_COMPUTE, a.g0, step_e // 3, rend)
            args = self._gpu_base(ext, STREAM_COMPUTE, corr)
            del args["queued"]
            nbytes = 4194304 if pre == "memcpy" else 67108864
            args["bytes"] = nbytes
            args["memory bandwidth (GB/s)"] = round(nbytes / max(end - start, 1), 6)
            if pre == "memcpy":
                self._gpu("gpu_memcpy", "Memcpy HtoD (Pinned -> Device)", STREAM_COMPUTE, start, end, corr, idx, args)
            else:
                self._gpu("gpu_memset", "Memset (Device)", STREAM_COMPUTE, start, end, corr, idx, args)
            k = 1
        backward = a.op != "F"
        for i in range(cfg.eager_kernels):
            j = (i * 3 + k) % len(_EAGER_KERNELS)
            opname, kname, regs, smem, grid, block = _EAGER_KERNELS[j]
            if backward:
                opname = _BWD_OP_PREFIX + _BWD_OPS[j]
            ext, corr, idx, rend = self._op(tid, t, opname, "kernel", _PY_FRAMES)
            t += slot
            dur = int(step_e * (0.5 + 0.45 * rng.random()))
            start, end = self._place(STREAM_COMPUTE, a.g0 + k * step_e, dur, rend)
            args = self._gpu_base(ext, STREAM_COMPUTE, corr)
            args.update({"registers per thread": regs, "shared memory": smem, "blocks per SM": 1.939394,
                         "warps per SM": 15.515152, "grid": grid, "block": block,
                         "est. achieved occupancy %": 24})
            self._gpu("kernel", kname, STREAM_COMPUTE, start, end, corr, idx, args)
            k += 1
        n = cfg.graph_kernels
        if n:
            ext, corr, idx, rend = self._op(tid, t, "CUDAGraph::replay", "graph", _PY_FRAMES)
            gstep = max((a.g1 - eager_end) // (n + 1), 1)
            rot = rng.randrange(cfg.graph_streams)
            mode = cfg.kernel_annotations
            for i in range(n):
                stream = GRAPH_STREAM_BASE + (i + rot) % cfg.graph_streams
                want = eager_end + i * gstep
                start = max(want, rend + LAUNCH_LAT, self.free.get(stream, 0))
                dur = int(gstep * (0.9 + 0.7 * rng.random()))
                if start + dur > a.g1:
                    dur = a.g1 - start
                end = start + max(dur, MIN_GPU_DUR)
                self.free[stream] = end
                args = self._gpu_base(ext, stream, corr)
                args.update({"registers per thread": 128, "shared memory": 98304, "blocks per SM": 1,
                             "warps per SM": 8, "grid": [132, 1, 1], "block": [256, 1, 1],
                             "est. achieved occupancy %": 12})
                if mode == "pp":
                    args["name"] = ann_name
                elif mode == "module":
                    run = i // 4
                    if run % 3 != 2:  # runs of 4 neighbouring kernels share a name; some carry none
                        part = "attention" if run % 2 == 0 else "feed_forward"
                        args["name"] = f"layers.{run // 2}.{part}"
                self._gpu("kernel", _GRAPH_KERNELS[i % len(_GRAPH_KERNELS)], stream, start, end, corr, idx, args)

    def _p2p(self, a: _Act, tid: int) -> None:
        t = a.g0 - self.costs.lead + PAD
        send = a.op.startswith("SEND")
        stream = STREAM_P2P_NEXT if a.op in ("SEND_F", "RECV_B") else STREAM_P2P_PREV
        peer_stage = self.stage + (1 if stream == STREAM_P2P_NEXT else -1)
        peer = self.group[peer_stage]
        comm = self._comm("send" if send else "recv", "pp")
        ext, corr, idx, rend = self._op(tid, t, "c10d::send" if send else "c10d::recv_", "kernel",
                                        comms=self._comms_op(comm, "pp"))
        start = max(a.g0, rend + LAUNCH_LAT, self.free.get(stream, 0))
        start, end = self._place(stream, start, a.g1 - start, rend)
        self._nccl("sendrecv", comm, "pp", ext, stream, corr, idx, start, end,
                   {"Dst Rank": peer} if send else {"Src Rank": peer})
        self._op(tid, t + self.costs.slot, "_c10d_functional::wait_tensor", "wait")

    def _fsdp(self, a: _Act, tid: int) -> None:
        t = a.g0 - self.costs.lead + PAD
        slot = self.costs.slot
        d = a.g1 - a.g0
        if a.op == "UNSHARD":
            for i in range(2):
                comm = self._comm("_allgather_base", "fsdp", i)
                ext, corr, idx, rend = self._op(tid, t + i * slot, "c10d::_allgather_base_", "kernel",
                                                comms=self._comms_op(comm, "fsdp"))
                dur = int((d // 2 - 3_000) * (0.85 + 0.15 * self.rng.random()))
                start, end = self._place(STREAM_ALLGATHER, a.g0 + i * d // 2, dur, rend)
                start, end = self._collective("fsdp", STREAM_ALLGATHER, a.g0 + i * d // 2, start, end)
                self._nccl("allgather", comm, "fsdp", ext, STREAM_ALLGATHER, corr, idx, start, end)
        elif a.op == "RESHARD":
            self._op(tid, t, "aten::resize_", None)
        else:  # REDUCE_GRAD
            ext, corr, idx, rend = self._op(tid, t, "aten::zero_", "memset")
            start, end = self._place(STREAM_REDUCE_SCATTER, a.g0, d // 50, rend)
            args = self._gpu_base(ext, STREAM_REDUCE_SCATTER, corr)
            del args["queued"]
            args["bytes"] = 33554432
            args["memory bandwidth (GB/s)"] = round(33554432 / max(end - start, 1), 6)
            self._gpu("gpu_memset", "Memset (Device)", STREAM_REDUCE_SCATTER, start, end, corr, idx, args)
            comm = self._comm("_reduce_scatter_base", "fsdp")
            ext, corr, idx, rend = self._op(tid, t + slot, "c10d::_reduce_scatter_base_", "kernel",
                                            comms=self._comms_op(comm, "fsdp"))
            start, end = self._place(STREAM_REDUCE_SCATTER, a.g0 + d // 20, d // 2, rend)
            start, end = self._collective("fsdp", STREAM_REDUCE_SCATTER, a.g0 + d // 20, start, end)
            self._nccl("reducescatter", comm, "fsdp", ext, STREAM_REDUCE_SCATTER, corr, idx, start, end)
            comm = self._comm("allreduce", "world")
            ext, corr, idx, rend = self._op(tid, t + 2 * slot, "c10d::allreduce_", "kernel",
                                            comms=self._comms_op(comm, "world"))
            start, end = self._place(STREAM_ALLREDUCE, a.g0 + d * 3 // 5, d * 3 // 8, rend)
            start, end = self._collective("world", STREAM_ALLREDUCE, a.g0 + d * 3 // 5, start, end, 3 / 5)
            self._nccl("allreduce", comm, "world", ext, STREAM_ALLREDUCE, corr, idx, start, end)
            if self.cfg.collectives:
                self._all_to_allv(tid, t + 3 * slot, a.g0 + d // 2, d // 4)

    def _action(self, a: _Act, ann_name: str) -> None:
        tid = self.bwd_tid if a.op in ("B", "I", "W") else self.main_tid
        if a.op in COMPUTE_OPS:
            self._compute(a, tid, ann_name)
        elif a.op in P2P_OPS:
            self._p2p(a, tid)
        else:
            self._fsdp(a, tid)

    # -- collective args (SynthConfig.collectives; the default keeps the older constant args)

    def _comm(self, coll: str, pg: str, i: int = 0) -> dict:
        """The collective args Kineto writes on a NCCL kernel (and on its record_param_comms op)."""
        pg_name, pg_desc, size, ranks, _ = self.pg[pg]
        n_in = n_out = 16777216
        dtype = "BFloat16"
        splits = ("[]", "[]")
        if self.cfg.collectives:
            n_in, n_out, dtype = collective_sizes(coll, size, i)
            if coll == "all_to_allv":
                sent, received = all_to_allv_splits(self.cfg, self.rank, self.steps_done)
                n_in, n_out, splits = sum(sent), sum(received), (str(sent), str(received))
        return {"Collective name": coll, "In msg nelems": n_in, "Out msg nelems": n_out, "Group size": size,
                "dtype": dtype, "In split size": splits[0], "Out split size": splits[1], "Process Group Name": pg_name,
                "Process Group Description": pg_desc, "Process Group Ranks": ranks}

    def _comms_op(self, comm: dict, pg: str) -> dict | None:
        """record_param_comms's args (None without SynthConfig.collectives): the collective's, the
        group's first rank and stride, this rank, and the op's number among its group's (``Seq``)."""
        if not self.cfg.collectives:
            return None
        ranks = process_groups(self.cfg, self.rank)[pg]["ranks"]
        seq = self.seq[pg] = self.seq.get(pg, 0) + 1
        stride = ranks[1] - ranks[0] if len(ranks) > 1 else 1
        return {**comm, "Rank": self.rank, "Global rank start": ranks[0], "Global rank stride": stride, "Seq": seq}

    def _record_param_comms(self, tid: int, t0: int, t1: int, args: dict) -> int:
        """The record_param_comms op c10d wraps a collective's launch in; returns its External id."""
        ext = self.ext
        self.ext += 1
        self._x("cpu_op", "record_param_comms", self.cpu_pid, tid, t0, t1,
                {"External id": ext, "Record function id": 0, **args})
        return ext

    def _slow_time(self, t: int) -> int:
        """When the slow rank reaches a time ``t`` of this rank's plan (its steps start later and last longer)."""
        return self.slow_t0 + int((t - self.step_t0) * self.cfg.slow_factor)

    def _collective(self, pg: str, stream: int, want: int, start: int, end: int,
                    fraction: float | None = None) -> tuple[int, int]:
        """With ``collectives``, a collective kernel's times as NCCL runs them: after the group's previous
        collective on this rank (one communicator runs its collectives in order), and not ending before
        the group's last rank arrives plus the transfer (this kernel's own duration).  Arrivals come from
        the plan: ``want`` for the ranks of this stage (the slow rank's stretched), and for a group over
        several stages (``fraction`` of the way into each stage's REDUCE_GRAD) each stage's own time."""
        if not self.cfg.collectives:
            return start, end
        shift = max(0, self.pg_free.get(pg, 0) - start)
        start, end = start + shift, end + shift
        slow = self.cfg.slow_rank
        arrivals = []
        for member in process_groups(self.cfg, self.rank)[pg]["ranks"]:
            if fraction is None:  # (a group of this rank's stage)
                if member == slow != self.rank:
                    arrivals.append(self._slow_time(want))
                continue
            g0, g1 = self.reduce_grad[pp_rank_of(self.cfg, member)]
            at = g0 + int((g1 - g0) * fraction)
            arrivals.append(self.slow_t0 + int(at * self.cfg.slow_factor) if member == slow else self.normal_t0 + at)
        if arrivals:
            end = max(end, max(arrivals) + LAUNCH_LAT + (end - start))
        self.free[stream] = self.pg_free[pg] = end
        return start, end

    def _all_to_allv(self, tid: int, t: int, want: int, dur: int) -> None:
        """An all_to_allv over the world group, each rank sending its own split sizes (MoE token routing)."""
        comm = self._comm("all_to_allv", "world")
        ext, corr, idx, rend = self._op(tid, t, "c10d::alltoall_base_", "kernel", comms=self._comms_op(comm, "world"))
        scale = comm["In msg nelems"] / (ALL_TO_ALLV_UNIT * 2.5 * self.cfg.ranks)
        start, end = self._place(STREAM_ALLTOALL, want, int(dur * scale), rend)
        start, end = self._collective("world", STREAM_ALLTOALL, want, start, end, 1 / 2)
        self._nccl("alltoall", comm, "world", ext, STREAM_ALLTOALL, corr, idx, start, end)

    # -- grouping into annotations

    def _groups(self, acts: list[_Act]) -> list[tuple[str, str | None, list[_Act]]]:
        """(annotation name, PP op or None, actions) per annotation, in order."""
        if self.cfg.schedule != "gpipe":
            return [(pp_action_name(self.stage, a.op, a.mb), a.op, [a]) for a in acts]
        fsdp = {"UNSHARD": "FSDP::all_gather", "RESHARD": "FSDP::reshard", "REDUCE_GRAD": "FSDP::reduce_grad"}
        groups: list[tuple[str, str | None, list[_Act]]] = []
        for a in acts:
            if a.op in fsdp:
                groups.append((fsdp[a.op], None, [a]))
                continue
            fwd = a.op in ("F", "RECV_F", "SEND_F")
            name = f"{'Forward' if fwd else 'Backward'} {a.mb}"
            if groups and groups[-1][0] == name:
                groups[-1][2].append(a)
            else:
                groups.append((name, "F" if fwd else "B", [a]))
        return groups

    def step(self, n: int) -> None:
        """Emit ProfilerStep#n of this rank."""
        plan, t_next = _plan_step(self.cfg, self.lists, self.costs, n, self.t_step)
        acts = plan[self.stage]
        self.step_t0, self.slow_t0, self.normal_t0 = self.t_step, self.t_slow, self.t_normal
        self.t_slow = self._slow_time(t_next)
        self.t_normal = self.normal_t0 + t_next - self.step_t0
        self.reduce_grad = [next((a.g0 - self.step_t0, a.g1 - self.step_t0) for a in acts_of if a.op == "REDUCE_GRAD")
                            for acts_of in plan]
        if self.rank == self.cfg.slow_rank:
            acts, t_next = _stretched(acts, self.t_step, t_next, self.cfg.slow_factor)
        self.t_step = t_next
        lead, cpu = self.costs.lead, self.costs.cpu
        c_first = acts[0].g0 - lead - 5_000
        c_last = acts[-1].g0 - lead + cpu[acts[-1].op] + 5_000
        if self.t_first is None:
            self.t_first = c_first - 50_000
        step_name = f"ProfilerStep#{n}"
        step_ext = self.ext
        self.ext += 1
        self._x("user_annotation", step_name, self.cpu_pid, self.main_tid, c_first, c_last,
                {"External id": step_ext, "Record function id": 0})
        self.step_spans = {}
        truth = self.truth
        for name, op, group in self._groups(acts):
            c0 = group[0].g0 - lead
            c1 = group[-1].g0 - lead + cpu[group[-1].op] - self.rng.randrange(PAD // 2)
            ext = self.ext
            self.ext += 1
            self._x("user_annotation", name, self.cpu_pid, self.main_tid, c0, c1,
                    {"External id": ext, "Record function id": 0})
            self.spans = {}
            for a in group:
                self._action(a, name)
            for stream in sorted(self.spans):
                s0, s1 = self.spans[stream]
                self._x("gpu_user_annotation", name, self.gpu_pid, stream, s0, s1, {"External id": ext})
                truth.gpu_user_annotations += 1
            if op is not None:
                truth.pp_annotations += 1
                truth.pp_action_counts[op] = truth.pp_action_counts.get(op, 0) + 1
                if n == 0:
                    truth.pp_actions_per_step.append([name, op, self.stage, group[0].mb])
        for stream in sorted(self.step_spans):
            s0, s1 = self.step_spans[stream]
            self._x("gpu_user_annotation", step_name, self.gpu_pid, stream, s0, s1, {"External id": step_ext})
            truth.gpu_user_annotations += 1
        self.t_last = max(self.t_last, c_last)
        self.steps_done += 1

    def finish(self) -> RankTruth:
        """Emit Kineto's trailing metadata and instants; return the truth."""
        pid, gpid = self.cpu_pid, self.gpu_pid
        ts = self._ts(self.t_first if self.t_first is not None else self.t_step)
        named = self.merged_style == "process-name"
        streams = sorted(self.free)

        def meta(name: str, p, tid, args: dict) -> None:
            self._emit({"name": name, "ph": "M", "ts": ts, "pid": p, "tid": tid, "args": args})

        meta("process_name", pid, 0, {"name": f"RANK {self.rank} - CPU" if named else "python"})
        meta("process_labels", pid, 0, {"labels": "CPU"})
        meta("process_sort_index", pid, 0, {"sort_index": pid})
        meta("process_name", gpid, 0, {"name": f"RANK {self.rank} - GPU" if named else "python"})
        meta("process_labels", gpid, 0, {"labels": f"GPU {self.device}"})
        meta("process_sort_index", gpid, 0, {"sort_index": 16777216 + gpid})
        for s in streams:
            meta("thread_name", gpid, s, {"name": f"stream {s} "})
            meta("thread_sort_index", gpid, s, {"sort_index": s})
        for tid, label in ((self.main_tid, "python"), (self.bwd_tid, "pt_autograd_0")):
            meta("thread_name", pid, tid, {"name": f"thread {tid} ({label})"})
            meta("thread_sort_index", pid, tid, {"sort_index": tid})
        end = self.t_last + 20_000
        t0 = self.t_first if self.t_first is not None else self.t_step
        self._emit({"ph": "X", "cat": "Trace", "ts": ts, "dur": (end - t0) / 1000, "pid": "Spans",
                    "tid": "PyTorch Profiler", "name": "PyTorch Profiler (0)", "args": {"Op count": 0}})
        self._emit({"name": "process_sort_index", "ph": "M", "ts": ts, "pid": "Spans", "tid": 0,
                    "args": {"sort_index": 536870912}})
        self._emit({"name": "Iteration Start: PyTorch Profiler", "ph": "i", "s": "g", "pid": "Traces",
                    "tid": "Trace PyTorch Profiler", "ts": ts})
        self._emit({"name": "Record Window End", "ph": "i", "s": "g", "pid": "", "tid": "",
                    "ts": self._ts(end)})
        self.links.flush()
        t = self.truth
        t.steps = self.steps_done
        t.events = self.sink.count - self.base_index
        t.gpu_streams = streams
        if self.corr > CORRELATION_START:
            t.correlation_min, t.correlation_max = CORRELATION_START, self.corr - 1
        return t


# ---------------------------------------------------------------- file framing


def _device_properties(cfg: SynthConfig) -> list[dict]:
    proto = _HIP_DEVICE if cfg.hip else _CUDA_DEVICE
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
        self.sink = _Sink(out, cfg.layout)
        self.sink.raw(_header(cfg, rank))
        self.gen = _RankGen(cfg, rank, self.sink, links=_Links(links))

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
    sink = _Sink(out, cfg.layout)
    sink.raw(_header(cfg, 0))
    origin = rank_base_ns(cfg, 0) - cfg.base_time_ns
    rank_events = []
    for r in range(cfg.ranks):
        gen = _RankGen(cfg, r, sink, origin_ns=origin, gpu_pid=r, merged_style=merged_style)
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
