"""The metadata readers (stackforge.wheels.readers.metadata) over *.dist-info/METADATA: synthetic files
holding the real header lines (the release each comes from is named above it), then real wheels."""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from packaging.requirements import Requirement

from stackforge.core.wheel_readings import ReadContext, Reading, ReadingStatus
from stackforge.wheels.readers import metadata as md

CTX = ReadContext(arch="12.0", gpu_count=8, interconnect="pcie", python="3.10", torch_cuda="12.8",
                  kernel_package="sgl-kernel")

# A License header whose continuation holds lines of spaces (as sglang's METADATA does) must not end the headers.
LICENSE = ("License:                                  Apache License\n"
           "                                   Version 2.0\n        \n           TERMS AND CONDITIONS\n")


def metadata(root: Path, version: str, *lines: str) -> Path:
    folder = root / f"sglang-{version}.dist-info"
    folder.mkdir(parents=True)
    text = f"Metadata-Version: 2.4\nName: sglang\nVersion: {version}\n{LICENSE}"
    text += "".join(f"{line}\n" for line in lines)
    (folder / "METADATA").write_text(text + "\n# SGLang\n\nRequires-Dist: not-a-header\n", encoding="utf-8")
    return root


def read(fact: str, root: Path, ctx: ReadContext = CTX, dist: str = "sglang") -> Reading:
    spec = next(s for s in md.READERS if s.fact == fact and s.dist == dist)
    reading = spec.reader(root, ctx)
    assert reading.fact == fact and reading.sites and "\n" not in reading.summary
    for found in reading.sites:
        if found.line:
            lines = (root / found.path).read_text(encoding="utf-8").splitlines()
            assert found.code == lines[found.line - 1].strip(), found
    return reading


# sglang 0.5.11 METADATA: Requires-Python, cuda-python (line 221), the kernel (258) and torch (263)
def release_0_5_11(root: Path) -> Path:
    return metadata(root, "0.5.11", "Requires-Python: >=3.10", "Requires-Dist: cuda-python>=13.0",
                    "Requires-Dist: flashinfer_python==0.6.8.post1", "Requires-Dist: sglang-kernel==0.4.2",
                    "Requires-Dist: torch==2.11.0", 'Requires-Dist: pytest; extra == "test"')


# sglang 0.5.10.post1 METADATA
def release_0_5_10_post1(root: Path) -> Path:
    return metadata(root, "0.5.10.post1", "Requires-Python: >=3.10", "Requires-Dist: cuda-python==12.9",
                    "Requires-Dist: sglang-kernel==0.4.1", "Requires-Dist: torch==2.9.1")


# sglang 0.5.1 METADATA: the runtime under the srt extra
def release_0_5_1(root: Path) -> Path:
    return metadata(root, "0.5.1", "Requires-Python: >=3.10", 'Requires-Dist: sgl-kernel==0.3.5; extra == "srt"',
                    'Requires-Dist: torch==2.8.0; extra == "srt"', 'Requires-Dist: cuda-python; extra == "srt"',
                    'Requires-Dist: torch; extra == "srt-hip"')


class TestRequiresPython:
    @pytest.mark.parametrize(("python", "status"), [("3.10", ReadingStatus.UNAVAILABLE),
                                                    ("3.11", ReadingStatus.AVAILABLE)])
    def test_python_against_the_floor(self, tmp_path: Path, python: str, status: ReadingStatus) -> None:
        # sglang 0.5.22 METADATA:213
        root = metadata(tmp_path, "0.5.22", "Requires-Python: >=3.11")
        reading = read("metadata:requires-python", root, ReadContext("12.0", 8, "pcie", python=python))
        assert reading.status is status
        assert reading.sites[0].code == "Requires-Python: >=3.11" and reading.sites[0].line == 8
        assert reading.depends_on == ("python",)

    def test_no_python_in_the_context_is_undecided(self, tmp_path: Path) -> None:
        reading = read("metadata:requires-python", release_0_5_11(tmp_path), ReadContext("12.0", 8, "pcie"))
        assert reading.status is ReadingStatus.UNDECIDED

    def test_flashinfer_is_read_too(self, tmp_path: Path) -> None:
        reading = read("metadata:requires-python", release_0_5_11(tmp_path), dist="flashinfer-python")
        assert reading.status is ReadingStatus.AVAILABLE


class TestTorchPin:
    def test_cuda13_stack_refuses_a_cuda12_torch(self, tmp_path: Path) -> None:
        reading = read("metadata:torch-pin", release_0_5_11(tmp_path))
        assert reading.status is ReadingStatus.UNAVAILABLE
        assert "torch==2.11.0" in reading.summary and "cuda-python>=13.0 needs a CUDA 13 stack" in reading.summary
        assert [s.code for s in reading.sites] == ["Requires-Dist: torch==2.11.0", "Requires-Dist: cuda-python>=13.0"]

    def test_cuda13_stack_admits_a_cuda13_torch(self, tmp_path: Path) -> None:
        ctx = ReadContext("12.0", 8, "pcie", torch_cuda="13.0")
        assert read("metadata:torch-pin", release_0_5_11(tmp_path), ctx).status is ReadingStatus.AVAILABLE

    def test_cuda12_release_admits_a_cuda12_torch(self, tmp_path: Path) -> None:
        reading = read("metadata:torch-pin", release_0_5_10_post1(tmp_path))
        assert reading.status is ReadingStatus.AVAILABLE and "torch==2.9.1" in reading.summary

    def test_cu13_extra_decides(self, tmp_path: Path) -> None:
        # sglang 0.5.23 METADATA:232
        root = metadata(tmp_path, "0.5.23", "Requires-Dist: flashinfer_python[cu13]==0.7.2",
                        "Requires-Dist: torch==2.14.1")
        reading = read("metadata:torch-pin", root)
        assert reading.status is ReadingStatus.UNAVAILABLE and "flashinfer_python[cu13]" in reading.summary

    def test_runtime_extra_counts_other_extras_do_not(self, tmp_path: Path) -> None:
        reading = read("metadata:torch-pin", release_0_5_1(tmp_path))
        assert reading.status is ReadingStatus.AVAILABLE and "torch==2.8.0 (extra srt)" in reading.summary

    @pytest.mark.parametrize(("requirement", "needs"), [
        ("cuda-python>=13.0", True), ("cuda-python==12.9", False), ("cuda-python>=12.0", False),
        ("cuda-python", False), ("nvidia-nccl-cu13==2.28.3", True), ("flashinfer_python[cu13]==0.7.2", True),
        ("nvidia-nccl-cu12==2.27.3", False)])
    def test_what_needs_cuda13(self, requirement: str, needs: bool) -> None:
        header = md.Header(1, "Requires-Dist", requirement, f"Requires-Dist: {requirement}")
        assert md.needs_cuda13(md.Dependency(header, Requirement(requirement), None)) is needs

    def test_no_torch_context_with_cuda13_release_is_undecided(self, tmp_path: Path) -> None:
        ctx = ReadContext("12.0", 8, "pcie")
        assert read("metadata:torch-pin", release_0_5_11(tmp_path), ctx).status is ReadingStatus.UNDECIDED


class TestKernelPackage:
    def test_renamed_kernel_refuses_the_old_name(self, tmp_path: Path) -> None:
        reading = read("metadata:kernel-package", release_0_5_10_post1(tmp_path))
        assert reading.status is ReadingStatus.UNAVAILABLE
        assert reading.sites[0].code == "Requires-Dist: sglang-kernel==0.4.1"

    def test_old_name_under_the_srt_extra(self, tmp_path: Path) -> None:
        reading = read("metadata:kernel-package", release_0_5_1(tmp_path))
        assert reading.status is ReadingStatus.AVAILABLE and "sgl-kernel==0.3.5" in reading.summary
        new = ReadContext("12.0", 8, "pcie", kernel_package="sglang-kernel")
        assert read("metadata:kernel-package", release_0_5_1(tmp_path / "again"), new).status \
            is ReadingStatus.UNAVAILABLE

    def test_no_kernel_is_absent(self, tmp_path: Path) -> None:
        root = metadata(tmp_path, "0.4.0", 'Requires-Dist: torch; extra == "srt"')
        assert read("metadata:kernel-package", root).status is ReadingStatus.ABSENT

    def test_no_metadata_is_undecided(self, tmp_path: Path) -> None:
        spec = next(s for s in md.READERS if s.fact == "metadata:kernel-package")
        assert spec.reader(tmp_path, CTX).status is ReadingStatus.UNDECIDED


def test_registry() -> None:
    keys = {(s.fact, s.dist) for s in md.READERS}
    assert len(keys) == len(md.READERS)
    assert {("metadata:requires-python", "sglang"), ("metadata:torch-pin", "sglang"),
            ("metadata:kernel-package", "sglang"), ("metadata:requires-python", "flashinfer-python"),
            ("metadata:torch-pin", "flashinfer-python")} <= keys


# --------------------------------------------------------------------------------------------
# Real wheels from PyPI (network): only the METADATA member is unpacked
# --------------------------------------------------------------------------------------------

REAL_VERSIONS = ("0.5.9", "0.5.10", "0.5.10.post1", "0.5.11")


def wheel_metadata(version: str, into: Path) -> Path:
    proc = subprocess.run([sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--only-binary=:all:",
                           f"sglang=={version}", "-d", str(into / "download")], capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    wheel = next((into / "download").glob("*.whl"))
    root = into / "unpacked"
    with zipfile.ZipFile(wheel) as archive:
        archive.extractall(root, [n for n in archive.namelist() if n.endswith(".dist-info/METADATA")])
    return root


@pytest.fixture(scope="module")
def wheels(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return {v: wheel_metadata(v, tmp_path_factory.mktemp(f"sglang-{v}")) for v in REAL_VERSIONS}


@pytest.mark.pypi
class TestRealWheels:
    def test_cuda13_stack_from_0_5_11(self, wheels: dict[str, Path]) -> None:
        before = read("metadata:torch-pin", wheels["0.5.10.post1"])
        after = read("metadata:torch-pin", wheels["0.5.11"])
        assert before.status is ReadingStatus.AVAILABLE and "torch==2.9.1" in before.summary
        assert after.status is ReadingStatus.UNAVAILABLE
        assert "torch==2.11.0" in after.summary and "cuda-python>=13.0" in after.summary

    def test_kernel_renamed_in_0_5_10(self, wheels: dict[str, Path]) -> None:
        assert read("metadata:kernel-package", wheels["0.5.9"]).status is ReadingStatus.AVAILABLE
        renamed = read("metadata:kernel-package", wheels["0.5.10"])
        assert renamed.status is ReadingStatus.UNAVAILABLE and "sglang-kernel==0.4.1" in renamed.summary

    def test_python_floor(self, wheels: dict[str, Path]) -> None:
        for version, root in wheels.items():
            assert read("metadata:requires-python", root).status is ReadingStatus.AVAILABLE, version
