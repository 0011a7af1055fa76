"""``streamtrace demo``: a small generated run through inspect, compact and merge."""
from __future__ import annotations

import argparse
import os
import sys
import tempfile

from ..commands.compact import compact
from ..commands.inspect import inspect
from ..commands.merge import merge
from .options import common_options, paragraphs, progress_wanted
from .report import human_report


def add_parser(commands: argparse._SubParsersAction) -> None:
    """``demo``'s options."""
    cmd = commands.add_parser(
        "demo", help="generate a small example trace, inspect, compact and merge it",
        description=paragraphs("Write a small generated 2-rank pipeline-parallel trace (CUDA-graph replays, NCCL, "
                        "PP annotations) into DIR, run 'inspect' and 'compact' on rank 0 and 'merge' the two ranks: "
                        "a quick check that everything works, and files to open in Perfetto."),
    )
    cmd.add_argument("dir", nargs="?", help="where to write the example (default: a new temp directory)")
    common_options(cmd)
    cmd.set_defaults(run=run)


def run(args: argparse.Namespace) -> None:
    from ..synth import SynthConfig, write_traces

    directory = args.dir or tempfile.mkdtemp(prefix="streamtrace-demo-")
    os.makedirs(directory, exist_ok=True)
    write_traces(SynthConfig(ranks=2, pp_stages=2, microbatches=4, steps=1), directory, compress="gz")
    trace = os.path.join(directory, "rank0_trace.json.gz")
    print(f"demo traces written to {directory}")
    summary = inspect(trace, spool_dir=args.spool_dir, progress=progress_wanted(args))
    sys.stdout.write(human_report("inspect", summary))
    compacted = compact(trace, overwrite=True, spool_dir=args.spool_dir, progress=progress_wanted(args))
    print(f"\ncompacted {compacted['measured_slices']:,} GPU slices from {compacted['original_streams']} streams "
          f"into {compacted['compacted_lanes']} lanes: {compacted['output']}")
    merged = merge([os.path.join(directory, f"rank{rank}_trace.json.gz") for rank in (0, 1)],
                   overwrite=True, spool_dir=args.spool_dir, progress=progress_wanted(args))
    print(f"merged 2 ranks with {merged['pp_send_recv_pairs']} SEND->RECV arrows: {merged['output']}")
    print("open them in https://ui.perfetto.dev; next: streamtrace inspect --json, streamtrace compact --help, "
          "streamtrace merge --help")
