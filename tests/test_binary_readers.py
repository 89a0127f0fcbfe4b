"""The wheel tier's binary readers: torch's, the kernel packages' and FlashInfer's prebuilt device code,
read by HTTP range requests from small synthetic wheels (zips of ELF-like objects carrying fatbin
containers in the documented layout), never unpacked."""

from __future__ import annotations

import os
import struct
import zipfile
from pathlib import Path

import pytest

from stackforge.core.wheel_readings import ReadContext, ReadingStatus, ReleaseFile
from stackforge.edges.index import IndexConfig, Release
from stackforge.edges.ranges import RemoteZip
from stackforge.inimage._sffatbin import entry_code, fatbin_entries
from stackforge.wheels.cache import WheelCache
from stackforge.wheels.readers import binaries, reader_for
from tests._wheel_helpers import LoopbackIndex, serve, sha256_of

SM120 = ReadContext(arch="12.0", gpu_count=8, interconnect="pcie")
HOPPER = ReadContext(arch="9.0", gpu_count=8, interconnect="nvlink")
ARCH_SPECIFIC = 0x100000


def fatbin(entries: list[tuple[int, int, int]], payload: bytes = b"") -> bytes:
    """A fatbin container: (kind, arch, flags) entries, each with ``payload`` behind its 64-byte header."""
    body = b""
    for kind, arch, flags in entries:
        body += struct.pack("<HHIQIIHHIIIQQQ", kind, 0x0101, 64, len(payload), 0, 0, 0, 0, arch, 0, 0, flags, 0, 0)
        body += payload
    return struct.pack("<IHHQ", 0xBA55ED50, 1, 16, len(body)) + body


def shared_object(*containers: bytes, padding: bytes = b"") -> bytes:
    """An ELF-looking object: a header, ``padding`` (host code), a stray magic that is no container, then
    the containers 8-byte aligned (as in a .nv_fatbin section)."""
    head = b"\x7fELF\x02\x01\x01" + bytes(57)
    # the magic and a header-like tail as data in host code: read as a container, it would swallow the next 4 KiB
    stray = struct.pack("<IHHQ", 0xBA55ED50, 1, 16, 4096) + bytes(48)
    blob = head + padding + stray
    blob += bytes(-len(blob) % 8)
    for container in containers:
        blob += container + bytes(-len(container) % 8)
    return blob + b"\x00" * 64


def wheel(folder: Path, name: str, members: dict[str, bytes], metadata: str = "") -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / name
    dist, version = name.split("-")[:2]
    with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_DEFLATED) as archive:
        for member, data in members.items():
            archive.writestr(member, data)
        archive.writestr(f"{dist}-{version}.dist-info/METADATA",
                         f"Metadata-Version: 2.1\nName: {dist}\nVersion: {version}\n{metadata}\n")
    return path


def release(path: Path, dist: str, version: str) -> Release:
    file = ReleaseFile(dist=dist, version=version, filename=path.name, url=path.as_uri(), sha256=sha256_of(path))
    return Release(dist, version, (file,))


@pytest.fixture
def cache(tmp_path: Path) -> WheelCache:
    return WheelCache.open(IndexConfig(), tmp_path / "cache")


def measure_one(fact: str, dist: str, path: Path, version: str, ctx: ReadContext, cache: WheelCache):
    from stackforge.wheels.tier import measure

    return measure(reader_for(fact, dist), release(path, dist, version), ctx, cache=cache).reading


# --- the shared fatbin parser ---------------------------------------------------------------------------

def test_the_parser_reads_entries_and_strict_mode_skips_a_stray_magic():
    blob = shared_object(fatbin([(2, 90, ARCH_SPECIFIC), (2, 120, 0), (1, 120, 0)], payload=b"x" * 40))

    def read_at(offset: int, length: int) -> bytes:
        return blob[offset:offset + length]

    codes = [entry_code(*e) for e in fatbin_entries(read_at, 0, len(blob), strict=True)]
    assert codes == ["sm_90a", "sm_120", "compute_120"]


# --- sgl-kernel / sglang-kernel ---------------------------------------------------------------------------

def kernel_wheel(folder: Path, version: str, archs: list[int], padding: bytes = b"") -> Path:
    ops = shared_object(fatbin([(2, a, 0) for a in archs], payload=os.urandom(64)), padding=padding)
    hopper_only = shared_object(fatbin([(2, 90, ARCH_SPECIFIC)]))
    return wheel(folder, f"sglang_kernel-{version}-cp310-abi3-manylinux2014_x86_64.whl",
                 {"sgl_kernel/common_ops.abi3.so": ops, "sgl_kernel/flash_ops.abi3.so": hopper_only,
                  "sgl_kernel/__init__.py": b"# python\n"})


def test_kernel_coverage_per_shared_object_read_by_ranges(tmp_path, cache):
    path = kernel_wheel(tmp_path / "w", "0.4.10", [80, 90, 120])
    reading = measure_one("kernel-arch-coverage", "sglang-kernel", path, "0.4.10", SM120, cache)
    assert reading.status is ReadingStatus.AVAILABLE, reading
    assert "1/2 files with device code cover sm_120" in reading.summary
    assert "no code for sm_120 in sgl_kernel/flash_ops.abi3.so" in reading.summary
    sites = {site.path: site.code for site in reading.sites}
    assert sites["sgl_kernel/common_ops.abi3.so"] == "fatbin: sm_80 sm_90 sm_120"
    assert sites["sgl_kernel/flash_ops.abi3.so"] == "fatbin: sm_90a"
    assert "read by HTTP ranges" in sites[path.name]

    older = kernel_wheel(tmp_path / "old", "0.4.9", [80, 90])
    refused = measure_one("kernel-arch-coverage", "sglang-kernel", older, "0.4.9", SM120, cache)
    assert refused.status is ReadingStatus.UNAVAILABLE, refused
    assert measure_one("kernel-arch-coverage", "sglang-kernel", older, "0.4.9", HOPPER, cache).status \
        is ReadingStatus.AVAILABLE


def test_a_member_past_the_read_limit_is_undecided_never_missing(tmp_path, cache, monkeypatch):
    # 3 MiB of incompressible host code before the containers: past a 1 MiB limit, read to the end at 8
    path = kernel_wheel(tmp_path / "w", "0.4.9", [80, 90], padding=os.urandom(3 << 20))
    monkeypatch.setenv("STACKFORGE_ABI_MAX_LIBRARY_MB", "1")
    reading = measure_one("kernel-arch-coverage", "sglang-kernel", path, "0.4.9", SM120, cache)
    assert reading.status is ReadingStatus.UNDECIDED, reading
    assert "over the 1 MiB read per library" in reading.summary
    fetched = next(s.code for s in reading.sites if s.path == path.name)
    assert float(fetched.split("; ")[1].split(" of ")[0]) < 3.0   # not the whole 3 MB member
    monkeypatch.setenv("STACKFORGE_ABI_MAX_LIBRARY_MB", "8")   # another limit reads it again, to the end
    whole = measure_one("kernel-arch-coverage", "sglang-kernel", path, "0.4.9", SM120, cache)
    assert whole.status is ReadingStatus.UNAVAILABLE, whole


# --- torch -------------------------------------------------------------------------------------------------

TORCH_METADATA = ('Requires-Dist: nvidia-cuda-runtime-cu12==12.8.90; platform_system == "Linux"\n'
                  'Requires-Dist: nvidia-nccl-cu12==2.27.5; platform_system == "Linux"')


def test_torch_kernels_from_libtorch_cuda_and_its_nccl_pin(tmp_path, cache):
    lib = shared_object(fatbin([(2, 80, 0), (2, 90, 0), (2, 120, 0), (1, 120, 0)]))
    path = wheel(tmp_path / "w", "torch-2.9.1-cp311-cp311-manylinux_2_28_x86_64.whl",
                 {"torch/lib/libtorch_cuda.so": lib, "torch/lib/libc10.so": shared_object(),
                  "torch/__init__.py": b""}, TORCH_METADATA)
    reading = measure_one("torch-kernels", "torch", path, "2.9.1", SM120, cache)
    assert reading.status is ReadingStatus.AVAILABLE, reading
    assert "SASS sm_120 runs on sm_120" in reading.summary
    assert "NCCL 2.27.5 (nvidia-nccl-cu12)" in reading.summary and "CUDA 12.8 build" in reading.summary
    assert any(s.path == "torch-2.9.1.dist-info/METADATA" and "nvidia-nccl-cu12==2.27.5" in s.code
               for s in reading.sites)
    # the stack's torch is another build (cu130): this wheel does not speak for it
    other = measure_one("torch-kernels", "torch", path, "2.9.1", ReadContext("12.0", 8, "pcie", torch_cuda="13.0"),
                        cache)
    assert other.status is ReadingStatus.UNDECIDED and "the CUDA 13.0 build, another wheel" in other.summary
    assert other.depends_on == ("arch", "torch_cuda")
    # only PTX below the target: JIT-compiled at first use
    ptx = wheel(tmp_path / "p", "torch-2.7.0-cp311-cp311-manylinux_2_28_x86_64.whl",
                {"torch/lib/libtorch_cuda.so": shared_object(fatbin([(2, 90, 0), (1, 90, 0)]))}, TORCH_METADATA)
    jit = measure_one("torch-kernels", "torch", ptx, "2.7.0", SM120, cache)
    assert jit.status is ReadingStatus.AVAILABLE and jit.manner == "ptx jit", jit
    cpu = wheel(tmp_path / "c", "torch-2.9.1-cp311-none-any.whl", {"torch/lib/libc10.so": shared_object()})
    assert measure_one("torch-kernels", "torch", cpu, "2.9.1", SM120, cache).status is ReadingStatus.UNAVAILABLE


def test_a_cuda_13_torch_names_its_build_through_the_cuda_toolkit_pin(tmp_path, cache):
    metadata = ('Requires-Dist: cuda-toolkit[cublas,cudart,nvrtc]==13.0.3; platform_system == "Linux"\n'
                'Requires-Dist: nvidia-nccl-cu13==2.30.7; platform_system == "Linux"')
    path = wheel(tmp_path / "w", "torch-2.14.1-cp311-cp311-manylinux_2_28_x86_64.whl",
                 {"torch/lib/libtorch_cuda.so": shared_object(fatbin([(2, 100, ARCH_SPECIFIC), (2, 120, 0)]))},
                 metadata)
    reading = measure_one("torch-kernels", "torch", path, "2.14.1", ReadContext("12.0", 8, "pcie", torch_cuda="13.0"),
                          cache)
    assert reading.status is ReadingStatus.AVAILABLE and reading.depends_on == ("arch", "torch_cuda"), reading
    assert "CUDA 13.0 build; NCCL 2.30.7 (nvidia-nccl-cu13)" in reading.summary


def test_torch_reads_only_its_cuda_library_and_the_metadata(tmp_path):
    big_cpu_library = os.urandom(2 << 20)
    path = wheel(tmp_path / "w", "torch-2.9.1-cp311-cp311-manylinux_2_28_x86_64.whl",
                 {"torch/lib/libtorch_cpu.so": big_cpu_library,
                  "torch/lib/libtorch_cuda.so": shared_object(fatbin([(2, 120, 0)]))}, TORCH_METADATA)
    remote = RemoteZip(str(path))
    scan = binaries.scan_torch(remote, 160 << 20)
    assert [m.member for m in scan.members] == ["torch/lib/libtorch_cuda.so"]
    assert remote.fetched < 200_000 < len(big_cpu_library), remote.fetched   # the 2 MB member was not read


# --- flashinfer-cubin / flashinfer-jit-cache ----------------------------------------------------------------

def test_cubin_coverage_from_member_names_only(tmp_path, cache):
    members = {f"flashinfer_cubin/cubins/h/fmha/trtllm-gen/fmhaSm100aKernel_{i}.cubin": os.urandom(200_000)
               for i in range(3)}
    members["flashinfer_cubin/cubins/h/gemm-1/Gemm_Bfloat16_schedS_sm100f.cubin"] = os.urandom(200_000)
    path = wheel(tmp_path / "w", "flashinfer_cubin-0.6.13-py3-none-any.whl", members)
    reading = measure_one("kernel-arch-coverage", "flashinfer-cubin", path, "0.6.13", SM120, cache)
    assert reading.status is ReadingStatus.UNAVAILABLE, reading
    assert "(sm_100a sm_100f)" in reading.summary
    blackwell = ReadContext(arch="10.0", gpu_count=8, interconnect="nvlink")
    assert measure_one("kernel-arch-coverage", "flashinfer-cubin", path, "0.6.13", blackwell, cache).status \
        is ReadingStatus.AVAILABLE
    remote = RemoteZip(str(path))
    binaries.scan_names(remote, 0)
    assert remote.fetched <= 64 * 1024 < path.stat().st_size / 10   # the tail with the central directory, no member


def test_a_cubin_named_for_no_arch_leaves_the_reading_undecided(tmp_path, cache):
    path = wheel(tmp_path / "w", "flashinfer_cubin-0.6.14-py3-none-any.whl",
                 {"flashinfer_cubin/cubins/h/deep-gemm/kernel.fp8.abc.cubin": b"x",
                  "flashinfer_cubin/cubins/h/gemm/G_sm100f.cubin": b"x"})
    reading = measure_one("kernel-arch-coverage", "flashinfer-cubin", path, "0.6.14", SM120, cache)
    assert reading.status is ReadingStatus.UNDECIDED and "no arch in its name" in reading.summary


# --- bisect and watch --------------------------------------------------------------------------------------

def test_bisect_accepts_torch_kernels_and_kernel_arch_coverage():
    from stackforge.wheels.tier import load_readers, resolve_specs

    readers = load_readers()
    assert [s.dist for s in resolve_specs(readers, "torch-kernels", None)] == ["torch"]
    assert {s.dist for s in resolve_specs(readers, "kernel-arch-coverage", None)} == {
        "flashinfer-cubin", "flashinfer-jit-cache", "sgl-kernel", "sglang-kernel"}


def test_bisect_finds_the_kernel_release_that_gains_the_arch_on_a_server_without_range(tmp_path, monkeypatch):
    from click.testing import CliRunner

    from stackforge.cli import cli

    monkeypatch.setenv("PIP_CONFIG_FILE", os.devnull)
    for name in ("PIP_INDEX_URL", "PIP_EXTRA_INDEX_URL", "PIP_FIND_LINKS", "PIP_NO_INDEX"):
        monkeypatch.delenv(name, raising=False)
    index = LoopbackIndex()
    for version, archs in (("0.4.8", [80, 90]), ("0.4.9", [80, 90]), ("0.4.10", [80, 90, 120])):
        index.add("sglang-kernel", kernel_wheel(tmp_path / version, version, archs))
    url, server = serve(index)   # it answers a Range request with the whole body: read as a stream
    monkeypatch.setenv("STACKFORGE_WHEEL_CACHE", str(tmp_path / "cache"))
    try:
        result = CliRunner().invoke(cli, ["bisect", "kernel-arch-coverage", "--target", "rtx-pro-6000-x8-pcie",
                                           "--package", "sglang-kernel", "--index-url", url])
    finally:
        server.shutdown()
    assert result.exit_code == 0, result.output
    assert "sglang-kernel 0.4.9 (unavailable)" in result.stdout and "-> 0.4.10 (available)" in result.stdout


def test_watch_a_release_of_a_package_no_reader_reads_is_listed_not_news():
    from stackforge.watch.campaign import NO_READER, NewRelease, WatchReport

    listed = NewRelease("nvidia-nccl-cu12", "2.28.1", "", "2.27.5", unread=NO_READER)
    quiet = WatchReport(checked_at="", index="", matrix="", targets=(), baseline={}, newest={}, releases=(listed,))
    assert NO_READER == "listed, not read (no reader)"
    assert not quiet.anything_new
    read = NewRelease("sglang-kernel", "0.4.10", "", "0.4.9")
    assert WatchReport(checked_at="", index="", matrix="", targets=(), baseline={}, newest={},
                       releases=(listed, read)).anything_new


def test_a_member_that_does_not_inflate_is_named_not_fatal(tmp_path, cache):
    path = kernel_wheel(tmp_path / "w", "0.4.11", [120])
    with zipfile.ZipFile(path) as archive:
        info = archive.getinfo("sgl_kernel/common_ops.abi3.so")
    data = bytearray(path.read_bytes())
    name_len, extra_len = struct.unpack_from("<HH", data, info.header_offset + 26)
    data[info.header_offset + 30 + name_len + extra_len] = 0xFF   # a deflate block of the reserved type 3
    path.write_bytes(bytes(data))
    reading = measure_one("kernel-arch-coverage", "sglang-kernel", path, "0.4.11", SM120, cache)
    assert reading.status in (ReadingStatus.UNDECIDED, ReadingStatus.UNAVAILABLE), reading
    assert "not read to the end" in " ".join(site.code for site in reading.sites), reading.sites
