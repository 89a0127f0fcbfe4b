"""Dead ends: every dead feature of the seed records, with evidence and the stack that unblocks each."""

from __future__ import annotations

import json
import re

import pytest
from matrix_fixtures import CU128, CU130, CU131, PRUNED, TARGET, plan_dict, record, seed_records

from stackforge.core.errors import SpecError
from stackforge.plan.planner import Plan
from stackforge.report.compat_matrix import build_matrix
from stackforge.report.deadends import find_dead_ends, write_deadends


@pytest.fixture
def dead():
    return find_dead_ends(build_matrix(seed_records(), Plan.from_json(plan_dict()), TARGET))


def test_every_failing_feature_is_listed_in_matrix_order(dead):
    assert dead.features() == ("flashinfer-jit", "flashinfer-ar-fusion", "torch-symm-mem", "nccl-graph-tree")
    by_feature = {d.feature: d for d in dead.dead_ends}
    symm = by_feature["torch-symm-mem"]
    assert [(e.stack_id, e.status, e.source) for e in symm.dead_on] == [
        (CU128, "crash", "measured"), (CU130, "unavailable", "predicted"), (CU131, "fail", "measured")]
    assert symm.dead_on[1].rule == "torch-symm-mem-sm120" and symm.dead_on[1].sources
    assert symm.dead_on[0].evidence.startswith("SymmetricMemory: arch sm_120 not supported")
    assert symm.stacks_total == 3 and symm.unblocked_by is None


def test_first_unblocking_stack_prefers_measurements(dead):
    by_feature = {d.feature: d for d in dead.dead_ends}
    # cu130's gate pass only shows the code admits sm_120; cu131 ran the fusion on the GPU: that one unblocks.
    fusion = by_feature["flashinfer-ar-fusion"].unblocked_by
    assert (fusion.stack_id, fusion.basis, fusion.tier) == (CU131, "measured", "runtime")
    tree = by_feature["nccl-graph-tree"].unblocked_by
    assert (tree.stack_id, tree.basis) == (CU130, "predicted")          # nobody ran it: flagged as such


def test_a_stack_whose_code_only_admits_a_feature_unblocks_it_as_admitted_not_measured():
    records = [r for r in seed_records() if not (r.stack_id == CU131 and r.feature == "flashinfer-ar-fusion")]
    dead = find_dead_ends(build_matrix(records, Plan.from_json(plan_dict()), TARGET))
    fusion = next(d for d in dead.dead_ends if d.feature == "flashinfer-ar-fusion")
    assert (fusion.unblocked_by.stack_id, fusion.unblocked_by.basis) == (CU130, "admitted")
    text = write_deadends(dead, "md")
    assert f"first unblocked by {CU130} (admitted by the code (gate), not measured working:" in text
    assert "- [ ] **flashinfer-ar-fusion**" in text          # the way out is not proven: the box stays open


def test_an_undecided_cell_is_not_dead_and_says_who_left_it_undecided():
    undecided = record(CU130, "torch-symm-mem", "undecided", tier="gate", probe="gate.sglang.symm-mem",
                       reason="needs a running server")
    measured_dead = record(CU131, "nccl-graph-tree", "fail")
    kept_open = record(CU131, "nccl-graph-tree", "undecided", tier="gate", probe="gate.y", reason="no context")
    plan = Plan.from_json(plan_dict())
    dead = find_dead_ends(build_matrix([undecided, measured_dead, kept_open], plan, TARGET))
    symm = next(d for d in dead.dead_ends if d.feature == "torch-symm-mem")
    predicted = next(e for e in symm.dead_on if e.stack_id == CU130)       # the rule's prediction still shows
    assert (predicted.status, predicted.source) == ("unavailable", "predicted")
    assert predicted.undecided == "undecided by gate.sglang.symm-mem: needs a running server"
    assert "🤷 undecided by gate.sglang.symm-mem: needs a running server" in write_deadends(dead, "md")
    tree = next(d for d in dead.dead_ends if d.feature == "nccl-graph-tree")
    assert [e.stack_id for e in tree.dead_on] == [CU131]                   # the measured fail, not the undecided
    assert find_dead_ends(build_matrix([undecided], Plan.empty(), TARGET)).dead_ends == ()


def test_custom_allreduce_passing_is_not_a_dead_end_and_pruned_stacks_are_listed_once(dead):
    assert "custom-allreduce" not in dead.features()
    assert all(e.stack_id != PRUNED for d in dead.dead_ends for e in d.dead_on)
    reason = "torch-no-cu128-from-212: torch 2.12 dropped the cu128 variant; there is no torch 2.14.1+cu128 wheel"
    assert dead.pruned == ((PRUNED, (reason,)),)


def test_markdown_reads_like_the_seed_todo_list(dead):
    text = write_deadends(dead, "md")
    assert "- [x] **flashinfer-ar-fusion** — DEAD END on 1 of 3 stacks (JIT doesn't support SM120)" in text
    assert f"first unblocked by {CU131} (measured pass, runtime:" in text
    assert "no stack in this matrix unblocks it" in text
    assert f"⛔ `{PRUNED}`" in text
    data = json.loads(write_deadends(dead, "json"))
    assert data["schema"] == "stackforge.deadends" and len(data["dead_ends"]) == 4
    assert re.search(r"torch-symm-mem +3/3 stacks  ", write_deadends(dead, "text"))
    with pytest.raises(SpecError):
        write_deadends(dead, "xml")


def test_no_dead_ends():
    report = build_matrix([record(CU131, "serve", "pass", tier="bench")], Plan.empty(), TARGET)
    dead = find_dead_ends(report)
    assert dead.dead_ends == ()
    assert "No dead ends" in write_deadends(dead, "md")


def test_open_dead_ends_are_unchecked_boxes_and_reasons_are_cut_only_on_one_screen_and_say_so(dead):
    text = write_deadends(dead, "md")
    # Measured to pass on a later stack: done. Nothing unblocks it, or only a prediction does: still open.
    assert "- [x] **flashinfer-ar-fusion**" in text
    assert "- [ ] **torch-symm-mem** — DEAD END on 3 of 3 stacks" in text
    assert "- [ ] **nccl-graph-tree**" in text
    long_reason = "SymmetricMemory refused: " + "sm_120 is not in the arch table; " * 20 + "END-OF-REASON"
    records = [record(CU131, "torch-symm-mem", "fail", reason=long_reason, evidence="x " * 400 + "END-OF-EVIDENCE")]
    report = find_dead_ends(build_matrix(records, Plan.empty(), TARGET))
    # The pull-request markdown and --evidence keep everything; the one-screen text cuts at a boundary and
    # states how much it left out.
    for out in (write_deadends(report, "md"), write_deadends(report, "text", evidence=True)):
        assert "END-OF-REASON" in out and "END-OF-EVIDENCE" in out
    assert "<details><summary>evidence</summary>" in write_deadends(report, "md")
    screen = write_deadends(report, "text")
    assert "END-OF-REASON" not in screen and "chars)" in screen
    assert max(len(line) for line in screen.splitlines()) <= 200
