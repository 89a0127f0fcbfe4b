"""Wheels unpacked on disk, content-addressed by the sha256 the index gives: ``<root>/<sha256>/``.

A wheel is downloaded (never installed, no dependencies) into a temporary file inside the cache,
checked against the index's sha256, unpacked into a temporary folder inside the cache and renamed
into place in one step, so ``<root>/<sha256>/`` either holds a whole wheel or does not exist: an
interruption (Ctrl-C, a dead network, a wrong hash) leaves nothing half-written. The downloaded
file is not kept; the unpacked tree is what readers read.

The tree is checked before a reading is trusted, since a reading cites the official wheel's sha256:
while unpacking, each file's sha256 is checked against the wheel's ``RECORD`` (the wheel spec's
urlsafe base64 without padding; a wheel that contradicts its own RECORD is refused) and written into a
manifest of the tree (:data:`MANIFEST_NAME`, :class:`TreeManifest`). :meth:`WheelCache.read` checks
the tree as a whole, runs a reader on it, then hashes each file the reader opened (seen through a
Python audit hook) against the manifest. An edited, deleted or added file throws the reading away: a
one-line warning, the tree is removed, the wheel downloaded and unpacked again, and the reader runs on
the fresh tree. Only the files a reader opens are hashed, so a warm read stays fast. A path a reader
tried to open that neither the tree nor the manifest has is a true reading of absence, not a change.

What a reader did not open can still decide its reading by being absent ("not in this release"), so
the whole tree is checked too, cheaply: a file deleted or added changes its folder's modification time,
and the manifest holds every folder's (and the size of each file at the top of the tree, whose folder
the final rename touches). An SGLang tree has ~600 folders for ~5,000 files. Someone who edits the
cache and restores the folders' times by hand is not what this guards against: the files a reader
opens are hashed whatever their times.

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

import base64
import contextvars
import csv
import hashlib
import io
import json
import os
import shutil
import sys
import tarfile
import tempfile
import threading
import zipfile
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path, PurePosixPath
from typing import TypeVar
from urllib.parse import urlsplit
from urllib.request import url2pathname

import requests

from stackforge.core.errors import EnvironmentFault, StackforgeError
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
#: Written into each unpacked tree; bump it when what is unpacked changes (2: the tree has a manifest).
UNPACK_FORMAT = "stackforge-wheel-tree-2"
_MARKER = ".stackforge-unpacked"
#: Each unpacked file's size and sha256 (as a RECORD writes it), written at unpack time.
MANIFEST_NAME = ".stackforge-manifest.json"
_T = TypeVar("_T")


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
    """Where wheels are unpacked, and how they are fetched (the session trusts pip's CA bundle).

    ``manifests`` and ``hashed`` remember, for this cache object only (one command), the trees found
    whole and the files whose hash matched (by path, size, time and inode), so a tree read many times
    is checked whole once and each file hashed once.
    """

    root: Path
    indexes: IndexConfig
    session: requests.Session
    manifests: dict[Path, TreeManifest] = field(default_factory=dict, compare=False, repr=False)
    hashed: set[tuple[str, int, int, int]] = field(default_factory=set, compare=False, repr=False)

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

    def read(self, file: ReleaseFile, reader: Callable[[Path], _T]) -> _T:
        """``reader``'s answer on the unpacked tree of ``file``, given only when the files it rests on
        are the wheel's (see the module docstring); a tree that differs is unpacked again, with a warning.

        Raises:
            IndexUnreachableError, WheelHashMismatch, WheelFileError: as :meth:`unpacked`; WheelFileError
                also when a freshly unpacked tree still differs from its manifest.
        """
        for attempt in (1, 2):
            root = self.unpacked(file)
            problem = self._tree_problem(root)
            if problem is None:
                with _opened_under(root) as opened:
                    answer = reader(root)
                problem = self._opened_problem(root, opened)
                if problem is None:
                    return answer
            if attempt == 2:
                raise WheelFileError(f"{file.filename}: the unpacked tree {root} differs from the wheel right after "
                                     f"unpacking it ({problem})",
                                     remedy=f"something else writes into {self.root}; stop it, or give "
                                            f"{CACHE_ENV} a folder of its own")
            print(f"stackforge: warning: wheel cache: {file.filename}: {problem}; not read, downloading and "
                  "unpacking it again", file=sys.stderr, flush=True)
            self._discard(root)
        raise AssertionError("unreachable")

    def _tree_problem(self, root: Path) -> str | None:
        """What is wrong with ``root`` as a whole (its manifest unreadable, a file missing or added), or None."""
        if root in self.manifests:
            return None
        try:
            manifest = TreeManifest.read(root)
        except (OSError, ValueError, TypeError, KeyError) as exc:
            return f"its manifest is unreadable ({type(exc).__name__})"
        problem = manifest.problem(root)
        if problem is None:
            self.manifests[root] = manifest
        return problem

    def _opened_problem(self, root: Path, opened: set[str]) -> str | None:
        """What is wrong with the files a reader opened under ``root`` (not the wheel's), or None."""
        manifest = self.manifests[root].files
        base = os.path.abspath(root)
        for path in sorted(opened):
            relative = os.path.relpath(path, base).replace(os.sep, "/")
            if relative in (_MARKER, MANIFEST_NAME) or os.path.isdir(path):
                continue
            try:
                stat = os.stat(path)
            except OSError:
                if relative not in manifest:
                    continue   # a reader that looked for a file the wheel lacks read its absence, truly
                return f"{relative} is missing from the unpacked tree"
            if relative not in manifest:
                return f"{relative} is not in the wheel"
            key = (path, stat.st_size, stat.st_mtime_ns, stat.st_ino)
            if key in self.hashed:
                continue
            if stat.st_size != manifest[relative][0] or _file_hash(Path(path)) != manifest[relative][1]:
                return f"{relative} differs from the wheel's RECORD"
            self.hashed.add(key)
        return None

    def _discard(self, root: Path) -> None:
        """Remove a tree that differs from its wheel: renamed away first, so no reader sees half of it."""
        self.manifests.pop(root, None)
        doomed = Path(tempfile.mkdtemp(dir=self.root, prefix=_TMP_PREFIX))
        try:
            os.rename(root, doomed / "tree")
        except FileNotFoundError:   # another process removed it first
            pass
        shutil.rmtree(doomed, ignore_errors=True)

    def unpacked(self, file: ReleaseFile) -> Path:
        """The folder ``file`` is unpacked in, downloading and unpacking it first if needed.

        Readers go through :meth:`read`, which checks the files they read against the wheel.

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
                manifest = _untar_package(download, staging, file)
            else:
                manifest = _unzip(download, staging, file)
            TreeManifest.of(staging, manifest).write(staging)
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
        """Copy ``file`` into ``into``; its sha256 (hex).

        Raises:
            IndexUnreachableError: the file could not be read from where the index says it is (exit 3).
            EnvironmentFault: the cache could not be written (a full disk is not the network failing; exit 3).
        """
        digest = hashlib.sha256()
        scheme = urlsplit(file.url).scheme
        with into.open("wb") as out:
            def keep(chunk: bytes) -> None:
                digest.update(chunk)
                try:
                    out.write(chunk)
                except OSError as exc:
                    raise EnvironmentFault.from_os_error(exc, doing="writing into the wheel cache") from None
            try:
                if scheme in ("http", "https"):
                    with self.session.get(with_credentials(file.url, self.indexes), stream=True,
                                          timeout=DOWNLOAD_TIMEOUT) as response:
                        response.raise_for_status()
                        for chunk in response.iter_content(_CHUNK):
                            keep(chunk)
                else:
                    source = Path(url2pathname(urlsplit(file.url).path)) if scheme == "file" else Path(file.url)
                    with source.open("rb") as handle:
                        for chunk in iter(lambda: handle.read(_CHUNK), b""):
                            keep(chunk)
            except (requests.RequestException, OSError) as exc:
                raise IndexUnreachableError(file.url, unreachable_cause(exc, file.url)) from None
        return digest.hexdigest()


def _complete(path: Path) -> bool:
    marker = path / _MARKER
    try:
        return marker.read_text().strip() == UNPACK_FORMAT
    except (OSError, UnicodeDecodeError):
        return False


@dataclass(frozen=True, slots=True)
class TreeManifest:
    """What an unpacked tree held when it was unpacked.

    Attributes:
        files: relative path -> (size, ``sha256=<b64>``), each checked against the wheel's RECORD.
        folders: relative path of every folder below the top -> its modification time (ns), taken
            once everything was written.
    """

    files: Mapping[str, tuple[int, str]]
    folders: Mapping[str, int]

    @classmethod
    def of(cls, tree: Path, files: Mapping[str, tuple[int, str]]) -> TreeManifest:
        base = os.path.abspath(tree)
        folders = {}
        for current, names, _ in os.walk(base):
            for name in names:
                path = os.path.join(current, name)
                folders[os.path.relpath(path, base).replace(os.sep, "/")] = os.stat(path).st_mtime_ns
        return cls(dict(files), folders)

    @classmethod
    def read(cls, root: Path) -> TreeManifest:
        path = os.path.join(os.path.abspath(root), MANIFEST_NAME)
        stat = os.stat(path)
        return _parsed_manifest(path, stat.st_size, stat.st_mtime_ns, stat.st_ino)

    def write(self, root: Path) -> None:
        (root / MANIFEST_NAME).write_text(json.dumps({"format": UNPACK_FORMAT, "files": self.files,
                                                      "folders": self.folders}))

    def problem(self, root: Path) -> str | None:
        """A file missing from ``root`` or added to it since it was unpacked, in words; None when none is."""
        base = os.path.abspath(root)
        for relative, mtime in self.folders.items():
            try:
                found = os.stat(f"{base}/{relative}").st_mtime_ns
            except OSError:
                return f"{relative}/ is missing from the unpacked tree"
            if found != mtime:
                return self._changed_in(base, relative)
        for relative, (size, _) in self.files.items():
            if "/" in relative:
                continue   # below the top: its folder's time said whether it is there
            try:
                found = os.stat(f"{base}/{relative}").st_size
            except OSError:
                return f"{relative} is missing from the unpacked tree"
            if found != size:
                return f"{relative} differs from the wheel's RECORD"
        return None

    def _changed_in(self, base: str, folder: str) -> str:
        """What changed in ``folder`` (its time moved): the file missing or added, by name."""
        prefix = f"{folder}/"
        expected = {name[len(prefix):].split("/")[0] for name in [*self.files, *self.folders]
                    if name.startswith(prefix)}
        try:
            present = set(os.listdir(f"{base}/{folder}"))
        except OSError:
            present = set()
        missing, added = sorted(expected - present), sorted(present - expected)
        if missing:
            return f"{prefix}{missing[0]} is missing from the unpacked tree"
        if added:
            return f"{prefix}{added[0]} is not in the wheel"
        return f"files in {prefix} were replaced since it was unpacked"


@lru_cache(maxsize=256)
def _parsed_manifest(path: str, size: int, mtime_ns: int, inode: int) -> TreeManifest:
    """A manifest file parsed, once per process while the file stays the same (a SGLang tree's takes
    ~4 ms to parse, and a search reads its trees many times); the tree itself is checked every time."""
    with open(path, encoding="utf-8") as handle:
        data = json.load(handle)
    if data["format"] != UNPACK_FORMAT:
        raise ValueError(f"manifest format {data['format']!r}")
    return TreeManifest({str(name): (int(size), str(digest)) for name, (size, digest) in data["files"].items()},
                        {str(name): int(mtime) for name, mtime in data["folders"].items()})


def record_hash(digest: bytes) -> str:
    """A sha256 digest as a wheel's RECORD writes it: ``sha256=`` and urlsafe base64 without padding."""
    return "sha256=" + base64.urlsafe_b64encode(digest).rstrip(b"=").decode("ascii")


def _file_hash(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for chunk in iter(lambda: handle.read(_CHUNK), b""):
            digest.update(chunk)
    return record_hash(digest.digest())


def _copy_hashed(source: io.BufferedIOBase | io.RawIOBase, target: Path) -> tuple[int, str]:
    """Copy ``source`` into a new file ``target``; (size, RECORD-style sha256) of what was written."""
    digest, size = hashlib.sha256(), 0
    target.parent.mkdir(parents=True, exist_ok=True)
    with target.open("wb") as out:
        for chunk in iter(lambda: source.read(_CHUNK), b""):
            digest.update(chunk)
            size += len(chunk)
            out.write(chunk)
    return size, record_hash(digest.digest())


def _record_hashes(archive: zipfile.ZipFile) -> dict[str, str]:
    """The sha256 entries of the wheel's ``*.dist-info/RECORD`` (path -> ``sha256=<b64>``); {} without one."""
    names = [n for n in archive.namelist() if n.count("/") == 1 and n.endswith(".dist-info/RECORD")]
    if not names:
        return {}
    text = archive.read(names[0]).decode("utf-8", errors="replace")
    return {row[0]: row[1] for row in csv.reader(io.StringIO(text))
            if len(row) >= 2 and row[1].startswith("sha256=")}


# --------------------------------------------------------------------------- what a reader opens

class _Opened(set[str]):
    """The absolute paths opened under one tree while a reader ran (filled by :func:`_audit`)."""

    def __init__(self, prefix: str) -> None:
        super().__init__()
        self.prefix = prefix


_READING: contextvars.ContextVar[_Opened | None] = contextvars.ContextVar("stackforge_wheel_read", default=None)
_HOOK_LOCK = threading.Lock()
_hooked = False


def _audit(event: str, args: tuple[object, ...]) -> None:
    # Every ``open`` of the process passes here (builtins.open, io.open, os.open): it must stay cheap and
    # never raise, so anything but a path opened while a reading is in progress returns at once.
    if event != "open":
        return
    opened = _READING.get()
    if opened is None or not args or not isinstance(args[0], (str, bytes)):
        return
    path = os.path.abspath(os.fsdecode(args[0]))
    if path.startswith(opened.prefix):
        opened.add(path)


@contextmanager
def _opened_under(root: Path) -> Iterator[_Opened]:
    """Collect the files opened under ``root`` in this thread until the block ends.

    A reader reads through pathlib, ``open`` and ``os`` (and the in-image SGLang helpers), so an audit
    hook sees every file it opens without changing a reader; audit hooks cannot be removed, so one is
    installed once per process and does nothing outside this block.
    """
    global _hooked
    with _HOOK_LOCK:
        if not _hooked:
            sys.addaudithook(_audit)
            _hooked = True
    opened = _Opened(os.path.abspath(root) + os.sep)
    token = _READING.set(opened)
    try:
        yield opened
    finally:
        _READING.reset(token)


def wanted_member(name: str) -> bool:
    """Whether a wheel member is unpacked (see :data:`SKIPPED_SUFFIXES`, :data:`SKIPPED_DIRS`)."""
    path = PurePosixPath(name)
    return path.suffix.lower() not in SKIPPED_SUFFIXES and not SKIPPED_DIRS.intersection(path.parts[:-1])


def import_names(dist: str) -> tuple[str, ...]:
    """The top-level package an sdist of ``dist`` may hold: ``flashinfer-python`` -> flashinfer_python, flashinfer."""
    plain = dist.replace("-", "_")
    return tuple(dict.fromkeys((plain, dist.removesuffix("-python").replace("-", "_"))))


def _untar_package(sdist: Path, into: Path, file: ReleaseFile) -> dict[str, tuple[int, str]]:
    """Unpack the importable package of an sdist (``<top>/<package>/...``) into ``into/<package>/``; the
    manifest of what was written (an sdist has no RECORD: the hashes are those of the checked archive).

    Only regular files with safe names are written (no links, devices, absolute or ``..`` paths).

    Raises:
        WheelFileError: not a readable tar archive, or no ``<package>/__init__.py`` at its top.
    """
    manifest: dict[str, tuple[int, str]] = {}
    try:
        with tarfile.open(sdist, mode="r:*") as archive:
            members = archive.getmembers()
            package = _sdist_package(members, file)
            for member in members:
                parts = PurePosixPath(member.name).parts
                if len(parts) < 3 or parts[1] != package or not member.isfile() or ".." in parts \
                        or member.name.startswith("/") or not wanted_member(member.name):
                    continue
                source = archive.extractfile(member)
                if source is None:
                    continue
                with source:
                    manifest["/".join(parts[1:])] = _copy_hashed(source, into.joinpath(*parts[1:]))
    except (tarfile.TarError, EOFError, OSError) as exc:
        raise WheelFileError(f"{file.filename} from {file.url} is not a readable sdist (tar): {exc}") from None
    return manifest


def _sdist_package(members: list[tarfile.TarInfo], file: ReleaseFile) -> str:
    inits = {PurePosixPath(m.name).parts[1] for m in members
             if len(PurePosixPath(m.name).parts) == 3 and PurePosixPath(m.name).name == "__init__.py"}
    found = [name for name in import_names(file.dist) if name in inits]
    if not found:
        raise WheelFileError(f"{file.filename}: unexpected sdist layout: no {' or '.join(import_names(file.dist))}"
                             "/__init__.py at its top")
    return found[0]


def _unzip(wheel: Path, into: Path, file: ReleaseFile) -> dict[str, tuple[int, str]]:
    """Unpack ``wheel`` into ``into``; the manifest of what was written. A member that would land outside
    ``into`` is refused (zip-slip), and so is a wheel whose file differs from its own ``RECORD``."""
    manifest: dict[str, tuple[int, str]] = {}
    try:
        with zipfile.ZipFile(wheel) as archive:
            members = archive.infolist()
            for member in members:
                parts = PurePosixPath(member.filename).parts
                if member.filename.startswith("/") or ".." in parts or (parts and ":" in parts[0]):
                    raise WheelFileError(f"{file.filename}: member {member.filename!r} would land outside "
                                         "its folder: refused")
            recorded = _record_hashes(archive)
            for member in members:
                if not wanted_member(member.filename):
                    continue
                parts = PurePosixPath(member.filename).parts
                if member.is_dir():
                    into.joinpath(*parts).mkdir(parents=True, exist_ok=True)
                    continue
                with archive.open(member) as source:
                    size, digest = _copy_hashed(source, into.joinpath(*parts))
                expected = recorded.get(member.filename)
                if expected is not None and expected != digest:
                    raise WheelFileError(f"{file.filename}: {member.filename} does not match the wheel's own RECORD "
                                         f"({digest}, RECORD says {expected}): refused")
                manifest["/".join(parts)] = (size, digest)
    except (zipfile.BadZipFile, zipfile.LargeZipFile, EOFError) as exc:
        raise WheelFileError(f"{file.filename} from {file.url} is not a wheel (zip): {exc}") from None
    return manifest

