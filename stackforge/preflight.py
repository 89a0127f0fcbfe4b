"""Preflight: does every pinned version have a file for the stack's Python and platform?

Asks the real indexes through the PEP 691 simple JSON API (PyPI, the PyTorch cuXYZ index, any
mirror that speaks it: PyPI's per-release JSON API is often not proxied) before
a long build starts. Answers are cached on disk. An index that cannot be reached is reported as
such, and the rest of the check goes on: an unreachable extra index would otherwise cost pip
seconds of retries per package during the build.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from dataclasses import dataclass
from enum import Enum
from pathlib import Path
from typing import Any, Iterable

import requests
from packaging.utils import InvalidSdistFilename, InvalidWheelFilename, parse_sdist_filename, parse_wheel_filename

from stackforge.plan import Cell, Plan
from stackforge.versions import compact

PYPI_SIMPLE = "https://pypi.org/simple"
SIMPLE_JSON = "application/vnd.pypi.simple.v1+json"
CACHE_TTL_S = 24 * 3600
TIMEOUT = (5, 20)   # connect, read: an unreachable index must answer fast


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

    @property
    def ok(self) -> bool:
        return all(c.status in (Availability.AVAILABLE, Availability.SDIST_ONLY) for c in self.checks)

    def to_json(self) -> dict[str, Any]:
        return {"ok": self.ok, "checks": [c.to_json() for c in self.checks]}

    def render(self) -> str:
        lines = ["", "PREFLIGHT (package indexes)"]
        for check in self.checks:
            lines.append(f"  {check.status.value:<11} {check.stack_id}  {check.package}=={check.version}  "
                         f"[{check.index}] {check.detail}")
        unreachable = sorted({c.index for c in self.checks if c.status is Availability.UNREACHABLE})
        for index in unreachable:
            lines.append(f"  note: {index} could not be reached from here; builds that need it will fail or crawl")
        return "\n".join(lines)


@dataclass(frozen=True, slots=True)
class Wanted:
    """One pinned file to look for."""

    package: str
    version: str
    index: str   # "pypi" or a PEP 503/691 simple index URL


def wanted_packages(cell: Cell) -> tuple[Wanted, ...]:
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


def run_preflight(plan: Plan, *, cache_dir: str | None = None, session: requests.Session | None = None) -> PreflightReport:
    """Check every kept stack's pinned packages against the real indexes."""
    cache = Path(cache_dir or Path.home() / ".cache" / "stackforge" / "preflight")
    session = session or requests.Session()
    checks: list[PackageCheck] = []
    seen_cells = {c.stack.id: c for c in plan.cells if not c.pruned}
    for stack_id, cell in seen_cells.items():
        python = cell.stack.python
        for wanted in wanted_packages(cell):
            status, detail = check_package(wanted, python, session=session, cache=cache)
            checks.append(PackageCheck(stack_id, wanted.package, wanted.version, wanted.index, status, detail))
    return PreflightReport(tuple(checks))


def check_package(wanted: Wanted, python: str, *, session: requests.Session, cache: Path) -> tuple[Availability, str]:
    """Availability of one pinned version for ``python`` on linux x86_64."""
    try:
        filenames = _filenames(wanted, session=session, cache=cache)
    except requests.RequestException as exc:
        return Availability.UNREACHABLE, f"{type(exc).__name__}: {_short(exc)}"
    if filenames is None:
        return Availability.MISSING, "version not on the index"
    return classify_files(filenames, wanted.version, python)


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


def _filenames(wanted: Wanted, *, session: requests.Session, cache: Path) -> list[str] | None:
    """File names of ``wanted.version`` on its index, or ``None`` when the project or version is absent."""
    index = PYPI_SIMPLE if wanted.index == "pypi" else wanted.index
    url = f"{index.rstrip('/')}/{wanted.package}/"
    data = _get_json(url, session=session, cache=cache, headers={"Accept": SIMPLE_JSON})
    if data is None:
        return None
    matching = [f["filename"] for f in data.get("files", []) if _file_version(f["filename"]) == wanted.version]
    return matching or None


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


def _get_json(url: str, *, session: requests.Session, cache: Path, headers: dict[str, str]) -> dict | None:
    """GET a JSON document, with an on-disk cache; ``None`` for 404."""
    path = cache / (hashlib.sha256(url.encode()).hexdigest()[:32] + ".json")
    if path.exists() and time.time() - path.stat().st_mtime < CACHE_TTL_S:
        return json.loads(path.read_text()).get("body")
    response = session.get(url, headers=headers, timeout=TIMEOUT)
    if response.status_code == 404:
        body = None
    else:
        response.raise_for_status()
        body = response.json()
    cache.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".{os.getpid()}.tmp")
    tmp.write_text(json.dumps({"url": url, "body": body}))
    os.replace(tmp, path)
    return body


def _short(exc: Exception) -> str:
    text = " ".join(str(exc).split())
    return text if len(text) <= 160 else text[:157] + "..."
