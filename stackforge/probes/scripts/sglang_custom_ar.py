"""Gate probe for SGLang's custom all-reduce: feature ``custom-allreduce``.

SGLang decides in ``CustomAllreduce.__init__`` (and from 0.5.10
``custom_all_reduce_utils.can_use_custom_all_reduce_with_nvlink``): the world size must be in
``_SUPPORTED_WORLD_SIZES``; ``world_size > 2 and not full_nvlink`` disables it; then a P2P check.

Live: the constructor runs for the target node (``_sglang_node.py``; "full NVLink" = the interconnect is
nvlink or nvswitch) until the P2P check. Static, when the module does not import: the world sizes, the
PCIe gate and SGLang's messages are read with ``ast`` (``_sglang_source.py``) and evaluated.

No GPU needed.
"""

from __future__ import annotations

import ast
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
from _sglang_source import (
    COMM,
    class_node,
    fill,
    module_constants,
    parse_file,
    pcie_gate,
    sglang_file,
    size_gate_messages,
)

FEATURE = "custom-allreduce"
CAR_MODULE = f"{COMM}.custom_all_reduce"
CAR_UTILS = f"{COMM}.custom_all_reduce_utils"


def live_custom_ar(torch: Any, node: Node) -> sf.ProbeVerdict | str:
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
    return car_verdict(f"{CAR_MODULE}.CustomAllreduce.__init__", outcome, logs, node, sizes, "live")


def car_verdict(where: str, outcome: str, logs: Sequence[str], node: Node, sizes: Any, method: str) -> sf.ProbeVerdict:
    said = "; ".join(logs)
    evidence = (f"[{method}] {where} for {node.world_size} GPUs, interconnect {node.interconnect} "
                f"(full NVLink: {node.full_nvlink}), _SUPPORTED_WORLD_SIZES={sizes}: {outcome}")
    evidence += f"\nSGLang logged: {said}" if said else ""
    if node.world_size <= 1:
        return sf.ProbeVerdict("skip", "custom all-reduce does not apply to a single GPU", evidence)
    if outcome.startswith("reached"):
        return sf.ProbeVerdict("pass", f"SGLang keeps custom all-reduce for {node.world_size} GPUs over "
                               f"{node.interconnect}; its P2P check decides at run time", evidence)
    if outcome.startswith("raised"):
        return sf.ProbeVerdict("error", f"SGLang's CustomAllreduce gate could not be evaluated: {outcome[7:]}", evidence)
    return sf.ProbeVerdict("fail", f"SGLang disables custom all-reduce: {said or outcome}", evidence)


def static_custom_ar(node: Node, import_error: str) -> sf.ProbeVerdict:
    """Evaluate the custom all-reduce gates from SGLang's files."""
    paths = [p for p in (sglang_file("srt/distributed/device_communicators/custom_all_reduce.py"),
                         sglang_file("srt/distributed/device_communicators/custom_all_reduce_utils.py")) if p]
    if not paths:
        return sf.ProbeVerdict("error", "no custom_all_reduce.py in this SGLang", import_error)
    trees = {path: parse_file(path) for path in paths}
    cls = class_node(trees[paths[0]], "CustomAllreduce")
    sizes = None
    if cls is not None:
        sizes = module_constants(ast.Module(body=cls.body, type_ignores=[])).get("_SUPPORTED_WORLD_SIZES")
    gate = next((g for tree in trees.values() if (g := pcie_gate(tree))), None)
    size_message = next((m for tree in trees.values() for m in size_gate_messages(tree)), "")
    prefix = f"static: import failed ({import_error}); read {', '.join(paths)}"
    where = "CustomAllreduce.__init__"
    fields = {"cls_name": "CustomAllreduce", "world_size": node.world_size, "supported_world_size": sizes}
    if sizes is None or gate is None:
        return sf.ProbeVerdict("error", "could not find _SUPPORTED_WORLD_SIZES or the PCIe gate in SGLang's files",
                               prefix)
    threshold, pcie_message, line = gate
    if node.world_size <= 1:
        return car_verdict(where, "returned (single GPU)", [], node, sizes, prefix)
    if node.world_size not in sizes:
        said = fill(size_message, node.world_size, str(sizes), **fields)
        return car_verdict(where, "returned with disabled=True", [said], node, sizes, prefix)
    if node.world_size > threshold and not node.full_nvlink:
        said = fill(pcie_message, **fields)
        return car_verdict(f"{where} (line {line}: world_size > {threshold} and not full_nvlink)",
                           "returned with disabled=True", [said], node, sizes, prefix)
    return car_verdict(where, "reached the P2P check", [], node, sizes, prefix)


#: SGLang's code alone decides this gate: the live run, else the static reading.
decide = functools.partial(evaluate, live_custom_ar, static_custom_ar)


def main(argv: Sequence[str]) -> None:
    run_gate(__doc__.splitlines()[0], FEATURE, decide, argv)


if __name__ == "__main__":
    sf.run_main(main, sys.argv[1:])
