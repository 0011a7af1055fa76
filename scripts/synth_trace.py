#!/usr/bin/env python3
"""Write synthetic multi-rank Kineto traces (+ ground truth) for tests and benchmarks.

Example:
  python scripts/synth_trace.py OUTDIR --ranks 8 --pp-stages 4 --microbatches 8 \\
      --schedule zb --target-mb 250 --compress gz --seed 1
Prints the truth summary (without per-step lists) as JSON.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing

from streamtrace.synth import (  # noqa: E402
    COMPRESSIONS,
    KERNEL_ANNOTATIONS,
    MERGED_STYLES,
    SCHEDULES,
    SynthConfig,
    summary,
    write_traces,
)


def main(argv: list[str] | None = None) -> int:
    d = SynthConfig()
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("outdir", help="output directory (created if missing)")
    p.add_argument("--ranks", type=int, default=d.ranks)
    p.add_argument("--pp-stages", type=int, default=d.pp_stages)
    p.add_argument("--microbatches", type=int, default=d.microbatches)
    p.add_argument("--schedule", choices=SCHEDULES, default=d.schedule)
    p.add_argument("--steps", type=int, default=d.steps, help="profiler steps (ignored with --target-mb)")
    p.add_argument("--target-mb", type=float, default=None,
                   help="add steps until every rank file is at least this many MB (1e6 bytes) uncompressed")
    p.add_argument("--graph-streams", type=int, default=d.graph_streams)
    p.add_argument("--graph-kernels", type=int, default=d.graph_kernels)
    p.add_argument("--eager-kernels", type=int, default=d.eager_kernels)
    p.add_argument("--python-noise", type=int, default=d.python_noise)
    p.add_argument("--kernel-annotations", choices=KERNEL_ANNOTATIONS, default=d.kernel_annotations)
    p.add_argument("--seed", type=int, default=d.seed)
    p.add_argument("--base-time-ns", type=int, default=d.base_time_ns)
    p.add_argument("--base-skew-ns", type=int, default=d.base_skew_ns)
    p.add_argument("--hip", action="store_true", help="AMD naming (hipGraphLaunch, hipLaunchKernel, ...)")
    p.add_argument("--no-big-ints", action="store_true", help="omit NCCL 'Comms Id' values >= 2**63")
    p.add_argument("--compress", choices=tuple(COMPRESSIONS), default="gz")
    p.add_argument("--no-merged", action="store_true", help="do not write merged_trace.json[.gz|.zst]")
    p.add_argument("--merged-style", choices=MERGED_STYLES, default="rank-arg")
    a = p.parse_args(argv)
    cfg = SynthConfig(
        ranks=a.ranks, pp_stages=a.pp_stages, microbatches=a.microbatches, schedule=a.schedule,
        steps=a.steps, target_bytes=None if a.target_mb is None else int(a.target_mb * 1e6),
        graph_streams=a.graph_streams, graph_kernels=a.graph_kernels, eager_kernels=a.eager_kernels,
        python_noise=a.python_noise, seed=a.seed, base_time_ns=a.base_time_ns, base_skew_ns=a.base_skew_ns,
        hip=a.hip, big_ints=not a.no_big_ints, kernel_annotations=a.kernel_annotations,
    )
    try:
        cfg.validate()
    except ValueError as e:
        p.error(str(e))
    truth = write_traces(cfg, a.outdir, compress=a.compress, merged=not a.no_merged,
                         merged_style=a.merged_style)
    print(json.dumps(summary(truth), indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
