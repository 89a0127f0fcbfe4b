"""The package indexes pip would ask, read in one place: what files a project has, with their hashes.

pip's locations come from ``--index-url``/``--extra-index-url``/``--find-links``, else from pip's own
configuration (:mod:`stackforge.edges.pip_config`). An index may speak the PEP 691 simple JSON API (PyPI,
the PyTorch cuXYZ index) or PEP 503 HTML (most mirrors), over http(s) or ``file://``; a find-links
location is a folder or a page of links. Both :mod:`stackforge.plan.preflight` (is a pinned file there?)
and the wheel tier (every release of a project, each file's sha256, yanked, Requires-Python) read
the indexes through :func:`project_files`; HTTP answers are cached on disk for a while.
:mod:`stackforge.build.requires` lists a release's files the same way and reads one wheel's core
metadata through :func:`wheel_metadata` (PEP 658, else HTTP range reads of the wheel).
"""

from __future__ import annotations

import errno
import hashlib
import html.parser
import io
import json
import os
import shutil
import socket
import sys
import time
import zipfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any
from urllib.parse import unquote, urljoin, urlsplit
from urllib.request import pathname2url, url2pathname

import requests
from packaging.utils import (
    InvalidSdistFilename,
    InvalidWheelFilename,
    canonicalize_name,
    parse_sdist_filename,
    parse_wheel_filename,
)
from packaging.version import InvalidVersion, Version

from stackforge.core.errors import StackforgeError
from stackforge.core.fsio import atomic_write_text
from stackforge.core.wheel_readings import ReleaseFile
from stackforge.edges.pip_config import (
    PYPI_SIMPLE,
    PipConfig,
    read_pip_config,
    redact_urls,
    refuse_credentials,
    without_credentials,
)
from stackforge.edges.resolver import ResolverIndexes

SIMPLE_JSON = "application/vnd.pypi.simple.v1+json"
# JSON when the index speaks it, else the PEP 503 HTML page every index serves.
ACCEPT = f"{SIMPLE_JSON}, application/vnd.pypi.simple.v1+html;q=0.2, text/html;q=0.1"
CACHE_TTL_S = 24 * 3600
TIMEOUT = (5, 20)   # connect, read: an unreachable index must answer fast
# An index page is asked again after this long (bump the file's entry version when its shape changes).
_ENTRY_FORMAT = "entries-v3"


class IndexUnreachableError(StackforgeError):
    """A package index (or find-links location) did not answer: its URL and the cause (TLS, DNS, refused...)."""

    code = "index.unreachable"
    exit_code = 3

    def __init__(self, url: str, cause: str, *, remedy: str = "") -> None:
        super().__init__(f"package index {without_credentials(url)} could not be read: {cause}",
                         remedy=remedy or "check the URL, the network and the CA bundle pip trusts "
                                          "(pip config: cert), or pass --index-url/--find-links")
        self.url = without_credentials(url)
        self.cause = cause


@dataclass(frozen=True, slots=True)
class IndexSource:
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
        origins: (location, where it was set) pairs: ``--index-url``, ``PIP_INDEX_URL``,
            ``pip config global.index-url``, ``pip's default`` (``stackforge doctor`` shows them).
    """

    index_url: str | None = PYPI_SIMPLE
    extra_index_urls: tuple[str, ...] = ()
    find_links: tuple[str, ...] = ()
    cert: str | None = None
    origins: tuple[tuple[str, str], ...] = ()

    def origin(self, location: str) -> str:
        """Where ``location`` was set; "" when not recorded (a config made in code)."""
        return dict(self.origins).get(location, "")

    def sources(self, primary: str = "pypi") -> tuple[IndexSource, ...]:
        """Every location asked for a package whose own index is ``primary`` ("pypi" = the main index)."""
        first = self.index_url if primary == "pypi" else primary
        indexes = dict.fromkeys([*([first] if first else []), *self.extra_index_urls])
        return (*(IndexSource(url, index=True) for url in indexes),
                *(IndexSource(location, index=False) for location in dict.fromkeys(self.find_links)))

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
        pip_config: pip's configuration (:func:`stackforge.edges.pip_config.read_pip_config`).
        env: the environment (``PIP_INDEX_URL``...); read directly too, in case pip could not be asked.
    """
    config = pip_config or PipConfig()
    settings = config.values(env)
    configured_index = settings.get("index-url", PYPI_SIMPLE)
    no_index = settings.get("no-index", "").lower() in ("1", "true", "yes", "on")
    return IndexConfig(index_url=None if no_index and not index_url else (index_url or configured_index),
                       extra_index_urls=tuple(dict.fromkeys([*settings.get("extra-index-url", "").split(),
                                                             *extra_index_urls])),
                       find_links=tuple(dict.fromkeys([*settings.get("find-links", "").split(), *find_links])),
                       cert=settings.get("cert") or None,
                       origins=_origins(config, env, index_url=index_url, extra_index_urls=extra_index_urls,
                                        find_links=find_links))


@dataclass(frozen=True, slots=True)
class IndexRequest:
    """Where a command was told to look for wheels (``--index-url``, ``--extra-index-url``,
    ``--find-links``); pip's configuration on this host fills in what it leaves out."""

    index_url: str | None = None
    extra_index_urls: tuple[str, ...] = ()
    find_links: Path | None = None


def configured_indexes(request: IndexRequest = IndexRequest()) -> IndexConfig:
    """:func:`index_config` for this host: the command-line values over pip's configuration here
    (:func:`stackforge.edges.pip_config.read_pip_config`) and this process's environment."""
    return index_config(index_url=request.index_url, extra_index_urls=request.extra_index_urls,
                        find_links=[str(request.find_links)] if request.find_links else [],
                        pip_config=read_pip_config(), env=os.environ)


def image_indexes(request: IndexRequest, *, ca_bundle: Path | None = None) -> IndexConfig:
    """Where the images' pip installs from, and so where ``build`` and ``plan --preflight`` look (files
    and locks alike): ``--index-url`` (else PyPI), ``--extra-index-url``, ``--find-links`` and the CA
    bundle the build trusts. pip's configuration on this host is not read: it names host paths and
    mirrors that an image cannot see, and what a build installs must not depend on the host.

    Raises:
        SpecError: an index URL carries credentials (shown redacted): the resolver would write it into
            the lock, a log or a layer.
    """
    for url in (request.index_url, *request.extra_index_urls):
        if url:
            refuse_credentials(url, what="index URL", remedy="give the index without user:password@ (a netrc "
                                                             "or keyring on the index's side)")
    wheelhouse = (str(Path(request.find_links).resolve()),) if request.find_links else ()
    origins = [(request.index_url or PYPI_SIMPLE, "--index-url" if request.index_url else "the images' default"),
               *((url, "--extra-index-url") for url in request.extra_index_urls),
               *((location, "--find-links") for location in wheelhouse)]
    return IndexConfig(index_url=request.index_url or PYPI_SIMPLE, extra_index_urls=tuple(request.extra_index_urls),
                       find_links=wheelhouse, cert=str(ca_bundle) if ca_bundle else None, origins=tuple(origins))


def resolver_indexes(config: IndexConfig) -> ResolverIndexes:
    """:func:`image_indexes` as the resolver takes them (PyPI is the resolver's default: not named)."""
    return ResolverIndexes(index_url=None if config.index_url == PYPI_SIMPLE else config.index_url,
                           extra_index_urls=config.extra_index_urls, find_links=config.find_links,
                           ca_bundle=Path(config.cert) if config.cert else None)


def _origins(config: PipConfig, env: Mapping[str, str] | None, *, index_url: str | None,
             extra_index_urls: Sequence[str], find_links: Sequence[str]) -> tuple[tuple[str, str], ...]:
    """(location, where it was set) for every location; a command-line value names its option."""
    found: dict[str, str] = {}
    if index_url:
        found[index_url] = "--index-url"
    else:
        main = config.setting("index-url", env)
        found[main.value if main else PYPI_SIMPLE] = main.origin if main else "pip's default"
    for option, given in (("extra-index-url", extra_index_urls), ("find-links", find_links)):
        found.update({location: f"--{option}" for location in given})
        setting = config.setting(option, env)
        for location in setting.value.split() if setting else ():
            found.setdefault(location, setting.origin)
    return tuple(found.items())


def new_session(indexes: IndexConfig) -> requests.Session:
    """An HTTP session that trusts the CA bundle pip trusts."""
    session = requests.Session()
    if indexes.cert:
        session.verify = indexes.cert
    return session


# --- one location's files -------------------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class IndexEntry:
    """One file a location lists for a project (credentials never kept: entries are cached on disk)."""

    filename: str
    url: str
    sha256: str = ""            # "" when the location gives none (a plain folder)
    requires_python: str = ""
    yanked: bool = False
    core_metadata: bool = False   # the location serves the wheel's METADATA beside it (PEP 658)
    upload_time: str = ""         # PEP 700 ``upload-time`` (JSON pages only)

    def to_json(self) -> dict[str, Any]:
        return {"filename": self.filename, "url": self.url, "sha256": self.sha256,
                "requires_python": self.requires_python, "yanked": self.yanked,
                "core_metadata": self.core_metadata, "upload_time": self.upload_time}


def project_files(source: IndexSource, project: str, *, session: requests.Session, cache: Path | None = None,
                  ttl_s: float = CACHE_TTL_S, timeout: float | tuple[float, float] = TIMEOUT,
                  ) -> list[IndexEntry] | None:
    """The files one location lists for ``project``; ``None`` when it has no page for it.

    Raises:
        requests.RequestException / OSError / ValueError: the location did not answer usefully
        (:func:`unreachable_cause` words the cause).
    """
    name = canonicalize_name(project)
    if urlsplit(source.location).scheme in ("http", "https"):
        # An index has a page per project; a find-links URL is itself the page of links.
        url = f"{source.location.rstrip('/')}/{name}/" if source.index else source.location
        return _get_entries(url, session=session, cache=cache, ttl_s=ttl_s, timeout=timeout)
    return _entries_on_disk(source, name)


def _entries_on_disk(source: IndexSource, project: str) -> list[IndexEntry] | None:
    """A ``file://`` index (a folder per project, with an index.html or the files), or a find-links folder."""
    location = source.location
    path = Path(url2pathname(urlsplit(location).path)) if location.startswith("file:") else Path(location)
    if not path.exists():
        raise FileNotFoundError(f"{path} does not exist")
    if path.is_file():
        if path.suffix in (".html", ".htm"):
            return _page_entries(path.read_text(encoding="utf-8", errors="replace"), _file_url(path))
        return [IndexEntry(path.name, _file_url(path))]
    if not source.index:
        return [IndexEntry(child.name, _file_url(child)) for child in sorted(path.iterdir()) if child.is_file()]
    page = path / project
    if (page / "index.html").is_file():
        return _page_entries((page / "index.html").read_text(encoding="utf-8", errors="replace"),
                             _file_url(page / "index.html"))
    if not page.is_dir():
        return None
    return [IndexEntry(child.name, _file_url(child)) for child in sorted(page.iterdir()) if child.is_file()]


def _file_url(path: Path) -> str:
    return "file://" + pathname2url(str(path.resolve()))


class _LinkParser(html.parser.HTMLParser):
    """The ``<a>`` elements of a PEP 503 page: href (with ``#sha256=``), data-requires-python, data-yanked."""

    def __init__(self) -> None:
        super().__init__()
        self.anchors: list[dict[str, str | None]] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag == "a" and dict(attrs).get("href"):
            self.anchors.append(dict(attrs))


def _page_entries(page: str, base_url: str) -> list[IndexEntry]:
    """The files a PEP 503 page links to; relative links resolved against ``base_url``."""
    parser = _LinkParser()
    parser.feed(page)
    entries = []
    for anchor in parser.anchors:
        href = str(anchor["href"])
        url, _, fragment = urljoin(base_url, href).partition("#")
        algorithm, _, digest = fragment.partition("=")
        entries.append(IndexEntry(filename=unquote(urlsplit(url).path.rstrip("/").rpartition("/")[2]),
                                  url=without_credentials(url),
                                  sha256=digest.lower() if algorithm == "sha256" else "",
                                  requires_python=anchor.get("data-requires-python") or "",
                                  yanked="data-yanked" in anchor,
                                  core_metadata=_offers_metadata(anchor.get("data-core-metadata")
                                                                 or anchor.get("data-dist-info-metadata"))))
    return entries


def _json_entries(data: Mapping[str, Any], base_url: str) -> list[IndexEntry]:
    """The files of a PEP 691 JSON page."""
    entries = []
    for item in data.get("files", []):
        hashes = item.get("hashes") or {}
        entries.append(IndexEntry(filename=str(item["filename"]),
                                  url=without_credentials(urljoin(base_url, str(item.get("url", item["filename"])))),
                                  sha256=str(hashes.get("sha256", "")).lower(),
                                  requires_python=str(item.get("requires-python") or ""),
                                  yanked=bool(item.get("yanked", False)),
                                  core_metadata=bool(item.get("core-metadata") or item.get("data-dist-info-metadata")),
                                  upload_time=str(item.get("upload-time") or "")))
    return entries


def _offers_metadata(attribute: str | None) -> bool:
    """PEP 714: ``data-core-metadata`` is "true" or a hash (``sha256=...``); absent or "false" means none."""
    return attribute is not None and attribute.lower() != "false"


def _get_entries(url: str, *, session: requests.Session, cache: Path | None, ttl_s: float,
                 timeout: float | tuple[float, float]) -> list[IndexEntry] | None:
    """GET a simple-index page (JSON or HTML) as entries, with an on-disk cache; ``None`` for 404.

    A cached page past its ``ttl_s`` is asked for again conditionally: the validators the index gave
    with it (``ETag``, ``Last-Modified``) are stored beside its entries and sent back, and a 304 keeps
    the cached entries. An idle poll of an unchanged page so costs headers, not the page (``watch``).
    """
    path = cache / (hashlib.sha256(f"{_ENTRY_FORMAT}:{url}".encode()).hexdigest()[:32] + ".json") if cache else None
    stored: Any = _UNREADABLE
    if path is not None and path.exists():
        stored = _cached_entries(path)
        if stored is not _UNREADABLE and time.time() - path.stat().st_mtime < ttl_s:
            return stored.entries   # type: ignore[no-any-return]
    # ttl 0 asks for today's answer: PyPI's CDN otherwise serves a page up to ~15 minutes old.
    headers = {"Accept": ACCEPT, **({"Cache-Control": "no-cache"} if ttl_s <= 0 else {})}
    if stored is not _UNREADABLE:
        headers.update(stored.conditional_headers())
    response = session.get(url, headers=headers, timeout=timeout)
    if response.status_code == 304 and stored is not _UNREADABLE:
        _touch(path)   # unchanged: the cached entries are today's answer
        return stored.entries   # type: ignore[no-any-return]
    if response.status_code == 404:
        entries = None
    else:
        response.raise_for_status()
        if "json" in response.headers.get("Content-Type", ""):
            entries = _json_entries(response.json(), response.url or url)
        else:
            entries = _page_entries(response.text, response.url or url)
    if path is not None:
        validators = {key: response.headers.get(header, "") for key, header in _VALIDATORS}
        try:
            atomic_write_text(path, json.dumps({"url": without_credentials(url), **validators,
                                                "files": None if entries is None else [e.to_json() for e in entries]}))
        except OSError as exc:   # the answer is good; only the next run pays for asking again
            _warn(f"index cache {path} could not be written ({exc.strerror or exc}); the answer is used uncached")
    return entries


#: (key in the cache entry, response header): what a conditional request sends back.
_VALIDATORS = (("etag", "ETag"), ("last_modified", "Last-Modified"))


@dataclass(frozen=True, slots=True)
class _CachedPage:
    """A cached index page: its entries (``None``: no page) and the validators the index gave with it."""

    entries: list[IndexEntry] | None
    etag: str = ""
    last_modified: str = ""

    def conditional_headers(self) -> dict[str, str]:
        return {**({"If-None-Match": self.etag} if self.etag else {}),
                **({"If-Modified-Since": self.last_modified} if self.last_modified else {})}


def _touch(path: Path | None) -> None:
    if path is None:
        return
    try:
        os.utime(path)
    except OSError:
        pass   # the next run asks again (conditionally): nothing is lost


_UNREADABLE = object()


def _cached_entries(path: Path) -> _CachedPage | object:
    """A cached page (its entries and validators), or :data:`_UNREADABLE` with a warning.

    A cache entry that does not parse (a torn or edited file, a folder) is the cache's fault, not the
    network's: it is asked for again and rewritten, never reported as the index failing.
    """
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        stored = data["files"]
        return _CachedPage(None if stored is None else [IndexEntry(**item) for item in stored],
                           etag=str(data.get("etag") or ""), last_modified=str(data.get("last_modified") or ""))
    except (OSError, ValueError, TypeError, KeyError, AttributeError, RecursionError) as exc:
        _warn(f"index cache entry {path} is unreadable ({type(exc).__name__}); asking the index again and "
              "rewriting it")
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path, ignore_errors=True)
        return _UNREADABLE


def _warn(message: str) -> None:
    """One warning line on stderr (the edge's own: the commands above never see a cache entry)."""
    print(f"stackforge: warning: {message}", file=sys.stderr, flush=True)


# --- one wheel's core metadata ---------------------------------------------------------------------

def wheel_metadata(entry: IndexEntry, *, session: requests.Session, url: str | None = None,
                   timeout: float | tuple[float, float] = TIMEOUT) -> str | None:
    """The ``*.dist-info/METADATA`` text of a listed wheel, without downloading the wheel.

    The separate metadata file when the location offers one (PEP 658), else the METADATA member
    read through HTTP range requests (a few KB of a many-MB wheel, as pip's "fast-deps" does).
    ``url`` is the wheel's URL when it needs credentials (:func:`with_credentials`). ``None`` when
    neither way works (no metadata file, no range support, no METADATA member).

    Raises:
        requests.RequestException / OSError / ValueError / zipfile.BadZipFile / KeyError: the location
        did not answer usefully.
    """
    url = url or entry.url
    if url.startswith("file:"):
        return _metadata_in_zip(Path(url2pathname(urlsplit(url).path)))
    if entry.core_metadata:
        response = session.get(url + ".metadata", timeout=timeout)
        return response.text if response.status_code == 200 else None
    remote = _RangeFile(session, url, timeout=timeout)
    return _metadata_in_zip(remote) if remote.ranges_supported else None


def _metadata_in_zip(wheel_file: Path | IO[bytes]) -> str | None:
    with zipfile.ZipFile(wheel_file) as wheel:
        member = next((n for n in wheel.namelist() if n.count("/") == 1 and n.endswith(".dist-info/METADATA")), None)
        return wheel.read(member).decode("utf-8", errors="replace") if member else None


class _RangeFile(io.RawIOBase):
    """A read-only, seekable view of a remote file; every read is one HTTP range request."""

    def __init__(self, session: requests.Session, url: str, *, timeout: float | tuple[float, float]) -> None:
        super().__init__()
        self._session, self._url, self._timeout = session, url, timeout
        head = session.head(url, timeout=timeout, allow_redirects=True)
        self.ranges_supported = head.status_code == 200 and head.headers.get("Accept-Ranges") == "bytes"
        self._size = int(head.headers.get("Content-Length", 0))
        self._position = 0

    def seekable(self) -> bool:
        return True

    def readable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._position

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self._position, io.SEEK_END: self._size}[whence]
        self._position = max(0, base + offset)
        return self._position

    def read(self, size: int = -1) -> bytes:
        end = self._size if size is None or size < 0 else min(self._size, self._position + size)
        if end <= self._position:
            return b""
        response = self._session.get(self._url, headers={"Range": f"bytes={self._position}-{end - 1}"},
                                     timeout=self._timeout)
        if response.status_code != 206:
            raise OSError(f"range request answered {response.status_code}")
        self._position += len(response.content)
        return response.content

    def readinto(self, buffer) -> int:  # type: ignore[no-untyped-def]
        data = self.read(len(buffer))
        buffer[: len(data)] = data
        return len(data)


def unreachable_cause(exc: BaseException, location: str = "") -> str:
    """Why a location did not answer, in a few words first (TLS, DNS, refused, timed out, HTTP 503...)."""
    chain = _causes(exc)
    names = " ".join(type(c).__name__ for c in chain)
    innermost = next((c for c in reversed(chain) if isinstance(c, OSError) and c.strerror), None)
    detail = redact_urls(_short(innermost if innermost is not None else exc), [location] if location else [])
    if isinstance(exc, requests.exceptions.SSLError) or "SSL" in names:
        return f"TLS: certificate or handshake failed ({redact_urls(_short(exc), [location] if location else [])})"
    if any(isinstance(c, socket.gaierror) for c in chain) or "NameResolution" in names:
        return f"DNS: host name not resolved ({detail})"
    if any(isinstance(c, ConnectionRefusedError) or getattr(c, "errno", None) == errno.ECONNREFUSED
           for c in chain):
        return f"refused: nothing listens there ({detail})"
    if isinstance(exc, requests.exceptions.Timeout):
        return f"timed out ({detail})"
    if isinstance(exc, requests.exceptions.HTTPError) and exc.response is not None:
        return f"HTTP {exc.response.status_code} ({detail})"
    if isinstance(exc, FileNotFoundError):
        return f"no such file or folder ({detail})"
    return f"{type(exc).__name__} ({detail})"


def _causes(exc: BaseException) -> list[BaseException]:
    """``exc`` and everything it wraps (``__cause__``, ``__context__``, urllib3's ``reason``, exception
    arguments), breadth first; bounded, since chains can loop."""
    seen: list[BaseException] = []
    pending: list[BaseException] = [exc]
    while pending and len(seen) < 24:
        current = pending.pop(0)
        if any(current is s for s in seen):
            continue
        seen.append(current)
        wrapped = [current.__cause__, current.__context__, getattr(current, "reason", None),
                   *getattr(current, "args", ())]
        pending += [w for w in wrapped if isinstance(w, BaseException)]
    return seen


def _short(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    return text if len(text) <= 160 else text[:157] + "..."


# --- a project's releases --------------------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class Release:
    """One version of a distribution and its files (one per file name, from the first index with a sha256)."""

    dist: str
    version: str
    files: tuple[ReleaseFile, ...]

    @property
    def parsed(self) -> Version:
        return Version(self.version)

    @property
    def yanked(self) -> bool:
        return bool(self.files) and all(f.yanked for f in self.files)

    @property
    def wheels(self) -> tuple[ReleaseFile, ...]:
        return tuple(f for f in self.files if f.kind == "wheel")

    @property
    def uploaded(self) -> str:
        """When the release's first file was uploaded (ISO 8601), or "" when the index does not say."""
        times = sorted(f.upload_time for f in self.files if f.upload_time)
        return times[0] if times else ""


def file_kind_and_version(filename: str, project: str) -> tuple[str, Version] | None:
    """("wheel" | "sdist", version) of a file of ``project``; ``None`` for another project's or other files."""
    try:
        if filename.endswith(".whl"):
            name, version, _, _ = parse_wheel_filename(filename)
            return ("wheel", version) if name == project else None
        for suffix in (".tar.gz", ".zip"):
            if filename.endswith(suffix):
                name, version = parse_sdist_filename(filename)
                return ("sdist", version) if name == project else None
    except (InvalidWheelFilename, InvalidSdistFilename, InvalidVersion, ValueError):
        return None
    return None


@dataclass(frozen=True, slots=True)
class ReleaseListing:
    """A project's releases, and the files of it whose version is not PEP 440 (skipped, never guessed at)."""

    releases: tuple[Release, ...]
    skipped: tuple[str, ...] = ()


def releases(dist: str, *, indexes: IndexConfig, include_pre: bool = False, include_yanked: bool = False,
             session: requests.Session | None = None, cache_dir: Path | None = None,
             ttl_s: float = CACHE_TTL_S) -> list[Release]:
    """Every release of ``dist`` the configured locations list, oldest first (``packaging.version`` order).

    See :func:`release_listing`, which also names the files it skipped.
    """
    return list(release_listing(dist, indexes=indexes, include_pre=include_pre, include_yanked=include_yanked,
                                session=session, cache_dir=cache_dir, ttl_s=ttl_s).releases)


def release_listing(dist: str, *, indexes: IndexConfig, include_pre: bool = False, include_yanked: bool = False,
                    session: requests.Session | None = None, cache_dir: Path | None = None,
                    ttl_s: float = CACHE_TTL_S) -> ReleaseListing:
    """Every release of ``dist`` the configured locations list, oldest first, and the skipped files.

    The same file in several locations is taken once: from the first location that gives its sha256
    (else the first that lists it); :attr:`ReleaseFile.index` says where it came from. Pre-releases
    and yanked files are left out unless asked for; a release whose every file is left out is too.
    A file of the project whose version is not PEP 440 is skipped and named in ``skipped``.
    ``ttl_s=0`` asks every location afresh (``Cache-Control: no-cache``).

    Raises:
        IndexUnreachableError: a location did not answer. A release list with a location missing
            could put a boundary in the wrong place, so this is an error, not a note.
    """
    project = str(canonicalize_name(dist))
    session = session or new_session(indexes)
    by_name: dict[str, ReleaseFile] = {}
    versions: dict[str, Version] = {}
    skipped: list[str] = []
    for source in indexes.sources():
        try:
            entries = project_files(source, project, session=session, cache=cache_dir, ttl_s=ttl_s)
        except (requests.RequestException, OSError, ValueError) as exc:
            raise IndexUnreachableError(source.location, unreachable_cause(exc, source.location)) from None
        for entry in entries or ():
            parsed = file_kind_and_version(entry.filename, project)
            if parsed is None:
                if _names_project(entry.filename, project):
                    skipped.append(entry.filename)
                continue
            kind, version = parsed
            known = by_name.get(entry.filename)
            if known is not None and (known.sha256 or not entry.sha256):
                continue
            versions[str(version)] = version
            by_name[entry.filename] = ReleaseFile(
                dist=project, version=str(version), filename=entry.filename, url=entry.url, sha256=entry.sha256,
                requires_python=entry.requires_python, yanked=entry.yanked, kind=kind,
                index=without_credentials(source.location), upload_time=entry.upload_time,
                core_metadata=entry.core_metadata)
    grouped: dict[str, list[ReleaseFile]] = {}
    for file in by_name.values():
        if file.yanked and not include_yanked:
            continue
        grouped.setdefault(file.version, []).append(file)
    found = [Release(project, version, tuple(sorted(files, key=lambda f: f.filename)))
             for version, files in grouped.items()
             if include_pre or not versions[version].is_prerelease]
    return ReleaseListing(tuple(sorted(found, key=lambda r: versions[r.version])),
                          tuple(dict.fromkeys(skipped)))


def _names_project(filename: str, project: str) -> bool:
    """Whether a file name that did not parse still starts with the project's name (a release of it
    with a version that is not PEP 440), as opposed to another project's file or a page link."""
    stem = filename.replace("_", "-").replace(".", "-").lower()
    return (filename.endswith((".whl", ".tar.gz", ".zip"))
            and stem.startswith(project.replace("_", "-").replace(".", "-") + "-"))


def find_release(found: Sequence[Release], version: str) -> Release | None:
    """The release whose version equals ``version`` (PEP 440 equality: 0.6.17 == 0.6.17.0)."""
    try:
        wanted = Version(version)
    except InvalidVersion:
        return None
    return next((r for r in found if r.parsed == wanted), None)


def with_credentials(url: str, indexes: IndexConfig) -> str:
    """``url`` with the ``user:password@`` of the configured location on the same host, if it has one.

    Entries are stored without credentials (they are cached and printed); a private index's files
    are fetched with the credentials its URL was configured with.
    """
    target = urlsplit(url)
    for location in (indexes.index_url or "", *indexes.extra_index_urls, *indexes.find_links):
        configured = urlsplit(location)
        if configured.username and (configured.scheme, configured.hostname) == (target.scheme, target.hostname):
            userinfo = configured.netloc.rpartition("@")[0]
            return target._replace(netloc=f"{userinfo}@{target.netloc}").geturl()
    return url

