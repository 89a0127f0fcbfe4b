"""Rule version bounds checked in the releases on both sides of them.

Each row names a rule, the fact its bound is on, the last release outside the bound and the first
release inside it, as read in the PyPI wheels of those releases (the rule's ``sources`` cite the file
and line). Moving a bound by one release makes one of these rows fail.
"""

from __future__ import annotations

import pytest

from stackforge.plan.rules import load_rules

# (rule id, fact, last release outside, first release inside, what the two wheels show)
BOUNDS = [
    ("sglang-ar-fusion-rejects-sm12", "sglang", "0.5.13.post1", "0.5.14",
     "flashinfer_comm_fusion.py: no _resolve_backend in 0.5.13.post1; :47-51 raises 'requires SM90 or SM10X' in 0.5.14"),
    ("sglang-torch-symm-mem-keyerror-sm12", "sglang", "0.5.14", "0.5.13.post1",
     "torch_symm_mem.py: 0.5.13.post1:85 indexes MAX_SIZES[capability]; 0.5.14:78 uses .get()"),
    ("sglang-torch-symm-mem-disabled-sm12", "sglang", "0.5.13.post1", "0.5.14",
     "torch_symm_mem.py: 0.5.14:78-87 .get() then 'Device capability %s not supported'"),
    ("sglang-cuda13-stack", "sglang", "0.5.10.post1", "0.5.11",
     "METADATA: 0.5.10.post1 torch==2.9.1, cuda-python==12.9; 0.5.11 torch==2.11.0, cuda-python>=13.0"),
    ("flashinfer-cuda128-dropped", "flashinfer", "0.6.17", "0.6.18",
     "METADATA:262 'Supported CUDA Versions': 0.6.17 '12.6, 12.8, 13.0, 13.1'; 0.6.18 '12.9, 13.0, and 13.4'"),
    # Found by `stackforge compat verify` in the wheels (each rule cites both files).
    ("sglang-python-min-311", "sglang", "0.5.21", "0.5.22", "METADATA:213 Requires-Python >=3.10 -> >=3.11"),
    ("sglang-python-min-310", "sglang", "0.5.22", "0.5.21", "0.5.22 is sglang-python-min-311's"),
    ("sglang-kernel-renamed", "sglang", "0.5.9", "0.5.10", "METADATA: sgl-kernel==0.3.21 -> sglang-kernel==0.4.1"),
    ("sglang-kernel-old-name", "sglang", "0.5.10", "0.5.9", "METADATA: sglang-kernel==0.4.1 in 0.5.10"),
    ("sglang-kernel-old-name", "sglang", "0.4.0.post2", "0.4.1", "0.4.0.post2 requires no kernel package"),
    ("sglang-trtllm-mha-sm12", "sglang", "0.5.10", "0.5.9", "server_args.py: decode admits SM120 from 0.5.10"),
    ("sglang-trtllm-mha-prefill-sm12", "sglang", "0.5.19", "0.5.18",
     "attention_hook.py:133 admits SM120 prefill from 0.5.19; server_args.py:6016 refuses it in 0.5.18"),
    ("sglang-moe-a2a-flag-absent", "sglang", "0.4.10.post2", "0.4.10.post1",
     "server_args.py:1384 declares --moe-a2a-backend in 0.4.10.post2"),
    ("flashinfer-mnnvl-sm12", "flashinfer", "0.6.12", "0.6.13", "jit/comm.py:41 supported_major_versions=[9, 10]"),
    ("flashinfer-pcie-ipc-ar-absent", "flashinfer", "0.7.0", "0.6.18.post1", "comm/pcie_ipc_ar.py from 0.7.0"),
    ("flashinfer-python-min-310", "flashinfer", "0.5.2", "0.5.3", "METADATA:8 Requires-Python >=3.9 -> >=3.10"),
    ("sglang-pcie-ipc-ar-absent", "sglang", "0.5.21", "0.5.20", "environ.py:1354 SGLANG_ENABLE_PCIE_IPC_ALLREDUCE"),
]


@pytest.fixture(scope="module")
def rules_by_id():
    return {rule.id: rule for rule in load_rules()}


@pytest.mark.parametrize(("rule_id", "fact", "outside", "inside", "evidence"), BOUNDS,
                         ids=[row[0] for row in BOUNDS])
def test_bound_sits_between_the_releases_read(rules_by_id, rule_id, fact, outside, inside, evidence):
    conditions = [c for c in rules_by_id[rule_id].conditions if c.fact == fact]
    assert conditions, f"{rule_id} has no condition on {fact}"
    assert all(c.holds(inside) for c in conditions), f"{rule_id} must cover {fact} {inside}: {evidence}"
    assert not all(c.holds(outside) for c in conditions), f"{rule_id} must not cover {fact} {outside}: {evidence}"


def test_symm_mem_rules_leave_no_sglang_release_between_them(rules_by_id):
    """The crash rule and the clean-disable rule meet: every release from 0.5.3 on is covered by one."""
    crash = rules_by_id["sglang-torch-symm-mem-keyerror-sm12"]
    clean = rules_by_id["sglang-torch-symm-mem-disabled-sm12"]

    def covers(rule, version):
        return all(c.holds(version) for c in rule.conditions if c.fact == "sglang")

    for version in ("0.5.3.post3", "0.5.12.post1", "0.5.13", "0.5.13.post1", "0.5.14", "0.5.15.post1", "0.5.23"):
        assert covers(crash, version) != covers(clean, version), version


# FlashInfer's SM 12.x arch normalisation (compilation_context.py), read in the wheels of 0.6.6, 0.6.7,
# 0.7.0.post1, 0.7.1, 0.7.2 and 0.7.4: SM 12.0 takes CUDA 12.8 from 0.7.1, SM 12.1 still needs 12.9.
FLASHINFER_BOUNDS = [
    ("flashinfer-sm120-needs-cuda129-nvcc", "0.6.6", "0.6.7"),
    ("flashinfer-sm120-needs-cuda129-nvcc", "0.7.1", "0.7.0.post1"),
    ("flashinfer-sm120-needs-cuda129-torch-fallback", "0.7.1", "0.7.0.post1"),
    ("flashinfer-sm121-needs-cuda129-nvcc", "0.6.6", "0.6.7"),
    ("flashinfer-sm121-needs-cuda129-torch-fallback", "0.6.6", "0.7.4"),
]


@pytest.mark.parametrize(("rule_id", "outside", "inside"), FLASHINFER_BOUNDS,
                         ids=[f"{r}-{o}-{i}" for r, o, i in FLASHINFER_BOUNDS])
def test_flashinfer_arch_normalisation_bounds(rules_by_id, rule_id, outside, inside):
    conditions = [c for c in rules_by_id[rule_id].conditions if c.fact == "flashinfer"]
    assert all(c.holds(inside) for c in conditions)
    assert not all(c.holds(outside) for c in conditions)


def test_sm121_rules_still_cover_the_newest_release_read(rules_by_id):
    """0.7.4 still raises 'SM 12.1+ requires CUDA >= 12.9' (compilation_context.py:105-107)."""
    for rule_id in ("flashinfer-sm121-needs-cuda129-nvcc", "flashinfer-sm121-needs-cuda129-torch-fallback"):
        assert all(c.holds("0.7.4") for c in rules_by_id[rule_id].conditions if c.fact == "flashinfer")
