"""Gate probe for FlashInfer on a target arch: features ``flashinfer-jit`` and ``flashinfer-ar-fusion``.

Runs FlashInfer's own code, no GPU needed:

1. Target archs. FlashInfer decides what to compile for in ``CompilationContext``
   (``flashinfer/compilation_context.py``): from ``FLASHINFER_CUDA_ARCH_LIST`` when set, else from
   the visible devices. The probe asks that code what it would choose for a device of the target
   capability, by constructing ``CompilationContext()`` while torch reports N devices of that
   capability (FlashInfer 0.3.1-0.6.6 then appends ``a`` for major >= 9; >= 0.6.7 calls
   ``_normalize_cuda_arch``, which needs the CUDA version from nvcc or ``torch.version.cuda``).
   The chosen value is exported as ``FLASHINFER_CUDA_ARCH_LIST`` (what FlashInfer's own AOT and
   jit-cache builds do) and FlashInfer's shared context is refreshed from it. ``--fi-arch-list``
   or a ``FLASHINFER_CUDA_ARCH_LIST`` already set in the image take precedence.
2. Module gates. FlashInfer's JIT spec generators (``flashinfer.jit.*.gen_*_module``) apply
   per-module arch gates (``get_nvcc_flags_list(supported_major_versions=[9, 10])`` raises
   ``RuntimeError: No supported CUDA architectures found for major versions [9, 10].``). Each
   generator that exists in this version is called; one that does not exist is reported absent.
3. With ``--build`` (and an nvcc where FlashInfer looks for it), the modules a serving run on the
   target JIT-builds first (``BUILD_MODULES``: norm, sampling and a decode-attention variant for
   ``flashinfer-jit``; the trtllm allreduce-fusion module for ``flashinfer-ar-fusion``) are compiled
   AND linked for the arch through FlashInfer's generated ninja files, side by side, within
   ``--build-timeout`` in all. A compile or link failure is ``fail`` in the compiler's / linker's
   words (a link that cannot find ``-lcudart`` fails the same way on a GPU host); a build past its
   limit is ``timeout``; every
   module built is a ``pass`` with ``metrics["evidence_level"] = "built"``. Nothing is loaded or run
   (no GPU): that is the runtime probe's. A pass that built nothing (gate only, or prebuilt modules)
   records ``"admitted"``. A module only one serving feature reaches is not built where the image's
   SGLang rejects that feature on the target in its own code (``SERVING_GATES``: the allreduce-fusion
   module, which SGLang 0.5.14+ refuses on sm_12x): no serving run of the stack builds it there, so the
   build would cost minutes and prove nothing; the result says so and stays ``admitted``.
4. ``--workspace DIR`` keeps FlashInfer's JIT workspace (the job runner mounts one per image and
   target arch, :func:`stackforge.jobs.job_runner.jit_cache_mount`, and its jobs take turns in it): on a
   rerun, or for another target of the same arch, ninja itself proves the
   objects and the .so up to date ("ninja: no work to do.") and the .so must be there; the reason then
   says "(from the build cache of <run, time>)", read from the stamp the building run left beside it.

An image without nvcc (the runtime flavour, CUDA 12.x toolkit wheels) cannot JIT anything: where the
gates admit the arch and nothing prebuilt covers it, the feature cannot work in this image, a failure a CPU
can see, so the verdict is ``fail``, worded "no nvcc in this flavour: ..." (the missing compiler is the
image's flavour, not FlashInfer's code), with ``jit_possible: false`` in its metrics: the reports fail every
feature whose serving code JIT-builds a FlashInfer module on such an image, and the upgrade report counts the
change as the flavour's. A gate that rejects the arch is FlashInfer's own answer and fails with or without
nvcc.

``--feature`` picks which feature this invocation decides; both appear in the metrics.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import json
import os
import re
import shutil
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import _sfprobe as sf

FEATURES = ("flashinfer-jit", "flashinfer-ar-fusion")
GATE_TEXT = "No supported CUDA architectures found"
GENCODE = re.compile(r"code=(sm|compute)_(\d+)([af]?)")
#: What each feature builds with --build: the modules a serving run on the target JIT-builds first
#: (RMSNorm, the sampler, a decode-attention variant; the trtllm allreduce-fusion module).
BUILD_MODULES = {"flashinfer-jit": ("norm", "sampling", "attention-decode"),
                 "flashinfer-ar-fusion": ("allreduce-fusion",)}
NINJA_NOOP = "ninja: no work to do."
#: Beside a module this probe built in a kept workspace: who built it (run label, UTC time).
BUILD_STAMP = ".stackforge-built.json"


@dataclasses.dataclass(frozen=True, slots=True)
class ModuleProbe:
    """One FlashInfer JIT module: where its generator may live in different versions."""

    name: str
    role: str  # jit (generic kernels) | ar-fusion | comm | moe | gemm
    candidates: tuple[tuple[str, str], ...]  # (module path, generator name), first found wins
    kwargs: str = ""  # name of the keyword-argument builder, "" for none


@dataclasses.dataclass(frozen=True, slots=True)
class ModuleGate:
    """What FlashInfer's generator said for the target."""

    name: str
    role: str
    status: str  # admitted | rejected | no-target | absent | error
    generator: str
    detail: str
    gencode: tuple[str, ...] = ()
    gencode_scope: str = ""  # module (the generator's own flags) | global (CompilationContext)
    aot: bool | None = None


@dataclasses.dataclass(frozen=True, slots=True)
class ArchResolution:
    """FlashInfer's target archs for the target capability, and how they were obtained."""

    source: str
    env_value: str
    archs: tuple[tuple[int, str], ...]
    error: str
    detail: str


@dataclasses.dataclass(frozen=True, slots=True)
class Toolkit:
    """The CUDA toolkit as FlashInfer finds it (``flashinfer.jit.cpp_ext``)."""

    cuda_home: str
    cuda_version: str
    version_error: str
    nvcc: str  # the nvcc FlashInfer's ninja file will call, "" if none is there
    ninja: str  # FlashInfer runs "ninja" from PATH


@dataclasses.dataclass(frozen=True, slots=True)
class ModuleBuild:
    """One module built through FlashInfer's generated ninja file: compiled, then linked."""

    name: str
    status: str  # built | compile-failed | link-failed | timeout | error (the ninja file was not written)
    stage: str   # write_ninja | compile | link | check (the linked .so is there)
    seconds: float
    output: str  # ninja -v's output: the commands and the compiler's / linker's words
    library: str = ""
    library_bytes: int = 0
    link_command: str = ""
    built_by: str = ""  # set when ninja found it up to date in a kept workspace: who built it there

    def metrics(self) -> dict[str, Any]:
        return {"status": self.status, "stage": self.stage, "seconds": self.seconds, "library": self.library,
                "cached": bool(self.built_by)}

    def evidence_line(self) -> str:
        if self.status != "built":
            return f"{self.name}: {self.status} at {self.stage} after {self.seconds} s"
        cached = f", up to date in the build cache of {self.built_by}" if self.built_by else ""
        return (f"{self.name}: built in {self.seconds} s{cached}: {self.library} ({self.library_bytes} bytes)"
                f"\n  link: {self.link_command or NINJA_NOOP}")


@dataclasses.dataclass(frozen=True, slots=True)
class Builds:
    """The chosen modules of one feature: those built (in the chosen order; they build side by side) and
    those left out, with why (absent in this version, prebuilt, refused by the stack's SGLang).
    ``wall_s``: the seconds the builds took together (None: their sum)."""

    modules: tuple[ModuleBuild, ...]
    left_out: tuple[tuple[str, str], ...] = ()
    wall_s: float | None = None

    def seconds(self) -> float:
        return self.wall_s if self.wall_s is not None else round(sum(b.seconds for b in self.modules), 1)


def module_probes(target: sf.Arch) -> tuple[ModuleProbe, ...]:
    """The modules whose gates decide the features; arch-named generators follow the target."""
    sm_names = (f"sm{target.sm}", f"sm{target.major}0")
    return (
        ModuleProbe("norm", "jit", (("flashinfer.jit.norm", "gen_norm_module"),)),
        ModuleProbe("sampling", "jit", (("flashinfer.jit.sampling", "gen_sampling_module"),)),
        ModuleProbe("page", "jit", (("flashinfer.jit.page", "gen_page_module"),)),
        ModuleProbe("attention-decode", "jit", (("flashinfer.jit.attention", "gen_single_decode_module"),
                                                ("flashinfer.jit.attention.modules", "gen_single_decode_module")),
                    kwargs="decode"),
        ModuleProbe("allreduce-fusion", "ar-fusion", (("flashinfer.jit.comm", "gen_trtllm_comm_module"),
                                                      ("flashinfer.comm.trtllm_ar", "gen_trtllm_comm_module"))),
        ModuleProbe("custom-allreduce", "comm", (("flashinfer.jit.comm", "gen_vllm_comm_module"),
                                                 ("flashinfer.comm.vllm_ar", "gen_vllm_comm_module"))),
        ModuleProbe("mnnvl-allreduce", "comm", (("flashinfer.jit.comm", "gen_trtllm_mnnvl_comm_module"),)),
        ModuleProbe("pcie-ipc-allreduce", "comm", (("flashinfer.jit.comm", "gen_pcie_ipc_comm_module"),)),
        ModuleProbe("moe-alltoall", "comm", (("flashinfer.jit.comm", "gen_moe_alltoall_module"),)),
        ModuleProbe("cutlass-fused-moe", "moe",
                    tuple(("flashinfer.jit.fused_moe", f"gen_cutlass_fused_moe_{sm}_module") for sm in sm_names)),
        ModuleProbe("gemm", "gemm", tuple(("flashinfer.jit.gemm", f"gen_gemm_{sm}_module") for sm in sm_names)),
    )


def generator_kwargs(kind: str, torch: Any) -> dict[str, Any]:
    """Arguments for generators that need them: a plain fp16 decode kernel, head dim 128."""
    if kind == "decode":
        return {"dtype_q": torch.float16, "dtype_kv": torch.float16, "dtype_o": torch.float16,
                "head_dim_qk": 128, "head_dim_vo": 128, "pos_encoding_mode": 0,
                "use_sliding_window": False, "use_logits_soft_cap": False}
    return {}


# --------------------------------------------------------------------------------------------
# Arch matching (what a gencode / TARGET_CUDA_ARCHS entry runs on)
# --------------------------------------------------------------------------------------------

def gencode_serves(flag: str, target: sf.Arch) -> bool:
    match = GENCODE.search(flag)
    return bool(match) and sf.code_runs_on(match.group(1), int(match.group(2)), match.group(3), target)


def format_archs(archs: Sequence[tuple[int, str]]) -> str:
    """FlashInfer's set {(12, '0a')} as the env-var syntax ``12.0a``."""
    return " ".join(f"{major}.{minor}" for major, minor in archs)


# --------------------------------------------------------------------------------------------
# Step 1: target archs through FlashInfer's CompilationContext
# --------------------------------------------------------------------------------------------

def detect_like_device(context_class: Any, torch: Any, target: sf.Arch, gpus: int) -> ArchResolution:
    """Run FlashInfer's device auto-detection with torch reporting ``gpus`` devices of the target
    capability (the only GPU input FlashInfer's arch choice has)."""
    count = max(gpus, 1)
    capability = (target.major, target.minor)
    with sf.captured_logs("flashinfer", "flashinfer.compilation_context") as logs, \
            sf.patched(torch.cuda, "device_count", lambda: count), \
            sf.patched(torch.cuda, "get_device_capability", lambda device=None: capability):
        try:
            archs = tuple(sorted(context_class().TARGET_CUDA_ARCHS))
            error = ""
        except Exception as exc:  # noqa: BLE001 - FlashInfer's exception is the evidence
            archs, error = (), sf.describe_exception(exc)
    how = f"FlashInfer's device auto-detection (CompilationContext()) for {count} x capability {capability}"
    if archs:
        return ArchResolution("device auto-detection", format_archs(archs), archs, "", how)
    normalize = getattr(context_class, "_normalize_cuda_arch", None)
    if normalize is not None and not error:
        # Auto-detection swallows the reason into a log line; the normaliser raises it cleanly.
        try:
            normalize(target.major, target.minor)
        except Exception as exc:  # noqa: BLE001
            error = sf.describe_exception(exc)
    error = error or "; ".join(logs) or "FlashInfer resolved no target architecture"
    return ArchResolution("device auto-detection", "", (), error, how + (f"; logged: {'; '.join(logs)}" if logs else ""))


def resolve_archs(context_class: Any, torch: Any, target: sf.Arch, gpus: int, cli_value: str) -> ArchResolution:
    """FlashInfer's target archs; exports them as FLASHINFER_CUDA_ARCH_LIST on success."""
    image_value = os.environ.get("FLASHINFER_CUDA_ARCH_LIST", "")
    if cli_value or image_value:
        source = "--fi-arch-list" if cli_value else "FLASHINFER_CUDA_ARCH_LIST set in the image"
        value = cli_value or image_value
        detail = f"FLASHINFER_CUDA_ARCH_LIST={value!r} ({source})"
    else:
        detected = detect_like_device(context_class, torch, target, gpus)
        if detected.error:
            return detected
        source, value, detail = detected.source, detected.env_value, detected.detail
    os.environ["FLASHINFER_CUDA_ARCH_LIST"] = value
    try:
        archs = tuple(sorted(context_class().TARGET_CUDA_ARCHS))
    except Exception as exc:  # noqa: BLE001 - e.g. "SM 12.x requires CUDA >= 12.9"
        return ArchResolution(source, value, (), sf.describe_exception(exc), detail)
    if not archs:
        return ArchResolution(source, value, (), "FlashInfer parsed no architecture from it", detail)
    return ArchResolution(source, value, archs, "", detail)


def refresh_shared_context(core: Any) -> None:
    """Make FlashInfer's import-time ``current_compilation_context`` follow the exported list,
    the way its own ``refresh_current_compilation_context`` (FlashInfer >= 0.7) does."""
    refresh = getattr(core, "refresh_current_compilation_context", None)
    if refresh is not None:
        refresh()
        return
    fresh = core.CompilationContext()
    core.current_compilation_context.TARGET_CUDA_ARCHS.clear()
    core.current_compilation_context.TARGET_CUDA_ARCHS.update(fresh.TARGET_CUDA_ARCHS)


# --------------------------------------------------------------------------------------------
# Step 2: module gates
# --------------------------------------------------------------------------------------------

def locate(candidates: Sequence[tuple[str, str]]) -> tuple[Callable[..., Any] | None, str, str]:
    """(generator, "module.function", "") or (None, "", why none was found)."""
    misses = []
    for module_name, function in candidates:
        module, error = sf.try_import(module_name)
        if module is None:
            misses.append(f"{module_name}: {error}")
            continue
        generator = getattr(module, function, None)
        if generator is None:
            misses.append(f"{module_name}.{function} does not exist")
            continue
        return generator, f"{module_name}.{function}", ""
    return None, "", "; ".join(misses)


def global_gencode(context_class: Any) -> tuple[tuple[str, ...], str]:
    """The -gencode flags FlashInfer adds to modules without their own (``build_cuda_cflags``
    calls ``CompilationContext().get_nvcc_flags_list()``)."""
    try:
        flags = context_class().get_nvcc_flags_list()
    except Exception as exc:  # noqa: BLE001
        return (), sf.describe_exception(exc)
    return tuple(f for f in flags if f.startswith("-gencode")), ""


def evaluate_module(probe: ModuleProbe, torch: Any, target: sf.Arch,
                    global_flags: tuple[tuple[str, ...], str]) -> tuple[ModuleGate, Any]:
    """Call one generator; the gate outcome and the JitSpec (None unless it was produced)."""
    generator, where, why = locate(probe.candidates)
    if generator is None:
        return ModuleGate(probe.name, probe.role, "absent", "", f"module absent in this version ({why})"), None
    try:
        spec = generator(**generator_kwargs(probe.kwargs, torch))
    except Exception as exc:  # noqa: BLE001 - the gate's own words
        status = "rejected" if GATE_TEXT in str(exc) else "error"
        return ModuleGate(probe.name, probe.role, status, where, sf.describe_exception(exc)), None
    own = tuple(f for f in (getattr(spec, "extra_cuda_cflags", None) or []) if f.startswith("-gencode"))
    flags, scope = (own, "module") if own else (global_flags[0], "global")
    try:
        aot = bool(spec.is_aot) if hasattr(spec, "is_aot") else None
    except Exception:  # noqa: BLE001 - only informative
        aot = None
    served = tuple(f for f in flags if gencode_serves(f, target))
    if served:
        return ModuleGate(probe.name, probe.role, "admitted", where, " ".join(served), flags, scope, aot), spec
    detail = (f"{where}() compiles only for {' '.join(flags)}" if flags
              else f"no -gencode flags: {global_flags[1] or 'FlashInfer resolved no global arch'}")
    return ModuleGate(probe.name, probe.role, "no-target", where, detail, flags, scope, aot), spec


# --------------------------------------------------------------------------------------------
# Step 3: toolkit and compile
# --------------------------------------------------------------------------------------------

def find_toolkit(cpp_ext: Any) -> Toolkit:
    """CUDA home, version and nvcc exactly as FlashInfer's cpp_ext finds them."""
    try:
        cuda_home = str(cpp_ext.get_cuda_path())
    except Exception as exc:  # noqa: BLE001
        cuda_home = f"<{sf.describe_exception(exc)}>"
    try:
        version, version_error = str(cpp_ext.get_cuda_version()), ""
    except Exception as exc:  # noqa: BLE001
        version, version_error = "", sf.describe_exception(exc)
    nvcc, _ = sf.flashinfer_nvcc(lambda: cuda_home if not cuda_home.startswith("<") else cpp_ext.get_cuda_path())
    return Toolkit(cuda_home, version, version_error, nvcc, shutil.which("ninja") or "")


def missing_nvcc(toolkit: Toolkit) -> str:
    """Where FlashInfer looked for nvcc, for a reason: its path, or FlashInfer's own words when it
    found no CUDA home at all (its get_cuda_path raised)."""
    if toolkit.cuda_home.startswith("<"):
        return f"no nvcc and no CUDA home ({toolkit.cuda_home[1:-1]})"
    return f"no nvcc at {os.path.join(toolkit.cuda_home, 'bin', 'nvcc')}"


def compile_targets(ninja_text: str) -> tuple[list[str], list[str]]:
    """(object targets, default targets) of a FlashInfer build.ninja; the defaults are the linked .so."""
    objects = re.findall(r"^build (\S+): (?:cuda_compile|compile)\S*\s", ninja_text, re.MULTILINE)
    defaults = re.findall(r"^default (.+)$", ninja_text, re.MULTILINE)
    return objects, [t for line in defaults for t in line.split()]


def ninja_did_nothing(output: str) -> bool:
    """ninja's own words for a build whose outputs are all newer than their inputs and commands."""
    return NINJA_NOOP in output


def read_stamp(build_dir: str) -> str:
    """Who built the module kept in ``build_dir`` (a warm workspace), "" when no probe stamped it."""
    try:
        with open(os.path.join(build_dir, BUILD_STAMP), encoding="utf-8") as handle:
            return str(json.load(handle).get("built_by", ""))
    except (OSError, ValueError, AttributeError):
        return ""


def write_stamp(build_dir: str, label: str) -> None:
    """Mark a module this probe built, so a rerun over a kept workspace can say where it came from."""
    when = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    built_by = f"run {label}, {when}" if label else when
    try:
        with open(os.path.join(build_dir, BUILD_STAMP), "w", encoding="utf-8") as handle:
            json.dump({"built_by": built_by}, handle)
    except OSError:
        pass  # the stamp only words a later reason; the build itself is proven by ninja and the .so


def link_command(output: str) -> str:
    """The link command ninja ran (``-v``): the line that writes the .so."""
    lines = [line for line in output.splitlines() if ".so" in line and " -o " in line]
    return re.sub(r"^\[\d+/\d+\]\s*", "", lines[-1].strip())[:600] if lines else ""


def sglang_refuses_ar_fusion(target: sf.Arch) -> str:
    """SGLang's own allreduce-fusion arch gate (``_resolve_backend``, 0.5.14+) read in the installed
    SGLang and decided for the target, as gate.sglang.ar-fusion's static reading decides it: where it
    raises, that check and its words; "" where it admits the target, is absent or cannot be read.
    Read, not run (importing SGLang costs seconds, and this only decides whether a build is worth it:
    gate.sglang.ar-fusion records SGLang's live answer)."""
    from _sglang_source import ADMITTED, GateUnread, fusion_gate
    gate = fusion_gate()
    if isinstance(gate, GateUnread):
        return ""
    try:
        if gate.decide(target.major) == ADMITTED:
            return ""
    except ValueError:
        return ""
    return gate.check_text()


#: Modules only one serving feature reaches, and how to read whether the stack's SGLang takes that path on
#: the target at all.
SERVING_GATES: dict[str, Callable[[sf.Arch], str]] = {"allreduce-fusion": sglang_refuses_ar_fusion}


def serving_refusal(name: str, args: Any) -> str:
    """Why no serving run of this stack builds ``name`` on the target: the image's SGLang rejects the
    feature for the target in its own code (``_resolve_backend`` raising ``requires SM90 or SM10X`` on
    sm_12x from 0.5.14). Building the module there would cost minutes and prove nothing a serving run
    needs. "" when no single feature decides the module, SGLang is not installed, has no gate of its own,
    admits the target, or cannot be read: the module is built then."""
    refuses = SERVING_GATES.get(name)
    version = sf.installed_version("sglang") if refuses else None
    if refuses is None or not version:
        return ""
    try:
        check = refuses(args.arch)
    except Exception:  # noqa: BLE001 - SGLang's code could not be read: build, as without SGLang
        return ""
    if not check:
        return ""
    return (f"SGLang {version} rejects the feature for capability {args.arch.dotted} in its own code, so no "
            f"serving run builds the module here ({check}; read, not run)")


def build_module(name: str, spec: Any, toolkit: Toolkit, timeout_s: float, label: str) -> ModuleBuild:
    """Compile, then link, the module through FlashInfer's own generated ninja file, within ``timeout_s``
    in all; the .so every ``default`` target names must exist afterwards. Over a kept workspace ninja
    may have nothing to do: the outputs are proven up to date by ninja itself, and the .so is there."""
    if timeout_s <= 0:
        return ModuleBuild(name, "timeout", "compile", 0.0, "no time left in the build budget for this module")
    try:
        spec.write_ninja()
        ninja_path, build_dir = str(spec.ninja_path), str(spec.build_dir)
        with open(ninja_path, encoding="utf-8") as handle:
            objects, libraries = compile_targets(handle.read())
    except Exception as exc:  # noqa: BLE001 - FlashInfer's own words
        return ModuleBuild(name, "error", "write_ninja", 0.0, sf.describe_exception(exc))
    kept = bool(libraries) and all(os.path.isfile(path) for path in libraries)
    base = [toolkit.ninja, "-v", "-f", ninja_path, "-C", build_dir]
    compiled = sf.run_command(base + objects, timeout_s)
    if compiled.timed_out or not compiled.ok:
        status = "timeout" if compiled.timed_out else "compile-failed"
        return ModuleBuild(name, status, "compile", round(compiled.seconds, 1), compiled.output)
    linked = sf.run_command(base + libraries, timeout_s - compiled.seconds)
    seconds = round(compiled.seconds + linked.seconds, 1)
    output = compiled.output + "\n" + linked.output
    if linked.timed_out or not linked.ok:
        return ModuleBuild(name, "timeout" if linked.timed_out else "link-failed", "link", seconds, output)
    missing = [path for path in libraries if not os.path.isfile(path)]
    if missing or not libraries:
        why = f"ninja succeeded but {', '.join(missing)} is missing" if missing else "build.ninja names no library"
        return ModuleBuild(name, "link-failed", "check", seconds, output + "\n" + why)
    cached = kept and ninja_did_nothing(compiled.output) and ninja_did_nothing(linked.output)
    if cached:
        built_by = read_stamp(build_dir) or "an earlier run"
    else:
        built_by = ""
        write_stamp(build_dir, label)
    return ModuleBuild(name, "built", "link", seconds, output, libraries[0], os.path.getsize(libraries[0]),
                       link_command(linked.output), built_by)


def first_error_line(output: str) -> str:
    """The most telling line of compiler/linker output: fatal errors and missing files or
    libraries before generic ``error:`` lines; never the ``collect2``/``ninja`` summaries."""
    lines = [line.strip() for line in output.splitlines() if line.strip()]
    telling = [line for line in lines if not line.startswith(("FAILED:", "ninja:", "collect2:"))]
    for pattern in (r"fatal error|cannot find|undefined reference|No such file|not found", r"\berror\b"):
        for line in telling:
            if re.search(pattern, line, re.IGNORECASE):
                return line[:300]
    last = telling or lines
    return last[-1][:300] if last else ""


# --------------------------------------------------------------------------------------------
# Decisions
# --------------------------------------------------------------------------------------------

def resolution_evidence(res: ArchResolution) -> str:
    archs = format_archs(res.archs) if res.archs else "none"
    return f"target archs: {archs} via {res.detail}" + (f"\nFlashInfer error: {res.error}" if res.error else "")


#: What a pass reached (``metrics["evidence_level"]``): ``built`` compiled and linked the modules for the
#: arch; ``admitted`` means FlashInfer's gates admit it and nothing was built here. Neither loaded or ran
#: anything: that is the runtime tier's.
ADMITTED = {"evidence_level": "admitted"}
BUILT = {"evidence_level": "built"}
#: A no-nvcc fail: this image cannot JIT what the target needs (the reports fail every feature whose serving
#: code JIT-builds a FlashInfer module on it, and call an upgrade change it explains the flavour's).
NO_JIT = {"jit_possible": False}


def chosen_gate_verdict(fi: str, target: sf.Arch, gates: dict[str, ModuleGate], chosen: Sequence[str],
                        evidence: str) -> sf.ScriptResult | None:
    """A module the target would JIT whose own gate refuses it decides before anything is built."""
    for name in chosen:
        gate = gates.get(name)
        if gate is None:
            return sf.ScriptResult("error", f"unknown module {name!r}; known: {', '.join(gates)}", evidence)
        if gate.status in ("rejected", "no-target"):
            return sf.ScriptResult("fail", f"FlashInfer {fi} gives its {name} module no code for {target.sm_name}: "
                                   f"{gate.detail}", evidence)
        if gate.status == "error":
            return sf.ScriptResult("error", f"FlashInfer {fi} {gate.generator} raised {gate.detail}", evidence)
    return None


def build_verdict(fi: str, what: str, target: sf.Arch, flags: str, toolkit: Toolkit, builds: Builds,
                  evidence: str) -> sf.ScriptResult:
    """The result once the builds ran: the first one that did not build decides; else a pass at the
    ``built`` level, or ``admitted`` where every chosen module was prebuilt or absent."""
    evidence = "\n".join([evidence, *(b.evidence_line() for b in builds.modules),
                          *(f"{name}: not built: {why}" for name, why in builds.left_out)])
    broken = next((b for b in builds.modules if b.status != "built"), None)
    if broken is not None:
        evidence += "\n" + broken.output[-3000:]
        if broken.status == "timeout":
            return sf.ScriptResult("timeout", f"building FlashInfer {fi}'s {broken.name} module for {flags} did not "
                                   f"finish within its time limit ({broken.seconds} s spent, stage {broken.stage})",
                                   evidence, NO_LEVEL)
        if broken.status == "error":
            return sf.ScriptResult("error", f"FlashInfer {fi} could not write the ninja file of its {broken.name} "
                                   f"module: {first_error_line(broken.output)}", evidence, NO_LEVEL)
        stage = "does not link" if broken.stage in ("link", "check") else "does not compile"
        return sf.ScriptResult("fail", f"FlashInfer {fi}'s {broken.name} module {stage} for {target.sm_name} "
                               f"({broken.stage}): {first_error_line(broken.output)}", evidence, NO_LEVEL)
    left = "; ".join(f"{name} not built: {why}" for name, why in builds.left_out)
    if not builds.modules:
        return sf.ScriptResult("pass", f"FlashInfer {fi} admits {target.sm_name} for {what} ({flags}); nothing to "
                               f"build here ({left})", evidence, ADMITTED)
    names = ", ".join(b.name for b in builds.modules)
    seconds = builds.seconds()
    reason = (f"FlashInfer {fi} built (compiled and linked) its {names} module{'s' if len(builds.modules) > 1 else ''} "
              f"for {flags} with nvcc {toolkit.cuda_version} in {seconds} s{cache_words(builds.modules)}; nothing was "
              "loaded or run (no GPU)" + (f"; {left}" if left else ""))
    return sf.ScriptResult("pass", reason, evidence, BUILT)


#: A result that is not a pass reached no evidence level worth recording.
NO_LEVEL: dict[str, Any] = {}


def cache_words(builds: Sequence[ModuleBuild]) -> str:
    """`` (from the build cache of ...)`` for modules ninja found up to date in a kept workspace."""
    cached = [b for b in builds if b.built_by]
    if not cached:
        return ""
    sources = sorted({b.built_by for b in cached})
    names = "" if len(cached) == len(builds) else " ".join(b.name for b in cached) + " "
    return f" ({names}from the build cache of {'; '.join(sources)})"


def decide_ar_fusion(fi: str, target: sf.Arch, res: ArchResolution, gates: dict[str, ModuleGate],
                     toolkit: Toolkit, builds: Builds | None) -> sf.ScriptResult:
    gate = gates["allreduce-fusion"]
    evidence = f"{gate.generator or 'gen_trtllm_comm_module'}: {gate.detail}\n{resolution_evidence(res)}"
    if res.error:
        return sf.ScriptResult("fail", f"FlashInfer {fi} cannot resolve an nvcc target for {target.sm_name} in this "
                               f"image, so no module can be built: {res.error}", resolution_evidence(res))
    if gate.status == "absent":
        return sf.ScriptResult("skip", f"FlashInfer {fi} has no allreduce-fusion JIT module: {gate.detail}", evidence)
    if gate.status == "rejected":
        return sf.ScriptResult("fail", f"FlashInfer {fi} rejects {target.sm_name} for allreduce fusion: {gate.detail}",
                               evidence)
    if gate.status == "error":
        return sf.ScriptResult("error", f"FlashInfer {fi} {gate.generator} raised {gate.detail}", evidence)
    if gate.status == "no-target":
        return sf.ScriptResult("fail", f"FlashInfer {fi} builds allreduce fusion without code for {target.sm_name}: "
                               f"{gate.detail}", evidence)
    if not toolkit.nvcc and not gate.aot:
        # The gate admits the arch, but FlashInfer would have to JIT the module and this image has no
        # compiler: the feature cannot work in this image (its flavour's doing, said in the words and metrics).
        return sf.ScriptResult("fail", sf.no_nvcc(
            f"FlashInfer {fi} admits {target.sm_name} for allreduce fusion ({gate.detail}), but this image "
            f"cannot build the module ({missing_nvcc(toolkit)}, no prebuilt trtllm_comm from the jit-cache)"),
            evidence, NO_JIT)
    if builds is not None:
        return build_verdict(fi, "allreduce fusion", target, gate.detail, toolkit, builds, evidence)
    build = (f"nvcc {toolkit.cuda_version} at {toolkit.nvcc}" if toolkit.nvcc
             else "no nvcc, prebuilt module from the jit-cache")
    return sf.ScriptResult("pass", f"FlashInfer {fi} admits {target.sm_name} for allreduce fusion "
                           f"({gate.detail}); gate only, nothing built or run; {build}", evidence, ADMITTED)


def decide_jit(fi: str, target: sf.Arch, res: ArchResolution, gates: dict[str, ModuleGate], toolkit: Toolkit,
               builds: Builds | None, chosen: Sequence[str] = ()) -> sf.ScriptResult:
    generic = [g for g in gates.values() if g.role == "jit"]
    admitted = [g for g in generic if g.status == "admitted"]
    evidence = "\n".join(f"{g.generator or g.name}: {g.status}: {g.detail}" for g in generic)
    evidence += "\n" + resolution_evidence(res)
    if res.error:
        return sf.ScriptResult("fail", f"FlashInfer {fi} cannot resolve an nvcc target for {target.sm_name} in this "
                               f"image: {res.error}", evidence)
    if not admitted:
        if all(g.status == "absent" for g in generic):
            return sf.ScriptResult("error", f"none of FlashInfer {fi}'s generic JIT generators were found", evidence)
        worst = next(g for g in generic if g.status != "absent")
        return sf.ScriptResult("fail", f"FlashInfer {fi} JIT has no code for {target.sm_name}: {worst.detail}", evidence)
    flags = admitted[0].detail
    if not toolkit.nvcc:
        if all(g.aot for g in admitted):
            return sf.ScriptResult("pass", f"FlashInfer {fi} targets {flags}; no nvcc, but its modules are prebuilt "
                                   "(AOT / jit-cache); nothing built or run here", evidence, ADMITTED)
        return sf.ScriptResult("fail", sf.no_nvcc(
            f"FlashInfer {fi} would JIT for {flags} but finds {missing_nvcc(toolkit)}, and nothing prebuilt "
            "covers its modules: this image cannot JIT-compile them"), evidence, NO_JIT)
    if not toolkit.ninja:
        return sf.ScriptResult("fail", f"FlashInfer {fi} JIT runs 'ninja' from PATH and there is none", evidence)
    refused = chosen_gate_verdict(fi, target, gates, chosen, evidence)
    if refused is not None:
        return refused
    if builds is None:
        return sf.ScriptResult("pass", f"FlashInfer {fi} JIT gates admit {target.sm_name} ({flags}); nvcc "
                               f"{toolkit.cuda_version} at {toolkit.nvcc}; nothing built (--build not given)",
                               evidence, ADMITTED)
    return build_verdict(fi, "JIT", target, flags, toolkit, builds, evidence)


# --------------------------------------------------------------------------------------------
# Main
# --------------------------------------------------------------------------------------------

def parse_args(argv: Sequence[str]) -> Any:
    parser = sf.common_parser(__doc__.splitlines()[0])
    parser.add_argument("--feature", choices=FEATURES, default="flashinfer-ar-fusion",
                        help="which feature this invocation decides")
    parser.add_argument("--build", "--compile", dest="build", action="store_true",
                        help="really build (compile and link) the feature's modules (needs nvcc)")
    parser.add_argument("--build-modules", "--compile-module", dest="build_modules", default="",
                        help="comma-separated modules to build (default: "
                        + "; ".join(f"{f}: {','.join(m)}" for f, m in BUILD_MODULES.items()) + ")")
    parser.add_argument("--build-timeout", "--compile-timeout", dest="build_timeout", type=float, default=900.0,
                        help="seconds for all the builds together; a build past it is a timeout")
    parser.add_argument("--fi-arch-list", default="",
                        help="use this FLASHINFER_CUDA_ARCH_LIST instead of FlashInfer's own choice")
    parser.add_argument("--workspace", default="",
                        help="FlashInfer JIT workspace, kept afterwards (a build cache); default: a fresh temp dir")
    parser.add_argument("--cache-label", default="",
                        help="who fills a kept --workspace (the runner's run id), quoted by a later warm rerun")
    return parser.parse_args(argv)


def chosen_modules(args: Any) -> tuple[str, ...]:
    if args.build_modules:
        return tuple(name.strip() for name in args.build_modules.split(",") if name.strip())
    return BUILD_MODULES[args.feature]


def installed_flashinfer() -> str | None:
    return sf.installed_version("flashinfer-python") or sf.installed_version("flashinfer")


@contextmanager
def fresh_workspace(chosen: str) -> Iterator[None]:
    """FlashInfer's JIT workspace is ``chosen`` (a kept build cache: ninja decides what is up to date in
    it) or a fresh temporary directory (removed afterwards). The environment variables the probe sets
    are restored afterwards, for a caller in the same process."""
    saved = {name: os.environ.get(name) for name in ("FLASHINFER_WORKSPACE_BASE", "FLASHINFER_CUDA_ARCH_LIST")}
    workspace = chosen or tempfile.mkdtemp(prefix="sf-flashinfer-")
    if chosen:
        os.makedirs(chosen, exist_ok=True)
    os.environ["FLASHINFER_WORKSPACE_BASE"] = workspace
    try:
        yield
    finally:
        if not chosen:
            shutil.rmtree(workspace, ignore_errors=True)
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def main(argv: Sequence[str]) -> None:
    args = parse_args(argv)
    fi = installed_flashinfer()
    if fi is None:
        sf.emit("skip", "FlashInfer is not installed in this image", facts=sf.collect_facts())
    with fresh_workspace(args.workspace):
        result, metrics, torch = probe(args, fi)
    sf.emit_result(result, sf.collect_facts(torch_module=torch), metrics)


def ar_fusion_gate(arch: sf.Arch, gpus: int, interconnect: str) -> sf.ScriptResult:
    """The gate.flashinfer.ar-fusion result for a target, for a caller in this process (the SGLang
    allreduce-fusion probe asks it when SGLang turns the fusion on by itself); gate only, nothing built."""
    fi = installed_flashinfer()
    if fi is None:
        return sf.ScriptResult("skip", "FlashInfer is not installed in this image")
    args = parse_args(["--arch", arch.dotted, "--gpus", str(gpus), "--interconnect", interconnect,
                       "--feature", "flashinfer-ar-fusion"])
    with fresh_workspace(""):
        result, _, _ = probe(args, fi)
    return result


def probe(args: Any, fi: str) -> tuple[sf.ScriptResult, dict[str, Any], Any]:
    """Everything after the workspace is set: import, resolve, gate, build, decide."""
    torch, error = sf.try_import("torch")
    if torch is None:
        return sf.ScriptResult("fail", f"torch does not import, so FlashInfer cannot: {error}", error), {}, None
    flashinfer, error = sf.try_import("flashinfer")
    if flashinfer is None:
        return sf.ScriptResult("fail", f"FlashInfer {fi} fails to import: {error}", error), {}, torch
    context_module, error = sf.try_import("flashinfer.compilation_context")
    if context_module is None:
        return sf.ScriptResult("skip", f"FlashInfer {fi} predates FLASHINFER_CUDA_ARCH_LIST arch gates (< 0.3.1): it "
                               "takes archs from torch.utils.cpp_extension and has no gate to evaluate without a GPU",
                               error), {}, torch
    core, error = sf.try_import("flashinfer.jit.core")
    cpp_ext, cpp_error = sf.try_import("flashinfer.jit.cpp_ext")
    if core is None or cpp_ext is None:
        return sf.ScriptResult("error", f"FlashInfer {fi} JIT internals did not import: {error or cpp_error}",
                               error or cpp_error), {}, torch
    target = args.arch
    res = resolve_archs(context_module.CompilationContext, torch, target, args.gpus, args.fi_arch_list)
    toolkit = find_toolkit(cpp_ext)
    metrics: dict[str, Any] = {
        "flashinfer": fi, "arch_source": res.source, "FLASHINFER_CUDA_ARCH_LIST": res.env_value,
        "target_archs": format_archs(res.archs), "fi_cuda_home": toolkit.cuda_home,
        "fi_cuda_version": toolkit.cuda_version or toolkit.version_error, "fi_nvcc": toolkit.nvcc,
        "ninja": toolkit.ninja}
    gates: dict[str, ModuleGate] = {}
    specs: dict[str, Any] = {}
    if not res.error:
        refresh_shared_context(core)
        flags = global_gencode(context_module.CompilationContext)
        for module_probe in module_probes(target):
            gate, spec = evaluate_module(module_probe, torch, target, flags)
            gates[gate.name], specs[gate.name] = gate, spec
    else:
        gates = {p.name: ModuleGate(p.name, p.role, "error", "", "target arch unresolved") for p in module_probes(target)}
    metrics["modules"] = {name: gate.status for name, gate in gates.items()}
    metrics["module_details"] = {name: gate.detail[:400] for name, gate in gates.items()}
    metrics["module_aot"] = {name: gate.aot for name, gate in gates.items() if gate.aot is not None}
    chosen = chosen_modules(args)
    builds = maybe_build(args, chosen, gates, specs, toolkit)
    if builds is not None:
        metrics["builds"] = {b.name: b.metrics() for b in builds.modules}
    jit = decide_jit(fi, target, res, gates, toolkit, builds if args.feature == "flashinfer-jit" else None,
                     chosen if args.build and args.feature == "flashinfer-jit" else ())
    fusion = decide_ar_fusion(fi, target, res, gates, toolkit,
                              builds if args.feature == "flashinfer-ar-fusion" else None)
    metrics["feature_status"] = {"flashinfer-jit": jit.status, "flashinfer-ar-fusion": fusion.status}
    return (jit if args.feature == "flashinfer-jit" else fusion), metrics, torch


def maybe_build(args: Any, chosen: Sequence[str], gates: dict[str, ModuleGate], specs: dict[str, Any],
                toolkit: Toolkit) -> Builds | None:
    """Build the chosen modules the gates admit and nothing prebuilt covers, side by side (each its own
    ninja: the machine's cores stay busy while one module's largest file compiles alone) within the build
    budget; None when not asked, no toolchain, or a chosen gate already decided (rejected, unknown): the
    decision then needs no build. The first module in the chosen order that did not build decides."""
    if not args.build or not toolkit.nvcc or not toolkit.ninja:
        return None
    if any(gates.get(name) is None or gates[name].status in ("rejected", "no-target", "error") for name in chosen):
        return None
    to_build: list[tuple[str, Any]] = []
    left_out: list[tuple[str, str]] = []
    for name in chosen:
        gate, spec = gates[name], specs.get(name)
        refusal = serving_refusal(name, args) if gate.status == "admitted" and not gate.aot else ""
        if refusal:
            left_out.append((name, refusal))
        elif gate.status == "absent" or spec is None:
            left_out.append((name, gate.detail or "no module spec"))
        elif gate.aot:
            left_out.append((name, "prebuilt (AOT / jit-cache), FlashInfer loads it without a build"))
        else:
            to_build.append((name, spec))
    started = time.monotonic()
    deadline = started + args.build_timeout
    if not to_build:
        return Builds((), tuple(left_out))
    with concurrent.futures.ThreadPoolExecutor(max_workers=len(to_build)) as pool:
        futures = [pool.submit(build_module, name, spec, toolkit, deadline - time.monotonic(), args.cache_label)
                   for name, spec in to_build]
        built = tuple(future.result() for future in futures)
    return Builds(built, tuple(left_out), round(time.monotonic() - started, 1))


if __name__ == "__main__":
    sf.run_main(main, sys.argv[1:])
