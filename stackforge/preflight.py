"""Preflight: does every pinned version have a file for the stack's Python and platform?

Asks the indexes pip would ask, before a long build starts: the index (PyPI unless configured), the
extra indexes and the find-links locations, taken from ``--index-url``/``--extra-index-url``/
``--find-links``, else from pip's own configuration (``PIP_INDEX_URL``, ``PIP_EXTRA_INDEX_URL``,
``PIP_FIND_LINKS``, ``PIP_CERT`` and the ``pip config`` files), so a machine behind a mirror is
checked against its mirror. An index may speak the PEP 691 simple JSON API (PyPI, the PyTorch cuXYZ
index; PyPI's per-release JSON API is often not proxied) or PEP 503 HTML (most mirrors), over
http(s) or ``file://``; find-links may be a folder or a page of links. HTTP answers are cached on
disk. An index that cannot be reached is reported as such, and the rest of the check goes on: an
unreachable extra index would otherwise cost pip seconds of retries per package during the build.
"""

from __future__ import annotations

import hashlib
import html.parser
import json
import os
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from enum import Enum
from pathlib import Path
from typing import Any, Iterable
from urllib.parse import unquote, urlsplit
from urllib.request import url2pathname

import requests
from packaging.utils import (InvalidSdistFilename, InvalidWheelFilename, canonicalize_name, parse_sdist_filename,
                             parse_wheel_filename)

from stackforge.pip_config import PYPI_SIMPLE, PipConfig, redact_urls, without_credentials
from stackforge.plan import Cell, Plan
from stackforge.versions import compact

SIMPLE_JSON = "application/vnd.pypi.simple.v1+json"
# JSON when the index speaks it, else the PEP 503 HTML page every index serves.
ACCEPT = f"{SIMPLE_JSON}, application/vnd.pypi.simple.v1+html;q=0.2, text/html;q=0.1"
CACHE_TTL_S = 24 * 3600
TIMEOUT = (5, 20)   # connect, read: an unreachable index must answer fast


class Availability(str, Enum):
    AVAILABLE = "available"        # a wheel for this python/platform exists
    SDIST_ONLY = "sdist-only"      # only a source distribution: the build compiles it
    MISSING = "missing"            # the version exists but no file fits, or the version does not exist
    UNREACHABLE = "unreachable"    # the index did not answer


@dataclass(frozen=True, slots=True)
class Source:
    """One place pip looks: an index (a page per project) or a find-links location (flat)."""

    location: str
    index: bool


@dataclass(frozen=True, slots=True)
class IndexConfig:
    """Where pip looks for files, as ``pip install`` would on this machine.

    Attributes:
        index_url: the main index (``None`` with pip's ``no-index``).
        extra_index_urls: further indexes, asked as well.
        find_links: folders, files or pages of links (pip ``--find-links``).
        cert: the CA bundle pip trusts (``cert``/``PIP_CERT``), or ``None`` for the default.
    """

    index_url: str | None = PYPI_SIMPLE
    extra_index_urls: tuple[str, ...] = ()
    find_links: tuple[str, ...] = ()
    cert: str | None = None

    def sources(self, primary: str) -> tuple[Source, ...]:
        """Every location asked for a package whose own index is ``primary`` ("pypi" = the main index)."""
        first = self.index_url if primary == "pypi" else primary
        indexes = dict.fromkeys([*([first] if first else []), *self.extra_index_urls])
        return (*(Source(url, index=True) for url in indexes),
                *(Source(location, index=False) for location in dict.fromkeys(self.find_links)))

    def describe(self) -> str:
        """The locations in one line, without credentials (it is printed)."""
        parts = [f"index {without_credentials(self.index_url)}" if self.index_url else "no index"]
        parts += [f"extra index {without_credentials(url)}" for url in self.extra_index_urls]
        parts += [f"find-links {without_credentials(location)}" for location in self.find_links]
        return ", ".join(parts)

    def to_json(self) -> dict[str, Any]:
        """The locations for --json, without credentials."""
        return {"index_url": without_credentials(self.index_url) if self.index_url else None,
                "extra_index_urls": [without_credentials(url) for url in self.extra_index_urls],
                "find_links": [without_credentials(location) for location in self.find_links]}


def index_config(*, index_url: str | None = None, extra_index_urls: Sequence[str] = (),
                 find_links: Sequence[str] = (), pip_config: PipConfig | None = None,
                 env: Mapping[str, str] | None = None) -> IndexConfig:
    """The locations pip would ask: command-line values first, then pip's environment and config files.

    As in pip, ``--index-url`` replaces the configured index while ``--extra-index-url`` and
    ``--find-links`` add to the configured ones.

    Args:
        pip_config: pip's configuration (:func:`stackforge.pip_config.read_pip_config`).
        env: the environment (``PIP_INDEX_URL``...); read directly too, in case pip could not be asked.
    """
    settings = (pip_config or PipConfig()).values(env)
    configured_index = settings.get("index-url", PYPI_SIMPLE)
    no_index = settings.get("no-index", "").lower() in ("1", "true", "yes", "on")
    return IndexConfig(index_url=None if no_index and not index_url else (index_url or configured_index),
                       extra_index_urls=tuple(dict.fromkeys([*settings.get("extra-index-url", "").split(),
                                                             *extra_index_urls])),
                       find_links=tuple(dict.fromkeys([*settings.get("find-links", "").split(), *find_links])),
                       cert=settings.get("cert") or None)


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

    @property
    def ok(self) -> bool:
        return all(c.status in (Availability.AVAILABLE, Availability.SDIST_ONLY) for c in self.checks)

    def to_json(self) -> dict[str, Any]:
        return {"ok": self.ok, "indexes": self.indexes.to_json(),
                "checks": [c.to_json() for c in self.checks]}

    def render(self) -> str:
        lines = ["", f"PREFLIGHT (package indexes: {self.indexes.describe()})"]
        for check in self.checks:
            lines.append(f"  {check.status.value:<11} {check.stack_id}  {check.package}=={check.version}  "
                         f"[{check.index}] {check.detail}")
        unreachable = sorted({c.index for c in self.checks if c.status is Availability.UNREACHABLE})
        for index in unreachable:
            lines.append(f"  note: {index} could not be reached from here; builds that need it will fail or crawl")
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


def run_preflight(plan: Plan, *, cache_dir: str | None = None, session: requests.Session | None = None,
                  indexes: IndexConfig | None = None) -> PreflightReport:
    """Check every kept stack's pinned packages against the indexes pip would ask."""
    indexes = indexes or IndexConfig()
    cache = Path(cache_dir or Path.home() / ".cache" / "stackforge" / "preflight")
    session = session or requests.Session()
    if indexes.cert:
        session.verify = indexes.cert
    checks: list[PackageCheck] = []
    seen_cells = {c.stack.id: c for c in plan.cells if not c.pruned}
    for stack_id, cell in seen_cells.items():
        python = cell.stack.python
        for wanted in wanted_packages(cell):
            status, detail, where = find_package(wanted, python, session=session, cache=cache, indexes=indexes)
            checks.append(PackageCheck(stack_id, wanted.package, wanted.version, where, status, detail))
    return PreflightReport(tuple(checks), indexes)


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


def _filenames(wanted: Wanted, source: Source, *, session: requests.Session, cache: Path) -> list[str] | None:
    """File names of ``wanted.version`` at one location, or ``None`` when the project or version is absent.

    Raises:
        requests.RequestException / OSError / ValueError: the location did not answer usefully.
    """
    project = canonicalize_name(wanted.package)
    if urlsplit(source.location).scheme in ("http", "https"):
        # An index has a page per project; a find-links URL is itself the page of links.
        url = f"{source.location.rstrip('/')}/{project}/" if source.index else source.location
        listing = _get_filenames(url, session=session, cache=cache)
    else:
        listing = _listing_on_disk(source, project)
    if listing is None:
        return None
    matching = [name for name in listing
                if _file_project(name) == project and _file_version(name) == wanted.version]
    return matching or None


def _listing_on_disk(source: Source, project: str) -> list[str] | None:
    """A ``file://`` index (a folder per project, with an index.html or the files), or a find-links folder."""
    location = source.location
    path = Path(url2pathname(urlsplit(location).path)) if location.startswith("file:") else Path(location)
    if not path.exists():
        raise FileNotFoundError(f"{path} does not exist")
    if path.is_file():
        return _links(path.read_text(encoding="utf-8", errors="replace")) if path.suffix in (".html", ".htm") \
            else [path.name]
    if not source.index:
        return [child.name for child in path.iterdir() if child.is_file()]
    page = path / project
    if (page / "index.html").is_file():
        return _links((page / "index.html").read_text(encoding="utf-8", errors="replace"))
    return [child.name for child in page.iterdir() if child.is_file()] if page.is_dir() else None


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


class _LinkParser(html.parser.HTMLParser):
    """The file names a PEP 503 page links to (the last path segment of each ``<a href>``)."""

    def __init__(self) -> None:
        super().__init__()
        self.names: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        href = dict(attrs).get("href") if tag == "a" else None
        if href:
            self.names.append(unquote(urlsplit(href).path.rstrip("/").rpartition("/")[2]))


def _links(page: str) -> list[str]:
    parser = _LinkParser()
    parser.feed(page)
    return parser.names


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


def _get_filenames(url: str, *, session: requests.Session, cache: Path) -> list[str] | None:
    """GET a simple-index page (JSON or HTML) as file names, with an on-disk cache; ``None`` for 404."""
    path = cache / (hashlib.sha256(f"files:{url}".encode()).hexdigest()[:32] + ".json")
    if path.exists() and time.time() - path.stat().st_mtime < CACHE_TTL_S:
        return json.loads(path.read_text()).get("files")
    response = session.get(url, headers={"Accept": ACCEPT}, timeout=TIMEOUT)
    if response.status_code == 404:
        names = None
    else:
        response.raise_for_status()
        if "json" in response.headers.get("Content-Type", ""):
            names = [str(f["filename"]) for f in response.json().get("files", [])]
        else:
            names = _links(response.text)
    cache.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".{os.getpid()}.tmp")
    tmp.write_text(json.dumps({"url": without_credentials(url), "files": names}))
    os.replace(tmp, path)
    return names


def _short(exc: Exception) -> str:
    text = " ".join(str(exc).split())
    return text if len(text) <= 160 else text[:157] + "..."
