"""What pass 2 does to each event: the plan a command builds between the passes."""
from __future__ import annotations

import collections
import itertools
from types import MappingProxyType
from typing import Callable, Iterable, Iterator, Mapping, Sequence

from ..io.jsonscan import RawMember
from ..io.writer import JoinedLines


class EmitPlan:
    """Pass 2 decisions; the defaults copy the trace unchanged.

    A plan either overrides :meth:`patch` (called for every event), or sets
    ``actions`` (one byte per event, 0 = copy unchanged) and ``patchers``
    (``patchers[action](line)`` is called only for the non-zero events, in
    event order, so each patcher can count its own events: such a plan names
    those counters in ``counters``, so that a worker given only some blocks
    can :meth:`skip` the others).  Integer attributes a plan counts in pass 2
    are named in ``tally_names``: workers' counts are added up.
    """

    actions: bytearray | None = None
    patchers: Sequence[Callable[[bytes], bytes | None]] = ()
    counters: Mapping[int, Iterator[int]] = MappingProxyType({})
    tally_names: tuple[str, ...] = ()

    def header(self, members: list[RawMember]) -> list[RawMember]:
        return members

    def patch(self, index: int, line: bytes) -> bytes | None:
        """The line to write for event ``index``, or None to drop it."""
        return line

    def lines(self, block: list[bytes], first_index: int) -> list[bytes] | JoinedLines:
        """The output lines for a block of spooled lines starting at event
        ``first_index``; a plan may override this to work on whole blocks."""
        return patched_lines(self, block, first_index)

    def skip(self, start: int, end: int) -> None:
        """Events ``start`` to ``end`` are emitted elsewhere (another worker):
        move every per-kind counter past them."""
        if start == end or self.actions is None:
            return
        for action, counter in self.counters.items():
            consume(counter, self.actions.count(action, start, end))

    def tallies(self) -> dict[str, int]:
        return {name: getattr(self, name) for name in self.tally_names}

    def add_tallies(self, tallies: dict[str, int]) -> None:
        """Add a worker's pass-2 counts to this plan's."""
        for name, value in tallies.items():
            setattr(self, name, getattr(self, name) + value)

    def appended(self) -> Iterable[bytes]:
        """Event lines to add before the array closes."""
        return ()

    def trailer(self, members: list[RawMember]) -> list[RawMember]:
        return members


def consume(counter: Iterator[int], count: int) -> None:
    """Advance ``counter`` by ``count`` steps at C speed."""
    collections.deque(itertools.islice(counter, count), maxlen=0)


def patched_lines(plan: EmitPlan, block: list[bytes], first_index: int,
                  dropped: list[int] | None = None) -> list[bytes]:
    """A block of spooled lines through ``plan.patch`` or its patchers; the
    events dropped are added to ``dropped`` (when given) by event index."""
    actions = plan.actions
    if actions is None:
        out = []
        for n, line in enumerate(block):
            line = plan.patch(first_index + n, line)
            if line is not None:
                out.append(line)
            elif dropped is not None:
                dropped.append(first_index + n)
        return out
    block_actions = actions[first_index:first_index + len(block)]
    if block_actions.count(0) == len(block):
        return block
    patchers = plan.patchers
    out = []
    keep = out.append
    for n, (line, action) in enumerate(zip(block, block_actions)):
        if action:
            line = patchers[action](line)
            if line is None:
                if dropped is not None:
                    dropped.append(first_index + n)
                continue
        keep(line)
    return out
