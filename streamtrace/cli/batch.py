"""Several inputs of compact, relink, redact, convert or attribute (files, or a
directory or glob standing for several): one task each (``streamtrace.batch``)."""
from __future__ import annotations

import argparse
import os

from .options import reading
from .report import Rows, counted, events_row, listed, report, view


def is_batch(args: argparse.Namespace, output_dir: str | None) -> bool:
    """Several inputs, a directory or glob standing for several, or an output that names a directory
    (DIR/ or an existing one): a batch run."""
    from ..io.inputs import names_several

    return (len(args.trace) > 1 or any(map(names_several, args.trace))
            or output_dir is not None and (output_dir.endswith(os.sep) or os.path.isdir(output_dir)))


def run_batch(args: argparse.Namespace, **options: object) -> None:
    from ..commands.batch import batch

    summary = batch(args.command, args.trace, args.output, dask=getattr(args, "dask", None), overwrite=args.overwrite,
                    **reading(args), **options)
    report("batch", summary, args, to_stderr=args.command == "attribute" and args.output == "-")


@view("batch")
def rows(summary: dict) -> Rows:
    outputs = summary["output"] if isinstance(summary["output"], list) else [summary["output"]]
    rows = [(summary["command"], f"{counted(summary['inputs'], 'input')}, one task each"), ("output", listed(outputs, 3))]
    if "events_read" in summary:
        rows.append(events_row(summary))
    return rows
