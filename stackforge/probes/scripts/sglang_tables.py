"""Gate probe for SGLang's communicator gates: ``torch-symm-mem``, ``custom-allreduce``, ``flashinfer-ar-fusion``.

SGLang decides in its own code whether these all-reduce paths exist for a node:

- torch symmetric memory: ``TorchSymmMemCommunicator.__init__``
  (``srt/distributed/device_communicators/torch_symm_mem.py``; ``SymmMemCommunicator`` in
  ``symm_mem.py`` for 0.5.3-0.5.5) looks the device's major capability and the world size up in
  ``TORCH_SYMM_MEM_ALL_REDUCE_MAX_SIZES`` / ``SYMM_MEM_ALL_REDUCE_MAX_SIZES``
  (``all_reduce_utils.py``); later it also needs multicast (a runtime property).
- custom all-reduce: ``CustomAllreduce.__init__`` (and from 0.5.10
  ``custom_all_reduce_utils.can_use_custom_all_reduce_with_nvlink``): world size in
  ``_SUPPORTED_WORLD_SIZES``; ``world_size > 2 and not full_nvlink`` disables it; then a P2P check.
- FlashInfer allreduce fusion, two questions:

  a. its arch gate ``_resolve_backend("auto")`` (``srt/layers/flashinfer_comm_fusion.py``, from
     0.5.14; older SGLang has none and FlashInfer's own gate decides);
  b. whether ServerArgs turns ``enable_flashinfer_allreduce_fusion`` on by itself: every
     ``self.enable_flashinfer_allreduce_fusion = True`` (0.5.14: ``self.flashinfer_allreduce_fusion_backend
     = "auto"``) in ``srt/server_args.py`` is found, and the
     ServerArgs method holding it (``_handle_model_specific_adjustments``) is run for each model
     architecture its conditions name, with every field at its default, ``tp_size`` = GPU count and
     one node. 0.5.4.post2-0.5.7 do so on sm_12x (GptOss through ``is_blackwell_supported`` = majors
     10 and 12; 0.5.7 also DeepseekV3 / Glm4Moe / Qwen3Moe); 0.5.8+ only on sm_90 / sm_100. When it
     does for more than one GPU, FlashInfer's own gate (``flashinfer_gates.py`` beside this script,
     run as its own process) is asked too: it rejecting the arch makes the result ``fail`` (the
     server would build a module FlashInfer has no code for), it admitting it ``pass``. The
     architectures go to the metric ``sglang_autoenables_ar_fusion``. 0.5.15 moved the decision to the
     post-process pass ``_flashinfer_allreduce_fusion_auto_enable(view)`` of ``srt/arg_groups/overrides.py``
     (a dict with a backend = on; 0.5.19's ``{...: None}`` for Qwen3.5 turns it off): it is called for each architecture of ``_FLASHINFER_ALLREDUCE_FUSION_ARCHS``
     and MiMo on a view of a default ServerArgs, or its conditions are read as below, its locals and
     one-line helpers (``attn_dp_enabled_of``) inlined, ``get_platform().is_sm90`` through
     ``runtime_context._PLATFORM_PROBES``, ``view.*`` from ``arg_groups/fields/`` (0.5.20+) or
     ServerArgs' own fields (0.5.15-0.5.19). The static reading is ``_sglang_source.py`` beside this
     script, shared with the wheel tier's readers.

Two ways to evaluate them for the target (major capability, GPU count, interconnect):

1. live: import the communicator module and run its constructor while torch / torch.distributed /
   NVML queries answer for the target node (capability, world size, "full NVLink" = interconnect
   is nvlink or nvswitch). The constructor stops at the first step that needs real hardware
   (the symmetric-memory allocation, the P2P check); reaching it means every gate passed.
   ServerArgs' method runs without ``__post_init__`` (which would load the model's config): the
   config getters return a config naming the architecture; ``torch.cuda`` answers available, the
   target capability and a neutral device name (not an H20), a CPU torch also a CUDA version
   (12.8, the first to target sm_100 / sm_120, so the capability decides); a module the method
   imports that does not import here (``model_config`` needs sgl_kernel) is stood in for by the
   named functions compiled from its own file. The evidence lists each of these answers.
2. static, when importing the module fails (SGLang pulls heavy dependencies): read the same files
   from the installed package with ``ast`` (the tables' literal values and the lookups and messages
   are SGLang's own code) and evaluate them; the evidence says that this is what happened. For
   ServerArgs the conditions on the path to the assignment are evaluated three-valued: the platform
   flags as the capability majors read from ``srt/utils/common.py`` (their CUDA floor not evaluated),
   ``self.*`` as the field defaults; what cannot be decided is reported as undecided.

A live constructor can also stop at state only a running server provides (:data:`SERVER_CONTEXT_ERRORS`:
SGLang 0.5.23's ``TorchSymmMemCommunicator.__init__`` reads ``get_exec()`` at torch_symm_mem.py:104,
which raises ``ValueError: config namespace 'exec' not published`` until a server has published its
ServerArgs). That error is not SGLang's verdict on the gate: for torch symmetric memory the size
table decides when it can (it denies the capability or world size, or the constructor passed its
table checks before it stopped), and says so with file:line; otherwise the result is ``undecided``.

No GPU needed.
"""

from __future__ import annotations

import ast
import copy
import dataclasses
import importlib.util
import json
import logging
import os
import sys
import re
import traceback
import types
from collections.abc import Iterator, Sequence
from contextlib import ExitStack, contextmanager
from typing import Any

import _sfprobe as sf
from _sglang_source import (AUTOENABLE_PASS, COMM, FUSION_FLAG, OVERRIDES_MODULE, PASS_KEY, SYMM_MODULES,
                            SYMM_TABLES, AutoEnable, FusionSite, PassSites, arch_raise, arch_test, autoenable_sites,
                            class_node, fill, min_capability, module_constants, named_archs, parse_file, pass_sites,
                            pcie_gate, read_autoenable, read_pass, sglang_file, size_gate_messages, table_access,
                            warnings_in)

FEATURES = ("torch-symm-mem", "custom-allreduce", "flashinfer-ar-fusion")
CAR_MODULE = f"{COMM}.custom_all_reduce"
CAR_UTILS = f"{COMM}.custom_all_reduce_utils"
FUSION_MODULE = "sglang.srt.layers.flashinfer_comm_fusion"
FUSION_GATE = "_resolve_backend"
SGLANG_UTILS = "sglang.srt.utils.common"


@dataclasses.dataclass(frozen=True, slots=True)
class ContextError:
    """An error SGLang raises where code reads state that only a running server sets up."""

    raised_in: str            # the file it is raised in, relative to site-packages
    message: "re.Pattern[str]"
    needs: str                # what the code needed, and where SGLang says so


#: Errors that mean "not inside a server", not "the gate said no". SGLang 0.5.23: every
#: ``get_exec()`` / ``get_model()`` ... goes through ``_Context.config_bag`` (runtime_context.py:1065-1069),
#: which raises until ``publish(server_args, role=...)`` (runtime_context.py:1489) projected the
#: namespaces, as a server does at start; ``server_args`` raises at runtime_context.py:1028 until then
#: (server_args.py:7193 in 0.5.14).
SERVER_CONTEXT_ERRORS = (
    ContextError("sglang/srt/runtime_context.py", re.compile(r"config namespace '[^']*' not published"),
                 "a running server's published config namespaces (runtime_context.config_bag; a server "
                 "publishes them from its ServerArgs at start)"),
    ContextError("sglang/srt/runtime_context.py", re.compile(r"Global server args is not set yet"),
                 "a running server's ServerArgs (set when a server starts)"),
    ContextError("sglang/srt/server_args.py", re.compile(r"Global server args is not set yet"),
                 "a running server's ServerArgs (set when a server starts)"),
)


def import_sglang(module_name: str) -> tuple[Any, str]:
    """Import an SGLang module; after a failure drop the half-imported ``sglang.*`` entries so the
    next attempt reports its own error (not a ``KeyError: 'sglang'`` left by the first)."""
    module, error = sf.try_import(module_name)
    if module is None:
        for name in [n for n in sys.modules if n == "sglang" or n.startswith("sglang.")]:
            del sys.modules[name]
    return module, error


def is_missing(error: str, module_name: str) -> bool:
    """True when the import failed because the module itself does not exist in this version."""
    return f"No module named '{module_name}'" in error


class GateReached(Exception):
    """Raised by the stand-in for the first hardware step: every gate before it passed."""


@dataclasses.dataclass(frozen=True, slots=True)
class Node:
    """The target node as SGLang's gates see it."""

    arch: sf.Arch
    world_size: int
    interconnect: str

    @property
    def full_nvlink(self) -> bool:
        # An nvlink/nvswitch target is taken as fully NVLink-connected (what is_full_nvlink asks).
        return self.interconnect in ("nvlink", "nvswitch")


# --------------------------------------------------------------------------------------------
# Live evaluation
# --------------------------------------------------------------------------------------------

@contextmanager
def sglang_warnings(level: int = logging.WARNING) -> Iterator[list[str]]:
    """Collect what SGLang logs at ``level`` and above while a constructor runs (INFO is where
    ServerArgs says what it turned on by itself)."""
    messages: list[str] = []

    class _Collect(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            text = record.getMessage()
            if text not in messages:
                messages.append(text)

    handler = _Collect(level=level)
    logger = logging.getLogger("sglang")
    saved_level = logger.level
    if logger.getEffectiveLevel() > level:
        logger.setLevel(level)
    logger.addHandler(handler)
    try:
        yield messages
    finally:
        logger.removeHandler(handler)
        logger.setLevel(saved_level)


def patch_if_present(stack: ExitStack, target: Any, name: str, value: Any) -> None:
    if hasattr(target, name):
        stack.enter_context(sf.patched(target, name, value))


@contextmanager
def emulated_node(torch: Any, node: Node, modules: Sequence[Any]) -> Iterator[None]:
    """torch, torch.distributed and SGLang's platform flags answering for the target node."""
    dist = torch.distributed
    capability = (node.arch.major, node.arch.minor)

    def all_gather(tensor_list: Any, tensor: Any, group: Any = None, async_op: bool = False) -> None:
        for index, item in enumerate(tensor_list):
            item.fill_(index)  # physical device ids 0..N-1

    with ExitStack() as stack:
        stack.enter_context(sf.patched(torch.cuda, "get_device_capability", lambda device=None: capability))
        stack.enter_context(sf.patched(torch.cuda, "device_count", lambda: node.world_size))
        stack.enter_context(sf.patched(torch.cuda, "set_device", lambda device: None))
        stack.enter_context(sf.patched(dist, "get_world_size", lambda group=None: node.world_size))
        stack.enter_context(sf.patched(dist, "get_rank", lambda group=None: 0))
        stack.enter_context(sf.patched(dist, "get_backend", lambda group=None: "gloo"))
        stack.enter_context(sf.patched(dist, "all_gather", all_gather))
        for module in modules:
            for flag, value in (("_is_cuda", True), ("_is_hip", False), ("_is_musa", False),
                                ("torch_symm_mem_available", True), ("symm_mem_available", True)):
                patch_if_present(stack, module, flag, value)
        saved_visible = os.environ.pop("CUDA_VISIBLE_DEVICES", None)
        try:
            yield
        finally:
            if saved_visible is not None:
                os.environ["CUDA_VISIBLE_DEVICES"] = saved_visible


def live_symm_mem(torch: Any, node: Node) -> sf.Verdict | str:
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


def server_context(exc: BaseException) -> str | None:
    """What a running server would have provided, when ``exc`` is one of :data:`SERVER_CONTEXT_ERRORS`
    (matched on the message and on the file the innermost frame is in); None for any other error."""
    frames = traceback.extract_tb(exc.__traceback__)
    if not frames:
        return None
    innermost = frames[-1].filename.replace(os.sep, "/")
    for known in SERVER_CONTEXT_ERRORS:
        if innermost.endswith(known.raised_in) and known.message.search(str(exc)):
            caller = next((f for f in reversed(frames) if "/sglang/" in f.filename.replace(os.sep, "/")
                           and not f.filename.replace(os.sep, "/").endswith(known.raised_in)), None)
            site = (f"{os.path.basename(caller.filename)}:{caller.lineno} `{(caller.line or '').strip()}` "
                    if caller else "")
            return (f"{site}needs {known.needs}; {type(exc).__name__}: {exc} "
                    f"({os.path.basename(innermost)}:{frames[-1].lineno})")
    return None


def constructor_line(exc: BaseException, path: str) -> int | None:
    """The line of ``path`` (the communicator's file) the constructor had reached when ``exc`` left it."""
    lines = [f.lineno for f in traceback.extract_tb(exc.__traceback__)
             if path and os.path.realpath(f.filename) == os.path.realpath(path)]
    return lines[-1] if lines else None


def symm_without_server(node: Node, where: str, outcome: str, context: str, stopped_at: int | None, trace: str,
                        logs: Sequence[str], tables: str) -> sf.Verdict:
    """The live constructor stopped at state only a running server provides (not SGLang's verdict):
    the size table decides when it can, else the result is undecided."""
    reading = symm_table_reading(node)
    said = "; ".join(logs)
    live = (f"[live; {tables}] {where} for capability {node.arch.dotted}, world size {node.world_size}: "
            f"{outcome}\nthe constructor needs what only a running SGLang server provides: {context}"
            + (f"\nSGLang logged: {said}" if said else "") + f"\n{trace}")
    if isinstance(reading, str):
        return sf.Verdict("undecided", f"SGLang's torch symmetric-memory constructor needs a running server "
                          f"({context}); the size table could not be read ({reading})", live)
    evidence = f"{live}\n[table] {reading.text()}"
    if not reading.admits:
        return sf.Verdict("fail", f"SGLang's size table decides: {reading.denial} (measured: the table "
                          f"{reading.table_name} at {reading.table_where} as looked up at {reading.lookup_where}; "
                          "the constructor itself stopped at server-only state)", evidence)
    if stopped_at is not None and stopped_at > reading.checks_end:
        return sf.Verdict("pass", f"SGLang's size table decides: {reading.table_name} "
                          f"({reading.table_where}) admits capability {node.arch.major} with {node.world_size} "
                          f"GPUs, and the constructor passed its table checks ({reading.checks_where}) live before "
                          f"it stopped at server-only state ({os.path.basename(reading.comm_path)}:{stopped_at}); "
                          "the allocation and multicast (handle.multicast_ptr != 0) were not reached and decide "
                          "at run time (see the runtime probe)", evidence)
    return sf.Verdict("undecided", f"SGLang's torch symmetric-memory constructor stopped at server-only state "
                      f"before its table checks ({context}); its table admits capability {node.arch.major} with "
                      f"{node.world_size} GPUs, but what comes before the table was not run", evidence)


def symm_verdict(where: str, outcome: str, logs: Sequence[str], node: Node, method: str) -> sf.Verdict:
    said = "; ".join(logs)
    evidence = f"[{method}] {where} for capability {node.arch.dotted}, world size {node.world_size}: {outcome}"
    evidence += f"\nSGLang logged: {said}" if said else ""
    if outcome.startswith("reached"):
        return sf.Verdict("pass", f"SGLang's torch symmetric-memory gate admits capability {node.arch.major} with "
                          f"{node.world_size} GPUs; it still needs multicast (handle.multicast_ptr != 0) at run "
                          "time, which PCIe GPUs usually lack (see the runtime probe)", evidence)
    if outcome.startswith("raised"):
        return sf.Verdict("fail", f"SGLang's torch symmetric-memory communicator raises {outcome[7:]} for "
                          f"capability {node.arch.major} (world size {node.world_size})", evidence)
    return sf.Verdict("fail", f"SGLang disables torch symmetric memory: {said or outcome}", evidence)


def live_custom_ar(torch: Any, node: Node) -> sf.Verdict | str:
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


def car_verdict(where: str, outcome: str, logs: Sequence[str], node: Node, sizes: Any, method: str) -> sf.Verdict:
    said = "; ".join(logs)
    evidence = (f"[{method}] {where} for {node.world_size} GPUs, interconnect {node.interconnect} "
                f"(full NVLink: {node.full_nvlink}), _SUPPORTED_WORLD_SIZES={sizes}: {outcome}")
    evidence += f"\nSGLang logged: {said}" if said else ""
    if node.world_size <= 1:
        return sf.Verdict("skip", "custom all-reduce does not apply to a single GPU", evidence)
    if outcome.startswith("reached"):
        return sf.Verdict("pass", f"SGLang keeps custom all-reduce for {node.world_size} GPUs over "
                          f"{node.interconnect}; its P2P check decides at run time", evidence)
    if outcome.startswith("raised"):
        return sf.Verdict("error", f"SGLang's CustomAllreduce gate could not be evaluated: {outcome[7:]}", evidence)
    return sf.Verdict("fail", f"SGLang disables custom all-reduce: {said or outcome}", evidence)


def no_fusion_gate(looked_for: str, method: str) -> sf.Verdict:
    """This SGLang has no arch gate of its own for FlashInfer allreduce fusion."""
    return sf.Verdict("skip", f"this SGLang has no FlashInfer allreduce-fusion arch gate of its own ({looked_for}; "
                      "SGLang has one from 0.5.14); FlashInfer's own gate (gate.flashinfer.ar-fusion) decides",
                      f"[{method}] looked for {FUSION_MODULE}.{FUSION_GATE}: {looked_for}")


@contextmanager
def platform_answers(utils: Any, node: Node) -> Iterator[None]:
    """SGLang's cached platform probes (``is_sm90_supported`` ...) answering for the node: the device
    SM they read (``get_device_sm``, NVML) is the target's, and their caches are emptied around the call."""
    def clear_caches() -> None:
        for name in dir(utils):
            if name.startswith("is_") and hasattr(getattr(utils, name), "cache_clear"):
                getattr(utils, name).cache_clear()

    with ExitStack() as stack:
        patch_if_present(stack, utils, "get_device_sm", lambda *args, **kwargs: node.arch.sm)
        patch_if_present(stack, utils, "is_cuda", lambda: True)
        clear_caches()
        stack.callback(clear_caches)
        yield


def live_ar_fusion(torch: Any, node: Node) -> sf.Verdict | str:
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
                return sf.Verdict("error", f"{call} needs what only a running SGLang server provides: {context}", "")
            return fusion_verdict(call, f"raised {sf.describe_exception(exc)}", node, f"live; torch CUDA {cuda}")
        except Exception as exc:  # noqa: BLE001 - not the gate: let the static reading decide
            return sf.Verdict("error", f"{call} raised {sf.describe_exception(exc)}", "")
    return fusion_verdict(call, f"returned {backend!r}", node, f"live; torch CUDA {cuda}")


def fusion_verdict(where: str, outcome: str, node: Node, method: str) -> sf.Verdict:
    evidence = f"[{method}] {where} for capability {node.arch.dotted}: {outcome}"
    if outcome.startswith("raised"):
        return sf.Verdict("fail", f"SGLang rejects FlashInfer allreduce fusion for capability {node.arch.dotted}: "
                          f"{outcome[7:]}", evidence)
    return sf.Verdict("pass", f"SGLang admits FlashInfer allreduce fusion for capability {node.arch.dotted} "
                      f"({outcome}); FlashInfer's own gate (gate.flashinfer.ar-fusion) still decides the kernel",
                      evidence)


# --------------------------------------------------------------------------------------------
# Static evaluation (ast over the installed files; the reading itself is _sglang_source.py's)
# --------------------------------------------------------------------------------------------


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


def static_symm_mem(node: Node, import_error: str) -> sf.Verdict:
    """Evaluate the symmetric-memory gate from SGLang's files."""
    reading = symm_table_reading(node)
    if isinstance(reading, str):
        if reading.startswith("no torch symmetric-memory communicator"):
            return sf.Verdict("skip", "this SGLang has no torch symmetric-memory communicator "
                              "(--enable-torch-symm-mem appeared in 0.5.3)", f"import: {import_error}")
        return sf.Verdict("error", reading, import_error)
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


def static_custom_ar(node: Node, import_error: str) -> sf.Verdict:
    """Evaluate the custom all-reduce gates from SGLang's files."""
    paths = [p for p in (sglang_file("srt/distributed/device_communicators/custom_all_reduce.py"),
                         sglang_file("srt/distributed/device_communicators/custom_all_reduce_utils.py")) if p]
    if not paths:
        return sf.Verdict("error", "no custom_all_reduce.py in this SGLang", import_error)
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
        return sf.Verdict("error", "could not find _SUPPORTED_WORLD_SIZES or the PCIe gate in SGLang's files",
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


def static_ar_fusion(node: Node, import_error: str) -> sf.Verdict:
    """Read ``_resolve_backend``'s arch check from SGLang's file and evaluate it for the node."""
    relative = FUSION_MODULE.replace("sglang.", "", 1).replace(".", "/") + ".py"
    path = sglang_file(relative)
    if path is None:
        return no_fusion_gate(f"no file sglang/{relative}", f"static: import failed ({import_error})")
    function = next((n for n in ast.walk(parse_file(path))
                     if isinstance(n, ast.FunctionDef) and n.name == FUSION_GATE), None)
    if function is None:
        return no_fusion_gate(f"{path} defines no function {FUSION_GATE}", f"static: import failed ({import_error})")
    prefix = f"static: import failed ({import_error}); read {path}, not run"
    gate = arch_raise(function)
    if gate is None:
        return sf.Verdict("error", f"{FUSION_GATE} in {path} has no `if <is_smXX flags>: raise` check", prefix)
    test, message, line = gate
    try:
        rejected = arch_test(test, node.arch.major)
    except ValueError as exc:
        return sf.Verdict("error", f"could not evaluate SGLang's check `{ast.unparse(test)}`: {exc}", prefix)
    where = (f"{os.path.basename(path)}:{line} {FUSION_GATE}: `if {ast.unparse(test)}: raise {message}` "
             "(flags read as capability majors; their CUDA-version part not evaluated)")
    outcome = f"raised {message}" if rejected else "returned (the arch check passes)"
    return fusion_verdict(where, outcome, node, prefix)


# --------------------------------------------------------------------------------------------
# ServerArgs turning FlashInfer allreduce fusion on by itself
# --------------------------------------------------------------------------------------------

SERVER_ARGS_MODULE = "sglang.srt.server_args"
#: torch.version.cuda answered for a CPU build of torch: 12.8 is the first CUDA release that targets
#: sm_100 / sm_120, so the CUDA floors of SGLang's flags (12.3 for sm90, 12.8 for Blackwell) are met
#: and the capability decides, as it does for any torch that can run on the target.
CPU_TORCH_CUDA = "12.8"
FLASHINFER_GATE_SCRIPT = "flashinfer_gates.py"
FLASHINFER_GATE_TIMEOUT_S = 180.0


# ----- live: ServerArgs' own method, run for each architecture

def server_args_for(cls: Any, arch: str, node: Node) -> Any:
    """A ServerArgs with every field at its default and tensor parallelism over the node's GPUs on one
    node, serving a model whose config names ``arch``. ``__post_init__`` is not run (it would load the
    model's config from the hub); the config getters return the stand-in config instead."""
    args = object.__new__(cls)
    for field in dataclasses.fields(cls):
        if field.default is not dataclasses.MISSING:
            value = field.default
        elif field.default_factory is not dataclasses.MISSING:
            value = field.default_factory()
        else:
            value = None
        object.__setattr__(args, field.name, value)
    hf_config = types.SimpleNamespace(architectures=[arch])
    model_config = types.SimpleNamespace(hf_config=hf_config)
    overrides = {"model_path": f"stackforge-probe/{arch}", "tp_size": node.world_size, "nnodes": 1,
                 # 0.5.4-0.5.6 read the model's config through get_hf_config(), 0.5.7+ through
                 # get_model_config().hf_config
                 "get_hf_config": lambda: hf_config, "get_model_config": lambda: model_config,
                 "model_config": model_config}
    for name, value in overrides.items():
        object.__setattr__(args, name, value)
    return args


def method_imports(tree: ast.Module, methods: Sequence[str]) -> list[ast.ImportFrom]:
    """``from sglang... import name`` statements inside the ServerArgs methods."""
    cls = class_node(tree, "ServerArgs")
    bodies = [m for m in (cls.body if cls else []) if isinstance(m, ast.FunctionDef) and m.name in methods]
    return [n for m in bodies for n in ast.walk(m) if isinstance(n, ast.ImportFrom) and n.level == 0
            and (n.module or "").startswith("sglang.")]


def standin_module(name: str, functions: Sequence[str]) -> tuple[types.ModuleType | None, str]:
    """A module holding ``functions`` compiled from SGLang's own file alone (annotations and
    decorators dropped), for a module whose import chain does not load here."""
    path = sglang_file(name.replace("sglang.", "", 1).replace(".", "/") + ".py")
    if path is None:
        return None, f"no file for {name}"
    defined = {n.name: n for n in parse_file(path).body if isinstance(n, ast.FunctionDef)}
    missing = [f for f in functions if f not in defined]
    if missing:
        return None, f"{path} defines no top-level function {', '.join(missing)}"
    module = types.ModuleType(name)
    module.__file__ = path
    for function in functions:
        node = copy.deepcopy(defined[function])
        node.decorator_list, node.returns = [], None
        for argument in (*node.args.posonlyargs, *node.args.args, *node.args.kwonlyargs,
                         node.args.vararg, node.args.kwarg):
            if argument is not None:
                argument.annotation = None
        code = compile(ast.fix_missing_locations(ast.Module(body=[node], type_ignores=[])), path, "exec")
        exec(code, module.__dict__)  # noqa: S102 - SGLang's own function, from its installed file
    return module, path


@contextmanager
def importable(imports: Sequence[ast.ImportFrom]) -> Iterator[list[str]]:
    """Import what the methods import in their bodies before the device is emulated (module-level
    platform checks then see this machine). A module whose import chain fails here (sgl_kernel
    without a GPU) is replaced, while the methods run, by one holding the named functions from its
    own file; the notes say so."""
    notes: list[str] = []
    with ExitStack() as stack:
        for statement in imports:
            module_name = statement.module or ""
            module, error = sf.try_import(module_name)
            if module is not None:
                continue
            standin, where = standin_module(module_name, [alias.name for alias in statement.names])
            if standin is None:
                notes.append(f"{module_name} does not import ({error}) and cannot be stood in for: {where}")
                continue
            stack.enter_context(dict_item(sys.modules, module_name, standin))
            names = ", ".join(alias.name for alias in statement.names)
            notes.append(f"{module_name} does not import here ({error}); its {names} was compiled from {where}")
        yield notes


@contextmanager
def dict_item(mapping: dict[str, Any], key: str, value: Any) -> Iterator[None]:
    missing = object()
    old = mapping.get(key, missing)
    mapping[key] = value
    try:
        yield
    finally:
        if old is missing:
            mapping.pop(key, None)
        else:
            mapping[key] = old


@contextmanager
def target_device(torch: Any, node: Node) -> Iterator[list[str]]:
    """torch answering as a GPU of the target beyond the capability: available, a neutral name,
    and for a CPU torch a CUDA version (:data:`CPU_TORCH_CUDA`); the notes say what was answered."""
    name = f"stackforge target {node.arch.sm_name}"
    notes = [f"torch.cuda.get_device_name() answered {name!r} (not an H20)"]
    with ExitStack() as stack:
        stack.enter_context(sf.patched(torch.cuda, "is_available", lambda: True))
        stack.enter_context(sf.patched(torch.cuda, "get_device_name", lambda device=None: name))
        if getattr(torch.version, "cuda", None) is None:
            stack.enter_context(sf.patched(torch.version, "cuda", CPU_TORCH_CUDA))
            notes.append(f"torch is a CPU build: torch.version.cuda answered {CPU_TORCH_CUDA!r}")
        else:
            notes.append(f"torch CUDA {torch.version.cuda}")
        yield notes


def live_autoenable(torch: Any, node: Node, sites: Sequence[FusionSite], path: str) -> AutoEnable | str:
    """Run the ServerArgs method(s) holding the auto-enable for every architecture they name."""
    module, error = import_sglang(SERVER_ARGS_MODULE)
    if module is None:
        return f"{SERVER_ARGS_MODULE}: {error}"
    cls = getattr(module, "ServerArgs", None)
    methods = list(dict.fromkeys(site.method for site in sites))
    if cls is None or not all(callable(getattr(cls, m, None)) for m in methods):
        return f"{SERVER_ARGS_MODULE}.ServerArgs lacks {', '.join(methods)}"
    utils, error = import_sglang(SGLANG_UTILS)
    if utils is None:
        return f"{SGLANG_UTILS}: {error}"
    outcomes: dict[str, str] = {}
    archs: list[str] = []
    with ExitStack() as stack:
        notes = stack.enter_context(importable(method_imports(parse_file(path), methods)))
        stack.enter_context(emulated_node(torch, node, [module]))
        notes += stack.enter_context(target_device(torch, node))
        stack.enter_context(platform_answers(utils, node))
        for arch in named_archs(sites):
            args = server_args_for(cls, arch, node)
            with sglang_warnings(logging.INFO) as logs:
                try:
                    for method in methods:
                        getattr(args, method)()
                except Exception as exc:  # noqa: BLE001 - an unanswered question: the static reading decides
                    return f"ServerArgs.{method}() for {arch} raised {sf.describe_exception(exc)}"
            # 0.5.14 sets flashinfer_allreduce_fusion_backend instead of the deprecated flag
            turned_on = getattr(args, FUSION_FLAG) is True or getattr(args, PASS_KEY, None) is not None
            said = [m for m in logs if "allreduce fusion" in m.lower()]
            outcomes[arch] = f"{FUSION_FLAG}={turned_on}" + (f" (SGLang logged: {'; '.join(said)})" if said else "")
            if turned_on:
                archs.append(arch)
    method_names = ", ".join(f"ServerArgs.{m}()" for m in methods)
    how = (f"[ServerArgs, live: {method_names} of {SERVER_ARGS_MODULE} run for each architecture; every field at "
           f"its default, tp_size={node.world_size}, nnodes=1, hf_config.architectures=[<arch>]; torch answering "
           f"capability {node.arch.dotted}; {'; '.join(notes)}]")
    return AutoEnable(tuple(archs), named_archs(sites), (), "live", "\n".join(
        [how, *(site.describe(os.path.basename(path)) for site in sites),
         *(f"{arch}: {outcome}" for arch, outcome in outcomes.items())]))


# ----- static: the same conditions read from the files


def static_autoenable(node: Node, sites: Sequence[FusionSite], path: str, why: str) -> AutoEnable:
    """Evaluate the path conditions of every auto-enable for each architecture they name."""
    return read_autoenable(node.arch.major, node.world_size, sites, path, why)


# ----- SGLang 0.5.15+: the auto-enable is a post-process pass of arg_groups/overrides.py


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
    with ExitStack() as stack:
        stack.enter_context(emulated_node(torch, node, [module, utils]))
        notes = stack.enter_context(target_device(torch, node))
        stack.enter_context(platform_answers(utils, node))
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


def evaluate_autoenable(torch: Any, node: Node) -> AutoEnable | str:
    """Live when ServerArgs imports and its method runs for every architecture, static otherwise;
    a string when this SGLang has no such auto-enable to evaluate."""
    found = autoenable_sites()
    if isinstance(found, str):
        return evaluate_pass(torch, node, found)
    sites, path = found
    result = live_autoenable(torch, node, sites, path) if torch is not None else "torch is not importable"
    if isinstance(result, AutoEnable):
        return result
    return static_autoenable(node, sites, path, f"live run failed: {result}")


# ----- combined with FlashInfer's own gate

def flashinfer_gate(node: Node) -> sf.Verdict:
    """FlashInfer's own allreduce-fusion gate for the node: the gate.flashinfer.ar-fusion probe
    (``flashinfer_gates.py`` beside this script), run as its own process."""
    script = os.path.join(os.path.dirname(os.path.abspath(__file__)), FLASHINFER_GATE_SCRIPT)
    argv = [sys.executable, script, "--arch", node.arch.dotted, "--gpus", str(node.world_size),
            "--interconnect", node.interconnect, "--feature", "flashinfer-ar-fusion"]
    run = sf.run_command(argv, FLASHINFER_GATE_TIMEOUT_S)
    lines = [line for line in run.stdout.splitlines() if line.startswith(sf.RESULT_PREFIX)]
    if not lines:
        ended = "timed out" if run.timed_out else f"exit {run.returncode} {run.start_error}".strip()
        return sf.Verdict("error", f"{FLASHINFER_GATE_SCRIPT} gave no result ({ended})", run.output[-1500:])
    try:
        payload = json.loads(lines[-1][len(sf.RESULT_PREFIX):])
        return sf.Verdict(payload["status"], payload["reason"], payload.get("evidence", ""))
    except (ValueError, KeyError, TypeError) as exc:
        return sf.Verdict("error", f"{FLASHINFER_GATE_SCRIPT} gave an unreadable result: {exc}", lines[-1][:1500])


def with_autoenable(base: sf.Verdict, auto: AutoEnable | str, node: Node) -> sf.Verdict:
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
        return sf.Verdict(base.status, f"{base.reason}; {turned_on}, but it fuses only with more than one GPU",
                          evidence, metrics)
    fi = flashinfer_gate(node)
    metrics["flashinfer_gate"] = fi.status
    evidence += f"\nFlashInfer's gate ({FLASHINFER_GATE_SCRIPT}): {fi.status}: {fi.reason}\n{fi.evidence}"
    turned_on += f" with {node.world_size} GPUs on one node, without --enable-flashinfer-allreduce-fusion"
    if base.status == "fail":
        return sf.Verdict("fail", f"{base.reason}; and {turned_on}", evidence, metrics)
    if fi.status == "fail":
        return sf.Verdict("fail", f"{turned_on}, and {fi.reason}", evidence, metrics)
    if fi.status == "pass":
        return sf.Verdict("pass", f"{turned_on}; {fi.reason}", evidence, metrics)
    return sf.Verdict(base.status, f"{base.reason}; {turned_on}; FlashInfer's gate: {fi.reason}", evidence, metrics)


# --------------------------------------------------------------------------------------------
# Main
# --------------------------------------------------------------------------------------------

def evaluate(feature: str, torch: Any, node: Node) -> sf.Verdict:
    """Live when SGLang's module imports, static otherwise."""
    live, static = {"torch-symm-mem": (live_symm_mem, static_symm_mem),
                    "custom-allreduce": (live_custom_ar, static_custom_ar),
                    "flashinfer-ar-fusion": (live_ar_fusion, static_ar_fusion)}[feature]
    result = live(torch, node) if torch is not None else "torch is not importable"
    if isinstance(result, sf.Verdict):
        if result.status != "error":
            return result
        result = f"live evaluation failed: {result.reason}"
    return static(node, result)


def main(argv: Sequence[str]) -> None:
    parser = sf.common_parser(__doc__.splitlines()[0])
    parser.add_argument("--feature", choices=FEATURES, default="torch-symm-mem")
    args = parser.parse_args(argv)
    version = sf.installed_version("sglang")
    if version is None or importlib.util.find_spec("sglang") is None:
        sf.emit("skip", "SGLang is not installed in this image", facts=sf.collect_facts())
    torch, _ = sf.try_import("torch")
    node = Node(args.arch, args.gpus, args.interconnect)
    verdicts = {feature: evaluate(feature, torch, node) for feature in FEATURES}
    method = "static" if "[static" in verdicts[args.feature].evidence else "live"
    verdicts["flashinfer-ar-fusion"] = with_autoenable(verdicts["flashinfer-ar-fusion"],
                                                       evaluate_autoenable(torch, node), node)
    chosen = verdicts[args.feature]
    metrics = {"sglang": version,
               "feature_status": {f: v.status for f, v in verdicts.items()},
               "method": method,
               "other_feature": {f: v.reason for f, v in verdicts.items() if f != args.feature}}
    sf.emit_verdict(sf.Verdict(chosen.status, f"SGLang {version}: {chosen.reason}", chosen.evidence,
                               chosen.metrics), sf.collect_facts(torch_module=torch), metrics)


if __name__ == "__main__":
    sf.run_main(main, sys.argv[1:])
