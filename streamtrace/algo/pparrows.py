"""Pipeline-parallel blocks and flow arrows (pure functions).

Blocks come from PP-named GPU annotation spans as they sit after
compaction; arrows are Perfetto flow pairs between blocks (SPEC 5).
"""
from __future__ import annotations

import math
from bisect import bisect_left
from collections import defaultdict
from dataclasses import dataclass
from typing import Iterable, Iterator

from .pp import parse_pp_name

COMPUTE_OPS = ("F", "B", "I", "W")
PEER_ABSENT = "pp_send_recv_peer_absent"  # SEND/RECV blocks whose peer stage has no block in the file
DIRECTION_COMPUTE = {"F": ("F",), "B": ("B", "I")}
FLOW_ID_BASE = 10**12


@dataclass(frozen=True, slots=True)  # one per PP span: hundreds of thousands on a large trace
class Span:
    """A GPU annotation span on a track (after compaction)."""

    pid: object
    tid: int
    name: str
    start: float
    end: float


@dataclass(frozen=True, slots=True)
class Block:
    stage: int | None
    op: str
    microbatch: int | None
    pid: object
    tid: int
    start: float
    end: float

    @property
    def label(self) -> str:
        stage = "" if self.stage is None else str(self.stage)
        microbatch = "" if self.microbatch is None else str(self.microbatch)
        return f"{stage}{self.op}{microbatch}"


def find_blocks(spans: Iterable[Span], compute_tracks: set, unshard_tracks: set) -> list[Block]:
    """PP blocks: compute ops clustered on the first compute annotation track,
    SEND/RECV spans as they are, UNSHARD spans on the first all-gather tracks."""
    compute: dict[tuple, list[Span]] = defaultdict(list)
    blocks = []
    for span in spans:
        for action in parse_pp_name(span.name):
            track = (span.pid, span.tid)
            if action.op in COMPUTE_OPS:
                if track in compute_tracks:
                    compute[(span.pid, action.stage, action.op, action.microbatch)].append(span)
            elif action.op.startswith(("SEND_", "RECV_")) or (action.op == "UNSHARD" and track in unshard_tracks):
                blocks.append(Block(action.stage, action.op, action.microbatch, span.pid, span.tid, span.start, span.end))
    for (pid, stage, op, microbatch), members in compute.items():
        members.sort(key=lambda span: (span.start, span.end))
        first, end = members[0], members[0].end
        for span in members[1:]:
            if span.start <= end:
                end = max(end, span.end)
                continue
            blocks.append(Block(stage, op, microbatch, pid, first.tid, first.start, end))
            first, end = span, span.end
        blocks.append(Block(stage, op, microbatch, pid, first.tid, first.start, end))
    blocks.sort(key=lambda block: (str(block.pid), block.start, block.label))
    return blocks


def pair_nearest(sources: list[Block], targets: list[Block]) -> list[tuple[Block, Block]]:
    """Greedy pairing by nearest midpoint; each block used at most once."""
    candidates = sorted(
        (abs((s.start + s.end) - (t.start + t.end)), i, j)
        for i, s in enumerate(sources) for j, t in enumerate(targets)
    )
    used_sources, used_targets, pairs = set(), set(), []
    for _, i, j in candidates:
        if i not in used_sources and j not in used_targets:
            used_sources.add(i)
            used_targets.add(j)
            pairs.append((sources[i], targets[j]))
    return pairs


Arrow = tuple  # (category, flow id, source Block, target Block, finish ts, source pp rank, target pp rank)


class ArrowMaker:
    """Makes flow arrows with fresh ids and counts what was made.

    Arrows are kept as small tuples over the shared blocks (a merged run has
    tens of thousands); :func:`arrow_events` writes them out as events.
    """

    def __init__(self, pp_rank_of: dict, next_id: int = FLOW_ID_BASE) -> None:
        self.pp_rank_of = pp_rank_of
        self.next_id = next_id
        self.arrows: list[Arrow] = []
        self.pairs: dict[str, int] = defaultdict(int)
        self.unmatched: dict[str, int] = defaultdict(int)

    def events(self) -> Iterator[dict]:
        return arrow_events(self.arrows)

    def connect(self, source: Block, target: Block, category: str, *, strictly_forward: bool = False) -> None:
        finish = max(source.start, target.start)
        if strictly_forward and finish <= source.start:
            finish = math.nextafter(source.start, math.inf)
        if finish > target.end:
            self.unmatched[category] += 1
            return
        self.arrows.append((category, self.next_id, source, target, finish,
                            self.pp_rank_of.get(source.pid), self.pp_rank_of.get(target.pid)))
        self.next_id += 1
        self.pairs[category] += 1

    def connect_nearest(self, sources: list[Block], targets: list[Block], category: str, *,
                        unpaired: list[Block], strictly_forward: bool = False) -> None:
        """Pair by nearest midpoint; blocks of ``unpaired`` left alone count as unmatched."""
        pairs = pair_nearest(sources, targets)
        paired = {id(block) for pair in pairs for block in pair}
        self.unmatched[category] += sum(1 for block in unpaired if id(block) not in paired)
        for source, target in pairs:
            self.connect(source, target, category, strictly_forward=strictly_forward)


def arrow_events(arrows: Iterable[Arrow]) -> Iterator[dict]:
    """Each arrow as its flow pair: ``s`` on the source block, ``f`` on the target."""
    for category, flow_id, source, target, finish, source_rank, target_rank in arrows:
        args = {
            "source_pp_rank": source_rank,
            "destination_pp_rank": target_rank,
            "source_stage": source.stage,
            "destination_stage": target.stage,
            "source_operation": source.op,
            "destination_operation": target.op,
            "microbatch": source.microbatch if source.microbatch is not None else target.microbatch,
        }
        name = f"{source.label} -> {target.label}"
        for phase, block, ts in (("s", source, source.start), ("f", target, finish)):
            yield {"name": name, "cat": category, "ph": phase, "bp": "e", "pid": block.pid, "tid": block.tid,
                   "ts": ts, "id": flow_id, "args": args}


def local_arrows(blocks: list[Block], maker: ArrowMaker) -> None:
    """Within a rank: RECV_x -> compute -> SEND_x, and UNSHARD -> first compute."""
    groups: dict[tuple, list[Block]] = defaultdict(list)
    for block in blocks:
        groups[(block.pid, block.stage, block.microbatch, block.op)].append(block)
    keys = sorted({key[:3] for key in groups}, key=str)
    for pid, stage, microbatch in keys:
        for direction, compute_ops in DIRECTION_COMPUTE.items():
            computes = [b for op in compute_ops for b in groups.get((pid, stage, microbatch, op), [])]
            receives = groups.get((pid, stage, microbatch, f"RECV_{direction}"), [])
            sends = groups.get((pid, stage, microbatch, f"SEND_{direction}"), [])
            if receives:
                maker.connect_nearest(receives, computes, "pp_compute_dependency", unpaired=receives)
            if sends:
                maker.connect_nearest(computes, sends, "pp_compute_dependency", unpaired=sends)
    computes_by_stage: dict[tuple, list[Block]] = defaultdict(list)
    for block in blocks:
        if block.op in COMPUTE_OPS:
            computes_by_stage[(block.pid, block.stage)].append(block)
    for members in computes_by_stage.values():
        members.sort(key=lambda block: (block.start, block.end))
    starts_by_stage = {key: [block.start for block in members] for key, members in computes_by_stage.items()}
    for block in blocks:
        if block.op != "UNSHARD":
            continue
        # the first compute (in start order) starting at or after the UNSHARD: a bisect, not a scan per UNSHARD
        members = computes_by_stage.get((block.pid, block.stage), [])
        at = bisect_left(starts_by_stage.get((block.pid, block.stage), []), block.start)
        if at == len(members):
            maker.unmatched["pp_unshard_dependency"] += 1
        else:
            maker.connect(block, members[at], "pp_unshard_dependency")


def send_recv_arrows(blocks: list[Block], maker: ArrowMaker, pipeline_of: dict | None = None) -> None:
    """Across ranks: SEND_F of stage s to RECV_F of s+1, SEND_B of s to RECV_B
    of s-1, same microbatch and pipeline (``pipeline_of[pid]``; one pipeline
    when not given), nearest midpoints paired, finish strictly after the
    start.  Unpaired blocks, dropped arrows and receives no send group aims
    at are counted as unmatched; those whose peer stage has no block at all
    in the pipeline (its rank is not in the file) as :data:`PEER_ABSENT`."""
    pipeline_of = pipeline_of or {}
    groups: dict[tuple, list[Block]] = defaultdict(list)
    stages: dict[object, set] = defaultdict(set)
    for block in blocks:
        stages[pipeline_of.get(block.pid)].add(block.stage)
        if block.op in ("SEND_F", "SEND_B", "RECV_F", "RECV_B"):
            groups[(pipeline_of.get(block.pid), block.stage, block.op, block.microbatch)].append(block)
    aimed_at = set()
    for (pipeline, stage, op, microbatch), sends in sorted(groups.items(), key=str):
        if not op.startswith("SEND_"):
            continue
        direction = op[-1]
        peer = (pipeline, stage + (1 if direction == "F" else -1), f"RECV_{direction}", microbatch)
        aimed_at.add(peer)
        if peer[1] not in stages[pipeline]:
            maker.unmatched[PEER_ABSENT] += len(sends)
            continue
        receives = groups.get(peer, [])
        maker.connect_nearest(sends, receives, "pp_send_recv", unpaired=sends + receives, strictly_forward=True)
    for (pipeline, stage, op, microbatch), receives in groups.items():
        if op.startswith("RECV_") and (pipeline, stage, op, microbatch) not in aimed_at:
            sender = stage + (-1 if op == "RECV_F" else 1)
            maker.unmatched[PEER_ABSENT if sender not in stages[pipeline] else "pp_send_recv"] += len(receives)
