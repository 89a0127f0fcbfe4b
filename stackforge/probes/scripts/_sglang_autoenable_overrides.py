"""SGLang 0.5.15+: the FlashInfer allreduce-fusion auto-enable as a post-process pass.

0.5.15 moved the decision from ServerArgs to ``_flashinfer_allreduce_fusion_auto_enable(view)`` of
``srt/arg_groups/overrides.py`` (a dict with a backend = on; 0.5.19's ``{...: None}`` for Qwen3.5 turns
it off). It is evaluated for each architecture of ``_FLASHINFER_ALLREDUCE_FUSION_ARCHS`` and MiMo:

1. live: the pass is called on a view of a default ServerArgs, as ``run_post_process_pass`` builds it,
   with SGLang's platform probes answering for the target (``get_platform()`` itself not replaced);
2. static, when that fails: its conditions are read (``_sglang_source.pass_sites`` / ``read_pass``), its
   locals and one-line helpers (``attn_dp_enabled_of``) inlined, ``get_platform().is_sm90`` through
   ``runtime_context._PLATFORM_PROBES``, ``view.*`` from ``arg_groups/fields/`` (0.5.20+) or ServerArgs'
   own fields (0.5.15-0.5.19), and evaluated three-valued.

Used by ``sglang_ar_fusion.py`` when the installed ``server_args.py`` holds no auto-enable of its own.
"""

from __future__ import annotations

import logging
import os
import types
from typing import Any

import _sfprobe as sf
from _sglang_node import SERVER_ARGS_MODULE, SGLANG_UTILS, Node, import_sglang, on_target, sglang_warnings
from _sglang_source import AUTOENABLE_PASS, OVERRIDES_MODULE, AutoEnable, PassSites, pass_sites, read_pass


def static_pass(node: Node, found: PassSites, why: str) -> AutoEnable:
    """The pass's conditions evaluated three-valued for each architecture they name."""
    return read_pass(node.arch.major, node.world_size, found, why)


def pass_outcome(module: Any, cls: Any, arch: str, node: Node) -> tuple[bool | None, str]:
    """Call the pass on a view of a default ServerArgs serving ``arch`` (None: it raised)."""
    config = types.SimpleNamespace(hf_config=types.SimpleNamespace(architectures=[arch]))
    try:
        args = cls(model_path=f"stackforge-probe/{arch}", tp_size=node.world_size, nnodes=1)
        view = module.ResolvedView(args, overlay=module._declaration_overlay(args))  # as run_post_process_pass
        # SGLang's model_config_of imports ModelConfig (-> sgl_kernel, which needs a driver) even when
        # it would hand back a memo: the pass's own name for it answers the stand-in config instead.
        with sglang_warnings(logging.INFO) as logs, sf.patched(module, "model_config_of", lambda view: config):
            declared = getattr(module, AUTOENABLE_PASS)(view)
    except Exception as exc:  # noqa: BLE001 - e.g. MiMo reads model_config.dtype, which the stand-in lacks
        return None, f"raised {sf.describe_exception(exc)}"
    said = [m for m in logs if "allreduce fusion" in m.lower()]
    return bool(declared), f"returned {declared!r}" + (f" (SGLang logged: {'; '.join(said)})" if said else "")


def live_pass(torch: Any, node: Node, found: PassSites) -> AutoEnable | str:
    """Call SGLang's pass for every architecture with its platform probes answering for the node
    (``get_platform()`` itself is not replaced)."""
    module, error = import_sglang(OVERRIDES_MODULE)
    if module is None:
        return f"{OVERRIDES_MODULE}: {error}"
    server_args, error = import_sglang(SERVER_ARGS_MODULE)
    utils, utils_error = import_sglang(SGLANG_UTILS)
    missing = [n for n in (AUTOENABLE_PASS, "ResolvedView", "_declaration_overlay") if not hasattr(module, n)]
    if server_args is None or utils is None or missing or not hasattr(server_args, "ServerArgs"):
        return f"cannot run the pass: {error or utils_error or f'{OVERRIDES_MODULE} lacks {missing}'}"
    outcomes: dict[str, tuple[bool | None, str]] = {}
    with on_target(torch, node, [module, utils], utils) as notes:
        for arch in found.archs:
            outcomes[arch] = pass_outcome(module, server_args.ServerArgs, arch, node)
    if all(on is None for on, _ in outcomes.values()):
        return f"{AUTOENABLE_PASS} raised for every architecture: {next(iter(outcomes.values()))[1]}"
    how = (f"[{AUTOENABLE_PASS}, live: {OVERRIDES_MODULE}.{AUTOENABLE_PASS}(view) called for each architecture; "
           f"{found.notes[0]}; view = ResolvedView(ServerArgs(model_path=..., tp_size={node.world_size}, nnodes=1), "
           f"overlay=_declaration_overlay(...)) as run_post_process_pass builds it, every other field at its default; "
           f"{OVERRIDES_MODULE}.model_config_of replaced by one answering a config with hf_config.architectures="
           f"[<arch>] only (SGLang's imports ModelConfig -> sgl_kernel, which needs a driver); get_platform() not "
           f"replaced: its probes in {SGLANG_UTILS} read get_device_sm()={node.arch.sm}, is_cuda()=True; "
           f"torch answering capability {node.arch.dotted}; {'; '.join(notes)}]")
    return AutoEnable(tuple(a for a, (on, _) in outcomes.items() if on), found.archs,
                      tuple(a for a, (on, _) in outcomes.items() if on is None), "live", "\n".join(
                          [how, *(site.describe(os.path.basename(found.path)) for site in found.sites),
                           *(f"{arch}: {text}" for arch, (_, text) in outcomes.items())]))


def evaluate_pass(torch: Any, node: Node, no_server_args: str) -> AutoEnable | str:
    """0.5.23+: live when overrides.py imports, static otherwise."""
    found = pass_sites()
    if isinstance(found, str):
        return f"{no_server_args}; {found}"
    result = live_pass(torch, node, found) if torch is not None else "torch is not importable"
    if isinstance(result, AutoEnable):
        return result
    return static_pass(node, found, f"live run failed: {result}")
