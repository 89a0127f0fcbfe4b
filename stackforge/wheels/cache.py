"""Wheels unpacked on disk, content-addressed by the sha256 the index gives: ``<root>/<sha256>/``.

A wheel is downloaded (never installed, no dependencies) into a temporary file inside the cache,
checked against the index's sha256, unpacked into a temporary folder inside the cache and renamed
into place in one step, so ``<root>/<sha256>/`` either holds a whole wheel or does not exist: an
interruption (Ctrl-C, a dead network, a wrong hash) leaves nothing half-written. The downloaded
file is not kept; the unpacked tree is what readers read.

Readers read Python code, metadata and headers, so compiled objects and kernel sources
(:data:`SKIPPED_SUFFIXES`) and vendored third-party trees (:data:`SKIPPED_DIRS`: CUTLASS, CCCL...)
are not unpacked: a FlashInfer 0.7 wheel is 700 MB unpacked, 200 MB without them. The tree records
which policy unpacked it (:data:`UNPACK_FORMAT`); a tree from another policy is unpacked again.

A release published only as an sdist (``.tar.gz``) is unpacked the same way, never built: only its
importable package (``<sdist>/<package>/``, e.g. ``flashinfer_python-0.3.1/flashinfer/``) lands in the
tree, at the place a wheel would put it, so readers read ``flashinfer/jit/comm.py`` in both. Everything
else an sdist holds (headers under ``include/``, ``PKG-INFO``) is left out: it is not where a wheel has
it, and :func:`stackforge.wheels.tier.measure` never takes its absence as a verdict.

The root is ``~/.cache/stackforge/wheels`` unless ``STACKFORGE_WHEEL_CACHE`` names another.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import tarfile
import tempfile
import zipfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from urllib.parse import urlsplit
from urllib.request import url2pathname

import requests

from stackforge.core.errors import StackforgeError
from stackforge.core.wheel_readings import ReleaseFile
from stackforge.edges.index import (
    IndexConfig,
    IndexUnreachableError,
    new_session,
    unreachable_cause,
    with_credentials,
)

CACHE_ENV = "STACKFORGE_WHEEL_CACHE"
DOWNLOAD_TIMEOUT = (5, 120)   # connect, read between chunks
_CHUNK = 1 << 20
_TMP_PREFIX = ".partial-"
#: Members not unpacked: compiled code and kernel sources (no reader reads them).
SKIPPED_SUFFIXES = frozenset({".so", ".a", ".o", ".cubin", ".fatbin", ".bin", ".ptx", ".dll", ".dylib", ".lib",
                              ".cu", ".cpp", ".cc", ".cxx", ".c"})
#: Path components of vendored third-party trees, not unpacked.
SKIPPED_DIRS = frozenset({"cutlass", "cccl", "spdlog", "3rdparty"})
#: Written into each unpacked tree; bump it when what is unpacked changes.
UNPACK_FORMAT = "stackforge-wheel-tree-1"
_MARKER = ".stackforge-unpacked"


class WheelHashMismatch(StackforgeError):
    """A downloaded file's sha256 differs from the one the index gave: refused, nothing kept."""

    code = "wheel.hash_mismatch"
    exit_code = 1

    def __init__(self, file: ReleaseFile, got: str) -> None:
        super().__init__(f"{file.filename} from {file.url} has sha256 {got}, the index {file.index or 'listing'} "
                         f"says {file.sha256}: refused", remedy="the file or the index is not what it claims; "
                                                             "check the mirror or proxy in between")
        self.file = file
        self.got = got


class WheelFileError(StackforgeError):
    """A downloaded wheel that cannot be unpacked (not a zip, or a member escaping its folder)."""

    code = "wheel.invalid"
    exit_code = 1


def default_root(env: Mapping[str, str] | None = None) -> Path:
    """``$STACKFORGE_WHEEL_CACHE``, else ``~/.cache/stackforge/wheels``."""
    environ = os.environ if env is None else env
    configured = environ.get(CACHE_ENV)
    return Path(configured).expanduser() if configured else Path.home() / ".cache" / "stackforge" / "wheels"


@dataclass(frozen=True, slots=True)
class WheelCache:
    """Where wheels are unpacked, and how they are fetched (the session trusts pip's CA bundle)."""

    root: Path
    indexes: IndexConfig
    session: requests.Session

    @classmethod
    def open(cls, indexes: IndexConfig, root: Path | None = None) -> WheelCache:
        return cls(root=root or default_root(), indexes=indexes, session=new_session(indexes))

    @property
    def index_dir(self) -> Path:
        """Where index pages are cached (beside the wheels, so one folder holds all the tier downloads)."""
        return self.root / "index"

    def cached(self, file: ReleaseFile) -> Path | None:
        """The unpacked tree of ``file`` if it is in the cache."""
        path = self.root / file.sha256 if file.sha256 else None
        return path if path is not None and _complete(path) else None

    def unpacked(self, file: ReleaseFile) -> Path:
        """The folder ``file`` is unpacked in, downloading and unpacking it first if needed.

        Raises:
            IndexUnreachableError: the file could not be fetched (exit 3).
            WheelHashMismatch: its sha256 is not the index's (refused, nothing kept).
            WheelFileError: it is no wheel that can be unpacked safely.
        """
        hit = self.cached(file)
        if hit is not None:
            return hit
        self.root.mkdir(parents=True, exist_ok=True)
        download = Path(tempfile.mkstemp(dir=self.root, prefix=_TMP_PREFIX, suffix=".whl")[1])
        staging: Path | None = None
        try:
            digest = self._download(file, download)
            if file.sha256 and digest != file.sha256.lower():
                raise WheelHashMismatch(file, digest)
            final = self.root / digest
            if _complete(final):
                return final
            staging = Path(tempfile.mkdtemp(dir=self.root, prefix=_TMP_PREFIX))
            if file.kind == "sdist":
                _untar_package(download, staging, file)
            else:
                _unzip(download, staging, file)
            (staging / _MARKER).write_text(UNPACK_FORMAT + "\n")
            staging.chmod(0o755)
            if final.is_dir():   # unpacked by another policy: replaced
                shutil.rmtree(final)
            try:
                os.rename(staging, final)
            except OSError:
                if not final.is_dir():   # not another process that finished the same wheel first
                    raise
            else:
                staging = None
            return final
        finally:
            download.unlink(missing_ok=True)
            if staging is not None:
                shutil.rmtree(staging, ignore_errors=True)

    def _download(self, file: ReleaseFile, into: Path) -> str:
        """Copy ``file`` into ``into``; its sha256 (hex)."""
        digest = hashlib.sha256()
        scheme = urlsplit(file.url).scheme
        try:
            with into.open("wb") as out:
                if scheme in ("http", "https"):
                    with self.session.get(with_credentials(file.url, self.indexes), stream=True,
                                          timeout=DOWNLOAD_TIMEOUT) as response:
                        response.raise_for_status()
                        for chunk in response.iter_content(_CHUNK):
                            digest.update(chunk)
                            out.write(chunk)
                else:
                    source = Path(url2pathname(urlsplit(file.url).path)) if scheme == "file" else Path(file.url)
                    with source.open("rb") as handle:
                        for chunk in iter(lambda: handle.read(_CHUNK), b""):
                            digest.update(chunk)
                            out.write(chunk)
        except (requests.RequestException, OSError) as exc:
            raise IndexUnreachableError(file.url, unreachable_cause(exc, file.url)) from None
        return digest.hexdigest()


def _complete(path: Path) -> bool:
    marker = path / _MARKER
    return marker.is_file() and marker.read_text().strip() == UNPACK_FORMAT


def wanted_member(name: str) -> bool:
    """Whether a wheel member is unpacked (see :data:`SKIPPED_SUFFIXES`, :data:`SKIPPED_DIRS`)."""
    path = PurePosixPath(name)
    return path.suffix.lower() not in SKIPPED_SUFFIXES and not SKIPPED_DIRS.intersection(path.parts[:-1])


def import_names(dist: str) -> tuple[str, ...]:
    """The top-level package an sdist of ``dist`` may hold: ``flashinfer-python`` -> flashinfer_python, flashinfer."""
    plain = dist.replace("-", "_")
    return tuple(dict.fromkeys((plain, dist.removesuffix("-python").replace("-", "_"))))


def _untar_package(sdist: Path, into: Path, file: ReleaseFile) -> None:
    """Unpack the importable package of an sdist (``<top>/<package>/...``) into ``into/<package>/``.

    Only regular files with safe names are written (no links, devices, absolute or ``..`` paths).

    Raises:
        WheelFileError: not a readable tar archive, or no ``<package>/__init__.py`` at its top.
    """
    try:
        with tarfile.open(sdist, mode="r:*") as archive:
            members = archive.getmembers()
            package = _sdist_package(members, file)
            for member in members:
                parts = PurePosixPath(member.name).parts
                if len(parts) < 3 or parts[1] != package or not member.isfile() or ".." in parts \
                        or member.name.startswith("/") or not wanted_member(member.name):
                    continue
                target = into.joinpath(*parts[1:])
                target.parent.mkdir(parents=True, exist_ok=True)
                source = archive.extractfile(member)
                if source is None:
                    continue
                with source, target.open("wb") as out:
                    shutil.copyfileobj(source, out)
    except (tarfile.TarError, EOFError, OSError) as exc:
        raise WheelFileError(f"{file.filename} from {file.url} is not a readable sdist (tar): {exc}") from None


def _sdist_package(members: list[tarfile.TarInfo], file: ReleaseFile) -> str:
    inits = {PurePosixPath(m.name).parts[1] for m in members
             if len(PurePosixPath(m.name).parts) == 3 and PurePosixPath(m.name).name == "__init__.py"}
    found = [name for name in import_names(file.dist) if name in inits]
    if not found:
        raise WheelFileError(f"{file.filename}: unexpected sdist layout: no {' or '.join(import_names(file.dist))}"
                             "/__init__.py at its top")
    return found[0]


def _unzip(wheel: Path, into: Path, file: ReleaseFile) -> None:
    """Unpack ``wheel`` into ``into``; a member that would land outside it is refused (zip-slip)."""
    try:
        with zipfile.ZipFile(wheel) as archive:
            members = archive.infolist()
            for member in members:
                parts = PurePosixPath(member.filename).parts
                if member.filename.startswith("/") or ".." in parts or (parts and ":" in parts[0]):
                    raise WheelFileError(f"{file.filename}: member {member.filename!r} would land outside "
                                         "its folder: refused")
            archive.extractall(into, members=[m for m in members if wanted_member(m.filename)])
    except zipfile.BadZipFile as exc:
        raise WheelFileError(f"{file.filename} from {file.url} is not a wheel (zip): {exc}") from None

