"""Reading source files of an unpacked wheel without importing them: parse, find, cite.

Readers decide a fact from the code as written, so they need three things, all here: a file parsed
into an AST (or just its lines, for headers), the calls / keywords / literals that carry the fact,
and the 1-based line each came from, as a :class:`~stackforge.core.wheel_readings.CodeSite`.

Nothing here raises on the wheel's content: a missing file is ``None``; a file that does not parse is
a :class:`SourceFile` whose ``tree`` is ``None`` and whose ``error`` says why (the reader then reports
UNDECIDED); a value that is not a literal is ``None`` from :meth:`SourceFile.resolve`.

API (small on purpose):
    parse(root, path) -> SourceFile | None        a file under root; Python files get a tree
    files_containing(root, text, under=...) -> tuple[str, ...]   fallback search when code moved
    SourceFile.function(name) -> FunctionDef | None                first def/async def of that name
    SourceFile.resolve(node) -> Resolved | None    literal value (also a module-level NAME = literal)
    SourceFile.site(node_or_line) -> CodeSite      the line as written, stripped
    SourceFile.lines_containing(text) -> tuple[int, ...]
    SourceFile.imported_module(root, name) -> str | None   the file a name is imported from
    calls_named(node, name) -> tuple[Call, ...]    calls of f(...) / x.f(...) in source order
    keyword_arg(call, name) -> keyword | None
    decorator_calls(function, name) -> tuple[Call, ...]
    absent_site(path) -> CodeSite                  line 0: the fact is the file's absence
    looked_site(root, path, lacking) -> CodeSite   line 0: absent, or present without what was looked for
    missing_subpackage(root, sites) -> str | None  the top-level subpackage an absent site's whole folder lacks
"""

from __future__ import annotations

import ast
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any

from stackforge.core.wheel_readings import CodeSite

_FunctionNode = ast.FunctionDef | ast.AsyncFunctionDef


@dataclass(frozen=True, slots=True)
class Resolved:
    """A literal value and the line that states it (the assignment's line for a named constant)."""

    value: Any
    line: int


@dataclass(frozen=True, slots=True)
class SourceFile:
    """One file of the wheel: its lines, and for Python its AST (``None`` with ``error`` if unparsable)."""

    path: str                         # inside the wheel, posix, e.g. "flashinfer/jit/comm.py"
    lines: tuple[str, ...]
    tree: ast.Module | None = None
    error: str = ""
    # name -> first def of that name in source order (module level, methods, nested), built once
    functions: Mapping[str, _FunctionNode] = field(default_factory=dict, compare=False, repr=False)

    def code(self, line: int) -> str:
        """The 1-based line as written, stripped ("" outside the file)."""
        return self.lines[line - 1].strip() if 1 <= line <= len(self.lines) else ""

    def site(self, where: ast.AST | int) -> CodeSite:
        """The code site of a node (its first line) or of a 1-based line number."""
        line = where if isinstance(where, int) else getattr(where, "lineno", 0)
        return CodeSite(self.path, line, self.code(line))

    def lines_containing(self, text: str) -> tuple[int, ...]:
        """1-based numbers of the lines that contain ``text``."""
        return tuple(number for number, line in enumerate(self.lines, start=1) if text in line)

    def function(self, name: str) -> _FunctionNode | None:
        """The first function (module level, method or nested) named ``name``, in source order."""
        return self.functions.get(name)

    def module_constant(self, name: str) -> ast.Assign | ast.AnnAssign | None:
        """The module-level assignment that binds ``name``, when there is exactly one."""
        if self.tree is None:
            return None
        bound = [node for node in self.tree.body if name in _assigned_names(node)]
        return bound[0] if len(bound) == 1 else None

    def resolve(self, node: ast.AST | None) -> Resolved | None:
        """The literal value of ``node``: a literal, or a name bound once at module level to one."""
        if node is None:
            return None
        try:
            return Resolved(ast.literal_eval(node), node.lineno)
        except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
            pass
        if isinstance(node, ast.Name):
            assignment = self.module_constant(node.id)
            if assignment is not None and assignment.value is not None:
                try:
                    return Resolved(ast.literal_eval(assignment.value), assignment.lineno)
                except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
                    return None
        return None

    def imported_module(self, root: Path, name: str) -> str | None:
        """The wheel path of the module ``name`` is imported from (``from .x import name``), if present."""
        if self.tree is None:
            return None
        for node in ast.walk(self.tree):
            if isinstance(node, ast.ImportFrom) and any((alias.asname or alias.name) == name
                                                         for alias in node.names):
                return _module_file(root, self.path, node.module or "", node.level)
        return None


def parse(root: Path, path: str) -> SourceFile | None:
    """``root/path`` read (and parsed when it is Python); ``None`` when the file does not exist."""
    file = root / path
    if not file.is_file():
        return None
    try:
        text = file.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        return SourceFile(path, (), None, f"cannot read {path}: {exc}")
    lines = tuple(text.splitlines())
    if not path.endswith(".py"):
        return SourceFile(path, lines)
    try:
        tree = ast.parse(text, filename=path)
    except (SyntaxError, ValueError, RecursionError) as exc:
        return SourceFile(path, lines, None, f"{path} does not parse: {exc}")
    return SourceFile(path, lines, tree, functions=_function_index(tree))


def files_containing(root: Path, text: str, *, under: str, suffix: str = ".py") -> tuple[str, ...]:
    """Wheel paths of the files below ``under`` (a folder inside the wheel) whose text holds
    ``text``, sorted. For code that moved to a file the reader does not know yet."""
    base = root / under
    if not base.is_dir():
        return ()
    hits = []
    for file in sorted(base.rglob(f"*{suffix}")):
        try:
            if text in file.read_text(encoding="utf-8", errors="replace"):
                hits.append(file.relative_to(root).as_posix())
        except OSError:
            continue
    return tuple(hits)


def calls_named(node: ast.AST, name: str) -> tuple[ast.Call, ...]:
    """Calls below ``node`` whose callee is ``name`` or ``<anything>.name``, in source order."""
    calls = [child for child in ast.walk(node) if isinstance(child, ast.Call) and callee_name(child) == name]
    return tuple(sorted(calls, key=lambda call: (call.lineno, call.col_offset)))


def callee_name(call: ast.Call) -> str:
    """``f`` for ``f(...)`` and ``x.y.f(...)``; "" for other callees."""
    if isinstance(call.func, ast.Name):
        return call.func.id
    if isinstance(call.func, ast.Attribute):
        return call.func.attr
    return ""


def keyword_arg(call: ast.Call, name: str) -> ast.keyword | None:
    """The ``name=...`` keyword of a call."""
    return next((keyword for keyword in call.keywords if keyword.arg == name), None)


def decorator_calls(function: _FunctionNode, name: str) -> tuple[ast.Call, ...]:
    """The decorators ``@name(...)`` (or ``@x.name(...)``) of a function."""
    return tuple(decorator for decorator in function.decorator_list
                 if isinstance(decorator, ast.Call) and callee_name(decorator) == name)


def absent_site(path: str) -> CodeSite:
    """The site of a file that is not in the wheel (line 0, no code)."""
    return CodeSite(path, 0, "")


def looked_site(root: Path, path: str, lacking: str) -> CodeSite:
    """A line-0 site for a file looked in: its absence (no code) when it is not in the wheel, else what
    the file there lacks (``lacking``), so evidence never calls a present file absent."""
    return CodeSite(path, 0, lacking if (root / path).is_file() else "")


def missing_subpackage(root: Path, sites: Sequence[CodeSite]) -> str | None:
    """The first top-level subpackage (``flashinfer/comm``) that an absence site (line 0, no code) lies in
    and that the tree lacks as a whole; None when every absent file's subpackage is there (or the file
    sits at the package's top). An sdist lays headers and data out unlike a wheel, so one missing file
    proves nothing there; a whole Python subpackage missing from its package tree does (FlashInfer
    0.2.7's sdist has no ``flashinfer/comm``)."""
    for site in sites:
        parts = PurePosixPath(site.path).parts
        if site.line == 0 and not site.code and len(parts) >= 3 and (root / parts[0]).is_dir() \
                and not (root / parts[0] / parts[1]).exists():
            return f"{parts[0]}/{parts[1]}"
    return None


def _function_index(tree: ast.Module) -> dict[str, _FunctionNode]:
    defs = sorted((node for node in ast.walk(tree) if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))),
                  key=lambda node: node.lineno)
    index: dict[str, _FunctionNode] = {}
    for node in defs:
        index.setdefault(node.name, node)
    return index


def _assigned_names(node: ast.stmt) -> tuple[str, ...]:
    if isinstance(node, ast.Assign):
        return tuple(target.id for target in node.targets if isinstance(target, ast.Name))
    if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
        return (node.target.id,)
    return ()


def _module_file(root: Path, importer: str, module: str, level: int) -> str | None:
    """The file of ``from <level dots><module> import ...`` written in ``importer``."""
    if level:
        package = Path(importer).parent.parts
        package = package[: len(package) - (level - 1)] if level > 1 else package
    else:
        package = ()
    parts = (*package, *(module.split(".") if module else ()))
    for candidate in (Path(*parts).with_suffix(".py") if parts else None, Path(*parts, "__init__.py")):
        if candidate is not None and (root / candidate).is_file():
            return candidate.as_posix()
    return None
