"""Gate probe ``stack-imports``: every compiled module of the stack loads against the stack's torch.

* The pure parts: the symbol and the missing library in a loader's error, a shared object's dynamic
  section read without any tool, how a module is loaded, sgl-kernel's per-arch choice, the torch a
  package says it was built for, and the decision over the loads.
* The script, for real, in the torch 2.13.0+cpu venv: a real extension built against torch 2.14.1's
  headers fails naming ``c10::detail::report_narrowing_overflow(char const*)`` and the torch it was built
  for; the same source built against the installed torch passes; a library whose initialiser hangs is
  that module's timeout (undecided, the rest still loaded), one that segfaults is its crash (fail); one
  that links ``libcuda.so.1`` loads with the toolkit's stub, or with a stand-in written from a ``cuda.h``
  (then a driver function the header lacks is undecided), and is undecided with neither.
* In a real image (``docker``): the same two extensions next to torch 2.13.0+cpu, run by the job runner;
  the default CUDA 13.1 image's real extensions against a stand-in written from its ``cuda.h``.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import _abi_ext as ext
import _probe_venvs as venvs
import pytest
from _build_helpers import small_cell
from _probe_runs import ProbeContext, run_in_container
from _session import SESSION_ID

from stackforge.core.model import Interconnect, Target
from stackforge.core.records import Status
from stackforge.edges.gpus import HostGpus
from stackforge.probes.catalog import catalog
from stackforge.probes.execute import SCRIPTS_DIR, ImageRef

sys.path.insert(0, str(SCRIPTS_DIR))
import stack_imports as si  # the in-image script, imported by path

sys.path.pop(0)
import _sfprobe as sf  # tests/conftest.py puts the in-image package on sys.path

RTX = Target(name="rtx-pro-6000-x8-pcie", gpu="NVIDIA RTX PRO 6000 Blackwell", arch="12.0", gpu_count=8,
             interconnect=Interconnect.PCIE)
SPEC = {probe.id: probe for probe in catalog()}["gate.stack.imports"]
LOADER_ERROR = f"ImportError: /site/sf_abi_new/sfext.so: undefined symbol: {ext.NEW_SYMBOL}"


# --------------------------------------------------------------------------------------------- pure parts

def test_the_symbol_and_the_missing_library_come_out_of_a_loaders_error():
    assert sf.undefined_symbol(LOADER_ERROR) == ext.NEW_SYMBOL
    assert sf.undefined_symbol("OSError: libcuda.so.1: cannot open shared object file: No such file") == ""
    assert sf.missing_library("OSError: libcuda.so.1: cannot open shared object file: No such file") == "libcuda.so.1"
    assert sf.missing_library(LOADER_ERROR) == ""


def test_demangling_uses_cxxfilt_and_leaves_what_it_cannot_read_out():
    if shutil.which("c++filt") is None:
        assert sf.demangle([ext.NEW_SYMBOL]) == {}
        return
    assert sf.demangle([ext.NEW_SYMBOL, "not_mangled", ""]) == {ext.NEW_SYMBOL: ext.NEW_SYMBOL_DEMANGLED}


def test_the_dynamic_section_says_what_a_shared_object_links_and_whether_it_is_a_python_module(tmp_path):
    extension = Path(sysconfig.get_paths()["stdlib"]) / "lib-dynload"
    ctypes_so = next(extension.glob("_ctypes.*.so"), None)
    if ctypes_so is None:
        pytest.fail(f"no _ctypes extension under {extension} to read")
    read = sf.elf_dynamic(str(ctypes_so))
    assert read.py_init == "_ctypes" and read.error == ""
    assert any(name.startswith("libffi") for name in read.needed)
    (tmp_path / "text.so").write_text("INPUT(libfoo.so)\n")  # a linker script named .so
    assert sf.elf_dynamic(str(tmp_path / "text.so")).error == "not an ELF file"


def test_each_module_is_loaded_the_way_its_package_would():
    assert si.load_way(sf.ElfDynamic(("libtorch_python.so",), "common_ops")) == si.PY_EXTENSION
    assert si.load_way(sf.ElfDynamic(("libtvm_ffi.so", "libcudart.so.12"))) == si.TVM_FFI
    assert si.load_way(sf.ElfDynamic(("libc10.so", "libtorch_cpu.so"))) == si.TORCH_LIBRARY
    assert si.load_way(sf.ElfDynamic(("libc.so.6",))) == si.SHARED


def test_sgl_kernel_library_is_the_targets_not_the_visible_gpus():
    both = ["sm100", "sm90"]
    assert si.sgl_kernel_arch_dir(both, sf.parse_arch("9.0"))[0] == "sm90"
    assert si.sgl_kernel_arch_dir(both, sf.parse_arch("12.0"))[0] == "sm100"
    assert si.sgl_kernel_arch_dir(["sm100", "sm120", "sm90"], sf.parse_arch("12.0"))[0] == "sm120"
    chosen, why = si.sgl_kernel_arch_dir(["sm90"], sf.parse_arch("12.0"))
    assert chosen == "" and "no sm100/" in why and "load_utils.py" in why


def test_only_the_missing_driver_makes_a_load_undecided():
    assert si.outcome_state(True, "") == (si.LOADED, "")
    state, why = si.outcome_state(False, "OSError: libcuda.so.1: cannot open shared object file: No such file")
    assert state == si.NO_DRIVER and "stub" in why
    assert si.outcome_state(False, "ModuleNotFoundError: No module named 'common_ops'")[0] == si.NO_DRIVER
    assert si.outcome_state(False, LOADER_ERROR) == (si.FAILED, "")
    assert si.outcome_state(False, "ModuleNotFoundError: No module named 'uvicorn'") == (si.FAILED, "")
    # with a stub standing in for the driver, a driver function it lacks is the host driver's question
    missing_driver_function = "OSError: /site/sgl_kernel/x.so: undefined symbol: cuTensorMapEncodeIm2colWide"
    assert si.outcome_state(False, missing_driver_function) == (si.FAILED, "")
    state, why = si.outcome_state(False, missing_driver_function, stand_in=True)
    assert state == si.NO_DRIVER and "cuTensorMapEncodeIm2colWide" in why and "driver" in why
    assert si.outcome_state(False, LOADER_ERROR, stand_in=True) == (si.FAILED, "")


def test_without_driver_stub_or_header_no_stand_in_is_written(tmp_path, monkeypatch):
    monkeypatch.setattr(sf, "cuda_header_candidates", lambda: ())
    made, line = si.write_stand_in(str(tmp_path / "libcuda.so.1"))
    assert not made and "nor a cuda.h" in line and "undecided" in line
    assert not (tmp_path / "libcuda.so.1").exists()
    header = tmp_path / "cuda.h"
    header.write_text("/* not the driver API */\nint cudaNothing(void);\n")
    monkeypatch.setattr(sf, "cuda_header_candidates", lambda: (str(header),))
    assert not si.write_stand_in(str(tmp_path / "libcuda.so.1"))[0]


def test_an_import_that_fails_inside_a_compiled_file_is_traced_to_that_files_package():
    root = sf.site_packages_dirs()[0]
    inside = si.LoadOutcome(si.LoadTask("sglang.launch_server", si.PY_MODULE, name="sglang.launch_server"), si.FAILED,
                            f"ImportError: {root}/sgl_kernel/sm100/common_ops.abi3.so: undefined symbol: {ext.NEW_SYMBOL}")
    assert si.failing_package(inside) == "sgl_kernel"
    missing = dataclasses.replace(inside, error="ModuleNotFoundError: No module named 'uvicorn'")
    assert si.failing_package(missing) == ""
    assert "built for" not in si.describe_failure(missing, {}, "", "2.13.0+cpu")
    assert "built for: not stated by the package" in si.describe_failure(inside, {}, "", "2.13.0+cpu")


def test_the_torch_a_package_was_built_for_comes_from_its_metadata():
    assert si.torch_pin_text(["torch==2.14.1", "numpy", "torchvision==0.29"], "1.0") == "torch==2.14.1"
    assert si.torch_pin_text(['torch>=2.8; platform_machine == "x86_64"'], "1.0") == "torch>=2.8"
    assert si.torch_pin_text(["torch"], "0.3.0+cu128torch2.8") == "torch 2.8 (version 0.3.0+cu128torch2.8)"
    assert si.torch_pin_text(["torch"], "0.4.1") == ""


def outcome(label: str, state: str, error: str = "", why: str = "") -> si.LoadOutcome:
    return si.LoadOutcome(si.LoadTask(label, si.PY_EXTENSION, f"/site/{label}", "sfext"), state, error, why=why)


TORCH_OK = si.LoadOutcome(si.LoadTask("torch", si.TORCH, name="torch"), si.LOADED, detail="torch 2.13.0+cpu")


def decide(*outcomes: si.LoadOutcome) -> sf.ScriptResult:
    details = {i: si.describe_failure(o, {}, "", "2.13.0+cpu") for i, o in enumerate(outcomes) if o.state != si.LOADED}
    return si.decide(TORCH_OK, outcomes, "2.13.0+cpu", details, ["context"])


def test_the_worst_load_decides():
    ok, bad = outcome("a/ok.so", si.LOADED), outcome("b/new.so", si.FAILED, LOADER_ERROR)
    passed = decide(ok)
    assert passed.status == "pass" and "a/ok.so" in passed.reason and "loaded (1): a/ok.so" in passed.evidence
    failed = decide(ok, bad, outcome("c/hang.so", si.TIMEOUT, "no answer within 3 s"))
    assert failed.status == "fail" and f"b/new.so (failed: undefined symbol {ext.NEW_SYMBOL})" in failed.reason
    assert failed.metrics["by_state"] == {"loaded": ["a/ok.so"], "failed": ["b/new.so"], "timeout": ["c/hang.so"]}
    assert decide(ok, outcome("d/segv.so", si.CRASH, "the loading process died by SIGSEGV")).status == "fail"
    hung = decide(ok, outcome("c/hang.so", si.TIMEOUT, "no answer within 3 s"))
    assert hung.status == "undecided" and "timeout" in hung.reason and "c/hang.so" in hung.reason
    no_driver = decide(ok, outcome("e/cuda.so", si.NO_DRIVER, "libcuda.so.1: cannot open", why="no stub"))
    assert no_driver.status == "undecided" and "e/cuda.so: no stub" in no_driver.reason


def test_a_torch_that_does_not_import_fails_whatever_else():
    broken = si.LoadOutcome(si.LoadTask("torch", si.TORCH, name="torch"), si.FAILED,
                            "ImportError: libtorch_cpu.so: cannot open shared object file")
    result = si.decide(broken, [], "2.13.0+cpu", {}, ["context"])
    assert result.status == "fail" and result.reason.startswith("torch does not import: ImportError")


# --------------------------------------------------------------------------------------------- the script, for real

@pytest.fixture(scope="module")
def torch_python() -> Path:
    return venvs.build_venv("torch-cpu", venvs.torch_steps())


@pytest.fixture(scope="module")
def abi_site(torch_python, tmp_path_factory) -> Path:
    """A site-packages folder with ``sf_abi_new`` (built for torch 2.14.1) and ``sf_abi_ok`` (for the
    installed torch), each with the dist-info its wheel would install."""
    site = tmp_path_factory.mktemp("abi") / "site-packages"
    installed = ext.installed_torch_dir(torch_python)
    ext.install_package(site, "sf_abi_new", ext.new_torch_dir(), ext.NEW_TORCH)
    ext.install_package(site, "sf_abi_ok", installed, "2.13.0+cpu")
    return site


def run_probe(python: Path, site: Path, *args: str, env: dict[str, str] | None = None) -> dict:
    path = os.pathsep.join(p for p in (str(site), os.environ.get("PYTHONPATH", "")) if p)
    proc = subprocess.run([str(python), str(SCRIPTS_DIR / "stack_imports.py"), "--arch", "12.0", *args],
                          capture_output=True, text=True, timeout=600, check=False,
                          env={**os.environ, "PYTHONPATH": path, "PYTHONDONTWRITEBYTECODE": "1", **(env or {})})
    last = proc.stdout.rstrip("\n").splitlines()[-1]
    assert last.startswith("STACKFORGE_RESULT "), proc.stdout[-2000:] + proc.stderr[-2000:]
    return json.loads(last.split(" ", 1)[1])


def test_an_extension_built_for_another_torch_fails_naming_the_symbol(torch_python, abi_site):
    payload = run_probe(torch_python, abi_site, "--package", "sf_abi_new")
    assert payload["status"] == "fail", payload
    assert payload["reason"].startswith("1 of 1 modules do not load against torch 2.13.0+cpu: sf_abi_new/sfext.so")
    assert f"undefined symbol: {ext.NEW_SYMBOL}" in payload["evidence"]
    if shutil.which("c++filt"):
        assert f"{ext.NEW_SYMBOL} = {ext.NEW_SYMBOL_DEMANGLED}" in payload["evidence"]
    assert "built for: torch==2.14.1 (sf_abi_new 1.0 METADATA); installed: torch 2.13.0+cpu" in payload["evidence"]
    assert payload["facts"]["versions"]["torch"] == "2.13.0+cpu"


def test_the_same_extension_built_for_the_installed_torch_passes(torch_python, abi_site):
    payload = run_probe(torch_python, abi_site, "--package", "sf_abi_ok")
    assert payload["status"] == "pass", payload
    assert "sf_abi_ok/sfext.so" in payload["reason"]
    assert payload["metrics"]["by_state"] == {"loaded": ["sf_abi_ok/sfext.so"]}
    assert "torch._C from " in payload["evidence"]
    # torch's build facts come from the loading child's own import: the probe imports torch once
    assert payload["facts"]["torch_version"] == "2.13.0+cpu", payload["facts"]
    assert payload["facts"]["torch_cuda"] is None and payload["facts"]["torch_git_version"]


def test_a_torch_that_does_not_load_is_the_verdict_and_nothing_else_is_tried(torch_python, abi_site, tmp_path):
    """torch is installed, but what ``import torch`` finds raises: that is the stack's failure, the
    extensions are never loaded (each would only fail for torch's reason) and no torch facts are claimed."""
    shadow = tmp_path / "shadow"
    (shadow / "torch").mkdir(parents=True)
    (shadow / "torch" / "__init__.py").write_text("raise ImportError('libtorch_cuda.so: cannot open shared object')\n")
    path = f"{shadow}{os.pathsep}{abi_site}"
    payload = run_probe(torch_python, Path(path), "--package", "sf_abi_ok")
    assert payload["status"] == "fail", payload
    assert payload["reason"].startswith("torch does not import: ImportError: libtorch_cuda.so"), payload["reason"]
    assert "sf_abi_ok/sfext.so" not in payload["reason"]
    assert "torch_version" not in payload["facts"]


C_LIBRARY = r"""
#include <signal.h>
#include <unistd.h>
__attribute__((constructor)) static void on_load(void) {
#if defined(SF_HANG)
  sleep(600);
#elif defined(SF_SEGV)
  raise(SIGSEGV);
#endif
}
#if defined(SF_STUB)
int cuInit(unsigned int flags) { return 34; }  /* CUDA_ERROR_STUB_LIBRARY, as the toolkit's stub answers */
#elif defined(SF_USES_CUDA)
int cuInit(unsigned int flags);
int sf_start_cuda(void) { return cuInit(0); }
#endif
int sf_answer(void) { return 42; }
"""


def build_c_library(out: Path, *flags: str) -> Path:
    out.parent.mkdir(parents=True, exist_ok=True)
    source = out.parent / f"{out.stem}.c"
    source.write_text(C_LIBRARY)
    done = subprocess.run(["gcc", "-shared", "-fPIC", str(source), *flags, "-o", str(out)], capture_output=True,
                          text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    source.unlink()
    return out


def test_a_load_that_hangs_is_its_timeout_and_one_that_crashes_its_crash(torch_python, tmp_path):
    site = tmp_path / "site-packages"
    build_c_library(site / "sf_bad_init" / "a_ok.so")
    build_c_library(site / "sf_bad_init" / "b_hang.so", "-DSF_HANG")
    build_c_library(site / "sf_bad_init" / "c_after.so")
    hung = run_probe(torch_python, site, "--package", "sf_bad_init", "--load-timeout", "5")
    assert hung["status"] == "undecided", hung
    assert "sf_bad_init/b_hang.so after 5 s" in hung["reason"]
    assert hung["metrics"]["by_state"] == {"loaded": ["sf_bad_init/a_ok.so", "sf_bad_init/c_after.so"],
                                           "timeout": ["sf_bad_init/b_hang.so"]}
    build_c_library(site / "sf_bad_init" / "b_hang.so", "-DSF_SEGV")
    crashed = run_probe(torch_python, site, "--package", "sf_bad_init", "--load-timeout", "5")
    assert crashed["status"] == "fail", crashed
    assert "sf_bad_init/b_hang.so (crash: the loading process died by SIGSEGV)" in crashed["reason"]
    assert crashed["metrics"]["by_state"]["loaded"] == ["sf_bad_init/a_ok.so", "sf_bad_init/c_after.so"]


DRIVER_HEADER = """/* the shape of cuda.h: declarations, and macros mapping names to versioned ones */
typedef int CUresult;
#define CUDAAPI
#define cuDriverGetVersion cuDriverGetVersion_v2
CUresult CUDAAPI cuInit(unsigned int Flags);
CUresult CUDAAPI cuDriverGetVersion(int *driverVersion);
"""


def test_libcuda_comes_from_the_stub_or_a_stand_in_written_from_cuda_h(torch_python, tmp_path):
    """A library linking libcuda.so.1 (as sgl-kernel's and FlashInfer's do). The stand-in for the toolkit's
    stub is a library with the stub's soname, libcuda.so.1, at ``$CUDA_HOME/lib64/stubs/libcuda.so``; an
    image without one (runtime-only: no compiler either) gets one written from its ``cuda.h``."""
    stub = build_c_library(tmp_path / "cuda" / "lib64" / "stubs" / "libcuda.so", "-DSF_STUB",
                           "-Wl,-soname,libcuda.so.1")
    site = tmp_path / "site-packages"
    build_c_library(site / "sf_cuda_user" / "uses_cuda.so", "-DSF_USES_CUDA", f"-L{stub.parent}", "-l:libcuda.so")
    assert "libcuda.so.1" in sf.elf_dynamic(str(site / "sf_cuda_user" / "uses_cuda.so")).needed
    with_stub = run_probe(torch_python, site, "--package", "sf_cuda_user", env={"CUDA_HOME": str(tmp_path / "cuda")})
    if "libcuda.so.1: the driver's" in with_stub["evidence"]:
        pytest.skip("this host has a CUDA driver: the no-driver path cannot be seen here")
    assert with_stub["status"] == "pass", with_stub
    assert f"the CUDA link stub {stub} stands in for it" in with_stub["evidence"]

    runtime_only = tmp_path / "runtime-only"
    (runtime_only / "include").mkdir(parents=True)
    (runtime_only / "include" / "cuda.h").write_text(DRIVER_HEADER)
    stand_in = run_probe(torch_python, site, "--package", "sf_cuda_user", env={"CUDA_HOME": str(runtime_only)})
    assert stand_in["status"] == "pass", stand_in
    assert (f"a stand-in written from {runtime_only / 'include' / 'cuda.h'} takes its place: 3 driver-API functions"
            in stand_in["evidence"])

    # a driver function the header does not name: the host's driver decides, not the stack
    (runtime_only / "include" / "cuda.h").write_text(DRIVER_HEADER.replace("cuInit", "cuInitOther"))
    lacking = run_probe(torch_python, site, "--package", "sf_cuda_user", env={"CUDA_HOME": str(runtime_only)})
    assert lacking["status"] == "undecided", lacking
    assert "sf_cuda_user/uses_cuda.so: needs the driver function cuInit, which the stub" in lacking["reason"]


# sgl-kernel's loader as sgl-kernel 0.3.21 / 0.4.10 write it (load_utils.py), cut down: it asks the GPU for its
# compute capability and takes sm90/ on 9.0, sm100/ otherwise and with no GPU. A second common_ops library in
# one process registers the same torch ops again: the real one aborts (c10::Error in a static initialiser).
FAKE_LOADER = """
import ctypes, os
import torch

def _get_compute_capability():
    if not torch.cuda.is_available():
        return None
    major, minor = torch.cuda.get_device_capability()
    return major * 10 + minor

def _load_architecture_specific_ops():
    capability = {reader}
    chosen = "sm90" if capability == 90 else "sm100"
    with open("/proc/self/maps") as maps:
        mapped = maps.read()
    if any(f"/sgl_kernel/{{d}}/common_ops" in mapped for d in ("sm90", "sm100") if d != chosen):
        os.abort()  # Tried to register an operator (sgl_kernel::...) with the same name multiple times
    return ctypes.CDLL(os.path.join(os.path.dirname(__file__), chosen, "common_ops.abi3.so"))
"""


def sgl_kernel_site(tmp_path: Path, reader: str) -> Path:
    """A site-packages with sgl-kernel's per-arch libraries and loader (``reader``: how it reads the
    capability) and an SGLang whose server entry module imports it."""
    site = tmp_path / "site-packages"
    for arch in ("sm90", "sm100"):
        build_c_library(site / "sgl_kernel" / arch / "common_ops.abi3.so")
    (site / "sgl_kernel" / "load_utils.py").write_text(FAKE_LOADER.format(reader=reader))
    (site / "sgl_kernel" / "__init__.py").write_text(
        "from sgl_kernel.load_utils import _load_architecture_specific_ops\n"
        "common_ops = _load_architecture_specific_ops()\n")
    entry = site / "sglang" / "srt" / "entrypoints"
    entry.mkdir(parents=True)
    for folder in (site / "sglang", site / "sglang" / "srt", entry):
        (folder / "__init__.py").write_text("")
    (entry / "http_server.py").write_text("import sgl_kernel\n")
    return site


def test_sgl_kernels_loader_in_the_entry_imports_chooses_for_the_target(torch_python, tmp_path):
    """On a 9.0 target the probe loads sm90/; SGLang's entry module then imports sgl-kernel, whose loader,
    asking a GPU there is not, would take sm100/ beside it and abort the process. Told the target's
    capability, it takes sm90/ itself and everything loads; a loader without the capability reader cannot be
    told, and the abort it meets is undecided, never the stack's failure. On 12.0 both choose sm100/."""
    told = sgl_kernel_site(tmp_path / "told", "_get_compute_capability()")
    h100 = run_probe(torch_python, told, "--arch", "9.0")
    assert h100["status"] == "pass", h100
    assert h100["metrics"]["by_state"]["loaded"][-1:] == ["sglang.srt.entrypoints.http_server"]
    assert "sgl_kernel/sm90/common_ops.abi3.so" in h100["metrics"]["by_state"]["loaded"]
    assert ("sgl-kernel's loader: its _get_compute_capability answered the target's compute capability (90; "
            "no GPU here)") in h100["evidence"]

    inline = sgl_kernel_site(tmp_path / "inline", "(lambda: None)()")   # asks the GPU without the reader
    (inline / "sgl_kernel" / "load_utils.py").write_text(
        (inline / "sgl_kernel" / "load_utils.py").read_text().replace("def _get_compute_capability", "def _gpu"))
    untold = run_probe(torch_python, inline, "--arch", "9.0")
    assert untold["status"] == "undecided", untold
    assert untold["metrics"]["by_state"]["out of context"] == ["sglang.srt.entrypoints.http_server"]
    assert ("no _get_compute_capability to be told the target's compute capability: with no GPU here it took "
            "sm100/ beside the target's sm90/") in untold["reason"]
    assert run_probe(torch_python, inline, "--arch", "12.0")["status"] == "pass"   # sm100/ both times


@pytest.mark.heavy  # a venv and a real probe run
def test_sglangs_entry_modules_are_imported_and_a_missing_dependency_fails(tmp_path):
    """SGLang 0.5.9 installed without its dependencies (the recipe of test_probe_scripts' fi063_python, so
    the venv is shared): its server entry modules do not import, each failure with SGLang's own line."""
    python = venvs.build_venv("fi-0.6.3-sgl-0.5.9", [
        *venvs.flashinfer_steps("0.6.3", "apache-tvm-ffi>=0.1.6,<0.2,!=0.1.8,!=0.1.8.post0"),
        ["--no-deps", "sglang==0.5.9"], list(venvs.SGLANG_059_IMPORT_DEPS)])
    payload = run_probe(python, tmp_path)
    assert payload["status"] == "fail", payload
    assert "sglang.srt.entrypoints.http_server (failed: ModuleNotFoundError: No module named 'uvicorn')" \
        in payload["reason"]
    assert "sglang 0.5.9: server entry modules sglang.srt.entrypoints.http_server" in payload["evidence"]
    assert "sglang/srt/entrypoints/http_server.py:" in payload["evidence"]   # the line that raised
    assert "flashinfer (" in payload["evidence"] and "no shared objects" in payload["evidence"]


@pytest.mark.heavy  # a venv and a real probe run
def test_without_torch_the_stack_fails(tmp_path):
    python = venvs.bare_venv()
    payload = run_probe(python, tmp_path)
    assert payload["status"] == "fail"
    assert payload["reason"] == "torch does not import: torch is not installed in this image"


# --------------------------------------------------------------------------------------------- in a real image

NO_GPU = HostGpus(False, "nvidia-smi not found on the host")


@pytest.mark.docker
def test_in_an_image_the_extension_built_for_another_torch_fails_and_the_matching_one_passes(
        docker_client, base_image, test_labels, torch_python, abi_site, tmp_path):
    context = tmp_path / "context"
    # torch 2.13.0+cpu as the venv holds it (hard links: nothing is copied), then the two extensions.
    shutil.copytree(ext.installed_torch_dir(torch_python).parent, context / "site", copy_function=os.link,
                    ignore=shutil.ignore_patterns("pip", "pip-*", "setuptools*", "_distutils_hack", "*.pth",
                                                  "__pycache__"))
    shutil.copytree(abi_site, context / "site", dirs_exist_ok=True)
    (context / "Dockerfile").write_text(f"FROM {base_image}\nCOPY site/ /usr/local/lib/python3.11/dist-packages/\n")
    tag = f"stackforge-test/stack-imports:{SESSION_ID}"
    image, _ = docker_client.images.build(path=str(context), tag=tag, labels=test_labels, rm=True, forcerm=True)
    try:
        ref = ImageRef(ref=tag, image_id=image.id)
        stack, _ = small_cell()
        ctx = ProbeContext(run_id="test-stack-imports", target=RTX, host_gpus=NO_GPU, timeout_s=600)
        new = run_in_container(docker_client, ref, stack, dataclasses.replace(SPEC, args=("--package", "sf_abi_new")),
                               ctx)
        assert new.outcome.status is Status.FAIL, new.outcome
        assert "sf_abi_new/sfext.so (failed: undefined symbol " + ext.NEW_SYMBOL in new.outcome.reason
        assert "built for: torch==2.14.1 (sf_abi_new 1.0 METADATA); installed: torch 2.13.0+cpu" in new.outcome.evidence
        assert "/usr/local/lib/python3.11/dist-packages/torch/_C." in new.outcome.evidence
        assert new.provenance.versions.get("torch") == "2.13.0+cpu"
        ok = run_in_container(docker_client, ref, stack, dataclasses.replace(SPEC, args=("--package", "sf_abi_ok")), ctx)
        assert ok.outcome.status is Status.PASS, ok.outcome
        assert ok.outcome.metrics["by_state"] == {"loaded": ["sf_abi_ok/sfext.so"]}
    finally:
        docker_client.images.remove(image.id, force=True)


@pytest.mark.docker
@pytest.mark.slow
@pytest.mark.pypi
def test_the_default_13_1_images_real_extensions_load_against_a_stand_in_written_from_its_cuda_h(
        docker_client, default_13_1_image, tmp_path):
    """A runtime-only image has no link stub: with the 13.1 image's stub removed, the probe writes the stand-in
    from the toolkit's ``cuda.h`` and sgl-kernel's, DeepGEMM's and DeepEP's real libraries load against it;
    with the header gone too, nothing stands in and the modules that link libcuda.so.1 are undecided."""
    from _probe_runs import script_result_in
    no_stub = 'rm -rf "$CUDA_HOME/lib64/stubs" && '
    loaded = script_result_in(docker_client, default_13_1_image, "stack_imports.py --arch 12.0", tmp_path,
                              before=no_stub)
    assert loaded["status"] == "pass", loaded
    assert "a stand-in written from /opt/cuda-wheels/nvidia/cu13/include/cuda.h takes its place" in loaded["evidence"]
    assert {"sgl_kernel/sm100/common_ops.abi3.so", "deep_gemm/_C.so"} <= set(loaded["metrics"]["by_state"]["loaded"])
    nothing = script_result_in(docker_client, default_13_1_image, "stack_imports.py --arch 12.0", tmp_path,
                               before=no_stub + 'find / -xdev -name cuda.h -path "*nvidia*" -delete && ')
    assert nothing["status"] == "undecided", nothing
    assert "nor a cuda.h to write a stand-in from" in nothing["evidence"]
    assert "sgl_kernel/sm100/common_ops.abi3.so: links libcuda.so.1" in nothing["reason"]


@pytest.mark.docker
@pytest.mark.slow
@pytest.mark.pypi
def test_the_default_13_1_images_entry_modules_import_for_a_9_0_target(docker_client, default_13_1_image, tmp_path):
    """sglang-kernel 0.4.10 on a 9.0 target: the probe loads sm90/common_ops, and SGLang's entry modules import
    sgl-kernel, whose loader takes sm90/ too when told the target's capability (untold, it took sm100/ beside
    it and the process aborted on the ops registered twice)."""
    from _probe_runs import script_result_in
    h100 = script_result_in(docker_client, default_13_1_image, "stack_imports.py --arch 9.0", tmp_path)
    assert h100["status"] == "pass", h100
    assert {"sgl_kernel/sm90/common_ops.abi3.so", "sglang.srt.entrypoints.http_server"} \
        <= set(h100["metrics"]["by_state"]["loaded"])
    assert "its _get_compute_capability answered the target's compute capability (90" in h100["evidence"]


def test_a_python_extension_tagged_for_another_interpreter_is_never_loaded(tmp_path):
    # sglang-kernel 0.4.10's wheel ships sgl_kernel/infllm_ops.cpython-310-x86_64-linux-gnu.so beside its abi3
    # modules: a 3.11 interpreter's import system never finds it, so loading it by hand is no serving failure.
    import importlib.machinery

    import stack_imports as si

    here = importlib.machinery.EXTENSION_SUFFIXES[0]
    assert si.importable_here(f"common_ops{here}")
    assert si.importable_here("common_ops.abi3.so") and si.importable_here("libfoo.so.1")
    other = "cpython-310" if "cpython-310" not in here else "cpython-311"
    assert not si.importable_here(f"infllm_ops.{other}-x86_64-linux-gnu.so")
    package = tmp_path / "sgl_kernel"
    package.mkdir()
    (package / f"infllm_ops.{other}-x86_64-linux-gnu.so").write_bytes(b"\x7fELF")
    tasks, context = si.package_tasks("sgl_kernel", str(package), si.sf.parse_arch("12.0"), 30)
    assert tasks == []
    assert any("another interpreter" in line and f"infllm_ops.{other}" in line for line in context)
