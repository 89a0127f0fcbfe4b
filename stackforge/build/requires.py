"""Look up what a package release declares it needs (its ``Requires-Dist``), from the package index.

Why: a FlashInfer wheel is a few MB, but the dependencies it pulls in (CUTLASS DSL libraries, cuDNN
frontend, numpy...) are hundreds. Installed in the same layer as FlashInfer, every FlashInfer change
would rebuild and re-store all of them. With the declared list known, the templates install it in a
layer of its own, before the package: releases that declare the same list share that layer, and a
FlashInfer-only change costs one small layer.

The lookup is an edge (network). It reads the index's JSON API (PEP 691), then the wheel's core
metadata: the separate metadata file (PEP 658) when the index offers one, else just the METADATA member
of the wheel through HTTP range requests (a few KB of a many-MB wheel, as pip's "fast-deps" does).
It gives up quietly (returns None) when neither works; the build then installs the package with its
dependencies in one layer.
"""

from __future__ import annotations

import email.parser
import io
import threading
import zipfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import requests
from packaging.utils import InvalidWheelFilename, canonicalize_name, parse_wheel_filename
from packaging.version import InvalidVersion, Version

if TYPE_CHECKING:
    from stackforge.model import Stack

PYPI_SIMPLE = "https://pypi.org/simple"
_JSON = "application/vnd.pypi.simple.v1+json"


def declared_requirements(package: str, version: str, *, index_url: str | None = None,
                          ca_bundle: Path | None = None, timeout: float = 20.0) -> tuple[str, ...] | None:
    """The ``Requires-Dist`` lines of ``package==version`` (raw, markers included), or None if unknown."""
    verify: str | bool = str(ca_bundle) if ca_bundle else True
    base = (index_url or PYPI_SIMPLE).rstrip("/")
    try:
        listing = requests.get(f"{base}/{canonicalize_name(package)}/", headers={"Accept": _JSON},
                               timeout=timeout, verify=verify)
        if listing.status_code != 200 or "json" not in listing.headers.get("Content-Type", ""):
            return None
        wheel = _pick_wheel(listing.json().get("files", []), package, version)
        if wheel is None:
            return None
        url = str(wheel["url"]).split("#", 1)[0]
        if wheel.get("core-metadata") or wheel.get("data-dist-info-metadata"):
            response = requests.get(url + ".metadata", timeout=timeout, verify=verify)
            text = response.text if response.status_code == 200 else None
        else:
            text = _metadata_from_wheel(url, timeout=timeout, verify=verify)
    except (requests.RequestException, ValueError, zipfile.BadZipFile, KeyError, OSError):
        return None
    if text is None:
        return None
    message = email.parser.Parser().parsestr(text, headersonly=True)
    return tuple(message.get_all("Requires-Dist") or ())


def _pick_wheel(files: list[dict], package: str, version: str) -> dict | None:
    """A wheel of this release: pure Python, or for x86_64 Linux (requirements rarely differ)."""
    wanted = Version(version)
    for entry in files:
        name = str(entry.get("filename", ""))
        if not name.endswith(".whl") or entry.get("yanked"):
            continue
        try:
            dist, release, _, tags = parse_wheel_filename(name)
        except (InvalidWheelFilename, InvalidVersion):
            continue
        platforms = {tag.platform for tag in tags}
        if dist != canonicalize_name(package) or release != wanted:
            continue
        if "any" in platforms or any("x86_64" in p and "linux" in p for p in platforms):
            return entry
    return None


def _metadata_from_wheel(url: str, *, timeout: float, verify: str | bool) -> str | None:
    """The ``*.dist-info/METADATA`` member of a remote wheel, read with HTTP range requests."""
    with requests.Session() as session:
        remote = _RangeFile(session, url, timeout=timeout, verify=verify)
        if not remote.ranges_supported:
            return None
        with zipfile.ZipFile(remote) as wheel:
            member = next((n for n in wheel.namelist()
                           if n.count("/") == 1 and n.endswith(".dist-info/METADATA")), None)
            return wheel.read(member).decode("utf-8", errors="replace") if member else None


class _RangeFile(io.RawIOBase):
    """A read-only, seekable view of a remote file; every read is one HTTP range request."""

    def __init__(self, session: requests.Session, url: str, *, timeout: float, verify: str | bool) -> None:
        super().__init__()
        self._session, self._url, self._timeout, self._verify = session, url, timeout, verify
        head = session.head(url, timeout=timeout, verify=verify, allow_redirects=True)
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
                                     timeout=self._timeout, verify=self._verify)
        if response.status_code != 206:
            raise OSError(f"range request answered {response.status_code}")
        self._position += len(response.content)
        return response.content

    def readinto(self, buffer) -> int:  # type: ignore[no-untyped-def]
        data = self.read(len(buffer))
        buffer[: len(data)] = data
        return len(data)


@dataclass
class RequirementsLookup:
    """Per-run cache of :func:`declared_requirements` (parallel builds ask once per release)."""

    index_url: str | None = None
    ca_bundle: Path | None = None
    _cache: dict[tuple[str, str], tuple[str, ...] | None] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def get(self, package: str, version: str) -> tuple[str, ...] | None:
        key = (package, version)
        with self._lock:
            if key not in self._cache:
                self._cache[key] = declared_requirements(package, version, index_url=self.index_url,
                                                         ca_bundle=self.ca_bundle)
            return self._cache[key]


#: The layers that get a dependency layer, and the distribution each installs.
DEPENDENCY_LAYER_PACKAGES = {"flashinfer": "flashinfer-python", "sglang": "sglang"}


def declared_for(stack: "Stack", lookup: RequirementsLookup, *, no_deps: frozenset[str],
                 ) -> tuple[tuple[tuple[str, tuple[str, ...]], ...], tuple[str, ...]]:
    """(layer -> declared requirements) for ``stack``'s dependency layers, and the packages not found.

    Layers installed ``--no-deps`` get none (their dependencies are deliberately left out).
    """
    versions = {"flashinfer": stack.flashinfer, "sglang": stack.sglang}
    found, unknown = [], []
    for layer, package in DEPENDENCY_LAYER_PACKAGES.items():
        if layer in no_deps:
            continue
        requirements = lookup.get(package, versions[layer])
        if requirements is None:
            unknown.append(f"{package}=={versions[layer]}")
        else:
            found.append((layer, requirements))
    return tuple(found), tuple(unknown)
