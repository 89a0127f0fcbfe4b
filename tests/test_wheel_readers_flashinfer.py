"""FlashInfer wheel readers: synthetic file trees copied from real releases, then the real wheels.

The synthetic trees hold the exact lines of the release named in each case's comment (a few lines
around the gate, at the same path), so the readers are checked against code FlashInfer shipped.
``TestRealWheels`` downloads the releases on both sides of each measured boundary from PyPI
(``pip download --no-deps``) and checks the readings there.
"""

from __future__ import annotations

import ast
import subprocess
import sys
import textwrap
import zipfile
from pathlib import Path

import pytest

from stackforge.core.errors import SpecError
from stackforge.core.wheel_readings import ReadContext, Reading, ReadingStatus
from stackforge.wheels.readers import READERS, reader_for
from stackforge.wheels.readers import flashinfer as fi
from stackforge.wheels.readers._ast import parse

SM120_PCIE = ReadContext(arch="12.0", gpu_count=8, interconnect="pcie")
SM121 = ReadContext(arch="12.1", gpu_count=1, interconnect="pcie")
SM90_NVSWITCH = ReadContext(arch="9.0", gpu_count=8, interconnect="nvswitch")


def write(root: Path, path: str, text: str) -> Path:
    file = root / path
    file.parent.mkdir(parents=True, exist_ok=True)
    file.write_text(textwrap.dedent(text).lstrip("\n"), encoding="utf-8")
    return file


def checked(root: Path, reading: Reading) -> Reading:
    """The reading, after checking that every cited line is the file's line as written; line 0 is an
    absence: of the file (no code, the file is not there) or of a name in a file that is (code says which)."""
    assert reading.sites, f"{reading.fact}: a reading without code sites: {reading.summary}"
    for site in reading.sites:
        if site.line == 0:
            assert (root / site.path).is_file() == bool(site.code), (site, reading.summary)
            continue
        lines = (root / site.path).read_text(encoding="utf-8").splitlines()
        assert lines[site.line - 1].strip() == site.code, (site, reading.summary)
    return reading


def read(fact: str, root: Path, ctx: ReadContext) -> Reading:
    return checked(root, reader_for(fact, fi.DIST).reader(root, ctx))


# ------------------------------------------------------------------------------------------------
# Code as shipped (trimmed to the lines around each gate)
# ------------------------------------------------------------------------------------------------

# flashinfer-python 0.6.16.post4, flashinfer/jit/comm.py:190-193
COMM_0_6_16_POST4 = """
from .core import JitSpec, gen_jit_spec, current_compilation_context


def gen_trtllm_comm_module() -> JitSpec:
    nvcc_flags = current_compilation_context.get_nvcc_flags_list(
        supported_major_versions=[9, 10]
    )
    return gen_jit_spec(
        "trtllm_comm",
        [],
        extra_cuda_cflags=nvcc_flags,
    )
"""

# flashinfer-python 0.6.17, flashinfer/jit/comm.py:37-43 and 190-193
COMM_0_6_17 = """
from .core import JitSpec, gen_jit_spec, current_compilation_context


def gen_trtllm_mnnvl_comm_module() -> JitSpec:
    # This MNNVL path is supported on Hopper/Blackwell datacenter targets only.
    # Thor (SM11x) and RTX/consumer (SM12x) are intentionally excluded here.
    nvcc_flags = current_compilation_context.get_nvcc_flags_list(
        supported_major_versions=[9, 10]
    )
    return gen_jit_spec("trtllm_mnnvl_comm", [], extra_cuda_cflags=nvcc_flags)


def gen_trtllm_comm_module() -> JitSpec:
    nvcc_flags = current_compilation_context.get_nvcc_flags_list(
        supported_major_versions=[9, 10, 12]
    )
    return gen_jit_spec("trtllm_comm", [], extra_cuda_cflags=nvcc_flags)
"""

# flashinfer-python 0.6.12, flashinfer/jit/comm.py:37-42 (MNNVL without a gate)
COMM_0_6_12_MNNVL = """
def gen_trtllm_mnnvl_comm_module() -> JitSpec:
    return gen_jit_spec(
        "trtllm_mnnvl_comm",
        [
            jit_env.FLASHINFER_CSRC_DIR / "trtllm_mnnvl_allreduce.cu",
        ],
    )
"""

# flashinfer-python 0.3.0 (sdist), flashinfer/comm/trtllm_ar.py:100-112: no arch gate
TRTLLM_AR_0_3_0 = """
def gen_trtllm_comm_module() -> JitSpec:
    gencode_flags = _get_cuda_arch_flags()
    has_sm100 = any(
        "compute_100" in flag for flag in gencode_flags
    ) and version_at_least(torch.version.cuda, "12.8")
    return gen_jit_spec(
        "trtllm_comm",
        [
            jit_env.FLASHINFER_CSRC_DIR / "trtllm_allreduce.cu",
        ],
        extra_cuda_cflags=sm100a_nvcc_flags if has_sm100 else [],
    )
"""

# flashinfer-python 0.3.1 (sdist), flashinfer/comm/trtllm_ar.py:100-103: the gate's first release
TRTLLM_AR_0_3_1 = """
def gen_trtllm_comm_module() -> JitSpec:
    nvcc_flags = current_compilation_context.get_nvcc_flags_list(
        supported_major_versions=[9, 10]
    )
    return gen_jit_spec("trtllm_comm", [], extra_cuda_cflags=nvcc_flags)
"""

# flashinfer-python 0.6.7, flashinfer/compilation_context.py:33-55
NORMALIZE_0_6_7 = '''
class CompilationContext:
    COMMON_NVCC_FLAGS = []

    @staticmethod
    def _normalize_cuda_arch(major: int, minor: int) -> tuple[int, str]:
        """Normalize a (major, minor) capability pair."""
        if major == 9:
            return (major, str(minor) + "a")
        elif major == 12:
            from flashinfer.jit.cpp_ext import is_cuda_version_at_least

            if is_cuda_version_at_least("12.9"):
                return (major, "0f")
            else:
                raise RuntimeError("SM 12.x requires CUDA >= 12.9")
        elif major >= 10:
            return (major, str(minor) + "a")
        return (major, str(minor))
'''

# flashinfer-python 0.7.1, flashinfer/compilation_context.py:80-110
NORMALIZE_0_7_1 = '''
class CompilationContext:
    @staticmethod
    def _normalize_cuda_arch(major: int, minor: int) -> tuple[int, str]:
        """SM 12.0 -> allow CUDA 12.8+; SM 12.1+ -> require CUDA >= 12.9."""
        if major == 9:
            return (major, str(minor) + "a")
        elif major == 12:
            from flashinfer.jit.cpp_ext import is_cuda_version_at_least

            if minor == 0:
                if is_cuda_version_at_least("12.9"):
                    return (major, "0f")
                if is_cuda_version_at_least("12.8"):
                    return (major, "0a")
                raise RuntimeError("SM 120 requires CUDA >= 12.8")
            if is_cuda_version_at_least("12.9"):
                return (major, str(minor) + "a")
            raise RuntimeError("SM 12.1+ requires CUDA >= 12.9")
        elif major >= 10:
            return (major, str(minor) + "a")
        return (major, str(minor))
'''

# flashinfer-python 0.6.6, flashinfer/compilation_context.py:25-33 (no _normalize_cuda_arch)
CONTEXT_0_6_6 = """
import os


class CompilationContext:
    COMMON_NVCC_FLAGS = [
        "-DFLASHINFER_ENABLE_FP8_E8M0",
    ]

    def __init__(self):
        self.TARGET_CUDA_ARCHS = set()
"""

FMHA_RUNNER = "flashinfer/data/include/flashinfer/trtllm/fmha/fmhaRunner.cuh"
# flashinfer-python 0.6.16, fmhaRunner.cuh:35-38
FMHA_RUNNER_0_6_16 = """
  TllmGenFmhaRunner(Data_type dtypeQ, Data_type dtypeKv, Data_type dtypeOut)
      : mSM(getSMVersion()), mDtypeQ(dtypeQ), mDtypeKv(dtypeKv), mDtypeOut(dtypeOut) {
    FLASHINFER_CHECK(mSM == kSM_100 || mSM == kSM_103 || mSM == kSM_107,
                     "Unsupported architecture");
"""
# flashinfer-python 0.5.0, fmhaRunner.cuh:28-30
FMHA_RUNNER_0_5_0 = """
  TllmGenFmhaRunner(Data_type dtypeQ, Data_type dtypeKv, Data_type dtypeOut)
      : mSM(getSMVersion()), mDtypeQ(dtypeQ), mDtypeKv(dtypeKv), mDtypeOut(dtypeOut) {
    FLASHINFER_CHECK(mSM == kSM_100 || mSM == kSM_103, "Unsupported architecture");
"""

# flashinfer-python 0.6.3, flashinfer/gemm/gemm_base.py (requirements and mm_fp4's decorators)
GEMM_0_6_3 = """
@supported_compute_capability([100, 103, 110, 120, 121])
def _cudnn_gemm_fp4_requirement(a, b):
    return True


@supported_compute_capability([100, 103])
def _trtllm_gemm_fp4_requirement(a, b):
    return True


@supported_compute_capability([100, 103, 110, 120, 121])
def _cutlass_gemm_fp4_requirement(a, b):
    return True


@backend_requirement(
    {
        "cudnn": _cudnn_gemm_fp4_requirement,
        "trtllm": _trtllm_gemm_fp4_requirement,
        "cutlass": _cutlass_gemm_fp4_requirement,
    },
    common_check=_check_mm_fp4_problem_size,
    heuristic_func=_heuristic_func_mm_fp4,  # result stored in mm_fp4.suitable_auto_backends
)
@flashinfer_api
def mm_fp4(
    a: torch.Tensor,
    b: torch.Tensor,
):
    pass
"""

# flashinfer-python 0.7.1, flashinfer/comm/pcie_ipc_ar.py:53 and 233-237
PCIE_IPC_AR_0_7_1 = """
_SUPPORTED_WORLD_SIZES = (2, 4, 8)


class PcieIpcWorkspace:
    def __init__(self, group):
        error = None
        if self.world_size not in _SUPPORTED_WORLD_SIZES:
            error = (
                f"world size {self.world_size} unsupported; "
                f"expected one of {_SUPPORTED_WORLD_SIZES}"
            )
"""
# flashinfer-python 0.7.1, flashinfer/jit/comm.py:268-273
PCIE_GENERATOR_0_7_1 = """
def gen_pcie_ipc_comm_module() -> JitSpec:
    # No architecture restriction: the kernels use only plain PTX loads/stores
    # and CUDA IPC, both of which predate every architecture flashinfer builds
    # for. The target is a PCIe machine without NVLink, which is orthogonal to
    # the SM version.
    return gen_jit_spec("pcie_ipc_comm", [])
"""


# ------------------------------------------------------------------------------------------------
# Registry
# ------------------------------------------------------------------------------------------------

FLASHINFER_FACTS = ("flashinfer-ar-fusion", "flashinfer-ar-fusion:gate-present", "flashinfer-mnnvl",
                    "flashinfer-jit", "trtllm-gen-fmha", "nvfp4-gemm", "flashinfer-pcie-ipc-ar")


def test_registry_has_every_flashinfer_fact_once() -> None:
    keys = [(spec.fact, spec.dist) for spec in READERS]
    assert len(keys) == len(set(keys))
    for fact in FLASHINFER_FACTS:
        spec = reader_for(fact, "flashinfer-python")
        assert spec.fact == fact and spec.dist == "flashinfer-python" and spec.what


def test_reader_for_unknown_fact_or_dist_is_bad_input_naming_the_known_ones() -> None:
    with pytest.raises(SpecError) as unknown_fact:
        reader_for("no-such-fact", "flashinfer-python")
    assert unknown_fact.value.exit_code == 2
    assert "flashinfer-ar-fusion" in unknown_fact.value.one_line()
    with pytest.raises(SpecError) as unknown_dist:
        reader_for("flashinfer-ar-fusion", "no-such-dist")
    assert "flashinfer-python" in unknown_dist.value.one_line()


# ------------------------------------------------------------------------------------------------
# flashinfer-ar-fusion and its gate
# ------------------------------------------------------------------------------------------------

def test_ar_fusion_gate_without_12_refuses_sm120_and_admits_sm90(tmp_path: Path) -> None:
    write(tmp_path, "flashinfer/jit/comm.py", COMM_0_6_16_POST4)
    refused = read("flashinfer-ar-fusion", tmp_path, SM120_PCIE)
    assert refused.status is ReadingStatus.UNAVAILABLE
    assert "flashinfer/jit/comm.py:6 supported_major_versions=[9, 10]: 12 not admitted" in refused.summary
    assert refused.depends_on == ("arch",)
    assert ("flashinfer/jit/comm.py", 6, "supported_major_versions=[9, 10]") in [
        (s.path, s.line, s.code) for s in refused.sites]
    assert read("flashinfer-ar-fusion", tmp_path, SM90_NVSWITCH).status is ReadingStatus.AVAILABLE


def test_ar_fusion_gate_with_12_admits_sm120_and_sm121(tmp_path: Path) -> None:
    write(tmp_path, "flashinfer/jit/comm.py", COMM_0_6_17)
    for ctx in (SM120_PCIE, SM121):
        reading = read("flashinfer-ar-fusion", tmp_path, ctx)
        assert reading.status is ReadingStatus.AVAILABLE
        assert "supported_major_versions=[9, 10, 12]: 12 admitted" in reading.summary


def test_ar_fusion_before_the_gate_compiles_for_any_arch_and_gate_is_absent(tmp_path: Path) -> None:
    write(tmp_path, "flashinfer/comm/trtllm_ar.py", TRTLLM_AR_0_3_0)
    reading = read("flashinfer-ar-fusion", tmp_path, SM120_PCIE)
    assert reading.status is ReadingStatus.AVAILABLE
    assert "has no supported_major_versions gate" in reading.summary
    assert reading.depends_on == ()  # no gate: the same for every target arch
    assert reading.sites[0].code == "def gen_trtllm_comm_module() -> JitSpec:"
    gate = read("flashinfer-ar-fusion:gate-present", tmp_path, SM120_PCIE)
    assert gate.status is ReadingStatus.ABSENT and gate.depends_on == ()


def test_ar_fusion_gate_in_its_0_3_1_location(tmp_path: Path) -> None:
    write(tmp_path, "flashinfer/comm/trtllm_ar.py", TRTLLM_AR_0_3_1)
    assert read("flashinfer-ar-fusion", tmp_path, SM120_PCIE).status is ReadingStatus.UNAVAILABLE
    gate = read("flashinfer-ar-fusion:gate-present", tmp_path, SM120_PCIE)
    assert gate.status is ReadingStatus.AVAILABLE
    assert "gated by supported_major_versions=[9, 10]" in gate.summary


def test_ar_fusion_generator_found_after_it_moves_again(tmp_path: Path) -> None:
    write(tmp_path, "flashinfer/jit/comm.py", COMM_0_6_12_MNNVL)  # the known file, without the generator
    write(tmp_path, "flashinfer/jit/comm/trtllm.py", COMM_0_6_17)
    reading = read("flashinfer-ar-fusion", tmp_path, SM120_PCIE)
    assert reading.status is ReadingStatus.AVAILABLE
    assert reading.summary.startswith("flashinfer/jit/comm/trtllm.py:")


def test_ar_fusion_absent_without_the_generator(tmp_path: Path) -> None:
    write(tmp_path, "flashinfer/__init__.py", "")
    reading = read("flashinfer-ar-fusion", tmp_path, SM120_PCIE)
    assert reading.status is ReadingStatus.ABSENT
    assert {s.path for s in reading.sites} == set(fi.AR_FUSION_FILES)
    assert read("flashinfer-ar-fusion:gate-present", tmp_path, SM120_PCIE).status is ReadingStatus.ABSENT


def test_ar_fusion_gate_through_a_named_constant_cites_both_lines(tmp_path: Path) -> None:
    # The shape of flashinfer-python 0.6.17 flashinfer/jit/mamba/checkpointing_ssu.py:47
    write(tmp_path, "flashinfer/jit/comm.py", """
        _SUPPORTED_MAJORS = [9, 10, 12]


        def gen_trtllm_comm_module():
            return ctx.get_nvcc_flags_list(supported_major_versions=_SUPPORTED_MAJORS)
        """)
    reading = read("flashinfer-ar-fusion", tmp_path, SM120_PCIE)
    assert reading.status is ReadingStatus.AVAILABLE
    assert [s.line for s in reading.sites] == [4, 5, 1]


def test_ar_fusion_gate_that_is_not_a_literal_is_undecided(tmp_path: Path) -> None:
    write(tmp_path, "flashinfer/jit/comm.py", """
        def gen_trtllm_comm_module():
            return ctx.get_nvcc_flags_list(supported_major_versions=majors_from_env())
        """)
    reading = read("flashinfer-ar-fusion", tmp_path, SM120_PCIE)
    assert reading.status is ReadingStatus.UNDECIDED
    assert "not a literal list" in reading.summary


def test_unparsable_comm_file_is_undecided(tmp_path: Path) -> None:
    write(tmp_path, "flashinfer/jit/comm.py", "def gen_trtllm_comm_module(:\n")
    reading = read("flashinfer-ar-fusion", tmp_path, SM120_PCIE)
    assert reading.status is ReadingStatus.UNDECIDED and "does not parse" in reading.summary


def test_bad_target_arch_is_undecided(tmp_path: Path) -> None:
    write(tmp_path, "flashinfer/jit/comm.py", COMM_0_6_17)
    reading = read("flashinfer-ar-fusion", tmp_path, ReadContext(arch="sm120", gpu_count=8, interconnect="pcie"))
    assert reading.status is ReadingStatus.UNDECIDED and "'sm120'" in reading.summary


# ------------------------------------------------------------------------------------------------
# flashinfer-mnnvl
# ------------------------------------------------------------------------------------------------

def test_mnnvl_without_gate_then_gated_to_9_and_10(tmp_path: Path) -> None:
    before, after = tmp_path / "0.6.12", tmp_path / "0.6.17"
    write(before, "flashinfer/jit/comm.py", COMM_0_6_12_MNNVL)
    write(after, "flashinfer/jit/comm.py", COMM_0_6_17)
    assert read("flashinfer-mnnvl", before, SM120_PCIE).status is ReadingStatus.AVAILABLE
    gated = read("flashinfer-mnnvl", after, SM120_PCIE)
    assert gated.status is ReadingStatus.UNAVAILABLE
    assert "flashinfer/jit/comm.py:8 supported_major_versions=[9, 10]: 12 not admitted" in gated.summary
    assert read("flashinfer-mnnvl", after, SM90_NVSWITCH).status is ReadingStatus.AVAILABLE


# ------------------------------------------------------------------------------------------------
# flashinfer-jit
# ------------------------------------------------------------------------------------------------

def jit(root: Path, arch: str, **cuda: object) -> Reading:
    return read("flashinfer-jit", root, ReadContext(arch=arch, gpu_count=1, interconnect="pcie", **cuda))


def test_jit_0_6_7_refuses_sm12_with_cuda_12_8_nvcc(tmp_path: Path) -> None:
    write(tmp_path, fi.COMPILATION_CONTEXT, NORMALIZE_0_6_7)
    reading = jit(tmp_path, "12.0", cuda="12.8", nvcc=True, torch_cuda="12.9")
    assert reading.status is ReadingStatus.UNAVAILABLE
    assert reading.depends_on == ("arch", "nvcc", "cuda")
    assert 'compilation_context.py:15 raise RuntimeError("SM 12.x requires CUDA >= 12.9")' in reading.summary
    assert "CUDA 12.8 (nvcc)" in reading.summary
    assert [s.line for s in reading.sites] == [7, 9, 12, 15]


def test_jit_0_6_7_without_nvcc_uses_torch_cuda(tmp_path: Path) -> None:
    write(tmp_path, fi.COMPILATION_CONTEXT, NORMALIZE_0_6_7)
    reading = jit(tmp_path, "12.1", cuda="12.8", nvcc=False, torch_cuda="12.9")
    assert reading.status is ReadingStatus.AVAILABLE
    assert reading.depends_on == ("arch", "nvcc", "torch_cuda")
    assert "-> compute_120f" in reading.summary


def test_jit_0_6_7_undecided_without_a_cuda_version_or_when_nvcc_is_unknown(tmp_path: Path) -> None:
    write(tmp_path, fi.COMPILATION_CONTEXT, NORMALIZE_0_6_7)
    missing = jit(tmp_path, "12.0")
    assert missing.status is ReadingStatus.UNDECIDED
    assert missing.depends_on == ("arch", "nvcc", "cuda", "torch_cuda")
    # nvcc unknown: FlashInfer would read nvcc's version if there is one, else torch's; one is not enough.
    one = jit(tmp_path, "12.0", cuda="12.9")
    assert one.status is ReadingStatus.UNDECIDED and "gives no torch_cuda" in one.summary
    without_cuda = jit(tmp_path, "12.0", nvcc=True, torch_cuda="12.9")
    assert without_cuda.status is ReadingStatus.UNDECIDED and "gives no cuda" in without_cuda.summary
    split = jit(tmp_path, "12.0", cuda="12.8", torch_cuda="12.9")
    assert split.status is ReadingStatus.UNDECIDED
    assert "depends on whether the stack has nvcc" in split.summary
    agreed = jit(tmp_path, "12.0", cuda="12.9", torch_cuda="13.0")
    assert agreed.status is ReadingStatus.AVAILABLE
    assert agreed.summary.startswith("with or without nvcc: ")
    assert "CUDA 12.9 (nvcc)" in agreed.summary and "CUDA 13.0 (torch)" in agreed.summary


def test_jit_sm90_does_not_depend_on_cuda(tmp_path: Path) -> None:
    write(tmp_path, fi.COMPILATION_CONTEXT, NORMALIZE_0_6_7)
    reading = jit(tmp_path, "9.0")
    assert reading.status is ReadingStatus.AVAILABLE
    assert reading.depends_on == ("arch",)
    assert "-> compute_90a" in reading.summary


def test_jit_0_7_1_sm120_with_cuda_12_8_is_compute_120a_but_sm121_still_needs_12_9(tmp_path: Path) -> None:
    write(tmp_path, fi.COMPILATION_CONTEXT, NORMALIZE_0_7_1)
    sm120 = jit(tmp_path, "12.0", cuda="12.8", nvcc=True)
    assert sm120.status is ReadingStatus.AVAILABLE
    assert 'compilation_context.py:14 return (major, "0a"): SM 12.0 with CUDA 12.8 (nvcc) -> compute_120a' \
        in sm120.summary
    sm121 = jit(tmp_path, "12.1", cuda="12.8", nvcc=True)
    assert sm121.status is ReadingStatus.UNAVAILABLE
    assert "SM 12.1+ requires CUDA >= 12.9" in sm121.summary
    assert jit(tmp_path, "12.0", cuda="12.6", nvcc=True).status is ReadingStatus.UNAVAILABLE
    assert jit(tmp_path, "12.1", cuda="12.9", nvcc=True).summary.endswith("-> compute_121a")


def test_jit_before_0_6_7_has_no_gate_and_cites_the_class(tmp_path: Path) -> None:
    write(tmp_path, fi.COMPILATION_CONTEXT, CONTEXT_0_6_6)
    reading = jit(tmp_path, "12.0", cuda="12.8", nvcc=True)
    assert reading.status is ReadingStatus.AVAILABLE
    assert reading.sites[0].code == "class CompilationContext:"
    assert "has no _normalize_cuda_arch" in reading.summary


def test_jit_without_compilation_context_cites_its_absence(tmp_path: Path) -> None:
    write(tmp_path, "flashinfer/__init__.py", "")
    reading = jit(tmp_path, "12.0", cuda="12.8", nvcc=True)
    assert reading.status is ReadingStatus.AVAILABLE
    assert [(s.path, s.line) for s in reading.sites] == [(fi.COMPILATION_CONTEXT, 0)]


def test_jit_code_the_reader_cannot_follow_is_undecided(tmp_path: Path) -> None:
    write(tmp_path, fi.COMPILATION_CONTEXT, """
        class CompilationContext:
            @staticmethod
            def _normalize_cuda_arch(major, minor):
                for suffix in SUFFIXES:
                    return (major, suffix)
        """)
    reading = jit(tmp_path, "12.0", cuda="12.9", nvcc=True)
    assert reading.status is ReadingStatus.UNDECIDED
    assert "For statement is not followed" in reading.summary


# ------------------------------------------------------------------------------------------------
# trtllm-gen-fmha
# ------------------------------------------------------------------------------------------------

def test_trtllm_fmha_sm_list_over_two_lines(tmp_path: Path) -> None:
    write(tmp_path, FMHA_RUNNER, FMHA_RUNNER_0_6_16)
    refused = read("trtllm-gen-fmha", tmp_path, SM120_PCIE)
    assert refused.status is ReadingStatus.UNAVAILABLE
    assert "{sm_100, sm_103, sm_107}: sm_120" in refused.summary
    assert [s.line for s in refused.sites] == [3, 4]
    blackwell = ReadContext(arch="10.3", gpu_count=8, interconnect="nvswitch")
    assert read("trtllm-gen-fmha", tmp_path, blackwell).status is ReadingStatus.AVAILABLE


def test_trtllm_fmha_sm_list_on_one_line(tmp_path: Path) -> None:
    write(tmp_path, FMHA_RUNNER, FMHA_RUNNER_0_5_0)
    reading = read("trtllm-gen-fmha", tmp_path, ReadContext(arch="10.7", gpu_count=1, interconnect="pcie"))
    assert reading.status is ReadingStatus.UNAVAILABLE
    assert "{sm_100, sm_103}: sm_107" in reading.summary


def test_trtllm_fmha_absent_without_runner_or_generator(tmp_path: Path) -> None:
    write(tmp_path, "flashinfer/__init__.py", "")
    assert read("trtllm-gen-fmha", tmp_path, SM120_PCIE).status is ReadingStatus.ABSENT


# ------------------------------------------------------------------------------------------------
# nvfp4-gemm
# ------------------------------------------------------------------------------------------------

def test_nvfp4_gemm_lists_each_backend_and_who_admits_the_target(tmp_path: Path) -> None:
    write(tmp_path, "flashinfer/gemm/gemm_base.py", GEMM_0_6_3)
    reading = read("nvfp4-gemm", tmp_path, SM120_PCIE)
    assert reading.status is ReadingStatus.AVAILABLE
    assert "cudnn [100, 103, 110, 120, 121]; trtllm [100, 103]" in reading.summary
    assert reading.summary.endswith("120 admitted by cudnn, cutlass")
    assert {s.line for s in reading.sites} >= {1, 6, 11, 26}
    assert read("nvfp4-gemm", tmp_path, SM90_NVSWITCH).status is ReadingStatus.UNAVAILABLE


def test_nvfp4_gemm_requirement_imported_from_another_module(tmp_path: Path) -> None:
    # flashinfer-python 0.7.2: "cake": cake_mm_fp4_requirement, imported into gemm_base.py
    write(tmp_path, "flashinfer/gemm/cake.py", """
        @supported_compute_capability([100, 103])
        def cake_mm_fp4_requirement(a, b):
            return True
        """)
    write(tmp_path, "flashinfer/gemm/gemm_base.py", """
        from .cake import cake_mm_fp4_requirement


        @backend_requirement({"cake": cake_mm_fp4_requirement})
        def mm_fp4(a, b):
            pass
        """)
    blackwell = ReadContext(arch="10.0", gpu_count=8, interconnect="nvswitch")
    reading = read("nvfp4-gemm", tmp_path, blackwell)
    assert reading.status is ReadingStatus.AVAILABLE
    assert ("flashinfer/gemm/cake.py", 1) in [(s.path, s.line) for s in reading.sites]
    assert read("nvfp4-gemm", tmp_path, SM120_PCIE).status is ReadingStatus.UNAVAILABLE


def test_nvfp4_gemm_unreadable_backend_leaves_it_undecided(tmp_path: Path) -> None:
    write(tmp_path, "flashinfer/gemm/gemm_base.py", """
        @supported_compute_capability([100, 103])
        def _trtllm_gemm_fp4_requirement(a, b):
            return True


        @backend_requirement({"trtllm": _trtllm_gemm_fp4_requirement, "new": make_requirement()})
        def mm_fp4(a, b):
            pass
        """)
    reading = read("nvfp4-gemm", tmp_path, SM120_PCIE)
    assert reading.status is ReadingStatus.UNDECIDED
    assert "new (requirement is not a plain function name)" in reading.summary


# ------------------------------------------------------------------------------------------------
# flashinfer-pcie-ipc-ar
# ------------------------------------------------------------------------------------------------

def test_pcie_ipc_ar_world_sizes_and_no_arch_gate(tmp_path: Path) -> None:
    write(tmp_path, fi.PCIE_IPC_AR, PCIE_IPC_AR_0_7_1)
    write(tmp_path, "flashinfer/jit/comm.py", PCIE_GENERATOR_0_7_1)
    eight = read("flashinfer-pcie-ipc-ar", tmp_path, SM120_PCIE)
    assert eight.status is ReadingStatus.AVAILABLE
    assert eight.summary.startswith("flashinfer/comm/pcie_ipc_ar.py:1 _SUPPORTED_WORLD_SIZES = (2, 4, 8)")
    assert eight.depends_on == ("gpu_count", "arch")
    six = read("flashinfer-pcie-ipc-ar", tmp_path, ReadContext(arch="12.0", gpu_count=6, interconnect="pcie"))
    assert six.status is ReadingStatus.UNAVAILABLE and "world size 6 unsupported" in six.summary


def test_pcie_ipc_ar_absent_before_it_shipped(tmp_path: Path) -> None:
    write(tmp_path, "flashinfer/jit/comm.py", COMM_0_6_17)
    reading = read("flashinfer-pcie-ipc-ar", tmp_path, SM120_PCIE)
    assert reading.status is ReadingStatus.ABSENT
    assert [(s.path, s.line) for s in reading.sites] == [(fi.PCIE_IPC_AR, 0)]


# ------------------------------------------------------------------------------------------------
# The AST helper
# ------------------------------------------------------------------------------------------------

def test_parse_missing_file_is_none_and_header_has_no_tree(tmp_path: Path) -> None:
    assert parse(tmp_path, "flashinfer/nothing.py") is None
    write(tmp_path, FMHA_RUNNER, FMHA_RUNNER_0_5_0)
    header = parse(tmp_path, FMHA_RUNNER)
    assert header is not None and header.tree is None and not header.error
    assert header.lines_containing("Unsupported architecture") == (3,)


def test_function_is_the_first_def_in_source_order_and_constants_resolve(tmp_path: Path) -> None:
    write(tmp_path, "flashinfer/x.py", """
        SIZES = (2, 4, 8)


        class A:
            def gen(self):
                return 1


        def gen():
            return 2
        """)
    source = parse(tmp_path, "flashinfer/x.py")
    assert source is not None and source.function("gen") is not None
    assert source.function("gen").lineno == 5
    resolved = source.resolve(ast.Name("SIZES", ast.Load()))
    assert resolved is not None and resolved.value == (2, 4, 8) and resolved.line == 1
    assert source.function("missing") is None


# ------------------------------------------------------------------------------------------------
# The real wheels on both sides of each boundary
# ------------------------------------------------------------------------------------------------

REAL_VERSIONS = ("0.6.12", "0.6.13", "0.6.16.post4", "0.6.17", "0.7.0.post1", "0.7.1")


@pytest.fixture(scope="module")
def wheels(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Each release's py3-none-any wheel from PyPI, unpacked (downloaded once per module)."""
    base = tmp_path_factory.mktemp("flashinfer-wheels")
    roots = {}
    for version in REAL_VERSIONS:
        target = base / "download" / version
        subprocess.run([sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--only-binary=:all:",
                        f"flashinfer-python=={version}", "-d", str(target)], check=True, timeout=600)
        wheel = next(target.glob("flashinfer_python-*.whl"))
        root = base / "unpacked" / version
        with zipfile.ZipFile(wheel) as archive:
            archive.extractall(root)
        roots[version] = root
    return roots


@pytest.mark.pypi
class TestRealWheels:
    """Readings on PyPI's flashinfer-python wheels at the measured boundaries."""

    def test_ar_fusion_boundary_on_sm120(self, wheels: dict[str, Path]) -> None:
        before = read("flashinfer-ar-fusion", wheels["0.6.16.post4"], SM120_PCIE)
        after = read("flashinfer-ar-fusion", wheels["0.6.17"], SM120_PCIE)
        assert before.status is ReadingStatus.UNAVAILABLE
        assert "flashinfer/jit/comm.py:192 supported_major_versions=[9, 10]: 12 not admitted" in before.summary
        assert after.status is ReadingStatus.AVAILABLE
        assert "flashinfer/jit/comm.py:192 supported_major_versions=[9, 10, 12]: 12 admitted" in after.summary
        for version in ("0.6.16.post4", "0.6.17"):
            gate = read("flashinfer-ar-fusion:gate-present", wheels[version], SM120_PCIE)
            assert gate.status is ReadingStatus.AVAILABLE

    def test_mnnvl_gate_appears_in_0_6_13(self, wheels: dict[str, Path]) -> None:
        before = read("flashinfer-mnnvl", wheels["0.6.12"], SM120_PCIE)
        after = read("flashinfer-mnnvl", wheels["0.6.13"], SM120_PCIE)
        assert before.status is ReadingStatus.AVAILABLE and "has no supported_major_versions gate" in before.summary
        assert after.status is ReadingStatus.UNAVAILABLE
        assert "flashinfer/jit/comm.py:41 supported_major_versions=[9, 10]: 12 not admitted" in after.summary
        assert read("flashinfer-mnnvl", wheels["0.6.13"], SM90_NVSWITCH).status is ReadingStatus.AVAILABLE

    def test_jit_sm120_with_cuda_12_8_boundary_at_0_7_1(self, wheels: dict[str, Path]) -> None:
        ctx = ReadContext(arch="12.0", gpu_count=8, interconnect="pcie", cuda="12.8", nvcc=True)
        before = read("flashinfer-jit", wheels["0.7.0.post1"], ctx)
        after = read("flashinfer-jit", wheels["0.7.1"], ctx)
        assert before.status is ReadingStatus.UNAVAILABLE
        assert 'compilation_context.py:83 raise RuntimeError("SM 12.x requires CUDA >= 12.9")' in before.summary
        assert after.status is ReadingStatus.AVAILABLE
        assert 'compilation_context.py:103 return (major, "0a")' in after.summary
        assert "compute_120a" in after.summary
        sm121 = ReadContext(arch="12.1", gpu_count=1, interconnect="pcie", cuda="12.8", nvcc=True)
        assert read("flashinfer-jit", wheels["0.7.1"], sm121).status is ReadingStatus.UNAVAILABLE
        assert read("flashinfer-jit", wheels["0.6.12"], ctx).status is ReadingStatus.UNAVAILABLE

    def test_trtllm_fmha_never_admits_sm120(self, wheels: dict[str, Path]) -> None:
        for version in REAL_VERSIONS:
            assert read("trtllm-gen-fmha", wheels[version], SM120_PCIE).status is ReadingStatus.UNAVAILABLE
        blackwell = ReadContext(arch="10.0", gpu_count=8, interconnect="nvswitch")
        assert read("trtllm-gen-fmha", wheels["0.7.1"], blackwell).status is ReadingStatus.AVAILABLE

    def test_nvfp4_gemm_declares_sm120(self, wheels: dict[str, Path]) -> None:
        reading = read("nvfp4-gemm", wheels["0.6.17"], SM120_PCIE)
        assert reading.status is ReadingStatus.AVAILABLE
        assert "120 admitted by cudnn, cutlass, b12x" in reading.summary
        assert read("nvfp4-gemm", wheels["0.6.17"], SM90_NVSWITCH).status is ReadingStatus.UNAVAILABLE

    def test_pcie_ipc_ar_ships_in_0_7_0_post1_and_admits_8_ranks(self, wheels: dict[str, Path]) -> None:
        assert read("flashinfer-pcie-ipc-ar", wheels["0.6.17"], SM120_PCIE).status is ReadingStatus.ABSENT
        for version in ("0.7.0.post1", "0.7.1"):
            reading = read("flashinfer-pcie-ipc-ar", wheels[version], SM120_PCIE)
            assert reading.status is ReadingStatus.AVAILABLE
            assert "_SUPPORTED_WORLD_SIZES = (2, 4, 8)" in reading.summary
