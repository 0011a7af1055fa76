"""Names, the pipeline plan shared by every rank (each stage's actions and their GPU time), and the
collective args Kineto writes on NCCL kernels (process groups, message sizes, all_to_allv splits)."""
from __future__ import annotations

import random
from dataclasses import dataclass

from .config import P2P_OPS, PAD, RECV_AFTER_SEND, SynthConfig, pp_group_of, pp_rank_of

# ---------------------------------------------------------------- names

# (cpu_op name, kernel name, registers, shared mem, grid, block)
EAGER_KERNELS = (
    ("aten::mm", "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x256x64_warpgroupsize2x1x1_execute_segment_k_off_kernel__5x_cublas", 168, 213248, [132, 1, 1], [384, 1, 1]),
    ("aten::add", "void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add<c10::BFloat16>, std::array<char*, 3ul> >(int, at::native::CUDAFunctor_add<c10::BFloat16>, std::array<char*, 3ul>)", 26, 0, [8192, 1, 1], [128, 1, 1]),
    ("aten::_fused_rms_norm", "void at::native::(anonymous namespace)::vectorized_layer_norm_kernel<c10::BFloat16, float, true>(int, float, c10::BFloat16 const*, c10::BFloat16 const*, c10::BFloat16 const*, float*, float*, c10::BFloat16*)", 40, 0, [8192, 1, 1], [256, 1, 1]),
    ("aten::_scaled_dot_product_flash_attention", "void pytorch_flash::flash_fwd_kernel<Flash_fwd_kernel_traits<128, 128, 64, 4, false, false, cutlass::bfloat16_t, Flash_kernel_traits<128, 128, 64, 4, cutlass::bfloat16_t> >, false, true, false, false, true, true, false, false>(pytorch_flash::Flash_fwd_params)", 255, 49152, [16, 32, 8], [128, 1, 1]),
    ("aten::silu", "void at::native::vectorized_elementwise_kernel<4, at::native::(anonymous namespace)::silu_kernel(at::TensorIteratorBase&)::{lambda()#1}::operator()() const::{lambda()#5}::operator()() const::{lambda(c10::BFloat16)#1}, std::array<char*, 2ul> >(int, at::native::(anonymous namespace)::silu_kernel(at::TensorIteratorBase&)::{lambda()#1}::operator()() const::{lambda()#5}::operator()() const::{lambda(c10::BFloat16)#1}, std::array<char*, 2ul>)", 24, 0, [21504, 1, 1], [128, 1, 1]),
    ("aten::mul", "void at::native::vectorized_elementwise_kernel<4, at::native::binary_internal::MulFunctor<c10::BFloat16>, std::array<char*, 3ul> >(int, at::native::binary_internal::MulFunctor<c10::BFloat16>, std::array<char*, 3ul>)", 28, 0, [21504, 1, 1], [128, 1, 1]),
    ("aten::copy_", "void at::native::elementwise_kernel<128, 4, at::native::gpu_kernel_impl_nocast<at::native::direct_copy_kernel_cuda(at::TensorIteratorBase&)::{lambda()#3}::operator()() const::{lambda()#12}::operator()() const::{lambda(c10::BFloat16)#1}>(at::TensorIteratorBase&, at::native::direct_copy_kernel_cuda(at::TensorIteratorBase&)::{lambda()#3}::operator()() const::{lambda()#12}::operator()() const::{lambda(c10::BFloat16)#1} const&)::{lambda(int)#1}>(int, at::native::gpu_kernel_impl_nocast<at::native::direct_copy_kernel_cuda(at::TensorIteratorBase&)::{lambda()#3}::operator()() const::{lambda()#12}::operator()() const::{lambda(c10::BFloat16)#1}>(at::TensorIteratorBase&, at::native::direct_copy_kernel_cuda(at::TensorIteratorBase&)::{lambda()#3}::operator()() const::{lambda()#12}::operator()() const::{lambda(c10::BFloat16)#1} const&)::{lambda(int)#1})", 30, 0, [4096, 1, 1], [128, 1, 1]),
    ("aten::mean", "void at::native::reduce_kernel<512, 1, at::native::ReduceOp<float, at::native::MeanOps<float, float, float, float>, unsigned int, float, 4, 4> >(at::native::ReduceOp<float, at::native::MeanOps<float, float, float, float>, unsigned int, float, 4, 4>)", 32, 16, [264, 1, 1], [32, 16, 1]),
)
BWD_OP_PREFIX = "autograd::engine::evaluate_function: "
BWD_OPS = ("MmBackward0", "AddBackward0", "FusedRmsNormBackward0", "ScaledDotProductFlashAttentionBackward0",
            "SiluBackward0", "MulBackward0", "ToCopyBackward0", "MeanBackward1")
GRAPH_KERNELS = (
    "triton_red_fused__to_copy_add_mean_mul_pow_rsqrt_0",
    "nvjet_tst_192x192_64x4_2x1_v_bz_coopA_TNT",
    "triton_poi_fused_mul_silu_1",
    "void cutlass::device_kernel<flash::enable_sm90_or_later<flash::FlashAttnFwdSm90<flash::CollectiveMainloopFwdSm90<2, cute::tuple<cute::C<1>, cute::C<1>, cute::C<1> >, cute::tuple<cute::C<128>, cute::C<128>, cute::C<128> >, 128, cutlass::bfloat16_t, float, cutlass::arch::Sm90, true, false, false, false, false, true, true, false, true, false, false>, flash::CollectiveEpilogueFwd<cute::tuple<cute::C<128>, cute::C<128>, cute::C<128> >, cute::tuple<cute::C<1>, cute::C<1>, cute::C<1> >, cutlass::bfloat16_t, cutlass::arch::Sm90, 256, true, false, false, false>, flash::DynamicPersistentTileScheduler<256, 128, false, true, false> > > >(flash::FlashAttnFwdSm90<...>::Params)",
    "triton_poi_fused__to_copy_add_2",
    "nvjet_tst_128x256_64x4_1x2_h_bz_coopA_NNT",
    "triton_per_fused__to_copy_mul_sum_3",
)
PY_FRAMES = (
    "torch/nn/modules/module.py(1784): _call_impl",
    "torch/nn/modules/module.py(1773): _wrapped_call_impl",
    "torchtitan/models/llama3/model.py(321): forward",
    "torch/distributed/pipelining/stage.py(702): forward_one_chunk",
    "torch/_dynamo/eval_frame.py(655): _fn",
    "torchtitan/models/llama3/model.py(235): forward",
    "<built-in method linear of type object at 0x7f3a91c2e8a0>",
)
PY_FRAMES_COMM = (
    "torch/distributed/pipelining/schedules.py(1987): _step_microbatches",
    "torch/distributed/c10d_logger.py(81): wrapper",
    "torch/distributed/distributed_c10d.py(2561): batch_isend_irecv",
    "torch/distributed/fsdp/_fully_shard/_fsdp_collectives.py(242): foreach_all_gather",
    "torch/distributed/distributed_c10d.py(4012): all_gather_into_tensor",
)
NCCL_KERNEL = {
    "allgather": "ncclDevKernel_AllGather_RING_LL(ncclDevKernelArgsStorage<4096ul>)",
    "reducescatter": "ncclDevKernel_ReduceScatter_Sum_bf16_RING_LL(ncclDevKernelArgsStorage<4096ul>)",
    "allreduce": "ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevKernelArgsStorage<4096ul>)",
    "sendrecv": "ncclDevKernel_SendRecv(ncclDevKernelArgsStorage<4096ul>)",
    "alltoall": "ncclDevKernel_SendRecv(ncclDevKernelArgsStorage<4096ul>)",
}
# runtime kind -> (cuda name, cbid, hip name, cid)
RUNTIME = {
    "kernel": ("cudaLaunchKernel", 211, "hipLaunchKernel", 185),
    "memcpy": ("cudaMemcpyAsync", 41, "hipMemcpyAsync", 110),
    "memset": ("cudaMemsetAsync", 51, "hipMemsetAsync", 132),
    "graph": ("cudaGraphLaunch", 311, "hipGraphLaunch", 215),
    "wait": ("cudaStreamWaitEvent", 147, "hipStreamWaitEvent", 175),
}
NO_GPU_WORK = ("wait",)

CUDA_DEVICE = {
    "name": "NVIDIA H100 80GB HBM3", "totalGlobalMem": 85029158912, "computeMajor": 9, "computeMinor": 0,
    "maxThreadsPerBlock": 1024, "maxThreadsPerMultiprocessor": 2048, "regsPerBlock": 65536, "warpSize": 32,
    "sharedMemPerBlock": 49152, "numSms": 132, "regsPerMultiprocessor": 65536,
    "sharedMemPerBlockOptin": 232448, "sharedMemPerMultiprocessor": 233472,
}
HIP_DEVICE = {
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


class Costs:
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
class Act:
    op: str
    mb: int | None
    g0: int  # planned GPU start (ns, internal)
    g1: int  # planned GPU end


def plan_step(cfg: SynthConfig, lists: list[list[tuple[str, int | None]]], costs: Costs,
               step: int, t0: int) -> tuple[list[list[Act]], int]:
    """Simulate one step of the pipeline (all stages) in GPU time; returns the plan and next step start."""
    rng = random.Random(f"{cfg.seed}:plan:{step}")
    S = len(lists)
    out: list[list[Act]] = [[] for _ in range(S)]
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
                out[s].append(Act(op, m, start, end))
                free[s] = end
                pos[s] += 1
                left -= 1
                moved = True
        if not moved:
            raise RuntimeError("pipeline schedule deadlocked")  # a bug in stage_actions
    return out, max(free) + rng.randint(100_000, 200_000)


def stretched(acts: list[Act], t0: int, t_next: int, factor: float) -> tuple[list[Act], int]:
    """A slow rank's step: its plan's times from the step start ``t0`` scaled by
    ``factor`` (its GPU work and its step last longer; it drifts later step by
    step; its P2P peers do not wait for it, its collective peers only with
    ``collectives``)."""
    def at(t: int) -> int:
        return t0 + int((t - t0) * factor)
    return [Act(a.op, a.mb, at(a.g0), at(a.g1)) for a in acts], at(t_next)


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


KINETO_LIST_MAX = 30  # Kineto writes longer lists of ranks truncated


def kineto_ranks(ranks: list[int]) -> str:
    """A ``Process Group Ranks`` value as Kineto writes it: the list's text, or beyond 30 ranks its first 29,
    ``...`` and its last (``[0, 1, ..., 28, ..., 63]``)."""
    if len(ranks) <= KINETO_LIST_MAX:
        return str(ranks)
    return "[" + ", ".join(map(str, ranks[:KINETO_LIST_MAX - 1])) + f", ..., {ranks[-1]}]"


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
