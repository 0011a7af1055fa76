"""How generated events become bytes: the buffered sink (compact lines or Kineto's own layout), the
launch links kept for the ground truth, and a rank's truth record."""
from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import BinaryIO, TextIO

from .config import dumps

# ---------------------------------------------------------------- output plumbing


class Sink:
    """Encoded events -> one JSON array body (one event per line), buffered.

    ``bytes`` counts what was flushed; call :meth:`flush` before reading it.
    """

    BATCH = 256  # orjson output objects carry ~4 KB of allocation each: keep few alive

    def __init__(self, out: BinaryIO, layout: str = "lines") -> None:
        self._out = out
        self._encode = _kineto_text if layout == "kineto" else dumps
        self._buf: list[bytes] = []
        self._sep = b"\n"
        self.bytes = 0
        self.count = 0

    def raw(self, data: bytes) -> None:
        self.flush()
        self._out.write(data)
        self.bytes += len(data)

    def event(self, ev: dict) -> int:
        """Queue one event; return its index in the array."""
        buf = self._buf
        buf.append(self._encode(ev))
        n = self.count
        self.count = n + 1
        if len(buf) >= self.BATCH:
            self.flush()
        return n

    def flush(self) -> None:
        if self._buf:
            chunk = self._sep + b",\n".join(self._buf)
            self._sep = b",\n"
            self._buf.clear()
            self._out.write(chunk)
            self.bytes += len(chunk)


_KINETO_FIRST_LINE = ("ph", "cat", "name", "pid", "tid")
_KINETO_TIMES = ("ts", "dur")


def _kineto_text(event: dict) -> bytes:
    """An event laid out as Kineto's JSON writer lays it out: indented lines
    (kind and place, times, the rest, then ``args`` a line of its own), a
    space after every colon and comma: what real traces look like to a reader."""
    groups = ([(key, value) for key, value in event.items() if key in _KINETO_FIRST_LINE],
              [(key, value) for key, value in event.items() if key in _KINETO_TIMES],
              [(key, value) for key, value in event.items()
               if key not in _KINETO_FIRST_LINE and key not in _KINETO_TIMES and key != "args"])
    lines = [_members(group) for group in groups if group]
    if "args" in event:
        args = event["args"]
        lines.append(f'"args": {{\n      {_members(args.items())}\n    }}' if args else '"args": {}')
    return ("  {\n    " + ",\n    ".join(lines) + "\n  }").encode()


def _members(pairs) -> str:
    return ", ".join(f"{dumps(key).decode()}: {dumps(value).decode()}" for key, value in pairs)


class Links:
    """Streams ``gpu_index,launch_index,correlation`` rows of the launch truth."""

    def __init__(self, out: TextIO | None) -> None:
        self._out = out
        self._buf: list[str] = []
        if out is not None:
            out.write("gpu_index,launch_index,correlation\n")

    def row(self, gpu: int, launch: int, corr: int) -> None:
        if self._out is not None:
            self._buf.append(f"{gpu},{launch},{corr}\n")
            if len(self._buf) >= 16384:
                self.flush()

    def flush(self) -> None:
        if self._out is not None and self._buf:
            self._out.write("".join(self._buf))
            self._buf.clear()


@dataclass
class RankTruth:
    """What one rank's event stream contains (indexes are 0-based positions in its traceEvents)."""

    rank: int
    file: str | None
    pp_rank: int
    pp_stage: int
    pp_group: list[int]
    dp_rank: int
    cpu_pid: int
    cpu_tids: list[int]
    gpu_pid: int  # in the rank file (= local device index)
    merged_gpu_pid: int  # in the merged file (= global rank)
    base_time_ns: int
    steps: int = 0
    events: int = 0
    bytes: int = 0  # uncompressed size of the rank file
    gpu_events: int = 0  # kernel + gpu_memcpy + gpu_memset
    kernels: int = 0
    gpu_memcpy: int = 0
    gpu_memset: int = 0
    runtime_calls: int = 0
    runtime_launches: int = 0  # runtime calls that launched GPU work
    graph_launches: int = 0
    gpu_events_per_graph_launch: int = 0
    flow_starts: int = 0
    flow_finishes: int = 0
    gpu_user_annotations: int = 0
    pp_annotations: int = 0  # CPU user_annotations named by the PP (or GPipe) pattern
    pp_action_counts: dict[str, int] = field(default_factory=dict)
    pp_actions_per_step: list[list] = field(default_factory=list)  # [name, op, stage, mb]; same every step
    gpu_streams: list[int] = field(default_factory=list)
    collective_kernels: int = 0  # NCCL kernels (every one carries the collective args)
    correlation_min: int | None = None
    correlation_max: int | None = None
    links_file: str | None = None
    merged_offset: int | None = None

    def to_dict(self) -> dict:
        return asdict(self)
