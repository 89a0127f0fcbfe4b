"""SGLang's own files read with ``ast``, never imported: the static half of the SGLang gate probes.

Shared by the in-image SGLang gate probes (``sglang_symm_mem.py``, ``sglang_custom_ar.py``,
``sglang_ar_fusion.py`` and its era modules; imported as ``_sglang_source`` from the in-image package,
the files found in the installed package) and the wheel tier's readers (``stackforge.wheels.readers.sglang``, the files under
an unpacked wheel's root). Every function that looks a file up takes ``root``: the directory holding the
``sglang`` package; ``None`` finds the installed one. Standard library only.
"""

from __future__ import annotations

import ast
import copy
import dataclasses
import importlib.util
import os
import re
from collections.abc import Iterator, Sequence
from typing import Any

COMM = "sglang.srt.distributed.device_communicators"
#: The symmetric-memory communicator and its class: ``torch_symm_mem.py`` from 0.5.4.post3,
#: ``symm_mem.py`` in 0.5.3-0.5.4.post2.
SYMM_MODULES = ((f"{COMM}.torch_symm_mem", "TorchSymmMemCommunicator"), (f"{COMM}.symm_mem", "SymmMemCommunicator"))
#: Its size table (capability major -> world size -> bytes) in ``all_reduce_utils.py``, by either name.
SYMM_TABLES = ("TORCH_SYMM_MEM_ALL_REDUCE_MAX_SIZES", "SYMM_MEM_ALL_REDUCE_MAX_SIZES")
#: The arch flags SGLang's gate reads: ``is_sm90`` / ``is_sm100_supported`` name capability majors 9 / 10.
ARCH_FLAG = re.compile(r"^_?is_sm(\d+)(?:_supported)?$")


def sglang_file(relative: str, root: str | None = None) -> str | None:
    """Path of a file inside the sglang package under ``root`` (an unpacked wheel), or inside the
    installed one when ``root`` is None, found without importing sglang."""
    if root is not None:
        path = os.path.join(root, "sglang", relative)
        return path if os.path.isfile(path) else None
    spec = importlib.util.find_spec("sglang")
    for root in (spec.submodule_search_locations or []) if spec else []:
        path = os.path.join(root, relative)
        if os.path.isfile(path):
            return path
    return None


def parse_file(path: str) -> ast.Module:
    with open(path, encoding="utf-8") as handle:
        return ast.parse(handle.read(), filename=path)


def literal(node: ast.AST, names: dict[str, Any]) -> Any:
    """Evaluate constant expressions (numbers, names bound earlier, + - * // **, containers)."""
    if isinstance(node, ast.Constant):
        return node.value
    if isinstance(node, ast.Name) and node.id in names:
        return names[node.id]
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        return -literal(node.operand, names)
    if isinstance(node, ast.BinOp):
        left, right = literal(node.left, names), literal(node.right, names)
        ops = {ast.Add: lambda a, b: a + b, ast.Sub: lambda a, b: a - b, ast.Mult: lambda a, b: a * b,
               ast.FloorDiv: lambda a, b: a // b, ast.Pow: lambda a, b: a ** b, ast.LShift: lambda a, b: a << b}
        if type(node.op) in ops:
            return ops[type(node.op)](left, right)
    if isinstance(node, ast.Dict):
        return {literal(k, names): literal(v, names) for k, v in zip(node.keys, node.values) if k is not None}
    if isinstance(node, (ast.List, ast.Tuple, ast.Set)):
        return [literal(e, names) for e in node.elts]
    if isinstance(node, ast.Call) and flag_name(node) in ("frozenset", "set", "tuple", "list") \
            and len(node.args) == 1 and not node.keywords:  # 0.5.23: frozenset({"DeepseekV3ForCausalLM", ...})
        return literal(node.args[0], names)
    raise ValueError(f"not a constant expression: {ast.dump(node)[:80]}")


def module_constants(tree: ast.Module) -> dict[str, Any]:
    """Top-level ``NAME = <constant expression>`` (or ``NAME: type = ...``) assignments of a module."""
    names: dict[str, Any] = {}
    for statement in tree.body:
        targets = statement.targets if isinstance(statement, ast.Assign) else \
            [statement.target] if isinstance(statement, ast.AnnAssign) and statement.value else []
        if len(targets) == 1 and isinstance(targets[0], ast.Name):
            try:
                names[targets[0].id] = literal(statement.value, names)
            except (ValueError, TypeError, ArithmeticError):
                pass
    return names


def message_text(node: ast.AST) -> str:
    """The format string of a log call's first argument (f-string fields kept as {name})."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.JoinedStr):
        return "".join(v.value if isinstance(v, ast.Constant) else "{" + ast.unparse(v.value) + "}"
                       for v in node.values)
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        return message_text(node.left) + message_text(node.right)
    return ast.unparse(node)


def warnings_in(node: ast.AST) -> list[tuple[int, str]]:
    """(line, format string) of every ``logger.warning(...)`` under ``node``."""
    found = []
    for call in ast.walk(node):
        if isinstance(call, ast.Call) and isinstance(call.func, ast.Attribute) \
                and call.func.attr in ("warning", "warn") and call.args:
            found.append((call.lineno, message_text(call.args[0])))
    return sorted(found)


def fill(message: str, *values: Any, **fields: Any) -> str:
    """Render a %-style or {field} log message the way logging / f-strings would."""
    try:
        message = message % values if "%" in message else message
    except (TypeError, ValueError):
        pass
    try:
        return message.format_map(fields) if fields and "{" in message else message
    except (KeyError, IndexError, ValueError):
        return message


def class_node(tree: ast.Module, name: str) -> ast.ClassDef | None:
    return next((n for n in ast.walk(tree) if isinstance(n, ast.ClassDef) and n.name == name), None)


def table_access(cls: ast.ClassDef, table_name: str) -> tuple[str, int]:
    """How the constructor looks the capability up: ``index`` (KeyError when missing) or
    ``get`` (a clean disable), and where."""
    accesses = []
    for node in ast.walk(cls):
        if isinstance(node, ast.Subscript) and isinstance(node.value, ast.Name) and node.value.id == table_name:
            accesses.append((node.lineno, "index"))
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "get" \
                and isinstance(node.func.value, ast.Name) and node.func.value.id == table_name:
            accesses.append((node.lineno, "get"))
    if not accesses:
        return "unknown", cls.lineno
    line, style = min(accesses)
    return style, line


def min_capability_site(cls: ast.ClassDef) -> tuple[int, int] | None:
    """(K, line) of ``if self.device_capability < K``, if the constructor has one."""
    for node in ast.walk(cls):
        if isinstance(node, ast.Compare) and isinstance(node.left, ast.Attribute) \
                and node.left.attr == "device_capability" and len(node.ops) == 1 \
                and isinstance(node.ops[0], ast.Lt) and isinstance(node.comparators[0], ast.Constant):
            return int(node.comparators[0].value), node.lineno
    return None


def pcie_gate(tree: ast.Module) -> tuple[int, str, int] | None:
    """(K, message, line) of ``if world_size > K and not full_nvlink: logger.warning(message)``."""
    for node in ast.walk(tree):
        if not (isinstance(node, ast.If) and isinstance(node.test, ast.BoolOp)
                and isinstance(node.test.op, ast.And)):
            continue
        threshold = next((int(v.comparators[0].value) for v in node.test.values
                          if isinstance(v, ast.Compare) and isinstance(v.left, ast.Name)
                          and v.left.id == "world_size" and isinstance(v.ops[0], ast.Gt)
                          and isinstance(v.comparators[0], ast.Constant)), None)
        negated = any(isinstance(v, ast.UnaryOp) and isinstance(v.op, ast.Not)
                      and isinstance(v.operand, ast.Name) and v.operand.id == "full_nvlink"
                      for v in node.test.values)
        messages = warnings_in(ast.Module(body=node.body, type_ignores=[]))
        if threshold is not None and negated and messages:
            return threshold, messages[0][1], node.lineno
    return None


def size_gate_messages(tree: ast.Module) -> list[str]:
    """Messages of ``if world_size not in ...: logger.warning(...)``."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and isinstance(node.test, ast.Compare) \
                and isinstance(node.test.left, ast.Name) and node.test.left.id == "world_size" \
                and isinstance(node.test.ops[0], ast.NotIn):
            found.extend(m for _, m in warnings_in(ast.Module(body=node.body, type_ignores=[])))
    return found


def arch_raise(function: ast.FunctionDef) -> tuple[ast.expr, str, int] | None:
    """(test, ``Error: message``, line) of the first ``if <test on is_smXX flags>: raise Error("...")``."""
    for node in sorted((n for n in ast.walk(function) if isinstance(n, ast.If)), key=lambda n: n.lineno):
        flags = [leaf for leaf in ast.walk(node.test) if ARCH_FLAG.match(flag_name(leaf) or "")]
        raised = next((s.exc for s in node.body if isinstance(s, ast.Raise) and isinstance(s.exc, ast.Call)), None)
        if flags and raised is not None:
            text = message_text(raised.args[0]) if raised.args else ""
            return node.test, f"{ast.unparse(raised.func)}: {text}", node.lineno
    return None


def flag_name(node: ast.AST) -> str | None:
    """``is_sm90`` for ``get_platform().is_sm90``, ``is_sm90_supported()``, ``_is_sm90_supported``."""
    if isinstance(node, ast.Call):
        node = node.func
    if isinstance(node, ast.Attribute):
        return node.attr
    if isinstance(node, ast.Name):
        return node.id
    return None


def platform_fact(node: ast.AST) -> str | None:
    """``is_sm90`` for ``get_platform().is_sm90`` (0.5.23's platform facts), else None."""
    if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Call) \
            and flag_name(node.value) == "get_platform" and not node.value.args:
        return node.attr
    return None


def arch_test(test: ast.expr, major: int) -> bool:
    """Evaluate a boolean of arch flags (``not (a or b)``) for a capability major."""
    if isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not):
        return not arch_test(test.operand, major)
    if isinstance(test, ast.BoolOp):
        values = [arch_test(v, major) for v in test.values]
        return all(values) if isinstance(test.op, ast.And) else any(values)
    match = ARCH_FLAG.match(flag_name(test) or "")
    if match is None:
        raise ValueError(f"not an arch flag: {ast.unparse(test)}")
    return int(match.group(1)) // 10 == major


FUSION_FLAG = "enable_flashinfer_allreduce_fusion"
#: SGLang's platform helpers that do not depend on the device: a CUDA build of SGLang.
PLATFORM_CONSTANTS = {"is_cuda": True, "is_cuda_alike": True, "is_hip": False, "is_npu": False,
                      "is_xpu": False, "is_musa": False, "is_cpu": False, "is_hpu": False}
#: Names on the path that only the real device answers (0.5.7+: ``"H20" in get_device_name()``);
#: the target is taken not to be an H20.
DEVICE_NAME_ANSWERS = {"is_h20_device": False}


@dataclasses.dataclass(frozen=True, slots=True)
class FusionSite:
    """One ``self.enable_flashinfer_allreduce_fusion = True`` in ServerArgs (0.5.23+: one
    ``return {"flashinfer_allreduce_fusion_backend": ...}`` of the overrides pass) and the ``if`` tests
    on the way to it (``taken`` False: the statement sits in that test's ``else``)."""

    method: str
    line: int
    path: tuple[tuple[ast.expr, bool], ...]
    owner: str = "ServerArgs."
    action: str = f"self.{FUSION_FLAG} = True"

    def describe(self, filename: str) -> str:
        conditions = " and ".join(ast.unparse(test) if taken else f"not ({ast.unparse(test)})"
                                  for test, taken in self.path)
        return f"{filename}:{self.line} {self.owner}{self.method}: `{self.action}` when {conditions or 'always'}"


@dataclasses.dataclass(frozen=True, slots=True)
class AutoEnable:
    """The model architectures for which ServerArgs turns the fusion flag on for the node."""

    archs: tuple[str, ...]  # turned on
    named: tuple[str, ...]  # every architecture the code on those paths names
    undecided: tuple[str, ...]  # the static reading could not decide
    method: str  # live | static
    evidence: str


def fusion_sites(tree: ast.Module) -> list[FusionSite]:
    """Every place in ServerArgs that sets the fusion flag to True, with its path conditions."""
    cls = class_node(tree, "ServerArgs")
    if cls is None:
        return []
    return [FusionSite(method.name, statement.lineno, path, action=ast.unparse(statement))
            for method in cls.body if isinstance(method, ast.FunctionDef)
            for statement, path in guarded_statements(method.body, ()) if sets_fusion_flag(statement)]


def guarded_statements(body: Sequence[ast.stmt], path: tuple[tuple[ast.expr, bool], ...]
                       ) -> Iterator[tuple[ast.stmt, tuple[tuple[ast.expr, bool], ...]]]:
    """Statements of a body (nested functions and classes excluded) with the ``if`` tests above them."""
    for statement in body:
        yield statement, path
        if isinstance(statement, ast.If):
            yield from guarded_statements(statement.body, (*path, (statement.test, True)))
            yield from guarded_statements(statement.orelse, (*path, (statement.test, False)))
        elif not isinstance(statement, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            for field in ("body", "orelse", "finalbody"):
                yield from guarded_statements(getattr(statement, field, None) or [], path)
            for handler in getattr(statement, "handlers", None) or []:
                yield from guarded_statements(handler.body, path)


def sets_fusion_flag(statement: ast.stmt) -> bool:
    """``self.enable_flashinfer_allreduce_fusion = True``, or (0.5.14, where that flag is deprecated)
    ``self.flashinfer_allreduce_fusion_backend = "auto"``."""
    if not (isinstance(statement, ast.Assign) and isinstance(statement.value, ast.Constant)):
        return False
    value = statement.value.value
    return any(isinstance(t, ast.Attribute) and isinstance(t.value, ast.Name) and t.value.id == "self"
               and ((t.attr == FUSION_FLAG and value is True) or (t.attr == PASS_KEY and isinstance(value, str)))
               for t in statement.targets)


def named_archs(sites: Sequence[FusionSite], constants: dict[str, Any] | None = None) -> tuple[str, ...]:
    """The architectures the path conditions compare ``model_arch`` with, in the code's order
    (a module constant compared with, 0.5.23's ``_FLASHINFER_ALLREDUCE_FUSION_ARCHS``, by its value)."""
    constants = constants or {}
    found: list[str] = []
    for site in sites:
        for test, _ in site.path:
            for node in ast.walk(test):
                if not (isinstance(node, ast.Compare) and isinstance(node.left, ast.Name)
                        and node.left.id == "model_arch"):
                    continue
                for compared in node.comparators:
                    if isinstance(compared, ast.Name) and isinstance(constants.get(compared.id), list):
                        compared = ast.List([ast.Constant(v) for v in constants[compared.id]], ast.Load())
                    values = compared.elts if isinstance(compared, (ast.List, ast.Tuple, ast.Set)) else [compared]
                    for value in values:
                        is_name = isinstance(value, ast.Constant) and isinstance(value.value, str)
                        if is_name and value.value not in found:
                            found.append(value.value)
    return tuple(found)


def autoenable_sites(root: str | None = None) -> tuple[list[FusionSite], str] | str:
    """(sites, server_args.py path), or why there is nothing to evaluate."""
    path = sglang_file("srt/server_args.py", root)
    if path is None:
        return "no sglang/srt/server_args.py in this SGLang"
    sites = fusion_sites(parse_file(path))
    if not sites:
        # Later SGLang (0.5.23) decides this in a pass of sglang/srt/arg_groups/overrides.py: evaluate_pass.
        return f"{path} has no `self.{FUSION_FLAG} = True` in ServerArgs"
    if not named_archs(sites):
        return f"{path}: the conditions on `self.{FUSION_FLAG} = True` name no model architecture"
    return sites, path


def platform_flag_majors(root: str | None = None) -> tuple[dict[str, frozenset[int]], str]:
    """Capability majors each platform flag (``is_sm100_supported``, ``is_blackwell_supported``)
    accepts, read from SGLang's utils (and, for a flag they do not define, ``srt/layers/utils.py``,
    where 0.5.1 keeps ``is_sm90_supported`` / ``is_sm100_supported``); their CUDA-version floor is
    not evaluated."""
    path = sglang_file("srt/utils/common.py", root) or sglang_file("srt/utils.py", root)
    if path is None:
        return {}, "no sglang/srt/utils"
    definitions = flag_definitions(path)
    layers = sglang_file("srt/layers/utils.py", root)
    added = {k: v for k, v in flag_definitions(layers).items() if k not in definitions} if layers else {}
    if added:
        definitions.update(added)
        path = f"{path} (and {', '.join(added)} from {layers})"
    majors: dict[str, frozenset[int]] = {}
    for _ in range(3):  # a flag may be the `or` of flags defined after it (0.5.6: is_blackwell_supported)
        for name, definition in definitions.items():
            found = capability_majors(definition, majors)
            if found is not None:
                majors[name] = found
    return majors, path


def flag_definitions(path: str) -> dict[str, ast.AST]:
    """The top-level ``def is_*`` bodies (not their decorators) and ``is_* = ...`` values of a module."""
    definitions: dict[str, ast.AST] = {}
    for statement in parse_file(path).body:
        if isinstance(statement, ast.FunctionDef) and statement.name.startswith("is_"):
            definitions[statement.name] = ast.Module(body=statement.body, type_ignores=[])
        elif isinstance(statement, ast.Assign):
            for target in statement.targets:
                if isinstance(target, ast.Name) and target.id.startswith("is_"):
                    definitions[target.id] = statement.value
    return definitions


def capability_majors(definition: ast.AST, known: dict[str, frozenset[int]]) -> frozenset[int] | None:
    """``partial(_check_cuda_device_version, device_capability_majors=[10, 12])``,
    ``get_device_capability(device)[0] in [10, 12]`` / ``== 10``, or an ``or`` of known flags."""
    try:
        for node in ast.walk(definition):
            if isinstance(node, ast.Call):
                for keyword in node.keywords:
                    if keyword.arg == "device_capability_majors":
                        return frozenset(literal(keyword.value, {}))
            if isinstance(node, ast.Compare) and len(node.ops) == 1 and isinstance(node.left, ast.Subscript) \
                    and "get_device_capability" in ast.unparse(node.left.value):
                value = literal(node.comparators[0], {})
                if isinstance(node.ops[0], ast.In):
                    return frozenset(value)
                if isinstance(node.ops[0], ast.Eq):
                    return frozenset([value])
    except (ValueError, TypeError):
        return None
    called = [known.get(name) for n in ast.walk(definition) if isinstance(n, ast.Call)
              and (name := flag_name(n) or "") not in PLATFORM_CONSTANTS]  # `if not is_cuda_alike(): return`
    if called and all(c is not None for c in called):
        return frozenset().union(*called)
    return None


def field_defaults(tree: ast.Module) -> dict[str, Any]:
    """``name: type = <constant>`` defaults of the ServerArgs dataclass."""
    return class_defaults(class_node(tree, "ServerArgs"))


def class_defaults(cls: ast.ClassDef | None) -> dict[str, Any]:
    """``name: type = <constant>`` defaults of a class body."""
    defaults: dict[str, Any] = {}
    for statement in cls.body if cls else []:
        if isinstance(statement, ast.AnnAssign) and isinstance(statement.target, ast.Name) and statement.value:
            try:
                defaults[statement.target.id] = literal(statement.value, {})
            except (ValueError, TypeError, ArithmeticError):
                pass
    return defaults


UNKNOWN = object()


@dataclasses.dataclass(frozen=True, slots=True)
class PathFacts:
    """What a path condition may be evaluated against."""

    arch: str
    major: int
    flags: dict[str, frozenset[int]]
    fields: dict[str, Any]
    constants: dict[str, Any] = dataclasses.field(default_factory=dict)  # the module's constants


def truth(test: ast.expr, facts: PathFacts, unknown: list[str]) -> bool | None:
    """Three-valued evaluation of a path condition (None: cannot be decided from the files; the
    sub-expression goes to ``unknown``)."""
    if isinstance(test, ast.BoolOp):
        inner: list[str] = []
        values = [truth(v, facts, inner) for v in test.values]
        decisive = isinstance(test.op, ast.Or)  # True decides an `or`, False an `and`
        if decisive in values:
            return decisive  # what it could not decide did not matter
        unknown.extend(inner)
        return None if None in values else not decisive
    if isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not):
        value = truth(test.operand, facts, unknown)
        return None if value is None else not value
    if (isinstance(test, ast.Call) and not test.args) or platform_fact(test):
        name = flag_name(test) or ""
        if name in facts.flags:
            return facts.major in facts.flags[name]
        if name in PLATFORM_CONSTANTS:
            return PLATFORM_CONSTANTS[name]
    if isinstance(test, ast.Compare) and len(test.ops) == 1:
        left, right = value_of(test.left, facts), value_of(test.comparators[0], facts)
        if left is not UNKNOWN and right is not UNKNOWN:
            compare = {ast.In: lambda a, b: a in b, ast.NotIn: lambda a, b: a not in b,
                       ast.Eq: lambda a, b: a == b, ast.NotEq: lambda a, b: a != b,
                       ast.Is: lambda a, b: a is b, ast.IsNot: lambda a, b: a is not b,
                       ast.Gt: lambda a, b: a > b, ast.GtE: lambda a, b: a >= b,
                       ast.Lt: lambda a, b: a < b, ast.LtE: lambda a, b: a <= b}.get(type(test.ops[0]))
            try:
                if compare is not None:
                    return bool(compare(left, right))
            except TypeError:  # e.g. None > 1: not decided here
                pass
    value = value_of(test, facts)
    if value is not UNKNOWN:
        return bool(value)
    unknown.append(ast.unparse(test))
    return None


def value_of(node: ast.expr, facts: PathFacts) -> Any:
    if isinstance(node, ast.Name) and node.id == "model_arch":
        return facts.arch
    if isinstance(node, ast.Name) and node.id in DEVICE_NAME_ANSWERS:
        return DEVICE_NAME_ANSWERS[node.id]
    if isinstance(node, ast.Name) and node.id in facts.constants:
        return facts.constants[node.id]
    if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in ("self", "view"):
        return facts.fields.get(node.attr, UNKNOWN)  # ServerArgs' methods read self.*, 0.5.23's passes view.*
    try:
        return literal(node, {})
    except (ValueError, TypeError, ArithmeticError):
        return UNKNOWN


def read_autoenable(major: int, world_size: int, sites: Sequence[FusionSite], path: str, why: str,
                    root: str | None = None) -> AutoEnable:
    """Evaluate the path conditions of every auto-enable for each architecture they name, for a GPU of
    capability major ``major`` and ``world_size`` GPUs on one node."""
    flags, utils_path = platform_flag_majors(root)
    fields = {**field_defaults(parse_file(path)), "tp_size": world_size, "nnodes": 1}
    facts = PathFacts("", major, flags, fields)
    archs, undecided, lines = judge_sites(sites, named_archs(sites), facts, f"{FUSION_FLAG}=")
    how = (f"[ServerArgs, static: {why}; read {path}, not run; platform flags as capability majors from "
           f"{utils_path} {used_flags(flags, sites)} (their CUDA-version floor not evaluated); fields at their "
           f"defaults with tp_size={world_size}, nnodes=1; is_h20_device taken as False]")
    return AutoEnable(tuple(archs), named_archs(sites), tuple(undecided), "static",
                      "\n".join([how, *(site.describe(os.path.basename(path)) for site in sites), *lines]))


def judge_sites(sites: Sequence[FusionSite], archs_named: Sequence[str], base: PathFacts, label: str
                ) -> tuple[list[str], list[str], list[str]]:
    """(turned on, undecided, one evidence line each) over the architectures: on when every path
    condition of some site holds for it."""
    archs, undecided, lines = [], [], []
    for arch in archs_named:
        facts = dataclasses.replace(base, arch=arch)
        unknown: list[str] = []
        values = []
        for site in sites:
            conditions = [truth(test, facts, unknown) for test, _ in site.path]
            conditions = [c if taken or c is None else not c for c, (_, taken) in zip(conditions, site.path)]
            values.append(False if False in conditions else None if None in conditions else True)
        if True in values:
            archs.append(arch)
            lines.append(f"{arch}: {label}True")
        elif None in values:
            undecided.append(arch)
            lines.append(f"{arch}: undecided (depends on {'; '.join(dict.fromkeys(unknown))})")
        else:
            lines.append(f"{arch}: {label}False")
    return archs, undecided, lines


def used_flags(flags: dict[str, frozenset[int]], sites: Sequence[FusionSite]) -> dict[str, list[int]]:
    """The platform flags the path conditions read, with their capability majors."""
    read = {flag_name(n) or platform_fact(n) for site in sites for test, _ in site.path for n in ast.walk(test)}
    return {name: sorted(majors) for name, majors in flags.items() if name in read}


OVERRIDES_MODULE = "sglang.srt.arg_groups.overrides"
#: ``_flashinfer_allreduce_fusion_auto_enable(view) -> dict`` (``@register_post_process``, run from
#: ``arg_groups/model_hook.py`` through ``run_post_process_pass``), sglang 0.5.23
#: ``srt/arg_groups/overrides.py``: a non-empty dict turns the fusion on.
AUTOENABLE_PASS = "_flashinfer_allreduce_fusion_auto_enable"
PASS_KEY = "flashinfer_allreduce_fusion_backend"
#: ``get_platform().<fact>`` -> probe of ``sglang.srt.utils.common`` (0.5.23 ``srt/runtime_context.py``).
PLATFORM_PROBES = "_PLATFORM_PROBES"
#: Where 0.5.23 declares the ServerArgs fields (one msgspec Struct per namespace).
FIELDS_DIR = "srt/arg_groups/fields"


@dataclasses.dataclass(frozen=True, slots=True)
class PassSites:
    """The pass's returns that turn the fusion on, read from overrides.py."""

    sites: tuple[FusionSite, ...]
    path: str
    archs: tuple[str, ...]  # what the conditions name, MiMo's and _FLASHINFER_ALLREDUCE_FUSION_ARCHS
    constants: dict[str, Any]  # overrides.py's module constants
    imports: dict[str, str]  # module-level ``from sglang.X import name``: name -> sglang.X
    notes: tuple[str, ...]  # how the conditions were read


class Inliner(ast.NodeTransformer):
    """Replace local names by their values and calls of one-line helpers (``attn_dp_enabled_of(view)``)
    by their return expression, so that the conditions read only ``view.*``, ``model_arch`` and the platform."""

    def __init__(self, names: dict[str, ast.expr], helpers: dict[str, tuple[ast.FunctionDef, str]],
                 used: list[str], depth: int = 0) -> None:
        self.names, self.helpers, self.used, self.depth = names, helpers, used, depth

    def visit_Name(self, node: ast.Name) -> ast.expr:
        return copy.deepcopy(self.names[node.id]) if isinstance(node.ctx, ast.Load) and node.id in self.names else node

    def visit_Call(self, node: ast.Call) -> ast.expr:
        self.generic_visit(node)
        name = node.func.id if isinstance(node.func, ast.Name) else ""
        function, where = self.helpers.get(name, (None, ""))
        params = [a.arg for a in function.args.args] if function else []
        if function is None or node.keywords or len(params) != len(node.args) or self.depth > 8:
            return node
        self.used.append(f"{name} ({where})")
        body = copy.deepcopy(single_return(function))
        return Inliner(dict(zip(params, node.args)), self.helpers, self.used, self.depth + 1).visit(body)


def single_return(function: ast.FunctionDef) -> ast.expr | None:
    """The expression of a function whose body is only ``return <expr>`` (docstring and imports aside)."""
    body = [s for s in function.body if not isinstance(s, (ast.Import, ast.ImportFrom))
            and not (isinstance(s, ast.Expr) and isinstance(s.value, ast.Constant))]
    if len(body) == 1 and isinstance(body[0], ast.Return) and body[0].value is not None:
        return body[0].value
    return None


def imported_names(tree: ast.Module) -> dict[str, str]:
    return {alias.asname or alias.name: statement.module for statement in tree.body
            if isinstance(statement, ast.ImportFrom) and (statement.module or "").startswith("sglang.")
            for alias in statement.names}


def module_path(module: str, root: str | None = None) -> str | None:
    return sglang_file(module.replace("sglang.", "", 1).replace(".", "/") + ".py", root)


def view_helpers(modules: Sequence[str], root: str | None = None) -> dict[str, tuple[ast.FunctionDef, str]]:
    """One-line functions taking arguments (``attn_dp_enabled_of(cfg)``) of the modules, first module first."""
    helpers: dict[str, tuple[ast.FunctionDef, str]] = {}
    for module in dict.fromkeys(modules):
        path = module_path(module, root)
        for statement in parse_file(path).body if path else []:
            if isinstance(statement, ast.FunctionDef) and statement.args.args and single_return(statement) \
                    and statement.name not in helpers:
                helpers[statement.name] = (statement, f"{os.path.basename(path)}:{statement.lineno}")
    return helpers


def sets_backend(statement: ast.stmt) -> bool:
    """``return {"flashinfer_allreduce_fusion_backend": <a backend>}`` (0.5.19's
    ``return {"flashinfer_allreduce_fusion_backend": None}`` turns it off: an earlier return, not a site)."""
    return isinstance(statement, ast.Return) and isinstance(statement.value, ast.Dict) \
        and any(isinstance(k, ast.Constant) and k.value == PASS_KEY
                and not (isinstance(v, ast.Constant) and v.value is None)
                for k, v in zip(statement.value.keys, statement.value.values))


def all_of(path: Sequence[tuple[ast.expr, bool]]) -> ast.expr:
    """One expression for "every test on this path holds"."""
    tests = [test if taken else ast.UnaryOp(ast.Not(), test) for test, taken in path]
    return tests[0] if len(tests) == 1 else ast.BoolOp(ast.And(), tests) if tests else ast.Constant(True)


def pass_sites(root: str | None = None) -> PassSites | str:
    """The pass's returns that set the backend, each with its ``if`` tests and the negated tests of
    every earlier ``return`` (MiMo's ``return {}``), locals and one-line helpers inlined."""
    path = sglang_file("srt/arg_groups/overrides.py", root)
    if path is None:
        return "no sglang/srt/arg_groups/overrides.py in this SGLang"
    tree = parse_file(path)
    function = next((n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == AUTOENABLE_PASS), None)
    if function is None:
        return f"{path} has no function {AUTOENABLE_PASS}"
    imports = imported_names(tree)
    used: list[str] = []
    helpers = view_helpers([OVERRIDES_MODULE, *imports.values()], root)
    names: dict[str, ast.expr] = {}
    for statement in function.body:  # model_arch stays: value_of answers it
        if isinstance(statement, ast.Assign) and len(statement.targets) == 1 \
                and isinstance(statement.targets[0], ast.Name) and statement.targets[0].id != "model_arch":
            names[statement.targets[0].id] = Inliner(names, helpers, used).visit(copy.deepcopy(statement.value))
    returns = [(s, p) for s, p in guarded_statements(function.body, ()) if isinstance(s, ast.Return)]
    sites = []
    for statement, own in returns:
        if sets_backend(statement):
            earlier = [(all_of(p), False) for s, p in returns if s.lineno < statement.lineno and not sets_backend(s)]
            tests = tuple((Inliner(names, helpers, used).visit(copy.deepcopy(t)), taken) for t, taken in
                          (*earlier, *own))
            sites.append(FusionSite(AUTOENABLE_PASS, statement.lineno, tests, "", ast.unparse(statement)))
    constants = module_constants(tree)
    archs = named_archs(sites, constants)
    if not archs:
        return f"{path}: {AUTOENABLE_PASS} has no return setting {PASS_KEY} under a model_arch condition"
    notes = (f"{AUTOENABLE_PASS} at {os.path.basename(path)}:{function.lineno}, {pass_callers(path)}",
             f"inlined: local names {', '.join(names)}; helpers {', '.join(dict.fromkeys(used)) or 'none'}")
    return PassSites(tuple(sites), path, archs, constants, imports, notes)


def pass_callers(overrides_path: str) -> str:
    """Where arg_groups/ runs the pass (``run_post_process_pass(server_args, <pass>)``)."""
    folder = os.path.dirname(overrides_path)
    found = []
    for name in sorted(os.listdir(folder)):
        if name.endswith(".py"):
            with open(os.path.join(folder, name), encoding="utf-8") as handle:
                found += [f"{name}:{number}" for number, line in enumerate(handle, 1)
                          if "run_post_process_pass(" in line and AUTOENABLE_PASS in line]
    return f"run from {', '.join(found)}" if found else "no run_post_process_pass call for it found in arg_groups/"


def platform_fact_majors(found: PassSites, flags: dict[str, frozenset[int]], root: str | None = None
                         ) -> tuple[dict[str, frozenset[int]], str]:
    """``get_platform()`` facts (``is_sm90``) as the majors of the probes they read (``is_sm90_supported``)."""
    path = module_path(found.imports.get("get_platform", ""), root)
    if path is None:
        return {}, "get_platform's module not found"
    probes = module_constants(parse_file(path)).get(PLATFORM_PROBES, {})
    facts = {fact: flags[probe] for fact, probe in probes.items() if probe in flags} if isinstance(probes, dict) else {}
    return facts, f"{path} {PLATFORM_PROBES}"


def namespace_defaults(root: str | None = None) -> tuple[dict[str, Any], str]:
    """Constant defaults of the fields of every namespace Struct in arg_groups/fields/; a name two
    namespaces declare with different defaults is left out (unknown). Before 0.5.20 there is no such
    folder and the pass reads the fields ServerArgs declares in server_args.py."""
    folder = os.path.dirname(sglang_file(f"{FIELDS_DIR}/__init__.py", root) or "")
    server_args = sglang_file("srt/server_args.py", root)
    if not folder and server_args:
        return field_defaults(parse_file(server_args)), f"ServerArgs in {server_args} (no sglang/{FIELDS_DIR})"
    defaults: dict[str, Any] = {}
    clashes: set[str] = set()
    for name in sorted(os.listdir(folder)) if folder else []:
        if name.endswith(".py"):
            for cls in (n for n in parse_file(os.path.join(folder, name)).body if isinstance(n, ast.ClassDef)):
                for field, value in class_defaults(cls).items():
                    clashes |= {field} if field in defaults and defaults[field] != value else set()
                    defaults.setdefault(field, value)
    return {k: v for k, v in defaults.items() if k not in clashes}, folder or f"no sglang/{FIELDS_DIR}"


def read_pass(major: int, world_size: int, found: PassSites, why: str, root: str | None = None) -> AutoEnable:
    """The pass's conditions evaluated three-valued for each architecture they name."""
    flags, utils_path = platform_flag_majors(root)
    facts_majors, probes_at = platform_fact_majors(found, flags, root)
    fields, fields_at = namespace_defaults(root)
    fields.update(tp_size=world_size, nnodes=1)
    base = PathFacts("", major, {**flags, **facts_majors}, fields, found.constants)
    archs, undecided, lines = judge_sites(found.sites, found.archs, base, "returns a backend: ")
    how = (f"[{AUTOENABLE_PASS}, static: {why}; read {found.path}, not run; {'; '.join(found.notes)}; "
           f"get_platform() facts as capability majors {used_flags(base.flags, found.sites)} (through {probes_at} "
           f"from {utils_path}; CUDA-version floor not evaluated); view.* at the field defaults of {fields_at} with "
           f"tp_size={world_size}, nnodes=1; model config beyond architectures unknown]")
    return AutoEnable(tuple(archs), found.archs, tuple(undecided), "static", "\n".join(
        [how, *(site.describe(os.path.basename(found.path)) for site in found.sites), *lines]))


# --------------------------------------------------------------------------------------------
# The communicator gates, decided once
# --------------------------------------------------------------------------------------------
# The static half of the in-image SGLang gate probes (over the installed package) and the wheel tier's
# readers (over an unpacked wheel) read SGLang's custom all-reduce, symmetric-memory and
# allreduce-fusion gates with the functions below and take the decision from one ``decide`` method, so
# the two tiers cannot answer the same code differently. Each caller only words the decision.

COMM_DIR = COMM.replace("sglang.", "", 1).replace(".", "/")
CAR_FILES = (f"{COMM_DIR}/custom_all_reduce.py", f"{COMM_DIR}/custom_all_reduce_utils.py")
SYMM_TABLE_FILE = f"{COMM_DIR}/all_reduce_utils.py"
FUSION_FILE = "srt/layers/flashinfer_comm_fusion.py"
FUSION_GATE = "_resolve_backend"
#: What a gate decides when it lets the feature through (the other answers name the check that refused).
ADMITTED = "admitted"


@dataclasses.dataclass(frozen=True, slots=True)
class GateUnread:
    """A gate that could not be read: its file is not in this SGLang (``absent``), or the file is there
    and the code the gate is made of was not found (``why`` says which; ``path`` / ``line``: where it
    was looked for)."""

    absent: bool
    why: str
    path: str = ""
    line: int = 1


def assignment_line(tree: ast.Module | ast.ClassDef, name: str) -> int:
    """Line of the top-level ``name = ...`` / ``name: T = ...`` of a module or class body (0: none)."""
    for statement in tree.body:
        targets = statement.targets if isinstance(statement, ast.Assign) else \
            [statement.target] if isinstance(statement, ast.AnnAssign) else []
        if any(isinstance(t, ast.Name) and t.id == name for t in targets):
            return statement.lineno
    return 0


CAR_V2_FILE = f"{COMM_DIR}/custom_all_reduce_v2.py"
CAR_V2_CLASS = "CustomAllReduceV2"
CAR_DISPATCH = "dispatch_custom_allreduce"
ENVIRON_FILE = "srt/environ.py"


@dataclasses.dataclass(frozen=True, slots=True)
class CustomArV2:
    """``CustomAllReduceV2`` as ``dispatch_custom_allreduce`` picks it on CUDA (0.5.11: opt-in behind
    ``SGLANG_USE_JIT_ALL_REDUCE``; 0.5.12: the default, ``SGLANG_OPT_USE_CUSTOM_ALL_REDUCE_V2``).

    ``nvlink_line``: V2's own ``full_nvlink != True: return`` (0.5.12) / ``return full_nvlink is True``
    (0.5.13), which refuses every world size without full NVLink, not only more than two GPUs (0 when
    V2 keeps only the shared ``world_size > K`` gate). ``fallback_line``: the test in the dispatch that
    lets a refused V2 fall through to ``CustomAllreduce`` (0.5.13's ``can_use_custom_all_reduce_v2``);
    0 when the dispatch returns V2 unconditionally, so a V2 that disables itself leaves no custom
    all-reduce at all (0.5.12, 0.5.12.post1)."""

    path: str
    dispatch_path: str
    dispatch_line: int       # the `if` in dispatch_custom_allreduce that picks V2
    switch: str              # the environment variable that picks it
    default_on: bool         # its default: V2 is what SGLang uses unless told otherwise
    sizes: list | None       # None: computed per arch at run time (0.5.23's configs), not read here
    sizes_line: int
    nvlink_line: int
    fallback_line: int

    def refuses(self, world_size: int, full_nvlink: bool, threshold: int) -> str | None:
        """Why V2 disables itself for the node (``nvlink`` | ``world-size`` | ``pcie``, or
        ``sizes-unread`` when that hangs on world sizes the files do not state), None: it is kept up to
        the P2P check. ``threshold``: the shared gate's K (``world_size > K and not full_nvlink``)."""
        if self.nvlink_line and not full_nvlink:
            return "nvlink"
        if self.sizes is None:
            return "sizes-unread"
        if world_size not in self.sizes:
            return "world-size"
        if world_size > threshold and not full_nvlink:
            return "pcie"
        return None


def env_default(name: str, root: str | None) -> bool | None:
    """The default of ``NAME = EnvBool(<bool>)`` in ``srt/environ.py`` (None: not read)."""
    path = sglang_file(ENVIRON_FILE, root)
    if path is None:
        return None
    for node in ast.walk(parse_file(path)):
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == name for t in node.targets) \
                and isinstance(node.value, ast.Call) and isinstance(node.value.func, ast.Name) \
                and node.value.func.id == "EnvBool" and node.value.args \
                and isinstance(node.value.args[0], ast.Constant) and isinstance(node.value.args[0].value, bool):
            return node.value.args[0].value
    return None


def env_switch(test: ast.expr, root: str | None) -> tuple[str, bool | None] | None:
    """(variable, default) of an environment test: ``envs.NAME.get()`` (its EnvBool default in
    environ.py) or ``get_bool_env_var("NAME", default="false")``; None: the test reads no variable."""
    if not isinstance(test, ast.Call):
        return None
    func = test.func
    if isinstance(func, ast.Attribute) and func.attr == "get" and isinstance(func.value, ast.Attribute) \
            and isinstance(func.value.value, ast.Name) and func.value.value.id == "envs":
        return func.value.attr, env_default(func.value.attr, root)
    if isinstance(func, ast.Name) and func.id == "get_bool_env_var" and test.args \
            and isinstance(test.args[0], ast.Constant):
        default = next((k.value for k in test.keywords if k.arg == "default"),
                       test.args[1] if len(test.args) > 1 else ast.Constant("false"))
        value = default.value if isinstance(default, ast.Constant) else None
        return str(test.args[0].value), (str(value).lower() in ("1", "true") if value is not None else None)
    return None


def returns_name(statement: ast.stmt, name: str) -> bool:
    return isinstance(statement, ast.Return) and isinstance(statement.value, ast.Name) and statement.value.id == name


def nvlink_required_line(tree: ast.Module) -> int:
    """Line of a test in V2's file that needs ``full_nvlink`` itself (``full_nvlink != True``,
    ``full_nvlink is True``, ``not full_nvlink``), not joined with a world-size test; 0: none."""
    # ast.walk still visits a skipped node's children: every node under a world-size BoolOp is skipped
    joined = {id(inner) for node in ast.walk(tree) if isinstance(node, ast.BoolOp)
              and any(isinstance(n, ast.Name) and n.id == "world_size" for n in ast.walk(node))
              for inner in ast.walk(node)}
    for node in ast.walk(tree):
        if id(node) in joined:
            continue
        operand = node.left if isinstance(node, ast.Compare) else \
            node.operand if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Not) else None
        if isinstance(operand, ast.Name) and operand.id == "full_nvlink" and (
                isinstance(node, ast.UnaryOp)
                or all(isinstance(c, ast.Constant) and c.value is True for c in node.comparators)):
            return node.lineno
    return 0


def v2_sizes(tree: ast.Module) -> tuple[list, int] | None:
    """The world sizes V2 passes as ``supported_world_size``: a literal list, or the keys of the
    ``THRESHOLD_2_SHOT_MAP`` dicts it is built from (the sizes every dict holds), with the line.
    None: they come from elsewhere (0.5.23: a per-arch config function)."""
    call = next((n for n in ast.walk(tree) if isinstance(n, ast.Call) and isinstance(n.func, ast.Name)
                 and n.func.id == "can_use_custom_all_reduce_with_nvlink"), None)
    given = next((k.value for k in call.keywords if k.arg == "supported_world_size"), None) if call else None
    if given is None:
        return None
    try:
        return sorted(literal(given, {})), given.lineno
    except (ValueError, TypeError, ArithmeticError):
        pass
    names = {n.id for n in ast.walk(given) if isinstance(n, ast.Name) and n.id.isupper()}
    tables = [(n.value, n.lineno) for n in ast.walk(tree) if isinstance(n, (ast.Assign, ast.AnnAssign))
              and isinstance(n.value, ast.Dict) and n.value.keys
              and any(isinstance(t, ast.Name) and t.id in names
                      for t in (n.targets if isinstance(n, ast.Assign) else [n.target]))]
    keys = [{k.value for k in table.keys if isinstance(k, ast.Constant)} for table, _ in tables]
    return (sorted(set.intersection(*keys)), tables[0][1]) if keys else None


def custom_ar_v2(main: str, main_tree: ast.Module, root: str | None) -> CustomArV2 | GateUnread | None:
    """V2 as the dispatch picks it on CUDA; None: this SGLang has no V2 in its dispatch (before 0.5.11)."""
    dispatch = next((n for n in ast.walk(main_tree) if isinstance(n, ast.FunctionDef) and n.name == CAR_DISPATCH),
                    None)
    picked = next(((s, steps) for s, steps in guarded_statements(dispatch.body, ())
                   if returns_name(s, CAR_V2_CLASS)), None) if dispatch else None
    if picked is None:
        return None
    statement, steps = picked
    tests = [(t, taken) for test, taken in steps for t in ([test] if not taken else
             test.values if isinstance(test, ast.BoolOp) and isinstance(test.op, ast.And) else [test])]
    switches = [(found, test) for test, taken in tests if taken and (found := env_switch(test, root))]
    path = sglang_file(CAR_V2_FILE, root)
    if len(switches) != 1 or switches[0][0][1] is None or path is None:
        return GateUnread(False, f"{CAR_DISPATCH} returns {CAR_V2_CLASS} under a switch (or from a file) that "
                                 "was not read", main, statement.lineno)
    (switch, default_on), switch_test = switches[0]
    # the dispatch's other tests: the platform (`_is_cuda`, true here) or a V2 check whose failure
    # falls through to the legacy class
    guards = [test for test, _ in tests if test is not switch_test and not (
        isinstance(test, ast.Name) and test.id.startswith("_is_"))]
    falls_back = any(returns_name(s, "CustomAllreduce") for s, _ in guarded_statements(dispatch.body, ()))
    tree = parse_file(path)
    sizes = v2_sizes(tree) or (None, 0)
    return CustomArV2(path, main, switch_test.lineno, switch, default_on, sizes[0], sizes[1],
                      nvlink_required_line(tree), guards[0].lineno if guards and falls_back else 0)


@dataclasses.dataclass(frozen=True, slots=True)
class CustomArGate:
    """``CustomAllreduce``'s gates in SGLang's files: ``_SUPPORTED_WORLD_SIZES`` and
    ``if world_size > K and not full_nvlink`` (in ``custom_all_reduce_utils.py`` from 0.5.10), with
    SGLang's warnings for both; and ``CustomAllReduceV2`` where the dispatch picks it by default."""

    main_path: str
    paths: tuple[str, ...]
    sizes: list
    sizes_line: int
    threshold: int
    gate_path: str
    gate_line: int
    pcie_message: str
    size_message: str
    v2: CustomArV2 | None = None   # only where the dispatch picks V2 by default

    def decide(self, world_size: int, full_nvlink: bool) -> str:
        """``one-gpu`` (no custom all-reduce is built) | ``world-size`` (not in the supported sizes) |
        ``pcie`` (more than K GPUs without full NVLink) | ``v2-<why>`` (the default V2 disables itself,
        :meth:`CustomArV2.refuses` says why, and the dispatch has no fallback; ``v2-sizes-unread``:
        whether V2 is kept is not in the files and the answer hangs on it) | :data:`ADMITTED` (up to
        the P2P check, which runs on the hardware). A refused V2 with a fallback is decided as the
        legacy class."""
        if world_size <= 1:
            return "one-gpu"
        legacy = self.legacy(world_size, full_nvlink)
        if self.v2 is None:
            return legacy
        refused = self.v2.refuses(world_size, full_nvlink, self.threshold)
        if refused is None:
            return ADMITTED
        if refused == "sizes-unread":
            # kept, or refused and fallen back to a legacy class that admits: admitted either way
            return ADMITTED if self.v2.fallback_line and legacy == ADMITTED else "v2-sizes-unread"
        return legacy if self.v2.fallback_line else f"v2-{refused}"

    def legacy(self, world_size: int, full_nvlink: bool) -> str:
        """``CustomAllreduce``'s own decision (see :meth:`decide`)."""
        if world_size <= 1:
            return "one-gpu"
        if world_size not in self.sizes:
            return "world-size"
        if world_size > self.threshold and not full_nvlink:
            return "pcie"
        return ADMITTED


def custom_ar_gate(root: str | None = None) -> CustomArGate | GateUnread:
    """The custom all-reduce gates of the sglang package under ``root`` (None: the installed one)."""
    main = sglang_file(CAR_FILES[0], root)
    if main is None:
        return GateUnread(True, "no custom_all_reduce.py in this SGLang")
    paths = tuple(p for p in (main, sglang_file(CAR_FILES[1], root)) if p)
    trees = {path: parse_file(path) for path in paths}
    cls = class_node(trees[main], "CustomAllreduce")
    body = ast.Module(body=cls.body, type_ignores=[]) if cls else None
    sizes = module_constants(body).get("_SUPPORTED_WORLD_SIZES") if body else None
    gate = next(((path, found) for path, tree in trees.items() if (found := pcie_gate(tree))), None)
    if cls is None or not isinstance(sizes, list) or gate is None:
        return GateUnread(False, "CustomAllreduce._SUPPORTED_WORLD_SIZES or the `world_size > K and not "
                                 "full_nvlink` gate was not found", main)
    gate_path, (threshold, pcie_message, gate_line) = gate
    size_message = next((m for tree in trees.values() for m in size_gate_messages(tree)), "")
    v2 = custom_ar_v2(main, trees[main], root)
    if isinstance(v2, GateUnread):
        return v2
    return CustomArGate(main, paths, sizes, assignment_line(cls, "_SUPPORTED_WORLD_SIZES"), threshold, gate_path,
                        gate_line, pcie_message, size_message, v2 if v2 is not None and v2.default_on else None)


@dataclasses.dataclass(frozen=True, slots=True)
class SymmMemGate:
    """The torch symmetric-memory communicator's gates in SGLang's files: its size table (capability
    major -> world size -> bytes), how the constructor looks the table up, its capability floor, its
    multicast check and SGLang's warnings."""

    table_name: str
    table: dict
    table_path: str
    table_line: int
    comm_path: str
    class_name: str
    style: str                   # index (KeyError when missing) | get (disabled) | unknown
    lookup_line: int
    floor: int | None            # K of ``if self.device_capability < K``
    floor_line: int | None
    multicast_line: int | None   # ``if handle.multicast_ptr == 0:`` (disabled without multicast)
    messages: tuple[tuple[int, str], ...]

    def decide(self, major: int, world_size: int) -> str:
        """``below-floor`` | ``capability`` (no entry for it: the lookup raises or disables, per
        :attr:`style`) | ``lookup-unknown`` (no entry, and how the constructor looks it up was not
        found) | ``world-size`` (no entry for it under the capability) | :data:`ADMITTED` (up to the
        allocation and the multicast check, which run on the hardware)."""
        if self.floor is not None and major < self.floor:
            return "below-floor"
        if major not in self.table:
            return "lookup-unknown" if self.style == "unknown" else "capability"
        if world_size not in self.table[major]:
            return "world-size"
        return ADMITTED

    @property
    def checks_end(self) -> int:
        """The last line of the constructor's capability / world-size checks."""
        checks = [n for n, m in self.messages if "capability" in m.lower() or "world size" in m.lower()]
        return max([self.lookup_line, *checks])

    def said(self, topic: str, value: int) -> str:
        """SGLang's own log message about ``topic`` (capability / world size), filled in."""
        return next((fill(m, value) for _, m in self.messages if topic in m.lower()), "")


def symm_mem_gate(root: str | None = None) -> SymmMemGate | GateUnread:
    """The symmetric-memory gates of the sglang package under ``root`` (None: the installed one)."""
    table_path = sglang_file(SYMM_TABLE_FILE, root)
    comm = next(((path, cls) for module, cls in SYMM_MODULES if (path := module_path(module, root))), None)
    if comm is None or table_path is None:
        return GateUnread(True, "no torch symmetric-memory communicator (torch_symm_mem.py / symm_mem.py and "
                                "all_reduce_utils.py) in this SGLang")
    table_tree = parse_file(table_path)
    constants = module_constants(table_tree)
    table_name = next((n for n in SYMM_TABLES if isinstance(constants.get(n), dict)), None)
    path, class_name = comm
    cls = class_node(parse_file(path), class_name)
    if table_name is None or cls is None:
        lacking = f"no {' / '.join(SYMM_TABLES)} literal" if table_name is None else f"no class {class_name}"
        return GateUnread(False, f"{lacking} in SGLang's communicator files", path)
    style, line = table_access(cls, table_name)
    floor = min_capability_site(cls)
    multicast = next((n.lineno for n in ast.walk(cls) if isinstance(n, ast.Compare)
                      and isinstance(n.left, ast.Attribute) and n.left.attr == "multicast_ptr"), None)
    return SymmMemGate(table_name, constants[table_name], table_path, assignment_line(table_tree, table_name),
                       path, class_name, style, line, floor[0] if floor else None, floor[1] if floor else None,
                       multicast, tuple(warnings_in(cls)))


@dataclasses.dataclass(frozen=True, slots=True)
class FusionGate:
    """``_resolve_backend``'s ``if <is_smXX flags>: raise Error("...")`` in
    ``srt/layers/flashinfer_comm_fusion.py`` (0.5.14+)."""

    path: str
    test: ast.expr
    message: str          # ``Error: text``
    line: int             # the ``if``
    raise_line: int

    def decide(self, major: int) -> str:
        """``arch`` (the check raises for the capability major) | :data:`ADMITTED`; ValueError when
        the test is not made of arch flags (the flags are read as capability majors, their
        CUDA-version part is not evaluated)."""
        return "arch" if arch_test(self.test, major) else ADMITTED

    def check_text(self) -> str:
        """The check as it reads: ``flashinfer_comm_fusion.py:48 _resolve_backend: `if <test>: raise <message>```."""
        return (f"{os.path.basename(self.path)}:{self.line} {FUSION_GATE}: "
                f"`if {ast.unparse(self.test)}: raise {self.message}`")


def fusion_gate(root: str | None = None) -> FusionGate | GateUnread:
    """SGLang's own allreduce-fusion arch gate under ``root`` (None: the installed one). Absent before
    0.5.14: FlashInfer's own gate decides alone."""
    path = sglang_file(FUSION_FILE, root)
    function = None if path is None else next(
        (n for n in ast.walk(parse_file(path)) if isinstance(n, ast.FunctionDef) and n.name == FUSION_GATE), None)
    if path is None or function is None:
        return GateUnread(True, f"no {FUSION_GATE} in sglang/{FUSION_FILE}" if path else f"no sglang/{FUSION_FILE}")
    gate = arch_raise(function)
    if gate is None:
        return GateUnread(False, f"{FUSION_GATE} has no `if <is_smXX flags>: raise` check", path, function.lineno)
    test, message, line = gate
    raised = min(n.lineno for n in ast.walk(function) if isinstance(n, ast.Raise) and n.lineno > line)
    return FusionGate(path, test, message, line, raised)
