"""``_sfstub``: the ``libcuda.so.1`` stand-in written without a compiler, from ``cuda.h``.

* The names: what the header declares and what its macros map them to (versioned and per-thread-stream
  names), comments ignored; a header that is not the driver API's gives none.
* The library: the loader of this machine loads it, finds every name, not one more, and each function
  returns CUDA_ERROR_STUB_LIBRARY (34); its dynamic section names it libcuda.so.1; a library linked
  against it needs libcuda.so.1 and loads with it; the AArch64 flavour carries that machine's code;
  bad input is refused.
"""

from __future__ import annotations

import ctypes
import platform
import shutil
import struct
import subprocess
from pathlib import Path

import _sfprobe as sf  # tests/conftest.py puts the in-image package on sys.path
import _sfstub as stub
import pytest

HEADER = """
/* CUresult CUDAAPI cuInComment(int); is not a declaration */
#if defined(CUDA_API_PER_THREAD_DEFAULT_STREAM)
    #define __CUDA_API_PTDS(api) api ## _ptds
    #define __CUDA_API_PTSZ(api) api ## _ptsz
#else
    #define __CUDA_API_PTDS(api) api
    #define __CUDA_API_PTSZ(api) api
#endif
#define cuCtxCreate                         cuCtxCreate_v4
#define cuMemcpyHtoD                        __CUDA_API_PTDS(cuMemcpyHtoD_v2)
#define cuStreamQuery                       __CUDA_API_PTSZ(cuStreamQuery)
CUresult CUDAAPI cuInit(unsigned int Flags);
CUresult CUDAAPI cuCtxCreate(CUcontext *pctx, CUctxCreateParams *ctxCreateParams,
                             unsigned int flags, CUdevice dev);
CUresult CUDAAPI cuMemcpyHtoD(CUdeviceptr dstDevice, const void *srcHost, size_t ByteCount);
CUresult CUDAAPI cuStreamQuery(CUstream hStream);
// CUresult CUDAAPI cuLineComment(void);
"""


def test_the_names_are_the_declared_ones_and_those_the_macros_map_them_to():
    assert stub.driver_api_names(HEADER) == (
        "cuCtxCreate", "cuCtxCreate_v4", "cuInit", "cuMemcpyHtoD", "cuMemcpyHtoD_v2", "cuMemcpyHtoD_v2_ptds",
        "cuStreamQuery", "cuStreamQuery_ptsz")
    assert stub.driver_api_names("int cudaMalloc(void **p, size_t n);\n#define cuX cuY\n") == ()


@pytest.mark.skipif(platform.machine() not in stub.SUPPORTED_MACHINES, reason="no stand-in for this machine")
def test_this_machines_loader_loads_the_stand_in_and_every_function_returns_the_stub_error(tmp_path):
    names = stub.driver_api_names(HEADER)
    path = tmp_path / "libcuda.so.1"
    path.write_bytes(stub.stub_library(names, platform.machine()))
    library = ctypes.CDLL(str(path))
    assert {name: getattr(library, name)() for name in names} == dict.fromkeys(names, stub.STUB_RESULT)
    with pytest.raises(AttributeError, match="undefined symbol: cuInComment"):
        library.cuInComment
    if shutil.which("readelf"):
        dynamic = subprocess.run(["readelf", "-d", str(path)], capture_output=True, text=True, timeout=60).stdout
        assert "Library soname: [libcuda.so.1]" in dynamic, dynamic


@pytest.mark.skipif(platform.machine() not in stub.SUPPORTED_MACHINES, reason="no stand-in for this machine")
def test_thousands_of_names_hash_and_load(tmp_path):
    """More names than one 64 KiB page of tables: the writable segment still starts on a page of its own."""
    names = [f"cuFunction{i}" for i in range(4000)]
    path = tmp_path / "libcuda.so.1"
    path.write_bytes(stub.stub_library(names, platform.machine()))
    library = ctypes.CDLL(str(path))
    assert library.cuFunction0() == library.cuFunction3999() == stub.STUB_RESULT


@pytest.mark.skipif(platform.machine() not in stub.SUPPORTED_MACHINES, reason="no stand-in for this machine")
def test_a_library_linked_against_the_stand_in_needs_libcuda_and_loads_with_it(tmp_path):
    (tmp_path / "libcuda.so.1").write_bytes(stub.stub_library(["cuInit"], platform.machine()))
    (tmp_path / "user.c").write_text("int cuInit(unsigned int);\nint sf_start(void) { return cuInit(0); }\n")
    user = tmp_path / "libuser.so"
    subprocess.run(["gcc", "-shared", "-fPIC", str(tmp_path / "user.c"), f"-L{tmp_path}", "-l:libcuda.so.1",
                    "-o", str(user)], check=True, capture_output=True, timeout=120)
    assert "libcuda.so.1" in sf.elf_dynamic(str(user)).needed
    ctypes.CDLL(str(tmp_path / "libcuda.so.1"), mode=ctypes.RTLD_GLOBAL)
    assert ctypes.CDLL(str(user)).sf_start() == stub.STUB_RESULT


def test_the_aarch64_stand_in_carries_that_machines_code():
    data = stub.stub_library(["cuInit"], "aarch64")
    assert data[:4] == b"\x7fELF" and struct.unpack_from("<H", data, 18)[0] == 183   # EM_AARCH64
    assert struct.pack("<II", 0x52800440, 0xD65F03C0) in data                         # mov w0, #34; ret


@pytest.mark.parametrize(("names", "machine", "message"), [
    (["cuInit"], "riscv64", "no stub code for 'riscv64'"),
    ([], "x86_64", "C identifiers"),
    (["cuInit; rm -rf /"], "x86_64", "C identifiers"),
])
def test_bad_input_is_refused(names, machine, message):
    with pytest.raises(ValueError, match=message):
        stub.stub_library(names, machine)


def test_the_header_search_looks_in_the_toolkit_and_the_cuda_wheels(tmp_path, monkeypatch):
    home, wheel = tmp_path / "cuda", tmp_path / "site" / "nvidia" / "cuda_runtime"
    for root in (home, wheel):
        (root / "include").mkdir(parents=True)
        (root / "include" / "cuda.h").write_text(HEADER)
    monkeypatch.setenv("CUDA_HOME", str(home))
    monkeypatch.delenv("CUDA_PATH", raising=False)
    monkeypatch.setattr(sf, "site_packages_dirs", lambda: (str(tmp_path / "site"),))
    found = sf.cuda_header_candidates()
    assert found[0] == str(home / "include" / "cuda.h")
    assert str(wheel / "include" / "cuda.h") in found
    assert all(Path(path).name == "cuda.h" for path in found)
