"""A tiny real torch extension for the stack-imports tests, built against one torch's headers and libc10.

The same source, built twice: against the installed torch (2.13.0+cpu from the wheelhouse) it loads;
against torch 2.14.1's headers (read from its wheel in pip's local index, never installed) it uses
``c10::safe_conv``, new in 2.14, whose overflow path calls ``c10::detail::report_narrowing_overflow``,
exported by 2.14's libc10 and not by 2.13's: importing it next to torch 2.13 fails with
``undefined symbol: _ZN3c106detail25report_narrowing_overflowEPKc``, the upgrade failure the probe is for
(an extension built for one torch meeting another). Only c10 is linked (1.6 MB of the 2.14.1 wheel, not
its 450 MB libtorch_cpu); the headers adapt to the torch they come from, as real extensions do.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import subprocess
import sysconfig
import zipfile
from pathlib import Path

import _probe_venvs as venvs
import pytest

SOURCE = r"""
// A torch extension module: the bytes of n floats by c10, narrowed to int32 the way its torch offers.
#include <Python.h>
#include <c10/core/ScalarType.h>
#include <c10/util/Exception.h>
#if __has_include(<c10/util/safe_conv.h>)
#include <c10/util/safe_conv.h>
#define SF_NARROW(v) c10::safe_conv<int32_t>(v, "size")
#else
#define SF_NARROW(v) static_cast<int32_t>(v)
#endif

static PyObject* float_bytes(PyObject*, PyObject* count) {
  int64_t n = PyLong_AsLongLong(count);
  int64_t size = n * static_cast<int64_t>(c10::elementSize(c10::ScalarType::Float));
  TORCH_CHECK(size >= 0, "a negative count: ", n);
  return PyLong_FromLong(SF_NARROW(size));
}

static PyMethodDef methods[] = {{"float_bytes", float_bytes, METH_O, "bytes of n floats (c10::elementSize)"},
                                {nullptr, nullptr, 0, nullptr}};
static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "sfext", nullptr, -1, methods};
PyMODINIT_FUNC PyInit_sfext(void) { return PyModule_Create(&module); }
"""
#: What the extension built against torch 2.14.1 needs that torch 2.13.0's libc10 does not export.
NEW_SYMBOL = "_ZN3c106detail25report_narrowing_overflowEPKc"
NEW_SYMBOL_DEMANGLED = "c10::detail::report_narrowing_overflow(char const*)"
NEW_TORCH = "2.14.1"
CACHE = venvs.VENV_ROOT / f"torch-{NEW_TORCH}-headers"


def installed_torch_dir(python: Path) -> Path:
    done = subprocess.run([str(python), "-c", "import os, torch; print(os.path.dirname(torch.__file__))"],
                          capture_output=True, text=True, timeout=300, check=True)
    return Path(done.stdout.strip())


def new_torch_dir() -> Path:
    """torch 2.14.1's headers and libc10, read out of its wheel once (a file lock keeps sessions apart)."""
    wheel = next((w for w in [venvs.torch_cuda_wheel()] if f"torch-{NEW_TORCH}-" in os.path.basename(w)), None)
    if wheel is None:
        pytest.skip(f"needs the torch {NEW_TORCH} wheel in pip's local index (found {venvs.torch_cuda_wheel()})")
    CACHE.parent.mkdir(parents=True, exist_ok=True)
    marker = CACHE / ".sf-extracted"
    with open(f"{CACHE}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not marker.exists():
            shutil.rmtree(CACHE, ignore_errors=True)
            with zipfile.ZipFile(wheel) as archive:
                archive.extractall(CACHE, [n for n in archive.namelist()
                                           if n.startswith("torch/include/") or n == "torch/lib/libc10.so"])
            marker.write_text(wheel)
    return CACHE / "torch"


def build_extension(torch_dir: Path, out_dir: Path) -> Path:
    """``out_dir/sfext.so`` compiled against ``torch_dir``'s headers and linked to its libc10."""
    out_dir.mkdir(parents=True, exist_ok=True)
    source = out_dir.parent / "sfext.cpp"
    source.write_text(SOURCE)
    compiler = shutil.which("g++")
    if compiler is None:
        pytest.fail("g++ is needed to build the test extension (the machine's compiler)")
    target = out_dir / "sfext.so"
    done = subprocess.run([compiler, "-O1", "-shared", "-fPIC", "-std=c++20", "-w",
                           f"-I{torch_dir / 'include'}", f"-I{sysconfig.get_paths()['include']}", str(source),
                           f"-L{torch_dir / 'lib'}", "-lc10", "-o", str(target)],
                          capture_output=True, text=True, timeout=600, check=False)
    assert done.returncode == 0, f"building the test extension failed:\n{done.stderr[-3000:]}"
    return target


def install_package(site: Path, package: str, torch_dir: Path, torch_pin: str) -> Path:
    """``site/package/sfext.so`` and the dist-info a wheel of it would install (its torch pin in METADATA)."""
    so = build_extension(torch_dir, site / package)
    dist = site / f"{package}-1.0.dist-info"
    dist.mkdir(parents=True, exist_ok=True)
    (dist / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {package}\nVersion: 1.0\n"
                                   f"Requires-Dist: torch=={torch_pin}\n")
    (dist / "top_level.txt").write_text(f"{package}\n")
    (dist / "RECORD").write_text(f"{package}/sfext.so,,\n{dist.name}/METADATA,,\n{dist.name}/RECORD,,\n")
    return so
