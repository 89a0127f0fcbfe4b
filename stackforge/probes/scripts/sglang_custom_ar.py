"""Gate probe for SGLang's custom all-reduce: feature ``custom-allreduce``.

SGLang decides in ``CustomAllreduce.__init__`` (and from 0.5.10
``custom_all_reduce_utils.can_use_custom_all_reduce_with_nvlink``): the world size must be in
``_SUPPORTED_WORLD_SIZES``; ``world_size > 2 and not full_nvlink`` disables it; then a P2P check.

Live: the constructor runs for the target node (``_sglang_node.py``; "full NVLink" = the interconnect is
nvlink or nvswitch) until the P2P check. Static, when the module does not import: the world sizes, the
PCIe gate and SGLang's messages are read with ``ast`` and decided by ``_sglang_source.py``, the same
code the wheel tier's reader decides them with.

No GPU needed.
"""

from __future__ import annotations

import functools
import sys
from collections.abc import Sequence
from contextlib import ExitStack
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
from _sglang_source import COMM, GateUnread, custom_ar_gate, fill

FEATURE = "custom-allreduce"
CAR_MODULE = f"{COMM}.custom_all_reduce"
CAR_UTILS = f"{COMM}.custom_all_reduce_utils"


def live_custom_ar(torch: Any, node: Node) -> sf.ScriptResult | str:
    """Run ``CustomAllreduce.__init__`` for the node up to its P2P check."""
    module, error = import_sglang(CAR_MODULE)
    if module is None:
        return f"{CAR_MODULE}: {error}"
    communicator = getattr(module, "CustomAllreduce", None)
    if communicator is None:
        return f"{CAR_MODULE} has no CustomAllreduce"
    utils, _ = import_sglang(CAR_UTILS)
    owners = [m for m in (module, utils) if m is not None]

    def p2p_check(*args: Any, **kwargs: Any) -> bool:
        raise GateReached("P2P check")

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
        try:
            instance = communicator(group=object(), device=0)
            outcome = f"returned with disabled={getattr(instance, 'disabled', None)}"
        except GateReached:
            outcome = "reached the P2P check"
        except Exception as exc:  # noqa: BLE001
            outcome = f"raised {sf.describe_exception(exc)}"
    sizes = getattr(communicator, "_SUPPORTED_WORLD_SIZES", None)
    return car_result(f"{CAR_MODULE}.CustomAllreduce.__init__", outcome, logs, node, sizes, "live")


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
