"""Readers of SGLang's own code in an unpacked ``sglang`` wheel: the communicator gates, the
allreduce-fusion gate and auto-enable, trtllm_mha's arch checks and the flags that name a feature.

The ``ast`` reading of SGLang's files is shared with the in-image gate probe: it lives in
``stackforge/inimage/_sglang_source.py`` (the probe imports it beside itself, these readers as
:mod:`stackforge.inimage._sglang_source`), and every lookup there takes the wheel's root.
Nothing here imports SGLang or torch.
"""

from __future__ import annotations

import ast
import os
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

from stackforge.core.wheel_readings import CodeSite, ReadContext, ReaderSpec, Reading, ReadingStatus
from stackforge.inimage import _sglang_source as source
from stackforge.wheels.readers._reader import DeclaredReader, gate_reading, reads, specs

DIST = "sglang"
COMM_DIR, FUSION_FILE, FUSION_GATE = source.COMM_DIR, source.FUSION_FILE, source.FUSION_GATE
#: Where SGLang declares its options: argparse strings in ``server_args.py`` up to 0.5.13.post1,
#: annotated ServerArgs fields from 0.5.14, one Struct per namespace in ``arg_groups/fields/`` in 0.5.23.
OPTION_FILES = ("srt/server_args.py", "srt/arg_groups")
FIELD_FILES = ("srt/server_args.py", "srt/arg_groups/fields")
#: Where the attention-backend checks live: ServerArgs, then the ``arg_groups`` hooks (0.5.19+).
BACKEND_CHECK_FILES = ("srt/server_args.py", "srt/arg_groups")
TRTLLM_MHA = "trtllm_mha"
PCIE_IPC_ENV = "SGLANG_ENABLE_PCIE_IPC_ALLREDUCE"


# --------------------------------------------------------------------------------------------
# Small helpers: files under the root, code sites, the context
# --------------------------------------------------------------------------------------------

def sglang_path(root: Path, relative: str) -> str | None:
    return source.sglang_file(relative, str(root))


def site(root: Path, path: str, line: int) -> CodeSite:
    """The line ``line`` of ``path`` (absolute, or relative to the root) as a code site."""
    full = Path(path) if os.path.isabs(path) else root / path
    lines = full.read_text(encoding="utf-8").splitlines()
    return CodeSite(full.relative_to(root).as_posix(), line, lines[line - 1].strip())


def missing(root: Path, relative: str, name: str) -> CodeSite:
    """A site saying ``name`` is absent: the file of the sglang package is not there (no code), or it
    is there without ``name`` (the code says so, so evidence never calls a present file absent)."""
    there = sglang_path(root, relative) is not None
    return CodeSite(f"sglang/{relative}", 0, f"no {name} in this file" if there else "")


def where(found: CodeSite) -> str:
    return f"{found.path}:{found.line}"


def major_of(ctx: ReadContext) -> int:
    return int(ctx.arch.split(".")[0])


def python_files(root: Path, relatives: Iterable[str]) -> Iterator[str]:
    """The files (and the ``.py`` files under the folders) of the sglang package, in the given order."""
    for relative in relatives:
        full = root / "sglang" / relative
        if full.is_file():
            yield str(full)
        elif full.is_dir():
            yield from (str(p) for p in sorted(full.rglob("*.py")))


# --------------------------------------------------------------------------------------------
# torch-symm-mem: the size table and how the constructor indexes it
# --------------------------------------------------------------------------------------------

def unread(root: Path, fact: str, gate: source.GateUnread, absent_file: str, absent_name: str,
           depends: tuple[str, ...] = ()) -> Reading:
    """The reading of a gate whose code was not there (ABSENT) or not found in its file (UNDECIDED,
    depending on ``depends`` as a decided reading would)."""
    if gate.absent:
        return Reading(fact, ReadingStatus.ABSENT, gate.why, (missing(root, absent_file, absent_name),))
    return Reading(fact, ReadingStatus.UNDECIDED, gate.why, (site(root, gate.path, gate.line),), depends)


@reads("torch-symm-mem",
       "TORCH_SYMM_MEM_ALL_REDUCE_MAX_SIZES and how TorchSymmMemCommunicator.__init__ indexes it")
def read_torch_symm_mem(root: Path, ctx: ReadContext) -> Reading:
    """Replays ``TorchSymmMemCommunicator.__init__``'s gates for the capability and the GPU count
    (decided by :meth:`~stackforge.inimage._sglang_source.SymmMemGate.decide`, as the gate probe's
    static path decides them)."""
    found = source.symm_mem_gate(str(root))
    if isinstance(found, source.GateUnread):
        return unread(root, "torch-symm-mem", found, f"{COMM_DIR}/torch_symm_mem.py", "TorchSymmMemCommunicator")
    major, size = major_of(ctx), ctx.gpu_count
    depends = ("arch", "gpu_count")
    table_site = site(root, found.table_path, found.table_line)
    access_site = site(root, found.comm_path, found.lookup_line)
    lookup = (f"{found.table_name}[self.device_capability]" if found.style == "index"
              else f"{found.table_name}.get(self.device_capability)")
    admitted = {cap: sorted(sizes) for cap, sizes in found.table.items()}
    decision = found.decide(major, size)
    if decision == "below-floor":
        floor_site = site(root, found.comm_path, found.floor_line)
        return Reading("torch-symm-mem", ReadingStatus.UNAVAILABLE,
                       f"{where(floor_site)} device_capability < {found.floor}: capability {major} "
                       "is refused (disabled)", (floor_site,), depends)
    if decision == "lookup-unknown":
        return Reading("torch-symm-mem", ReadingStatus.UNDECIDED,
                       f"capability {major} is not in {found.table_name} {admitted}, and how the constructor "
                       "looks it up was not found", (table_site,), depends)
    if decision == "capability":
        outcome = "raises KeyError" if found.style == "index" else "disabled=True (communicator not available)"
        return Reading("torch-symm-mem", ReadingStatus.UNAVAILABLE,
                       f"{where(access_site)} {lookup}: capability {major} not in {admitted}: {outcome}",
                       (access_site, table_site), depends,
                       manner="raises KeyError" if found.style == "index" else "disabled")
    if decision == "world-size":
        return Reading("torch-symm-mem", ReadingStatus.UNAVAILABLE,
                       f"{where(table_site)} {found.table_name}[{major}] admits world sizes "
                       f"{admitted[major]}: {size} GPUs disabled", (table_site, access_site), depends)
    admits = (f"{where(table_site)} {found.table_name}[{major}][{size}] = "
              f"{found.table[major][size] // (1 << 20)} MiB (looked up at {where(access_site)} with "
              f"{'.get' if found.style == 'get' else 'an index'})")
    if found.multicast_line is None:
        return Reading("torch-symm-mem", ReadingStatus.AVAILABLE, admits, (table_site, access_site), depends)
    multicast_site = site(root, found.comm_path, found.multicast_line)
    sites = (table_site, access_site, multicast_site)
    if not ctx.multicast:
        return Reading("torch-symm-mem", ReadingStatus.UNAVAILABLE,
                       f"{admits}; {where(multicast_site)} multicast_ptr == 0 disables it and the target "
                       "has no multicast", sites, (*depends, "multicast"))
    return Reading("torch-symm-mem", ReadingStatus.AVAILABLE,
                   f"{admits}; {where(multicast_site)} needs multicast, which the target has", sites,
                   (*depends, "multicast"))


# --------------------------------------------------------------------------------------------
# custom-allreduce: supported world sizes and the PCIe gate
# --------------------------------------------------------------------------------------------

@reads("custom-allreduce",
       "CustomAllreduce._SUPPORTED_WORLD_SIZES, the `world_size > 2 and not full_nvlink` gate, and "
       "CustomAllReduceV2 where dispatch_custom_allreduce picks it by default")
def read_custom_allreduce(root: Path, ctx: ReadContext) -> Reading:
    """``CustomAllreduce``: world size in ``_SUPPORTED_WORLD_SIZES``, then ``world_size > 2 and not
    full_nvlink`` disables it (in ``custom_all_reduce_utils.can_use_custom_all_reduce_with_nvlink``
    from 0.5.10); SGLang's code has no capability floor for it, the P2P check runs on the hardware.
    Where ``dispatch_custom_allreduce`` picks ``CustomAllReduceV2`` by default (0.5.12+), V2's own
    gates decide first: it needs full NVLink at every world size, and a refused V2 leaves NCCL
    unless the dispatch falls back to ``CustomAllreduce`` (0.5.13+).
    Decided by :meth:`~stackforge.inimage._sglang_source.CustomArGate.decide`, as the gate probe's
    static path decides it."""
    depends = ("gpu_count", "interconnect")
    found = source.custom_ar_gate(str(root))
    if isinstance(found, source.GateUnread):
        return unread(root, "custom-allreduce", found, source.CAR_FILES[0], "CustomAllreduce", depends)
    sizes_site = site(root, found.main_path, found.sizes_line)
    gate_site = site(root, found.gate_path, found.gate_line)
    sites = (sizes_site, gate_site)
    size, threshold, sizes = ctx.gpu_count, found.threshold, found.sizes
    full_nvlink = ctx.interconnect != "pcie"
    decision = found.decide(size, full_nvlink=full_nvlink)
    v2_said = ""
    if found.v2 is not None:
        v2, v2_sites = found.v2, custom_ar_v2_sites(root, found.v2)
        sites = (*v2_sites.values(), *sites)
        refused = v2.refuses(size, full_nvlink, threshold)
        v2_said = (f"{where(v2_sites['switch'])} {v2.switch} (on by default) picks CustomAllReduceV2; "
                   + (custom_ar_v2_refusal(refused, v2, v2_sites, size, ctx.interconnect) if refused else ""))
        if refused is None:
            return Reading("custom-allreduce", ReadingStatus.AVAILABLE,
                           f"{v2_said}{where(v2_sites['sizes'])} world sizes {v2.sizes} admit {size}, and "
                           f"{ctx.interconnect} is full NVLink (the P2P check runs on the hardware)", sites, depends)
        if decision == "v2-sizes-unread":
            return Reading("custom-allreduce", ReadingStatus.UNDECIDED,
                           f"{v2_said}, and CustomAllreduce, the fallback, would not keep them", sites, depends)
        if decision.startswith("v2-"):
            return Reading("custom-allreduce", ReadingStatus.UNAVAILABLE,
                           f"{v2_said}; {where(v2_sites['switch'])} the dispatch returns it unconditionally: no "
                           "fallback to CustomAllreduce (NCCL all-reduce)", sites, depends)
        v2_said += f"; {where(v2_sites['fallback'])} the dispatch falls back to CustomAllreduce: "
    if decision == "one-gpu":
        return Reading("custom-allreduce", ReadingStatus.UNAVAILABLE,
                       "one GPU: SGLang builds no custom all-reduce", sites, depends)
    if decision == "world-size":
        return Reading("custom-allreduce", ReadingStatus.UNAVAILABLE,
                       f"{v2_said}{where(sizes_site)} _SUPPORTED_WORLD_SIZES = {sizes}: {size} GPUs disabled",
                       sites, depends)
    if decision == "pcie":
        return Reading("custom-allreduce", ReadingStatus.UNAVAILABLE,
                       f"{v2_said}{where(gate_site)} world_size > {threshold} and not full_nvlink: {size} PCIe "
                       "GPUs disabled", sites, depends)
    return Reading("custom-allreduce", ReadingStatus.AVAILABLE,
                   f"{v2_said}{where(sizes_site)} _SUPPORTED_WORLD_SIZES = {sizes} admits {size}; {where(gate_site)} "
                   f"world_size > {threshold} and not full_nvlink passes for {ctx.interconnect} "
                   "(the P2P check runs on the hardware)", sites, depends)


def custom_ar_v2_sites(root: Path, v2: source.CustomArV2) -> dict[str, CodeSite]:
    """The dispatch's switch, V2's world sizes, its own NVLink test and the dispatch's fallback test,
    each where the code has it."""
    found = {"switch": (v2.dispatch_path, v2.dispatch_line), "sizes": (v2.path, v2.sizes_line),
             "nvlink": (v2.path, v2.nvlink_line), "fallback": (v2.dispatch_path, v2.fallback_line)}
    return {name: site(root, path, line) for name, (path, line) in found.items() if line}


def custom_ar_v2_refusal(refused: str, v2: source.CustomArV2, v2_sites: dict[str, CodeSite], size: int,
                         interconnect: str) -> str:
    if refused == "nvlink":
        return f"{where(v2_sites['nvlink'])} it needs full NVLink: {size} GPUs over {interconnect} disable it"
    if refused == "world-size":
        return f"{where(v2_sites['sizes'])} its world sizes {v2.sizes}: {size} GPUs disable it"
    if refused == "sizes-unread":
        return (f"its world sizes are computed at run time (not a literal in sglang/{source.CAR_V2_FILE}): "
                f"whether it keeps {size} GPUs is not in the files")
    return f"the shared gate world_size > K and not full_nvlink disables it for {size} GPUs over {interconnect}"


# --------------------------------------------------------------------------------------------
# flashinfer-ar-fusion: SGLang's own arch gate, and ServerArgs turning fusion on by itself
# --------------------------------------------------------------------------------------------

@reads("flashinfer-ar-fusion", "_resolve_backend's arch check in srt/layers/flashinfer_comm_fusion.py")
def read_ar_fusion_gate(root: Path, ctx: ReadContext) -> Reading:
    """``_resolve_backend`` in ``srt/layers/flashinfer_comm_fusion.py`` (0.5.14+): its
    ``if not (is_sm90 or is_sm100...): raise`` evaluated for the capability major by
    :meth:`~stackforge.inimage._sglang_source.FusionGate.decide`, as the gate probe's static path does."""
    found = source.fusion_gate(str(root))
    if isinstance(found, source.GateUnread) and found.absent:
        # No gate of SGLang's own: SGLang admits the arch and FlashInfer's gate alone decides, so a
        # matrix cell takes FlashInfer's reading rather than a "fail" for a gate that is not there.
        return Reading("flashinfer-ar-fusion", ReadingStatus.AVAILABLE,
                       f"{found.why}: SGLang has no arch gate of its own (FlashInfer's decides)",
                       (missing(root, FUSION_FILE, f"def {FUSION_GATE}"),))
    if isinstance(found, source.GateUnread):
        return Reading("flashinfer-ar-fusion", ReadingStatus.UNDECIDED, found.why,
                       (site(root, found.path, found.line),))
    sites = (site(root, found.path, found.line), site(root, found.path, found.raise_line))
    test = ast.unparse(found.test)
    try:
        rejected = found.decide(major_of(ctx)) != source.ADMITTED
    except ValueError as exc:
        return Reading("flashinfer-ar-fusion", ReadingStatus.UNDECIDED,
                       f"{where(sites[0])} `{test}` could not be evaluated: {exc}", sites, ("arch",))
    verdict = f"raises {found.message}" if rejected else "passes"
    return gate_reading("flashinfer-ar-fusion", not rejected,
                        f"{where(sites[0])} {FUSION_GATE}: `if {test}` for capability "
                        f"{ctx.arch}: {verdict} (flags read as capability majors)", sites, ("arch",))


@reads("flashinfer-ar-fusion:autoenable",
       "ServerArgs / the overrides pass turning FlashInfer allreduce fusion on by itself")
def read_ar_fusion_autoenable(root: Path, ctx: ReadContext) -> Reading:
    """Does ServerArgs turn ``enable_flashinfer_allreduce_fusion`` on by itself for the arch? Every
    ``self.enable_flashinfer_allreduce_fusion = True`` (0.5.23: the overrides pass's returns) with the
    conditions on its path evaluated for each model architecture they name: platform flags as
    capability majors, fields at their defaults, ``tp_size`` = the GPU count, one node.
    AVAILABLE = turned on for some architecture; UNAVAILABLE = for none; ABSENT = no such code."""
    depends = ("arch", "gpu_count")
    fact = "flashinfer-ar-fusion:autoenable"
    found = source.autoenable_sites(str(root))
    if isinstance(found, str):
        passes = source.pass_sites(str(root))
        if isinstance(passes, str):
            return Reading(fact, ReadingStatus.ABSENT, f"no auto-enable: {relative(root, found)}; "
                           f"{relative(root, passes)}",
                           (missing(root, "srt/server_args.py", "enable_flashinfer_allreduce_fusion = True"),))
        auto = source.read_pass(major_of(ctx), ctx.gpu_count, passes, "wheel tier", str(root))
        sites = tuple(site(root, passes.path, s.line) for s in passes.sites)
    else:
        fusion_sites, path = found
        auto = source.read_autoenable(major_of(ctx), ctx.gpu_count, fusion_sites, path, "wheel tier", str(root))
        sites = tuple(site(root, path, s.line) for s in fusion_sites)
    at = ", ".join(where(s) for s in sites)
    if auto.archs:
        return Reading(fact, ReadingStatus.AVAILABLE,
                       f"{at}: turned on by itself on capability {ctx.arch} with {ctx.gpu_count} GPUs for "
                       f"{', '.join(auto.archs)}", sites, depends)
    if auto.undecided:
        return Reading(fact, ReadingStatus.UNDECIDED,
                       f"{at}: for {', '.join(auto.undecided)} the conditions depend on what the files do not "
                       "say", sites, depends)
    return Reading(fact, ReadingStatus.UNAVAILABLE,
                   f"{at}: not turned on for capability {ctx.arch} with {ctx.gpu_count} GPUs "
                   f"(architectures named: {', '.join(auto.named)})", sites, depends)


def relative(root: Path, text: str) -> str:
    """A message naming absolute paths under the root, with the root left out."""
    return text.replace(f"{root}{os.sep}", "")


# --------------------------------------------------------------------------------------------
# sglang-trtllm-mha-prefill / sglang-trtllm-mha-decode: `if <backend> == "trtllm_mha" and not (<arch flags>): raise`
# --------------------------------------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class BackendGate:
    """One ``raise`` guarded by a trtllm_mha backend test and an arch-flag test."""

    path: str
    line: int                  # the `if` holding the arch test
    phases: frozenset[str]     # prefill / decode
    arch_tests: tuple[ast.expr, ...]
    other_tests: tuple[ast.expr, ...] = ()   # what else the raise needs (a KV-cache dtype, CP): not an arch gate


def conjuncts(test: ast.expr, taken: bool) -> list[ast.expr]:
    """The tests that must all hold for a path step (an ``else`` step is its negated test)."""
    if not taken:
        return [ast.UnaryOp(ast.Not(), test)]
    if isinstance(test, ast.BoolOp) and isinstance(test.op, ast.And):
        return [leaf for value in test.values for leaf in conjuncts(value, True)]
    return [test]


def backend_phases(test: ast.expr) -> frozenset[str] | None:
    """Which phase(s) a test on the trtllm_mha backend selects: ``prefill_backend == "trtllm_mha"``
    prefill, ``attention_backend == ...`` both, an ``or`` of them their union; a test that names
    trtllm_mha another way (0.5.15: ``"trtllm_mha" in (prefill_backend, decode_backend)``) both.
    None: the test does not name trtllm_mha."""
    if not any(isinstance(n, ast.Constant) and n.value == TRTLLM_MHA for n in ast.walk(test)):
        return None
    values = test.values if isinstance(test, ast.BoolOp) and isinstance(test.op, ast.Or) else [test]
    phases: set[str] = set()
    for value in values:
        name = ast.unparse(value.left) if isinstance(value, ast.Compare) and isinstance(value.ops[0], ast.Eq) else ""
        phases |= {"prefill"} if "prefill" in name else {"decode"} if "decode" in name else {"prefill", "decode"}
    return frozenset(phases)


def is_arch_test(test: ast.expr) -> bool:
    try:
        source.arch_test(test, 0)
    except ValueError:
        return False
    return True


def backend_gates(root: Path) -> list[BackendGate]:
    """Every raise whose path holds trtllm_mha backend tests and arch-flag tests; one that also needs
    something else (0.5.19+: fp8 KV cache on SM120, context parallelism) keeps it in ``other_tests``."""
    gates = []
    for path in python_files(root, BACKEND_CHECK_FILES):
        tree = source.parse_file(path)
        for function in (n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))):
            for statement, steps in source.guarded_statements(function.body, ()):
                if not isinstance(statement, ast.Raise) or not steps:
                    continue
                tests = [t for test, taken in steps for t in conjuncts(test, taken)]
                phases = [p for t in tests if (p := backend_phases(t)) is not None]
                arch = [t for t in tests if backend_phases(t) is None and is_arch_test(t)]
                if phases and arch:
                    line = next(test.lineno for test, _ in reversed(steps) if any(a in conjuncts(test, True)
                                                                                 for a in arch))
                    other = tuple(t for t in tests if backend_phases(t) is None and t not in arch)
                    gates.append(BackendGate(path, line, frozenset.intersection(*phases), tuple(arch), other))
    return gates


def backend_named(root: Path) -> CodeSite | None:
    """The first place the option files name ``"trtllm_mha"`` (the backend exists)."""
    for path in python_files(root, BACKEND_CHECK_FILES):
        for node in ast.walk(source.parse_file(path)):
            if isinstance(node, ast.Constant) and node.value == TRTLLM_MHA:
                return site(root, path, node.lineno)
    return None


def trtllm_reader(phase: str) -> DeclaredReader:
    fact = f"sglang-trtllm-mha-{phase}"

    @reads(fact, f"the trtllm_mha {phase} backend's arch check (server_args.py / arg_groups)")
    def read(root: Path, ctx: ReadContext) -> Reading:
        """SGLang's check of the trtllm_mha attention backend for one phase on the arch."""
        named = backend_named(root)
        if named is None:
            return Reading(fact, ReadingStatus.ABSENT, "no trtllm_mha attention backend in this SGLang",
                           (missing(root, "srt/server_args.py", TRTLLM_MHA),))
        found = [g for g in backend_gates(root) if phase in g.phases]
        gates = [g for g in found if not g.other_tests]
        major = major_of(ctx)
        also = [g for g in found if g.other_tests and all(source.arch_test(t, major) for t in g.arch_tests)]
        also_sites = tuple(site(root, g.path, g.line) for g in also)
        conditional = "".join(f"; {where(s)} also raises when {' and '.join(ast.unparse(t) for t in g.other_tests)}"
                              for s, g in zip(also_sites, also))
        if not gates:
            return Reading(fact, ReadingStatus.AVAILABLE,
                           f"{where(named)} names trtllm_mha; no arch check raises for {phase}", (named,), ("arch",))
        rejecting = [g for g in gates if all(source.arch_test(t, major) for t in g.arch_tests)]
        sites = tuple(site(root, g.path, g.line) for g in (rejecting or gates))
        tests = "; ".join(f"{where(s)} `if {' and '.join(ast.unparse(t) for t in g.arch_tests)}: raise`"
                          for s, g in zip(sites, rejecting or gates))
        if rejecting:
            return Reading(fact, ReadingStatus.UNAVAILABLE,
                           f"{tests}: raises for capability {ctx.arch} ({phase})", sites, ("arch",))
        return Reading(fact, ReadingStatus.AVAILABLE,
                       f"{tests}: capability {ctx.arch} passes ({phase}){conditional}", (*sites, *also_sites),
                       ("arch",))

    read.__name__ = f"read_trtllm_{phase}"
    return read


# --------------------------------------------------------------------------------------------
# Options that name a feature: --enable-torch-symm-mem, --moe-a2a-backend
# --------------------------------------------------------------------------------------------

def option_site(root: Path, option: str) -> CodeSite | None:
    """Where SGLang declares ``--option``: its argparse string, or the annotated field it is made from."""
    field = option.lstrip("-").replace("-", "_")
    for path in python_files(root, OPTION_FILES):
        for node in ast.walk(source.parse_file(path)):
            if isinstance(node, ast.Constant) and node.value == option:
                return site(root, path, node.lineno)
    for path in python_files(root, FIELD_FILES):
        for cls in (n for n in ast.walk(source.parse_file(path)) if isinstance(n, ast.ClassDef)):
            line = next((s.lineno for s in cls.body if isinstance(s, ast.AnnAssign)
                         and isinstance(s.target, ast.Name) and s.target.id == field), None)
            if line is not None:
                return site(root, path, line)
    return None


def option_reader(fact: str, option: str) -> DeclaredReader:
    @reads(fact, f"the {option} option (server_args.py / arg_groups/fields)")
    def read(root: Path, ctx: ReadContext) -> Reading:
        """Whether this SGLang declares the option (its argparse string or its ServerArgs field)."""
        found = option_site(root, option)
        if found is None:
            return Reading(fact, ReadingStatus.ABSENT, f"SGLang declares no {option}",
                           (missing(root, "srt/server_args.py", option),))
        return Reading(fact, ReadingStatus.AVAILABLE, f"{where(found)} declares {option}", (found,))

    read.__name__ = f"read_option_{option.lstrip('-').replace('-', '_')}"
    return read


# --------------------------------------------------------------------------------------------
# sglang-pcie-ipc-ar: SGLANG_ENABLE_PCIE_IPC_ALLREDUCE and FlashInfer's PCIe-IPC all-reduce
# --------------------------------------------------------------------------------------------

def env_site(root: Path, name: str) -> CodeSite | None:
    """Where ``srt/environ.py`` declares an environment variable (``NAME = EnvBool(...)``)."""
    path = sglang_path(root, "srt/environ.py")
    for cls in (n for n in ast.walk(source.parse_file(path)) if isinstance(n, ast.ClassDef)) if path else []:
        line = source.assignment_line(cls, name)
        if line:
            return site(root, path, line)
    return None


@reads("sglang-pcie-ipc-ar", "SGLANG_ENABLE_PCIE_IPC_ALLREDUCE and pcie_ipc_ar.py's supported world sizes")
def read_pcie_ipc_ar(root: Path, ctx: ReadContext) -> Reading:
    """``SGLANG_ENABLE_PCIE_IPC_ALLREDUCE`` (off by default) builds ``PcieIpcCommunicator`` for the tp
    group when its ``_SUPPORTED_WORLD_SIZES`` admits the world size; it needs FlashInfer's
    ``flashinfer.comm.PcieIpcAllReduceWorkspace``. SGLang does not check the interconnect for it."""
    fact = "sglang-pcie-ipc-ar"
    declared = env_site(root, PCIE_IPC_ENV)
    relative_comm = f"{COMM_DIR}/pcie_ipc_ar.py"
    path = sglang_path(root, relative_comm)
    if declared is None or path is None:
        return Reading(fact, ReadingStatus.ABSENT, f"no {PCIE_IPC_ENV} / {relative_comm} in this SGLang",
                       (declared or missing(root, "srt/environ.py", PCIE_IPC_ENV),)
                       + (() if path else (missing(root, relative_comm, "PcieIpcCommunicator"),)))
    tree = source.parse_file(path)
    sizes = source.module_constants(tree).get("_SUPPORTED_WORLD_SIZES")
    line = source.assignment_line(tree, "_SUPPORTED_WORLD_SIZES")
    needs = next((n for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)
                  and (n.module or "").startswith("flashinfer")
                  and any(a.name == "PcieIpcAllReduceWorkspace" for a in n.names)), None)
    if not isinstance(sizes, list) or not line:
        return Reading(fact, ReadingStatus.UNDECIDED, f"{relative_comm} has no _SUPPORTED_WORLD_SIZES literal",
                       (declared,), ("gpu_count",))
    sites = (declared, site(root, path, line), *((site(root, path, needs.lineno),) if needs else ()))
    needed = f"; needs {needs.module}.PcieIpcAllReduceWorkspace (FlashInfer)" if needs else ""
    if ctx.gpu_count not in sizes:
        return Reading(fact, ReadingStatus.UNAVAILABLE,
                       f"{where(sites[1])} _SUPPORTED_WORLD_SIZES = {tuple(sizes)}: {ctx.gpu_count} GPUs not built",
                       sites, ("gpu_count",))
    return Reading(fact, ReadingStatus.AVAILABLE,
                   f"{where(declared)} {PCIE_IPC_ENV} (off by default); {where(sites[1])} _SUPPORTED_WORLD_SIZES = "
                   f"{tuple(sizes)} admits {ctx.gpu_count}{needed}", sites, ("gpu_count",))


READERS: tuple[ReaderSpec, ...] = specs(
    DIST, read_torch_symm_mem, option_reader("torch-symm-mem:flag", "--enable-torch-symm-mem"),
    read_custom_allreduce, read_ar_fusion_gate, read_ar_fusion_autoenable, trtllm_reader("prefill"),
    trtllm_reader("decode"), read_pcie_ipc_ar, option_reader("ep-a2a", "--moe-a2a-backend"))
