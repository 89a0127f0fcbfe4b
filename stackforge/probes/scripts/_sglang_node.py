"""What the SGLang gate probes share: the target node, torch and SGLang answering for it, importing SGLang.

The probes ``sglang_symm_mem.py``, ``sglang_custom_ar.py`` and ``sglang_ar_fusion.py`` each decide one of
SGLang's communicator gates, in one of two ways:

1. live: import the communicator module and run its constructor (or gate function) while torch /
   torch.distributed / NVML queries answer for the target node (:func:`emulated_node`: capability, world
   size, "full NVLink" = interconnect is nvlink or nvswitch). The constructor stops at the first step that
   needs real hardware (:class:`GateReached`); reaching it means every gate passed.
2. static, when the live run cannot be made (SGLang pulls heavy dependencies, or its code stops at state only
   a running server provides): read the same files from the installed package with ``ast``
   (``_sglang_source.py``, shared with the wheel tier's readers) and evaluate them.

:func:`evaluate` makes that choice and says which one decided (:class:`Evaluated`); :func:`run_gate` is
every probe's ``main``.

A live constructor can also stop at state only a running server provides (:data:`SERVER_CONTEXT_ERRORS`:
SGLang 0.5.23's ``TorchSymmMemCommunicator.__init__`` reads ``get_exec()`` at torch_symm_mem.py:104,
which raises ``ValueError: config namespace 'exec' not published`` until a server has published its
ServerArgs). That error is not SGLang's verdict on the gate; :func:`server_context` recognises it.

Standard library only (torch and SGLang are passed in or imported by name). No GPU needed.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import logging
import os
import re
import sys
import traceback
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager, ExitStack, contextmanager
from typing import Any

import _sfprobe as sf

SGLANG_UTILS = "sglang.srt.utils.common"
SERVER_ARGS_MODULE = "sglang.srt.server_args"


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


#: torch.version.cuda answered for a CPU build of torch: 12.8 is the first CUDA release that targets
#: sm_100 / sm_120, so the CUDA floors of SGLang's flags (12.3 for sm90, 12.8 for Blackwell) are met
#: and the capability decides, as it does for any torch that can run on the target.
CPU_TORCH_CUDA = "12.8"


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


def sglang_warnings(level: int = logging.WARNING) -> AbstractContextManager[list[str]]:
    """Collect what SGLang logs at ``level`` and above while a constructor runs (INFO is where
    ServerArgs says what it turned on by itself)."""
    return sf.captured_logs("sglang", level=level)


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


@contextmanager
def on_target(torch: Any, node: Node, modules: Sequence[Any], utils: Any) -> Iterator[list[str]]:
    """Everything that answers for the node while ServerArgs-level code runs (its decisions read the
    device name and CUDA version as well as the capability): :func:`emulated_node` over ``modules``,
    :func:`target_device`, and :func:`platform_answers` over ``utils``. Yields target_device's notes."""
    with ExitStack() as stack:
        stack.enter_context(emulated_node(torch, node, modules))
        notes = stack.enter_context(target_device(torch, node))
        stack.enter_context(platform_answers(utils, node))
        yield notes


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


# --------------------------------------------------------------------------------------------
# Live or static, and each probe's main
# --------------------------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True, slots=True)
class Evaluated:
    """A gate's result and the way it was reached: ``live`` (SGLang's code ran for the node) or
    ``static`` (its files were read with ``ast``)."""

    result: sf.ScriptResult
    method: str


LiveGate = Callable[[Any, Node], "sf.ScriptResult | str"]
StaticGate = Callable[[Node, str], sf.ScriptResult]


def evaluate(live: LiveGate, static: StaticGate, torch: Any, node: Node) -> Evaluated:
    """Live when SGLang's module imports and its code gives an answer, static otherwise (told why)."""
    result = live(torch, node) if torch is not None else "torch is not importable"
    if isinstance(result, sf.ScriptResult):
        if result.status != "error":
            return Evaluated(result, "live")
        result = f"live evaluation failed: {result.reason}"
    return Evaluated(static(node, result), "static")


def run_gate(description: str, feature: str, decide: Callable[[Any, Node], Evaluated],
             argv: Sequence[str]) -> None:
    """A gate probe's ``main``: skip without SGLang, else decide ``feature`` for the node and emit it."""
    args = sf.common_parser(description).parse_args(argv)
    version = sf.installed_version("sglang")
    if version is None or importlib.util.find_spec("sglang") is None:
        sf.emit("skip", "SGLang is not installed in this image", facts=sf.collect_facts())
    torch, _ = sf.try_import("torch")
    decided = decide(torch, Node(args.arch, args.gpus, args.interconnect))
    result = decided.result
    metrics = {"sglang": version, "feature_status": {feature: result.status}, "method": decided.method}
    sf.emit_result(sf.ScriptResult(result.status, f"SGLang {version}: {result.reason}", result.evidence,
                                   result.metrics), sf.collect_facts(torch_module=torch), metrics)
