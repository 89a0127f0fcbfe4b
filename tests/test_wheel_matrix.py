"""Wheel-tier records in the matrix, dead ends and pick: measured (wheel), below gate and runtime, above a rule."""

from __future__ import annotations

import pytest

from stackforge.core.errors import NothingQualifiesError
from stackforge.core.records import Tier
from stackforge.core.wheel_readings import CodeSite, ReadContext, Reading, ReadingStatus, ReleaseFile
from stackforge.plan.planner import Plan
from stackforge.report.compat_matrix import CellSource, CellStatus, build_matrix, cell_label
from stackforge.report.deadends import find_dead_ends, write_deadends
from stackforge.report.pick import evaluate_candidates, pick
from stackforge.wheels.tier import Measurement, wheel_record
from tests.matrix_fixtures import CU130, CU131, TARGET, plan_dict, seed_records

SM120 = ReadContext(arch="12.0", gpu_count=8, interconnect="pcie")
SITE = {"flashinfer-python": "flashinfer/jit/comm.py", "sglang": "sglang/srt/distributed/torch_symm_mem.py"}


def wheel(dist: str, version: str, fact: str, status: ReadingStatus, code: str = "", *,
          ctx: ReadContext = SM120, depends_on: tuple[str, ...] = ("arch",)):
    reading = Reading(fact, status, f"{SITE.get(dist, dist)}:10 {code}", (CodeSite(SITE.get(dist, dist), 10, code),),
                      depends_on)
    file = ReleaseFile(dist, version, f"{dist}-{version}-py3-none-any.whl", f"https://files/{dist}-{version}.whl",
                       "a" * 64, index="https://pypi.org/simple")
    return wheel_record(Measurement(dist, version, reading, file), target=TARGET, ctx=ctx, run_id="wheel-run")


def matrix(extra):
    return build_matrix([*seed_records(), *extra], Plan.from_json(plan_dict()), TARGET)


def test_a_wheel_record_decides_a_cell_of_every_stack_pinning_its_release():
    report = matrix([wheel("sglang", "0.5.12", "custom-allreduce", ReadingStatus.UNAVAILABLE, "world_size in (2, 4)")])
    cell = report.row(CU130).cell("custom-allreduce")
    assert (cell.status, cell.source) == (CellStatus.FAIL, CellSource.MEASURED)
    assert (cell.tier, cell.how) == (Tier.WHEEL, "wheel")
    assert "wheel" in cell_label(cell) and "world_size in (2, 4)" in cell.evidence
    from stackforge.report.compat_matrix_write import write_matrix_md
    assert "*wheel* = measured (wheel)" in write_matrix_md(report), "the legend explains the wheel label"
    predicted = report.row(CU131).cell("custom-allreduce").source is CellSource.PREDICTED
    assert predicted, "sglang 0.5.23 was not read"
    assert [row.stack_id for row in report.rows if row.stack_id.startswith("wheel-")] == [], \
        "a wheel record is no stack of its own"


def test_gate_and_runtime_outrank_the_wheel_tier():
    report = matrix([wheel("flashinfer-python", "0.6.14", "flashinfer-ar-fusion", ReadingStatus.UNAVAILABLE),
                     wheel("flashinfer-python", "0.7.2", "flashinfer-ar-fusion", ReadingStatus.UNAVAILABLE)])
    assert (report.row(CU130).cell("flashinfer-ar-fusion").status, report.row(CU130).cell(
        "flashinfer-ar-fusion").tier) == (CellStatus.ADMITTED, Tier.GATE)     # a gate that runs nothing admits
    assert report.row(CU131).cell("flashinfer-ar-fusion").tier is Tier.RUNTIME


def test_the_wheel_tier_outranks_a_rule_and_flags_a_contradiction():
    report = matrix([wheel("sglang", "0.5.12", "torch-symm-mem", ReadingStatus.AVAILABLE, "MAX_SIZES.get(cap)")])
    cell = report.row(CU130).cell("torch-symm-mem")
    # The code admits the target (a reading, not a run): admitted, and still against the rule's bound.
    assert (cell.status, cell.source, cell.tier) == (CellStatus.ADMITTED, CellSource.MEASURED, Tier.WHEEL)
    assert "rule contradicted by measurement" in cell.contradicted and "wheel" in cell.contradicted
    assert "the code admits the target; whether torch-symm-mem works is decided by a runtime probe" in cell.reason


def test_a_reading_that_depends_on_the_stack_matches_only_stacks_with_that_context():
    from dataclasses import replace
    cu128 = wheel("flashinfer-python", "0.6.14", "flashinfer-jit", ReadingStatus.UNAVAILABLE,
                  ctx=replace(SM120, cuda="12.8"), depends_on=("arch", "cuda"))
    cu130 = wheel("flashinfer-python", "0.6.14", "flashinfer-jit", ReadingStatus.UNAVAILABLE,
                  ctx=replace(SM120, cuda="13.0"), depends_on=("arch", "cuda"))
    assert cu128.stack_id == "wheel-flashinfer-python-0.6.14-cu12.8" != cu130.stack_id
    cell = matrix([cu128]).row(CU130).cell("flashinfer-jit")
    assert all(r.tier is not Tier.WHEEL for r in cell.records)
    assert any(r.tier is Tier.WHEEL for r in matrix([cu130]).row(CU130).cell("flashinfer-jit").records)


def test_undecided_and_narrower_facts_decide_nothing_and_add_no_column():
    report = matrix([wheel("sglang", "0.5.12", "custom-allreduce", ReadingStatus.UNDECIDED),
                     wheel("sglang", "0.5.12", "torch-symm-mem:flag", ReadingStatus.AVAILABLE)])
    assert report.row(CU130).cell("custom-allreduce").source is CellSource.PREDICTED
    assert "torch-symm-mem:flag" not in report.features


def test_both_halves_of_the_pcie_ipc_allreduce_decide_one_cell_and_the_worst_wins():
    """FlashInfer's module and SGLang's switch are read from two releases; the path works only when both
    have it, so both readings land in the ``pcie-allreduce`` cell and a missing half makes it fail."""
    fi = wheel("flashinfer-python", "0.7.2", "flashinfer-pcie-ipc-ar", ReadingStatus.AVAILABLE,
               "_SUPPORTED_WORLD_SIZES = (2, 4, 8)")
    both = matrix([fi, wheel("sglang", "0.5.23", "sglang-pcie-ipc-ar", ReadingStatus.AVAILABLE,
                             "SGLANG_ENABLE_PCIE_IPC_ALLREDUCE = EnvBool(False)")])
    assert "flashinfer-pcie-ipc-ar" not in both.features and "sglang-pcie-ipc-ar" not in both.features
    cell = both.row(CU131).cell("pcie-allreduce")
    assert (cell.status, cell.tier) == (CellStatus.ADMITTED, Tier.WHEEL)
    assert {r.probe for r in cell.records} == {"wheel.flashinfer-python.flashinfer-pcie-ipc-ar",
                                               "wheel.sglang.sglang-pcie-ipc-ar"}
    half = matrix([fi, wheel("sglang", "0.5.23", "sglang-pcie-ipc-ar", ReadingStatus.ABSENT)])
    assert half.row(CU131).cell("pcie-allreduce").status is CellStatus.FAIL


def test_deadends_names_the_first_release_that_unblocks_from_measured_boundaries():
    boundary = [wheel("flashinfer-python", "0.6.3", "flashinfer-ar-fusion", ReadingStatus.UNAVAILABLE,
                      "supported_major_versions=[9, 10]"),
                wheel("flashinfer-python", "0.6.16.post4", "flashinfer-ar-fusion", ReadingStatus.UNAVAILABLE,
                      "supported_major_versions=[9, 10]"),
                wheel("flashinfer-python", "0.6.17", "flashinfer-ar-fusion", ReadingStatus.AVAILABLE,
                      "supported_major_versions=[9, 10, 12]"),
                wheel("flashinfer-python", "0.7.2", "flashinfer-ar-fusion", ReadingStatus.AVAILABLE,
                      "supported_major_versions=[9, 10, 12]")]
    report = find_dead_ends(matrix(boundary))
    fusion = next(d for d in report.dead_ends if d.feature == "flashinfer-ar-fusion")
    (found,) = fusion.boundaries
    assert (found.dist, found.last_blocked, found.first_unblocked) == ("flashinfer-python", "0.6.16.post4", "0.6.17")
    text = write_deadends(report, "md")
    assert ("first release whose code admits it: flashinfer-python 0.6.17 (measured (wheel): "
            "flashinfer/jit/comm.py:10 supported_major_versions=[9, 10, 12]; 0.6.16.post4 blocks: "
            "flashinfer/jit/comm.py:10 supported_major_versions=[9, 10])") in text
    assert "rules only" not in text.split("**flashinfer-ar-fusion**")[1].split("- [")[0]
    tree = text.split("**nccl-graph-tree**")[1].split("- [")[0]
    assert "rests on the rules only: no release is measured to unblock it" in tree
    # nccl-graph-tree is no wheel fact: `stackforge bisect nccl-graph-tree` would be exit 2.
    assert "stackforge bisect" not in tree and "no wheel reader reads it" in tree
    json_text = write_deadends(report, "json")
    assert '"first_unblocked": "0.6.17"' in json_text


def test_deadends_says_when_the_newest_release_read_still_blocks():
    report = find_dead_ends(matrix([wheel("sglang", "0.5.9", "torch-symm-mem", ReadingStatus.UNAVAILABLE, "KeyError"),
                                    wheel("sglang", "0.5.12", "torch-symm-mem", ReadingStatus.UNAVAILABLE, "KeyError")]))
    text = write_deadends(report, "text")
    assert "still blocked in the newest sglang release read, 0.5.12" in text


def test_pick_never_takes_a_wheel_reading_that_admits_as_working():
    records = [*seed_records(), wheel("sglang", "0.5.12", "torch-symm-mem", ReadingStatus.AVAILABLE)]
    with pytest.raises(NothingQualifiesError):
        pick(records, Plan.from_json(plan_dict()), TARGET, require=("torch-symm-mem",)).picked()
    cu130 = next(c for c in evaluate_candidates(records, Plan.from_json(plan_dict()), TARGET, ("torch-symm-mem",))
                 if c.stack_id == CU130)
    blocker, = cu130.blockers
    assert blocker.line.startswith(
        "torch-symm-mem: admitted by the code only, not measured working (wheel probe wheel.sglang.torch-symm-mem")


def test_a_pruned_stack_gets_no_wheel_record():
    from tests.matrix_fixtures import PRUNED
    report = matrix([wheel("flashinfer-python", "0.6.3", "flashinfer-ar-fusion", ReadingStatus.AVAILABLE)])
    cell = report.row(PRUNED).cell("flashinfer-ar-fusion")
    assert cell.status is CellStatus.PRUNED and not cell.contradicted and not cell.records


def test_a_wheel_pass_does_not_override_a_rule_no_wheel_can_witness():
    """A wheel pass says the release's code admits the target; a rule whose data says no wheel reading
    decides it (a failure only running the kernel shows: nvfp4 mm_fp4 on SM120 in FlashInfer 0.6.3)
    stands, with the wheel record kept as evidence, and no contradiction is flagged."""
    plan = plan_dict()
    for cell in plan["cells"]:
        for prediction in cell["predictions"]:
            if prediction.get("rule") == "torch-symm-mem-sm120":
                prediction["unwitnessed"] = "a runtime failure: only running the kernel shows it"
    passed = wheel("sglang", "0.5.12", "torch-symm-mem", ReadingStatus.AVAILABLE, "MAX_SIZES.get(cap)")
    report = build_matrix([*seed_records(), passed], Plan.from_json(plan), TARGET)
    cell = report.row(CU130).cell("torch-symm-mem")
    assert (cell.status, cell.source, cell.contradicted) == (CellStatus.UNAVAILABLE, CellSource.PREDICTED, "")
    assert "no wheel reading decides this rule: a runtime failure" in cell.reason
    assert passed.probe in cell.reason and any(r.tier is Tier.WHEEL for r in cell.records)
    # A wheel failure still decides: the code refusing the target is a measurement.
    failed = wheel("sglang", "0.5.12", "torch-symm-mem", ReadingStatus.UNAVAILABLE, "MAX_SIZES[cap]")
    refused = build_matrix([*seed_records(), failed], Plan.from_json(plan), TARGET).row(CU130).cell("torch-symm-mem")
    assert (refused.status, refused.tier) == (CellStatus.FAIL, Tier.WHEEL)
