"""Records and a plan, built in code, for the results / matrix / dead ends / pick / diff tests.

The "seed" campaign: 8x RTX PRO 6000 (sm_120) on PCIe, three kept stacks from CUDA 12.8 to 13.1 and
one pruned stack. Records are real :class:`ResultRecord` objects with varied statuses
and tiers; the plan dict has the shape of ``stackforge plan --json``.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

from stackforge.core.records import Outcome, Prediction, Provenance, ResultRecord, Status, Tier, Verdict
from stackforge.plan.derive import cell_driver_floor

TARGET = "rtx-pro-6000-x8-pcie"
CU128 = "cu128-torch2.9.1-fi0.6.3-sgl0.5.9-py312"
CU130 = "cu130-torch2.11.0-fi0.6.14-sgl0.5.12-py312"
CU131 = "cu131-torch2.14.1-fi0.7.2-sgl0.5.23-py312"
PRUNED = "cu128-torch2.14.1-fi0.6.3-sgl0.5.9-py312"
FEATURES = ("flashinfer-jit", "flashinfer-ar-fusion", "custom-allreduce", "torch-symm-mem", "nccl-graph-tree",
            "serve")

STACKS: dict[str, dict[str, Any]] = {
    CU128: {"cuda": "12.8", "torch": "2.9.1", "flashinfer": "0.6.3", "sglang": "0.5.9", "python": "3.12",
            "flavour": "devel", "os": "ubuntu24.04", "flashinfer_addons": [], "torch_variant": None, "kernel": None},
    CU130: {"cuda": "13.0", "torch": "2.11.0", "flashinfer": "0.6.14", "sglang": "0.5.12", "python": "3.12",
            "flavour": "devel", "os": "ubuntu24.04", "flashinfer_addons": [], "torch_variant": None, "kernel": None},
    CU131: {"cuda": "13.1", "torch": "2.14.1", "flashinfer": "0.7.2", "sglang": "0.5.23", "python": "3.12",
            "flavour": "devel", "os": "ubuntu24.04", "flashinfer_addons": [], "torch_variant": None, "kernel": None},
    PRUNED: {"cuda": "12.8", "torch": "2.14.1", "flashinfer": "0.6.3", "sglang": "0.5.9", "python": "3.12",
             "flavour": "devel", "os": "ubuntu24.04", "flashinfer_addons": [], "torch_variant": None, "kernel": None},
}
MIN_DRIVER = {CU128: "570.26", CU130: "580.65.06", CU131: "590.44.01", PRUNED: "570.26"}
DIGESTS = {CU131: "ghcr.io/acme/stackforge@sha256:" + "c" * 64, CU130: "sha256:" + "b" * 64}

SOURCE = {"ref": "flashinfer-ai/flashinfer PR #3633", "url": "https://github.com/flashinfer-ai/flashinfer/pull/3633",
          "confidence": "verified"}
RULES = {
    "fi-arfusion-sm120": Prediction(
        feature="flashinfer-ar-fusion", verdict=Verdict.UNAVAILABLE, rule="fi-arfusion-sm120",
        reason="FlashInfer's allreduce-fusion JIT has no SM120 target before 0.6.x",
        error="No supported CUDA architectures found for major versions [12]", remedy="use FlashInfer >= 0.6.14",
        sources=(SOURCE,)),
    "torch-symm-mem-sm120": Prediction(
        feature="torch-symm-mem", verdict=Verdict.UNAVAILABLE, rule="torch-symm-mem-sm120",
        reason="torch symmetric memory's arch table has no SM120", error="SymmetricMemory: arch not supported",
        sources=({"ref": "pytorch/pytorch symm_mem arch table", "confidence": "secondary"},)),
    "custom-ar-pcie": Prediction(
        feature="custom-allreduce", verdict=Verdict.HAZARD, rule="custom-ar-pcie",
        reason="custom allreduce over >2 PCIe GPUs contends for the bus (38 tok/s vs 82 for NCCL)",
        sources=({"ref": "vllm-project/vllm #13719", "confidence": "secondary"},)),
}
PREDICTED = {
    CU128: {"flashinfer-ar-fusion": "fi-arfusion-sm120", "torch-symm-mem": "torch-symm-mem-sm120",
            "custom-allreduce": "custom-ar-pcie"},
    CU130: {"flashinfer-ar-fusion": "fi-arfusion-sm120", "torch-symm-mem": "torch-symm-mem-sm120",
            "custom-allreduce": "custom-ar-pcie"},
    CU131: {"custom-allreduce": "custom-ar-pcie"},
}
PRUNE_FINDING = {"rule": "torch-no-cu128-from-212", "effect": "incompatible", "feature": None,
                 "reason": "torch 2.12 dropped the cu128 variant; there is no torch 2.14.1+cu128 wheel",
                 "error": "", "remedy": "use CUDA 13.x with torch 2.14.1",
                 "sources": [{"ref": "pytorch/test-infra generate_binary_build_matrix.py", "confidence": "verified",
                              "url": "https://github.com/pytorch/test-infra"}]}


def plan_dict() -> dict[str, Any]:
    """A plan in the shape of ``stackforge plan --json`` (one target, 3 kept stacks, 1 pruned)."""
    cells = []
    for stack_id in (CU128, PRUNED, CU130, CU131):     # deliberately not in version order
        pruned = stack_id == PRUNED
        predictions = [] if pruned else [_prediction(stack_id, f) for f in FEATURES if f != "serve"]
        findings = [PRUNE_FINDING] if pruned else [_finding(RULES[r]) for r in PREDICTED[stack_id].values()]
        cells.append({"stack_id": stack_id, "stack": STACKS[stack_id], "target": TARGET,
                      "status": "pruned" if pruned else "kept",
                      "derived": _derived(stack_id),
                      "driver_floor": cell_driver_floor(MIN_DRIVER[stack_id], "", TARGET, "570.26", ()).to_json(),
                      "findings": findings, "predictions": predictions})
    return {"schema": "stackforge.plan", "schema_version": 1,
            "matrix": {"name": "seed", "source": "matrices/seed.yaml"},
            "targets": {TARGET: {"name": TARGET, "gpu": "NVIDIA RTX PRO 6000 Blackwell", "arch": "12.0",
                                 "gpu_count": 8, "interconnect": "pcie", "multicast": False,
                                 "min_driver": "570.26", "description": "the seed's box"}},
            "cells": cells}


def _derived(stack_id: str) -> dict[str, Any]:
    """The derived facts of a seed stack, as ``Derived.to_json`` writes them (the reports read
    only ``min_driver`` and ``torch_variant``)."""
    stack = STACKS[stack_id]
    return {"torch_variant": "cu128", "torch_cuda": "12.8", "torch_index_url": None,
            "torch_requirement": f"torch=={stack['torch']}", "kernel_package": None, "kernel_version": None,
            "flashinfer_extra": None, "cuda_image_version": f"{stack['cuda']}.0",
            "base_image": f"nvidia/cuda:{stack['cuda']}.0-devel-ubuntu24.04", "base_python": "3.12",
            "toolkit_wheels": {}, "has_nvcc": True, "min_driver": MIN_DRIVER[stack_id],
            "min_driver_reason": "",
            "toolkit_driver": None, "expected_arch_list": [], "sglang_pins": {}}


def _prediction(stack_id: str, feature: str) -> dict[str, Any]:
    rule = PREDICTED[stack_id].get(feature)
    if rule is None:
        return Prediction(feature=feature, verdict=Verdict.NO_RULE).to_json()
    return RULES[rule].to_json()


def _finding(prediction: Prediction) -> dict[str, Any]:
    effect = {"unavailable": "feature_unavailable", "hazard": "hazard"}[prediction.verdict.value]
    return {"rule": prediction.rule, "effect": effect, "feature": prediction.feature, "reason": prediction.reason,
            "error": prediction.error, "remedy": prediction.remedy, "sources": [dict(s) for s in prediction.sources]}


def record(stack_id: str, feature: str, status: Status | str, *, tier: Tier | str = Tier.RUNTIME,
           probe: str | None = None, reason: str = "", evidence: str = "", metrics: dict[str, Any] | None = None,
           run_id: str = "20260301T020000Z-aaaaaa", created_at: str = "2026-03-01T02:00:00+00:00",
           target: str = TARGET, kind: str | None = None, digest: str | None = None,
           image: str | None = None) -> ResultRecord:
    """A real ResultRecord with provenance (image, digest, driver) filled in like a probe run would."""
    tier = Tier(tier)
    status = Status(status)
    return ResultRecord(
        run_id=run_id, stack_id=stack_id, stack=STACKS.get(stack_id, {"cuda": "12.8"}), target=target,
        probe=probe or f"{feature}-{tier.value}", feature=feature, tier=tier,
        outcome=Outcome(status=status, reason=reason or f"{feature} {status.value}",
                        evidence=evidence or f"evidence for {feature} on {stack_id}: {status.value}",
                        metrics=metrics or {}, duration_s=1.5),
        provenance=Provenance(image=image or f"stackforge/{stack_id}:abc123", image_id=f"sha256:{'1' * 64}",
                              digest=digest if digest is not None else DIGESTS.get(stack_id),
                              versions={"torch": STACKS.get(stack_id, {}).get("torch", "")},
                              torch_arch_list=["sm_90", "sm_100", "sm_120"], driver="595.10",
                              gpus=["NVIDIA RTX PRO 6000 Blackwell"] * 8, host="gpu-box-1"),
        kind=kind or ("bench" if tier is Tier.BENCH else "probe"), created_at=created_at)


def serve_metrics(median: float, spread: float = 1.2) -> dict[str, Any]:
    """A serving benchmark summary the way the bench scripts write it (median, min, max, cv, n)."""
    return {"output_throughput": {"n": 5, "median": median, "minimum": median - spread / 2,
                                  "maximum": median + spread / 2, "mean": median, "stdev": spread / 4,
                                  "cv": spread / 4 / median}}


def seed_records() -> list[ResultRecord]:
    """The seed's campaign as records: dead ends on CUDA 12.8, gate-only evidence on 13.0, 13.1 works."""
    return [
        # CUDA 12.8: the dead-end inventory.
        record(CU128, "flashinfer-jit", "fail", tier="gate", reason="nvcc 12.8 cannot JIT for sm_120",
               evidence="RuntimeError: No supported CUDA architectures found for major versions [12]"),
        record(CU128, "flashinfer-jit", "fail", reason="JIT compile failed on the GPU",
               evidence="RuntimeError: No supported CUDA architectures found for major versions [12]"),
        record(CU128, "flashinfer-ar-fusion", "fail", reason="JIT doesn't support SM120",
               evidence="flashinfer.comm: trtllm_allreduce_fusion: no kernel image for sm_120"),
        record(CU128, "custom-allreduce", "pass", reason="custom allreduce ran (slow: PCIe contention)",
               evidence="custom AR 8 ranks ok; 2.1x slower than NCCL ring"),
        record(CU128, "torch-symm-mem", "crash", reason="probe process died by SIGABRT",
               evidence="SymmetricMemory: arch sm_120 not supported\nAborted (core dumped)"),
        record(CU128, "nccl-graph-tree", "timeout", reason="killed at its 120 s timeout",
               evidence="NCCL INFO Channel 00/02 : 0 1 2 3 4 5 6 7 (hang during graph capture)"),
        record(CU128, "serve", "pass", tier="bench", probe="serve-bench", reason="served 5 rounds",
               metrics=serve_metrics(89.5)),
        # CUDA 13.0: only gate-tier evidence so far (CI without the GPU); runtime probes skipped.
        record(CU130, "flashinfer-jit", "pass", tier="gate", reason="JIT compiles compute_120f with nvcc 13.0",
               evidence="ninja: build stopped ok; sm_120 module built"),
        record(CU130, "flashinfer-jit", "skip", reason="no GPU on this host", evidence="nvidia-smi not found"),
        record(CU130, "flashinfer-ar-fusion", "pass", tier="gate", reason="allreduce fusion module compiles for sm_120",
               evidence="trtllm_allreduce_fusion: compiled for compute_120f"),
        record(CU130, "flashinfer-ar-fusion", "skip", reason="no GPU on this host", evidence="nvidia-smi not found"),
        # CUDA 13.1: the way out.
        record(CU131, "flashinfer-jit", "pass", reason="JIT compiled and ran on sm_120",
               evidence="rmsnorm max abs err 0.0"),
        record(CU131, "flashinfer-ar-fusion", "pass", reason="allreduce fusion matches NCCL on 8 ranks",
               evidence="max abs diff 0.0; 8 ranks"),
        record(CU131, "torch-symm-mem", "fail", reason="rendezvous refused: SM120 not in the arch table",
               evidence="RuntimeError: SymmetricMemory is not supported on this device (sm_120)"),
        record(CU131, "serve", "pass", tier="bench", probe="serve-bench", reason="served 5 rounds",
               metrics=serve_metrics(112.0)),
    ]


def seed_workspace(folder: Path) -> Path:
    """``folder`` with ``results/`` holding one finished run (``run-a``) of the seed records and the
    seed plan as ``plan.json``: what the matrix, deadends and pick commands read."""
    from stackforge.results.store import finish_run, start_run, write_record

    run_dir = start_run(folder / "results", command=["stackforge", "probe"], run_id="run-a")
    for rec in seed_records():
        write_record(run_dir, dataclasses.replace(rec, run_id="run-a"))
    finish_run(run_dir)
    (folder / "plan.json").write_text(json.dumps(plan_dict()))
    return folder
