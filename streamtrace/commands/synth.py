"""``synth``: a generated run (:mod:`streamtrace.synth`) written as every
command writes its files: checked before anything is written, made in a
hidden staging directory inside the output directory and published
together, so a failed or interrupted run leaves nothing and replaces
nothing unasked."""
from __future__ import annotations

import os
from pathlib import Path

from ..errors import TraceError
from ..io.destinations import Destinations
from ..io.formats import COMPRESSIONS
from ..synth import MERGED_STYLES, TRUTH_FILE, SynthConfig, file_names, write_traces
from .batch import staged

GENERATOR_COMPRESSION = {"none": "none", "gzip": "gz", "zstd": "zst"}
"""``compress`` as every command spells it -> the generator's name for it."""


def synthesize(outdir: str | os.PathLike, config: SynthConfig | None = None, *, compress: str = "gzip",
               merged: bool = True, merged_style: str = "rank-arg", overwrite: bool = False) -> dict:
    """Write a generated run into ``outdir`` (the ``synth`` command): the rank
    files, their links CSVs, the merged file unless ``merged`` is false, and
    ``truth.json``; returns the truth (what every command should find).

    Refused before anything is written when a file would replace one
    already there (unless ``overwrite``) or the settings are inconsistent.
    """
    config = SynthConfig() if config is None else config
    if compress not in COMPRESSIONS:
        raise TraceError(f"unknown compression {compress!r}; choose from {', '.join(COMPRESSIONS)}")
    if merged_style not in MERGED_STYLES:
        raise TraceError(f"unknown merged style {merged_style!r}; choose from {', '.join(MERGED_STYLES)}")
    try:
        config.validate()
    except ValueError as exc:
        raise TraceError(f"synth: {exc}") from None
    generator_compress = GENERATOR_COMPRESSION[compress]
    ranks, links, merged_name = file_names(config, generator_compress, merged)
    names = [*ranks, *links, *([merged_name] if merged_name else []), TRUTH_FILE]
    directory = Path(outdir)
    destinations = Destinations(overwrite=overwrite)
    destinations.directory(directory, writes="synth's files")
    destinations.claim_all(directory / name for name in names)
    with staged([str(directory / name) for name in names], overwrite) as paths:
        return write_traces(config, os.path.dirname(paths[0]), compress=generator_compress, merged=merged,
                            merged_style=merged_style)
