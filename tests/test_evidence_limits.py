"""No status says more than its evidence: what each tier concludes (admitted vs pass), features the target's
hardware cannot have (n/a), and the upgrade report's counts built on both."""

from __future__ import annotations

from pathlib import Path

import pytest
from matrix_fixtures import CU128, CU131, TARGET, plan_dict, record, seed_records

from stackforge.core.errors import SpecError
from stackforge.core.model import Interconnect, Target
from stackforge.core.records import Tier
from stackforge.plan.features import ADMITS, BUILDS, DECIDES, load_feature_catalog
from stackforge.plan.planner import Plan
from stackforge.plan.rules import FEATURES, load_targets
from stackforge.report.compat_matrix import CellJudge, CellSource, CellStatus, build_matrix, decide_cell
from stackforge.report.compat_matrix_write import write_matrix_csv, write_matrix_json
from stackforge.report.deadends import find_dead_ends
from stackforge.report.upgrade import ChangeKind, StackChoice, build_upgrade, change_of, summary_line

CATALOG = load_feature_catalog()
TARGETS = load_targets()


def test_every_feature_the_rules_speak_of_has_a_question_and_known_tiers():
    assert set(FEATURES) <= set(CATALOG.features)
    for spec in CATALOG.features.values():
        assert spec.question
        assert all(conclusion in (DECIDES, BUILDS, ADMITS) for _, conclusion in spec.tiers)


def test_a_reading_of_the_code_only_admits_and_a_refusal_stays_a_fail():
    nvfp4 = CellJudge(CATALOG.spec("nvfp4-gemm"))
    admitted = decide_cell("nvfp4-gemm", [record(CU131, "nvfp4-gemm", "pass", tier="wheel")], judge=nvfp4)
    assert (admitted.status, admitted.source, admitted.tier) == (CellStatus.ADMITTED, CellSource.MEASURED, Tier.WHEEL)
    assert "whether nvfp4-gemm works is decided by a" in admitted.reason and not admitted.dead
    refused = decide_cell("nvfp4-gemm", [record(CU131, "nvfp4-gemm", "fail", tier="wheel")], judge=nvfp4)
    assert refused.status is CellStatus.FAIL and refused.dead
    # A tier that decides the question passes as pass: the arch list is the question of torch-kernels.
    kernels = decide_cell("torch-kernels", [record(CU131, "torch-kernels", "pass", tier="gate")],
                          judge=CellJudge(CATALOG.spec("torch-kernels")))
    assert kernels.status is CellStatus.PASS
    # A runtime pass outranks the admission and decides.
    jit = [record(CU131, "flashinfer-jit", "pass", tier="gate"), record(CU131, "flashinfer-jit", "pass")]
    assert decide_cell("flashinfer-jit", jit, judge=CellJudge(CATALOG.spec("flashinfer-jit"))).status is CellStatus.PASS


def test_features_the_pcie_box_cannot_have_are_not_applicable_with_the_reason():
    box = TARGETS["rtx-pro-6000-x8-pcie"]
    assert "nvlink" not in box.hardware and "multi-gpu" in box.hardware
    assert "NVLink or an RDMA NIC" in CATALOG.spec("ep-a2a").not_applicable(box)
    assert "NVLink" in CATALOG.spec("flashinfer-mnnvl").not_applicable(box)
    assert "multicast" in CATALOG.spec("nccl-nvls").not_applicable(box)
    assert CATALOG.spec("custom-allreduce").not_applicable(box) == ""
    # The same features apply where the hardware is there: NVSwitch boxes, an RDMA NIC for DeepEP.
    assert CATALOG.spec("ep-a2a").not_applicable(TARGETS["h100-x8-nvswitch"]) == ""
    with_nic = Target("pcie-rdma", "x", "12.0", 8, Interconnect.PCIE, rdma=True)
    assert CATALOG.spec("ep-a2a").not_applicable(with_nic) == ""
    # One GPU has no collectives at all.
    assert "two or more GPUs" in CATALOG.spec("nccl-graph-ring").not_applicable(TARGETS["h200-x1"])


def test_a_not_applicable_cell_keeps_its_records_and_is_no_dead_end_in_any_format():
    records = [record(CU131, "ep-a2a", "pass", tier="wheel"), record(CU128, "ep-a2a", "fail", tier="wheel")]
    report = build_matrix(records, Plan.from_json(plan_dict()), TARGET, features=("ep-a2a",))
    cell = report.row(CU131).cell("ep-a2a")
    assert (cell.status, cell.source) == (CellStatus.NOT_APPLICABLE, CellSource.TARGET)
    assert cell.reason.startswith(f"n/a on {TARGET}: needs NVLink or an RDMA NIC") and cell.records
    assert not find_dead_ends(report).dead_ends
    assert '"status": "n/a"' in write_matrix_json(report)
    assert ",ep-a2a,n/a,target," in write_matrix_csv(report)


def test_upgrade_counts_keep_admitted_apart_from_gained_and_leave_n_a_out():
    assert change_of(CellStatus.UNAVAILABLE, CellStatus.ADMITTED) == ChangeKind.ADMITTED
    assert change_of(CellStatus.FAIL, CellStatus.PASS) == ChangeKind.GAINED
    assert change_of(CellStatus.ADMITTED, CellStatus.FAIL) == ChangeKind.LOST
    assert change_of(CellStatus.ADMITTED, CellStatus.PASS) == ChangeKind.UNCHANGED
    assert change_of(CellStatus.PASS, CellStatus.NOT_APPLICABLE) == ChangeKind.NOT_APPLICABLE
    records = [record(CU128, "nvfp4-gemm", "fail", tier="wheel"), record(CU131, "nvfp4-gemm", "pass", tier="wheel"),
               record(CU128, "ep-a2a", "pass", tier="wheel"), record(CU131, "ep-a2a", "fail", tier="wheel"),
               record(CU128, "custom-allreduce", "fail"), record(CU131, "custom-allreduce", "pass")]
    report = build_upgrade(records, Plan.from_json(plan_dict()), TARGET, StackChoice(CU128), StackChoice(CU131))
    changes = {c.feature: c for c in report.features}
    assert changes["nvfp4-gemm"].change == ChangeKind.ADMITTED
    assert changes["custom-allreduce"].change == ChangeKind.GAINED
    assert changes["ep-a2a"].change == ChangeKind.NOT_APPLICABLE      # never "lost" on a box without NVLink
    line = summary_line(report)
    assert "1 gained (measured working or a rule's word), 1 admitted by the code (needs a runtime probe)" in line
    assert "0 lost" in line and "n/a" in line


def test_a_gate_that_built_the_module_is_built_and_one_that_built_nothing_is_admitted():
    jit = CellJudge(CATALOG.spec("flashinfer-jit"))
    built = decide_cell("flashinfer-jit", [record(CU131, "flashinfer-jit", "pass", tier="gate",
                                                  metrics={"evidence_level": "built"})], judge=jit)
    assert (built.status, built.source, built.tier) == (CellStatus.BUILT, CellSource.MEASURED, Tier.GATE)
    assert "built for the target, nothing ran it" in built.reason and not built.dead
    admitted = decide_cell("flashinfer-jit", [record(CU131, "flashinfer-jit", "pass", tier="gate",
                                                     metrics={"evidence_level": "admitted"})], judge=jit)
    assert admitted.status is CellStatus.ADMITTED
    # A tier that only admits never builds, whatever its record claims.
    nvfp4 = CellJudge(CATALOG.spec("nvfp4-gemm"))
    claimed = decide_cell("nvfp4-gemm", [record(CU131, "nvfp4-gemm", "pass", tier="wheel",
                                                metrics={"evidence_level": "built"})], judge=nvfp4)
    assert claimed.status is CellStatus.ADMITTED
    # A GPU run decides over the gate.
    ran = decide_cell("flashinfer-jit", [record(CU131, "flashinfer-jit", "pass", tier="gate",
                                                metrics={"evidence_level": "built"}),
                                         record(CU131, "flashinfer-jit", "pass")], judge=jit)
    assert ran.status is CellStatus.PASS


@pytest.mark.parametrize("said", ["fail", "skip"])   # the gate probe's word now; older records skipped
def test_an_image_that_cannot_jit_fails_every_feature_whose_code_path_jit_builds(said):
    cannot = record(CU128, "flashinfer-jit", said, tier="gate", probe="gate.flashinfer.jit",
                    reason="no nvcc in this flavour: FlashInfer would JIT", metrics={"jit_possible": False})
    records = [cannot, record(CU128, "pcie-allreduce", "pass", tier="wheel"),
               record(CU128, "nvfp4-gemm", "pass", tier="wheel"),
               record(CU131, "pcie-allreduce", "pass", tier="wheel"),
               record(CU131, "flashinfer-jit", "pass", tier="gate", metrics={"evidence_level": "built"})]
    report = build_matrix(records, Plan.from_json(plan_dict()), TARGET,
                          features=("flashinfer-jit", "pcie-allreduce", "nvfp4-gemm"))
    old = report.row(CU128)
    for feature in ("flashinfer-jit", "pcie-allreduce"):
        cell = old.cell(feature)
        assert (cell.status, cell.source, cell.tier) == (CellStatus.FAIL, CellSource.MEASURED, Tier.GATE), feature
        assert "no nvcc in this flavour" in cell.reason
        assert cell.decisive is not None and cell.decisive.outcome.status.value == "fail"
    assert "cannot JIT-compile the FlashInfer module" in old.cell("pcie-allreduce").reason
    assert "gate.flashinfer.jit" in old.cell("pcie-allreduce").reason
    # A feature whose code path builds no FlashInfer module keeps what the code admits.
    assert old.cell("nvfp4-gemm").status is CellStatus.ADMITTED
    # The stored record is unchanged; the other stack, which can JIT, is not touched.
    assert cannot.outcome.status.value == said
    assert report.row(CU131).cell("flashinfer-jit").status is CellStatus.BUILT
    assert report.row(CU131).cell("pcie-allreduce").status is CellStatus.ADMITTED


def test_upgrade_names_built_apart_and_never_calls_a_prediction_works():
    assert change_of(CellStatus.FAIL, CellStatus.BUILT) == ChangeKind.BUILT
    assert change_of(CellStatus.BUILT, CellStatus.FAIL) == ChangeKind.LOST
    records = [record(CU128, "flashinfer-jit", "fail", tier="gate"),
               record(CU131, "flashinfer-jit", "pass", tier="gate", metrics={"evidence_level": "built"})]
    report = build_upgrade(records, Plan.from_json(plan_dict()), TARGET, StackChoice(CU128), StackChoice(CU131))
    changes = {c.feature: c for c in report.features}
    assert changes["flashinfer-jit"].change == ChangeKind.BUILT
    assert "1 built (compiled and linked, needs a runtime probe)" in summary_line(report)
    seed = build_upgrade(seed_records(), Plan.from_json(plan_dict()), TARGET, StackChoice(CU128), StackChoice(CU131))
    hazard = next(c for c in seed.features if c.feature == "custom-allreduce")
    assert (hazard.change, hazard.after.status, hazard.label()) == (
        ChangeKind.UNCHANGED, "hazard", "＝ unchanged (predicted hazard)")


def test_a_change_on_evidence_of_different_strength_says_so():
    records = [record(CU128, "custom-allreduce", "fail", tier="wheel"), record(CU131, "custom-allreduce", "pass")]
    report = build_upgrade(records, Plan.from_json(plan_dict()), TARGET, StackChoice(CU128), StackChoice(CU131))
    change = next(c for c in report.features if c.feature == "custom-allreduce")
    assert change.change == ChangeKind.GAINED
    assert change.mixed_evidence == "evidence of different strength: from measured (wheel), to measured (runtime)"
    assert change.mixed_evidence in change.label()


def test_a_broken_feature_catalog_is_refused_with_its_line(tmp_path: Path):
    bad_tier = tmp_path / "knowledge.yaml"
    bad_tier.write_text("schema: 1\nfeatures:\n  x:\n    question: q\n    tiers: {wheel: proves}\n")
    with pytest.raises(SpecError, match="tier wheel must be one of decides, builds, admits"):
        load_feature_catalog(bad_tier)
    bad_need = tmp_path / "needs.yaml"
    bad_need.write_text("schema: 1\nfeatures:\n  x:\n    question: q\n    needs: [{any: [warp], why: w}]\n")
    with pytest.raises(SpecError, match="needs.any must list hardware from nvlink"):
        load_feature_catalog(bad_need)


def test_a_target_says_its_rdma_nic_and_nodes(tmp_path: Path):
    path = tmp_path / "targets.yaml"
    path.write_text("schema: 1\ntargets:\n  pair:\n    gpu: g\n    arch: '9.0'\n    gpu_count: 8\n"
                    "    interconnect: nvswitch\n    rdma: true\n    nodes: 2\n")
    pair = load_targets(path)["pair"]
    assert pair.hardware == {"nvlink", "rdma", "multi-gpu", "multi-node"}
    path.write_text(path.read_text().replace("nodes: 2", "nodes: 0"))
    with pytest.raises(SpecError, match="nodes must be a positive integer"):
        load_targets(path)


def test_a_benchmark_never_decides_a_capability_of_the_catalog():
    """bench.allreduce.symm-mem (two-shot, no multicast) files its records under torch-symm-mem; if only
    benches ran, that cell must not read pass on PCIe: a benchmark's numbers are metrics, not verdicts."""
    bench_pass = record(CU131, "torch-symm-mem", "pass", tier="bench", probe="bench.allreduce.symm-mem",
                        metrics={"busbw_gbps": 20.0})
    judge = CellJudge(CATALOG.spec("torch-symm-mem"))
    alone = decide_cell("torch-symm-mem", [bench_pass], judge=judge)
    assert alone.status is CellStatus.UNTESTED and alone.records == (bench_pass,)
    assert alone.reason == ("benchmark(s) bench.allreduce.symm-mem measured numbers only: a benchmark never decides "
                            "torch-symm-mem")
    runtime_fail = record(CU131, "torch-symm-mem", "fail", reason="rendezvous refused")
    assert decide_cell("torch-symm-mem", [bench_pass, runtime_fail], judge=judge).status is CellStatus.FAIL
    # A feature only benchmarks speak for (serving throughput) is theirs to decide.
    serve = record(CU131, "serve", "pass", tier="bench", probe="serve-bench")
    assert decide_cell("serve", [serve], judge=CellJudge(CATALOG.spec("serve"))).status is CellStatus.PASS


def test_a_broken_host_is_not_a_broken_stack():
    """When the P2P probe fails on the host in a run (IOMMU/ACS on a PCIe board), the collectives' failures of
    that run are undecided with the P2P evidence; a failure of another run, or a feature that does not rest
    on P2P, still decides."""
    p2p = record(CU131, "p2p-access", "fail", probe="runtime.cuda.p2p-matrix", run_id="r1",
                 reason="the driver admits peer access but 2 of 56 copies failed (0->3: hang)")
    hung = record(CU131, "nccl-graph-ring", "timeout", probe="runtime.nccl.graph-ring", run_id="r1",
                  reason="killed at its 900 s timeout")
    other_run = record(CU131, "custom-allreduce", "fail", probe="runtime.sglang.custom-allreduce", run_id="r2",
                       reason="wrong sum")
    jit = record(CU131, "flashinfer-jit", "fail", probe="runtime.flashinfer.jit", run_id="r1", reason="nvcc error")
    report = build_matrix([p2p, hung, other_run, jit], Plan.from_json(plan_dict()), TARGET,
                          features=("p2p-access", "nccl-graph-ring", "custom-allreduce", "flashinfer-jit"))
    row = report.row(CU131)
    ring = row.cell("nccl-graph-ring")
    assert ring.status is CellStatus.UNDECIDED and not ring.dead
    assert ring.reason.startswith("undecided by runtime.nccl.graph-ring: p2p-access fails on this host in the same "
                                  "run (runtime.cuda.p2p-matrix: the driver admits peer access but 2 of 56 copies")
    assert "this timeout is the host's, not a verdict on the stack: killed at its 900 s timeout" in ring.reason
    assert row.cell("p2p-access").status is CellStatus.FAIL
    assert row.cell("custom-allreduce").status is CellStatus.FAIL          # another run: P2P was not seen failing
    assert row.cell("flashinfer-jit").status is CellStatus.FAIL            # one GPU: does not rest on P2P
    assert hung.outcome.status.value == "timeout"                          # the stored record is unchanged
