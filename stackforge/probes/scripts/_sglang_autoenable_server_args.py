"""SGLang 0.5.4.post2-0.5.14: ServerArgs turning FlashInfer allreduce fusion on by itself.

Every ``self.enable_flashinfer_allreduce_fusion = True`` (0.5.14: ``self.flashinfer_allreduce_fusion_backend
= "auto"``) in ``srt/server_args.py`` is found (``_sglang_source.autoenable_sites``), and the ServerArgs
method holding it (``_handle_model_specific_adjustments``) is evaluated for each model architecture its
conditions name:

1. live: the method runs without ``__post_init__`` (which would load the model's config): the config
   getters return a config naming the architecture; ``torch.cuda`` answers available, the target
   capability and a neutral device name (not an H20), a CPU torch also a CUDA version
   (:data:`_sglang_node.CPU_TORCH_CUDA`); a module the method imports that does not import here
   (``model_config`` needs sgl_kernel) is stood in for by the named functions compiled from its own file.
   The evidence lists each of these answers.
2. static, when the live run fails: the conditions on the path to the assignment are evaluated
   three-valued (``_sglang_source.read_autoenable``): the platform flags as the capability majors read
   from ``srt/utils/common.py`` (their CUDA floor not evaluated), ``self.*`` as the field defaults; what
   cannot be decided is reported as undecided.

Used by ``sglang_ar_fusion.py`` when the installed ``server_args.py`` holds such an assignment.
"""

from __future__ import annotations

import ast
import copy
import dataclasses
import logging
import os
import sys
import types
from collections.abc import Iterator, Sequence
from contextlib import ExitStack, contextmanager
from typing import Any

import _sfprobe as sf
from _sglang_node import SERVER_ARGS_MODULE, SGLANG_UTILS, Node, import_sglang, on_target, sglang_warnings
from _sglang_source import (
    FUSION_FLAG,
    PASS_KEY,
    AutoEnable,
    FusionSite,
    class_node,
    named_archs,
    parse_file,
    read_autoenable,
    sglang_file,
)


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
        notes += stack.enter_context(on_target(torch, node, [module], utils))
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


def static_autoenable(node: Node, sites: Sequence[FusionSite], path: str, why: str) -> AutoEnable:
    """Evaluate the path conditions of every auto-enable for each architecture they name."""
    return read_autoenable(node.arch.major, node.world_size, sites, path, why)


def evaluate_server_args(torch: Any, node: Node, sites: Sequence[FusionSite], path: str) -> AutoEnable:
    """Live when ServerArgs imports and its method runs for every architecture, static otherwise."""
    result = live_autoenable(torch, node, sites, path) if torch is not None else "torch is not importable"
    if isinstance(result, AutoEnable):
        return result
    return static_autoenable(node, sites, path, f"live run failed: {result}")
