"""A stack's lock: every package of its image pinned to a version, its files and their sha256.

Two locks meet in stackforge; this module is the second one:

* the *matrix lock* (``<matrix>.lock.yaml``, :mod:`stackforge.plan.lock`) records which releases a
  matrix's selectors chose, so it names the stacks;
* the *stack lock* (``pylock.toml``, PEP 751) records the full package set of one stack, resolved on
  the host before any image work, so it names the files each image installs.

This module is pure: a :class:`LockRequest` (what a stack asks for, for which Python, platform and
indexes) comes from the stack; the resolver's answers (PEP 751 text) are parsed into
:class:`LockedPackage` rows; :func:`assign_layers` puts each package into the image layer that installs
it; :meth:`StackLock.to_toml` writes the lock and :func:`read_stack_lock` reads it back, refusing a file
edited into an inconsistent state with the line at fault. Running the resolver is the edge's job
(:mod:`stackforge.edges.resolver`); resolving a stack is :mod:`stackforge.build.locking`.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import tomllib
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import InvalidVersion, Version

from stackforge.core.errors import SpecError

#: The image layers a lock's packages are installed in, in build order. ``toolkit`` goes into its own
#: prefix outside the venv; ``deps`` holds every dependency not in the torch layer.
LOCK_LAYERS = ("installer", "torch", "toolkit", "deps", "flashinfer", "kernel", "sglang")
#: Layers installed into a prefix of their own outside the venv: the CUDA toolkit wheels, and uv when the
#: image installs with it. ``pip freeze`` of the venv does not list them, and the venv may hold another
#: build of the same package (torch's nvidia-cuda-runtime beside the toolkit's).
OUTSIDE_VENV = ("installer", "toolkit")
LOCK_FILE = "pylock.toml"
#: Schema of the ``[tool.stackforge]`` table (bump when keys change meaning).
LOCK_TOOL_SCHEMA = 1
_SHA256 = re.compile(r"[0-9a-f]{64}")


@dataclass(frozen=True, slots=True)
class LockRequest:
    """What one stack asks the resolver for (frozen; its :meth:`key` says when a lock is stale).

    Attributes:
        stack_id: the stack.
        python: ``3.11``; the lock is resolved for CPython of this minor version.
        platform: uv's ``--python-platform`` (``x86_64-manylinux_2_36``: the base image's glibc).
        layers: layer -> requirements installed with their dependencies (``torch``, ``flashinfer``,
            ``kernel``, ``sglang``).
        exact: layer -> requirements installed exactly, without dependencies (``toolkit``, and the
            layers the build installs ``--no-deps``).
        torch_index_url: the PyTorch index torch comes from, or None (PyPI / the wheelhouse).
        index_url / extra_index_urls / find_links: the indexes the image's pip uses for the rest.
    """

    stack_id: str
    python: str
    platform: str
    layers: tuple[tuple[str, tuple[str, ...]], ...]
    exact: tuple[tuple[str, tuple[str, ...]], ...] = ()
    torch_index_url: str | None = None
    index_url: str | None = None
    extra_index_urls: tuple[str, ...] = ()
    find_links: tuple[str, ...] = ()

    def requirements(self, *, exact: bool = False) -> list[str]:
        """Every requirement of the resolved (or, with ``exact``, the exact) layers, in layer order."""
        groups = dict(self.exact if exact else self.layers)
        return [r for layer in LOCK_LAYERS for r in groups.get(layer, ())]

    def layer_of(self, name: str, *, exact: bool = False) -> str | None:
        """The named layer that asks for package ``name`` itself (among the exact ones), if any."""
        wanted = canonicalize_name(name)
        for layer, requirements in (self.exact if exact else self.layers):
            if any(_requirement_name(r) == wanted for r in requirements):
                return layer
        return None

    def key(self) -> str:
        """sha256 over everything the resolution depends on except the index's contents."""
        payload = {"stack_id": self.stack_id, "python": self.python, "platform": self.platform,
                   "layers": [list(x) for x in self.layers], "exact": [list(x) for x in self.exact],
                   "torch_index_url": self.torch_index_url, "index_url": self.index_url,
                   "extra_index_urls": list(self.extra_index_urls), "find_links": list(self.find_links)}
        return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()


@dataclass(frozen=True, slots=True)
class LockedFile:
    """One file of a locked package: a wheel or the sdist, where it is and its sha256 (None: unhashed)."""

    kind: str            # "wheel" | "sdist"
    location: str        # URL, or a path for a find-links file
    sha256: str | None


@dataclass(frozen=True, slots=True)
class LockedPackage:
    name: str            # canonical
    version: str
    files: tuple[LockedFile, ...]
    layer: str = "deps"

    @property
    def hashes(self) -> tuple[str, ...]:
        return tuple(sorted({f.sha256 for f in self.files if f.sha256}))

    def pin(self) -> str:
        return f"{self.name}=={self.version}"


@dataclass(frozen=True, slots=True)
class StackLock:
    """A stack's resolved package set, by layer, with what it was resolved from and by what."""

    stack_id: str
    request_key: str
    python: str
    platform: str
    resolver: str
    packages: tuple[LockedPackage, ...]
    notes: tuple[str, ...] = ()

    def layer(self, name: str) -> tuple[LockedPackage, ...]:
        return tuple(p for p in self.packages if p.layer == name)

    def versions(self) -> dict[str, str]:
        """Name -> version of the venv's packages (what ``pip freeze`` in the image lists)."""
        return {p.name: p.version for p in self.venv_packages}

    def by_place(self) -> dict[str, LockedPackage]:
        """Every package keyed by where it is installed: its name in the venv, ``<prefix>:<name>`` outside
        it (the toolkit prefix may hold another build of a package the venv has)."""
        return {(p.name if p.layer not in OUTSIDE_VENV else f"{p.layer}:{p.name}"): p for p in self.packages}

    @property
    def unhashed(self) -> tuple[str, ...]:
        """Packages the index gave no sha256 for (``--locked`` refuses such a lock)."""
        return tuple(p.name for p in self.packages if not p.hashes)

    @property
    def venv_packages(self) -> tuple[LockedPackage, ...]:
        """What ``pip freeze`` in the image's venv lists (the toolkit lives in its own prefix)."""
        return tuple(p for p in self.packages if p.layer not in OUTSIDE_VENV)

    def to_toml(self) -> str:
        """The lock as PEP 751 ``pylock.toml``: ``[[packages]]`` is exactly the venv; the toolkit, installed
        into its own prefix outside it (it may hold another build of a package the venv has), is
        ``[[tool.stackforge.toolkit]]`` in the same form; stackforge's own keys under ``tool.stackforge``."""
        lines = ["# A stack lock written by stackforge (PEP 751): every package of the image, its files and",
                 "# their sha256. Regenerate with `stackforge build --relock`; do not edit by hand.",
                 'lock-version = "1.0"', 'created-by = "stackforge"',
                 f"requires-python = {_toml_string('==' + self.python + '.*')}", ""]
        for package in sorted(self.venv_packages, key=lambda p: (LOCK_LAYERS.index(p.layer), p.name)):
            lines += ["[[packages]]", *_package_lines(package), f"tool.stackforge.layer = {_toml_string(package.layer)}",
                      ""]
        lines += ["[tool.stackforge]", f"schema = {LOCK_TOOL_SCHEMA}", f"stack-id = {_toml_string(self.stack_id)}",
                  f"request-key = {_toml_string(self.request_key)}", f"platform = {_toml_string(self.platform)}",
                  f"resolver = {_toml_string(self.resolver)}",
                  f"notes = [{', '.join(_toml_string(n) for n in self.notes)}]", ""]
        for prefix in OUTSIDE_VENV:
            for package in sorted(self.layer(prefix), key=lambda p: p.name):
                lines += [f"[[tool.stackforge.{prefix}]]", *_package_lines(package), ""]
        return "\n".join(lines)

    def sha256(self) -> str:
        return hashlib.sha256(self.to_toml().encode()).hexdigest()


# ------------------------------------------------------------------------------------------ reading


def packages_from_pylock(text: str, *, source: str) -> list[LockedPackage]:
    """The packages of a resolver's PEP 751 answer (layer not yet assigned)."""
    document = _parse_toml(text, source)
    rows = document.get("packages")
    if not isinstance(rows, list):
        raise SpecError("the lock has no [[packages]] list", source=source)
    return [_package(row, text, source) for row in rows]


def stack_lock_text(data: bytes, *, source: str) -> str:
    """A recorded lock's bytes as text; a file that is not UTF-8 (never one stackforge wrote) is refused.

    Raises:
        SpecError: not UTF-8, with the line of the first bad byte (exit 2).
    """
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise SpecError(f"not UTF-8 text (byte {exc.start}): not a lock stackforge wrote", source=source,
                        line=data[:exc.start].count(b"\n") + 1,
                        remedy="remove it, or rebuild it with --relock") from None


def read_stack_lock(text: str, *, source: str, request: LockRequest | None = None) -> StackLock:
    """Parse a stack lock written by :meth:`StackLock.to_toml`; refuse one that is not consistent.

    Refused, with the line at fault: bad TOML, a package without a valid name / version / sha256, a
    package twice, a layer stackforge does not know, and (given the ``request``) a lock made for other
    inputs or a stack package at another version than the stack pins.
    """
    document = _parse_toml(text, source)
    tool = document.get("tool", {}).get("stackforge")
    if not isinstance(tool, dict) or tool.get("schema") != LOCK_TOOL_SCHEMA:
        raise SpecError(f"not a stack lock written by stackforge (no [tool.stackforge] schema "
                        f"{LOCK_TOOL_SCHEMA})", source=source, remedy="rebuild it with --relock")
    packages = []
    for row in document.get("packages") or []:
        package = _package(row, text, source)
        layer = (row.get("tool") or {}).get("stackforge", {}).get("layer")
        if layer not in LOCK_LAYERS or layer in OUTSIDE_VENV:
            raise SpecError(f"package {package.name}: unknown layer {layer!r} (one of "
                            f"{', '.join(x for x in LOCK_LAYERS if x not in OUTSIDE_VENV)})",
                            source=source, line=_line_of(text, package.name), remedy="rebuild it with --relock")
        packages.append(LockedPackage(package.name, package.version, package.files, layer))
    _refuse_duplicates(packages, text, source)
    for prefix in OUTSIDE_VENV:
        outside = [dataclasses.replace(_package(row, text, source), layer=prefix) for row in tool.get(prefix, [])]
        _refuse_duplicates(outside, text, source)
        packages += outside
    lock = StackLock(stack_id=str(tool.get("stack-id", "")), request_key=str(tool.get("request-key", "")),
                     python=str(document.get("requires-python", "")).removeprefix("==").removesuffix(".*"),
                     platform=str(tool.get("platform", "")), resolver=str(tool.get("resolver", "")),
                     packages=tuple(packages), notes=tuple(str(n) for n in tool.get("notes", [])))
    if request is not None:
        check_lock_matches(lock, request, text=text, source=source)
    return lock


def check_lock_matches(lock: StackLock, request: LockRequest, *, text: str = "", source: str = "") -> None:
    """Refuse a lock made for other inputs, or whose stack packages differ from the stack's pins."""
    if lock.stack_id != request.stack_id or lock.request_key != request.key():
        raise SpecError(f"the lock was resolved for other inputs than stack {request.stack_id} has now "
                        "(requirements, Python, platform or indexes changed)", source=source,
                        line=_line_of(text, "request-key", key=True) or None,
                        remedy="resolve it again with --relock")
    outside = {r: layer for layer, requirements in request.exact if layer in OUTSIDE_VENV for r in requirements}
    for requirement in (*request.requirements(), *request.requirements(exact=True)):
        parsed = Requirement(requirement)
        name = canonicalize_name(parsed.name)
        group = lock.layer(outside[requirement]) if requirement in outside else lock.venv_packages
        locked = next((p for p in group if p.name == name), None)
        if locked is None or not parsed.specifier.contains(locked.version, prereleases=True):
            found = f"locks {locked.pin()}" if locked else f"lacks {name}"
            raise SpecError(f"the lock {found}, but stack {request.stack_id} asks for {requirement}",
                            source=source, line=_line_of(text, name) or None, remedy="resolve it again with --relock")


def _parse_toml(text: str, source: str) -> dict[str, Any]:
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        line = re.search(r"line (\d+)", str(exc))
        raise SpecError(f"not valid TOML: {exc}", source=source, line=int(line.group(1)) if line else None) from None


def _package(row: Any, text: str, source: str) -> LockedPackage:
    if not isinstance(row, dict):
        raise SpecError("a [[packages]] entry is not a table", source=source)
    raw_name = str(row.get("name", ""))
    line = _line_of(text, raw_name) or None
    if not re.fullmatch(r"[A-Za-z0-9]([A-Za-z0-9._-]*[A-Za-z0-9])?", raw_name):
        raise SpecError(f"package name {raw_name!r} is not a valid distribution name", source=source, line=line)
    name = canonicalize_name(raw_name)
    version = str(row.get("version", ""))
    try:
        Version(version)
    except InvalidVersion:
        raise SpecError(f"package {name}: version {version!r} is not a PEP 440 version", source=source,
                        line=line) from None
    files = [_file("wheel", w, name, source, line) for w in row.get("wheels") or []]
    if isinstance(row.get("sdist"), dict):
        files.append(_file("sdist", row["sdist"], name, source, line))
    if not files:
        raise SpecError(f"package {name} {version}: no file (wheels or sdist) is locked", source=source, line=line)
    return LockedPackage(name, version, tuple(files))


def _file(kind: str, table: Any, name: str, source: str, line: int | None) -> LockedFile:
    if not isinstance(table, dict):
        raise SpecError(f"package {name}: a {kind} entry is not a table", source=source, line=line)
    location = str(table.get("url") or table.get("path") or "")
    if not location:
        raise SpecError(f"package {name}: a {kind} entry has neither url nor path", source=source, line=line)
    sha256 = (table.get("hashes") or {}).get("sha256")
    if sha256 is not None and not _SHA256.fullmatch(str(sha256)):
        raise SpecError(f"package {name}: {str(sha256)[:80]!r} is not a sha256 (64 hex digits)", source=source,
                        line=line)
    return LockedFile(kind, location, None if sha256 is None else str(sha256))


def _refuse_duplicates(packages: Sequence[LockedPackage], text: str, source: str) -> None:
    seen: set[str] = set()
    for package in packages:
        if package.name in seen:
            raise SpecError(f"package {package.name} is locked twice", source=source,
                            line=_line_of(text, package.name, last=True) or None, remedy="rebuild it with --relock")
        seen.add(package.name)


def _line_of(text: str, value: str, *, key: bool = False, last: bool = False) -> int:
    """The 1-based line of ``name = "<value>"`` (or of key ``value =``), 0 when not found."""
    if not text:
        return 0
    pattern = re.compile(rf"^\s*{re.escape(value)}\s*=" if key else rf'^\s*name\s*=\s*"{re.escape(value)}"',
                         re.IGNORECASE)
    found = [n for n, line in enumerate(text.splitlines(), 1) if pattern.match(line)]
    return (found[-1] if last else found[0]) if found else 0


# ------------------------------------------------------------------------------------------ layers


def assign_layers(request: LockRequest, resolved: Iterable[LockedPackage], torch_closure: Iterable[str],
                  exact: Iterable[LockedPackage] = ()) -> tuple[LockedPackage, ...]:
    """Put each package into the layer that installs it.

    ``torch_closure`` names what torch alone resolves to (torch and everything it pulls in): those go
    into the torch layer, so two stacks that lock the same torch files share that layer. A package the
    stack names itself goes into its own layer; every other dependency into ``deps``. Packages installed
    exactly (``exact``) keep the layer that asks for them.
    """
    closure = {canonicalize_name(n) for n in torch_closure}
    exact = list(exact)
    # A package a --no-deps layer pins exactly is installed by that layer, even when the resolution of
    # the other layers also brought it in.
    pinned_exactly = {p.name for p in exact if request.layer_of(p.name, exact=True) not in OUTSIDE_VENV}
    placed = []
    for package in (p for p in resolved if p.name not in pinned_exactly):
        layer = request.layer_of(package.name)
        if layer is None:
            layer = "torch" if package.name in closure else "deps"
        placed.append(LockedPackage(package.name, package.version, package.files, layer))
    for package in exact:
        placed.append(LockedPackage(package.name, package.version, package.files,
                                    request.layer_of(package.name, exact=True) or "deps"))
    return tuple(placed)


def layer_requirements_text(packages: Sequence[LockedPackage]) -> str:
    """A requirements file installing exactly ``packages``: one ``name==version`` with every sha256.

    pip installs it with ``--no-deps --require-hashes``: it picks a file whose hash is listed and
    resolves nothing. Names and versions were validated when the lock was read; hashes are hex.
    """
    lines = []
    for package in sorted(packages, key=lambda p: p.name):
        hashes = "".join(f" \\\n    --hash=sha256:{h}" for h in package.hashes)
        lines.append(f"{package.pin()}{hashes}\n")
    return "".join(lines)


# ------------------------------------------------------------------------------------------ changes


def lock_changes(old: StackLock, new: StackLock) -> list[str]:
    """What moved between two locks of a stack, one short line each (empty: the same files)."""
    before, after = old.by_place(), new.by_place()
    kept = sorted(before.keys() & after.keys())
    changes = [f"{key} {before[key].version} -> {after[key].version}" for key in kept
               if before[key].version != after[key].version]
    changes += [f"+ {key} {after[key].version}" for key in sorted(after.keys() - before.keys())]
    changes += [f"- {key} {before[key].version}" for key in sorted(before.keys() - after.keys())]
    refiled = [key for key in kept
               if before[key].version == after[key].version and before[key].hashes != after[key].hashes]
    if refiled:
        changes.append(f"other files for the same version: {', '.join(refiled)}")
    # The same files served from elsewhere (another index, a mirror that moved): the image would fetch there.
    relocated = [f"{key} {_locations(before[key])} -> {_locations(after[key])}" for key in kept
                 if before[key].version == after[key].version and before[key].hashes == after[key].hashes
                 and _locations(before[key]) != _locations(after[key])]
    if relocated:
        changes.append(f"other URLs for the same files: {'; '.join(relocated)}")
    moved = [key for key in kept if before[key].layer != after[key].layer]
    if moved:
        changes.append(f"another layer: {', '.join(moved)}")
    return changes


# ------------------------------------------------------------------------------------------ helpers


def _locations(package: LockedPackage) -> str:
    """A package's file locations, sorted, in one piece (for naming a URL that moved)."""
    return ", ".join(sorted(f.location for f in package.files))


def _requirement_name(text: str) -> str:
    return canonicalize_name(Requirement(text).name)   # requirements come from compose: PEP 508 already


def _toml_string(value: str) -> str:
    return json.dumps(value)   # a JSON string is a TOML basic string for the characters written here


def _package_lines(package: LockedPackage) -> list[str]:
    lines = [f"name = {_toml_string(package.name)}", f"version = {_toml_string(package.version)}"]
    wheels = [f for f in package.files if f.kind == "wheel"]
    sdists = [f for f in package.files if f.kind == "sdist"]
    if wheels:
        lines += ["wheels = [", *(f"    {_file_table(f)}," for f in wheels), "]"]
    if sdists:
        lines.append(f"sdist = {_file_table(sdists[0])}")
    return lines


def _file_table(file: LockedFile) -> str:
    where = "path" if "://" not in file.location else "url"
    hashes = f"{{ sha256 = {_toml_string(file.sha256)} }}" if file.sha256 else "{}"
    return f"{{ {where} = {_toml_string(file.location)}, hashes = {hashes} }}"

