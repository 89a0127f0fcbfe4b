"""Gate probe for SGLang's own JIT kernels on a target arch: feature ``sglang-jit``.

SGLang JIT-compiles kernels of its own at serving time, apart from FlashInfer's: every run on CUDA
builds the KV-cache ``store_cache`` kernel the first time the memory pool writes a layer's K/V
(``can_use_store_cache(row_bytes)``, then ``store_cache``):

- sglang 0.5.9 wheel: ``sglang/srt/mem_cache/memory_pool.py:39`` imports it from
  ``sglang/jit_kernel/kvcache.py`` (``_jit_kvcache_module`` :20, ``can_use_store_cache`` :31), which
  builds through ``sglang/jit_kernel/utils.py:93`` ``load_jit`` -> ``tvm_ffi.cpp.load_inline``
  (apache-tvm-ffi 0.1.11 wheel: ``tvm_ffi/cpp/extension.py:583`` ``build_ninja`` runs ninja, then
  ``load_module``; cache ``$TVM_FFI_CACHE_DIR``); the arch is ``TVM_FFI_CUDA_ARCH_LIST``, which
  ``load_jit`` sets from ``torch.cuda.get_device_capability`` unless the image already sets it (:156-160).
- sglang 0.5.23 wheel: ``sglang/srt/mem_cache/memory_pool.py:48`` imports it from
  ``sglang/kernels/ops/kvcache/kvcache.py`` (``_jit_kvcache_module`` :26, ``can_use_store_cache`` :52),
  built by ``sglang/kernels/jit/utils/compile/loader.py:49`` ``load_jit``: its own build.ninja
  (``compile/ninja.py:74`` ``generate``, ``:138`` ``build``; link ``-L$CUDA_HOME/lib64 -lcudart``,
  ``compile/toolchain.py:244``), then ``_load`` (:270, ``tvm_ffi.load_module``), then a content-addressed
  cache under ``$SGLANG_JIT_CACHE_DIR`` (``compile/cache.py:317``). The arch is the local GPU's
  (``utils/arch.py:105`` ``_init_jit_cuda_arch_once``, with SGLang's ``a``/``f`` suffix :82-101);
  ``override_jit_cuda_arch(major, minor)`` (:163) is SGLang's own knob "to compile for an arch the
  local GPU is not".

The probe calls that same serving entry point, ``can_use_store_cache``, inside the image, with the
target's arch given through the release's own knob (``override_jit_cuda_arch``; for the 0.5.9 layout,
torch reporting a device of the target capability, from which SGLang computes
``TVM_FFI_CUDA_ARCH_LIST`` itself). It watches SGLang's build step and its load step (the functions
named in :data:`LAYOUTS`, wrapped, not replaced) to tell a module that did not compile or link from one
that built: a link failure is ``fail`` in the linker's words; a build past ``--build-timeout`` is
``timeout`` (the build runs in a child process whose whole process group is killed at the limit); a
module built is a ``pass`` with ``metrics["evidence_level"] = "built"``. tvm-ffi then loads the module
as SGLang does (it needs no GPU: the module links libcudart, not the driver); a load that fails for any
reason but a missing driver is a ``fail``. Nothing is run (no GPU): that is the runtime tier's.

An image without the nvcc SGLang calls (``$CUDA_HOME/bin/nvcc``), where nothing prebuilt covers the
module, cannot serve the kernel: ``fail`` worded "no nvcc in this flavour: ..." with ``jit_possible:
false``, as the FlashInfer gate does. A release without either JIT package JIT-compiles none of its
own kernels: ``skip``.

``--workspace DIR`` is the runner's per-(image, target arch) JIT build cache
(:func:`stackforge.jobs.job_runner.jit_cache_mount`, shared with the FlashInfer gate): SGLang's cache
goes to ``DIR/sglang`` unless the image sets its own, so a rerun finds the module in SGLang's own cache
(which re-hashes its dependencies before it trusts a build) and says who built it.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import importlib.util
import json
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import ExitStack, contextmanager
from typing import Any

import _sfprobe as sf
import flashinfer_gates as fg

FEATURE = "sglang-jit"
#: One line of the worker's stdout: the report so far (the parent keeps the last one).
REPORT_PREFIX = "SF_SGLANG_JIT_REPORT "
#: Beside SGLang's cache in a kept workspace: who built which library (run label, UTC time).
STAMP_FILE = ".stackforge-built.json"
#: Row width the kvcache kernel is instantiated for: one KV head of dim 128 in bf16 per rank (an 8-KV-head
#: model at tensor parallel 8). Other widths instantiate the same template.
DEFAULT_ROW_BYTES = 256


@dataclasses.dataclass(frozen=True, slots=True)
class JitModule:
    """One of SGLang's JIT modules, as the serving code reaches it."""

    name: str
    module: str    # where the serving entry point lives
    function: str  # called with (row_bytes,), as memory_pool.py calls it


@dataclasses.dataclass(frozen=True, slots=True)
class JitLayout:
    """Where a release keeps its JIT loader, and the functions that build and load a module."""

    package: str                  # present iff the release has this layout
    loader: str                   # module.function of the loader (for the words)
    build_hook: tuple[str, str]   # runs ninja; raises with ninja's output when it fails
    load_hook: tuple[str, str]    # loads the linked .so (tvm_ffi.load_module)
    cache_env: str                # SGLang's / tvm-ffi's cache directory variable
    arch_override: tuple[str, str] | None  # SGLang's own arch knob, None: torch reports the target capability
    modules: tuple[JitModule, ...]


#: Newest layout first: sglang.kernels.jit (0.5.2x, e.g. 0.5.23), sglang.jit_kernel (e.g. 0.5.9).
LAYOUTS = (
    JitLayout("sglang.kernels.jit", "sglang.kernels.jit.utils.compile.loader.load_jit",
              ("sglang.kernels.jit.utils.compile.ninja", "build"),
              ("sglang.kernels.jit.utils.compile.loader", "_load"),
              "SGLANG_JIT_CACHE_DIR", ("sglang.kernels.jit.utils", "override_jit_cuda_arch"),
              (JitModule("kvcache", "sglang.kernels.ops.kvcache.kvcache", "can_use_store_cache"),)),
    JitLayout("sglang.jit_kernel", "sglang.jit_kernel.utils.load_jit",
              ("tvm_ffi.cpp.extension", "build_ninja"),
              ("tvm_ffi.cpp.extension", "load_module"),
              "TVM_FFI_CACHE_DIR", None,
              (JitModule("kvcache", "sglang.jit_kernel.kvcache", "can_use_store_cache"),)),
)


@dataclasses.dataclass(frozen=True, slots=True)
class ModuleOutcome:
    """What SGLang's loader did with one module.

    status: ``built`` (ninja compiled and linked it now), ``cached`` (a build found in the kept cache: SGLang
    skipped the build, or ninja had nothing to do), ``prebuilt`` (loaded from a cache the image ships),
    ``build-failed``, ``load-failed``, ``refused`` (the entry point declined before any build), ``running``
    (the worker was still in it when the report was written: a timeout when the worker was killed).
    """

    name: str
    call: str
    status: str
    stage: str = ""          # compile | link | load | call
    seconds: float = 0.0
    output: str = ""          # ninja's output / the exception's words
    library: str = ""
    library_bytes: int = 0
    link_flags: str = ""
    load_error: str = ""
    built_by: str = ""

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> "ModuleOutcome":
        fields = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in fields})


@dataclasses.dataclass(frozen=True, slots=True)
class Report:
    """What the worker found, in the order it found it."""

    sglang: str
    layout: str = ""          # the package of the layout found, "" for none
    loader: str = ""
    import_error: str = ""    # the layout is there but does not import
    nvcc: str = ""            # the nvcc SGLang's build would call, "" when it is not there
    nvcc_looked: str = ""     # where SGLang looks for it
    ninja: str = ""
    arch: str = ""            # the target SGLang resolved (12.0f) / TVM_FFI_CUDA_ARCH_LIST
    arch_source: str = ""
    cache_dir: str = ""
    modules: tuple[ModuleOutcome, ...] = ()
    facts: Mapping[str, Any] = dataclasses.field(default_factory=dict)

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> "Report":
        fields = {f.name for f in dataclasses.fields(cls)}
        values = {k: v for k, v in data.items() if k in fields}
        values["modules"] = tuple(ModuleOutcome.from_json(m) for m in data.get("modules") or ())
        return cls(**values)


# --------------------------------------------------------------------------------------------
# Decisions (pure)
# --------------------------------------------------------------------------------------------

def failed_stage(output: str) -> str:
    """``link`` when ninja's failed target is the shared object, else ``compile``."""
    failed = [line for line in output.splitlines() if line.strip().startswith("FAILED:")]
    if failed:
        return "link" if ".so" in failed[-1] else "compile"
    return "link" if any(w in output for w in ("/ld:", "ld: ", "collect2")) else "compile"


def decide(report: Report, target: sf.Arch, timed_out: bool, timeout_s: float) -> sf.ScriptResult:
    """The verdict from the worker's last report (``timed_out``: the worker was killed at its limit)."""
    sgl = f"SGLang {report.sglang}"
    if not report.layout:
        if report.import_error:
            return sf.ScriptResult("fail", f"{sgl}'s JIT loader does not import: {report.import_error}",
                                   report.import_error)
        if timed_out:
            return sf.ScriptResult("timeout", f"importing {sgl} did not finish within {timeout_s:g} s", "", NO_LEVEL)
        return sf.ScriptResult("skip", f"{sgl} has no JIT kernels of its own ({' / '.join(l.package for l in LAYOUTS)} "
                               "absent): this release JIT-compiles none")
    evidence = layout_evidence(report)
    running = next((m for m in report.modules if m.status == "running"), None)
    if running is not None or (timed_out and not report.modules):
        name = running.name if running is not None else "its first"
        return sf.ScriptResult("timeout", f"building {sgl}'s {name} JIT module for {report.arch or target.sm_name} "
                               f"did not finish within its time limit ({timeout_s:g} s)", evidence, NO_LEVEL)
    if report.import_error:
        return sf.ScriptResult("fail", f"{sgl}'s JIT loader does not import: {report.import_error}",
                               evidence + "\n" + report.import_error)
    if not report.modules:
        return sf.ScriptResult("error", f"{sgl}: none of the JIT modules the probe knows for {report.layout} was "
                               "reached", evidence)
    for outcome in report.modules:
        evidence += "\n" + module_evidence(outcome)
    broken = next((m for m in report.modules if m.status not in ("built", "cached", "prebuilt")), None)
    if broken is not None:
        return broken_verdict(sgl, report, broken, target, evidence)
    built = [m for m in report.modules if m.status in ("built", "cached")]
    names = ", ".join(m.name for m in report.modules)
    if not built:
        return sf.ScriptResult("pass", f"{sgl} loads its {names} JIT module prebuilt from {report.cache_dir} "
                               f"(nothing built here; arch {report.arch})", evidence, fg.ADMITTED)
    seconds = round(sum(m.seconds for m in built), 1)
    cached = sorted({m.built_by for m in built if m.status == "cached"})
    source = f" (from the build cache of {'; '.join(cached)})" if cached else ""
    loaded = ("tvm-ffi loaded it" if not any(m.load_error for m in built)
              else "loading it needs the GPU host's driver (libcuda.so.1)")
    reason = (f"{sgl} built (compiled and linked) its {names} JIT module{'s' if len(built) > 1 else ''} for "
              f"{report.arch} through its own loader ({report.loader}) with {report.nvcc} in {seconds} s{source}; "
              f"{loaded}; nothing was run (no GPU)")
    return sf.ScriptResult("pass", reason, evidence, fg.BUILT)


def broken_verdict(sgl: str, report: Report, broken: ModuleOutcome, target: sf.Arch,
                   evidence: str) -> sf.ScriptResult:
    """The first module that is not built decides."""
    evidence += "\n" + broken.output[-3000:]
    what = f"{sgl}'s {broken.name} JIT module"
    if broken.status == "build-failed" and not report.nvcc:
        return sf.ScriptResult("fail", sf.no_nvcc(
            f"{what} must be JIT-built for {report.arch or target.sm_name} and nothing prebuilt covers it, but "
            f"there is no nvcc at {report.nvcc_looked}: this image cannot JIT-compile it"), evidence, fg.NO_JIT)
    if broken.status == "build-failed" and not report.ninja:
        return sf.ScriptResult("fail", f"{what}: SGLang runs 'ninja' from PATH and there is none", evidence)
    if broken.status == "build-failed":
        stage = broken.stage or failed_stage(broken.output)
        verb = "does not link" if stage == "link" else "does not compile"
        return sf.ScriptResult("fail", f"{what} {verb} for {report.arch or target.sm_name} ({stage}): "
                               f"{fg.first_error_line(broken.output)}", evidence, NO_LEVEL)
    if broken.status == "load-failed":
        return sf.ScriptResult("fail", f"{what} built for {report.arch}, but tvm-ffi cannot load it: "
                               f"{sf.one_line(broken.load_error)[:300]}", evidence, NO_LEVEL)
    if broken.status == "refused":
        return sf.ScriptResult("fail", f"{what}: {broken.call} declined before building anything: "
                               f"{sf.one_line(broken.output)[:300]}", evidence, NO_LEVEL)
    return sf.ScriptResult("error", f"{what}: {broken.call} raised {sf.one_line(broken.output)[:300]}", evidence)


#: A result that is not a pass reached no evidence level worth recording.
NO_LEVEL: dict[str, Any] = {}


def layout_evidence(report: Report) -> str:
    return (f"layout: {report.layout} (loader {report.loader}); target {report.arch or '?'} via {report.arch_source}"
            f"\nnvcc: {report.nvcc or 'none at ' + report.nvcc_looked}; ninja: {report.ninja or 'none on PATH'}"
            f"\ncache: {report.cache_dir}")


def module_evidence(outcome: ModuleOutcome) -> str:
    line = f"{outcome.call}: {outcome.status}"
    if outcome.status in ("built", "cached", "prebuilt"):
        line += f" in {outcome.seconds} s: {outcome.library} ({outcome.library_bytes} bytes)"
        if outcome.built_by:
            line += f", built by {outcome.built_by}"
        if outcome.link_flags:
            line += f"\n  ldflags: {outcome.link_flags}"
    elif outcome.stage:
        line += f" at {outcome.stage} after {outcome.seconds} s"
    return line


def metrics_of(report: Report) -> dict[str, Any]:
    return {"sglang": report.sglang, "jit_layout": report.layout, "jit_arch": report.arch,
            "jit_arch_source": report.arch_source, "sglang_nvcc": report.nvcc, "jit_cache_dir": report.cache_dir,
            "modules": {m.name: {"status": m.status, "seconds": m.seconds, "library": m.library,
                                 "load": m.load_error or ("ok" if m.library else "")} for m in report.modules}}


def last_report(output: str) -> dict[str, Any] | None:
    """The worker's last report line (it prints one after each step), None when there is none."""
    for line in reversed(output.splitlines()):
        if line.startswith(REPORT_PREFIX):
            try:
                data = json.loads(line[len(REPORT_PREFIX):])
            except ValueError:
                continue
            return data if isinstance(data, dict) else None
    return None


def cache_environment(environ: Mapping[str, str], root: str) -> dict[str, str]:
    """The cache variables to set: each layout's under ``root`` unless the image sets it (a cache the image
    ships is the serving run's; what it holds counts as prebuilt)."""
    return {layout.cache_env: os.path.join(root, layout.cache_env.lower())
            for layout in LAYOUTS if not environ.get(layout.cache_env)}


# --------------------------------------------------------------------------------------------
# Worker: runs inside the image, in a child process the parent can kill at the limit
# --------------------------------------------------------------------------------------------

class Worker:
    """Calls SGLang's serving entry point for each module with the build and load steps observed."""

    def __init__(self, args: Any, sglang: str) -> None:
        self.args = args
        self.report: dict[str, Any] = {"sglang": sglang, "modules": []}
        self.current: dict[str, Any] = {}

    def publish(self) -> None:
        sys.stdout.write("\n" + REPORT_PREFIX + json.dumps(self.report, default=str) + "\n")
        sys.stdout.flush()

    def run(self) -> None:
        layout = self.find_layout()
        self.publish()
        if layout is None or self.report.get("import_error"):
            return
        with ExitStack() as stack:
            try:
                stack.enter_context(self.target_arch(layout))
                stack.enter_context(self.observed(layout))
            except Exception as exc:  # noqa: BLE001 - SGLang's own words
                self.report["import_error"] = sf.describe_exception(exc)
                self.publish()
                return
            for module in layout.modules:
                self.build(module)
        self.report["facts"] = sf.collect_facts(torch_module=sys.modules.get("torch"))
        self.publish()

    def find_layout(self) -> JitLayout | None:
        for layout in LAYOUTS:
            try:
                found = importlib.util.find_spec(layout.package) is not None
            except (ImportError, ValueError) as exc:
                if isinstance(exc, ModuleNotFoundError) and (exc.name or "") in layout.package:
                    continue
                self.report["import_error"] = sf.describe_exception(exc)
                return None
            if not found:
                continue
            self.report.update(layout=layout.package, loader=layout.loader,
                               cache_dir=os.environ.get(layout.cache_env, ""), ninja=shutil.which("ninja") or "")
            module, error = sf.try_import(layout.loader.rsplit(".", 1)[0])
            if module is None:
                self.report["import_error"] = error
            return layout
        return None

    @contextmanager
    def target_arch(self, layout: JitLayout) -> Iterator[None]:
        """The target's arch through the release's own knob, and the nvcc its build would call."""
        target = self.args.arch
        torch = importlib.import_module("torch")
        if layout.arch_override is not None:
            module = importlib.import_module(layout.arch_override[0])
            override = getattr(module, layout.arch_override[1], None)
            if override is not None:
                with override(target.major, target.minor):
                    arch = module.get_jit_cuda_arch()
                    toolchain = importlib.import_module("sglang.kernels.jit.utils.compile.toolchain")
                    self.report.update(arch=arch.target_name, arch_source=f"{callable_path(override)}"
                                       f"({target.major}, {target.minor})")
                    self.set_nvcc(toolchain.device_compiler_path())
                    yield
                return
        # torch reports a device of the target capability: SGLang computes its arch list from it.
        capability = (target.major, target.minor)
        with sf.patched(torch.cuda, "current_device", lambda: 0), \
                sf.patched(torch.cuda, "get_device_capability", lambda device=None: capability):
            preset = os.environ.get("TVM_FFI_CUDA_ARCH_LIST")
            self.report.update(arch=preset or f"{target.major}.{target.minor}", arch_source=(
                "TVM_FFI_CUDA_ARCH_LIST set in the image" if preset else
                f"SGLang's load_jit from torch.cuda.get_device_capability() = {capability} (TVM_FFI_CUDA_ARCH_LIST)"))
            extension = importlib.import_module("tvm_ffi.cpp.extension")
            find_home = getattr(extension, "_find_cuda_home", sf.flashinfer_cuda_home)  # the same search order
            try:
                self.set_nvcc(os.path.join(find_home(), "bin", "nvcc"))
            except Exception as exc:  # noqa: BLE001 - tvm-ffi's own words say where it looked
                self.report.update(nvcc="", nvcc_looked=f"no CUDA home ({sf.describe_exception(exc)})")
            yield

    def set_nvcc(self, path: str) -> None:
        usable = os.path.isfile(path) and os.access(path, os.X_OK)
        self.report.update(nvcc=path if usable else "", nvcc_looked=path)

    @contextmanager
    def observed(self, layout: JitLayout) -> Iterator[None]:
        """SGLang's build and load functions, wrapped to record what they did (they still do it)."""
        build_module = importlib.import_module(layout.build_hook[0])
        load_module = importlib.import_module(layout.load_hook[0])
        build, load = getattr(build_module, layout.build_hook[1]), getattr(load_module, layout.load_hook[1])
        with sf.patched(build_module, layout.build_hook[1], self.watch_build(build)), \
                sf.patched(load_module, layout.load_hook[1], self.watch_load(load)):
            yield

    def watch_build(self, build: Callable[..., Any]) -> Callable[..., Any]:
        def watched(*args: Any, **kwargs: Any) -> Any:
            build_dir = str(kwargs.get("build_dir") or (args[0] if args else ""))
            before = shared_objects(build_dir)
            self.current.update(status="running", stage="compile", load_error="")
            self.publish_current()
            started = time.monotonic()
            try:
                result = build(*args, **kwargs)
            except BaseException as exc:
                self.current.update(status="build-failed", seconds=round(time.monotonic() - started, 1),
                                    output=str(exc), stage=failed_stage(str(exc)))
                raise
            after = shared_objects(build_dir)
            # ninja rebuilt nothing: a build our kept cache holds, or one the image ships (prebuilt)
            unchanged = "cached" if self.in_workspace(build_dir) else "prebuilt"
            self.current.update(status=unchanged if after and after == before else "built",
                                seconds=round(time.monotonic() - started, 1), stage="link",
                                link_flags=ninja_variable(build_dir, kwargs.get("build_file"), "ldflags"))
            return result
        return watched

    def watch_load(self, load: Callable[..., Any]) -> Callable[..., Any]:
        def watched(path: Any, *args: Any, **kwargs: Any) -> Any:
            library = str(path)
            if self.current.get("status") not in ("built", "cached"):
                # No build ran: SGLang's cache served it (ours, or one the image ships).
                self.current.update(status="cached" if self.in_workspace(library) else "prebuilt", stage="load")
            self.current.update(library=library, library_bytes=file_size(library))
            try:
                return load(path, *args, **kwargs)
            except BaseException as exc:
                error = sf.describe_exception(exc)
                if sf.missing_library(error) not in ("libcuda.so.1", "libcuda.so"):
                    self.current.update(status="load-failed", load_error=error, stage="load")
                else:  # the driver is the GPU host's: loading is not this tier's to decide
                    self.current.update(load_error=f"not loadable without a driver: {error}")
                raise
        return watched

    def in_workspace(self, library: str) -> bool:
        root = self.args.workspace
        return bool(root) and os.path.realpath(library).startswith(os.path.realpath(root) + os.sep)

    def publish_current(self) -> None:
        self.report["modules"] = [*self.report["modules"][:-1], dict(self.current)]
        self.publish()

    def build(self, module: JitModule) -> None:
        row_bytes = self.args.kv_row_bytes
        call = f"{module.module}.{module.function}({row_bytes})"
        self.current = {"name": module.name, "call": call, "status": "running", "stage": "call"}
        self.report["modules"].append(dict(self.current))
        self.publish_current()
        started = time.monotonic()
        with sf.captured_logs("sglang") as logs:
            try:
                entry = getattr(importlib.import_module(module.module), module.function)
                answer = entry(row_bytes)
            except Exception as exc:  # noqa: BLE001 - the serving path's own exception
                answer, logs = False, [*logs, sf.describe_exception(exc)]
        if self.current.get("library"):
            self.current["library"] = published(self.current["library"])
        if self.current.get("status") in ("built", "cached") and self.current.get("library") and self.args.workspace:
            self.current["built_by"] = stamp(self.args.workspace, self.current["library"], self.args.cache_label,
                                             self.current["status"] == "cached")
        if self.current.get("status") == "running" and not answer:
            self.current.update(status="refused", output="; ".join(logs) or f"{call} returned {answer!r}")
        elif self.current.get("status") == "running":
            self.current.update(status="error", output=f"{call} returned {answer!r} and neither built nor loaded "
                                "a module (the probe no longer observes this release's loader)")
        if not self.current.get("seconds"):
            self.current["seconds"] = round(time.monotonic() - started, 1)
        self.publish_current()


def published(library: str) -> str:
    """Where SGLang's cache keeps a module it loaded from a staging directory (0.5.2x builds into
    ``build-<key>/.staging-<uuid>/``, loads, then publishes ``build-<key>/deps-<key>/``): the newest leaf
    holding that file, else the path as loaded."""
    staging = os.path.dirname(library)
    if not os.path.basename(staging).startswith(".staging-"):
        return library
    scope, name = os.path.dirname(staging), os.path.basename(library)
    try:
        leaves = [os.path.join(scope, d, name) for d in os.listdir(scope) if d.startswith("deps-")]
    except OSError:
        return library
    leaves = [path for path in leaves if os.path.isfile(path)]
    return max(leaves, key=os.path.getmtime) if leaves else library


def callable_path(function: Any) -> str:
    return f"{getattr(function, '__module__', '?')}.{getattr(function, '__qualname__', '?')}"


def shared_objects(build_dir: str) -> dict[str, float]:
    """{.so path: mtime} in a build directory (ninja rebuilding nothing leaves them as they were)."""
    try:
        names = os.listdir(build_dir)
    except OSError:
        return {}
    paths = [os.path.join(build_dir, name) for name in names if name.endswith(".so")]
    return {path: os.path.getmtime(path) for path in paths}


def ninja_variable(build_dir: str, text: Any, name: str) -> str:
    """``name = ...`` of the build.ninja that ran (passed in, or read from the build directory)."""
    if not isinstance(text, str):
        try:
            with open(os.path.join(build_dir, "build.ninja"), encoding="utf-8") as handle:
                text = handle.read()
        except OSError:
            return ""
    for line in text.splitlines():
        if line.startswith(f"{name} = "):
            return line[len(name) + 3:][:600]
    return ""


def file_size(path: str) -> int:
    try:
        return os.path.getsize(path)
    except OSError:
        return 0


def stamp(workspace: str, library: str, label: str, cached: bool) -> str:
    """Who built ``library``: read from the stamp file of a kept workspace on a cache hit, written on a build."""
    path = os.path.join(workspace, "sglang", STAMP_FILE)
    try:
        with open(path, encoding="utf-8") as handle:
            stamps = json.load(handle)
        stamps = stamps if isinstance(stamps, dict) else {}
    except (OSError, ValueError):
        stamps = {}
    key = os.path.basename(library)
    if cached:
        return str(stamps.get(key) or "an earlier run")
    when = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    stamps[key] = f"run {label}, {when}" if label else when
    try:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "w", encoding="utf-8") as handle:
            json.dump(stamps, handle)
    except OSError:
        pass  # the stamp only words a later reason
    return ""


# --------------------------------------------------------------------------------------------
# Main
# --------------------------------------------------------------------------------------------

def parse_args(argv: Sequence[str]) -> Any:
    parser = sf.common_parser(__doc__.splitlines()[0])
    parser.add_argument("--build-timeout", type=float, default=600.0,
                        help="seconds for SGLang's imports and builds together; past it the result is a timeout")
    parser.add_argument("--kv-row-bytes", type=int, default=DEFAULT_ROW_BYTES,
                        help="row width (bytes) the kvcache store_cache kernel is built for")
    parser.add_argument("--workspace", default="",
                        help="kept JIT build cache (SGLang's goes to DIR/sglang); default: a fresh temp dir")
    parser.add_argument("--cache-label", default="", help="who fills a kept --workspace (the runner's run id)")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    return parser.parse_args(argv)


def main(argv: Sequence[str]) -> None:
    args = parse_args(argv)
    sglang = sf.installed_version("sglang")
    if args.worker:
        Worker(args, sglang or "").run()
        sys.stdout.flush()
        os._exit(0)
    if sglang is None:
        sf.emit("skip", "SGLang is not installed in this image", facts=sf.collect_facts(import_torch=False))
    workspace = args.workspace or tempfile.mkdtemp(prefix="sf-sglang-jit-")
    env = {**os.environ, **cache_environment(os.environ, os.path.join(workspace, "sglang"))}
    worker_argv = [sys.executable, os.path.abspath(__file__), *argv, "--worker", "--workspace", workspace]
    try:
        done = sf.run_command(worker_argv, args.build_timeout, env=env)
    finally:
        if not args.workspace:
            shutil.rmtree(workspace, ignore_errors=True)
    data = last_report(done.stdout)
    if data is None:
        status = "timeout" if done.timed_out else "error"
        sf.emit(status, f"the SGLang JIT worker ended without a report (exit {done.returncode}"
                f"{', killed at its limit' if done.timed_out else ''}): "
                f"{fg.first_error_line(done.output) or done.start_error}", done.output,
                facts=sf.collect_facts(import_torch=False))
    report = Report.from_json(data)
    result = decide(report, args.arch, done.timed_out, args.build_timeout)
    facts = dict(report.facts) or sf.collect_facts(import_torch=False)
    sf.emit_result(result, facts, metrics_of(report))


if __name__ == "__main__":
    sf.run_main(main, sys.argv[1:])
