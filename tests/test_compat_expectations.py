"""What the shipped compat data predicts for the stacks that matter, judged by stackforge's engine.

The two default-matrix stacks (matrices/default.yaml) must survive on the default target
(8x RTX PRO 6000, sm_120, PCIe, no multicast) with exactly the dead ends the rules in compat/ name,
and a few known-bad stacks must be pruned by the rule that explains why. The expectations are a table:
changing a rule that moves one of these predictions must change this table on purpose.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from stackforge.core.model import Flavour, Stack
from stackforge.plan.planner import evaluate_cell, load_knowledge

COMPAT_DIR = Path(__file__).resolve().parents[1] / "compat"

STACKS: dict[str, dict[str, object]] = {
    # (A) the CUDA 12.8 stack of matrices/default.yaml: torch 2.9.1 cu128, FlashInfer 0.6.3, SGLang 0.5.9 (sgl-kernel 0.3.21).
    "A": dict(cuda="12.8", torch="2.9.1", flashinfer="0.6.3", sglang="0.5.9", python="3.12",
              flavour=Flavour.DEVEL, os="ubuntu24.04"),
    # (B) the CUDA 13.1 upgrade: torch 2.14.1 cu130, FlashInfer 0.7.2, SGLang 0.5.23 (sglang-kernel 0.4.10), wheels.
    "B": dict(cuda="13.1", torch="2.14.1", flashinfer="0.7.2", sglang="0.5.23", python="3.11",
              flavour=Flavour.WHEELS, os="debian12"),
    # torch 2.7.1 pins NCCL 2.26.2 (compat/tables.yaml torch_nccl), SGLang 0.4.8 pins torch 2.7.1.
    "torch27": dict(cuda="12.8", torch="2.7.1", flashinfer="0.2.6.post1", sglang="0.4.8", python="3.12",
                    flavour=Flavour.DEVEL, os="ubuntu24.04"),
    # Known-bad stacks.
    "cu126": dict(cuda="12.6", torch="2.9.1", flashinfer="0.6.3", sglang="0.5.9", python="3.12",
                  flavour=Flavour.DEVEL, os="ubuntu24.04"),
    # SGLang 0.5.10.post1 pins sglang-kernel 0.4.1 (a CUDA 12 build), here on a CUDA 13 torch.
    "kernel-cuda12-on-13.1": dict(cuda="13.1", torch="2.9.1", flashinfer="0.6.7.post3", sglang="0.5.10.post1",
                                  python="3.12", flavour=Flavour.DEVEL, os="ubuntu24.04"),
    "torch212-on-12.8": dict(cuda="12.8", torch="2.12.0", flashinfer="0.6.3", sglang="0.5.9", python="3.12",
                             flavour=Flavour.DEVEL, os="ubuntu24.04"),
    "sglang0.5.23-on-12.8": dict(cuda="12.8", torch="2.14.1", flashinfer="0.7.2", sglang="0.5.23", python="3.12",
                                 flavour=Flavour.DEVEL, os="ubuntu24.04"),
}

RTX_PCIE = "rtx-pro-6000-x8-pcie"

# (stack, target, feature, expected verdict, rule the prediction must come from or "" for any)
PREDICTIONS = [
    # A on 8x RTX PRO 6000 over PCIe: fusion, custom all-reduce, symmetric memory and the NCCL tree, and more.
    ("A", RTX_PCIE, "flashinfer-ar-fusion", "unavailable", "flashinfer-ar-fusion-sm12-gate"),
    ("A", RTX_PCIE, "custom-allreduce", "unavailable", "sglang-custom-ar-pcie-gt2"),
    ("A", RTX_PCIE, "torch-symm-mem", "unavailable", ""),
    ("A", RTX_PCIE, "nccl-graph-tree", "hazard", "nccl-global-algo-tree"),
    ("A", RTX_PCIE, "nccl-global-tree", "unavailable", "nccl-global-algo-tree-no-allgather"),
    ("A", RTX_PCIE, "nccl-nvls", "unavailable", "nccl-nvls-needs-multicast"),
    ("A", RTX_PCIE, "trtllm-gen-fmha", "unavailable", ""),
    ("A", RTX_PCIE, "nvfp4-gemm", "unavailable", "flashinfer-nvfp4-mm-fp4-sm120"),
    ("A", RTX_PCIE, "flashinfer-jit", "no-rule", ""),     # FI 0.6.3 auto-detects compute_120a with CUDA 12.8
    ("A", RTX_PCIE, "torch-kernels", "no-rule", ""),      # cu128 has sm_120 SASS
    ("A", RTX_PCIE, "kernel-arch-coverage", "no-rule", ""),
    # B on 8x RTX PRO 6000 over PCIe: FlashInfer 0.7.2 admits SM12x, but SGLang >= 0.5.14 rejects it itself.
    ("B", RTX_PCIE, "flashinfer-ar-fusion", "unavailable", "sglang-ar-fusion-rejects-sm12"),
    ("B", RTX_PCIE, "custom-allreduce", "unavailable", "sglang-custom-ar-pcie-gt2"),
    ("B", RTX_PCIE, "torch-symm-mem", "unavailable", ""),
    ("B", RTX_PCIE, "nccl-graph-tree", "hazard", "nccl-global-algo-tree"),
    ("B", RTX_PCIE, "nccl-global-tree", "unavailable", "nccl-global-algo-tree-no-allgather"),
    ("B", RTX_PCIE, "nccl-nvls", "unavailable", "nccl-nvls-needs-multicast"),
    ("B", RTX_PCIE, "flashinfer-jit", "no-rule", ""),   # measured by the gate probe (a real JIT compile)
    ("B", RTX_PCIE, "nvfp4-gemm", "no-rule", ""),
    ("B", RTX_PCIE, "torch-kernels", "no-rule", ""),
    # The same stacks on other hardware: the SM120/PCIe dead ends must not leak onto Hopper + NVSwitch.
    ("B", "h200-x8-nvswitch", "flashinfer-ar-fusion", "no-rule", ""),
    ("B", "h200-x8-nvswitch", "custom-allreduce", "no-rule", ""),
    ("B", "h200-x8-nvswitch", "torch-symm-mem", "no-rule", ""),
    ("B", "h200-x8-nvswitch", "nccl-nvls", "no-rule", ""),
    # The lamport packing bug PR #3903 fixed lives in trtllm_custom_all_reduce, not in the fusion SGLang calls.
    ("A", "h200-x8-nvswitch", "flashinfer-ar-fusion", "no-rule", ""),
    ("A", "rtx-pro-6000-x2-pcie", "custom-allreduce", "hazard", "pcie-sm12-p2p-hang"),
    # The NCCL torch pins decides: 2.26.2 (torch 2.7.x) crashes from 512 KiB on SM120; 2.27.5 (torch 2.9.1) is not ruled out.
    ("torch27", RTX_PCIE, "nccl-graph-ring", "unavailable", "nccl-2262-sm12-illegal-memory-access"),
    ("A", RTX_PCIE, "nccl-graph-ring", "no-rule", ""),
    ("torch27", "h200-x8-nvswitch", "nccl-graph-ring", "no-rule", ""),
]

# (stack, target, rules that must fire, rules that must not fire)
FIRED = [
    # All of a feature's reasons are kept, not only the one the prediction shows.
    ("A", RTX_PCIE, {"sglang-torch-symm-mem-keyerror-sm12", "torch-symm-mem-needs-multicast",
                  "driver-blackwell-570"},
     {"sglang-torch-symm-mem-disabled-sm12", "flashinfer-sm120-needs-cuda129-nvcc"}),
    ("B", RTX_PCIE, {"sglang-torch-symm-mem-disabled-sm12", "torch-symm-mem-needs-multicast",
                  "driver-blackwell-570"},
     {"flashinfer-ar-fusion-sm12-gate", "sglang-torch-symm-mem-keyerror-sm12", "sglang-cuda13-stack"}),
]

# (stack, target, pruned?, rules among the pruning ones)
PRUNING = [
    ("A", RTX_PCIE, False, set()),
    ("B", RTX_PCIE, False, set()),
    ("A", "h200-x8-nvswitch", False, set()),
    ("B", "b200-x8", False, set()),
    ("cu126", RTX_PCIE, True, {"cuda-min-toolkit-sm100-sm120", "torch-cu12-pre128-no-blackwell"}),
    ("torch212-on-12.8", RTX_PCIE, True, {"torch-no-cu128-from-212"}),
    ("kernel-cuda12-on-13.1", RTX_PCIE, True, {"sglang-kernel-cuda12-build"}),
    ("sglang0.5.23-on-12.8", RTX_PCIE, True, {"sglang-cuda13-stack", "torch-no-cu128-from-212"}),
]


@pytest.fixture(scope="module")
def knowledge():
    return load_knowledge(COMPAT_DIR)


def _cell(knowledge, stack: str, target: str):
    return evaluate_cell(Stack(**STACKS[stack]), knowledge.targets[target], knowledge)


@pytest.mark.parametrize(("stack", "target", "feature", "verdict", "rule"), PREDICTIONS,
                         ids=[f"{s}-{t}-{f}" for s, t, f, _, _ in PREDICTIONS])
def test_prediction(knowledge, stack, target, feature, verdict, rule):
    predictions = {p.feature: p for p in _cell(knowledge, stack, target).predictions}
    prediction = predictions[feature]
    assert prediction.verdict.value == verdict, f"{feature}: {prediction.verdict.value} by {prediction.rule!r}"
    if rule:
        assert prediction.rule == rule
    if verdict != "no-rule":
        assert prediction.reason and prediction.sources, "a prediction always carries its reason and sources"


@pytest.mark.parametrize(("stack", "target", "must", "must_not"), FIRED, ids=[f"{s}-{t}" for s, t, _, _ in FIRED])
def test_fired_rules(knowledge, stack, target, must, must_not):
    fired = {f.rule.id for f in _cell(knowledge, stack, target).findings}
    assert must <= fired, f"missing: {sorted(must - fired)}"
    assert not (must_not & fired), f"unexpected: {sorted(must_not & fired)}"


@pytest.mark.parametrize(("stack", "target", "pruned", "because"), PRUNING, ids=[f"{s}-{t}" for s, t, _, _ in PRUNING])
def test_pruning(knowledge, stack, target, pruned, because):
    cell = _cell(knowledge, stack, target)
    pruning = {f.rule.id for f in cell.findings if f.rule.effect.value == "incompatible"}
    assert cell.pruned is pruned, f"pruned by {sorted(pruning)}"
    assert because <= pruning, f"missing: {sorted(because - pruning)}"


def test_default_matrix_keeps_both_stacks(knowledge):
    """Both families of matrices/default.yaml survive the rules on the default target."""
    kept = {ident for ident in ("A", "B") if not _cell(knowledge, ident, RTX_PCIE).pruned}
    assert kept == {"A", "B"}
