"""Look up what a package release declares it needs (its ``Requires-Dist``), from the package index.

Why: a FlashInfer wheel is a few MB, but the dependencies it pulls in (CUTLASS DSL libraries, cuDNN
frontend, numpy...) are hundreds. Installed in the same layer as FlashInfer, every FlashInfer change
would rebuild and re-store all of them. With the declared list known, the templates install it in a
layer of its own, before the package: releases that declare the same list share that layer, and a
FlashInfer-only change costs one small layer.

The lookup is an edge (network), read through the one index client, :mod:`stackforge.edges.index`:
the release's files from the index (PEP 691 JSON or PEP 503 HTML), then the wheel's core metadata
(:func:`stackforge.edges.index.wheel_metadata`: PEP 658, else HTTP range reads of the wheel).
When neither works it says why (:class:`Declared`: not listed, or the index unreachable and the cause);
the package then installs its dependencies in its own layer, and callers say so (see
:func:`dropped_warning`): the Dockerfile, and so the image tag, differ from a render that had the list.
"""

from __future__ import annotations

import email.parser
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
from stackforge.edges.index import (
    IndexConfig,
    IndexEntry,
    IndexSource,
    new_session,
    project_files,
    wheel_metadata,
    with_credentials,
)
from stackforge.edges.pip_config import PYPI_SIMPLE, redact_urls, without_credentials

if TYPE_CHECKING:
    from stackforge.core.model import Stack

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
    indexes = IndexConfig(index_url=(index_url or PYPI_SIMPLE).rstrip("/"), cert=str(ca_bundle) if ca_bundle else None)
    base = str(indexes.index_url)
    shown = without_credentials(base)
    try:
        with new_session(indexes) as session:
            files = project_files(IndexSource(base, index=True), package, session=session, timeout=timeout)
            if files is None:
                return Declared(LookupStatus.NOT_LISTED, reason=f"{shown} answered HTTP 404")
            wheel = _pick_wheel(files, package, version)
            if wheel is None:
                return Declared(LookupStatus.NOT_LISTED, reason=f"{shown} lists no Linux x86_64 wheel of it")
            text = wheel_metadata(wheel, session=session, url=with_credentials(wheel.url, indexes), timeout=timeout)
    except requests.HTTPError as exc:
        status = exc.response.status_code if exc.response is not None else "an error"
        return Declared(LookupStatus.NOT_LISTED, reason=f"{shown} answered HTTP {status}")
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


def _pick_wheel(files: list[IndexEntry], package: str, version: str) -> IndexEntry | None:
    """A wheel of this release: pure Python, or for x86_64 Linux (requirements rarely differ)."""
    wanted = Version(version)
    for entry in files:
        if not entry.filename.endswith(".whl") or entry.yanked:
            continue
        try:
            dist, release, _, tags = parse_wheel_filename(entry.filename)
        except (InvalidWheelFilename, InvalidVersion):
            continue
        platforms = {tag.platform for tag in tags}
        if dist != canonicalize_name(package) or release != wanted:
            continue
        if "any" in platforms or any("x86_64" in p and "linux" in p for p in platforms):
            return entry
    return None


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
