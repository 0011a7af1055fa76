"""One rank's events (:class:`RankGen`): steps of pipeline actions with their CPU ops, launches,
kernels on streams and CUDA-graph replays, annotations, NCCL collectives and flow arrows."""
from __future__ import annotations

import random

from .config import (
    BIG_COMMS_ID,
    BWD_TID_OFFSET,
    COMPUTE_OPS,
    CORRELATION_START,
    CPU_PID_BASE,
    CPU_PID_STRIDE,
    GRAPH_STREAM_BASE,
    LAUNCH_LAT,
    MIN_GPU_DUR,
    P2P_OPS,
    PAD,
    STREAM_ALLGATHER,
    STREAM_ALLREDUCE,
    STREAM_ALLTOALL,
    STREAM_COMPUTE,
    STREAM_P2P_NEXT,
    STREAM_P2P_PREV,
    STREAM_REDUCE_SCATTER,
    T0_NS,
    SynthConfig,
    pp_group_of,
    pp_rank_of,
    rank_base_ns,
)
from .plan import (
    ALL_TO_ALLV_UNIT,
    BWD_OP_PREFIX,
    BWD_OPS,
    EAGER_KERNELS,
    GRAPH_KERNELS,
    NCCL_KERNEL,
    NO_GPU_WORK,
    PY_FRAMES,
    PY_FRAMES_COMM,
    RUNTIME,
    Act,
    Costs,
    all_to_allv_splits,
    collective_sizes,
    kineto_ranks,
    plan_step,
    pp_action_name,
    process_groups,
    stage_actions,
    stretched,
)
from .sinks import Links, RankTruth, Sink

# ---------------------------------------------------------------- one rank's events


class RankGen:
    """Emits one rank's events step by step into a sink (a rank file or the merged file)."""

    def __init__(self, cfg: SynthConfig, rank: int, sink: Sink, *, links: Links | None = None,
                 origin_ns: int | None = None, gpu_pid: int | None = None,
                 merged_style: str | None = None) -> None:
        self.cfg = cfg
        self.rank = rank
        self.sink = sink
        self.links = links or Links(None)
        self.base_index = sink.count
        self.origin = rank_base_ns(cfg, rank) - cfg.base_time_ns if origin_ns is None else origin_ns
        self.merged_style = merged_style
        self.rank_arg = merged_style == "rank-arg"
        self._event = sink.event
        self.rng = random.Random(f"{cfg.seed}:rank:{rank}")
        self.costs = Costs(cfg)
        self.lists = [stage_actions(cfg, s) for s in range(cfg.pp_stages)]
        self.stage = pp_rank_of(cfg, rank)
        self.group = pp_group_of(cfg, rank)
        self.gpus_per_node = min(8, cfg.ranks)
        self.device = rank % self.gpus_per_node
        self.cpu_pid = CPU_PID_BASE + CPU_PID_STRIDE * rank
        self.main_tid = self.cpu_pid
        self.bwd_tid = self.cpu_pid + BWD_TID_OFFSET
        self.gpu_pid = self.device if gpu_pid is None else gpu_pid
        rt = RUNTIME
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
            self.pg = {kind: (g["pg_name"], g["pg_desc"], g["pg_size"], kineto_ranks(g["ranks"]), at)
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

    def _op(self, tid: int, t0: int, name: str, rt: str | None, frames: tuple[str, ...] = PY_FRAMES_COMM,
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
        if rt not in NO_GPU_WORK:
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
        self._gpu("kernel", NCCL_KERNEL[kind], stream, start, end, corr, launch_idx, args)

    # -- actions

    def _compute(self, a: Act, tid: int, ann_name: str) -> None:
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
            ext, corr, idx, rend = self._op(tid, t, name, pre, PY_FRAMES)
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
            j = (i * 3 + k) % len(EAGER_KERNELS)
            opname, kname, regs, smem, grid, block = EAGER_KERNELS[j]
            if backward:
                opname = BWD_OP_PREFIX + BWD_OPS[j]
            ext, corr, idx, rend = self._op(tid, t, opname, "kernel", PY_FRAMES)
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
            ext, corr, idx, rend = self._op(tid, t, "CUDAGraph::replay", "graph", PY_FRAMES)
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
                self._gpu("kernel", GRAPH_KERNELS[i % len(GRAPH_KERNELS)], stream, start, end, corr, idx, args)

    def _p2p(self, a: Act, tid: int) -> None:
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

    def _fsdp(self, a: Act, tid: int) -> None:
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

    def _action(self, a: Act, ann_name: str) -> None:
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
        group's first rank and stride, this rank, and the op's number among its group's (``Seq``, which
        Kineto copies onto the op's kernel: added to ``comm``)."""
        if not self.cfg.collectives:
            return None
        ranks = process_groups(self.cfg, self.rank)[pg]["ranks"]
        seq = comm["Seq"] = self.seq[pg] = self.seq.get(pg, 0) + 1
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

    def _groups(self, acts: list[Act]) -> list[tuple[str, str | None, list[Act]]]:
        """(annotation name, PP op or None, actions) per annotation, in order."""
        if self.cfg.schedule != "gpipe":
            return [(pp_action_name(self.stage, a.op, a.mb), a.op, [a]) for a in acts]
        fsdp = {"UNSHARD": "FSDP::all_gather", "RESHARD": "FSDP::reshard", "REDUCE_GRAD": "FSDP::reduce_grad"}
        groups: list[tuple[str, str | None, list[Act]]] = []
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
        plan, t_next = plan_step(self.cfg, self.lists, self.costs, n, self.t_step)
        acts = plan[self.stage]
        self.step_t0, self.slow_t0, self.normal_t0 = self.t_step, self.t_slow, self.t_normal
        self.t_slow = self._slow_time(t_next)
        self.t_normal = self.normal_t0 + t_next - self.step_t0
        self.reduce_grad = [next((a.g0 - self.step_t0, a.g1 - self.step_t0) for a in acts_of if a.op == "REDUCE_GRAD")
                            for acts_of in plan]
        if self.rank == self.cfg.slow_rank:
            acts, t_next = stretched(acts, self.t_step, t_next, self.cfg.slow_factor)
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
