"""Compose one stack's Dockerfile and build context from the templates in ``dockerfiles/``.

:func:`compose_stack` is pure: (stack, derived facts, options) -> :class:`Composed` (Dockerfile text,
context files, content hash, image tag, labels). :func:`write_context` is the one edge that writes a
composed context to disk.

Every value that reaches the Dockerfile passes :func:`guard_value` twice: once when the render
variables are assembled, and again through Jinja's ``finalize`` hook on every ``{{ value }}``. Only
plain version strings, identifiers, URLs and paths pass; whitespace, quotes, ``$``, backslashes,
newlines and a leading ``-`` (an option in disguise) never do, so a hostile version string cannot
add a Dockerfile instruction or a shell command. Shell syntax comes only from the templates' literal
text.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import jinja2
from markupsafe import Markup
from packaging.markers import InvalidMarker
from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import canonicalize_name

from stackforge.compose.stack_lock import LOCK_LAYERS, LockRequest, StackLock, layer_requirements_text
from stackforge.core.data import data_dir
from stackforge.core.envelope import document_text
from stackforge.core.errors import SpecError, UnsafeValueError
from stackforge.core.fsio import atomic_write_text
from stackforge.core.model import Flavour, Stack, content_hash
from stackforge.core.versions import parse_version
from stackforge.plan.derive import Derived

#: Schema of the ``io.stackforge.*`` label set (bump when keys change meaning).
LABEL_SCHEMA = "1"
LABEL_PREFIX = "io.stackforge"
#: ``io.stackforge.jit``: can the image JIT-compile and link CUDA modules (FlashInfer's, SGLang's)? Only where it
#: has nvcc; what is verified in the built image is the build record's ``jit-link`` check.
JIT_AVAILABLE = "available"
JIT_UNAVAILABLE = "unavailable:no-nvcc"
# A wheels-flavour toolkit lives in its own prefix, outside the Python environment: torch pins its own
# CUDA runtime (cu130 torch: nvidia-cuda-runtime 13.0.x) and CCCL refuses an nvcc whose minor version
# differs from the cudart headers, so the toolkit keeps the runtime headers of its own release.
TOOLKIT_PREFIX = "/opt/cuda-wheels"
#: The context script that gives a wheels toolkit with nvcc the layout JIT builders link against (lib64 with
#: development links, a link-time libcuda stub): dockerfiles/context/, shipped in the build context.
JIT_LAYOUT_SCRIPT = "cuda-jit-layout.sh"
#: Port of stackforge's asset server on 127.0.0.1 (classic builds: wheelhouse and CA bundle; BuildKit
#: without named build contexts: the wheelhouse): the server's first choice, and the default of
#: :data:`ASSET_PORT_ARG`, so builds on a host where it is free share the builder's layer cache.
ASSET_PORT = 38751
#: The build argument that carries the port the asset server got. The Dockerfile names the argument,
#: never the port: a port is host-local (another build may hold 38751), and what the Dockerfile says
#: is hashed into the image tag, so two builds of one stack must render the same text.
ASSET_PORT_ARG = "STACKFORGE_ASSET_PORT"
#: Where BuildKit mounts the wheelhouse inside RUN steps.
WHEELHOUSE_MOUNT = "/stackforge/wheelhouse"
#: FlashInfer's own wheel index (flashinfer-jit-cache is not on PyPI), one per CUDA variant.
FLASHINFER_WHEEL_INDEX = "https://flashinfer.ai/whl"
#: Layers that may be installed with ``--no-deps`` (declared in the image's labels).
NO_DEPS_LAYERS = frozenset({"flashinfer", "kernel", "sglang"})
#: Packages with a layer of their own; never part of a dependency layer.
STACK_PACKAGES = ("torch", "flashinfer-python", "flashinfer-cubin", "flashinfer-jit-cache", "sgl-kernel",
                  "sglang-kernel", "sglang")
#: Context files with the dependencies a layer's package declares (see ComposeOptions.declared).
DEPENDENCY_FILES = {"flashinfer": "requires/flashinfer.txt", "sglang": "requires/sglang.txt"}
TEMPLATE = "Dockerfile.j2"
#: Tag suffix of an image whose wanted dependency layers were dropped (ComposeOptions.dropped_layers).
INLINE_DEPS_SUFFIX = "-inline-deps"
#: What installs the layers of a stack lock inside the image; uv lives in its own prefix outside the venv.
INSTALLERS = ("pip", "uv")
UV_PREFIX = "/opt/stackforge/uv"

# Plain values only: versions, identifiers, image references, URLs, paths. The first character may
# not be '-' (an option), and none of " ' ` $ \ ; & | < > ( ) { } * ? # or whitespace may appear.
_SAFE_VALUE = re.compile(r"[A-Za-z0-9/][A-Za-z0-9._+=!:/@,~%\[\]-]{0,499}")
_IMAGE_REPO_SEPARATORS = re.compile(r"[._-]{2,}")


@dataclass(frozen=True, slots=True)
class ComposeOptions:
    """How a stack is composed (independent of the stack itself).

    Attributes:
        buildkit: render for BuildKit (cache, secret and bind mounts) or for the classic builder.
        base_image: FROM image to use instead of the derived one (``--base-image``, or the
            substitute the build chose); the derived one is still recorded as "requested".
        index_url / extra_index_urls: pip indexes (no credentials: they would land in a layer).
        wheelhouse: a find-links wheelhouse is provided at build time.
        wheelhouse_mount: BuildKit only: the wheelhouse comes as a named build context (BuildKit >= 0.10)
            bind-mounted into RUN steps; False: from the 127.0.0.1 asset server, as for classic builds.
        ca_bundle: a CA bundle is provided at build time (as a secret; its content is never rendered).
        no_deps: layers installed with ``--no-deps`` (``flashinfer``, ``kernel``, ``sglang``).
        declared: what the FlashInfer / SGLang releases declare they need (``Requires-Dist`` lines, from
            :mod:`stackforge.build.requires`), keyed ``flashinfer`` / ``sglang``. When known, those
            dependencies get a layer of their own before the package, shared by releases that declare
            the same list; when not, the package brings them in its own layer.
        dropped_layers: dependency layers that were wanted but whose list could not be had (the
            index was unreachable or did not say). The Dockerfile then differs from one rendered with
            the list, so the tag ends in :data:`INLINE_DEPS_SUFFIX` and a label names the layers:
            the same inputs never change the tag without saying so.
        lock: the stack's lock (:mod:`stackforge.compose.stack_lock`). Given, every layer installs its
            part of the lock (``lock/<layer>.txt`` in the context) with ``--no-deps`` and
            ``--require-hashes``: nothing is resolved inside the image, and the declared-dependency
            layers give way to one ``deps`` layer of the locked dependencies.
        installer: what installs a lock's layers: ``pip``, or ``uv`` (needs a lock, and ``uv_requirement``,
            the pin of the uv that is locked and installed first into its own prefix).
    """

    buildkit: bool = True
    base_image: str | None = None
    index_url: str | None = None
    extra_index_urls: tuple[str, ...] = ()
    wheelhouse: bool = False
    wheelhouse_mount: bool = True
    ca_bundle: bool = False
    no_deps: frozenset[str] = frozenset()
    declared: tuple[tuple[str, tuple[str, ...]], ...] = ()
    dropped_layers: tuple[str, ...] = ()
    lock: StackLock | None = None
    installer: str = "pip"
    uv_requirement: str | None = None


@dataclass(frozen=True, slots=True)
class Composed:
    """A composed stack: everything a builder needs besides the wheelhouse and the CA bundle.

    Attributes:
        stack_id: the stack's readable id.
        dockerfile: the Dockerfile text.
        files: other context files (name -> text), e.g. ``stack.json``.
        content_hash: sha256 (hex) over the Dockerfile and the context files.
        tag: ``stackforge/<stack-id>:<hash12>``, plus ``-inline-deps`` when dependency layers were dropped.
        labels: the labels the Dockerfile sets (sorted key/value pairs).
        base_image: the image the Dockerfile starts FROM.
        base_requested: the base the stack derives (differs when overridden or substituted).
        torch_source: ``index`` (PyTorch index), ``pypi`` or ``wheelhouse``.
        buildkit: composed for BuildKit (True) or the classic builder.
    """

    stack_id: str
    dockerfile: str
    files: dict[str, str]
    content_hash: str
    tag: str
    labels: tuple[tuple[str, str], ...]
    base_image: str
    base_requested: str
    torch_source: str
    buildkit: bool
    no_deps: frozenset[str] = field(default_factory=frozenset)

    @property
    def hash12(self) -> str:
        """The short content hash used in the image tag."""
        return self.content_hash[:12]

    def label(self, key: str) -> str:
        """One label's value (KeyError when the Dockerfile does not set it)."""
        return dict(self.labels)[key]


def guard_value(value: object, *, what: str = "value") -> str:
    """Return ``value`` as text if it is safe inside a Dockerfile line, else raise UnsafeValueError.

    Markup (the output of the templates' own macros, assembled from guarded values) passes as is.
    """
    if isinstance(value, Markup):
        return value
    if value is None or isinstance(value, (dict, list, tuple, set)):
        # A template printing None or a container is a template bug, never something to render.
        raise UnsafeValueError(f"template tried to render {what} {value!r}; only plain values are rendered")
    text = str(value)
    if not _SAFE_VALUE.fullmatch(text):
        shown = repr(text) if len(text) <= 80 else repr(text[:77]) + "..."
        raise UnsafeValueError(f"{what} {shown} cannot go into a Dockerfile: only letters, digits and "
                               f"._+=!:/@,~%[]- are allowed, and it may not start with '-'")
    return text


def compose_stack(stack: Stack, derived: Derived, options: ComposeOptions = ComposeOptions()) -> Composed:
    """Compose ``stack`` (pure: no Docker, no filesystem writes).

    Raises:
        UnsafeValueError: a value could inject Dockerfile or shell text.
        SpecError: the stack cannot be composed as asked (e.g. a kernel package without a version,
            a wheels flavour without toolkit pins, an index URL with credentials).
    """
    _guard_stack(stack)
    variables = _variables(stack, derived, options)
    dockerfile = _environment().get_template(TEMPLATE).render(variables)
    files = {"stack.json": _stack_json(stack, derived, variables), **variables["dependency_files"]}
    digest = content_hash({"dockerfile": dockerfile, "files": files}, length=64)
    return Composed(
        stack_id=stack.id, dockerfile=dockerfile, files=files, content_hash=digest,
        tag=f"stackforge/{image_repository(stack.id)}:{digest[:12]}{_tag_suffix(options)}",
        labels=tuple(variables["labels"]),
        base_image=variables["base_image"], base_requested=derived.base_image,
        torch_source=variables["torch_source"], buildkit=options.buildkit, no_deps=options.no_deps)


def _tag_suffix(options: ComposeOptions) -> str:
    return INLINE_DEPS_SUFFIX if options.dropped_layers else ""


def write_context(composed: Composed, directory: Path) -> Path:
    """Write the Dockerfile and context files into ``directory`` (created); return the Dockerfile path.

    Each file is written to a temporary name and renamed, so a reader never sees half a file.
    """
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    for name, text in {"Dockerfile": composed.dockerfile, **composed.files}.items():
        _write_atomically(directory / name, text)
    return directory / "Dockerfile"


def image_repository(stack_id: str) -> str:
    """A valid image repository name for a stack id (lower case; ``+`` and friends become ``-``)."""
    name = re.sub(r"[^a-z0-9._-]", "-", stack_id.lower())
    name = _IMAGE_REPO_SEPARATORS.sub("-", name).strip("._-")
    return name or "stack"


# ------------------------------------------------------------------------------------------ variables


def _variables(stack: Stack, derived: Derived, options: ComposeOptions) -> dict[str, Any]:
    """Everything the templates see, each value already checked by guard_value."""
    _check_options(options)
    if options.installer == "uv" and options.lock is None:
        raise SpecError("--installer uv installs a stack lock, and this build has none", remedy="drop --no-lock")
    base_image = guard_value(options.base_image or derived.base_image, what="base image")
    torch_source = _torch_source(derived, options)
    named = _named_requirements(stack, derived, torch_source)
    _, fi_hold, fi_index = _flashinfer(stack, derived)
    toolkit = _toolkit_requirements(stack, derived)
    variables: dict[str, Any] = {
        "stack_id": stack.id, "cuda": stack.cuda, "python": stack.python, "flavour": stack.flavour.value,
        "torch": stack.torch, "flashinfer": stack.flashinfer, "sglang": stack.sglang,
        "base_image": base_image, "python_from": _python_source(stack, derived),
        "buildkit": options.buildkit, "ca": options.ca_bundle, "wheelhouse": options.wheelhouse,
        "wheelhouse_mount": options.wheelhouse and options.buildkit and options.wheelhouse_mount,
        "wheelhouse_url": _wheelhouse_url(options), "asset_url": _asset_url(options),
        "asset_port_arg": ASSET_PORT_ARG if _uses_asset_server(options) else None, "asset_port": ASSET_PORT,
        "user_index_url": options.index_url, "user_extra_index_urls": list(options.extra_index_urls),
        "no_deps": sorted(options.no_deps),
        "toolkit_wheels": toolkit, "toolkit_has_nvcc": bool(toolkit) and derived.has_nvcc,
        "cuda_home": _wheels_cuda_home(stack), "toolkit_prefix": TOOLKIT_PREFIX,
        "venv_cuda_include": _venv_cuda_dir(stack, "include"), "venv_cuda_lib": _venv_cuda_dir(stack, "lib"),
        "jit_layout_script": JIT_LAYOUT_SCRIPT,
        "torch_variant": derived.torch_variant, "torch_source": torch_source,
        "torch_source_label": derived.torch_index_url if torch_source == "index" else torch_source,
        "torch_requirement": named["torch"][0],
        "torch_index_url": derived.torch_index_url if torch_source == "index" else None,
        "flashinfer_requirements": named["flashinfer"], "flashinfer_hold": fi_hold,
        "flashinfer_extra_index": fi_index, "flashinfer_addons": list(stack.flashinfer_addons),
        "kernel_package": derived.kernel_package, "kernel_version": derived.kernel_version,
        "kernel_requirement": named["kernel"][0] if named["kernel"] else None,
        "sglang_requirement": named["sglang"][0],
    }
    lock_files = _lock_files(stack, options.lock)
    variables.update(locked=options.lock is not None, installer=options.installer, uv_prefix=UV_PREFIX,
                     uv_binary=f"{UV_PREFIX}/bin/uv",
                     require_hashes=options.lock is not None and not options.lock.unhashed,
                     lock_file=lambda layer: f"/opt/stackforge/lock/{layer}.txt" if f"lock/{layer}.txt" in lock_files
                     else None)
    files = {**_dependency_files(stack, derived, options), **lock_files,
             **_context_scripts(variables["toolkit_has_nvcc"])}
    variables["dependency_files"] = files
    for layer in ("flashinfer", "sglang"):
        variables[f"{layer}_deps_file"] = DEPENDENCY_FILES[layer] if DEPENDENCY_FILES[layer] in files else None
    variables["labels"] = _labels(stack, derived, options, variables)
    _guard_all(variables)
    return variables


def _guard_stack(stack: Stack) -> None:
    """Check the stack's own values first: its id (used everywhere) is computed from them."""
    for name in ("cuda", "torch", "flashinfer", "sglang", "python", "os", "torch_variant", "kernel"):
        value = getattr(stack, name)
        if value is not None:
            guard_value(value, what=f"stack {name}")
    for addon in stack.flashinfer_addons:
        guard_value(addon, what="FlashInfer addon")


def _check_options(options: ComposeOptions) -> None:
    if options.installer not in INSTALLERS:
        raise SpecError(f"--installer takes {' or '.join(INSTALLERS)}, not {options.installer!r}")
    if options.installer == "uv" and not options.uv_requirement:
        raise SpecError("--installer uv needs the pin of the uv to install (uv==VERSION)")
    unknown = set(options.no_deps) - NO_DEPS_LAYERS
    if unknown:
        raise SpecError(f"--no-deps applies to {', '.join(sorted(NO_DEPS_LAYERS))}, not {', '.join(sorted(unknown))}")
    unknown = set(options.dropped_layers) - set(DEPENDENCY_FILES)
    if unknown:
        raise SpecError(f"only {', '.join(sorted(DEPENDENCY_FILES))} have dependency layers, not "
                        f"{', '.join(sorted(unknown))}")
    for url in (options.index_url, *options.extra_index_urls):
        if url is not None:
            _check_index_url(url)


def _check_index_url(url: str) -> None:
    """Index URLs end up in RUN lines (and so in ``docker history``): refuse credentials outright."""
    guard_value(url, what="index URL")
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https", "file"):
        raise SpecError(f"index URL {url!r} must start with https://, http:// or file://")
    if parts.username or parts.password:
        raise SpecError("an index URL with credentials would be stored in the image history",
                        remedy="give the index without user:password and pass credentials another way")


def _torch_source(derived: Derived, options: ComposeOptions) -> str:
    """A wheelhouse replaces the PyTorch index for torch (air-gapped builds); else index or PyPI."""
    if options.wheelhouse:
        return "wheelhouse"
    return "index" if derived.torch_index_url else "pypi"


def _torch_requirement(derived: Derived, torch_source: str) -> str:
    """Pin the variant's local tag (``+cu130``, ``+cpu``) when PyPI's default variant is not wanted.

    ``torch==2.9.1`` also matches PyPI's default build; ``torch==2.9.1+cu130`` matches only the wanted
    variant, so a wheelhouse or index holding another build fails loudly instead of installing it.
    """
    requirement = derived.torch_requirement
    if derived.torch_index_url and torch_source in ("index", "wheelhouse") and "+" not in requirement:
        requirement = f"{requirement}+{derived.torch_variant}"
    return requirement


def _python_source(stack: Stack, derived: Derived) -> str:
    """Where the interpreter comes from: the base itself, the OS packages, or deadsnakes (Ubuntu)."""
    if stack.flavour is Flavour.WHEELS:
        return "base"   # python:<py>-slim (or the bootstrapped Debian with the same python)
    if derived.base_python == stack.python:
        return "apt"
    if stack.os.startswith("ubuntu"):
        return "deadsnakes"
    raise SpecError(f"stack {stack.id}: {stack.os} ships Python {derived.base_python}, not {stack.python}, "
                    f"and stackforge knows no package source for it",
                    remedy=f"use python {derived.base_python} or flavour 'wheels'")


def _toolkit_requirements(stack: Stack, derived: Derived) -> list[str]:
    if stack.flavour is not Flavour.WHEELS:
        return []
    if not derived.toolkit_wheels:
        raise SpecError(f"stack {stack.id}: flavour 'wheels' needs toolkit wheel pins for CUDA {stack.cuda} "
                        f"(compat/tables.yaml toolkit_wheels); none are known",
                        remedy="add the pins (nvcc, nvvm, crt, cccl, runtime of one release) to the table")
    return [f"{package}=={version}" for package, version in sorted(derived.toolkit_wheels.items())]


def _wheels_cuda_home(stack: Stack) -> str:
    """13.x toolkit wheels put nvcc under ``nvidia/cu13`` of the prefix they are installed into."""
    return f"{TOOLKIT_PREFIX}/nvidia/cu{parse_version(stack.cuda).major}"


def _venv_cuda_dir(stack: Stack, folder: str) -> str:
    """``include`` / ``lib`` of the CUDA libraries torch brought into the venv (cuBLAS, cuRAND...): FlashInfer's
    JIT sources include their headers and its modules may link them; the toolkit prefix links to both."""
    return f"/opt/venv/lib/python{stack.python}/site-packages/nvidia/cu{parse_version(stack.cuda).major}/{folder}"


def _context_scripts(toolkit_has_nvcc: bool) -> dict[str, str]:
    """Shell scripts a layer runs, shipped in the context from ``dockerfiles/context/`` (their text is part
    of the content hash, so an edited script is a new image)."""
    if not toolkit_has_nvcc:
        return {}
    return {JIT_LAYOUT_SCRIPT: (data_dir("dockerfiles") / "context" / JIT_LAYOUT_SCRIPT).read_text(encoding="utf-8")}


def _flashinfer(stack: Stack, derived: Derived) -> tuple[list[str], list[str], str | None]:
    """Requirements, pins to hold, and the extra index (jit-cache lives on FlashInfer's own index)."""
    version = stack.flashinfer
    extra = f"[{derived.flashinfer_extra}]" if derived.flashinfer_extra else ""
    requirements = [f"flashinfer-python{extra}=={version}"]
    hold = [f"flashinfer-python=={version}"]
    index = None
    for addon in stack.flashinfer_addons:
        requirements.append(f"flashinfer-{addon}=={version}")
        hold.append(f"flashinfer-{addon}=={version}")
        if addon == "jit-cache":
            index = _jit_cache_index(stack, derived)
    return requirements, hold, index


def _jit_cache_index(stack: Stack, derived: Derived) -> str:
    if not derived.torch_variant.startswith("cu"):
        raise SpecError(f"stack {stack.id}: flashinfer-jit-cache exists only for CUDA variants, "
                        f"not {derived.torch_variant!r}")
    return f"{FLASHINFER_WHEEL_INDEX}/{derived.torch_variant}"


def _kernel_requirement(derived: Derived) -> str | None:
    if derived.kernel_package is None:
        return None
    if not derived.kernel_version:
        raise SpecError(f"kernel package {derived.kernel_package} has no version: every package is pinned",
                        remedy="pin 'kernel' in the matrix or add SGLang's pin to compat/tables.yaml")
    return f"{derived.kernel_package}=={derived.kernel_version}"


def _dependency_files(stack: Stack, derived: Derived, options: ComposeOptions) -> dict[str, str]:
    """Context files listing what FlashInfer / SGLang declare they need, for their dependency layers.

    The stack's own packages are left out (torch, FlashInfer and its addons, the kernel, SGLang): each
    has its own pinned layer, and leaving them out keeps the dependency layers independent of their
    versions, so they can sit early and be shared.
    """
    if options.lock is not None:
        return {}   # the lock's deps layer replaces the declared-dependency layers
    declared = dict(options.declared)
    extras = {"flashinfer": {derived.flashinfer_extra} - {None}, "sglang": set()}
    own = set(STACK_PACKAGES) | ({derived.kernel_package} if derived.kernel_package else set())
    files = {}
    for layer in ("flashinfer", "sglang"):
        if layer in options.no_deps or not declared.get(layer):
            continue
        lines = dependency_lines(declared[layer], extras=extras[layer], python=stack.python, exclude=own)
        if lines:
            files[DEPENDENCY_FILES[layer]] = "".join(f"{line}\n" for line in lines)
    return files


def _lock_files(stack: Stack, lock: StackLock | None) -> dict[str, str]:
    """``lock/<layer>.txt`` for every layer of the lock that holds a package."""
    if lock is None:
        return {}
    if lock.stack_id != stack.id:
        raise SpecError(f"the lock given for stack {stack.id} is the lock of {lock.stack_id}")
    return {f"lock/{layer}.txt": layer_requirements_text(packages)
            for layer in LOCK_LAYERS
            if (packages := lock.layer(layer))}


def _named_requirements(stack: Stack, derived: Derived, torch_source: str) -> dict[str, list[str]]:
    """The requirements of the layers the stack names, by layer: what the Dockerfile installs unlocked and
    what a lock request asks for, so the two can never differ."""
    kernel = _kernel_requirement(derived)
    return {"torch": [_torch_requirement(derived, torch_source)], "flashinfer": _flashinfer(stack, derived)[0],
            "kernel": [kernel] if kernel else [], "sglang": [f"sglang=={stack.sglang}"]}


def lock_request(stack: Stack, derived: Derived, options: ComposeOptions, *, glibc: str,
                 find_links: tuple[str, ...] = ()) -> LockRequest:
    """What the stack's image installs, as a resolver request: the same requirements, in the same layers,
    from the same indexes as the unlocked Dockerfile (so a lock holds what the image's pip would take).

    Layers installed ``--no-deps`` (and the toolkit, always installed exactly) are locked exactly too.
    """
    _guard_stack(stack)
    _check_options(options)   # an index URL with credentials is refused before it reaches the resolver
    torch_source = _torch_source(derived, options)
    named = _named_requirements(stack, derived, torch_source)
    fi_index = _flashinfer(stack, derived)[2]
    layers = tuple((layer, tuple(r)) for layer, r in named.items() if r and layer not in options.no_deps)
    exact = [("toolkit", tuple(_toolkit_requirements(stack, derived)))] if stack.flavour is Flavour.WHEELS else []
    exact += [(layer, tuple(r)) for layer, r in named.items() if r and layer in options.no_deps]
    if options.installer == "uv":
        exact.append(("installer", (str(options.uv_requirement),)))
    return LockRequest(
        stack_id=stack.id, python=stack.python, platform=f"x86_64-manylinux_{glibc.replace('.', '_')}",
        layers=layers, exact=tuple(exact),
        torch_index_url=derived.torch_index_url if torch_source == "index" else None,
        index_url=options.index_url, extra_index_urls=(*options.extra_index_urls, *([fi_index] if fi_index else [])),
        find_links=find_links)


def dependency_lines(declared: tuple[str, ...] | list[str], *, extras: set[str], python: str,
                     exclude: set[str] = frozenset()) -> list[str]:
    """``Requires-Dist`` lines as they apply inside the image: markers decided, extras resolved.

    Markers are evaluated for the image (Linux x86_64, CPython ``python``) with the requested extras,
    so the result is the same on every build machine; direct-URL requirements are left to pip's own
    resolution in the package's layer. Each line is re-serialised by ``packaging`` (a PEP 508
    requirement: it cannot be a pip option), and the list is sorted so releases that declare the same
    requirements in another order still share the layer.
    """
    environment = _image_environment(python)
    excluded = {canonicalize_name(name) for name in exclude}
    lines = set()
    for text in declared:
        try:
            requirement = Requirement(text)
        except (InvalidRequirement, InvalidMarker):
            continue
        if requirement.url or canonicalize_name(requirement.name) in excluded:
            continue
        if requirement.marker is not None:
            wanted = sorted(extras) or [""]
            if not any(requirement.marker.evaluate({**environment, "extra": extra}) for extra in wanted):
                continue
            requirement.marker = None
        lines.add(str(requirement))
    return sorted(lines, key=str.lower)


def _image_environment(python: str) -> dict[str, str]:
    return {"python_version": python, "python_full_version": f"{python}.0", "sys_platform": "linux",
            "platform_system": "Linux", "platform_machine": "x86_64", "os_name": "posix",
            "implementation_name": "cpython", "platform_python_implementation": "CPython",
            "platform_release": "", "platform_version": "", "implementation_version": f"{python}.0"}


def _wheelhouse_url(options: ComposeOptions) -> str:
    if options.buildkit and options.wheelhouse_mount:
        return WHEELHOUSE_MOUNT
    return Markup(f"{_asset_url(options)}/wheelhouse/")


def _asset_url(options: ComposeOptions) -> str:
    """The asset server as the RUN steps' shell sees it: the port is the build argument's value."""
    # Markup: fixed text of stackforge's own (the render guard refuses "$" in values, rightly).
    return Markup(f"http://127.0.0.1:${{{ASSET_PORT_ARG}}}")


def _uses_asset_server(options: ComposeOptions) -> bool:
    """Whether a RUN step fetches from the asset server (the CA of a classic build, an unmounted wheelhouse)."""
    return (not options.buildkit and options.ca_bundle) or (options.wheelhouse and not (
        options.buildkit and options.wheelhouse_mount))


def _labels(stack: Stack, derived: Derived, options: ComposeOptions, v: Mapping[str, Any]) -> list[tuple[str, str]]:
    """Static labels: OCI keys plus ``io.stackforge.*`` for every pin and choice (sorted by key).

    Labels known only after the build (content hash, freeze, created, base digest) are added by the
    builder's metadata step, so they do not feed back into the content hash.
    """
    p = LABEL_PREFIX
    runtime_only = stack.flavour is Flavour.RUNTIME or (stack.flavour is Flavour.WHEELS and not derived.has_nvcc)
    labels = {
        "org.opencontainers.image.title": f"stackforge/{stack.id}",
        "org.opencontainers.image.version": stack.id,
        "org.opencontainers.image.vendor": "stackforge",
        "org.opencontainers.image.base.name": v["base_image"],
        f"{p}.schema": LABEL_SCHEMA,
        f"{p}.stack.id": stack.id,
        f"{p}.cuda": stack.cuda,
        f"{p}.torch": stack.torch,
        f"{p}.torch.requirement": v["torch_requirement"],
        f"{p}.torch.variant": derived.torch_variant,
        f"{p}.torch.cuda": derived.torch_cuda or "none",
        f"{p}.torch.index": derived.torch_index_url or "pypi",
        f"{p}.torch.source": v["torch_source"],
        f"{p}.flashinfer": stack.flashinfer,
        f"{p}.flashinfer.addons": ",".join(stack.flashinfer_addons) or "none",
        f"{p}.kernel.package": derived.kernel_package or "none",
        f"{p}.kernel.version": derived.kernel_version or "none",
        f"{p}.sglang": stack.sglang,
        f"{p}.python": stack.python,
        f"{p}.flavour": stack.flavour.value,
        f"{p}.os": stack.os,
        f"{p}.base.image": v["base_image"],
        f"{p}.base.requested": derived.base_image,
        f"{p}.has-nvcc": _bool(derived.has_nvcc),
        f"{p}.jit": JIT_AVAILABLE if derived.has_nvcc else JIT_UNAVAILABLE,
        f"{p}.runtime-only": _bool(runtime_only),
        f"{p}.toolkit-wheels": ",".join(v["toolkit_wheels"]) or "none",
        f"{p}.no-deps": ",".join(sorted(options.no_deps)) or "none",
        f"{p}.builder": "buildkit" if options.buildkit else "classic",
    }
    if options.lock is not None:
        labels[f"{p}.installer"] = options.installer
        labels[f"{p}.lock.sha256"] = options.lock.sha256()
        labels[f"{p}.lock.packages"] = str(len(options.lock.packages))
    if options.dropped_layers:
        labels[f"{p}.dependency-layers.dropped"] = ",".join(sorted(options.dropped_layers))
    return sorted(labels.items())


def _bool(value: bool) -> str:
    return "true" if value else "false"


def _guard_all(variables: Mapping[str, Any]) -> None:
    """Check every string that may be rendered, so a hostile value fails with its name attached."""
    for name, value in variables.items():
        items = value if isinstance(value, list) else [value]
        for item in items:
            if isinstance(item, tuple):
                for part in item:
                    guard_value(part, what=f"{name} entry")
            elif isinstance(item, str):
                guard_value(item, what=name.replace("_", " "))


def _stack_json(stack: Stack, derived: Derived, variables: Mapping[str, Any]) -> str:
    """``/opt/stackforge/stack.json``: the stack as asked for and what stackforge derived from it."""
    payload = {"schema": "stackforge.image-stack", "schema_version": 1, "stack_id": stack.id,
               "stack": stack.to_json(), "derived": derived.to_json(),
               "torch_source": variables["torch_source"], "base_image": variables["base_image"]}
    return document_text(payload)


# ------------------------------------------------------------------------------------------ edges


def _environment() -> jinja2.Environment:
    """Jinja set up to fail loudly: undefined names raise, every printed value is guarded.

    ``autoescape`` is on only so that macro output is Markup and can be told apart from raw values in
    the guard; the guard already refuses every character HTML escaping would change.
    """
    return jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(data_dir("dockerfiles"))),
        undefined=jinja2.StrictUndefined,
        autoescape=True,
        finalize=guard_value,
        trim_blocks=True,
        lstrip_blocks=True,
        keep_trailing_newline=True,
    )


def _write_atomically(path: Path, text: str) -> None:
    atomic_write_text(path, text, mode=0o644)   # COPY keeps the mode: readable by any user of the image
