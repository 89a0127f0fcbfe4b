"""Readers of SGLang's own code in an unpacked ``sglang`` wheel: the communicator gates, the
allreduce-fusion gate and auto-enable, trtllm_mha's arch checks and the flags that name a feature.

The ``ast`` reading of SGLang's files is shared with the in-image gate probe: it lives in
``stackforge/inimage/_sglang_source.py`` (the probe imports it from the in-image package, these readers as
:mod:`stackforge.inimage._sglang_source`), and every lookup there takes the wheel's root.
Nothing here imports SGLang or torch.
"""

from __future__ import annotations

import ast
import os
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from stackforge.core.wheel_readings import CodeSite, ReadContext, ReaderSpec, Reading, ReadingStatus
from stackforge.inimage import _sglang_source as source
from stackforge.wheels.readers._reader import DeclaredReader, gate_reading, reads, specs

DIST = "sglang"
COMM_DIR = source.COMM.replace("sglang.", "", 1).replace(".", "/")
FUSION_FILE = "srt/layers/flashinfer_comm_fusion.py"
FUSION_GATE = "_resolve_backend"
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


def assignment_line(tree: ast.Module | ast.ClassDef, name: str) -> int | None:
    """Line of the top-level ``name = ...`` / ``name: T = ...`` of a module or class body."""
    for statement in tree.body:
        targets = statement.targets if isinstance(statement, ast.Assign) else \
            [statement.target] if isinstance(statement, ast.AnnAssign) else []
        if any(isinstance(t, ast.Name) and t.id == name for t in targets):
            return statement.lineno
    return None


def class_constant(cls: ast.ClassDef, name: str) -> Any:
    return source.module_constants(ast.Module(body=cls.body, type_ignores=[])).get(name)


# --------------------------------------------------------------------------------------------
# torch-symm-mem: the size table and how the constructor indexes it
# --------------------------------------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class SymmMem:
    """The symmetric-memory communicator as read: its table and the constructor's lookup."""

    table_name: str
    table: dict[int, dict[int, int]]
    table_site: CodeSite
    style: str                    # index (KeyError when missing) | get (disabled) | unknown
    access_site: CodeSite
    floor: tuple[int, CodeSite] | None
    multicast_site: CodeSite | None   # ``if handle.multicast_ptr == 0:`` (disabled without multicast)


def symm_mem(root: Path) -> SymmMem | Reading:
    """The communicator's reading inputs, or the reading when there is nothing to evaluate."""
    table_relative = f"{COMM_DIR}/all_reduce_utils.py"
    table_path = sglang_path(root, table_relative)
    comm = next(((p, cls) for module, cls in source.SYMM_MODULES
                 if (p := source.module_path(module, str(root)))), None)
    if comm is None or table_path is None:
        return Reading("torch-symm-mem", ReadingStatus.ABSENT,
                       "no torch symmetric-memory communicator (torch_symm_mem.py / symm_mem.py and "
                       "all_reduce_utils.py) in this SGLang",
                       (missing(root, f"{COMM_DIR}/torch_symm_mem.py", "TorchSymmMemCommunicator"),))
    table_tree = source.parse_file(table_path)
    constants = source.module_constants(table_tree)
    table_name = next((n for n in source.SYMM_TABLES if isinstance(constants.get(n), dict)), None)
    path, class_name = comm
    cls = source.class_node(source.parse_file(path), class_name)
    if table_name is None or cls is None:
        lacking = f"no {' / '.join(source.SYMM_TABLES)} literal" if table_name is None else f"no class {class_name}"
        return Reading("torch-symm-mem", ReadingStatus.UNDECIDED, f"{lacking} in SGLang's communicator files",
                       (site(root, path, 1),))
    style, line = source.table_access(cls, table_name)
    floor = source.min_capability_site(cls)
    multicast = next((n.lineno for n in ast.walk(cls) if isinstance(n, ast.Compare)
                      and isinstance(n.left, ast.Attribute) and n.left.attr == "multicast_ptr"), None)
    return SymmMem(table_name, constants[table_name], site(root, table_path, assignment_line(table_tree, table_name)),
                   style, site(root, path, line), (floor[0], site(root, path, floor[1])) if floor else None,
                   site(root, path, multicast) if multicast else None)


@reads("torch-symm-mem",
       "TORCH_SYMM_MEM_ALL_REDUCE_MAX_SIZES and how TorchSymmMemCommunicator.__init__ indexes it")
def read_torch_symm_mem(root: Path, ctx: ReadContext) -> Reading:
    """Replays ``TorchSymmMemCommunicator.__init__``'s gates for the capability and the GPU count."""
    found = symm_mem(root)
    if isinstance(found, Reading):
        return found
    major, size = major_of(ctx), ctx.gpu_count
    depends = ("arch", "gpu_count")
    lookup = (f"{found.table_name}[self.device_capability]" if found.style == "index"
              else f"{found.table_name}.get(self.device_capability)")
    admitted = {cap: sorted(sizes) for cap, sizes in found.table.items()}
    if found.floor is not None and major < found.floor[0]:
        return Reading("torch-symm-mem", ReadingStatus.UNAVAILABLE,
                       f"{where(found.floor[1])} device_capability < {found.floor[0]}: capability {major} "
                       "is refused (disabled)", (found.floor[1],), depends)
    if major not in found.table:
        if found.style == "unknown":
            return Reading("torch-symm-mem", ReadingStatus.UNDECIDED,
                           f"capability {major} is not in {found.table_name} {admitted}, and how the constructor "
                           "looks it up was not found", (found.table_site,), depends)
        outcome = "raises KeyError" if found.style == "index" else "disabled=True (communicator not available)"
        return Reading("torch-symm-mem", ReadingStatus.UNAVAILABLE,
                       f"{where(found.access_site)} {lookup}: capability {major} not in {admitted}: {outcome}",
                       (found.access_site, found.table_site), depends,
                       manner="raises KeyError" if found.style == "index" else "disabled")
    if size not in found.table[major]:
        return Reading("torch-symm-mem", ReadingStatus.UNAVAILABLE,
                       f"{where(found.table_site)} {found.table_name}[{major}] admits world sizes "
                       f"{admitted[major]}: {size} GPUs disabled", (found.table_site, found.access_site), depends)
    admits = (f"{where(found.table_site)} {found.table_name}[{major}][{size}] = "
              f"{found.table[major][size] // (1 << 20)} MiB (looked up at {where(found.access_site)} with "
              f"{'.get' if found.style == 'get' else 'an index'})")
    if found.multicast_site is None:
        return Reading("torch-symm-mem", ReadingStatus.AVAILABLE, admits, (found.table_site, found.access_site),
                       depends)
    sites = (found.table_site, found.access_site, found.multicast_site)
    if not ctx.multicast:
        return Reading("torch-symm-mem", ReadingStatus.UNAVAILABLE,
                       f"{admits}; {where(found.multicast_site)} multicast_ptr == 0 disables it and the target "
                       "has no multicast", sites, (*depends, "multicast"))
    return Reading("torch-symm-mem", ReadingStatus.AVAILABLE,
                   f"{admits}; {where(found.multicast_site)} needs multicast, which the target has", sites,
                   (*depends, "multicast"))


# --------------------------------------------------------------------------------------------
# custom-allreduce: supported world sizes and the PCIe gate
# --------------------------------------------------------------------------------------------

@reads("custom-allreduce",
       "CustomAllreduce._SUPPORTED_WORLD_SIZES and the `world_size > 2 and not full_nvlink` gate")
def read_custom_allreduce(root: Path, ctx: ReadContext) -> Reading:
    """``CustomAllreduce``: world size in ``_SUPPORTED_WORLD_SIZES``, then ``world_size > 2 and not
    full_nvlink`` disables it (in ``custom_all_reduce_utils.can_use_custom_all_reduce_with_nvlink``
    from 0.5.10); SGLang's code has no capability floor for it, the P2P check runs on the hardware."""
    depends = ("gpu_count", "interconnect")
    main = sglang_path(root, f"{COMM_DIR}/custom_all_reduce.py")
    if main is None:
        return Reading("custom-allreduce", ReadingStatus.ABSENT, "no custom_all_reduce.py in this SGLang",
                       (missing(root, f"{COMM_DIR}/custom_all_reduce.py", "CustomAllreduce"),))
    paths = [p for p in (main, sglang_path(root, f"{COMM_DIR}/custom_all_reduce_utils.py")) if p]
    trees = {p: source.parse_file(p) for p in paths}
    cls = source.class_node(trees[main], "CustomAllreduce")
    sizes = class_constant(cls, "_SUPPORTED_WORLD_SIZES") if cls else None
    gate = next(((p, g) for p, tree in trees.items() if (g := source.pcie_gate(tree))), None)
    if cls is None or not isinstance(sizes, list) or gate is None:
        return Reading("custom-allreduce", ReadingStatus.UNDECIDED,
                       "CustomAllreduce._SUPPORTED_WORLD_SIZES or the `world_size > K and not full_nvlink` gate "
                       "was not found", (site(root, main, 1),), depends)
    sizes_site = site(root, main, assignment_line(cls, "_SUPPORTED_WORLD_SIZES"))
    gate_path, (threshold, _, gate_line) = gate
    gate_site = site(root, gate_path, gate_line)
    sites = (sizes_site, gate_site)
    size = ctx.gpu_count
    if size <= 1:
        return Reading("custom-allreduce", ReadingStatus.UNAVAILABLE,
                       "one GPU: SGLang builds no custom all-reduce", sites, depends)
    if size not in sizes:
        return Reading("custom-allreduce", ReadingStatus.UNAVAILABLE,
                       f"{where(sizes_site)} _SUPPORTED_WORLD_SIZES = {sizes}: {size} GPUs disabled", sites, depends)
    if size > threshold and ctx.interconnect == "pcie":
        return Reading("custom-allreduce", ReadingStatus.UNAVAILABLE,
                       f"{where(gate_site)} world_size > {threshold} and not full_nvlink: {size} PCIe GPUs disabled",
                       sites, depends)
    return Reading("custom-allreduce", ReadingStatus.AVAILABLE,
                   f"{where(sizes_site)} _SUPPORTED_WORLD_SIZES = {sizes} admits {size}; {where(gate_site)} "
                   f"world_size > {threshold} and not full_nvlink passes for {ctx.interconnect} "
                   "(the P2P check runs on the hardware)", sites, depends)


# --------------------------------------------------------------------------------------------
# flashinfer-ar-fusion: SGLang's own arch gate, and ServerArgs turning fusion on by itself
# --------------------------------------------------------------------------------------------

@reads("flashinfer-ar-fusion", "_resolve_backend's arch check in srt/layers/flashinfer_comm_fusion.py")
def read_ar_fusion_gate(root: Path, ctx: ReadContext) -> Reading:
    """``_resolve_backend`` in ``srt/layers/flashinfer_comm_fusion.py`` (0.5.14+): its
    ``if not (is_sm90 or is_sm100...): raise`` evaluated for the capability major."""
    path = sglang_path(root, FUSION_FILE)
    function = None if path is None else next(
        (n for n in ast.walk(source.parse_file(path)) if isinstance(n, ast.FunctionDef) and n.name == FUSION_GATE),
        None)
    if path is None or function is None:
        looked = f"no {FUSION_GATE} in sglang/{FUSION_FILE}" if path else f"no sglang/{FUSION_FILE}"
        # No gate of SGLang's own: SGLang admits the arch and FlashInfer's gate alone decides, so a
        # matrix cell takes FlashInfer's reading rather than a "fail" for a gate that is not there.
        return Reading("flashinfer-ar-fusion", ReadingStatus.AVAILABLE,
                       f"{looked}: SGLang has no arch gate of its own (FlashInfer's decides)",
                       (missing(root, FUSION_FILE, f"def {FUSION_GATE}"),))
    gate = source.arch_raise(function)
    if gate is None:
        return Reading("flashinfer-ar-fusion", ReadingStatus.UNDECIDED,
                       f"{FUSION_GATE} has no `if <is_smXX flags>: raise` check", (site(root, path, function.lineno),))
    test, message, line = gate
    raised = min(n.lineno for n in ast.walk(function) if isinstance(n, ast.Raise) and n.lineno > line)
    sites = (site(root, path, line), site(root, path, raised))
    try:
        rejected = source.arch_test(test, major_of(ctx))
    except ValueError as exc:
        return Reading("flashinfer-ar-fusion", ReadingStatus.UNDECIDED,
                       f"{where(sites[0])} `{ast.unparse(test)}` could not be evaluated: {exc}", sites, ("arch",))
    verdict = f"raises {message}" if rejected else "passes"
    return gate_reading("flashinfer-ar-fusion", not rejected,
                        f"{where(sites[0])} {FUSION_GATE}: `if {ast.unparse(test)}` for capability "
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
        line = assignment_line(cls, name)
        if line is not None:
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
    line = assignment_line(tree, "_SUPPORTED_WORLD_SIZES")
    needs = next((n for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)
                  and (n.module or "").startswith("flashinfer")
                  and any(a.name == "PcieIpcAllReduceWorkspace" for a in n.names)), None)
    if not isinstance(sizes, list) or line is None:
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
