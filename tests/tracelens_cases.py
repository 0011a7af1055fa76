"""The inputs of the committed TraceLens reference tables (tests/reference/tracelens/<case>/):
generated runs with collective args and real traces, each as the rank files TraceLens reads, in rank order.

scripts/tracelens_reference.py runs TraceLens on them; tests/test_collectives.py runs analyze on the
same inputs and compares every table with TraceLens's, row by row.
"""
from __future__ import annotations

from pathlib import Path

from streamtrace.synth import SynthConfig, write_traces

REFERENCE = Path(__file__).parent / "reference" / "tracelens"
TRACES = Path(__file__).resolve().parents[2] / "shared" / "traces"
SMALL = dict(steps=2, microbatches=2, eager_kernels=2, graph_kernels=4, python_noise=0, collectives=True)
SYNTH = {
    # FSDP over 4 ranks, rank 2 slow: all-gathers, reduce-scatters, all-reduces, all_to_allv, one node
    "synth_fsdp4": SynthConfig(ranks=4, pp_stages=1, slow_rank=2, slow_factor=1.25, seed=3, **SMALL),
    # 16 ranks over two nodes (8 GPUs each), 2 PP stages (send/recv), rank 5 slow
    "synth_pp16": SynthConfig(ranks=16, pp_stages=2, slow_rank=5, slow_factor=1.4, seed=4, **SMALL),
}
REAL = {
    "dlrm_8ranks": sorted((TRACES / "dlrm_8ranks").glob("worker*"), key=lambda path: int(path.name[6:].split("_")[0])),
    "nccl_rank0": [TRACES / "nccl_rank0.json.gz"],
    "b200_eager": [TRACES / "b200_eager.json.gz"],
}
HEATMAP = ("synth_fsdp4", "synth_pp16")  # cases whose reference has TraceLens's all2allv heat map
CASES = (*SYNTH, *REAL)


def case_files(case: str, directory: Path) -> list[Path]:
    """The rank files of a case, in rank order (a generated case is written into ``directory``)."""
    if case in REAL:
        return REAL[case]
    truth = write_traces(SYNTH[case], directory, compress="gz", merged=True)
    return [directory / rank["file"] for rank in truth["ranks"]]
