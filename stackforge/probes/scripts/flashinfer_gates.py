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
3. With ``--compile`` (and an nvcc where FlashInfer looks for it), one small module is really
   JIT-compiled for the arch through FlashInfer's generated ninja file, with a timeout. That is
   compile-only: without a GPU nothing is loaded or run, and the link step is reported apart.

An image without nvcc (the runtime flavour, CUDA 12.x toolkit wheels) cannot JIT anything: where the
gates admit the arch and nothing prebuilt covers it, the verdict is a skip, "no nvcc in this flavour",
not a fail, because the missing compiler is the image's flavour, not FlashInfer. A gate that rejects
the arch is FlashInfer's own answer and fails with or without nvcc.

``--feature`` picks which feature this invocation decides; both appear in the metrics.
"""

from __future__ import annotations

import dataclasses
import os
import re
import shutil
import sys
import tempfile
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import _sfprobe as sf

FEATURES = ("flashinfer-jit", "flashinfer-ar-fusion")
GATE_TEXT = "No supported CUDA architectures found"
GENCODE = re.compile(r"code=(sm|compute)_(\d+)([af]?)")


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
    nvcc = os.environ.get("FLASHINFER_NVCC") or os.path.join(cuda_home, "bin", "nvcc")
    usable = os.path.isfile(nvcc) and os.access(nvcc, os.X_OK)
    return Toolkit(cuda_home, version, version_error, nvcc if usable else "", shutil.which("ninja") or "")


def missing_nvcc(toolkit: Toolkit) -> str:
    """Where FlashInfer looked for nvcc, for a reason: its path, or FlashInfer's own words when it
    found no CUDA home at all (its get_cuda_path raised)."""
    if toolkit.cuda_home.startswith("<"):
        return f"no nvcc and no CUDA home ({toolkit.cuda_home[1:-1]})"
    return f"no nvcc at {os.path.join(toolkit.cuda_home, 'bin', 'nvcc')}"


def compile_targets(ninja_text: str) -> tuple[list[str], list[str]]:
    """(object targets, default targets) of a FlashInfer build.ninja."""
    objects = re.findall(r"^build (\S+): (?:cuda_compile|compile)\S*\s", ninja_text, re.MULTILINE)
    defaults = re.findall(r"^default (.+)$", ninja_text, re.MULTILINE)
    return objects, [t for line in defaults for t in line.split()]


def compile_module(spec: Any, toolkit: Toolkit, timeout_s: float) -> dict[str, Any]:
    """Compile the module's objects via FlashInfer's own ninja file; then try the link."""
    try:
        spec.write_ninja()
        ninja_path, build_dir = str(spec.ninja_path), str(spec.build_dir)
        with open(ninja_path, encoding="utf-8") as handle:
            objects, defaults = compile_targets(handle.read())
    except Exception as exc:  # noqa: BLE001
        return {"status": "fail", "stage": "write_ninja", "output": sf.describe_exception(exc)}
    base = [toolkit.ninja, "-v", "-f", ninja_path, "-C", build_dir]
    result = sf.run_command(base + objects, timeout_s)
    outcome: dict[str, Any] = {"stage": "compile", "seconds": round(result.seconds, 1),
                               "objects": len(objects), "output": result.output}
    if result.timed_out:
        return {**outcome, "status": "timeout"}
    if not result.ok:
        return {**outcome, "status": "fail"}
    link = sf.run_command(base + defaults, min(timeout_s, 300))
    link_line = first_error_line(link.output) if not link.ok else ""
    return {**outcome, "status": "ok", "link": "ok" if link.ok else "failed", "link_error": link_line}


def first_error_line(output: str) -> str:
    """The most telling line of compiler/linker output: fatal errors and missing files or
    libraries before generic ``error:`` lines; never the ``collect2``/``ninja`` summaries."""
    lines = [line.strip() for line in output.splitlines() if line.strip()]
    telling = [line for line in lines if not line.startswith(("FAILED:", "ninja:", "collect2:"))]
    for pattern in (r"fatal error|cannot find|undefined reference|No such file", r"\berror\b"):
        for line in telling:
            if re.search(pattern, line, re.IGNORECASE):
                return line[:300]
    return lines[-1][:300] if lines else ""


# --------------------------------------------------------------------------------------------
# Decisions
# --------------------------------------------------------------------------------------------

def resolution_evidence(res: ArchResolution) -> str:
    archs = format_archs(res.archs) if res.archs else "none"
    return f"target archs: {archs} via {res.detail}" + (f"\nFlashInfer error: {res.error}" if res.error else "")


def decide_ar_fusion(fi: str, target: sf.Arch, res: ArchResolution, gates: dict[str, ModuleGate],
                     toolkit: Toolkit, compiled: dict[str, Any] | None) -> sf.ScriptResult:
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
    if compiled is not None and compiled["status"] != "ok":
        return compile_result(fi, "allreduce-fusion", target, compiled, evidence)
    how = "compiled (compile-only)" if compiled else "gate only, nothing compiled or run"
    if not toolkit.nvcc and not gate.aot:
        # The gate admits the arch, but FlashInfer would have to JIT the module and this image has no
        # compiler: a property of the image's flavour, not of FlashInfer, so no verdict on the feature.
        return sf.ScriptResult("skip", sf.no_nvcc(
            f"FlashInfer {fi} admits {target.sm_name} for allreduce fusion ({gate.detail}), but this image "
            f"cannot build the module ({missing_nvcc(toolkit)}, no prebuilt trtllm_comm from the jit-cache)"),
            evidence)
    build = (f"nvcc {toolkit.cuda_version} at {toolkit.nvcc}" if toolkit.nvcc
             else "no nvcc, prebuilt module from the jit-cache")
    return sf.ScriptResult("pass", f"FlashInfer {fi} admits {target.sm_name} for allreduce fusion "
                           f"({gate.detail}); {how}; {build}", evidence)


def decide_jit(fi: str, target: sf.Arch, res: ArchResolution, gates: dict[str, ModuleGate], toolkit: Toolkit,
               compiled: dict[str, Any] | None, compile_name: str) -> sf.ScriptResult:
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
                                   "(AOT / jit-cache)", evidence)
        return sf.ScriptResult("skip", sf.no_nvcc(
            f"FlashInfer {fi} would JIT for {flags} but finds {missing_nvcc(toolkit)}: only prebuilt kernels "
            "can be used here"), evidence)
    if not toolkit.ninja:
        return sf.ScriptResult("fail", f"FlashInfer {fi} JIT runs 'ninja' from PATH and there is none", evidence)
    if compiled is None:
        return sf.ScriptResult("pass", f"FlashInfer {fi} JIT gates admit {target.sm_name} ({flags}); nvcc "
                               f"{toolkit.cuda_version} at {toolkit.nvcc}; not compiled (--compile not given)", evidence)
    if compiled["status"] != "ok":
        return compile_result(fi, compile_name, target, compiled, evidence)
    link = ("link ok" if compiled.get("link") == "ok"
            else f"link step failed here: {compiled.get('link_error', '')}")
    return sf.ScriptResult("pass", f"FlashInfer {fi} JIT-compiled its {compile_name} module for {flags} with nvcc "
                           f"{toolkit.cuda_version} in {compiled['seconds']} s (compile-only: no GPU to load or run it; "
                           f"{link})", evidence + "\n" + compiled["output"][-2500:])


def compile_result(fi: str, name: str, target: sf.Arch, compiled: dict[str, Any], evidence: str) -> sf.ScriptResult:
    output = compiled.get("output", "")
    if compiled["status"] == "timeout":
        return sf.ScriptResult("error", f"compiling FlashInfer {fi}'s {name} module did not finish within "
                               f"{compiled.get('seconds')} s", evidence + "\n" + output[-2000:])
    return sf.ScriptResult("fail", f"FlashInfer {fi}'s {name} module does not compile for {target.sm_name} "
                           f"({compiled.get('stage')}): {first_error_line(output)}", evidence + "\n" + output[-3000:])


# --------------------------------------------------------------------------------------------
# Main
# --------------------------------------------------------------------------------------------

def parse_args(argv: Sequence[str]) -> Any:
    parser = sf.common_parser(__doc__.splitlines()[0])
    parser.add_argument("--feature", choices=FEATURES, default="flashinfer-ar-fusion",
                        help="which feature this invocation decides")
    parser.add_argument("--compile", action="store_true", help="really JIT-compile one module (needs nvcc)")
    parser.add_argument("--compile-module", default="",
                        help="module to compile (default: norm for flashinfer-jit, "
                        "allreduce-fusion for flashinfer-ar-fusion)")
    parser.add_argument("--compile-timeout", type=float, default=900.0)
    parser.add_argument("--fi-arch-list", default="",
                        help="use this FLASHINFER_CUDA_ARCH_LIST instead of FlashInfer's own choice")
    parser.add_argument("--workspace", default="", help="FlashInfer JIT workspace (default: a fresh temp dir)")
    return parser.parse_args(argv)


def installed_flashinfer() -> str | None:
    return sf.installed_version("flashinfer-python") or sf.installed_version("flashinfer")


@contextmanager
def fresh_workspace(chosen: str) -> Iterator[None]:
    """FlashInfer's JIT workspace is ``chosen`` or a fresh temporary directory (removed afterwards): a stale
    JIT cache from an earlier image must not decide the result. The environment variables the probe sets
    are restored afterwards, for a caller in the same process."""
    saved = {name: os.environ.get(name) for name in ("FLASHINFER_WORKSPACE_BASE", "FLASHINFER_CUDA_ARCH_LIST")}
    workspace = chosen or tempfile.mkdtemp(prefix="sf-flashinfer-")
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
    allreduce-fusion probe asks it when SGLang turns the fusion on by itself)."""
    fi = installed_flashinfer()
    if fi is None:
        return sf.ScriptResult("skip", "FlashInfer is not installed in this image")
    args = parse_args(["--arch", arch.dotted, "--gpus", str(gpus), "--interconnect", interconnect,
                       "--feature", "flashinfer-ar-fusion"])
    with fresh_workspace(""):
        result, _, _ = probe(args, fi)
    return result


def probe(args: Any, fi: str) -> tuple[sf.ScriptResult, dict[str, Any], Any]:
    """Everything after the workspace is set: import, resolve, gate, compile, decide."""
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
    compile_name = args.compile_module or ("norm" if args.feature == "flashinfer-jit" else "allreduce-fusion")
    compiled = maybe_compile(args, compile_name, gates, specs, toolkit)
    if compiled is not None:
        metrics["compile"] = {k: v for k, v in compiled.items() if k != "output"}
    jit = decide_jit(fi, target, res, gates, toolkit, compiled if compile_name != "allreduce-fusion" else None,
                     compile_name)
    fusion = decide_ar_fusion(fi, target, res, gates, toolkit,
                              compiled if compile_name == "allreduce-fusion" else None)
    metrics["feature_status"] = {"flashinfer-jit": jit.status, "flashinfer-ar-fusion": fusion.status}
    return (jit if args.feature == "flashinfer-jit" else fusion), metrics, torch


def maybe_compile(args: Any, name: str, gates: dict[str, ModuleGate], specs: dict[str, Any],
                  toolkit: Toolkit) -> dict[str, Any] | None:
    """Compile the chosen module when asked and possible; None when not attempted."""
    if not args.compile or not toolkit.nvcc or not toolkit.ninja:
        return None
    gate = gates.get(name)
    if gate is None:
        return {"status": "fail", "stage": "select", "output": f"unknown module {name!r}; "
                f"known: {', '.join(gates)}"}
    if gate.status != "admitted" or specs.get(name) is None:
        return None  # the gate already decided; there is nothing to compile
    return compile_module(specs[name], toolkit, args.compile_timeout)


if __name__ == "__main__":
    sf.run_main(main, sys.argv[1:])
