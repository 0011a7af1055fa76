"""stragglers_nccl_all: HTA's straggler rule over every communication kernel, ``ncclDevKernel*`` included.

HTA's straggler analysis looks only at kernels named ``ncclKernel*`` (HTA issue 360), so on NCCL 2.19+
traces (``ncclDevKernel*``) it finds no communication; the ``stragglers`` table keeps that. The oracle
for the corrected table is HTA itself, run on a copy of the same trace whose kernels are renamed
``ncclKernel*``; the ground truth is synth's slow rank.
"""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import TRACES

import streamtrace
from streamtrace.synth import SynthConfig, write_traces

SLOW_RANK = 3


def candidates(tables: dict, table: str) -> list[int]:
    return sorted({row["rank"] for row in tables[table] if row["potential_straggler"]})


@pytest.fixture(scope="module")
def dev_and_renamed(tmp_path_factory) -> tuple[Path, Path]:
    """A 4-rank run whose NCCL kernels are all ``ncclDevKernel_*`` (as synth writes them), rank 3 slow;
    and the same files with the kernels renamed ``ncclKernel_*``."""
    dev = tmp_path_factory.mktemp("dev")
    config = SynthConfig(ranks=4, pp_stages=2, microbatches=2, steps=4, graph_kernels=4, eager_kernels=3, python_noise=0,
                         graph_streams=2, big_ints=False, slow_rank=SLOW_RANK, slow_factor=1.5, collectives=True)
    write_traces(config, dev, compress="none", merged=False)
    renamed = tmp_path_factory.mktemp("renamed")
    for path in sorted(dev.glob("rank*_trace.json")):
        text = path.read_text()
        assert "ncclDevKernel_" in text and '"ncclKernel' not in text
        (renamed / path.name).write_text(text.replace("ncclDevKernel", "ncclKernel"))
    assert json.loads((dev / "truth.json").read_text())["slow_rank"]["rank"] == SLOW_RANK
    return dev, renamed


@pytest.mark.slow
def test_dev_kernels_hta_sees_none_corrected_mode_finds_the_slow_rank(dev_and_renamed):
    dev, renamed = dev_and_renamed
    tables = streamtrace.analyze(dev, jobs=1)["tables"]
    assert candidates(tables, "stragglers") == []  # HTA's rule: no ncclKernel..., no communication
    assert all(row["normalized_start_time"] is None and not row["late"] for row in tables["stragglers"])
    assert SLOW_RANK in candidates(tables, "stragglers_nccl_all")
    assert candidates(streamtrace.analyze(dev, jobs=1, num_candidates=1)["tables"], "stragglers_nccl_all") == [SLOW_RANK]

    from hta_oracle import hta_tables

    hta = {row["rank"] for row in hta_tables(renamed)["stragglers"]}  # HTA on the kernels it can see
    assert candidates(tables, "stragglers_nccl_all") == sorted(hta)
    on_renamed = streamtrace.analyze(renamed, jobs=1)["tables"]
    assert on_renamed["stragglers"] == on_renamed["stragglers_nccl_all"] == tables["stragglers_nccl_all"]
    text = subprocess.run([sys.executable, "-m", "streamtrace", "analyze", str(dev), "-j", "1"], capture_output=True,
                          text=True).stdout
    assert f"late ranks     {', '.join(map(str, candidates(tables, 'stragglers_nccl_all')))}: " in text
    assert "stragglers_nccl_all; HTA's own sees none" in text


def test_nccl_kernel_traces_both_modes_agree():
    """The DLRM ranks' kernels are ncclKernel_*: HTA's table and the corrected one are the same rows."""
    tables = streamtrace.analyze(TRACES / "dlrm_8ranks", jobs=1, only="stragglers")["tables"]
    assert candidates(tables, "stragglers") == [2, 7]
    assert tables["stragglers"] == tables["stragglers_nccl_all"]
    assert any(row["normalized_start_time"] is not None for row in tables["stragglers_nccl_all"])
