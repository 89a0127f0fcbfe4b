"""pick: the best image by evidence, the driver check, gate-only flags, and "nothing qualifies"."""

from __future__ import annotations

import dataclasses

import pytest
from matrix_fixtures import (
    CU128,
    CU130,
    CU131,
    DIGESTS,
    TARGET,
    plan_dict,
    record,
    seed_records,
    serve_metrics,
)

from stackforge.core.errors import NothingQualifiesError, SpecError
from stackforge.plan.planner import Plan
from stackforge.report.pick import EXIT_GATE_ONLY, EXIT_PICKED, evaluate_candidates, pick, pick_to_json


@pytest.fixture
def plan():
    return Plan.from_json(plan_dict())


def test_measured_pass_new_enough_driver_best_throughput(plan):
    chosen = pick(seed_records(), plan, TARGET, ["flashinfer-ar-fusion"], driver="595.10").picked()
    assert chosen.candidate.stack_id == CU131
    assert chosen.reference == DIGESTS[CU131] and chosen.candidate.pinned
    assert chosen.exit_code == EXIT_PICKED and chosen.warnings() == ()
    why = chosen.why()
    assert "best output_throughput: 112 tok/s" in why[0]
    assert any("flashinfer-ar-fusion: pass (runtime probe" in line and "max abs diff 0.0" in line for line in why)
    assert any("driver 595.10 meets >= 590.44.01" in line for line in why)


def test_a_plan_read_from_its_json_is_picked_from():
    plan = Plan.from_json(plan_dict(), path="plan.json")
    chosen = pick(seed_records(), plan, TARGET, ["flashinfer-ar-fusion"], driver="595.10").picked()
    assert chosen.candidate.stack_id == CU131


def test_old_driver_falls_back_to_gate_only_evidence(plan):
    # torch-kernels is a question the gate tier decides (the arch list names sm_120): a gate pass is a pass.
    arch_list = record(CU130, "torch-kernels", "pass", tier="gate", reason="torch arch list has sm_120")
    chosen = pick([*seed_records(), arch_list], plan, TARGET, ["torch-kernels"], driver="585.1").picked()
    assert chosen.candidate.stack_id == CU130
    assert chosen.exit_code == EXIT_GATE_ONLY == 5
    # A bare digest is completed with the image's repository: repo@sha256:...
    assert chosen.reference == f"stackforge/{CU130}@{DIGESTS[CU130]}"
    assert any("gate evidence only" in w for w in chosen.warnings())
    assert any("pass on gate evidence only" in line for line in chosen.why())


def test_an_admitted_feature_is_never_taken_as_working(plan):
    # The gate of flashinfer-ar-fusion compiles nothing that runs: its pass only shows the code admits sm_120,
    # so on the driver that rules out the runtime-measured stack nothing qualifies, and pick says why.
    with pytest.raises(NothingQualifiesError) as info:
        pick(seed_records(), plan, TARGET, ["flashinfer-ar-fusion"], driver="585.1").picked()
    assert info.value.exit_code == 4
    cu130 = next(c for c in evaluate_candidates(seed_records(), plan, TARGET, ["flashinfer-ar-fusion"], "585.1")
                 if c.stack_id == CU130)
    blocker, = cu130.blockers
    assert blocker.line.startswith("flashinfer-ar-fusion: admitted by the code only, not measured working (gate probe")
    assert blocker.unmeasured      # what it waits for is a probe that decides, like an untested cell


def test_driver_strings_compare_as_versions(plan):
    # "580.9" < "580.65.06" as versions, although "9" > "6" as text.
    with pytest.raises(NothingQualifiesError):
        pick(seed_records(), plan, TARGET, ["flashinfer-ar-fusion"], driver="580.9").picked()
    with pytest.raises(SpecError, match="not a version"):
        pick(seed_records(), plan, TARGET, [], driver="latest").picked()


def test_nothing_qualifies_names_the_closest_and_its_blockers(plan):
    with pytest.raises(NothingQualifiesError) as info:
        pick(seed_records(), plan, TARGET, ["torch-symm-mem", "flashinfer-jit"], driver="595.10").picked()
    error = info.value
    assert error.exit_code == 4
    text = error.one_line()
    assert f"Closest: {CU131}" in text and "1 blocker: [1] torch-symm-mem: fail (runtime probe" in text
    assert "SymmetricMemory is not supported on this device" in text
    assert "stackforge deadends" in error.remedy
    closest = error.shortfall[0]
    assert closest.stack_id == CU131 and [c.name for c in closest.blockers] == ["torch-symm-mem"]


def test_pruned_predicted_and_untested_are_blockers(plan):
    by_id = {c.stack_id: c for c in evaluate_candidates(seed_records(), plan, TARGET, ["torch-symm-mem", "serve"])}
    pruned = by_id["cu128-torch2.14.1-fi0.6.3-sgl0.5.9-py312"]
    assert any(c.name == "plan" and "pruned" in c.line for c in pruned.blockers)
    assert any(c.name == "image" for c in pruned.blockers)                   # never probed
    cu130 = {c.name: c.line for c in by_id[CU130].blockers}
    assert cu130["torch-symm-mem"].startswith("torch-symm-mem: predicted unavailable by rule torch-symm-mem-sm120")
    assert cu130["serve"] == "serve: no evidence (never probed, no rule)"


def test_ties_go_to_the_newer_stack_and_optimize_newest():
    records = [record(CU128, "serve", "pass", tier="bench", metrics=serve_metrics(100.0)),
               record(CU131, "serve", "pass", tier="bench", metrics=serve_metrics(100.0))]
    assert pick(records, Plan.empty(), TARGET, ["serve"]).picked().candidate.stack_id == CU131
    faster_old = [records[0], dataclasses.replace(records[1], outcome=dataclasses.replace(
        records[1].outcome, metrics=serve_metrics(50.0)))]
    assert pick(faster_old, Plan.empty(), TARGET, ["serve"]).picked().candidate.stack_id == CU128
    assert pick(faster_old, Plan.empty(), TARGET, ["serve"], optimize="newest").picked().candidate.stack_id == CU131


def test_serving_throughput_outranks_bandwidth_then_gemm():
    records = [record(CU128, "allreduce", "pass", tier="bench", metrics={"busbw_gbps": {"median": 40.0}}),
               record(CU131, "gemm", "pass", tier="bench", metrics={"tflops": 900.0}),
               record(CU130, "serve", "pass", tier="bench", metrics=serve_metrics(10.0))]
    chosen = pick(records, Plan.empty(), TARGET).picked()
    assert (chosen.candidate.stack_id, chosen.candidate.metric.name) == (CU130, "output_throughput")
    chosen = pick(records[:2], Plan.empty(), TARGET).picked()
    assert (chosen.candidate.stack_id, chosen.candidate.metric.name) == (CU128, "busbw")


def test_metrics_as_the_bench_scripts_write_them():
    """allreduce_sweep.py: peak_busbw_gbps beside sizes and efficiencies; gemm.py: best_tflops by dtype."""
    allreduce = {"collective": "allreduce", "peak_busbw_gbps": 41.5, "peak_busbw_size_bytes": 1 << 30,
                 "avg_busbw_gbps": 30.0, "peak_busbw_efficiency": 0.66, "rows": [{"size_bytes": 8, "time_us": 9.0}]}
    gemm = {"device": "cuda", "best_tflops": {"bf16": 380.0, "fp8": 700.0}, "rows": [{"tflops": 1.0}]}
    records = [record(CU128, "allreduce", "pass", tier="bench", metrics=allreduce),
               record(CU131, "gemm", "pass", tier="bench", metrics=gemm)]
    chosen = pick(records, Plan.empty(), TARGET).picked()
    assert (chosen.candidate.stack_id, chosen.candidate.metric.value, chosen.candidate.metric.unit) == (
        CU128, 41.5, "GB/s")
    gemm_only = pick(records[1:], Plan.empty(), TARGET).picked().candidate.metric
    assert (gemm_only.name, gemm_only.value, gemm_only.unit) == ("tflops", 700.0, "TFLOP/s")
    serve = record(CU130, "serve", "pass", tier="bench", metrics={"output_tok_s": 95.0, "ttft_ms": {"median": 80}})
    assert pick([*records, serve], Plan.empty(), TARGET).picked().candidate.stack_id == CU130


def test_unpinned_images_and_mixed_images_warn():
    records = [record(CU128, "serve", "pass", tier="bench", digest="", created_at="2026-03-01T00:00:00+00:00"),
               record(CU128, "flashinfer-jit", "pass", digest="", image="stackforge/other:1",
                      created_at="2026-03-02T00:00:00+00:00")]
    chosen = pick(records, Plan.empty(), TARGET, ["serve", "flashinfer-jit"]).picked()
    assert chosen.reference == f"sha256:{'1' * 64}" and not chosen.candidate.pinned
    warnings = " ".join(chosen.warnings())
    assert "not pinned by digest" in warnings
    assert "2 different images" not in warnings                                   # same image id both times
    other = dataclasses.replace(records[1], provenance=dataclasses.replace(records[1].provenance, image_id="sha256:2"))
    chosen = pick([records[0], other], Plan.empty(), TARGET, ["serve", "flashinfer-jit"]).picked()
    warnings = " ".join(chosen.warnings())
    assert "2 different images" in warnings


def test_an_undecided_record_is_never_evidence_for_an_image():
    passed = record(CU131, "serve", "pass", tier="bench", metrics=serve_metrics(100.0),
                    created_at="2026-03-01T00:00:00+00:00")
    undecided = record(CU131, "serve", "undecided", tier="gate", probe="gate.x", reason="needs a running server",
                       image="stackforge/elsewhere:9", digest="sha256:" + "e" * 64,
                       created_at="2026-03-09T00:00:00+00:00")                 # newer, another image
    chosen = pick([passed, undecided], Plan.empty(), TARGET, ["serve"]).picked()
    assert chosen.reference == DIGESTS[CU131] and "different images" not in " ".join(chosen.warnings())
    # Only undecided records: the feature has no verdict (not ruled out) and there is no image to offer.
    only = record(CU130, "serve", "undecided", tier="gate", probe="gate.x", reason="needs a running server")
    with pytest.raises(NothingQualifiesError):
        pick([only], Plan.empty(), TARGET, ["serve"]).picked()
    candidate = evaluate_candidates([only], Plan.empty(), TARGET, ["serve"])[0]
    checks = {c.name: c for c in candidate.blockers}
    assert checks["serve"].line == "serve: no verdict, undecided by gate.x: needs a running server"
    assert checks["serve"].unmeasured
    assert checks["image"].line.startswith("no image: every probe of this stack on this target was undecided")


def test_unknown_feature_and_optimize_are_spec_errors(plan):
    with pytest.raises(SpecError, match="unknown feature.*flashinfer-ar-fushion"):
        pick(seed_records(), plan, TARGET, ["flashinfer-ar-fushion"]).picked()
    with pytest.raises(SpecError, match="optimize"):
        pick(seed_records(), plan, TARGET, [], optimize="cheapest").picked()


def test_a_feature_only_a_probe_decides_is_accepted_before_any_record_measures_it(plan):
    """p2p-access has no rule and no record here, yet `list features` and `matrix --feature` know it."""
    assert all(r.feature != "p2p-access" for r in seed_records())
    candidates = evaluate_candidates(seed_records(), plan, TARGET, ["p2p-access"])
    assert candidates and all(not c.qualifies for c in candidates)
    with pytest.raises(NothingQualifiesError):
        pick(seed_records(), plan, TARGET, ["p2p-access"]).picked()
    with pytest.raises(SpecError, match="unknown feature.*p2p-acess; known: .*p2p-access"):
        pick(seed_records(), plan, TARGET, ["p2p-acess"]).picked()


def test_requires_driver_rules_are_honoured():
    data = plan_dict()
    cell = next(c for c in data["cells"] if c["stack_id"] == CU131)
    cell["findings"].append({"rule": "cuda131-driver", "effect": "requires", "feature": None, "reason": "r",
                             "requires": {"driver": ">=600"}, "sources": []})
    with pytest.raises(NothingQualifiesError, match="driver 595.10 is too old"):
        pick([r for r in seed_records() if r.stack_id == CU131], Plan.from_json(data), TARGET,
             ["flashinfer-jit"], driver="595.10").picked()


def test_pick_json(plan):
    candidates = evaluate_candidates(seed_records(), plan, TARGET, ["flashinfer-ar-fusion"], "595.10")
    chosen = pick(seed_records(), plan, TARGET, ["flashinfer-ar-fusion"], driver="595.10").picked()
    data = pick_to_json(chosen, candidates, TARGET, ["flashinfer-ar-fusion"], "595.10")
    assert (data["status"], data["exit_code"], data["image"]) == ("picked", 0, DIGESTS[CU131])
    assert data["candidates"][0]["stack_id"] == CU131 and data["candidates"][0]["qualifies"]
    failed = pick_to_json(None, candidates, TARGET, ["x"], None)
    assert failed["status"] == "nothing-qualifies" and failed["exit_code"] == 4


def test_the_driver_floor_is_the_plan_cells_not_recomputed_from_derived():
    """`plan` wrote the floor (derived.min_driver is one of its parts, not the floor itself)."""
    data = plan_dict()
    cell = next(c for c in data["cells"] if c["stack_id"] == CU131)
    cell["derived"]["min_driver"] = "1"
    cell["driver_floor"] = {"version": "600", "because": ["CUDA 13.x: driver >= 600 [>= 600]"]}
    with pytest.raises(NothingQualifiesError, match="driver 595.10 is too old: this stack needs >= 600"):
        pick([r for r in seed_records() if r.stack_id == CU131], Plan.from_json(data), TARGET,
             ["flashinfer-jit"], driver="595.10").picked()
