"""Gate probe ``stack-imports``: every compiled extension of the stack loads against the stack's torch.

An sgl-kernel, FlashInfer, DeepGEMM or DeepEP extension built against another torch fails at import
with ``undefined symbol: _ZN3c10...``: the classic upgrade failure, and one a CPU can see. This probe
loads, with torch already imported, every compiled module the stack's packages ship, the way each
package would:

- torch itself (``import torch``, which loads ``torch._C``);
- Python extension modules (a shared object exporting ``PyInit_X``) through :mod:`importlib`;
  TVM-FFI modules (FlashInfer's AOT / jit-cache modules from 0.5 on, which link ``libtvm_ffi.so``)
  through ``tvm_ffi.load_module``; torch op libraries (linking libtorch / libc10, no ``PyInit_``)
  through ``torch.ops.load_library``; any other shared object through :class:`ctypes.CDLL`;
- sgl-kernel's per-arch ``common_ops`` library *for the target*: its own loader picks the directory
  from the visible GPU (``sm90/`` for compute capability 9.0, ``sm100/`` for any other GPU and for
  none; source: sgl-project/sglang sgl-kernel/python/sgl_kernel/load_utils.py:59-68,
  ``_load_architecture_specific_ops``), and without a GPU newer loaders find none (``No module named
  'common_ops'``), so this probe chooses the file itself (``sm<target>/`` when the wheel has one, else
  the loader's rule) and leaves the other arches' libraries unloaded;
- then SGLang's server entry modules that the installed release has (``sglang.launch_server``,
  ``sglang.srt.entrypoints.http_server``...): importing them runs the import-time checks (FlashInfer's
  version check across its packages, a missing dependency). They import sgl-kernel, whose loader asks the
  GPU for its compute capability; with none here it would take its no-GPU library (``sm100/``) beside the
  target's that this probe loaded (``sm90/`` for 9.0), and two ``common_ops`` libraries register the same
  torch ops: the process aborts, as no serving run does. So the loader's capability reader
  (``_get_compute_capability``) answers the target's capability in the loading child, and the loader makes
  its own choice from it. A loader without that reader cannot be told; then a failed entry import, next to
  a target library other than the no-GPU one, is undecided.

Every load runs in a child process that imports torch first, under a time limit per module (a hang is
that module's ``timeout``; the child is killed and a new one goes on with the next module; a child that
dies by a signal is that module's ``crash``). torch's own load is the first child's first task, and it
reports torch's build facts for the result's provenance, so torch is imported once per child, never in
this process; when it does not load, nothing else is tried. Those objects link ``libcuda.so.1``, which
only a driver provides: where none is installed the image's CUDA link stub
(``$CUDA_HOME/lib64/stubs/libcuda.so``) is put on the child's ``LD_LIBRARY_PATH`` as ``libcuda.so.1``. A
runtime-only image (CUDA wheels without nvcc) has no stub and no compiler to make one, but its CUDA
runtime wheel has ``cuda.h``: a stand-in with every driver-API function that header names is written
from it (``_sfstub.py``). With a stub or a stand-in, a driver function it does not define is undecided
(the host's driver decides that); with neither, a module whose only failure is the missing
``libcuda.so.1`` is undecided, never failed.

Each failure names the file, the error, the undefined symbol (demangled by the image's ``c++filt`` when
it has one, else mangled), and, where the package says, the torch it was built for (its METADATA's
``Requires-Dist: torch`` pin, or a ``torchX.Y`` in its version) next to the torch installed.

Result: ``fail`` when a module fails to load for any reason but the missing driver (or its child crashed),
or torch does not import (or is not installed); ``undecided`` when nothing failed but a load could not be
decided (no driver, stub nor cuda.h, or a load hung past its limit: a script cannot report ``timeout`` itself);
``pass`` with the count and list of modules when everything loaded. No GPU needed.
"""

from __future__ import annotations

import ctypes
import dataclasses
import functools
import importlib
import importlib.abc
import importlib.machinery
import importlib.metadata
import importlib.util
import json
import os
import platform
import re
import select
import signal
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Mapping, Sequence

import _sfprobe as sf
import _sfstub as stub

#: The packages whose compiled modules are loaded (import names, under any site-packages).
DEFAULT_PACKAGES = ("sgl_kernel", "flashinfer", "flashinfer_cubin", "flashinfer_jit_cache", "deep_gemm", "deep_ep")
#: SGLang's server entry modules, as files under the installed ``sglang/``: those the release has are imported.
SGLANG_ENTRY_FILES = ("srt/entrypoints/http_server.py", "srt/entrypoints/engine.py", "srt/server.py",
                      "launch_server.py")
#: sgl-kernel's loader: compute capability 9.0 loads ``sm90/``, every other GPU (and no GPU) ``sm100/``.
SGL_KERNEL_LOADER = "sgl-project/sglang sgl-kernel/python/sgl_kernel/load_utils.py:59-68 (_load_architecture_specific_ops)"
ARCH_DIR = re.compile(r"sm(\d+)")
#: A CUDA driver-API function's name (``cuInit``, ``cuMemcpy_v2``), as an undefined symbol names it.
DRIVER_FUNCTION = re.compile(r"cu[A-Z][A-Za-z0-9_]*")
SHARED_OBJECT = re.compile(r"\.so(\.\d+)*$")
#: A Python extension's file name tag (``.cpython-310-x86_64-linux-gnu.so``, ``.abi3.so``): an interpreter whose
#: importlib.machinery.EXTENSION_SUFFIXES lack it never imports that file.
INTERPRETER_TAG = re.compile(r"\.((?:cpython|pypy)[-\w]*|abi3)\.so$")
LOADER_FLAG = "--loader"
LOADER_FD_ENV = "SF_STACK_IMPORTS_FD"
#: The target's compute capability as sgl-kernel's loader counts it (90 for 9.0), for the loading child.
CAPABILITY_ENV = "SF_STACK_IMPORTS_CAPABILITY"
#: sgl-kernel's loader module, and the reader in it that asks the visible GPU for its compute capability.
SGL_KERNEL_LOADER_MODULE, CAPABILITY_READER = "sgl_kernel.load_utils", "_get_compute_capability"
#: The per-arch library sgl-kernel's loader takes without a GPU (SGL_KERNEL_LOADER).
SGL_KERNEL_NO_GPU_DIR = "sm100"
#: How long a loading child may take between two modules (a restarted one imports torch first).
STARTUP_TIMEOUT_S = 300.0

# How a module is loaded (the way its package would).
TORCH, PY_EXTENSION, TVM_FFI, TORCH_LIBRARY, SHARED, PY_MODULE = (
    "torch", "python extension", "tvm-ffi module", "torch op library", "shared object", "python module")
# What became of one load. NO_DRIVER and OUT_OF_CONTEXT decide nothing (the result is undecided).
LOADED, FAILED, NO_DRIVER, TIMEOUT, CRASH, NOT_RUN = "loaded", "failed", "no driver", "timeout", "crash", "not run"
OUT_OF_CONTEXT = "out of context"
# What sgl-kernel's loader was told in the loading child: the target's capability, nothing (it has no reader
# to answer), or it never ran (no SGLang entry module imported sgl-kernel).
TOLD, NO_READER, NOT_IMPORTED = "told", "no reader", "not imported"

#: Failures that only the missing GPU driver explains, with why: the module is undecided, never failed.
NO_DRIVER_ERRORS = (
    (re.compile(r"libcuda\.so\.1: cannot open shared object file"),
     "links libcuda.so.1, which only a driver provides, and this image has no CUDA link stub to stand in for it"),
    (re.compile(r"No module named 'common_ops'"),
     (f"sgl-kernel's own loader picks its library from the visible GPU ({SGL_KERNEL_LOADER}); without one it "
      "finds none (its library for the target is loaded on its own by this probe)")),
)


@dataclasses.dataclass(frozen=True, slots=True)
class LoadTask:
    """One module to load in the child: ``path`` (a file) or ``name`` (a module to import)."""

    label: str       # what the evidence calls it: the file inside site-packages, or the module name
    how: str         # TORCH, PY_EXTENSION, TVM_FFI, TORCH_LIBRARY, SHARED or PY_MODULE
    path: str = ""
    name: str = ""
    timeout_s: float = 120.0
    package: str = ""  # the import package it belongs to (sgl_kernel), "" for torch / SGLang's modules


@dataclasses.dataclass(frozen=True, slots=True)
class LoadOutcome:
    """What one load did: ``state`` (LOADED, FAILED, NO_DRIVER, OUT_OF_CONTEXT, TIMEOUT, CRASH, NOT_RUN), the
    error as the loader said it, the frame that raised, and the seconds it took."""

    task: LoadTask
    state: str
    error: str = ""
    where: str = ""
    seconds: float = 0.0
    why: str = ""    # for NO_DRIVER / OUT_OF_CONTEXT: why the load decides nothing
    detail: str = ""  # what a load that worked reports (torch: its version and torch._C's file)
    facts: Mapping[str, object] = dataclasses.field(default_factory=dict)  # torch's build facts, from its load


# --------------------------------------------------------------------------------------------
# Pure parts: what to load, and what the loads decide
# --------------------------------------------------------------------------------------------

def load_way(dynamic: sf.ElfDynamic) -> str:
    """How a package loads a shared object, from what it exports and links."""
    if dynamic.py_init:
        return PY_EXTENSION
    if any(n.startswith("libtvm_ffi") for n in dynamic.needed):
        return TVM_FFI
    if any(n.startswith(("libtorch", "libc10")) for n in dynamic.needed):
        return TORCH_LIBRARY
    return SHARED


def sgl_kernel_arch_dir(arch_dirs: Sequence[str], target: sf.Arch) -> tuple[str, str]:
    """(the per-arch directory of sgl-kernel the target loads, why); ("", why) when none applies.

    A wheel with a directory for the target's exact arch (``sm120``) is taken at its word; otherwise the
    package loader's own rule: ``sm90`` on compute capability 9.0, ``sm100`` on any other."""
    exact = f"sm{target.sm}"
    if exact in arch_dirs:
        return exact, f"the wheel has a library for {target.sm_name}"
    chosen = "sm90" if target.sm == 90 else "sm100"
    rule = f"sgl-kernel's loader takes {chosen}/ on compute capability {target.dotted} ({SGL_KERNEL_LOADER})"
    return (chosen, rule) if chosen in arch_dirs else ("", f"{rule}, and this wheel has no {chosen}/")


def no_driver_reason(error: str, stand_in: bool = False) -> str:
    """Why ``error`` says only that no driver is here ("" when it says more: a real failure). With a stub
    standing in for the driver (``stand_in``), a driver-API function the stub does not define is the host
    driver's question (a newer driver may have it), not the stack's."""
    symbol = sf.undefined_symbol(error)
    if symbol:
        if stand_in and DRIVER_FUNCTION.fullmatch(symbol):
            return (f"needs the driver function {symbol}, which the stub standing in for libcuda.so.1 does not "
                    "define: only a GPU host's driver can say whether it has it")
        return ""
    return next((why for pattern, why in NO_DRIVER_ERRORS if pattern.search(error)), "")


def outcome_state(ok: bool, error: str, stand_in: bool = False) -> tuple[str, str]:
    """(LOADED / NO_DRIVER / FAILED, why) of a load that finished (``stand_in``: see :func:`no_driver_reason`)."""
    if ok:
        return LOADED, ""
    why = no_driver_reason(error, stand_in)
    return (NO_DRIVER, why) if why else (FAILED, "")


def torch_pin_text(requires: Sequence[str], version: str) -> str:
    """The torch a distribution says it was built for: its ``Requires-Dist: torch`` pins (markers dropped)
    or a ``torchX.Y`` in its version's local part (``0.3.0+cu128torch2.8``); "" when it says nothing."""
    pins = [r.split(";")[0].strip() for r in requires if re.match(r"torch(?![\w.-])", r.strip())]
    pins = [p for p in pins if p != "torch"]
    local = re.search(r"\+.*?torch(\d+(?:\.\d+)*)", version)
    parts = pins + ([f"torch {local.group(1)} (version {version})"] if local else [])
    return ", ".join(parts)


def describe_failure(outcome: LoadOutcome, demangled: Mapping[str, str], built_for: str, torch_version: str) -> str:
    """The evidence lines of one module that did not load."""
    task = outcome.task
    head = f"{outcome.state.upper()} {task.label} [{task.how}{f' {task.name}' if task.name else ''}]"
    lines = [f"{head}: {outcome.error or outcome.why}"]
    if outcome.where:
        lines.append(f"  raised at {outcome.where}")
    symbol = sf.undefined_symbol(outcome.error)
    if symbol:
        lines.append(f"  undefined symbol {symbol}" + (f" = {demangled[symbol]}" if symbol in demangled else
                                                        " (no c++filt in this image: mangled name)"))
    if outcome.state in (NO_DRIVER, OUT_OF_CONTEXT):
        lines.append(f"  undecided: {outcome.why}")
    if outcome.state == CRASH or symbol or (outcome.state == FAILED and task.how != PY_MODULE):
        lines.append(f"  built for: {built_for or 'not stated by the package'}; installed: torch {torch_version}")
    return "\n".join(lines)


def decide(torch_outcome: LoadOutcome, outcomes: Sequence[LoadOutcome], torch_version: str,
           details: Mapping[int, str], context: Sequence[str],
           demangled: Mapping[str, str] | None = None) -> sf.ScriptResult:
    """The result of the loads: ``details`` holds the failure lines of ``outcomes`` by index."""
    metrics: dict[str, object] = {
        "torch": torch_version, "modules": len(outcomes),
        "by_state": {state: [o.task.label for o in outcomes if o.state == state]
                     for state in (LOADED, FAILED, CRASH, TIMEOUT, NO_DRIVER, OUT_OF_CONTEXT, NOT_RUN)
                     if any(o.state == state for o in outcomes)},
        "seconds": {o.task.label: round(o.seconds, 2) for o in outcomes if o.state != NOT_RUN},
    }
    if torch_outcome.state != LOADED:
        error = torch_outcome.error or torch_outcome.why or torch_outcome.state
        return sf.ScriptResult("fail", f"torch does not import: {error}",
                               "\n".join([*context, describe_failure(torch_outcome, {}, "", "none")]), metrics)
    bad = [o for o in outcomes if o.state in (FAILED, CRASH)]
    hung = [o for o in outcomes if o.state == TIMEOUT]
    undecided = [o for o in outcomes if o.state in (NO_DRIVER, OUT_OF_CONTEXT)]
    loaded = [o for o in outcomes if o.state == LOADED]
    failure_lines = [details[i] for i, o in enumerate(outcomes) if o.state != LOADED and i in details]
    listing = [f"loaded ({len(loaded)}): " + ", ".join(o.task.label for o in loaded)] if loaded else []
    evidence = "\n".join([*context, *failure_lines, *listing])
    against = f"torch {torch_version}"
    if bad:
        return sf.ScriptResult("fail", f"{len(bad)} of {len(outcomes)} modules do not load against {against}: "
                               + "; ".join(short_failure(o, demangled or {}) for o in bad), evidence, metrics)
    if hung:
        return sf.ScriptResult("undecided", f"{len(hung)} load(s) did not finish within their limit (timeout: "
                               + ", ".join(f"{o.task.label} after {o.task.timeout_s:g} s" for o in hung)
                               + f"); nothing else failed against {against}", evidence, metrics)
    if undecided:
        return sf.ScriptResult("undecided", f"{len(undecided)} module(s) need what only a GPU host has ("
                               + "; ".join(f"{o.task.label}: {o.why}" for o in undecided)
                               + f"); the other {len(loaded)} load against {against}", evidence, metrics)
    return sf.ScriptResult("pass", f"{against} imports and all {len(loaded)} modules load against it: "
                           + (", ".join(o.task.label for o in loaded) or "(no compiled module besides torch's)"),
                           evidence, metrics)


def target_library_dir(outcomes: Sequence[LoadOutcome]) -> str:
    """The per-arch directory of the sgl-kernel library this probe loaded for the target (``sm90`` on a 9.0
    target) when it is not the one sgl-kernel's loader takes without a GPU; "" otherwise."""
    for outcome in outcomes:
        parts = outcome.task.label.split("/")
        if (outcome.task.package == "sgl_kernel" and len(parts) > 2 and ARCH_DIR.fullmatch(parts[1])
                and parts[1] != SGL_KERNEL_NO_GPU_DIR):
            return parts[1]
    return ""


def without_target_capability(outcomes: Sequence[LoadOutcome], loader: str) -> list[LoadOutcome]:
    """The outcomes, with the failed imports of SGLang's entry modules undecided where sgl-kernel's loader could
    not be told the target's capability (``loader`` is NO_READER) and chose its no-GPU library next to the
    target's other one this probe loaded: two libraries registering the same torch ops, which no serving run
    loads together, so what failed there says nothing of the stack."""
    other = target_library_dir(outcomes)
    if loader != NO_READER or not other:
        return list(outcomes)
    why = (f"sgl-kernel's loader has no {CAPABILITY_READER} to be told the target's compute capability: with no GPU "
           f"here it took {SGL_KERNEL_NO_GPU_DIR}/ beside the target's {other}/ this probe loaded, which no serving "
           "run loads together")
    return [dataclasses.replace(o, state=OUT_OF_CONTEXT, why=why)
            if o.task.how == PY_MODULE and o.state in (FAILED, CRASH) else o for o in outcomes]


def loader_line(loader: str, target: sf.Arch) -> list[str]:
    """The evidence line of how sgl-kernel's loader chose its library in the loading child (none when it never ran)."""
    if loader == TOLD:
        return [f"sgl-kernel's loader: its {CAPABILITY_READER} answered the target's compute capability "
                f"({target.sm}; no GPU here), and the loader chose its library from that"]
    if loader == NO_READER:
        return [f"sgl-kernel's loader: no {CAPABILITY_READER} in {SGL_KERNEL_LOADER_MODULE}: it chose its library "
                "without the target's compute capability"]
    return []


def short_failure(outcome: LoadOutcome, demangled: Mapping[str, str]) -> str:
    symbol = sf.undefined_symbol(outcome.error)
    readable = f" = {demangled[symbol]}" if symbol in demangled else ""
    what = f"undefined symbol {symbol}{readable}" if symbol else sf.one_line(outcome.error)[:200]
    return f"{outcome.task.label} ({outcome.state}: {what})"


# --------------------------------------------------------------------------------------------
# Discovery in the image
# --------------------------------------------------------------------------------------------

def importable_here(filename: str) -> bool:
    """False for a Python extension tagged for another interpreter (``x.cpython-310-...so`` under 3.11): the
    import system never loads it, so loading it by hand would report a failure no serving run meets."""
    tag = INTERPRETER_TAG.search(filename)
    return tag is None or tag.group(0) in importlib.machinery.EXTENSION_SUFFIXES


def shared_objects(root: str) -> list[str]:
    files = []
    for directory, subdirs, names in os.walk(root):
        subdirs[:] = sorted(d for d in subdirs if d != "__pycache__")
        files += [os.path.join(directory, n) for n in sorted(names) if SHARED_OBJECT.search(n)]
    return files


def package_tasks(name: str, root: str, target: sf.Arch, timeout_s: float) -> tuple[list[LoadTask], list[str]]:
    """(the loads of one package's compiled modules, context lines: what was chosen or left out and why)."""
    site = os.path.dirname(root)
    tasks, context, skipped = [], [], []
    arch_dirs = sorted(d for d in os.listdir(root) if ARCH_DIR.fullmatch(d) and os.path.isdir(os.path.join(root, d)))
    chosen = ""
    if name == "sgl_kernel" and arch_dirs:
        chosen, why = sgl_kernel_arch_dir(arch_dirs, target)
        context.append(f"{name}: per-arch libraries in {', '.join(d + '/' for d in arch_dirs)}; loads "
                       f"{chosen + '/' if chosen else 'none of them'} for {target.sm_name}: {why}")
    other_python = []
    for path in shared_objects(root):
        relative = os.path.relpath(path, root).split(os.sep)
        if chosen and len(relative) > 1 and relative[0] in arch_dirs and relative[0] != chosen:
            skipped.append(os.path.relpath(path, site))
            continue
        if not importable_here(os.path.basename(path)):
            other_python.append(os.path.relpath(path, site))
            continue
        dynamic = sf.elf_dynamic(path)
        if dynamic.error:
            context.append(f"{os.path.relpath(path, site)}: not loaded: {dynamic.error}")
            continue
        tasks.append(LoadTask(os.path.relpath(path, site), load_way(dynamic), path, dynamic.py_init, timeout_s, name))
    if skipped:
        context.append(f"{name}: not loaded, built for other arches: {', '.join(skipped)}")
    if other_python:
        context.append(f"{name}: not loaded, Python extensions for another interpreter, which this Python's import "
                       f"system never finds (its suffixes: {' '.join(importlib.machinery.EXTENSION_SUFFIXES)}): "
                       f"{', '.join(other_python)}")
    if not tasks:
        context.append(f"{name} ({root}): no shared objects")
    return tasks, context


def sglang_entry_tasks(timeout_s: float) -> tuple[list[LoadTask], list[str]]:
    """The imports of SGLang's server entry modules that the installed release has."""
    found = sf.package_dirs(("sglang",))
    if "sglang" not in found:
        return [], ["sglang: not installed (no server entry modules to import)"]
    root = found["sglang"]
    modules = ["sglang." + f[:-3].replace("/", ".") for f in SGLANG_ENTRY_FILES if os.path.isfile(os.path.join(root, f))]
    if not modules:
        return [], [f"sglang ({root}): none of {', '.join(SGLANG_ENTRY_FILES)} in this release"]
    return ([LoadTask(m, PY_MODULE, name=m, timeout_s=timeout_s) for m in modules],
            [f"sglang {sf.installed_version('sglang') or '?'}: server entry modules {', '.join(modules)}"])


def failing_package(outcome: LoadOutcome) -> str:
    """The import package of the compiled file that failed: the task's own, or for an import that failed
    inside (SGLang importing sgl-kernel) the package of the ``.so`` its error names."""
    if outcome.task.package:
        return outcome.task.package
    named = re.search(r"(/\S+\.so(?:\.\d+)*)", outcome.error)
    for root in sf.site_packages_dirs() if named else ():
        relative = os.path.relpath(named.group(1), root)
        if not relative.startswith(".."):
            return relative.split(os.sep)[0]
    return ""


@functools.lru_cache(maxsize=None)
def built_for(package: str) -> str:
    """The torch the distribution that installed ``package`` says it was built for ("" when it says none);
    asked once per package (each failing module of one package asks again, and the lookup reads every
    distribution's metadata)."""
    try:
        dists = importlib.metadata.packages_distributions().get(package, [])
    except Exception:  # noqa: BLE001 - broken metadata of another distribution
        return ""
    parts = []
    for dist in dict.fromkeys(dists):
        try:
            meta = importlib.metadata.distribution(dist)
        except importlib.metadata.PackageNotFoundError:
            continue
        text = torch_pin_text(meta.requires or [], meta.version)
        if text:
            parts.append(f"{text} ({dist} {meta.version} METADATA)")
    return "; ".join(parts)


def driver_library() -> str:
    """A real ``libcuda.so.1`` the loader finds (ldconfig's cache or LD_LIBRARY_PATH), "" when none."""
    for directory in filter(None, os.environ.get("LD_LIBRARY_PATH", "").split(":")):
        path = os.path.join(directory, "libcuda.so.1")
        if os.path.exists(path) and "stubs" not in path:
            return path
    for ldconfig in ("/sbin/ldconfig", "/usr/sbin/ldconfig", "ldconfig"):
        listed = sf.run_command([ldconfig, "-p"], 30)
        if listed.ok:
            for line in listed.stdout.splitlines():
                if line.strip().startswith("libcuda.so.1 ") and "stubs" not in line:
                    return line.rsplit("=>", 1)[-1].strip()
            return ""
    return ""


@dataclasses.dataclass(frozen=True, slots=True)
class LibcudaChoice:
    """Which ``libcuda.so.1`` the loading children find (the driver's, a stub, or none): ``env`` is theirs,
    ``line`` says it for the evidence; ``stand_in``: a stub takes the driver's place (a driver function it
    lacks is then the host driver's question)."""

    env: Mapping[str, str]
    line: str
    stand_in: bool = False


def child_environment(workdir: str) -> LibcudaChoice:
    """The loading children's environment: the driver's ``libcuda.so.1`` where one is installed; else the
    image's CUDA link stub; else a stand-in written from the image's ``cuda.h`` (:mod:`_sfstub`: a
    runtime-only image has neither compiler nor stub); else none, and a module that needs it is undecided."""
    env = dict(os.environ)
    driver = driver_library()
    if driver:
        return LibcudaChoice(env, f"libcuda.so.1: the driver's ({driver})")
    link_dir = os.path.join(workdir, "libcuda-stub")
    os.makedirs(link_dir, exist_ok=True)
    stubs = sf.libcuda_stub_candidates()
    if stubs:
        os.symlink(stubs[0], os.path.join(link_dir, "libcuda.so.1"))
        line = f"libcuda.so.1: no driver here; the CUDA link stub {stubs[0]} stands in for it (loads only, no calls)"
        search = (link_dir, os.path.dirname(stubs[0]))
    else:
        made, line = write_stand_in(os.path.join(link_dir, "libcuda.so.1"))
        if not made:
            return LibcudaChoice(env, line)
        search = (link_dir,)
    env["LD_LIBRARY_PATH"] = ":".join(filter(None, (*search, env.get("LD_LIBRARY_PATH", ""))))
    return LibcudaChoice(env, line, stand_in=True)


def write_stand_in(path: str) -> tuple[bool, str]:
    """(whether a ``libcuda.so.1`` stand-in was written at ``path`` from the image's ``cuda.h``, the line
    that says so or why not)."""
    nothing = ("libcuda.so.1: no driver and no CUDA link stub in this image (looked in $CUDA_HOME/lib64/stubs, "
               "/usr/local/cuda/lib64/stubs and the CUDA wheels)")
    machine = platform.machine()
    if machine not in stub.SUPPORTED_MACHINES:
        return False, f"{nothing}, and no stand-in is written for {machine}; a module that needs it is undecided"
    for header in sf.cuda_header_candidates():
        try:
            with open(header, encoding="utf-8", errors="replace") as handle:
                names = stub.driver_api_names(handle.read())
        except OSError:
            continue
        if names:
            with open(path, "wb") as handle:
                handle.write(stub.stub_library(names, machine))
            return True, (f"{nothing}; a stand-in written from {header} takes its place: {len(names)} driver-API "
                          f"functions, each returning CUDA_ERROR_STUB_LIBRARY (loads only, no calls)")
    return False, f"{nothing}, nor a cuda.h to write a stand-in from; a module that needs it is undecided"


# --------------------------------------------------------------------------------------------
# The loads: a child process, watched module by module
# --------------------------------------------------------------------------------------------

def run_loads(tasks: Sequence[LoadTask], libcuda: LibcudaChoice, workdir: str,
              target: sf.Arch) -> tuple[list[LoadOutcome], str, str]:
    """Load ``tasks`` in order in child processes (a new one after a hang or a crash); (outcomes, the
    children's output tail, what sgl-kernel's loader was told: TOLD, NO_READER or NOT_IMPORTED). The first
    task is torch: when it does not load, nothing else is tried (every other load would fail for torch's
    reason, not its own) and the rest stay NOT_RUN."""
    plan = os.path.join(workdir, "tasks.json")
    with open(plan, "w", encoding="utf-8") as handle:
        json.dump([dataclasses.asdict(t) for t in tasks], handle)
    outcomes: dict[int, LoadOutcome] = {}
    loader = {"told": NOT_IMPORTED}
    child = dataclasses.replace(libcuda, env={**libcuda.env, CAPABILITY_ENV: str(target.sm)})
    log_path = os.path.join(workdir, "children.log")
    start = 0
    while start < len(tasks) and (0 not in outcomes or outcomes[0].state == LOADED):
        start = run_child(tasks, plan, start, child, log_path, outcomes, loader)
    log = ""
    if os.path.exists(log_path):
        with open(log_path, encoding="utf-8", errors="replace") as handle:
            log = handle.read()
    return [outcomes.get(i, LoadOutcome(t, NOT_RUN)) for i, t in enumerate(tasks)], log[-3000:], loader["told"]


def run_child(tasks: Sequence[LoadTask], plan: str, start: int, libcuda: LibcudaChoice, log_path: str,
              outcomes: dict[int, LoadOutcome], loader: dict[str, str]) -> int:
    """One child from task ``start`` on; fills ``outcomes`` and ``loader`` (what sgl-kernel's loader was told);
    returns where the next child starts."""
    read_fd, write_fd = os.pipe()
    with open(log_path, "a", encoding="utf-8") as log:
        try:
            proc = subprocess.Popen([sys.executable, os.path.abspath(__file__), LOADER_FLAG, plan, str(start)],
                                    stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                    env={**libcuda.env, LOADER_FD_ENV: str(write_fd)}, pass_fds=(write_fd,),
                                    start_new_session=True)
        except OSError as exc:
            os.close(read_fd)
            os.close(write_fd)
            for i in range(start, len(tasks)):
                outcomes[i] = LoadOutcome(tasks[i], FAILED, f"could not start the loader: {sf.describe_exception(exc)}")
            return len(tasks)
    os.close(write_fd)
    current, began, buffer = None, time.monotonic(), b""
    try:
        while True:
            limit = tasks[current].timeout_s if current is not None else STARTUP_TIMEOUT_S
            left = began + limit - time.monotonic()
            ready, _, _ = select.select([read_fd], [], [], max(left, 0))
            if not ready:
                kill_group(proc)
                if current is None:  # the child hung before its first module (its own `import torch`)
                    current = start
                outcomes[current] = LoadOutcome(tasks[current], TIMEOUT, f"no answer within {limit:g} s",
                                                seconds=time.monotonic() - began)
                return current + 1
            chunk = os.read(read_fd, 65536)
            if not chunk:
                code = proc.wait()
                if current is None:
                    return len(tasks) if all(i in outcomes for i in range(start, len(tasks))) else \
                        crash_before_start(tasks, start, code, outcomes)
                name = signal_text(code)
                outcomes[current] = LoadOutcome(tasks[current], CRASH, f"the loading process {name}",
                                                seconds=time.monotonic() - began)
                return current + 1
            buffer += chunk
            while b"\n" in buffer:
                line, buffer = buffer.split(b"\n", 1)
                event = json.loads(line)
                if event["event"] == "start":
                    current, began = event["i"], time.monotonic()
                elif event["event"] == "loader":
                    loader["told"] = event["told"]
                else:
                    state, why = outcome_state(event["ok"], event.get("error", ""), libcuda.stand_in)
                    outcomes[event["i"]] = LoadOutcome(tasks[event["i"]], state, event.get("error", ""),
                                                       event.get("where", ""), time.monotonic() - began, why,
                                                       event.get("detail", ""), event.get("facts", {}))
                    current, began = None, time.monotonic()
                    if event["i"] == 0 and state != LOADED:
                        return len(tasks)  # torch did not load: run_loads tries nothing else
    finally:
        os.close(read_fd)
        if proc.poll() is None:
            kill_group(proc)


def crash_before_start(tasks: Sequence[LoadTask], start: int, code: int, outcomes: dict[int, LoadOutcome]) -> int:
    """A child that ended between modules without finishing them all: the next one is its crash."""
    index = next(i for i in range(start, len(tasks)) if i not in outcomes)
    outcomes[index] = LoadOutcome(tasks[index], CRASH, f"the loading process {signal_text(code)} before it")
    return index + 1


def signal_text(code: int) -> str:
    if code < 0:
        try:
            return f"died by {signal.Signals(-code).name}"
        except ValueError:
            return f"died by signal {-code}"
    return f"exited with status {code}"


def kill_group(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    proc.wait()


# --------------------------------------------------------------------------------------------
# The child: loads the modules, one event line per start and end
# --------------------------------------------------------------------------------------------

def load(task: Mapping[str, str]) -> str:
    """Load one module the way its package would (torch is imported before any of them, also in a child
    started again after a hang or a crash); what it reports."""
    how, path, name = task["how"], task["path"], task["name"]
    torch = importlib.import_module("torch")
    if how == TORCH:  # import torch loads torch._C; an unloadable one has raised already
        return f"torch {torch.__version__}, torch._C from {getattr(torch._C, '__file__', '?')}"
    if how == PY_EXTENSION:
        spec = importlib.util.spec_from_file_location(name, path)
        if spec is None or spec.loader is None:
            raise ImportError(f"no import spec for {path}")
        spec.loader.exec_module(importlib.util.module_from_spec(spec))
    elif how == TVM_FFI:
        importlib.import_module("tvm_ffi").load_module(path)
    elif how == TORCH_LIBRARY:
        torch.ops.load_library(path)
    elif how == SHARED:
        ctypes.CDLL(path)
    else:
        importlib.import_module(name)
    return ""


class TargetCapability(importlib.abc.MetaPathFinder):
    """Finds sgl-kernel's loader module as the import system would and, once its code has run, makes its
    capability reader answer the target's compute capability (there is no GPU to ask), so the loader picks
    its per-arch library for the target by its own rule; ``report`` is told whether the reader was there."""

    def __init__(self, capability: int, report) -> None:
        self.capability, self.report = capability, report

    def find_spec(self, fullname, path=None, target=None):
        if fullname != SGL_KERNEL_LOADER_MODULE:
            return None
        spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        run, capability, report = spec.loader.exec_module, self.capability, self.report

        def exec_module(module):
            run(module)
            told = callable(getattr(module, CAPABILITY_READER, None))
            if told:
                setattr(module, CAPABILITY_READER, lambda: capability)
            report(TOLD if told else NO_READER)

        spec.loader.exec_module = exec_module
        return spec


def torch_facts_of(task: Mapping[str, str]) -> dict[str, object]:
    """``{"facts": torch's build facts}`` after torch's own load, so the probe's provenance needs no
    import of torch in the parent; {} for any other task, or when torch cannot say."""
    if task["how"] != TORCH:
        return {}
    try:
        return {"facts": json.loads(json.dumps(sf.torch_facts(sys.modules["torch"]), default=str))}
    except Exception:  # noqa: BLE001 - provenance only; the load itself worked
        return {}


def raised_at(exc: BaseException) -> str:
    """The file and line that raised, past the import system's frozen frames and this loader's own."""
    here = os.path.abspath(__file__)
    frames = [f for f in traceback.extract_tb(exc.__traceback__)
              if not f.filename.startswith("<frozen") and os.path.abspath(f.filename) != here]
    return f"{frames[-1].filename}:{frames[-1].lineno}" if frames else ""


def loader_main(plan: str, start: int) -> None:
    events = os.fdopen(int(os.environ[LOADER_FD_ENV]), "w", buffering=1)
    with open(plan, encoding="utf-8") as handle:
        tasks = json.load(handle)
    if os.environ.get(CAPABILITY_ENV, "").isdigit():
        sys.meta_path.insert(0, TargetCapability(int(os.environ[CAPABILITY_ENV]), lambda told: events.write(
            json.dumps({"event": "loader", "told": told}) + "\n")))
    for index in range(start, len(tasks)):
        events.write(json.dumps({"i": index, "event": "start"}) + "\n")
        try:
            detail = load(tasks[index])
        except BaseException as exc:  # noqa: BLE001 - every failure is evidence
            event = {"ok": False, "error": sf.describe_exception(exc)[:4000], "where": raised_at(exc)}
        else:
            event = {"ok": True, "detail": detail, **torch_facts_of(tasks[index])}
        events.write(json.dumps({"i": index, "event": "done", **event}) + "\n")
    events.flush()
    os._exit(0)  # no atexit hook of a loaded library may hang the child after its last answer


# --------------------------------------------------------------------------------------------
# main
# --------------------------------------------------------------------------------------------

def main(argv: Sequence[str]) -> None:
    parser = sf.common_parser(__doc__.splitlines()[0])
    parser.add_argument("--package", action="append", default=[], help="another import package to load")
    parser.add_argument("--load-timeout", type=float, default=120.0, help="seconds one compiled module may take")
    parser.add_argument("--import-timeout", type=float, default=300.0,
                        help="seconds torch's or an SGLang entry module's import may take")
    args = parser.parse_args(argv)
    torch_version = sf.installed_version("torch")
    if torch_version is None:
        sf.emit("fail", "torch does not import: torch is not installed in this image",
                evidence="searched: " + ", ".join(sf.site_packages_dirs()),
                facts=sf.collect_facts(import_torch=False, search_nvcc=False))
    context = [f"target {args.arch.sm_name}; installed torch {torch_version}"]
    tasks = []
    for name, root in sorted(sf.package_dirs((*DEFAULT_PACKAGES, *args.package)).items()):
        found, lines = package_tasks(name, root, args.arch, args.load_timeout)
        tasks += found
        context += lines
    entries, lines = sglang_entry_tasks(args.import_timeout)
    context += lines
    with tempfile.TemporaryDirectory(prefix="sf-stack-imports-") as workdir:
        libcuda = child_environment(workdir)
        # torch first, in the same child as the rest: without it every other load fails for its
        # reason, not their own, and run_loads then tries nothing else.
        torch_task = LoadTask("torch", TORCH, name="torch", timeout_s=args.import_timeout)
        (torch_outcome, *outcomes), log, loader = run_loads([torch_task, *tasks, *entries], libcuda, workdir,
                                                            args.arch)
        outcomes = without_target_capability(outcomes, loader) if torch_outcome.state == LOADED else []
    context += [libcuda.line, *loader_line(loader, args.arch), f"torch: {torch_outcome.detail or torch_outcome.error}"]
    facts = {**sf.collect_facts(import_torch=False, search_nvcc=False), **torch_outcome.facts}
    demangled = sf.demangle([sf.undefined_symbol(o.error) for o in (torch_outcome, *outcomes)])
    details = {i: describe_failure(o, demangled, built_for(failing_package(o)) if failing_package(o) else "",
                                   torch_version)
               for i, o in enumerate(outcomes) if o.state != LOADED}
    if any(o.state in (CRASH, TIMEOUT) for o in (torch_outcome, *outcomes)) and log.strip():
        context.append("loading processes' last output:\n" + log[-1500:])
    result = decide(torch_outcome, outcomes, torch_version, details, context, demangled)
    sf.emit_result(result, facts, {"demangled": demangled} if demangled else None)

if __name__ == "__main__":
    if sys.argv[1:2] == [LOADER_FLAG]:
        loader_main(sys.argv[2], int(sys.argv[3]))
    sf.run_main(main, sys.argv[1:])
