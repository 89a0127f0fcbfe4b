"""Preflight: does every pinned version have a file for the stack's Python and platform?

Asks the indexes the build's pip and resolver will ask, before a long build starts: the CLI hands in
:func:`stackforge.edges.index.image_indexes` (``--index-url``, else PyPI; ``--extra-index-url``;
``--find-links``; the build's CA bundle), the same function ``build`` resolves with. pip's own
configuration on this host is not read: the images never see it. An index may speak the PEP 691 simple JSON API (PyPI, the PyTorch cuXYZ
index; PyPI's per-release JSON API is often not proxied) or PEP 503 HTML (most mirrors), over
http(s) or ``file://``; find-links may be a folder or a page of links. HTTP answers are cached on
disk (the index client is :mod:`stackforge.edges.index`). An index that cannot be reached is reported
as such, and the rest of the check goes on: an unreachable extra index would otherwise cost pip
seconds of retries per package during the build.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from enum import Enum
from pathlib import Path
from typing import Any, Iterable

import requests
from packaging.utils import (
    InvalidSdistFilename,
    InvalidWheelFilename,
    canonicalize_name,
    parse_sdist_filename,
    parse_wheel_filename,
)

from stackforge.core.model import Stack
from stackforge.core.versions import compact

# The index client is shared with the wheel tier; its names stay importable from here.
from stackforge.edges.index import IndexConfig, IndexSource, index_config, new_session, project_files
from stackforge.edges.pip_config import PYPI_SIMPLE, redact_urls, without_credentials
from stackforge.plan.derive import Derived
from stackforge.plan.planner import Plan, PlanCell

#: Reads the kept stacks' compiled extensions against their torch (the ABI reading,
#: :func:`stackforge.wheels.abi.check_stacks`, handed in by the CLI: that layer sits above this one)
#: and returns its warning lines; none when every extension matches.
AbiCheck = Callable[[Sequence[tuple[Stack, Derived]]], Sequence[str]]

__all__ = ["Availability", "IndexConfig", "PackageCheck", "PreflightReport", "IndexSource", "Wanted", "check_package",
           "classify_files", "find_package", "index_config", "run_preflight", "wanted_packages"]


class Availability(str, Enum):
    AVAILABLE = "available"        # a wheel for this python/platform exists
    SDIST_ONLY = "sdist-only"      # only a source distribution: the build compiles it
    MISSING = "missing"            # the version exists but no file fits, or the version does not exist
    UNREACHABLE = "unreachable"    # the index did not answer


@dataclass(frozen=True, slots=True)
class PackageCheck:
    stack_id: str
    package: str
    version: str
    index: str
    status: Availability
    detail: str

    def to_json(self) -> dict[str, str]:
        return {"stack_id": self.stack_id, "package": self.package, "version": self.version,
                "index": self.index, "status": self.status.value, "detail": self.detail}


@dataclass(frozen=True, slots=True)
class PreflightReport:
    checks: tuple[PackageCheck, ...]
    indexes: IndexConfig = IndexConfig()
    #: the ABI reading's warnings (an extension needing symbols its torch does not export, a reading
    #: skipped); warnings only: they never fail the preflight
    abi_warnings: tuple[str, ...] = ()

    @property
    def ok(self) -> bool:
        return all(c.status in (Availability.AVAILABLE, Availability.SDIST_ONLY) for c in self.checks)

    def to_json(self) -> dict[str, Any]:
        return {"ok": self.ok, "indexes": self.indexes.to_json(),
                "checks": [c.to_json() for c in self.checks], "abi_warnings": list(self.abi_warnings)}

    def render(self) -> str:
        lines = ["", f"PREFLIGHT (package indexes: {self.indexes.describe()})"]
        for check in self.checks:
            lines.append(f"  {check.status.value:<11} {check.stack_id}  {check.package}=={check.version}  "
                         f"[{check.index}] {check.detail}")
        unreachable = sorted({c.index for c in self.checks if c.status is Availability.UNREACHABLE})
        for index in unreachable:
            lines.append(f"  note: {index} could not be reached from here; builds that need it will fail or crawl")
        lines += [f"  warning: {line}" for line in self.abi_warnings]
        if not self.ok:
            counts = {status: sum(c.status is status for c in self.checks)
                      for status in (Availability.MISSING, Availability.UNREACHABLE)}
            lines.append(f"  preflight failed: {counts[Availability.MISSING]} missing, "
                         f"{counts[Availability.UNREACHABLE]} unreachable")
        return "\n".join(lines)


@dataclass(frozen=True, slots=True)
class Wanted:
    """One pinned file to look for."""

    package: str
    version: str
    index: str   # "pypi" or a PEP 503/691 simple index URL


def wanted_packages(cell: PlanCell) -> tuple[Wanted, ...]:
    """The pinned packages of one cell and the index each comes from."""
    stack, derived = cell.stack, cell.derived
    items = [Wanted("torch", stack.torch, derived.torch_index_url or "pypi"),
             Wanted("flashinfer-python", stack.flashinfer, "pypi"),
             Wanted("sglang", stack.sglang, "pypi")]
    if derived.kernel_package and derived.kernel_version:
        items.append(Wanted(derived.kernel_package, derived.kernel_version, "pypi"))
    items += [Wanted(f"flashinfer-{addon}", stack.flashinfer, "pypi") for addon in stack.flashinfer_addons]
    items += [Wanted(name, version, "pypi") for name, version in derived.toolkit_wheels.items()]
    return tuple(items)


def run_preflight(plan: Plan, *, cache_dir: str | None = None, session: requests.Session | None = None,
                  indexes: IndexConfig | None = None, abi: AbiCheck | None = None) -> PreflightReport:
    """Check every kept stack's pinned packages against the indexes pip would ask; with ``abi``, also
    read each kept stack's compiled extensions against its torch (warnings only)."""
    indexes = indexes or IndexConfig()
    cache = Path(cache_dir or Path.home() / ".cache" / "stackforge" / "preflight")
    session = session or new_session(indexes)
    checks: list[PackageCheck] = []
    seen_cells = {c.stack.id: c for c in plan.cells if not c.pruned}
    for stack_id, cell in seen_cells.items():
        python = cell.stack.python
        for wanted in wanted_packages(cell):
            status, detail, where = find_package(wanted, python, session=session, cache=cache, indexes=indexes)
            checks.append(PackageCheck(stack_id, wanted.package, wanted.version, where, status, detail))
    abi_warnings = tuple(abi([(cell.stack, cell.derived) for cell in seen_cells.values()])) if abi else ()
    return PreflightReport(tuple(checks), indexes, abi_warnings)


def check_package(wanted: Wanted, python: str, *, session: requests.Session, cache: Path) -> tuple[Availability, str]:
    """Availability of one pinned version for ``python`` on linux x86_64, on its own index only."""
    status, detail, _ = find_package(wanted, python, session=session, cache=cache,
                                     indexes=IndexConfig(index_url=PYPI_SIMPLE))
    return status, detail


def find_package(wanted: Wanted, python: str, *, session: requests.Session, cache: Path,
                 indexes: IndexConfig) -> tuple[Availability, str, str]:
    """(availability, detail, where) of one pinned version across every location pip would ask.

    A fitting wheel anywhere makes it available; otherwise a location that did not answer makes it
    unreachable (the file may be there), else sdist-only or missing.
    """
    sources = indexes.sources(wanted.index)
    if not sources:
        return Availability.MISSING, "no index and no find-links to look in (pip's no-index)", wanted.index
    found: dict[str, list[str]] = {}
    unreachable: list[tuple[str, str]] = []
    for source in sources:
        try:
            names = _filenames(wanted, source, session=session, cache=cache)
        except (requests.RequestException, OSError, ValueError) as exc:
            # requests names the URL it asked ("401 ... for url: https://user:token@..."): shown, so redacted.
            unreachable.append((source.location, redact_urls(f"{type(exc).__name__}: {_short(exc)}",
                                                             [source.location])))
            continue
        if not names:
            continue
        status, detail = classify_files(names, wanted.version, python)
        if status is Availability.AVAILABLE:   # pip takes the first fitting wheel it sees: enough
            return status, detail, _label(source.location, wanted.index)
        found[source.location] = names
    if unreachable:
        location, why = unreachable[0]
        return Availability.UNREACHABLE, why, _label(location, wanted.index)
    if found:
        status, detail = classify_files([n for names in found.values() for n in names], wanted.version, python)
        return status, detail, _label(next(iter(found)), wanted.index)
    where = "the index" if len(sources) == 1 else f"any of the {len(sources)} locations asked"
    return Availability.MISSING, f"version not on {where}", _label(sources[0].location, wanted.index)


def _label(source: str, primary: str) -> str:
    """How a location is named in the report: "pypi" for PyPI itself, else its URL (no credentials) or path."""
    return "pypi" if source == PYPI_SIMPLE and primary == "pypi" else without_credentials(source)


def classify_files(filenames: Iterable[str], version: str, python: str) -> tuple[Availability, str]:
    """Pure: is there a wheel for ``python`` on manylinux x86_64 among ``filenames``?"""
    names = list(filenames)
    fitting = [n for n in names if n.endswith(".whl") and _wheel_fits(n, version, python)]
    if fitting:
        return Availability.AVAILABLE, fitting[0]
    if any(n.endswith((".tar.gz", ".zip")) for n in names):
        return Availability.SDIST_ONLY, "no wheel for this python/platform; pip would build from source"
    return Availability.MISSING, f"no file for cp{compact(python)} manylinux x86_64 among {len(names)} file(s)"


def _wheel_fits(filename: str, version: str, python: str) -> bool:
    try:
        _, wheel_version, _, tags = parse_wheel_filename(filename)
    except InvalidWheelFilename:
        return False
    if wheel_version.public != version.split("+")[0] and str(wheel_version) != version:
        return False
    cp = f"cp{compact(python)}"
    for tag in tags:
        platform_ok = tag.platform == "any" or (tag.platform.startswith(("manylinux", "linux")) and
                                                tag.platform.endswith("x86_64"))
        python_ok = tag.interpreter in (cp, "py3", f"py{compact(python)}") or \
            (tag.abi == "abi3" and tag.interpreter.startswith("cp") and int(tag.interpreter[2:]) <= int(cp[2:]))
        if platform_ok and python_ok:
            return True
    return False


def _filenames(wanted: Wanted, source: IndexSource, *, session: requests.Session, cache: Path) -> list[str] | None:
    """File names of ``wanted.version`` at one location, or ``None`` when the project or version is absent.

    Raises:
        requests.RequestException / OSError / ValueError: the location did not answer usefully.
    """
    project = canonicalize_name(wanted.package)
    listing = project_files(source, project, session=session, cache=cache)
    if listing is None:
        return None
    matching = [entry.filename for entry in listing
                if _file_project(entry.filename) == project and _file_version(entry.filename) == wanted.version]
    return matching or None


def _file_project(filename: str) -> str | None:
    """The canonical project name a wheel or sdist file name carries."""
    try:
        if filename.endswith(".whl"):
            return str(parse_wheel_filename(filename)[0])
        for suffix in (".tar.gz", ".zip"):
            if filename.endswith(suffix):
                return str(parse_sdist_filename(filename)[0])
    except (InvalidWheelFilename, InvalidSdistFilename, ValueError):
        return None
    return None


def _file_version(filename: str) -> str | None:
    """The version a wheel or sdist file name carries (local part dropped: 2.9.1+cu130 -> 2.9.1)."""
    if filename.endswith(".whl"):
        try:
            return parse_wheel_filename(filename)[1].public
        except InvalidWheelFilename:
            return None
    for suffix in (".tar.gz", ".zip"):
        if filename.endswith(suffix):
            try:
                return parse_sdist_filename(filename)[1].public
            except (InvalidSdistFilename, ValueError):
                return None
    return None


def _short(exc: Exception) -> str:
    text = " ".join(str(exc).split())
    return text if len(text) <= 160 else text[:157] + "..."
