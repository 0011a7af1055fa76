"""``analyze --ops``'s pass-1 collection from a chunk's projected events
(:func:`...io.projection.projected_events` with ``ops``): the columns
:meth:`.ops.OpsCollector.visit` keeps per event, taken a field at a time
over the whole chunk, from the one decoding the index reads too (no event
dict, no second parse).  Op signatures come as their text and are decoded
once per distinct text.  A chunk whose projection could read differently
from its dicts (:func:`accepts_chunk`) goes the dict way.
"""
from __future__ import annotations

from itertools import repeat
from operator import add
from types import SimpleNamespace
from typing import NamedTuple

import msgspec
import numpy as np
import orjson

from ...algo import iterannotation
from ...algo.opstables import KERNEL
from ...algo.optree import NO_LINK
from ...io.projection import OP_SIGNATURE_ARGS, attribute
from .chunktimes import Times, times_of
from .ops import (
    GPU_CATS,
    HOST_CATS,
    KEYS,
    LINK_HIGH,
    LINK_LOW,
    METADATA,
    NUMBERS,
    RANK_EVIDENCE,
    RUNTIME,
    OpsCollector,
    _key,
    _number,
    _pid_key,
)

_SIGNATURE_ATTRIBUTES = [attribute(key) for key in OP_SIGNATURE_ARGS]
assert _SIGNATURE_ATTRIBUTES == ["Input_Dims", "Input_type", "Input_Strides", "Concrete_Inputs", "Output_type"]  # (_signatures)
# a category's code: 0 none of these, then python_func, ac2g, the categories whose own args.rank places an
# event but that the ops keep not ("Kernel"), those they keep (host, then GPU), user annotations, and two
# that the ops read as none of these but analyze's index leaves out: no category (or one that is no
# string), and "Trace"
_KEPT = [*HOST_CATS, *GPU_CATS]
_FLOW, _FIRST_HOST, _FIRST_GPU, _ANNOTATION = 2, 4, 4 + len(HOST_CATS), 4 + len(_KEPT)
_NO_CATEGORY, _TRACE = _ANNOTATION + 1, _ANNOTATION + 2
_CODES = {"python_func": 1, "ac2g": 2, **dict.fromkeys(RANK_EVIDENCE - set(_KEPT), 3),
          **{cat: 4 + at for at, cat in enumerate(_KEPT)}, None: _NO_CATEGORY, "Trace": _TRACE}
_FLAGS = np.array([0, 2, 0, 0, *(1 if cat == "cpu_op" else 0 for cat in _KEPT), 0, 0, 0], dtype=np.int8)  # (runs')
_IS_RUNTIME = np.array([False] * 4 + [HOST_CATS.get(cat) == RUNTIME for cat in _KEPT] + [False] * 3)
_EVIDENCE = np.array([False, False, False, True, *(cat in RANK_EVIDENCE for cat in _KEPT), False, False, False])
_CODE_OF: dict = {None: _NO_CATEGORY}  # category -> code, for the categories met so far (up to _FEW_CATEGORIES)
_FEW_CATEGORIES = 1 << 12
# by code: a host event's kind, a GPU event's category, and whether it is a driver call
_HOST_KIND = np.array([0] * 4 + [HOST_CATS.get(cat, 0) for cat in _KEPT] + [0] * 3, dtype=np.int8)
_GPU_CAT = np.array([0] * 4 + [GPU_CATS.get(cat, 0) for cat in _KEPT] + [0] * 3, dtype=np.int8)
_DRIVER = np.array([False] * 4 + [cat == "cuda_driver" for cat in _KEPT] + [False] * 3)
_EXACT = float(1 << 53)  # (integers below it are floats exactly, and so are their sums)
_PLAIN_IDS = {int, type(None)}
_INT_OR_NONE = {int, type(None)}
_KEY_TYPES = {int, str}
_FLOW_PHASES = {"s": 1, "f": 2}  # (a flow's start and end: the phases TraceLens reads)
_FLOATS = {int, float}
_HOST_ARG_NAMES = ("correlation", "External_id", "Sequence_number", "kernel")
_GPU_ARG_NAMES = ("correlation", "External_id", "original_stream", "stream")
_NO_ARGS = SimpleNamespace(**dict.fromkeys([*_HOST_ARG_NAMES, *_GPU_ARG_NAMES, *_SIGNATURE_ATTRIBUTES]))  # (no args)
_encode = msgspec.json.encode
_NO_LISTS = (None,) * len(_SIGNATURE_ATTRIBUTES)
_NO_SIGNATURE = _encode(_NO_LISTS)


class Kept(NamedTuple):
    """The host events of a chunk, or its GPU events: their positions, the events and their names."""

    at: np.ndarray
    events: list
    names: list


class Coded(NamedTuple):
    """What :func:`chunk_codes` reads of a chunk once, for :func:`collect_chunk` and analyze's index."""

    codes: np.ndarray  # each event's category's code (see _CODES)
    plain: bool  # whether every category is a string or None (then the codes tell which are None)
    pids: list  # each event's pid
    phases: list  # and phase (read with the categories while the decoded events are fresh in the cache)
    host: Kept
    gpu: Kept

    def of_category(self, cat: str, chosen: np.ndarray) -> list:
        """The host or GPU events of this category (one of HOST_CATS or GPU_CATS) that are ``chosen`` (a
        mask of the chunk's events), in event order."""
        kept = self.host if cat in HOST_CATS else self.gpu
        return _taken(kept.events, np.flatnonzero((self.codes[kept.at] == _CODES[cat]) & chosen[kept.at]))

    def left_out(self, at: np.ndarray) -> np.ndarray | None:
        """Of the events at ``at``, those that analyze's index leaves out (no category, or "Trace"), as a
        mask; None where :attr:`plain` is not so (the index then looks at the categories itself)."""
        if not self.plain:
            return None
        codes = self.codes[at]
        return (codes == _NO_CATEGORY) | (codes == _TRACE)

    def pids_of(self, at: np.ndarray) -> list:
        """The pids of the events at ``at`` (of every event: the list as it is)."""
        return self.pids if len(at) == len(self.pids) else _taken(self.pids, at)


def accepts_chunk(events: list) -> bool:
    """Whether the projected events read as their dicts would (:func:`chunk_codes`)."""
    return chunk_codes(events) is not None


def chunk_codes(events: list) -> Coded | None:
    """Each event's code (its category's, :data:`_CODES`) and name, for :func:`collect_chunk`; None where the
    projected events could read otherwise than their dicts: a host or GPU event not named by a string
    (the dict way names one without a name ""), or a launch call whose args hold no correlation (the
    projection reads an absent one and a null one alike)."""
    cats, pids, phases = [event.cat for event in events], [event.pid for event in events], [event.ph for event in events]
    try:
        codes = np.frombuffer(bytes(map(_CODE_OF.__getitem__, cats)), dtype=np.int8)  # (bytes(): a sixth faster)
        plain = True  # (the categories met so far are strings and None)
    except (KeyError, TypeError):  # (a category not met yet, or one that is no string)
        codes, plain = _new_codes(cats), set(map(type, cats)) <= {str, type(None)}
    host, gpu = (_kept(events, np.flatnonzero((codes >= first) & (codes < last)))
                 for first, last in ((_FIRST_HOST, _FIRST_GPU), (_FIRST_GPU, _ANNOTATION)))
    if (host.names or gpu.names) and set(map(type, host.names)) | set(map(type, gpu.names)) != {str}:
        return None
    if [at for at in np.flatnonzero(_IS_RUNTIME[codes[host.at]]).tolist()
            if (args := host.events[at].args) is not None and args.correlation is None
            and "launch" in host.names[at].lower()]:
        return None
    return Coded(codes, plain, pids, phases, host, gpu)


def _kept(events: list, at: np.ndarray) -> Kept:
    """The events at ``at`` with their names (read of these events only)."""
    chosen = _taken(events, at)
    return Kept(at, chosen, [event.name for event in chosen])


def _new_codes(cats: list) -> np.ndarray:
    """The codes of categories some of which were not met yet (kept for the next chunks while they are
    few); a category that is no string has none (:data:`_NO_CATEGORY`), as in :meth:`.ops.OpsCollector.visit`."""
    cats = [cat if cat.__class__ is str else None for cat in cats]
    codes = {cat: _CODES.get(cat, _ANNOTATION if cat is not None and iterannotation.CATEGORY in cat else 0)
             for cat in dict.fromkeys(cats)}
    if len(_CODE_OF) + len(codes) <= _FEW_CATEGORIES:
        _CODE_OF.update(codes)
    return np.frombuffer(bytes(map(codes.__getitem__, cats)), dtype=np.int8)


def collect_chunk(c: OpsCollector, events: list, coded: Coded | None = None, times: Times | None = None) -> None:
    """A chunk's events into the collector's columns (:func:`accepts_chunk` said yes; ``coded``: its
    :func:`chunk_codes`, ``times``: its :func:`.chunktimes.chunk_times`, when at hand), as its ``visit``
    of each event's dict would."""
    first_uid = c.events
    c.events += len(events)
    if not events:
        return
    coded = chunk_codes(events) if coded is None else coded
    times = _times(events) if times is None else times
    codes, pids, phases = coded.codes, coded.pids, coded.phases
    owns = None  # (each event's own args.rank, -1 none; None: no event has one)
    evidence = np.flatnonzero(_EVIDENCE[codes]).tolist()
    evidence_args = [events[at].args for at in evidence]
    ranks = [args.rank for args in evidence_args] if None not in evidence_args else [
        None if args is None else args.rank for args in evidence_args]
    if ranks.count(None) != len(ranks):
        owns = [-1] * len(events)
        for at, rank in zip(evidence, ranks):
            if rank.__class__ is int and rank >= 0:
                owns[at] = rank
    run_of = _runs(c, pids, owns, _FLAGS[codes])
    if "M" in phases:
        for at in [at for at, ph in enumerate(phases) if ph == "M"]:
            _metadata(c, events[at])
    flows = np.flatnonzero(codes == _FLOW)
    if len(flows):
        _flows(c, events, phases, pids, flows, run_of)
    annotations = np.flatnonzero(codes == _ANNOTATION)
    if len(annotations):
        _annotations(c, events, annotations, times, run_of)
    chunk = (c, coded, times, run_of, first_uid)
    for kept, take in ((coded.host, _host), (coded.gpu, _gpu)):
        if len(kept.at):
            timed = _timed(c, kept, times, run_of)
            if len(timed.at):
                take(chunk, timed)
    c.spill_if_full()


def _times(events: list) -> Times:
    """The times of events as the dict way reads them (:func:`_numbers`), for a chunk without them."""
    times = times_of(_numbers([event.ts for event in events]), _numbers([event.dur for event in events]))
    assert times is not None  # (_numbers gives ints, floats and None only)
    return times


def _timed(c: OpsCollector, kept: Kept, times: Times, run_of: np.ndarray) -> Kept:
    """The kept events with a numeric ts and dur (the others counted as untimed, per run)."""
    chosen = kept.at
    timed = ~(np.isnan(times.ts_float[chosen]) | np.isnan(times.dur_float[chosen]))
    if timed.all():
        return kept
    untimed = c.runs.arrays["untimed"]
    for run in run_of[chosen[~timed]].tolist():
        untimed[run] += 1
    listed = np.flatnonzero(timed).tolist()
    return Kept(chosen[timed], _taken(kept.events, listed), _taken(kept.names, listed))


def _ends(times: Times, at: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Start, end and duration of the events at ``at`` (timed), as float64: the end as ``ts + dur`` in
    Python (ints summed exactly, then made a float), which float64 sums equal below 2**53."""
    ts, dur = times.ts_float[at], times.dur_float[at]
    if len(at) and float(np.abs(ts).max()) + float(np.abs(dur).max()) >= _EXACT:
        listed = at.tolist()
        return ts, np.array(list(map(add, map(times.ts.__getitem__, listed), map(times.dur.__getitem__, listed))),
                            dtype=np.float64), dur
    return ts, ts + dur, dur


def _are_ints(values: list, kinds: set, at: np.ndarray) -> np.ndarray:
    """Whether each value at ``at`` (none of them None) is an int (a bool is not), at once where the
    chunk's ``kinds`` of values tell."""
    if int not in kinds:
        return np.zeros(len(at), dtype=np.int8)
    if kinds <= _INT_OR_NONE:
        return np.ones(len(at), dtype=np.int8)
    return np.array([value.__class__ is int for value in map(values.__getitem__, at.tolist())], dtype=np.int8)


def _name_numbers(c: OpsCollector, names: list) -> list[int]:
    """Each name's number (new names numbered in order), by lookups alone where all are known."""
    known = c.names
    try:
        out = list(map(known.get, names))
        first = out.index(None) if None in out else len(out)
    except TypeError:  # (a name that is a list or an object: an annotation's may be)
        out, first = [], 0
    if first < len(names):
        out[first:] = [known.setdefault(name, len(known)) if name.__class__ is str else c._name(name)
                       for name in names[first:]]
    return out


def _present(args: list) -> list:
    """Events' args, :data:`_NO_ARGS` (every member None) for an event that has none."""
    return args if None not in args else [_NO_ARGS if one is None else one for one in args]


def _numbers(values: list) -> list:
    """Times as the dict way reads them (None: absent or no number)."""
    if set(map(type, values)) <= {int, float}:
        return values
    return [value if value.__class__ in NUMBERS else _number(value) for value in values]


def _runs(c: OpsCollector, pids: list, owns: list | None, flags: np.ndarray) -> np.ndarray:
    """Each event's run (of one pid and own rank; the chunk's first continues the collector's last where the
    key is the same), the chunk's new runs appended with their counts, and ``flags`` (each event's) OR-ed
    into its run's; ``owns`` None: no event has its own rank."""
    ints = _int64(pids) if set(map(type, pids)) == {int} else None
    if ints is not None:
        changes = ints[1:] != ints[:-1]
        own = None if owns is None else np.array(owns, dtype=np.int64)
        if own is not None:
            changes |= own[1:] != own[:-1]
        starts = np.concatenate(([0], np.flatnonzero(changes) + 1))
        start_pids, start_owns = ints[starts].tolist(), [-1] * len(starts) if own is None else own[starts].tolist()
    else:
        keyed = list(zip(pids, [-1] * len(pids) if owns is None else owns))
        starts = np.array([0, *[at for at, (before, key) in enumerate(zip(keyed, keyed[1:]), 1) if key != before]],
                          dtype=np.int64)
        start_pids, start_owns = (list(column) for column in zip(*_taken(keyed, starts)))
    lengths = np.diff(np.append(starts, len(pids)))
    run_flags = np.bitwise_or.reduceat(flags, starts)
    runs = c.runs.arrays
    before = c._at
    skip = 1 if (start_pids[0], start_owns[0]) == c._last else 0  # (the run before goes on)
    if skip:
        runs["count"][before] += int(lengths[0])
        runs["flags"][before] |= int(run_flags[0])
    first = len(runs["count"])
    new = len(starts) - skip
    if new:
        pid_keys = c.pid_keys
        new_pids = start_pids[skip:]
        known = list(map(pid_keys.get, new_pids)) if ints is not None or set(map(type, new_pids)) <= _KEY_TYPES else [None]
        runs["pid"].fromlist(known if None not in known else
                             [pid_keys.setdefault(_pid_key(pid), len(pid_keys)) for pid in new_pids])
        runs["own"].fromlist(start_owns[skip:])
        _append(runs, (("count", lengths[skip:]), ("flags", run_flags[skip:]), ("untimed", np.zeros(new, np.int64))))
        c._last, c._at = (start_pids[-1], start_owns[-1]), first + new - 1
    numbers = np.arange(first - skip, first + new, dtype=np.int64)
    if skip:
        numbers[0] = before
    return np.repeat(numbers, lengths)


def _int64(values: list[int]) -> np.ndarray | None:
    """Integers as int64; None where one is beyond it."""
    try:
        return np.array(values, dtype=np.int64)
    except OverflowError:
        return None


def _metadata(c: OpsCollector, event: object) -> None:
    name, args = event.name, event.args
    if name.__class__ is str and name in METADATA and args is not None:
        c.metadata[(_key(event.pid), _key(event.tid), name)] = getattr(args, METADATA[name])


def _places(c: OpsCollector, pids: list, tids: list) -> list[int]:
    """Each event's (pid, tid) number, as the dict way numbers them; events of one pid (the usual case: a
    chunk's host events, or its GPU events) by the pid's own numbers of its tids, with no tuple per event."""
    places = c.places
    kinds = set(map(type, pids)) | set(map(type, tids))
    if pids and kinds <= _KEY_TYPES and pids.count(pid := pids[0]) == len(pids):
        of_pid = c.tid_places.setdefault(pid, {})
        out = list(map(of_pid.get, tids))
        if None in out:
            for at in [at for at, number in enumerate(out) if number is None]:
                out[at] = of_pid[tids[at]] = places.setdefault((pid, tids[at]), len(places))
        return out
    if kinds <= _KEY_TYPES:
        keys = list(zip(pids, tids))
    else:
        keys = [(pid, tid) if pid.__class__ in KEYS and tid.__class__ in KEYS else (_key(pid), _key(tid))
                for pid, tid in zip(pids, tids)]
    out = list(map(places.get, keys))
    if None in out:
        out = [places.setdefault(key, len(places)) for key in keys]
    return out


def _links(c: OpsCollector, values: list) -> list[int]:
    """Ids as the collector numbers them (the short way when all are plain integers or None)."""
    kinds = set(map(type, values))
    if kinds <= _PLAIN_IDS:
        present = values if type(None) not in kinds else [value for value in values if value is not None]
        if not present or (LINK_LOW < min(present) and max(present) < LINK_HIGH):
            return values if len(present) == len(values) else [NO_LINK if value is None else value for value in values]
    link = c._link
    return [value if value.__class__ is int and LINK_LOW < value < LINK_HIGH else link(value) for value in values]


def _signatures(c: OpsCollector, args: list) -> list[int]:
    """Each host event's signature number (``args``: its args, :data:`_NO_ARGS` where it has none): its
    argument lists as one text (absent and null alike: None either way), decoded once per distinct text."""
    known = c.signature_of_raw
    # (the members read by name: a list comprehension reads them in half attrgetter's time; the lists of a
    # launch call, none, give the text of none without encoding it)
    lists = [(one.Input_Dims, one.Input_type, one.Input_Strides, one.Concrete_Inputs, one.Output_type) for one in args]
    texts = [_NO_SIGNATURE if one == _NO_LISTS else _encode(one) for one in lists]
    out = list(map(known.get, texts))
    if None in out:
        for at in [at for at, number in enumerate(out) if number is None]:
            number = known.get(texts[at])
            if number is None:
                number = known[texts[at]] = c._signature(orjson.loads(texts[at]))
            out[at] = number
    return out


def _annotations(c: OpsCollector, events: list, chosen: np.ndarray, times: Times, run_of: np.ndarray) -> None:
    """The annotations' columns, as :meth:`.ops.OpsCollector.annotate` keeps each (one without a numeric
    ts or dur left out: it encloses nothing)."""
    at = chosen[~(np.isnan(times.ts_float[chosen]) | np.isnan(times.dur_float[chosen]))]
    ts, end, _ = _ends(times, at)
    names = [event.name for event in _taken(events, at)]
    _append(c.annotations.arrays, (("ts", ts), ("end", end), ("name", _name_numbers(c, names)), ("run", run_of[at])))


def _append(columns: dict, values: tuple) -> None:
    """Each (column name, list or numpy array) pair's values appended to its typed column (``fromlist``:
    a third of ``extend``'s time on a list; an array's bytes at once)."""
    for name, values_of in values:
        column = columns[name]
        if values_of.__class__ is list:
            column.fromlist(values_of)
        else:
            column.frombytes(values_of.astype(column.typecode, copy=False).tobytes())


def _taken(values: list, at: np.ndarray | list) -> list:
    """The values at positions ``at``."""
    return list(map(values.__getitem__, at if at.__class__ is list else at.tolist()))


def _flows(c: OpsCollector, events: list, phases: list, pids: list, flows: np.ndarray, run_of: np.ndarray) -> None:
    """The flows' columns (their starts and ends; a flow event of another phase is left out)."""
    flow_phases = _taken(phases, flows)
    try:
        kinds = np.frombuffer(bytes(map(_FLOW_PHASES.get, flow_phases, repeat(0))), dtype=np.int8)
    except TypeError:  # (a phase that is a list or an object)
        kinds = np.array([_FLOW_PHASES.get(ph, 0) if ph.__class__ is str else 0 for ph in flow_phases], dtype=np.int8)
    starts, ends = flows[kinds == 1], flows[kinds == 2]
    start_events, end_events = _taken(events, starts), _taken(events, ends)
    for columns, chosen, chosen_events in ((c.flow_starts.arrays, starts, start_events),
                                           (c.flow_ends.arrays, ends, end_events)):
        _append(columns, (("id", _links(c, [event.id for event in chosen_events])), ("run", run_of[chosen])))
    c.flow_ends.arrays["place"].fromlist(_places(c, _taken(pids, ends), [event.tid for event in end_events]))


def _fields(c: OpsCollector, kept: Kept) -> tuple[list[int], list[int], list]:
    """The name numbers, places and args of the kept events."""
    events = kept.events
    return (_name_numbers(c, kept.names), _places(c, [event.pid for event in events], [event.tid for event in events]),
            _present([event.args for event in events]))


def _host(chunk: tuple, kept: Kept) -> None:
    """The host events' columns (``chunk``: what :func:`collect_chunk` read of the chunk), as
    :meth:`.ops.OpsCollector.host` keeps each."""
    c, coded, times, run_of, first_uid = chunk
    at, names = kept.at, kept.names
    name_ids, places, args = _fields(c, kept)
    codes = coded.codes[at]
    kinds = _HOST_KIND[codes]
    corrs, exts = [one.correlation for one in args], [one.External_id for one in args]
    seqs, kernels = [one.Sequence_number for one in args], [one.kernel for one in args]
    launch = np.full(len(at), -1, dtype=np.int8)  # (see OpsCollector.host)
    runtime = np.flatnonzero(kinds == RUNTIME)
    if len(runtime):
        named = c._launch_names  # (whether a name is a launch call's, asked once per name)
        numbers = _taken(name_ids, runtime)
        if None in map(named.get, numbers):
            for k, number in zip(runtime.tolist(), numbers):
                if number not in named:
                    named[number] = "launch" in names[k].lower()
        launches = runtime[np.array(list(map(named.__getitem__, numbers)), dtype=bool)].tolist()
        launch[launches] = [0 if corrs[k] is not None else 1 for k in launches]
    ts, end, dur = _ends(times, at)
    _append(c.host.arrays, (
            ("thread", places), ("ts", ts), ("end", end), ("kind", kinds), ("name", name_ids),
            ("sig", _signatures(c, args)), ("uid", at + first_uid), ("corr", _links(c, corrs)),
            ("ext", _links(c, exts)), ("seq", _links(c, seqs)),
            ("kernel", [-1] * len(kernels) if kernels.count(None) == len(kernels) else
             [c._name(kernel) if kernel.__class__ is str else -1 for kernel in kernels]), ("run", run_of[at]),
            ("launch", launch), ("dur", dur), ("dur_int", _are_ints(times.dur, times.dur_kinds, at)),
            ("driver", _DRIVER[codes])))


def _gpu(chunk: tuple, kept: Kept) -> None:
    """The GPU events' columns, as :meth:`.ops.OpsCollector.visit` keeps each."""
    c, coded, times, run_of, _ = chunk
    at, names = kept.at, kept.names
    name_ids, places, args = _fields(c, kept)
    gpu_cats = _GPU_CAT[coded.codes[at]]
    corrs, exts = [one.correlation for one in args], [one.External_id for one in args]
    originals, streams = [one.original_stream for one in args], [one.stream for one in args]
    if originals.count(None) != len(originals):
        streams = [stream if original is None else original for original, stream in zip(originals, streams)]
    if not set(map(type, streams)) <= _FLOATS:  # (else as they are: a typed float column takes ints as float() does)
        streams = [float(stream) if stream.__class__ in NUMBERS else np.nan for stream in streams]
    ts, end, dur = _ends(times, at)
    dur_int = _are_ints(times.dur, times.dur_kinds, at)
    _append(c.gpu.arrays, (
            ("ts", ts), ("end", end), ("dur", dur), ("integral", _are_ints(times.ts, times.ts_kinds, at) & dur_int),
            ("cat", gpu_cats), ("name", name_ids), ("stream", streams), ("dur_int", dur_int), ("place", places),
            ("corr", _links(c, corrs)), ("ext", _links(c, exts)), ("run", run_of[at])))
    numbers, asked = set(name_ids), c._collective_names  # (whether a name is a collective kernel's, asked once per name)
    if not numbers <= asked.keys():
        for number, name in zip(name_ids, names):
            if number not in asked:
                asked[number] = c.collectives.wanted(name)
    wanted = {number for number in numbers if asked[number]}
    if wanted:
        slots = run_of[at]
        for k in [k for k, number in enumerate(name_ids) if number in wanted and gpu_cats[k] == KERNEL]:
            c.collectives.add_projected([kept.events[k]], lambda _pid, slot=int(slots[k]): slot)
