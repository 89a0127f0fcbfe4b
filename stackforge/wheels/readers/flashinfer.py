"""Facts read from an unpacked flashinfer-python wheel: FlashInfer's own arch and CUDA gates.

Every reader here is pure and static: it reads FlashInfer's source as shipped in the wheel (Python
through :mod:`ast`, CUDA headers as text), never imports flashinfer or torch, and cites the lines it
decided on. Code moves between releases, so each reader looks in the places the fact has lived
and, for a generator that moved again, searches ``flashinfer/`` for its ``def``. What each reader
decides (boundaries as read in the PyPI wheels 0.5.0-0.7.4 and the sdists before them):

``flashinfer-ar-fusion``
    ``gen_trtllm_comm_module`` (``flashinfer/comm/trtllm_ar.py`` from 0.2.7.post1, ``flashinfer/jit/comm.py``
    from 0.4.0) compiles with ``get_nvcc_flags_list(supported_major_versions=[...])``, which raises
    for a target whose major is not listed. Listed: AVAILABLE; not listed: UNAVAILABLE. Up to 0.3.0.post1
    the generator has no such gate and compiles for whatever archs the build targets: AVAILABLE.
    No generator at all: ABSENT. On SM12x: ``[9, 10]`` from 0.3.1 to 0.6.16.post4, ``[9, 10, 12]``
    from 0.6.17.
``flashinfer-ar-fusion:gate-present``
    Whether that generator has an arch gate at all, whatever the target: AVAILABLE (with the list)
    from 0.3.1; ABSENT when the generator has none (0.2.7.post1-0.3.0.post1) or does not exist
    (the gate's code path is not there, which is what ABSENT means).
``flashinfer-mnnvl``
    The same reading for ``gen_trtllm_mnnvl_comm_module``: no gate up to 0.6.12, ``[9, 10]`` from
    0.6.13 ("SM12x intentionally excluded").
``flashinfer-jit``
    The SM12x CUDA-version gate only (whether the image has an nvcc to JIT with at all is the
    image's, not the release's). ``CompilationContext._normalize_cuda_arch``
    (``flashinfer/compilation_context.py``, from 0.6.7) is followed statement by statement for the
    target's (major, minor) and the CUDA version FlashInfer would find (``ctx.cuda`` when
    ``ctx.nvcc``, else ``ctx.torch_cuda``; both, and they must agree, when ``ctx.nvcc`` is None): a
    ``raise`` ("SM 12.x requires CUDA >= 12.9") is UNAVAILABLE, a ``return`` AVAILABLE with the
    nvcc arch it yields (0.7.1: SM 12.0 with CUDA 12.8 -> compute_120a; SM 12.1 still raises).
    ``depends_on`` names the CUDA fields only when the path taken asks for the CUDA version.
    Without that function (up to 0.6.6) there is no such gate: AVAILABLE, citing its absence.
``trtllm-gen-fmha``
    ``TllmGenFmhaRunner``'s ``FLASHINFER_CHECK(mSM == kSM_100 || ...)`` in the shipped header
    ``fmhaRunner.cuh``: the SMs trtllm-gen FMHA runs on ({100, 103}; 107 added in 0.6.16).
``nvfp4-gemm``
    ``mm_fp4``'s ``@backend_requirement({backend: requirement})`` (from 0.5.0); each requirement's
    ``@supported_compute_capability([...])`` lists the compute capabilities that backend admits
    (FlashInfer's own ``is_compute_capability_supported``: any backend). This is the declared
    support: 120/121 are declared by cudnn and cutlass in every wheel, so a backend that is
    declared but fails at run time (0.6.3 on SM120) is beyond this reading.
``flashinfer-pcie-ipc-ar``
    ``flashinfer/comm/pcie_ipc_ar.py`` (from 0.7.0): its ``_SUPPORTED_WORLD_SIZES`` ((2, 4, 8))
    against the target's GPU count, and any arch gate on ``gen_pcie_ipc_comm_module`` (none).
"""
from __future__ import annotations

import ast
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from packaging.version import InvalidVersion, Version

from stackforge.core.wheel_readings import CodeSite, ReadContext, ReaderSpec, Reading, ReadingStatus
from stackforge.wheels.readers._ast import (
    SourceFile,
    absent_site,
    callee_name,
    calls_named,
    decorator_calls,
    files_containing,
    keyword_arg,
    looked_site,
    parse,
)
from stackforge.wheels.readers._reader import gate_reading, reads, specs

DIST = "flashinfer-python"
PACKAGE = "flashinfer"

# Where each generator has lived, newest layout first.
AR_FUSION_FILES = ("flashinfer/jit/comm.py", "flashinfer/comm/trtllm_ar.py")
MNNVL_FILES = ("flashinfer/jit/comm.py", "flashinfer/comm/trtllm_mnnvl_ar.py")
PCIE_GENERATOR_FILES = ("flashinfer/jit/comm.py",)
COMPILATION_CONTEXT = "flashinfer/compilation_context.py"
FMHA_RUNNER_FILES = ("flashinfer/data/include/flashinfer/trtllm/fmha/fmhaRunner.cuh",
                     "include/flashinfer/trtllm/fmha/fmhaRunner.cuh")
FMHA_GENERATOR_FILES = ("flashinfer/jit/attention/modules.py", "flashinfer/jit/attention/pytorch.py")
GEMM_FILES = ("flashinfer/gemm/gemm_base.py", "flashinfer/gemm.py")
PCIE_IPC_AR = "flashinfer/comm/pcie_ipc_ar.py"

GATE_CALL = "get_nvcc_flags_list"
GATE_KEYWORD = "supported_major_versions"
FMHA_CHECK_TEXT = "Unsupported architecture"


# ------------------------------------------------------------------------------------------------
# Shared pieces
# ------------------------------------------------------------------------------------------------

def parse_arch(arch: str) -> tuple[int, int] | None:
    """``"12.0"`` -> (12, 0); ``None`` for anything else."""
    match = re.fullmatch(r"\s*(\d+)\.(\d+)\s*", arch or "")
    return (int(match.group(1)), int(match.group(2))) if match else None


def bad_arch(fact: str, ctx: ReadContext, sites: tuple[CodeSite, ...]) -> Reading:
    return Reading(fact, ReadingStatus.UNDECIDED,
                   f"target arch {ctx.arch!r} is not a compute capability like 12.0", sites, ("arch",))


def cite(site: CodeSite) -> str:
    """``path:line`` of a site (just the path for a file's absence)."""
    return f"{site.path}:{site.line}" if site.line else site.path


def parsed_file(fact: str, root: Path, path: str, absent: ReadingStatus, absence: str) -> SourceFile | Reading:
    """The Python file ``path`` parsed, or the reading when there is nothing to read: ``absent``
    ("no <path>: <absence>") when the wheel lacks the file, UNDECIDED when it does not parse."""
    source = parse(root, path)
    if source is None:
        return Reading(fact, absent, f"no {path}: {absence}", (absent_site(path),))
    if source.tree is None:
        return Reading(fact, ReadingStatus.UNDECIDED, source.error, (looked_site(root, path, "does not parse"),))
    return source


@dataclass(frozen=True, slots=True)
class Located:
    """A function found in the wheel (``function`` None when it is not there; ``looked`` = where)."""

    source: SourceFile | None
    function: ast.FunctionDef | ast.AsyncFunctionDef | None
    looked: tuple[str, ...]
    error: str = ""

    def absent_sites(self, root: Path, name: str) -> tuple[CodeSite, ...]:
        """The files looked in: absent, or present without ``def name`` (or unreadable: the error)."""
        lacking = "could not be read" if self.error else f"no def {name} in this file"
        return tuple(looked_site(root, path, lacking) for path in self.looked)


def locate_function(root: Path, name: str, candidates: Sequence[str]) -> Located:
    """``def name`` in the first candidate file that has it, else in any file under flashinfer/."""
    found = _function_in(root, name, candidates)
    if found is not None:
        return found
    # Only when the known places miss it: one text scan of the package for the def.
    moved = [path for path in files_containing(root, f"def {name}(", under=PACKAGE) if path not in candidates]
    return _function_in(root, name, moved) or Located(None, None, tuple(candidates))


def _function_in(root: Path, name: str, paths: Sequence[str]) -> Located | None:
    for path in paths:
        source = parse(root, path)
        if source is None:
            continue
        if source.tree is None:
            if any(f"def {name}(" in line for line in source.lines):
                return Located(source, None, (path,), source.error)
            continue
        function = source.function(name)
        if function is not None:
            return Located(source, function, (path,))
    return None


@dataclass(frozen=True, slots=True)
class ArchGate:
    """One ``get_nvcc_flags_list(supported_major_versions=...)`` call inside a generator."""

    majors: tuple[int, ...] | None   # None: not a literal the reader can evaluate
    site: CodeSite                   # the keyword's line (the list as written)
    value_site: CodeSite | None      # the constant's definition when the list is a named constant

    def text(self) -> str:
        listed = "?" if self.majors is None else f"[{', '.join(str(m) for m in self.majors)}]"
        return f"{GATE_KEYWORD}={listed}"


def arch_gates(source: SourceFile, function: ast.AST) -> tuple[ArchGate, ...]:
    """The arch gates a JIT generator applies (each one raises for a major it does not list)."""
    gates = []
    for call in calls_named(function, GATE_CALL):
        keyword = keyword_arg(call, GATE_KEYWORD)
        value = keyword.value if keyword is not None else (call.args[0] if call.args else None)
        if value is None:
            continue  # get_nvcc_flags_list() without a list: every target arch
        anchor = keyword if keyword is not None else value
        resolved = source.resolve(value)
        majors = (tuple(int(m) for m in resolved.value)
                  if resolved is not None and isinstance(resolved.value, (list, tuple, set))
                  and all(isinstance(m, int) for m in resolved.value) else None)
        if resolved is not None and resolved.value is None:
            continue  # supported_major_versions=None: no filter
        value_site = (source.site(resolved.line)
                      if resolved is not None and resolved.line != anchor.lineno else None)
        gates.append(ArchGate(majors, source.site(anchor), value_site))
    return tuple(gates)


def read_generator_gate(fact: str, generator: str, candidates: Sequence[str], what: str,
                        root: Path, ctx: ReadContext) -> Reading:
    """A JIT generator's arch gate against the target's major (see the module docstring)."""
    located = locate_function(root, generator, candidates)
    if located.error:
        return Reading(fact, ReadingStatus.UNDECIDED, located.error, located.absent_sites(root, generator))
    if located.function is None:
        return Reading(fact, ReadingStatus.ABSENT,
                       f"no {generator} in {', '.join(located.looked)} or elsewhere under {PACKAGE}/: "
                       f"no {what} in this release", located.absent_sites(root, generator))
    source = located.source
    assert source is not None
    def_site = source.site(located.function)
    capability = parse_arch(ctx.arch)
    if capability is None:
        return bad_arch(fact, ctx, (def_site,))
    gates = arch_gates(source, located.function)
    if not gates:
        return Reading(fact, ReadingStatus.AVAILABLE,
                       f"{cite(def_site)} {generator} has no {GATE_KEYWORD} gate: compiles for every "
                       f"target arch, {ctx.arch} included", (def_site,))
    sites = (def_site, *(site for gate in gates for site in (gate.site, gate.value_site) if site))
    unreadable = [gate for gate in gates if gate.majors is None]
    if unreadable:
        return Reading(fact, ReadingStatus.UNDECIDED,
                       f"{cite(unreadable[0].site)} {GATE_KEYWORD} is not a literal list: "
                       f"{unreadable[0].site.code}", sites, ("arch",))
    major = capability[0]
    refusing = [gate for gate in gates if major not in (gate.majors or ())]
    gate = (refusing or gates)[0]   # the first gate that refuses the major, else the first gate
    verdict = (f"not admitted ({generator} raises 'No supported CUDA architectures found' for {ctx.arch})"
               if refusing else "admitted")
    return gate_reading(fact, not refusing, f"{cite(gate.site)} {gate.text()}: {major} {verdict}", sites,
                        ("arch",))


# ------------------------------------------------------------------------------------------------
# flashinfer-ar-fusion, flashinfer-ar-fusion:gate-present, flashinfer-mnnvl
# ------------------------------------------------------------------------------------------------

@reads("flashinfer-ar-fusion",
       "gen_trtllm_comm_module's get_nvcc_flags_list(supported_major_versions=...) vs the target's major")
def read_ar_fusion(root: Path, ctx: ReadContext) -> Reading:
    return read_generator_gate("flashinfer-ar-fusion", "gen_trtllm_comm_module", AR_FUSION_FILES,
                               "trtllm allreduce-fusion JIT module", root, ctx)


@reads("flashinfer-ar-fusion:gate-present",
       "whether gen_trtllm_comm_module has an arch gate at all (none before 0.3.1)")
def read_ar_fusion_gate_present(root: Path, ctx: ReadContext) -> Reading:
    """Is there an arch gate on the fusion JIT at all (target-independent)."""
    fact, generator = "flashinfer-ar-fusion:gate-present", "gen_trtllm_comm_module"
    located = locate_function(root, generator, AR_FUSION_FILES)
    if located.error:
        return Reading(fact, ReadingStatus.UNDECIDED, located.error, located.absent_sites(root, generator))
    if located.function is None or located.source is None:
        return Reading(fact, ReadingStatus.ABSENT,
                       f"no {generator} in {', '.join(located.looked)}: no allreduce-fusion JIT, so no gate",
                       located.absent_sites(root, generator))
    source = located.source
    def_site = source.site(located.function)
    gates = arch_gates(source, located.function)
    if not gates:
        return Reading(fact, ReadingStatus.ABSENT,
                       f"{cite(def_site)} {generator} has no {GATE_KEYWORD} gate (compiles for every target arch)",
                       (def_site,))
    sites = (def_site, *(site for gate in gates for site in (gate.site, gate.value_site) if site))
    return Reading(fact, ReadingStatus.AVAILABLE,
                   f"{cite(gates[0].site)} {generator} gated by {gates[0].text()}", sites)


@reads("flashinfer-mnnvl", "gen_trtllm_mnnvl_comm_module's supported_major_versions vs the target's major")
def read_mnnvl(root: Path, ctx: ReadContext) -> Reading:
    return read_generator_gate("flashinfer-mnnvl", "gen_trtllm_mnnvl_comm_module", MNNVL_FILES,
                               "MNNVL comm JIT module", root, ctx)


# ------------------------------------------------------------------------------------------------
# flashinfer-jit: the SM12x CUDA-version gate in CompilationContext._normalize_cuda_arch
# ------------------------------------------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class Unknown:
    """A value or condition the reader cannot evaluate statically (why, where)."""

    why: str
    needs_cuda: bool = False          # the CUDA version FlashInfer finds would decide it


@dataclass(frozen=True, slots=True)
class Exit:
    """How a followed function ended: ``return`` (value text) or ``raise``, and the lines on the way."""

    kind: str                        # return | raise | end
    line: int
    value: Any
    trail: tuple[int, ...]           # lines of the conditions evaluated on the way, in order


@dataclass
class _Frame:
    """Variables of the function being followed (local to one evaluation, never shared)."""

    names: dict[str, Any]
    cuda: Version | None
    trail: list[int]


_COMPARE = {ast.Eq: lambda a, b: a == b, ast.NotEq: lambda a, b: a != b, ast.Lt: lambda a, b: a < b,
            ast.LtE: lambda a, b: a <= b, ast.Gt: lambda a, b: a > b, ast.GtE: lambda a, b: a >= b,
            ast.In: lambda a, b: a in b, ast.NotIn: lambda a, b: a not in b}


def evaluate(node: ast.expr, frame: _Frame) -> Any:
    """The value of an expression built from the arguments, literals, ``str()``, ``Version()`` and
    FlashInfer's CUDA-version helpers; :class:`Unknown` for anything else."""
    if isinstance(node, ast.Constant):
        return node.value
    if isinstance(node, ast.Name):
        return frame.names.get(node.id, Unknown(f"line {node.lineno}: {node.id} is not known statically"))
    if isinstance(node, (ast.Tuple, ast.List)):
        items = [evaluate(item, frame) for item in node.elts]
        unknown = next((item for item in items if isinstance(item, Unknown)), None)
        return unknown or tuple(items)
    if isinstance(node, ast.BoolOp):
        return _evaluate_boolop(node, frame)
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Not):
        operand = evaluate(node.operand, frame)
        return operand if isinstance(operand, Unknown) else not operand
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        left, right = evaluate(node.left, frame), evaluate(node.right, frame)
        for side in (left, right):
            if isinstance(side, Unknown):
                return side
        try:
            return left + right
        except TypeError:
            return Unknown(f"line {node.lineno}: cannot add {left!r} and {right!r}")
    if isinstance(node, ast.Compare):
        return _evaluate_compare(node, frame)
    if isinstance(node, ast.Call):
        return _evaluate_call(node, frame)
    return Unknown(f"line {node.lineno}: {type(node).__name__} expression is not followed")


def _evaluate_boolop(node: ast.BoolOp, frame: _Frame) -> Any:
    is_and = isinstance(node.op, ast.And)
    for operand in node.values:
        value = evaluate(operand, frame)
        if isinstance(value, Unknown):
            return value
        if bool(value) != is_and:
            return value
    return value


def _evaluate_compare(node: ast.Compare, frame: _Frame) -> Any:
    left = evaluate(node.left, frame)
    for op, comparator in zip(node.ops, node.comparators):
        right = evaluate(comparator, frame)
        for side in (left, right):
            if isinstance(side, Unknown):
                return side
        compare = _COMPARE.get(type(op))
        if compare is None:
            return Unknown(f"line {node.lineno}: comparison {type(op).__name__} is not followed")
        try:
            if not compare(left, right):
                return False
        except TypeError:
            return Unknown(f"line {node.lineno}: cannot compare {left!r} and {right!r}")
        left = right
    return True


def _cuda_version(frame: _Frame, line: int) -> Version | Unknown:
    return frame.cuda if frame.cuda is not None else Unknown(f"line {line}: needs the CUDA version", True)


def _evaluate_call(node: ast.Call, frame: _Frame) -> Any:
    name = callee_name(node)
    args = [evaluate(arg, frame) for arg in node.args]
    unknown = next((arg for arg in args if isinstance(arg, Unknown)), None)
    if name == "is_cuda_version_at_least" and len(args) == 1 and not node.keywords:
        cuda = _cuda_version(frame, node.lineno)
        if unknown or isinstance(cuda, Unknown):
            return unknown or cuda
        return _version(args[0], node.lineno, lambda v: cuda >= v)
    if name == "get_cuda_version" and not args:
        return _cuda_version(frame, node.lineno)
    if name == "Version" and len(args) == 1:
        return unknown or _version(args[0], node.lineno, lambda v: v)
    if name in ("str", "int") and len(args) == 1 and not unknown:
        return str(args[0]) if name == "str" else int(args[0])
    return unknown or Unknown(f"line {node.lineno}: call {name or '<expr>'}() is not followed")


def _version(text: Any, line: int, then: Any) -> Any:
    try:
        return then(Version(str(text)))
    except InvalidVersion:
        return Unknown(f"line {line}: {text!r} is not a version")


def follow(statements: Sequence[ast.stmt], frame: _Frame) -> Exit | Unknown | None:
    """Run a function body for the frame's arguments, statically: ``None`` = fell off the end."""
    for statement in statements:
        if isinstance(statement, (ast.Import, ast.ImportFrom, ast.Pass)):
            continue
        if isinstance(statement, ast.Expr):
            if isinstance(statement.value, ast.Constant):
                continue  # docstring
            return Unknown(f"line {statement.lineno}: expression statement is not followed")
        if isinstance(statement, ast.Assign) and all(isinstance(t, ast.Name) for t in statement.targets):
            value = evaluate(statement.value, frame)
            for target in statement.targets:
                frame.names[target.id] = value  # an Unknown stays unknown until it is used
            continue
        if isinstance(statement, ast.If):
            frame.trail.append(statement.test.lineno)
            test = evaluate(statement.test, frame)
            if isinstance(test, Unknown):
                return test
            outcome = follow(statement.body if test else statement.orelse, frame)
            if outcome is not None:
                return outcome
            continue
        if isinstance(statement, ast.Return):
            value = evaluate(statement.value, frame) if statement.value is not None else None
            return Exit("return", statement.lineno, value, tuple(frame.trail))
        if isinstance(statement, ast.Raise):
            return Exit("raise", statement.lineno, None, tuple(frame.trail))
        return Unknown(f"line {statement.lineno}: {type(statement).__name__} statement is not followed")
    return None


def follow_function(function: ast.FunctionDef | ast.AsyncFunctionDef, arguments: Sequence[Any],
                    cuda: Version | None) -> Exit | Unknown:
    """Follow ``function(*arguments)`` with FlashInfer finding CUDA ``cuda`` (None: unknown)."""
    params = [arg.arg for arg in function.args.args if arg.arg not in ("self", "cls")]
    if len(params) < len(arguments):
        return Unknown(f"line {function.lineno}: {function.name} takes {len(params)} arguments")
    frame = _Frame(dict(zip(params, arguments)), cuda, [])
    outcome = follow(function.body, frame)
    if outcome is None:
        return Exit("end", function.body[-1].end_lineno or function.lineno, None, tuple(frame.trail))
    return outcome


def cuda_fields(ctx: ReadContext) -> tuple[str, ...]:
    """The context fields holding the CUDA version FlashInfer's ``get_cuda_version`` would find:
    nvcc's when the stack has nvcc, else torch's; both (they must agree) when that is not known."""
    if ctx.nvcc is True:
        return ("cuda",)
    if ctx.nvcc is False:
        return ("torch_cuda",)
    return ("cuda", "torch_cuda")


def nvcc_arch(value: Any) -> str:
    """``(12, "0a")`` -> ``compute_120a``; "" for values of another shape."""
    if isinstance(value, tuple) and len(value) == 2 and isinstance(value[0], int) and isinstance(value[1], str):
        return f"compute_{value[0]}{value[1]}"
    return ""


@reads("flashinfer-jit",
       "CompilationContext._normalize_cuda_arch followed for the target arch and the CUDA FlashInfer finds")
def read_jit(root: Path, ctx: ReadContext) -> Reading:
    """The SM12x CUDA-version gate of FlashInfer's CompilationContext for the target and CUDA."""
    fact = "flashinfer-jit"
    source = parsed_file(fact, root, COMPILATION_CONTEXT, ReadingStatus.AVAILABLE,
                         "no CUDA-version gate on the target arch in this release")
    if isinstance(source, Reading):
        return source
    function = source.function("_normalize_cuda_arch")
    if function is None:
        anchor = source.lines_containing("class CompilationContext")
        site = (source.site(anchor[0]) if anchor
                else looked_site(root, COMPILATION_CONTEXT, "no class CompilationContext in this file"))
        return Reading(fact, ReadingStatus.AVAILABLE,
                       f"{cite(site)} CompilationContext has no _normalize_cuda_arch: no CUDA-version gate "
                       "on the target arch in this release", (site,))
    capability = parse_arch(ctx.arch)
    if capability is None:
        return bad_arch(fact, ctx, (source.site(function),))
    first = follow_function(function, capability, None)
    if isinstance(first, Exit):
        return jit_reading(source, function, ctx, first, "", ("arch",))
    if not first.needs_cuda:
        return Reading(fact, ReadingStatus.UNDECIDED, f"{COMPILATION_CONTEXT} {first.why}",
                       (source.site(function),), ("arch",))
    fields = cuda_fields(ctx)
    depends = ("arch", "nvcc", *fields)
    missing = [field for field in fields if not getattr(ctx, field)]
    if missing:
        nvcc = {True: "has nvcc", False: "has no nvcc", None: "may or may not have nvcc"}[ctx.nvcc]
        return Reading(fact, ReadingStatus.UNDECIDED,
                       f"{cite(source.site(function))} _normalize_cuda_arch for SM {ctx.arch} depends on the CUDA "
                       f"version FlashInfer finds (nvcc's, else torch's); the stack {nvcc} and the context gives "
                       f"no {' or '.join(missing)}", (source.site(function),), depends)
    candidates = tuple((field, str(getattr(ctx, field))) for field in fields)
    readings = []
    for field, version in candidates:
        try:
            cuda = Version(version)
        except InvalidVersion:
            return Reading(fact, ReadingStatus.UNDECIDED, f"{field} {version!r} is not a CUDA version",
                           (source.site(function),), depends)
        outcome = follow_function(function, capability, cuda)
        if isinstance(outcome, Unknown):
            return Reading(fact, ReadingStatus.UNDECIDED, f"{COMPILATION_CONTEXT} {outcome.why}",
                           (source.site(function),), depends)
        how = "nvcc" if field == "cuda" else "torch"
        readings.append(jit_reading(source, function, ctx, outcome, f"CUDA {version} ({how})", depends))
    if len(readings) == 1:
        return readings[0]
    # Whether the stack has nvcc is not known: both versions were followed.
    sites = tuple(dict.fromkeys(site for r in readings for site in r.sites))
    summaries = "; ".join(dict.fromkeys(r.summary for r in readings))
    if len({reading.status for reading in readings}) > 1:
        return Reading(fact, ReadingStatus.UNDECIDED, f"depends on whether the stack has nvcc: {summaries}",
                       sites, depends)
    return Reading(fact, readings[0].status, f"with or without nvcc: {summaries}", sites, depends)


def jit_reading(source: SourceFile, function: ast.AST, ctx: ReadContext, outcome: Exit, cuda: str,
                depends: tuple[str, ...]) -> Reading:
    fact = "flashinfer-jit"
    sites = tuple(source.site(line) for line in dict.fromkeys((*outcome.trail, outcome.line)))
    where = f"SM {ctx.arch}" + (f" with {cuda}" if cuda else "")
    exit_site = source.site(outcome.line)
    if outcome.kind == "raise":
        return Reading(fact, ReadingStatus.UNAVAILABLE, f"{cite(exit_site)} {exit_site.code}: {where} refused",
                       sites, depends)
    arch = nvcc_arch(outcome.value)
    compiled = f" -> {arch}" if arch else ""
    return Reading(fact, ReadingStatus.AVAILABLE, f"{cite(exit_site)} {exit_site.code}: {where}{compiled}",
                   sites, depends)


# ------------------------------------------------------------------------------------------------
# trtllm-gen-fmha: the SMs TllmGenFmhaRunner accepts
# ------------------------------------------------------------------------------------------------

def fmha_check_lines(source: SourceFile) -> tuple[int, ...]:
    """The lines of the ``FLASHINFER_CHECK(...)`` statement that says "Unsupported architecture"."""
    hits = source.lines_containing(FMHA_CHECK_TEXT)
    if not hits:
        return ()
    end = hits[0]
    start = next((line for line in range(end, max(end - 6, 0), -1) if "CHECK(" in source.code(line)), end)
    return tuple(range(start, end + 1))


@reads("trtllm-gen-fmha", "TllmGenFmhaRunner's SM check (mSM == kSM_N) in the shipped fmhaRunner.cuh")
def read_trtllm_fmha(root: Path, ctx: ReadContext) -> Reading:
    """trtllm-gen FMHA's SM list, from the runner header the wheel ships."""
    fact = "trtllm-gen-fmha"
    runner = next((source for path in FMHA_RUNNER_FILES if (source := parse(root, path)) is not None), None)
    if runner is None:
        generator = locate_function(root, "gen_trtllm_gen_fmha_module", FMHA_GENERATOR_FILES)
        if generator.function is None:
            return Reading(fact, ReadingStatus.ABSENT,
                           "no fmhaRunner.cuh and no gen_trtllm_gen_fmha_module: no trtllm-gen FMHA in this release",
                           tuple(looked_site(root, path, "no gen_trtllm_gen_fmha_module in this file")
                                 for path in (*FMHA_RUNNER_FILES, *generator.looked)))
        assert generator.source is not None
        return Reading(fact, ReadingStatus.UNDECIDED,
                       "gen_trtllm_gen_fmha_module exists but the wheel ships no fmhaRunner.cuh to read its SM check",
                       (generator.source.site(generator.function),))
    lines = fmha_check_lines(runner)
    if not lines:
        return Reading(fact, ReadingStatus.UNDECIDED,
                       f"{runner.path} has no SM check ('{FMHA_CHECK_TEXT}'): which SMs run trtllm-gen FMHA "
                       "is left to the kernels it loads",
                       (looked_site(root, runner.path, f"no '{FMHA_CHECK_TEXT}' in this file"),))
    sites = tuple(runner.site(line) for line in lines)
    statement = " ".join(site.code for site in sites)
    sms = tuple(int(sm) for sm in re.findall(r"mSM\s*==\s*kSM_(\d+)", statement))
    if not sms or "!=" in statement:
        return Reading(fact, ReadingStatus.UNDECIDED,
                       f"{cite(sites[0])} SM check is not a list of 'mSM == kSM_N': {statement}", sites)
    capability = parse_arch(ctx.arch)
    if capability is None:
        return bad_arch(fact, ctx, sites)
    sm = capability[0] * 10 + capability[1]
    listed = "{" + ", ".join(f"sm_{n}" for n in sms) + "}"
    verdict = "admitted" if sm in sms else "'Unsupported architecture'"
    return gate_reading(fact, sm in sms,
                        f"{cite(sites[0])} TllmGenFmhaRunner accepts {listed}: sm_{sm} {verdict}", sites, ("arch",))


# ------------------------------------------------------------------------------------------------
# nvfp4-gemm: mm_fp4's backends and the compute capabilities each declares
# ------------------------------------------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class BackendSupport:
    """One backend of ``mm_fp4`` and the compute capabilities its requirement function declares."""

    backend: str
    ccs: tuple[int, ...] | None      # None: could not be read (requirement not found / not literal)
    site: CodeSite                   # the decorator line, or the backend's entry when unread
    note: str = ""


def backend_support(root: Path, source: SourceFile, backend: str, requirement: ast.expr,
                    entry: CodeSite) -> BackendSupport:
    """What ``@supported_compute_capability`` on a backend's requirement function declares."""
    if not isinstance(requirement, ast.Name):
        return BackendSupport(backend, None, entry, "requirement is not a plain function name")
    holder, function = source, source.function(requirement.id)
    if function is None:
        path = source.imported_module(root, requirement.id)
        imported = parse(root, path) if path else None
        function = imported.function(requirement.id) if imported is not None else None
        holder = imported if imported is not None else source
    if function is None:
        return BackendSupport(backend, None, entry, f"{requirement.id} not found")
    decorators = decorator_calls(function, "supported_compute_capability")
    if not decorators:
        # FlashInfer's is_backend_supported: a requirement without the decorator admits no cc.
        return BackendSupport(backend, (), holder.site(function), "no @supported_compute_capability")
    resolved = holder.resolve(decorators[0].args[0]) if decorators[0].args else None
    if resolved is None or not isinstance(resolved.value, (list, tuple, set)):
        return BackendSupport(backend, None, holder.site(decorators[0]), "capability list is not a literal")
    return BackendSupport(backend, tuple(int(cc) for cc in resolved.value), holder.site(decorators[0]))


@reads("nvfp4-gemm", "mm_fp4's backends and each requirement's @supported_compute_capability list")
def read_nvfp4_gemm(root: Path, ctx: ReadContext) -> Reading:
    """Which of mm_fp4's backends declare support for the target's compute capability."""
    fact = "nvfp4-gemm"
    located = locate_function(root, "mm_fp4", GEMM_FILES)
    if located.error:
        return Reading(fact, ReadingStatus.UNDECIDED, located.error, located.absent_sites(root, "mm_fp4"))
    if located.function is None or located.source is None:
        return Reading(fact, ReadingStatus.ABSENT, f"no mm_fp4 in {', '.join(located.looked)}: no FP4 GEMM API",
                       located.absent_sites(root, "mm_fp4"))
    source, function = located.source, located.function
    def_site = source.site(function)
    requirement = next(iter(decorator_calls(function, "backend_requirement")), None)
    if requirement is None or not requirement.args or not isinstance(requirement.args[0], ast.Dict):
        return Reading(fact, ReadingStatus.UNDECIDED,
                       f"{cite(def_site)} mm_fp4 has no @backend_requirement({{backend: requirement}}) to read",
                       (def_site,))
    capability = parse_arch(ctx.arch)
    if capability is None:
        return bad_arch(fact, ctx, (def_site,))
    cc = capability[0] * 10 + capability[1]
    backends = []
    for key, value in zip(requirement.args[0].keys, requirement.args[0].values):
        if isinstance(key, ast.Constant) and isinstance(key.value, str):
            backends.append(backend_support(root, source, key.value, value, source.site(key)))
    listing = "; ".join(f"{b.backend} {list(b.ccs) if b.ccs is not None else '?'}" for b in backends)
    sites = (def_site, *dict.fromkeys(b.site for b in backends))
    admitting = [b.backend for b in backends if b.ccs and cc in b.ccs]
    unread = [b for b in backends if b.ccs is None]
    admitted: bool | None
    if admitting:
        admitted, verdict = True, f"admitted by {', '.join(admitting)}"
    elif unread:   # one of the backends not read may admit it
        notes = ", ".join(f"{b.backend} ({b.note})" for b in unread)
        admitted, verdict = None, f"not admitted by those read; {notes}"
    else:
        admitted, verdict = False, "admitted by none"
    return gate_reading(fact, admitted, f"{cite(def_site)} mm_fp4 backends {listing}: {cc} {verdict}", sites,
                        ("arch",))


# ------------------------------------------------------------------------------------------------
# flashinfer-pcie-ipc-ar
# ------------------------------------------------------------------------------------------------

@reads("flashinfer-pcie-ipc-ar",
       "flashinfer/comm/pcie_ipc_ar.py present, its _SUPPORTED_WORLD_SIZES and the JIT arch gate")
def read_pcie_ipc_ar(root: Path, ctx: ReadContext) -> Reading:
    """FlashInfer's PCIe IPC allreduce: present, its world sizes, and its JIT arch gate."""
    fact = "flashinfer-pcie-ipc-ar"
    source = parsed_file(fact, root, PCIE_IPC_AR, ReadingStatus.ABSENT, "no PCIe IPC allreduce in this release")
    if isinstance(source, Reading):
        return source
    assignment = source.module_constant("_SUPPORTED_WORLD_SIZES")
    resolved = source.resolve(assignment.value) if assignment is not None else None
    if resolved is None or not isinstance(resolved.value, (tuple, list, set)):
        return Reading(fact, ReadingStatus.UNDECIDED,
                       f"{PCIE_IPC_AR} has no literal _SUPPORTED_WORLD_SIZES to read the world sizes from",
                       (source.site(1),), ("gpu_count",))
    sizes = tuple(sorted(int(size) for size in resolved.value))
    sites = [source.site(resolved.line)]
    checks = [line for line in source.lines_containing("_SUPPORTED_WORLD_SIZES") if "not in" in source.code(line)]
    sites.extend(source.site(line) for line in checks[:1])
    gate = read_generator_gate(fact, "gen_pcie_ipc_comm_module", PCIE_GENERATOR_FILES,
                               "PCIe IPC allreduce JIT module", root, ctx)
    sites.extend(site for site in gate.sites if site.line)
    where = f"{cite(sites[0])} _SUPPORTED_WORLD_SIZES = {sizes}"
    depends = ("gpu_count", "arch")
    if ctx.gpu_count not in sizes:
        return Reading(fact, ReadingStatus.UNAVAILABLE, f"{where}: world size {ctx.gpu_count} unsupported",
                       tuple(sites), depends)
    if gate.status in (ReadingStatus.UNAVAILABLE, ReadingStatus.UNDECIDED):
        return Reading(fact, gate.status, f"{where}; {gate.summary}", tuple(sites), depends)
    arch_note = gate.summary if gate.status is ReadingStatus.AVAILABLE else "no JIT generator found to gate the arch"
    return Reading(fact, ReadingStatus.AVAILABLE,
                   f"{where}: world size {ctx.gpu_count} admitted; {arch_note}", tuple(sites), depends)


READERS: tuple[ReaderSpec, ...] = specs(DIST, read_ar_fusion, read_ar_fusion_gate_present, read_mnnvl,
                                         read_jit, read_trtllm_fmha, read_nvfp4_gemm, read_pcie_ipc_ar)
