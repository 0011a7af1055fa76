"""``streamtrace demo``: a small generated run through inspect, compact and merge."""
from __future__ import annotations

import argparse
import os
import sys

from ..errors import TraceError
from .options import paragraphs, progress_wanted
from .report import counted, human_report, lanes


def add_parser(commands: argparse._SubParsersAction) -> None:
    """``demo``'s options."""
    cmd = commands.add_parser(
        "demo", help="generate a small example trace, inspect, compact and merge it",
        description=paragraphs("Write a small generated 2-rank pipeline-parallel trace (CUDA-graph replays, NCCL, "
                        "PP annotations) into DIR, run 'inspect' and 'compact' on rank 0 and 'merge' the two ranks: "
                        "a quick check that everything works, and files to open in Perfetto."),
    )
    cmd.add_argument("dir", nargs="?", help="where to write the example: a new or empty directory (default: a new "
                                            "temp directory)")
    cmd.add_argument("--overwrite", action="store_true", help="replace the files of an earlier demo in DIR")
    cmd.add_argument("--spool-dir", metavar="DIR", help="directory for temporary spool files (default: the system "
                                                        "temp dir)")
    cmd.add_argument("-q", "--quiet", action="store_true", help="no progress on stderr")
    cmd.add_argument("--progress", action="store_true", help="a progress bar even when stderr is not a terminal")
    cmd.add_argument("--debug", action="store_true", help="show tracebacks instead of one-line errors")
    cmd.set_defaults(run=run)


def run(args: argparse.Namespace) -> None:
    import tempfile

    from ..commands.compact import compact
    from ..commands.inspect import inspect
    from ..commands.merge import merge
    from ..commands.synth import synthesize
    from ..synth import SynthConfig

    directory = args.dir or tempfile.mkdtemp(prefix="streamtrace-demo-")
    if os.path.isdir(directory) and os.listdir(directory) and not args.overwrite:
        raise TraceError("holds files already: give a new or empty directory, or --overwrite to replace an earlier "
                         "demo's files", path=directory)
    truth = synthesize(directory, SynthConfig(ranks=2, pp_stages=2, microbatches=4, steps=1), overwrite=args.overwrite)
    trace, other = (os.path.join(directory, rank["file"]) for rank in truth["ranks"])
    print(f"demo traces written to {directory}")
    summary = inspect(trace, top=3, spool_dir=args.spool_dir, progress=progress_wanted(args))
    sys.stdout.write(human_report("inspect", summary))
    compacted = compact(trace, overwrite=args.overwrite, spool_dir=args.spool_dir, progress=progress_wanted(args))
    print(f"\ncompacted {lanes(compacted)}: {compacted['output']}")
    merged = merge([trace, other], overwrite=args.overwrite, spool_dir=args.spool_dir, progress=progress_wanted(args))
    print(f"merged 2 ranks with {counted(merged['pp_send_recv_pairs'], 'SEND->RECV arrow')}: {merged['output']}")
    print("open them in https://ui.perfetto.dev; next: streamtrace inspect --json, streamtrace compact --help, "
          "streamtrace merge --help")
