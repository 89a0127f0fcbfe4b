"""Gate probe for SGLang and FlashInfer allreduce fusion: feature ``flashinfer-ar-fusion``.

Two questions:

a. SGLang's own arch gate ``_resolve_backend("auto")`` (``srt/layers/flashinfer_comm_fusion.py``, from
   0.5.14; older SGLang has none and FlashInfer's own gate decides): called live with SGLang's platform
   flags answering for the target, or its ``if <is_smXX flags>: raise`` read with ``ast``.
b. whether SGLang turns ``enable_flashinfer_allreduce_fusion`` on by itself, with every field at its
   default, ``tp_size`` = GPU count and one node. Where the installed SGLang decides that is its era's
   module: ``ServerArgs`` methods in ``srt/server_args.py`` (0.5.4.post2-0.5.14,
   ``_sglang_autoenable_server_args.py``) or the post-process pass of ``srt/arg_groups/overrides.py``
   (0.5.15+, ``_sglang_autoenable_overrides.py``). 0.5.4.post2-0.5.7 do so on sm_12x (GptOss through
   ``is_blackwell_supported`` = majors 10 and 12; 0.5.7 also DeepseekV3 / Glm4Moe / Qwen3Moe); 0.5.8+
   only on sm_90 / sm_100. When it does for more than one GPU, FlashInfer's own gate
   (:func:`flashinfer_gates.ar_fusion_gate`, the gate.flashinfer.ar-fusion probe beside this script, called
   in this process) is asked too: it rejecting the arch makes the result ``fail`` (the server would build a
   module FlashInfer has no code for), it admitting it ``pass``. The architectures go to the metric
   ``sglang_autoenables_ar_fusion``.

No GPU needed.
"""

from __future__ import annotations

import ast
import dataclasses
import sys
from collections.abc import Sequence
from typing import Any

import _sfprobe as sf
import flashinfer_gates
from _sglang_autoenable_overrides import evaluate_pass
from _sglang_autoenable_server_args import evaluate_server_args
from _sglang_node import (
    SGLANG_UTILS,
    Evaluated,
    Node,
    emulated_node,
    evaluate,
    import_sglang,
    is_missing,
    platform_answers,
    run_gate,
    server_context,
    sglang_warnings,
)
from _sglang_source import ADMITTED, FUSION_GATE, AutoEnable, GateUnread, autoenable_sites, fusion_gate

FEATURE = "flashinfer-ar-fusion"
FUSION_MODULE = "sglang.srt.layers.flashinfer_comm_fusion"
FLASHINFER_GATE_SCRIPT = "flashinfer_gates.py"


def no_fusion_gate(looked_for: str, method: str) -> sf.ScriptResult:
    """This SGLang has no arch gate of its own for FlashInfer allreduce fusion."""
    return sf.ScriptResult("skip", f"this SGLang has no FlashInfer allreduce-fusion arch gate of its own ({looked_for}; "
                           "SGLang has one from 0.5.14); FlashInfer's own gate (gate.flashinfer.ar-fusion) decides",
                           f"[{method}] looked for {FUSION_MODULE}.{FUSION_GATE}: {looked_for}")


def live_ar_fusion(torch: Any, node: Node) -> sf.ScriptResult | str:
    """Call SGLang's ``_resolve_backend("auto")`` with the platform answering for the node."""
    module, error = import_sglang(FUSION_MODULE)
    if module is None:
        if is_missing(error, FUSION_MODULE):
            return no_fusion_gate(f"no module {FUSION_MODULE}", "live")
        return f"{FUSION_MODULE}: {error}"
    gate = getattr(module, FUSION_GATE, None)
    if gate is None:
        return no_fusion_gate(f"{FUSION_MODULE} has no function {FUSION_GATE}", "live")
    cuda = getattr(torch.version, "cuda", None)
    if cuda is None:
        # The platform flags compare torch.version.cuda too; a CPU torch cannot answer them.
        return "torch has no CUDA version (CPU build), which SGLang's is_smXX_supported flags read"
    utils, error = import_sglang(SGLANG_UTILS)
    if utils is None:
        return f"{SGLANG_UTILS}: {error}"
    call = f"{FUSION_MODULE}.{FUSION_GATE}('auto', is_multi_node=False)"
    with sglang_warnings(), emulated_node(torch, node, [module, utils]), platform_answers(utils, node):
        try:
            backend = gate("auto", False)
        except ValueError as exc:  # SGLang's own rejection, unless it is state only a server sets up
            context = server_context(exc)
            if context is not None:   # not the gate's answer: let the static reading decide
                return sf.ScriptResult("error", f"{call} needs what only a running SGLang server provides: {context}", "")
            return fusion_result(call, f"raised {sf.describe_exception(exc)}", node, f"live; torch CUDA {cuda}")
        except Exception as exc:  # noqa: BLE001 - not the gate: let the static reading decide
            return sf.ScriptResult("error", f"{call} raised {sf.describe_exception(exc)}", "")
    return fusion_result(call, f"returned {backend!r}", node, f"live; torch CUDA {cuda}")


def fusion_result(where: str, outcome: str, node: Node, method: str) -> sf.ScriptResult:
    evidence = f"[{method}] {where} for capability {node.arch.dotted}: {outcome}"
    if outcome.startswith("raised"):
        return sf.ScriptResult("fail", f"SGLang rejects FlashInfer allreduce fusion for capability {node.arch.dotted}: "
                               f"{outcome[7:]}", evidence)
    return sf.ScriptResult("pass", f"SGLang admits FlashInfer allreduce fusion for capability {node.arch.dotted} "
                           f"({outcome}); FlashInfer's own gate (gate.flashinfer.ar-fusion) still decides the kernel",
                           evidence)


def static_ar_fusion(node: Node, import_error: str) -> sf.ScriptResult:
    """Read ``_resolve_backend``'s arch check from SGLang's file and evaluate it for the node: decided by
    ``_sglang_source.FusionGate.decide``, as the wheel tier's reader decides it."""
    method = f"static: import failed ({import_error})"
    gate = fusion_gate()
    if isinstance(gate, GateUnread) and gate.absent:
        return no_fusion_gate(gate.why, method)
    if isinstance(gate, GateUnread):
        return sf.ScriptResult("error", f"{gate.why} in {gate.path}", f"{method}; read {gate.path}, not run")
    prefix = f"{method}; read {gate.path}, not run"
    test = ast.unparse(gate.test)
    try:
        rejected = gate.decide(node.arch.major) != ADMITTED
    except ValueError as exc:
        return sf.ScriptResult("error", f"could not evaluate SGLang's check `{test}`: {exc}", prefix)
    where = f"{gate.check_text()} (flags read as capability majors; their CUDA-version part not evaluated)"
    outcome = f"raised {gate.message}" if rejected else "returned (the arch check passes)"
    return fusion_result(where, outcome, node, prefix)


def evaluate_autoenable(torch: Any, node: Node) -> AutoEnable | str:
    """SGLang's own auto-enable, by the era's module the installed package calls for: ServerArgs'
    methods when ``server_args.py`` assigns the flag (0.5.4.post2-0.5.14), the overrides pass otherwise
    (0.5.15+); a string when this SGLang has no such auto-enable to evaluate."""
    found = autoenable_sites()
    if isinstance(found, str):
        return evaluate_pass(torch, node, found)
    sites, path = found
    return evaluate_server_args(torch, node, sites, path)


def flashinfer_gate(node: Node) -> sf.ScriptResult:
    """FlashInfer's own allreduce-fusion gate for the node, as the gate.flashinfer.ar-fusion probe
    decides it (``flashinfer_gates.py`` beside this script), reason and evidence bounded as that probe's
    result line bounds them."""
    try:
        result = flashinfer_gates.ar_fusion_gate(node.arch, node.world_size, node.interconnect)
    except Exception as exc:  # noqa: BLE001 - FlashInfer's failure is this half's answer, not the probe's
        return sf.ScriptResult("error", f"{FLASHINFER_GATE_SCRIPT} raised {sf.describe_exception(exc)}",
                               sf.traceback_text(exc))
    return sf.ScriptResult(result.status, sf.one_line(result.reason), sf.bound_text(result.evidence))


def with_autoenable(base: sf.ScriptResult, auto: AutoEnable | str, node: Node) -> sf.ScriptResult:
    """The fusion verdict once ServerArgs' own auto-enable is known: a hazard only when SGLang turns
    fusion on by itself for a multi-GPU target and FlashInfer's gate rejects the arch."""
    if isinstance(auto, str):
        return dataclasses.replace(base, evidence=f"{base.evidence}\nServerArgs auto-enable not evaluated: {auto}",
                                   metrics={**base.metrics, "sglang_autoenables_ar_fusion": None})
    metrics = {**base.metrics, "sglang_autoenables_ar_fusion": list(auto.archs),
               "autoenable_method": auto.method}
    if auto.undecided:
        metrics["autoenable_undecided"] = list(auto.undecided)
    evidence = f"{base.evidence}\n{auto.evidence}"
    if not auto.archs:
        return dataclasses.replace(base, evidence=evidence, metrics=metrics)
    archs = ", ".join(auto.archs)
    turned_on = (f"SGLang's ServerArgs turns FlashInfer allreduce fusion on by itself for {archs} on "
                 f"{node.arch.sm_name}")
    if node.world_size <= 1:
        # SGLang fuses only under tensor parallelism (communicator.py: `self._context.tp_size > 1`;
        # flashinfer_comm_fusion.py: `if world_size <= 1: return None, None`, 0.5.4.post3-0.5.7).
        return sf.ScriptResult(base.status, f"{base.reason}; {turned_on}, but it fuses only with more than one GPU",
                               evidence, metrics)
    fi = flashinfer_gate(node)
    metrics["flashinfer_gate"] = fi.status
    evidence += f"\nFlashInfer's gate ({FLASHINFER_GATE_SCRIPT}): {fi.status}: {fi.reason}\n{fi.evidence}"
    turned_on += f" with {node.world_size} GPUs on one node, without --enable-flashinfer-allreduce-fusion"
    if base.status == "fail":
        return sf.ScriptResult("fail", f"{base.reason}; and {turned_on}", evidence, metrics)
    if fi.status == "fail":
        return sf.ScriptResult("fail", f"{turned_on}, and {fi.reason}", evidence, metrics)
    if fi.status == "pass":
        return sf.ScriptResult("pass", f"{turned_on}; {fi.reason}", evidence, metrics)
    return sf.ScriptResult(base.status, f"{base.reason}; {turned_on}; FlashInfer's gate: {fi.reason}", evidence, metrics)


def decide(torch: Any, node: Node) -> Evaluated:
    """SGLang's arch gate (live or static), then what its own auto-enable and FlashInfer's gate add."""
    gate = evaluate(live_ar_fusion, static_ar_fusion, torch, node)
    return Evaluated(with_autoenable(gate.result, evaluate_autoenable(torch, node), node), gate.method)


def main(argv: Sequence[str]) -> None:
    run_gate(__doc__.splitlines()[0], FEATURE, decide, argv)


if __name__ == "__main__":
    sf.run_main(main, sys.argv[1:])
