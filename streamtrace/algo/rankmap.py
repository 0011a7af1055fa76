"""Which rank each pid of a merged trace belongs to (SPEC 6), as pure rules.

The rules, in order of preference, each deciding the pids the earlier ones
left open:

1. ``args.rank`` on the pid's events;
2. the rank its ``process_name`` states (``RANK 3 - GPU``, ``rank 3``);
3. a user-given ``--rank-map`` (JSON object pid -> rank);
4. inference: a GPU pid is paired with the CPU pid whose launches carry the
   same correlation ids *earlier in time* (launch ts <= GPU ts).  Every rank
   reuses the same ids, so ids alone pair every CPU pid with every GPU pid;
   the time order is what tells them apart.  Paired pids share a rank: the
   known rank of either side, or a fresh number for each group of unknown
   pids, in the order the groups first launch or run GPU work;
5. ``distributedInfo.rank`` when the file is a single rank's.

A pid that several ranks claim (two ``process_name`` events naming different
ranks, as when files whose pids collide are concatenated, or several
``args.rank`` values) is *ambiguous*: its events keep no pid rank, and the
commands that link events report it, and stop if its correlation ids
collide.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Iterable, Mapping

from ..errors import TraceError

UNKNOWN = -1
AMBIGUOUS = -2


@dataclass
class PidEvidence:
    """What pass 1 saw of one pid, enough to decide its rank."""

    pid: object
    arg_ranks: set[int] = field(default_factory=set)
    name_ranks: set[int] = field(default_factory=set)
    first_work: int | None = None  # event index of its first launch or GPU event
    unranked: bool = False  # some event of the pid lacks args.rank (only those need a pid rank)


@dataclass(frozen=True)
class Pairing:
    """The CPU pid a GPU pid's work came from, by inference."""

    gpu: int  # pid slot
    cpu: int | None  # pid slot, None when no candidate or a tie
    consistent: int  # sampled GPU events whose id the CPU pid launched earlier
    inconsistent: int  # ... launched only later (impossible for the true launcher)
    tied_with: int | None = None  # another CPU pid scoring the same


def pair_by_time(
    gpu_samples: Mapping[int, Iterable[tuple[int, float]]],
    launches_by_id: Mapping[int, list[tuple[int, float]]],
) -> dict[int, Pairing]:
    """Pair each GPU pid with the CPU pid that launched its sampled work.

    ``gpu_samples[gpu] = [(correlation, gpu_ts), ...]``;
    ``launches_by_id[correlation] = [(cpu_slot, launch_ts), ...]``.  The true
    launcher scores one consistent sample per matched event and never an
    inconsistent one; another rank's CPU pid shares the ids but, unless the
    ranks run in lockstep, not the timing.  The score is consistent -
    inconsistent.  Ranks in lockstep tie: a CPU pid already paired with
    another GPU pid drops out of a tie (one process drives one GPU), which
    settles a chain of lockstep ranks from its first one; a tie that remains
    leaves the GPU pid unpaired.
    """
    scores = {gpu: _scores(samples, launches_by_id) for gpu, samples in gpu_samples.items()}
    tops: dict[int, list[int]] = {}
    for gpu, score in scores.items():
        best = max((good - bad for good, bad in score.values() if good), default=None)
        tops[gpu] = sorted(cpu for cpu, (good, bad) in score.items() if good and good - bad == best)
    paired: dict[int, int] = {}
    settled = True
    while settled:
        settled = False
        taken = set(paired.values())
        for gpu, top in tops.items():
            if gpu in paired:
                continue
            free = [cpu for cpu in top if cpu not in taken] if len(top) > 1 else top
            if len(free) == 1:
                paired[gpu] = free[0]
                taken.add(free[0])
                settled = True
    pairings: dict[int, Pairing] = {}
    for gpu, top in tops.items():
        cpu = paired.get(gpu)
        if cpu is not None:
            pairings[gpu] = Pairing(gpu, cpu, *scores[gpu][cpu])
        elif top:
            pairings[gpu] = Pairing(gpu, None, *scores[gpu][top[0]], tied_with=top[1])
        else:
            pairings[gpu] = Pairing(gpu, None, 0, 0)
    return pairings


def _scores(samples: Iterable[tuple[int, float]], launches_by_id: Mapping[int, list[tuple[int, float]]]
            ) -> dict[int, list[int]]:
    """[consistent, inconsistent] sample counts per CPU pid sharing the samples' ids."""
    scores: dict[int, list[int]] = {}
    for correlation, gpu_ts in samples:
        earliest: dict[int, float] = {}
        for cpu, launch_ts in launches_by_id.get(correlation, ()):
            if cpu not in earliest or launch_ts < earliest[cpu]:
                earliest[cpu] = launch_ts
        for cpu, launch_ts in earliest.items():
            score = scores.setdefault(cpu, [0, 0])
            score[0 if launch_ts <= gpu_ts else 1] += 1
    return scores


@dataclass
class RankResolution:
    """Rank and deciding rule of every pid slot."""

    ranks: list[int]  # per pid slot: rank, UNKNOWN or AMBIGUOUS
    rules: list[str]
    ambiguous: dict[int, list[int]]  # pid slot -> the ranks claiming it
    pairings: dict[int, Pairing]

    def known(self) -> list[int]:
        return sorted({rank for rank in self.ranks if rank >= 0})


def resolve_ranks(
    pids: list[PidEvidence],
    *,
    rank_map: Mapping[object, int] | None = None,
    pairings: Mapping[int, Pairing] | Callable[[], Mapping[int, Pairing]] | None = None,
    file_rank: object = None,
) -> RankResolution:
    """Apply the rules in order; see the module docstring.

    ``pairings`` may be a function making them: it is called only when some
    pid is left to infer (pairing costs GPU pids x samples x CPU pids
    sharing an id, which for a thousand ranks named by ``args.rank`` is
    minutes of work that decides nothing).
    """
    ranks = [UNKNOWN] * len(pids)
    rules = ["unknown"] * len(pids)
    ambiguous: dict[int, list[int]] = {}
    for slot, facts in enumerate(pids):
        for rule, claimed in (("args.rank", facts.arg_ranks), ("process_name", facts.name_ranks)):
            if len(claimed) == 1:
                ranks[slot], rules[slot] = next(iter(claimed)), rule
            elif claimed and rule == "args.rank" and not facts.unranked:
                ranks[slot], rules[slot] = AMBIGUOUS, "args.rank (per event)"
            elif claimed:
                ranks[slot], rules[slot] = AMBIGUOUS, f"ambiguous ({rule})"
                ambiguous[slot] = sorted(claimed)
            if claimed:
                break
        else:
            if rank_map and facts.pid in rank_map:
                ranks[slot], rules[slot] = rank_map[facts.pid], "rank-map"
    if callable(pairings):
        pairings = pairings() if UNKNOWN in ranks else {}
    pairings = dict(pairings or {})
    _infer(pids, ranks, rules, pairings, ambiguous)
    if not any(rank >= 0 for rank in ranks) and type(file_rank) is int:
        for slot in range(len(pids)):
            if ranks[slot] == UNKNOWN:
                ranks[slot], rules[slot] = file_rank, "distributedInfo.rank"
    return RankResolution(ranks, rules, ambiguous, pairings)


def _infer(pids: list[PidEvidence], ranks: list[int], rules: list[str], pairings: dict[int, Pairing],
           ambiguous: dict[int, list[int]]) -> None:
    """Rule 4: spread known ranks over pairings; number groups of unknown pids.

    A single group of unknown pids is left unknown: that is a single-rank
    file, and rule 5 (or nothing) names its rank.
    """
    parent = list(range(len(pids)))

    def root(slot: int) -> int:
        while parent[slot] != slot:
            parent[slot] = parent[parent[slot]]
            slot = parent[slot]
        return slot

    for gpu, pairing in pairings.items():
        cpu = pairing.cpu
        if cpu is None:
            if ranks[gpu] == UNKNOWN and pairing.tied_with is not None:
                rules[gpu] = "unknown (inference tie)"
            continue
        if ranks[gpu] == UNKNOWN and ranks[cpu] >= 0:
            ranks[gpu], rules[gpu] = ranks[cpu], "inferred"
        elif ranks[cpu] == UNKNOWN and ranks[gpu] >= 0:
            ranks[cpu], rules[cpu] = ranks[gpu], "inferred"
        elif ranks[cpu] == UNKNOWN and ranks[gpu] == UNKNOWN:
            parent[root(gpu)] = root(cpu)
    groups: dict[int, list[int]] = {}
    for slot, facts in enumerate(pids):
        if ranks[slot] == UNKNOWN and facts.first_work is not None and rules[slot] == "unknown":
            groups.setdefault(root(slot), []).append(slot)
    if len(groups) < 2 and not any(rank >= 0 for rank in ranks):
        return
    taken = {rank for rank in ranks if rank >= 0} | {rank for claimed in ambiguous.values() for rank in claimed}
    fresh = 0
    first_work = lambda members: min(pids[slot].first_work for slot in members)  # noqa: E731
    for members in sorted(groups.values(), key=first_work):
        while fresh in taken:
            fresh += 1
        for slot in members:
            ranks[slot], rules[slot] = fresh, "inferred"
        taken.add(fresh)


def rank_map_from_json(mapping: object, origin: str) -> dict[object, int]:
    """A ``--rank-map`` document (a JSON object from pid to rank), checked.

    JSON keys are strings, so a key that spells an integer names the integer
    pid as well (``{"4037": 0, "GPU 1": 1}``).
    """
    if not isinstance(mapping, dict):
        raise TraceError("rank map must be a JSON object {pid: rank}", path=origin)
    result: dict[object, int] = {}
    for key, rank in mapping.items():
        if type(rank) is not int or rank < 0:
            raise TraceError(f"rank map: rank of pid {key!r} must be a non-negative integer", path=origin)
        result[key] = rank
        if key.lstrip("-").isdigit():
            result[int(key)] = rank
    return result
