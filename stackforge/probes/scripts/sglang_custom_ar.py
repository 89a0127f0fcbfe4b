"""Gate probe for SGLang's custom all-reduce: feature ``custom-allreduce``.

SGLang decides in ``CustomAllreduce.__init__`` (and from 0.5.10
``custom_all_reduce_utils.can_use_custom_all_reduce_with_nvlink``): the world size must be in
``_SUPPORTED_WORLD_SIZES``; ``world_size > 2 and not full_nvlink`` disables it; then a P2P check.
From 0.5.12 ``dispatch_custom_allreduce`` picks ``CustomAllReduceV2`` by default on CUDA; V2 disables
itself without full NVLink at any world size, and only from 0.5.13 does the dispatch fall back to
``CustomAllreduce`` when V2 cannot be used (0.5.12 / 0.5.12.post1 leave NCCL).

Live: the class the dispatch picks (``CustomAllreduce`` where V2 is not the default) runs for the
target node (``_sglang_node.py``; "full NVLink" = the interconnect is nvlink or nvswitch) until the
P2P check (for V2: until it builds its JIT kernel object, or the dispatch's own V2 check keeps it).
Static, when the module does not import: the world sizes, the PCIe gate, V2's switch, NVLink test and
fallback, and SGLang's messages are read with ``ast`` and decided by ``_sglang_source.py``, the same
code the wheel tier's reader decides them with.

No GPU needed.
"""

from __future__ import annotations

import functools
import sys
from collections.abc import Sequence
from contextlib import ExitStack
from types import SimpleNamespace
from typing import Any

import _sfprobe as sf
from _sglang_node import (
    GateReached,
    Node,
    emulated_node,
    evaluate,
    import_sglang,
    patch_if_present,
    run_gate,
    sglang_warnings,
)
from _sglang_source import COMM, CAR_DISPATCH, CAR_V2_CLASS, GateUnread, custom_ar_gate, fill

FEATURE = "custom-allreduce"
CAR_MODULE = f"{COMM}.custom_all_reduce"
CAR_UTILS = f"{COMM}.custom_all_reduce_utils"
CAR_V2_MODULE = f"{COMM}.custom_all_reduce_v2"


def v2_is_default() -> bool:
    """Whether SGLang's files say the dispatch picks CustomAllReduceV2 by default (0.5.12+): then the
    live run asks the dispatch which class to build, as SGLang's process group does."""
    gate = custom_ar_gate()
    return not isinstance(gate, GateUnread) and gate.v2 is not None


def live_custom_ar(torch: Any, node: Node) -> sf.ScriptResult | str:
    """Run the constructor of the class SGLang builds (``CustomAllreduce``, or what
    ``dispatch_custom_allreduce`` returns where V2 is the default) for the node up to its P2P check."""
    module, error = import_sglang(CAR_MODULE)
    if module is None:
        return f"{CAR_MODULE}: {error}"
    communicator = getattr(module, "CustomAllreduce", None)
    if communicator is None:
        return f"{CAR_MODULE} has no CustomAllreduce"
    dispatch = getattr(module, CAR_DISPATCH, None) if v2_is_default() else None
    v2_module = None
    if dispatch is not None:
        v2_module, v2_error = import_sglang(CAR_V2_MODULE)
        if v2_module is None:
            return f"{CAR_V2_MODULE}: {v2_error}"
    utils, _ = import_sglang(CAR_UTILS)
    owners = [m for m in (module, utils, v2_module) if m is not None]
    built = "CustomAllreduce"
    # V2 asks the shared check for full_nvlink and then decides on it itself (0.5.12: in its
    # constructor; 0.5.13+: in the dispatch, before falling back), so while V2 decides, the P2P check
    # answers "P2P works" and the gate is reached where V2 would build its JIT kernel object;
    # CustomAllreduce's gate is reached at the P2P check itself.
    v2_deciding, p2p_asked = [dispatch is not None], []

    def p2p_check(*args: Any, **kwargs: Any) -> bool:
        p2p_asked.append(True)
        if v2_deciding[0]:
            return True
        raise GateReached("P2P check")

    def v2_builds(*args: Any, **kwargs: Any) -> Any:
        raise GateReached("CustomAllReduceV2 builds its kernel object (after the P2P check)")

    with sglang_warnings() as logs, emulated_node(torch, node, owners), ExitStack() as stack:
        for owner in owners:
            patch_if_present(stack, owner, "custom_ar", True)
            patch_if_present(stack, owner, "in_the_same_node_as",
                             lambda group, source_rank=0: [True] * node.world_size)
            patch_if_present(stack, owner, "is_full_nvlink", lambda ids, world_size: node.full_nvlink)
            patch_if_present(stack, owner, "_can_p2p", p2p_check)
            patch_if_present(stack, owner, "can_p2p", p2p_check)
        ops = getattr(module, "ops", None)
        if ops is not None:
            patch_if_present(stack, ops, "IS_CUSTOM_AR_AVAILABLE", True)
        if v2_module is not None:
            patch_if_present(stack, v2_module, "get_custom_all_reduce_cls", v2_builds)
            # 0.5.23 sizes V2's tables from the device's properties (its world sizes per arch)
            properties = SimpleNamespace(major=node.arch.major, minor=node.arch.minor, multi_processor_count=1,
                                         name="emulated")
            stack.enter_context(sf.patched(torch.cuda, "get_device_properties", lambda device=None: properties))
        try:
            device: Any = 0
            if dispatch is not None:
                # 0.5.13+ asks V2's own check inside the dispatch (a refused V2 falls back); 0.5.12 does not
                device = torch.device("cuda", 0)
                communicator, name = sf.sglang_custom_allreduce_class(object(), device)
                built = f"{name} (picked by {CAR_DISPATCH})"
                v2_deciding[0] = name == CAR_V2_CLASS
                device = device if name == CAR_V2_CLASS else 0
                if name == CAR_V2_CLASS and p2p_asked:
                    # the dispatch ran V2's own check (0.5.13+) up to the P2P check, and kept V2
                    raise GateReached("CustomAllReduceV2 kept by the dispatch's check")
            instance = communicator(group=object(), device=device)
            outcome = f"returned with disabled={getattr(instance, 'disabled', None)}"
        except GateReached:
            outcome = "reached the P2P check"
        except Exception as exc:  # noqa: BLE001
            outcome = f"raised {sf.describe_exception(exc)}"
    sizes = getattr(communicator, "_SUPPORTED_WORLD_SIZES", None)
    return car_result(f"{CAR_MODULE}.{built}.__init__", outcome, logs, node, sizes, "live")


def car_result(where: str, outcome: str, logs: Sequence[str], node: Node, sizes: Any, method: str) -> sf.ScriptResult:
    said = "; ".join(logs)
    evidence = (f"[{method}] {where} for {node.world_size} GPUs, interconnect {node.interconnect} "
                f"(full NVLink: {node.full_nvlink}), _SUPPORTED_WORLD_SIZES={sizes}: {outcome}")
    evidence += f"\nSGLang logged: {said}" if said else ""
    if node.world_size <= 1:
        return sf.ScriptResult("skip", "custom all-reduce does not apply to a single GPU", evidence)
    if outcome.startswith("reached"):
        return sf.ScriptResult("pass", f"SGLang keeps custom all-reduce for {node.world_size} GPUs over "
                               f"{node.interconnect}; its P2P check decides at run time", evidence)
    if outcome.startswith("raised"):
        return sf.ScriptResult("error", f"SGLang's CustomAllreduce gate could not be evaluated: {outcome[7:]}", evidence)
    return sf.ScriptResult("fail", f"SGLang disables custom all-reduce: {said or outcome}", evidence)


def static_custom_ar(node: Node, import_error: str) -> sf.ScriptResult:
    """Evaluate the custom all-reduce gates from SGLang's files: decided by
    ``_sglang_source.CustomArGate.decide``, as the wheel tier's reader decides them."""
    gate = custom_ar_gate()
    if isinstance(gate, GateUnread):
        return sf.ScriptResult("error", gate.why, import_error if gate.absent else
                               f"static: import failed ({import_error}); read {gate.path}")
    prefix = f"static: import failed ({import_error}); read {', '.join(gate.paths)}"
    where = "CustomAllreduce.__init__"
    sizes = gate.sizes
    fields = {"cls_name": "CustomAllreduce", "world_size": node.world_size, "supported_world_size": sizes}
    decision = gate.decide(node.world_size, node.full_nvlink)
    if gate.v2 is not None and decision != "one-gpu":
        v2 = gate.v2
        v2_fields = {**fields, "cls_name": CAR_V2_CLASS, "supported_world_size": v2.sizes}
        picked = f"{CAR_V2_CLASS}.__init__ (picked by {CAR_DISPATCH}, {v2.switch} on by default)"
        refused = v2.refuses(node.world_size, node.full_nvlink, gate.threshold)
        if decision == "v2-sizes-unread":
            return sf.ScriptResult("undecided", f"{CAR_V2_CLASS}'s world sizes are computed at run time, not "
                                   f"stated in its file, and CustomAllreduce (the fallback) would not keep "
                                   f"{node.world_size} GPUs", f"[{prefix}] {picked}")
        if decision.startswith("v2-"):
            said = {"world-size": fill(gate.size_message, node.world_size, str(v2.sizes), **v2_fields),
                    "nvlink": f"{CAR_V2_CLASS} needs full NVLink ({v2.path.rsplit('/', 1)[-1]} line "
                              f"{v2.nvlink_line})",
                    "pcie": fill(gate.pcie_message, **v2_fields)}[refused]
            return car_result(f"{picked}; the dispatch has no fallback to CustomAllreduce",
                              "returned with disabled=True", [said], node, v2.sizes, prefix)
        if refused is None:
            return car_result(picked, "reached the P2P check", [], node, v2.sizes, prefix)
        why = "its world sizes are not stated in its file; kept or not" if refused == "sizes-unread" else \
            f"refused: {refused}; the dispatch falls back, line {v2.fallback_line}"
        where = f"CustomAllreduce.__init__ ({CAR_V2_CLASS} {why})"
    if decision == "one-gpu":
        return car_result(where, "returned (single GPU)", [], node, sizes, prefix)
    if decision == "world-size":
        said = fill(gate.size_message, node.world_size, str(sizes), **fields)
        return car_result(where, "returned with disabled=True", [said], node, sizes, prefix)
    if decision == "pcie":
        said = fill(gate.pcie_message, **fields)
        return car_result(f"{where} (line {gate.gate_line}: world_size > {gate.threshold} and not full_nvlink)",
                          "returned with disabled=True", [said], node, sizes, prefix)
    return car_result(where, "reached the P2P check", [], node, sizes, prefix)


#: SGLang's code alone decides this gate: the live run, else the static reading.
decide = functools.partial(evaluate, live_custom_ar, static_custom_ar)


def main(argv: Sequence[str]) -> None:
    run_gate(__doc__.splitlines()[0], FEATURE, decide, argv)


if __name__ == "__main__":
    sf.run_main(main, sys.argv[1:])
