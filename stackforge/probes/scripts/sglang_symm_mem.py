"""Gate probe for SGLang's torch symmetric-memory communicator: feature ``torch-symm-mem``.

SGLang decides in ``TorchSymmMemCommunicator.__init__``
(``srt/distributed/device_communicators/torch_symm_mem.py``; ``SymmMemCommunicator`` in ``symm_mem.py``
for 0.5.3-0.5.5, whichever file the installed package has) by looking the device's major capability and
the world size up in ``TORCH_SYMM_MEM_ALL_REDUCE_MAX_SIZES`` / ``SYMM_MEM_ALL_REDUCE_MAX_SIZES``
(``all_reduce_utils.py``); later it also needs multicast (a runtime property).

Live: the constructor runs for the target node (``_sglang_node.py``) until the symmetric-memory
allocation. Static, when the module does not import: the table, its lookup and SGLang's messages are
read with ``ast`` (``_sglang_source.py``) and evaluated.

When the live constructor stops at state only a running server provides (0.5.23 reads ``get_exec()`` at
torch_symm_mem.py:104), the size table decides when it can (it denies the capability or world size, or
the constructor passed its table checks before it stopped), and says so with file:line; otherwise the
result is ``undecided``.

No GPU needed.
"""

from __future__ import annotations

import ast
import dataclasses
import functools
import os
import sys
from collections.abc import Sequence
from typing import Any

import _sfprobe as sf
from _sglang_node import (
    GateReached,
    Node,
    constructor_line,
    emulated_node,
    evaluate,
    import_sglang,
    is_missing,
    run_gate,
    server_context,
    sglang_warnings,
)
from _sglang_source import (
    SYMM_MODULES,
    SYMM_TABLES,
    class_node,
    fill,
    min_capability,
    module_constants,
    parse_file,
    sglang_file,
    table_access,
    warnings_in,
)

FEATURE = "torch-symm-mem"


def live_symm_mem(torch: Any, node: Node) -> sf.ProbeVerdict | str:
    """Run the torch symmetric-memory communicator's constructor for the node; a verdict, or
    the import error text when the module cannot be imported."""
    errors = []
    for module_name, class_name in SYMM_MODULES:
        module, error = import_sglang(module_name)
        if module is None:
            errors.append(f"{module_name}: {error}")
            if is_missing(error, module_name):
                continue  # older/newer SGLang: try the other file name
            break
        communicator = getattr(module, class_name, None)
        symm = getattr(module, "torch_symm_mem", None)
        if communicator is None or symm is None:
            errors.append(f"{module_name} has no {class_name} / torch_symm_mem")
            continue

        def allocate(*args: Any, **kwargs: Any) -> None:
            raise GateReached("torch_symm_mem.empty")

        group = type("ProbeGroup", (), {"group_name": "stackforge-probe"})()
        where = f"{module_name}.{class_name}.__init__"
        context, stopped_at, trace = None, None, ""
        with sglang_warnings() as logs, emulated_node(torch, node, [module]), sf.patched(symm, "empty", allocate):
            try:
                instance = communicator(group, 0)
                outcome = f"returned with disabled={getattr(instance, 'disabled', None)}"
            except GateReached:
                outcome = "reached the symmetric-memory allocation"
            except Exception as exc:  # noqa: BLE001 - e.g. KeyError: 12, SGLang's own failure
                outcome = f"raised {sf.describe_exception(exc)}"
                context = server_context(exc)
                stopped_at = constructor_line(exc, getattr(module, "__file__", "") or "")
                trace = sf.traceback_text(exc)
        tables = "; ".join(f"{name} = {getattr(module, name)}" for name in SYMM_TABLES if hasattr(module, name))
        if context is not None:
            return symm_without_server(node, where, outcome, context, stopped_at, trace, logs, tables)
        return symm_verdict(where, outcome, logs, node, f"live; {tables}" if tables else "live")
    return "; ".join(errors)


def symm_without_server(node: Node, where: str, outcome: str, context: str, stopped_at: int | None, trace: str,
                        logs: Sequence[str], tables: str) -> sf.ProbeVerdict:
    """The live constructor stopped at state only a running server provides (not SGLang's verdict):
    the size table decides when it can, else the result is undecided."""
    reading = symm_table_reading(node)
    said = "; ".join(logs)
    live = (f"[live; {tables}] {where} for capability {node.arch.dotted}, world size {node.world_size}: "
            f"{outcome}\nthe constructor needs what only a running SGLang server provides: {context}"
            + (f"\nSGLang logged: {said}" if said else "") + f"\n{trace}")
    if isinstance(reading, str):
        return sf.ProbeVerdict("undecided", f"SGLang's torch symmetric-memory constructor needs a running server "
                               f"({context}); the size table could not be read ({reading})", live)
    evidence = f"{live}\n[table] {reading.text()}"
    if not reading.admits:
        return sf.ProbeVerdict("fail", f"SGLang's size table decides: {reading.denial} (measured: the table "
                               f"{reading.table_name} at {reading.table_where} as looked up at {reading.lookup_where}; "
                               "the constructor itself stopped at server-only state)", evidence)
    if stopped_at is not None and stopped_at > reading.checks_end:
        return sf.ProbeVerdict("pass", f"SGLang's size table decides: {reading.table_name} "
                               f"({reading.table_where}) admits capability {node.arch.major} with {node.world_size} "
                               f"GPUs, and the constructor passed its table checks ({reading.checks_where}) live before "
                               f"it stopped at server-only state ({os.path.basename(reading.comm_path)}:{stopped_at}); "
                               "the allocation and multicast (handle.multicast_ptr != 0) were not reached and decide "
                               "at run time (see the runtime probe)", evidence)
    return sf.ProbeVerdict("undecided", f"SGLang's torch symmetric-memory constructor stopped at server-only state "
                           f"before its table checks ({context}); its table admits capability {node.arch.major} with "
                           f"{node.world_size} GPUs, but what comes before the table was not run", evidence)


def symm_verdict(where: str, outcome: str, logs: Sequence[str], node: Node, method: str) -> sf.ProbeVerdict:
    said = "; ".join(logs)
    evidence = f"[{method}] {where} for capability {node.arch.dotted}, world size {node.world_size}: {outcome}"
    evidence += f"\nSGLang logged: {said}" if said else ""
    if outcome.startswith("reached"):
        return sf.ProbeVerdict("pass", f"SGLang's torch symmetric-memory gate admits capability {node.arch.major} with "
                               f"{node.world_size} GPUs; it still needs multicast (handle.multicast_ptr != 0) at run "
                               "time, which PCIe GPUs usually lack (see the runtime probe)", evidence)
    if outcome.startswith("raised"):
        return sf.ProbeVerdict("fail", f"SGLang's torch symmetric-memory communicator raises {outcome[7:]} for "
                               f"capability {node.arch.major} (world size {node.world_size})", evidence)
    return sf.ProbeVerdict("fail", f"SGLang disables torch symmetric memory: {said or outcome}", evidence)


@dataclasses.dataclass(frozen=True, slots=True)
class SymmTableReading:
    """SGLang's symmetric-memory size table read from its files, and what it decides for the node."""

    table_name: str
    table: dict
    table_path: str
    table_line: int
    comm_path: str
    class_name: str
    style: str               # index (KeyError when missing) | get (clean disable) | unknown
    lookup_line: int
    checks_end: int          # the last line of the capability / world-size checks in the constructor
    minimum: int | None
    node: Node
    messages: tuple[tuple[int, str], ...]

    @property
    def table_where(self) -> str:
        return f"{os.path.basename(self.table_path)}:{self.table_line}"

    @property
    def lookup_where(self) -> str:
        return f"{os.path.basename(self.comm_path)}:{self.lookup_line}"

    @property
    def checks_where(self) -> str:
        return f"{os.path.basename(self.comm_path)}:{self.lookup_line}-{self.checks_end}"

    @property
    def admits(self) -> bool:
        major, size = self.node.arch.major, self.node.world_size
        too_old = self.minimum is not None and major < self.minimum
        return not too_old and major in self.table and size in self.table[major]

    @property
    def denial(self) -> str:
        major, size = self.node.arch.major, self.node.world_size
        if self.minimum is not None and major < self.minimum:
            return f"capability {major} is below the constructor's floor {self.minimum}"
        if major not in self.table:
            return f"no entry for capability {major} (keys {sorted(self.table)})"
        if size not in self.table[major]:
            return f"no world size {size} for capability {major} (sizes {sorted(self.table[major])})"
        return ""

    def said(self, topic: str, value: int) -> str:
        """SGLang's own log message about ``topic`` (capability / world size), filled in."""
        return next((fill(m, value) for _, m in self.messages if topic in m.lower()), "")

    def text(self) -> str:
        return (f"{self.table_name} = {self.table} ({self.table_path}:{self.table_line}); "
                f"{self.class_name}.__init__ looks it up with {self.style} at {self.comm_path}:{self.lookup_line}, "
                f"its capability / world-size checks end at line {self.checks_end}")


def symm_table_reading(node: Node) -> SymmTableReading | str:
    """Read the symmetric-memory size table and its lookup from SGLang's files; the reason as text when
    they are not there."""
    table_path = sglang_file("srt/distributed/device_communicators/all_reduce_utils.py")
    comm_path = next(((p, c) for m, c in SYMM_MODULES
                      if (p := sglang_file(m.replace("sglang.", "", 1).replace(".", "/") + ".py"))), None)
    if comm_path is None or table_path is None:
        return "no torch symmetric-memory communicator in this SGLang"
    table_tree = parse_file(table_path)
    constants = module_constants(table_tree)
    table_name = next((n for n in SYMM_TABLES if n in constants), None)
    if table_name is None:
        return f"no {' / '.join(SYMM_TABLES)} literal in {table_path}"
    path, class_name = comm_path
    cls = class_node(parse_file(path), class_name)
    if cls is None:
        return f"{path} has no class {class_name}"
    style, line = table_access(cls, table_name)
    messages = tuple(warnings_in(cls))
    checks = [n for n, m in messages if "capability" in m.lower() or "world size" in m.lower()]
    return SymmTableReading(table_name, constants[table_name], table_path, assignment_line(table_tree, table_name),
                            path, class_name, style, line, max([line, *checks]), min_capability(cls), node, messages)


def assignment_line(tree: ast.Module, name: str) -> int:
    """The line of the top-level assignment to ``name`` (0 when there is none)."""
    return next((statement.lineno for statement in tree.body
                 if isinstance(statement, (ast.Assign, ast.AnnAssign))
                 and any(isinstance(t, ast.Name) and t.id == name
                         for t in (statement.targets if isinstance(statement, ast.Assign) else [statement.target]))),
                0)


def static_symm_mem(node: Node, import_error: str) -> sf.ProbeVerdict:
    """Evaluate the symmetric-memory gate from SGLang's files."""
    reading = symm_table_reading(node)
    if isinstance(reading, str):
        if reading.startswith("no torch symmetric-memory communicator"):
            return sf.ProbeVerdict("skip", "this SGLang has no torch symmetric-memory communicator "
                                   "(--enable-torch-symm-mem appeared in 0.5.3)", f"import: {import_error}")
        return sf.ProbeVerdict("error", reading, import_error)
    where = f"{os.path.basename(reading.comm_path)}:{reading.lookup_line} {reading.class_name}.__init__"
    prefix = (f"import of the communicator failed ({import_error}); read {reading.table_path} and "
              f"{reading.comm_path} instead: {reading.table_name} = {reading.table}")
    major, size, table = node.arch.major, node.world_size, reading.table
    if reading.minimum is not None and major < reading.minimum:
        return symm_verdict(where, f"returned (capability {major} < {reading.minimum})",
                            [reading.said("capability", major)], node, "static: " + prefix)
    if major not in table:
        if reading.style == "index":
            return symm_verdict(where, f"raised KeyError: {major}", [], node, "static: " + prefix)
        return symm_verdict(where, "returned with disabled=True", [reading.said("capability", major)], node,
                            "static: " + prefix)
    if size not in table[major]:
        return symm_verdict(where, "returned with disabled=True", [reading.said("world size", size)], node,
                            "static: " + prefix)
    return symm_verdict(where, "reached the symmetric-memory allocation", [], node, "static: " + prefix)


#: SGLang's code alone decides this gate: the live run, else the static reading.
decide = functools.partial(evaluate, live_symm_mem, static_symm_mem)


def main(argv: Sequence[str]) -> None:
    run_gate(__doc__.splitlines()[0], FEATURE, decide, argv)


if __name__ == "__main__":
    sf.run_main(main, sys.argv[1:])
