"""Where a pass-1 worker's time goes, stage by stage, for one command's index.

The first chunks of a trace are cut as the workers get them (the engine's
own cutting, during an ``inspect -j 1`` that stops once it has them), then
indexed chunk after chunk as a worker indexes them, each stage timed:

- fold: the chunk's folded copy (letters lower-cased, digits as ``9``),
  which the number test and the secret screen read;
- read test: whether the projection reads the chunk as orjson would;
- decode: msgspec into the command's projection (with the spool lines in
  the input's own text, for the commands that spool events);
- secret screen (``inspect``, and every command that spools events for a
  copy): the pre-filter of the secret rules;
- visit: the index's ``visit_projected``, less the screen;
- spool: the lines compressed into the chunk's zstd frame;
- part: ``take_part`` and its pickle, sent back to the main process.

Figures are nanoseconds per byte of input, the best of ``--repeat``
repetitions (each with a fresh index), so a noisy machine shows less than
in whole runs; `scripts/bench.py` stays the measure of whole commands.

    python scripts/pass1_stages.py TRACE [--command inspect] [--chunks 80] [--repeat 5]
"""
from __future__ import annotations

import argparse
import pickle
import time
from typing import Callable

import streamtrace
from streamtrace.algo.secrets import SecretFinder, fold
from streamtrace.commands.attribute import AttributeIndex
from streamtrace.commands.compactindex import CompactIndex
from streamtrace.commands.inspectindex import InspectVisitor
from streamtrace.commands.mergedindex import LinksIndex
from streamtrace.commands.sliceindex import Selection, SliceIndex
from streamtrace.commands.split import SplitIndex
from streamtrace.engine import indexworkers
from streamtrace.io.configfiles import load_rules
from streamtrace.io.projection import ProjectedChunk, read_alike
from streamtrace.io.redact import RedactOptions, copy_screen, load_secret_rules
from streamtrace.io.spool import EventSpool
from streamtrace.resources import fix_heap_thresholds


def _inspect_index() -> InspectVisitor:
    options = RedactOptions()
    return InspectVisitor(SecretFinder(load_secret_rules(options.rules, options.patterns)))


INDEXES: dict[str, tuple[Callable[[], object], bool]] = {  # the command's pass-1 index, and whether it spools events
    "inspect": (_inspect_index, False),
    "attribute": (lambda: AttributeIndex(None), False),
    "compact": (lambda: CompactIndex(load_rules(None)), True),
    "relink": (LinksIndex, True),
    "split": (SplitIndex, True),
    "slice": (lambda: SliceIndex(Selection(), None), True),
}
STAGES = ("fold", "read test", "decode", "secret screen", "visit", "spool", "part")


class _Enough(Exception):
    """Raised inside the engine once the chunks wanted are in hand."""


def _nothing_suspicious(text: bytes, folded: bytes) -> bool:
    return False


def first_chunks(trace: str, count: int) -> list[bytes]:
    """The texts of the first ``count`` chunks a pass-1 worker would get."""
    kept: list[bytes] = []
    index_chunk = indexworkers.ChunkIndexer.__call__

    def keep(self: indexworkers.ChunkIndexer, text: bytes) -> object:
        kept.append(bytes(text))
        if len(kept) >= count:
            raise _Enough
        return index_chunk(self, text)

    indexworkers.ChunkIndexer.__call__ = keep
    try:
        streamtrace.inspect(trace, jobs=1, secrets=False)
    except _Enough:
        pass
    finally:
        indexworkers.ChunkIndexer.__call__ = index_chunk
    return kept


def time_stages(texts: list[bytes], command: str) -> dict[str, float]:
    """Seconds per stage over ``texts``, indexed one after another by a fresh index."""
    make_index, spools = INDEXES[command]
    index = make_index()
    index.partial = True  # (as in a worker: parts go to the main process)
    screen = getattr(index, "screen_batch", None)
    if screen is not None:
        index.screen_batch = _nothing_suspicious  # (each chunk is screened before the visit, timed on its own)
    elif spools:
        screen = copy_screen().finder.suspicious  # the engine's screen of what a copy writes
    encode = EventSpool.text_frame_encoder()
    spent = dict.fromkeys(STAGES, 0.0)
    clock = time.perf_counter
    for text in texts:
        started = clock()
        folded = fold(text)
        folded_at = clock()
        if not read_alike(text, folded):
            raise SystemExit("a chunk the projection does not read: choose another trace")
        tested_at = clock()
        elements = lines = None
        if spools:
            events, lines, elements = index.projection.decode_with_lines(text, folded)
        else:
            events = index.projection.decode(text, folded)
        decoded_at = clock()
        if screen is not None and screen(text, folded):
            raise SystemExit("a chunk the secret screen flags: choose another trace")
        screened_at = clock()
        if not index.visit_projected(ProjectedChunk(text, events, elements, folded)):
            raise SystemExit("a chunk the projected visit refuses: choose another trace")
        visited_at = clock()
        if lines is not None:
            encode(lines)
        spooled_at = clock()
        pickle.dumps(index.take_part(), pickle.HIGHEST_PROTOCOL)
        ended = clock()
        for stage, seconds in zip(STAGES, (folded_at - started, tested_at - folded_at, decoded_at - tested_at,
                                           screened_at - decoded_at, visited_at - screened_at,
                                           spooled_at - visited_at, ended - spooled_at)):
            spent[stage] += seconds
    return {stage: seconds for stage, seconds in spent.items()
            if not (stage == "spool" and not spools or stage == "secret screen" and screen is None)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("trace", help="an uncompressed or compressed trace")
    parser.add_argument("--command", choices=sorted(INDEXES), default="inspect")
    parser.add_argument("--chunks", type=int, default=80, help="chunks of about 1 MiB to time (default 80)")
    parser.add_argument("--repeat", type=int, default=5, help="repetitions; the best is shown (default 5)")
    arguments = parser.parse_args()
    fix_heap_thresholds()  # (as in a worker)
    try:
        texts = first_chunks(arguments.trace, arguments.chunks)
    except streamtrace.TraceError as error:
        raise SystemExit(f"pass1_stages.py: {error}") from None
    if not texts:
        raise SystemExit("pass1_stages.py: the trace is read whole, not in chunks for workers: too small to time")
    size = sum(map(len, texts))
    runs = [time_stages(texts, arguments.command) for _ in range(arguments.repeat)]
    best = min(runs, key=lambda run: sum(run.values()))
    print(f"{arguments.command}: {len(texts)} chunks, {size / 1e6:.1f} MB; ns per byte, best of {arguments.repeat}")
    for stage, seconds in best.items():
        print(f"  {stage:14s} {seconds / size * 1e9:6.2f}")
    print(f"  {'total':14s} {sum(best.values()) / size * 1e9:6.2f}")


if __name__ == "__main__":
    main()
