"""Gate probe for SGLang's torch symmetric-memory communicator: feature ``torch-symm-mem``.

SGLang decides in ``TorchSymmMemCommunicator.__init__``
(``srt/distributed/device_communicators/torch_symm_mem.py``; ``SymmMemCommunicator`` in ``symm_mem.py``
for 0.5.3-0.5.5, whichever file the installed package has) by looking the device's major capability and
the world size up in ``TORCH_SYMM_MEM_ALL_REDUCE_MAX_SIZES`` / ``SYMM_MEM_ALL_REDUCE_MAX_SIZES``
(``all_reduce_utils.py``); later it also needs multicast (a runtime property).

Live: the constructor runs for the target node (``_sglang_node.py``) until the symmetric-memory
allocation. Static, when the module does not import: the table, its lookup and SGLang's messages are
read with ``ast`` and decided by ``_sglang_source.py``, the same code the wheel tier's reader decides
them with.

When the live constructor stops at state only a running server provides (0.5.23 reads ``get_exec()`` at
torch_symm_mem.py:104), the size table decides when it can (it denies the capability or world size, or
the constructor passed its table checks before it stopped), and says so with file:line; otherwise the
result is ``undecided``.

No GPU needed.
"""

from __future__ import annotations

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
from _sglang_source import ADMITTED, SYMM_MODULES, SYMM_TABLES, GateUnread, SymmMemGate, symm_mem_gate

FEATURE = "torch-symm-mem"


def live_symm_mem(torch: Any, node: Node) -> sf.ScriptResult | str:
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
        return symm_result(where, outcome, logs, node, f"live; {tables}" if tables else "live")
    return "; ".join(errors)


def symm_without_server(node: Node, where: str, outcome: str, context: str, stopped_at: int | None, trace: str,
                        logs: Sequence[str], tables: str) -> sf.ScriptResult:
    """The live constructor stopped at state only a running server provides (not SGLang's verdict):
    the size table decides when it can, else the result is undecided."""
    gate = symm_mem_gate()
    said = "; ".join(logs)
    live = (f"[live; {tables}] {where} for capability {node.arch.dotted}, world size {node.world_size}: "
            f"{outcome}\nthe constructor needs what only a running SGLang server provides: {context}"
            + (f"\nSGLang logged: {said}" if said else "") + f"\n{trace}")
    if isinstance(gate, GateUnread):
        return sf.ScriptResult("undecided", f"SGLang's torch symmetric-memory constructor needs a running server "
                               f"({context}); the size table could not be read ({gate.why})", live)
    evidence = f"{live}\n[table] {gate_text(gate)}"
    decision = gate.decide(node.arch.major, node.world_size)
    if decision not in (ADMITTED, "lookup-unknown"):
        return sf.ScriptResult("fail", f"SGLang's size table decides: {denial(gate, node, decision)} (measured: the "
                               f"table {gate.table_name} at {table_where(gate)} as looked up at {lookup_where(gate)}; "
                               "the constructor itself stopped at server-only state)", evidence)
    if decision == ADMITTED and stopped_at is not None and stopped_at > gate.checks_end:
        return sf.ScriptResult("pass", f"SGLang's size table decides: {gate.table_name} "
                               f"({table_where(gate)}) admits capability {node.arch.major} with {node.world_size} "
                               f"GPUs, and the constructor passed its table checks ({checks_where(gate)}) live before "
                               f"it stopped at server-only state ({os.path.basename(gate.comm_path)}:{stopped_at}); "
                               "the allocation and multicast (handle.multicast_ptr != 0) were not reached and decide "
                               "at run time (see the runtime probe)", evidence)
    table_says = (f"its table admits capability {node.arch.major} with {node.world_size} GPUs" if decision == ADMITTED
                  else f"its table has no entry for capability {node.arch.major} and how the constructor looks it "
                       "up was not found")
    return sf.ScriptResult("undecided", f"SGLang's torch symmetric-memory constructor stopped at server-only state "
                           f"before its table checks ({context}); {table_says}, but what comes before the table was "
                           "not run", evidence)


def symm_result(where: str, outcome: str, logs: Sequence[str], node: Node, method: str) -> sf.ScriptResult:
    said = "; ".join(logs)
    evidence = f"[{method}] {where} for capability {node.arch.dotted}, world size {node.world_size}: {outcome}"
    evidence += f"\nSGLang logged: {said}" if said else ""
    if outcome.startswith("reached"):
        return sf.ScriptResult("pass", f"SGLang's torch symmetric-memory gate admits capability {node.arch.major} with "
                               f"{node.world_size} GPUs; it still needs multicast (handle.multicast_ptr != 0) at run "
                               "time, which PCIe GPUs usually lack (see the runtime probe)", evidence)
    if outcome.startswith("raised"):
        return sf.ScriptResult("fail", f"SGLang's torch symmetric-memory communicator raises {outcome[7:]} for "
                               f"capability {node.arch.major} (world size {node.world_size})", evidence)
    return sf.ScriptResult("fail", f"SGLang disables torch symmetric memory: {said or outcome}", evidence)


def table_where(gate: SymmMemGate) -> str:
    return f"{os.path.basename(gate.table_path)}:{gate.table_line}"


def lookup_where(gate: SymmMemGate) -> str:
    return f"{os.path.basename(gate.comm_path)}:{gate.lookup_line}"


def checks_where(gate: SymmMemGate) -> str:
    return f"{os.path.basename(gate.comm_path)}:{gate.lookup_line}-{gate.checks_end}"


def gate_text(gate: SymmMemGate) -> str:
    return (f"{gate.table_name} = {gate.table} ({gate.table_path}:{gate.table_line}); "
            f"{gate.class_name}.__init__ looks it up with {gate.style} at {gate.comm_path}:{gate.lookup_line}, "
            f"its capability / world-size checks end at line {gate.checks_end}")


def denial(gate: SymmMemGate, node: Node, decision: str) -> str:
    """What the table refuses, in words, for a decision other than admitted."""
    major, size = node.arch.major, node.world_size
    if decision == "below-floor":
        return f"capability {major} is below the constructor's floor {gate.floor}"
    if decision == "world-size":
        return f"no world size {size} for capability {major} (sizes {sorted(gate.table[major])})"
    return f"no entry for capability {major} (keys {sorted(gate.table)})"


def static_symm_mem(node: Node, import_error: str) -> sf.ScriptResult:
    """Evaluate the symmetric-memory gate from SGLang's files: decided by
    ``_sglang_source.SymmMemGate.decide``, as the wheel tier's reader decides it."""
    gate = symm_mem_gate()
    if isinstance(gate, GateUnread):
        if gate.absent:
            return sf.ScriptResult("skip", "this SGLang has no torch symmetric-memory communicator "
                                   "(--enable-torch-symm-mem appeared in 0.5.3)", f"import: {import_error}")
        return sf.ScriptResult("error", f"{gate.why} ({gate.path})", import_error)
    where = f"{lookup_where(gate)} {gate.class_name}.__init__"
    method = (f"static: import of the communicator failed ({import_error}); read {gate.table_path} and "
              f"{gate.comm_path} instead: {gate.table_name} = {gate.table}")
    major, size = node.arch.major, node.world_size
    decision = gate.decide(major, size)
    if decision == "below-floor":
        return symm_result(where, f"returned (capability {major} < {gate.floor})",
                           [gate.said("capability", major)], node, method)
    if decision == "lookup-unknown":
        return sf.ScriptResult("undecided", f"SGLang's size table {gate.table_name} ({table_where(gate)}) has no "
                               f"entry for capability {major}, and how {gate.class_name}.__init__ looks it up was "
                               "not found in its file", f"[{method}] {gate_text(gate)}")
    if decision == "capability" and gate.style == "index":
        return symm_result(where, f"raised KeyError: {major}", [], node, method)
    if decision == "capability":
        return symm_result(where, "returned with disabled=True", [gate.said("capability", major)], node, method)
    if decision == "world-size":
        return symm_result(where, "returned with disabled=True", [gate.said("world size", size)], node, method)
    return symm_result(where, "reached the symmetric-memory allocation", [], node, method)


#: SGLang's code alone decides this gate: the live run, else the static reading.
decide = functools.partial(evaluate, live_symm_mem, static_symm_mem)


def main(argv: Sequence[str]) -> None:
    run_gate(__doc__.splitlines()[0], FEATURE, decide, argv)


if __name__ == "__main__":
    sf.run_main(main, sys.argv[1:])
