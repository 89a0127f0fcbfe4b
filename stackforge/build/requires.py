"""Look up what a package release declares it needs (its ``Requires-Dist``), from the package index.

Why: a FlashInfer wheel is a few MB, but the dependencies it pulls in (CUTLASS DSL libraries, cuDNN
frontend, numpy...) are hundreds. Installed in the same layer as FlashInfer, every FlashInfer change
would rebuild and re-store all of them. With the declared list known, the templates install it in a
layer of its own, before the package: releases that declare the same list share that layer, and a
FlashInfer-only change costs one small layer.

The lookup is an edge (network). It reads the index's JSON API (PEP 691), then the wheel's core
metadata: the separate metadata file (PEP 658) when the index offers one, else just the METADATA member
of the wheel through HTTP range requests (a few KB of a many-MB wheel, as pip's "fast-deps" does).
When neither works it says why (:class:`Declared`: not listed, or the index unreachable and the cause);
the package then installs its dependencies in its own layer, and callers say so (see
:func:`dropped_warning`): the Dockerfile, and so the image tag, differ from a render that had the list.
"""

from __future__ import annotations

import email.parser
import io
import threading
import zipfile
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path
from typing import TYPE_CHECKING

import requests
from packaging.utils import InvalidWheelFilename, canonicalize_name, parse_wheel_filename
from packaging.version import InvalidVersion, Version

from stackforge.build.classify import diagnose
from stackforge.pip_config import PYPI_SIMPLE, redact_urls, without_credentials

if TYPE_CHECKING:
    from stackforge.model import Stack

_JSON = "application/vnd.pypi.simple.v1+json"


class LookupStatus(str, Enum):
    """How a lookup of declared requirements ended."""

    FOUND = "found"              # the index gave the release's Requires-Dist
    NOT_LISTED = "not-listed"    # the index answered, but has no usable wheel or metadata for it
    UNREACHABLE = "unreachable"  # the index could not be asked (TLS, DNS, refused, timeout...)


@dataclass(frozen=True, slots=True)
class Declared:
    """What one lookup found: the ``Requires-Dist`` lines, or why there are none (one line)."""

    status: LookupStatus
    requirements: tuple[str, ...] = ()
    reason: str = ""


def lookup_declared(package: str, version: str, *, index_url: str | None = None, ca_bundle: Path | None = None,
                    timeout: float = 20.0) -> Declared:
    """The ``Requires-Dist`` lines of ``package==version`` (raw, markers included), or why not."""
    verify: str | bool = str(ca_bundle) if ca_bundle else True
    base = (index_url or PYPI_SIMPLE).rstrip("/")
    shown = without_credentials(base)
    try:
        listing = requests.get(f"{base}/{canonicalize_name(package)}/", headers={"Accept": _JSON},
                               timeout=timeout, verify=verify)
        if listing.status_code != 200:
            return Declared(LookupStatus.NOT_LISTED, reason=f"{shown} answered HTTP {listing.status_code}")
        if "json" not in listing.headers.get("Content-Type", ""):
            return Declared(LookupStatus.NOT_LISTED, reason=f"{shown} offers no JSON listing (PEP 691)")
        wheel = _pick_wheel(listing.json().get("files", []), package, version)
        if wheel is None:
            return Declared(LookupStatus.NOT_LISTED, reason=f"{shown} lists no Linux x86_64 wheel of it")
        url = str(wheel["url"]).split("#", 1)[0]
        if wheel.get("core-metadata") or wheel.get("data-dist-info-metadata"):
            response = requests.get(url + ".metadata", timeout=timeout, verify=verify)
            text = response.text if response.status_code == 200 else None
        else:
            text = _metadata_from_wheel(url, timeout=timeout, verify=verify)
    except requests.RequestException as exc:
        # The same words a failed build gets: tls, dns, proxy, unreachable... with the deciding line.
        diagnosis = diagnose(redact_urls(f"{type(exc).__name__}: {exc}", [base]))
        return Declared(LookupStatus.UNREACHABLE, reason=f"{shown}: {diagnosis.cause.value}: {diagnosis.line}")
    except (ValueError, zipfile.BadZipFile, KeyError, OSError) as exc:
        return Declared(LookupStatus.NOT_LISTED, reason=f"unreadable answer from {shown}: {type(exc).__name__}")
    if text is None:
        return Declared(LookupStatus.NOT_LISTED, reason=f"{shown} gave no core metadata for the wheel")
    message = email.parser.Parser().parsestr(text, headersonly=True)
    return Declared(LookupStatus.FOUND, tuple(message.get_all("Requires-Dist") or ()))


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
    """Per-run cache of :func:`lookup_declared` (parallel builds ask once per release)."""

    index_url: str | None = None
    ca_bundle: Path | None = None
    _cache: dict[tuple[str, str], Declared] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def get(self, package: str, version: str) -> Declared:
        key = (package, version)
        with self._lock:
            if key not in self._cache:
                self._cache[key] = lookup_declared(package, version, index_url=self.index_url,
                                                   ca_bundle=self.ca_bundle)
            return self._cache[key]


#: The layers that get a dependency layer, and the distribution each installs.
DEPENDENCY_LAYER_PACKAGES = {"flashinfer": "flashinfer-python", "sglang": "sglang"}


@dataclass(frozen=True, slots=True)
class DroppedLayer:
    """A dependency layer that was wanted but could not be had: its package brings its dependencies."""

    layer: str
    requirement: str        # package==version
    reason: str


def declared_for(stack: "Stack", lookup: RequirementsLookup, *, no_deps: frozenset[str],
                 ) -> tuple[tuple[tuple[str, tuple[str, ...]], ...], tuple[DroppedLayer, ...]]:
    """(layer -> declared requirements) for ``stack``'s dependency layers, and the layers dropped.

    Layers installed ``--no-deps`` get none (their dependencies are deliberately left out).
    """
    versions = {"flashinfer": stack.flashinfer, "sglang": stack.sglang}
    found, dropped = [], []
    for layer, package in DEPENDENCY_LAYER_PACKAGES.items():
        if layer in no_deps:
            continue
        declared = lookup.get(package, versions[layer])
        if declared.status is LookupStatus.FOUND:
            found.append((layer, declared.requirements))
        else:
            dropped.append(DroppedLayer(layer, f"{package}=={versions[layer]}", declared.reason))
    return tuple(found), tuple(dropped)


def dropped_warning(dropped: tuple[DroppedLayer, ...], suffix: str) -> str:
    """One line naming the dropped dependency layers and why (for stderr and the build log)."""
    reasons = {d.reason for d in dropped}
    if len(reasons) == 1:
        named = f"{', '.join(d.requirement for d in dropped)} ({dropped[0].reason})"
    else:
        named = ", ".join(f"{d.requirement} ({d.reason})" for d in dropped)
    return (f"no dependency layer for {named}; each installs its dependencies in its own layer, "
            f"and the image tag ends in '{suffix}'")
