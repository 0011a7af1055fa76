"""The performance-model sheets' ops taken a block at a time, their models found once per group of ops
of one name, signature and kernel names, against plain per-op code over the same trees."""
from __future__ import annotations

import numpy as np
import pytest
from conftest import TRACES

from streamtrace.algo import opsheets
from streamtrace.algo.opstables import OpTree, ancestors
from streamtrace.commands.analyses.ops import read_input

TRACES_WITH_SHEETS = ["b200_eager.json.gz", "nccl_rank0.json.gz", "sampled_rank-0.json.gz"]


def _sheet_ops(tree: OpTree, sheet: str) -> list[int]:
    f = tree.f
    return [h for h in range(len(f.h_ts)) if f.names[f.h_name[h]] in opsheets.SHEET_OPS[sheet]]


def _kernel_names(tree: OpTree, gpu: list[int]) -> tuple[str, ...]:
    """An op's kernel names by start, ties as listed (Python's sort is stable)."""
    f = tree.f
    return tuple(f.names[f.g_name[g]] for g in sorted(gpu, key=lambda g: f.g_ts[g]))


@pytest.mark.parametrize("trace", ["nccl_rank0.json.gz", "dlrm_8ranks/worker0_step_12.1694128201545.pt.trace.json.gz"])
def test_backward_links_at_once_are_each_ops_walk(trace: str) -> None:
    """Each op's backward GPU events: for each forward op at or below it, its backward op's subtree's
    links, the backward ops in ascending order (TraceLens's walk, written per op)."""
    tree = OpTree(read_input(str(TRACES / trace))[0])
    ops = list(range(len(tree.f.h_ts)))
    forwards, backwards = opsheets.backward_ops(tree)
    below: dict[int, set[int]] = {}
    for fwd, bwd in zip(forwards.tolist(), backwards.tolist()):
        for h in ancestors(tree.parent, fwd):
            below.setdefault(h, set()).add(bwd)
    link_op, link_gpu = tree.link_pairs(np.arange(len(tree.f.h_ts)))
    links: dict[int, list[int]] = {}
    for h, g in zip(link_op.tolist(), link_gpu.tolist()):
        links.setdefault(h, []).append(g)
    expected = {h: [g for b in sorted(below[h]) for g in links.get(b, [])] for h in sorted(set(forwards.tolist()))}
    assert opsheets.backward_links(tree, ops) == expected
    assert len(expected) and any(expected.values())


@pytest.mark.parametrize("trace", TRACES_WITH_SHEETS)
def test_a_sheets_models_run_once_per_name_signature_and_kernel_names(trace: str, monkeypatch) -> None:
    """Ops of one shape are many: the sheet asks a model's outcome once per distinct (name, signature,
    kernel names by start), not once per op."""
    tree = OpTree(read_input(str(TRACES / trace))[0])
    f = tree.f
    sheet = max(opsheets.SHEET_OPS, key=lambda sheet: len(_sheet_ops(tree, sheet)))
    ops = _sheet_ops(tree, sheet)
    link_op, link_gpu = tree.link_pairs(np.asarray(ops))
    gpu: dict[int, list[int]] = {h: [] for h in ops}
    for h, g in zip(link_op.tolist(), link_gpu.tolist()):
        gpu[h].append(g)
    shapes = {(f.names[f.h_name[h]], int(f.h_sig[h]), _kernel_names(tree, gpu[h])) for h in ops}
    asked = []
    model_outcome = opsheets.model_outcome
    monkeypatch.setattr(opsheets, "model_outcome", lambda tree, h, model, kernels, *rest: asked.append(
        (f.names[f.h_name[h]], int(f.h_sig[h]), tuple(f.names[k] for k in kernels)))
        or model_outcome(tree, h, model, kernels, *rest))
    opsheets.model_sheet(tree, sheet, f.signature_values)
    assert sorted(asked) == sorted(shapes) and len(shapes) < len(ops)


@pytest.mark.parametrize("trace", TRACES_WITH_SHEETS)
def test_sheets_alike_in_small_blocks_and_with_hashes_all_equal(trace: str, monkeypatch) -> None:
    """Blocks of a few ops and GPU events, and a kernel-names hash that tells nothing apart, change no
    sheet: ops whose kernel names differ never share a model's outcome (they are compared)."""
    facts = read_input(str(TRACES / trace))[0]
    expected, notes = opsheets.model_sheets(OpTree(facts), facts.signature_values)
    monkeypatch.setattr(opsheets, "OP_BLOCK", 3)
    monkeypatch.setattr(opsheets, "LINK_BLOCK", 5)
    monkeypatch.setattr(opsheets._Block, "_hashes", lambda self: np.zeros(len(self.count), dtype=np.uint64))
    got, got_notes = opsheets.model_sheets(OpTree(facts), facts.signature_values)
    assert expected and {sheet: table.rows for sheet, table in got.items()} == {
        sheet: table.rows for sheet, table in expected.items()} and got_notes == notes


def test_groups_join_only_ops_of_equal_kernel_names(monkeypatch) -> None:
    """Each group's ops have one name, signature and kernel names, with or without a telling hash; the ops
    whose model reads more of them (``alone``, by name) are each in a group of their own."""
    tree = OpTree(read_input(str(TRACES / "nccl_rank0.json.gz"))[0])
    f = tree.f
    ops = np.asarray(sorted(_sheet_ops(tree, "UnaryElementwise") + _sheet_ops(tree, "BinaryElementwise")))
    op, gpu = tree.link_pairs(ops)
    first = np.searchsorted(op, ops)
    count = np.searchsorted(op, ops, "right") - first
    keys = [(int(f.h_name[h]), int(f.h_sig[h]), _kernel_names(tree, gpu[lo:lo + n].tolist()))
            for h, lo, n in zip(ops.tolist(), first.tolist(), count.tolist())]
    names, many = np.unique(f.h_name[ops], return_counts=True)
    alone = np.zeros(len(f.names), dtype=bool)
    alone[names[np.argsort(many)[-2]]] = True  # (the second most common name)
    lone = alone[f.h_name[ops]]
    for hashes in (True, False):
        if not hashes:
            monkeypatch.setattr(opsheets._Block, "_hashes", lambda self: np.zeros(len(self.count), dtype=np.uint64))
        group, firsts = opsheets._Block(tree, ops, first, count, op, gpu).groups(alone)
        assert [keys[i] for i in firsts[group].tolist()] == keys
        assert len(np.unique(group[lone])) == lone.sum() > 1 and not np.isin(group[lone], group[~lone]).any()
        if hashes:
            assert len(firsts) == len({key for key, one in zip(keys, lone.tolist()) if not one}) + lone.sum()
    assert len(firsts) < len(ops)
