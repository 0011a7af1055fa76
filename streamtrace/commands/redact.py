"""``redact``: the same trace with credentials replaced, for sharing.

It is ``convert`` with a redactor on its output (see
:mod:`streamtrace.io.redact`): one streaming pass, bounded memory, the
same bytes for every ``-j``.
"""
from __future__ import annotations

import os

from ..io.redact import RedactOptions
from ..io.sink import SinkSpec, default_output
from ..io.source import SourceSpec
from .convert import convert


def redact(
    src: SourceSpec,
    dst: SinkSpec | None = None,
    *,
    rules: str | None = None,
    patterns: tuple[str, ...] | list[str] = (),
    pseudonymize: tuple[str, ...] | list[str] = (),
    compress: str | None = None,
    level: int | None = None,
    overwrite: bool = False,
    salvage: bool = False,
    spool_dir: str | None = None,
    reread_remote: bool = False,
    progress: bool | str | None = False,
    jobs: int | str | None = None,
    summary_file: str | os.PathLike | None = None,
) -> dict:
    """Write ``src`` to ``dst`` (default ``<name>_redacted.json.gz``) with
    every secret replaced by ``<redacted:KIND>`` and, per ``pseudonymize``
    (``hosts``, ``users``, ``paths``), those replaced by stable pseudonyms.
    ``rules`` is a secret-rules TOML file, ``patterns`` extra ``NAME=REGEX``
    shapes.  Returns convert's summary with a ``redaction`` entry."""
    dst = default_output(src, "_redacted") if dst is None else dst
    options = RedactOptions(rules, tuple(patterns), tuple(pseudonymize))
    return convert(src, dst, compress=compress, level=level, overwrite=overwrite, salvage=salvage,
                   spool_dir=spool_dir, reread_remote=reread_remote, progress=progress, jobs=jobs, redact=options,
                   summary_file=summary_file)
