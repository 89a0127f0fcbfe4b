"""The ABI reading: do a stack's compiled extensions need torch symbols its pinned torch does not export?

An sgl-kernel / sglang-kernel or flashinfer-jit-cache extension built against another torch fails at
import with ``undefined symbol: _ZN3c10...``. That is visible before any image: the extension's
undefined dynamic symbols that belong to torch (``c10::``, ``at::``, ``torch::``, ``caffe2::``) against
the defined dynamic symbols of the libraries a torch extension links (:data:`TORCH_LIBRARIES`).

Both sides are read from the wheels on the index by HTTP range requests (:mod:`stackforge.edges.ranges`):
the zip's central directory, then each wanted shared object only as far as its dynamic symbol table
(:mod:`stackforge.wheels.elf`). A library whose table lies too deep in a large compressed member
(torch 2.14.1's ``libtorch_cuda.so``: patchelf moved its ``.dynstr`` to the end, 356 MB compressed)
is not read, and the reading says so (:data:`MAX_LIBRARY_FETCH`): a symbol found in none of the
libraries read is then ``undecided``, never ``missing``.

Each wheel's reading is cached by its sha256 in the wheel cache (``<cache>/abi/<sha256>.json``), so a
second run does not touch the network. No CLI code here: :func:`check_stacks` returns an
:class:`AbiReport` whose :meth:`AbiReport.warnings` the commands print.
"""

from __future__ import annotations

import json
import os
import re
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path
from typing import Any
from zipfile import BadZipFile

import requests
from packaging.utils import canonicalize_name

from stackforge.core.errors import StackforgeError
from stackforge.core.fsio import atomic_write_text
from stackforge.core.model import Stack
from stackforge.core.textfit import brief
from stackforge.core.wheel_readings import ReleaseFile
from stackforge.edges.index import (
    IndexConfig,
    IndexUnreachableError,
    file_kind_and_version,
    new_session,
    project_files,
    unreachable_cause,
    with_credentials,
)
from stackforge.edges.ranges import MemberBytes, RemoteZip
from stackforge.edges.runner import run, which
from stackforge.plan.derive import Derived
from stackforge.plan.preflight import Availability, classify_files
from stackforge.wheels.cache import WheelFileError, default_root
from stackforge.wheels.elf import DynamicSymbols, ElfError, dynamic_symbols

#: The libraries a torch C++ extension links (``torch.utils.cpp_extension``: c10, torch, torch_cpu,
#: torch_python, and c10_cuda / torch_cuda for CUDA extensions); a wheel without one (a CPU torch has
#: no ``libtorch_cuda.so``) simply lacks it.
TORCH_LIBRARIES = ("torch/lib/libc10.so", "torch/lib/libc10_cuda.so", "torch/lib/libtorch.so",
                   "torch/lib/libtorch_cpu.so", "torch/lib/libtorch_cuda.so", "torch/lib/libtorch_python.so")
#: A library whose symbol table is not at the front is inflated from the start to its end: done when
#: its member is at most this many compressed bytes. torch 2.14.1's libtorch_cpu.so (121 MB) is read,
#: its libtorch_cuda.so (356 MB, most of the 555 MB wheel) is not.
MAX_LIBRARY_FETCH = 160 << 20
#: Raises (or lowers) that limit, in MiB: ``STACKFORGE_ABI_MAX_LIBRARY_MB=1024`` reads libtorch_cuda.so too.
LIMIT_ENV = "STACKFORGE_ABI_MAX_LIBRARY_MB"
#: How far into an object the front reading looks for its symbol table (and the names behind it).
FRONT_LIMIT = 64 << 20
#: Mangled names of torch's namespaces: functions and data (``_ZN``, ``_ZNK`` const members), vtables,
#: typeinfo and guard variables of its classes.
_TORCH_SYMBOL = re.compile(r"^_Z(?:T[VISHW]|GV)?N[rVKRO]*(?:3c10|2at|5torch|6caffe2)")
#: FlashInfer's own wheel index (flashinfer-jit-cache is not on PyPI); the same URL
#: stackforge.compose.dockerfile installs it from.
FLASHINFER_WHEEL_INDEX = "https://flashinfer.ai/whl"
#: Bump when what a cached reading holds changes.
CACHE_FORMAT = "stackforge-abi-1"
#: The error of a library the wheel does not have (a CPU torch has no libtorch_cuda.so): nothing left unread.
ABSENT = "not in this wheel"
#: How many missing symbols a warning line names.
SHOWN = 3
#: A warning line (after "stackforge: warning: ") stays within 200 characters; the whole finding is in ``--json``.
LINE_LIMIT = 170


class AbiStatus(str, Enum):
    MATCH = "match"            # every torch symbol the object needs is exported by the torch read
    MISSING = "missing"        # some are exported by none of the torch libraries, all of them read
    UNDECIDED = "undecided"    # some are not in the libraries read, and a library was not read


def is_torch_symbol(name: str) -> bool:
    """Whether a mangled name belongs to torch (``c10::``, ``at::``, ``torch::``, ``caffe2::``)."""
    return bool(_TORCH_SYMBOL.match(name))


# --- one wheel read ---------------------------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class LibraryReading:
    """One shared object of a wheel: how its table was found, or why it was not read.

    ``symbols`` are the torch-owned names that matter for its side: exported ones for a torch
    library, needed (undefined) ones for an extension.
    """

    member: str
    symbols: tuple[str, ...] = ()
    located: str = ""
    entries: int = 0
    error: str = ""

    @property
    def read(self) -> bool:
        return not self.error

    @property
    def left_unread(self) -> bool:
        """In the wheel, but not read (past the limit, no table found): what it holds is unknown."""
        return bool(self.error) and self.error != ABSENT

    def to_json(self) -> dict[str, Any]:
        return {"member": self.member, "symbols": list(self.symbols), "located": self.located,
                "entries": self.entries, "error": self.error}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> LibraryReading:
        return cls(member=data["member"], symbols=tuple(data["symbols"]), located=data["located"],
                   entries=int(data["entries"]), error=data["error"])


@dataclass(frozen=True, slots=True)
class WheelAbi:
    """What one wheel's shared objects export (torch) or need (an extension), read by ranges."""

    file: ReleaseFile
    libraries: tuple[LibraryReading, ...]
    requires_torch: tuple[str, ...] = ()     # the ``Requires-Dist: torch...`` lines of its METADATA
    fetched: int = 0                         # bytes this reading fetched (0: from the cache)
    wheel_size: int = 0
    seconds: float = 0.0
    cached: bool = False
    max_library_fetch: int = MAX_LIBRARY_FETCH   # the limit it was read with

    @property
    def label(self) -> str:
        return f"{self.file.dist} {self.file.version}"

    def source(self) -> str:
        return f"wheel: {self.file.url} sha256:{self.file.sha256 or '(none given)'}"

    def to_json(self) -> dict[str, Any]:
        return {"format": CACHE_FORMAT, "filename": self.file.filename, "url": self.file.url,
                "sha256": self.file.sha256, "libraries": [lib.to_json() for lib in self.libraries],
                "requires_torch": list(self.requires_torch), "fetched": self.fetched,
                "wheel_size": self.wheel_size, "seconds": round(self.seconds, 2),
                "max_library_fetch": self.max_library_fetch}


def library_limit(env: dict[str, str] | None = None) -> int:
    """:data:`MAX_LIBRARY_FETCH`, or ``$STACKFORGE_ABI_MAX_LIBRARY_MB`` MiB when that is a whole number."""
    configured = (os.environ if env is None else env).get(LIMIT_ENV, "").strip()
    return int(configured) << 20 if configured.isdigit() else MAX_LIBRARY_FETCH


def read_wheel_abi(file: ReleaseFile, *, side: str, session: requests.Session, cache_root: Path | None,
                   indexes: IndexConfig | None = None, max_library_fetch: int = MAX_LIBRARY_FETCH) -> WheelAbi:
    """The torch side (``side="torch"``: :data:`TORCH_LIBRARIES`' exports) or the extension side
    (``side="extension"``: every ``.so``'s needs, and the METADATA's torch requirement) of one wheel.

    Raises:
        IndexUnreachableError: the wheel could not be fetched.
        WheelFileError: it is no zip this reader can walk.
    """
    cached = _cached(file, cache_root, max_library_fetch)
    if cached is not None:
        return cached
    started = time.monotonic()
    url = with_credentials(file.url, indexes) if indexes is not None else file.url
    try:
        remote = RemoteZip(url, session=session, display_url=file.url)
        if side == "torch":
            wanted, expected = (lambda name: name in TORCH_LIBRARIES), TORCH_LIBRARIES
        else:
            wanted, expected = (lambda name: name.endswith(".so") or _is_metadata(name)), ()
        sizes = {m.name: m.compressed_size for m in remote.members()} if remote.ranged else {}
        read = remote.read_members(wanted, lambda data: _read_member(data, side, sizes, max_library_fetch),
                                   expected=expected)
    except BadZipFile as exc:
        raise WheelFileError(f"{file.filename} from {file.url}: {exc}") from None
    libraries = tuple(value for name, value in sorted(read.items()) if isinstance(value, LibraryReading))
    if side == "torch":   # the central directory (or a stream walked to its end) lists every member
        libraries += tuple(LibraryReading(name, error=ABSENT) for name in TORCH_LIBRARIES
                           if name not in read)
    metadata = next((value for value in read.values() if isinstance(value, str)), "")
    result = WheelAbi(file=file, libraries=tuple(sorted(libraries, key=lambda lib: lib.member)),
                      requires_torch=_torch_requirements(metadata), fetched=remote.fetched,
                      wheel_size=remote.size or 0, seconds=time.monotonic() - started,
                      max_library_fetch=max_library_fetch)
    _store(result, cache_root)
    return result


def _read_member(data: MemberBytes, side: str, sizes: dict[str, int], max_fetch: int) -> LibraryReading | str:
    name = data.member.name
    if _is_metadata(name):
        return data.prefix(data.size).decode("utf-8", errors="replace")
    compressed = sizes.get(name, data.member.compressed_size)
    limit = data.size if compressed <= max_fetch else min(FRONT_LIMIT, data.size)
    try:
        table = dynamic_symbols(data.at, limit=limit)
    except (ElfError, EOFError, ValueError) as exc:
        why = str(exc)
        if limit < data.size:   # the key fact first: the limit, then what the front held
            why = (f"{compressed / 1e6:.0f} MB compressed, over the {max_fetch >> 20} MiB read per library "
                   f"({LIMIT_ENV} raises it), and its table is not at the front: {why}")
        return LibraryReading(name, error=why)
    return LibraryReading(name, symbols=_side_symbols(table, side), located=table.located, entries=table.count)


def _side_symbols(table: DynamicSymbols, side: str) -> tuple[str, ...]:
    names = table.defined if side == "torch" else table.undefined
    return tuple(sorted(n for n in names if is_torch_symbol(n)))


def _is_metadata(name: str) -> bool:
    return name.count("/") == 1 and name.endswith(".dist-info/METADATA")


def _torch_requirements(metadata: str) -> tuple[str, ...]:
    lines = (line.partition(":")[2].strip() for line in metadata.splitlines() if line.startswith("Requires-Dist:"))
    return tuple(line for line in lines if re.match(r"torch\b(?![-_.])", line))


def _cache_path(file: ReleaseFile, root: Path | None) -> Path | None:
    return root / "abi" / f"{file.sha256}.json" if root is not None and file.sha256 else None


def _cached(file: ReleaseFile, root: Path | None, max_library_fetch: int) -> WheelAbi | None:
    """The stored reading of ``file``; one that left a library unread under another limit is read again."""
    path = _cache_path(file, root)
    if path is None or not path.is_file():
        return None
    try:
        data = json.loads(path.read_text())
        if data.get("format") != CACHE_FORMAT:
            return None
        libraries = tuple(LibraryReading.from_json(lib) for lib in data["libraries"])
        unread = any(lib.left_unread for lib in libraries)
        if unread and data.get("max_library_fetch") != max_library_fetch:
            return None
        return WheelAbi(file=file, libraries=libraries, requires_torch=tuple(data["requires_torch"]), fetched=0,
                        wheel_size=int(data.get("wheel_size", 0)), seconds=0.0, cached=True,
                        max_library_fetch=int(data["max_library_fetch"]))
    except (OSError, ValueError, KeyError, TypeError):
        return None   # a damaged entry is read again


def _store(result: WheelAbi, root: Path | None) -> None:
    path = _cache_path(result.file, root)
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_text(path, json.dumps(result.to_json()))


# --- one extension object against one torch ----------------------------------------------------------

@dataclass(frozen=True, slots=True)
class AbiFinding:
    """One extension shared object against the torch a stack pins."""

    stacks: tuple[str, ...]
    torch: str                       # "2.14.1+cu130"
    extension: WheelAbi
    torch_wheel: WheelAbi
    member: str
    status: AbiStatus
    missing: tuple[str, ...] = ()    # mangled names found in no torch library read
    demangled: tuple[str, ...] = ()  # the same, demangled (c++filt), or () without c++filt
    needed: int = 0
    why: str = ""                    # what left it undecided

    def line(self) -> str:
        """The warning line: ``abi: <object> (<dist> <version>) needs N symbols torch X does not export: ...``."""
        names = self.demangled or self.missing
        shown = ", ".join(names[:SHOWN]) + (f" (+{len(names) - SHOWN} more)" if len(names) > SHOWN else "")
        head = f"abi: {self.member} ({self.extension.label})"
        if self.status is AbiStatus.MISSING:
            return brief(f"{head} needs {len(self.missing)} symbol(s) torch {self.torch} does not export: {shown}",
                         LINE_LIMIT)
        return brief(f"{head} against torch {self.torch} undecided: {self.why}", LINE_LIMIT)

    def evidence(self) -> tuple[str, ...]:
        lines = [self.line(), f"  stacks: {', '.join(self.stacks)}",
                 f"  needs {self.needed} torch symbol(s); torch libraries read: "
                 + "; ".join(f"{lib.member.rpartition('/')[2]} ({len(lib.symbols)} exported, {lib.located})"
                             if lib.read else f"{lib.member.rpartition('/')[2]} not read: {lib.error}"
                             for lib in self.torch_wheel.libraries)]
        if self.extension.requires_torch:
            lines.append(f"  {self.extension.label} METADATA: Requires-Dist: {', '.join(self.extension.requires_torch)}")
        lines += [f"  missing: {mangled}" + (f" = {plain}" if plain != mangled else "")
                  for mangled, plain in zip(self.missing, self.demangled or self.missing)]
        lines += [f"  {self.extension.source()}", f"  {self.torch_wheel.source()}"]
        return tuple(lines)

    def to_json(self) -> dict[str, Any]:
        return {"stacks": list(self.stacks), "torch": self.torch, "package": self.extension.file.dist,
                "version": self.extension.file.version, "member": self.member, "status": self.status.value,
                "needed": self.needed, "missing": list(self.missing), "demangled": list(self.demangled),
                "why": self.why, "requires_torch": list(self.extension.requires_torch),
                "extension_wheel": self.extension.to_json() | {"libraries": None},
                "torch_wheel": self.torch_wheel.to_json() | {"libraries": None}}


def compare(extension: WheelAbi, torch_wheel: WheelAbi, *, torch: str, stacks: Sequence[str] = (),
            demangle: Callable[[Sequence[str]], tuple[str, ...]] | None = None) -> tuple[AbiFinding, ...]:
    """Each shared object of ``extension`` against the exports of ``torch_wheel`` (pure, no network)."""
    exported = {name for lib in torch_wheel.libraries if lib.read for name in lib.symbols}
    unread = [lib for lib in torch_wheel.libraries if lib.left_unread]
    findings = []
    for lib in extension.libraries:
        base: dict[str, Any] = {"stacks": tuple(stacks), "torch": torch, "extension": extension,
                                "torch_wheel": torch_wheel, "member": lib.member, "needed": len(lib.symbols)}
        if not lib.read:
            findings.append(AbiFinding(**base, status=AbiStatus.UNDECIDED, why=f"the object was not read: {lib.error}"))
            continue
        missing = tuple(name for name in lib.symbols if name not in exported)
        if not missing:
            findings.append(AbiFinding(**base, status=AbiStatus.MATCH))
        elif unread:
            names = ", ".join(u.member.rpartition("/")[2] for u in unread)
            findings.append(AbiFinding(**base, status=AbiStatus.UNDECIDED, missing=missing,
                                       demangled=demangle(missing) if demangle else (),
                                       why=f"{len(missing)} of its {len(lib.symbols)} torch symbol(s) are in none of "
                                           f"the libraries read, and {names} was not read ({unread[0].error})"))
        else:
            findings.append(AbiFinding(**base, status=AbiStatus.MISSING, missing=missing,
                                       demangled=demangle(missing) if demangle else ()))
    return tuple(findings)


def demangle(names: Sequence[str]) -> tuple[str, ...]:
    """``c++filt`` of each name, or () when c++filt is not on PATH or fails (the mangled names stand)."""
    if not names or which("c++filt") is None:
        return ()
    try:
        result = run(["c++filt"], timeout=30, input_text="\n".join(names) + "\n", tail_chars=1 << 22)
    except StackforgeError:
        return ()
    lines = result.output_tail.splitlines()
    return tuple(lines) if result.succeeded and len(lines) == len(names) else ()


# --- the stacks of a plan ----------------------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class AbiReport:
    """The ABI reading of some stacks: one finding per extension object, and what was skipped and why."""

    findings: tuple[AbiFinding, ...] = ()
    skipped: tuple[str, ...] = ()
    wheels: tuple[WheelAbi, ...] = field(default=())

    def warnings(self) -> tuple[str, ...]:
        """A line per object that needs what its torch does not export, one per extension wheel and torch
        whose objects stay undecided, one per reading skipped; () when all match."""
        lines = [f.line() for f in self.findings if f.status is AbiStatus.MISSING]
        undecided: dict[tuple[str, str], list[AbiFinding]] = {}
        for finding in self.findings:
            if finding.status is AbiStatus.UNDECIDED:
                undecided.setdefault((finding.extension.label, finding.torch), []).append(finding)
        lines += [_undecided_line(label, torch, found) for (label, torch), found in undecided.items()]
        lines += [f"abi: reading skipped: {why}" for why in self.skipped]
        return tuple(dict.fromkeys(lines))

    def to_json(self) -> dict[str, Any]:
        return {"findings": [f.to_json() for f in self.findings], "skipped": list(self.skipped),
                "fetched": sum(w.fetched for w in self.wheels)}


def _undecided_line(label: str, torch: str, found: Sequence[AbiFinding]) -> str:
    """One line for an extension wheel's objects left undecided against one torch."""
    names = list(dict.fromkeys(n for f in found for n in (f.demangled or f.missing)))
    shown = ", ".join(names[:SHOWN]) + (f" (+{len(names) - SHOWN} more)" if len(names) > SHOWN else "")
    unread = [lib for lib in found[0].torch_wheel.libraries if lib.left_unread]
    # The first clause of each reason (its size against the limit); the whole reason is in --json.
    why = "; ".join(f"{lib.member.rpartition('/')[2]} not read: {re.split(r'[,;(]', lib.error, 1)[0].strip()}"
                    for lib in unread)
    objects = list(dict.fromkeys(f.member for f in found if f.missing))
    if not objects:   # the objects themselves could not be read
        return f"abi: {label} against torch {torch} undecided for {len(found)} object(s): {found[0].why}"
    return brief(f"abi: {label} vs torch {torch} undecided ({why}): {len(names)} symbol(s) of {len(objects)} "
                 f"object(s) in no library read; first: {shown}", LINE_LIMIT)


@dataclass(frozen=True, slots=True)
class _Wanted:
    dist: str
    version: str
    primary: str        # "pypi" or an index URL
    python: str


def extension_wheels(stack: Stack, derived: Derived) -> tuple[_Wanted, ...]:
    """The compiled extensions a stack installs: its kernel package and, with that addon, flashinfer-jit-cache.
    (DeepGEMM is pinned by no stack here; sglang-kernel carries its own copy.)"""
    wanted = []
    if derived.kernel_package and derived.kernel_version:
        wanted.append(_Wanted(derived.kernel_package, derived.kernel_version, "pypi", stack.python))
    if "jit-cache" in stack.flashinfer_addons and derived.torch_variant.startswith("cu"):
        wanted.append(_Wanted("flashinfer-jit-cache", stack.flashinfer,
                              f"{FLASHINFER_WHEEL_INDEX}/{derived.torch_variant}", stack.python))
    return tuple(wanted)


def check_stacks(cells: Iterable[tuple[Stack, Derived]], *, indexes: IndexConfig,
                 cache_root: Path | None = None, session: requests.Session | None = None,
                 max_library_fetch: int | None = None) -> AbiReport:
    """The ABI reading of each stack's extensions against its pinned torch.

    Never raises for the network or a bad wheel: what could not be read is in :attr:`AbiReport.skipped`
    (one line each), and the rest is still read.
    """
    root = cache_root if cache_root is not None else default_root()
    session = session or new_session(indexes)
    limit = library_limit() if max_library_fetch is None else max_library_fetch
    pairs: dict[tuple[_Wanted, _Wanted, str], list[str]] = {}
    for stack, derived in cells:
        torch = _Wanted("torch", stack.torch, derived.torch_index_url or "pypi", stack.python)
        label = f"{stack.torch}+{derived.torch_variant}"
        for extension in extension_wheels(stack, derived):
            pairs.setdefault((extension, torch, label), []).append(stack.id)
    read: dict[_Wanted, WheelAbi | str] = {}
    findings: list[AbiFinding] = []
    skipped: list[str] = []
    for (extension, torch, label), stacks in pairs.items():
        sides = [_read_once(w, side, read, indexes=indexes, session=session, root=root, limit=limit)
                 for w, side in ((extension, "extension"), (torch, "torch"))]
        problems = [s for s in sides if isinstance(s, str)]
        if problems:
            skipped.extend(p for p in problems if p not in skipped)
            continue
        ext_abi, torch_abi = sides
        assert isinstance(ext_abi, WheelAbi) and isinstance(torch_abi, WheelAbi)
        findings += compare(ext_abi, torch_abi, torch=label, stacks=stacks, demangle=demangle)
    return AbiReport(tuple(findings), tuple(skipped), tuple(w for w in read.values() if isinstance(w, WheelAbi)))


def _read_once(wanted: _Wanted, side: str, read: dict[_Wanted, WheelAbi | str], *, indexes: IndexConfig,
               session: requests.Session, root: Path, limit: int) -> WheelAbi | str:
    if wanted not in read:
        try:
            file = find_wheel(wanted, indexes=indexes, session=session, cache=root / "index")
            read[wanted] = read_wheel_abi(file, side=side, session=session, cache_root=root, indexes=indexes,
                                          max_library_fetch=limit)
        except StackforgeError as exc:
            read[wanted] = f"{wanted.dist} {wanted.version}: {exc.one_line()}"
        except OSError as exc:   # a find-links file that went away, a cache folder that cannot be written
            read[wanted] = f"{wanted.dist} {wanted.version}: {type(exc).__name__}: {exc}"
    return read[wanted]


def find_wheel(wanted: _Wanted, *, indexes: IndexConfig, session: requests.Session, cache: Path) -> ReleaseFile:
    """The wheel pip would take for ``wanted`` on linux x86_64 (the first location with a fitting one).

    Raises:
        IndexUnreachableError: a location did not answer and none had the wheel.
        WheelFileError: no fitting wheel anywhere.
    """
    project = str(canonicalize_name(wanted.dist))
    unreachable: IndexUnreachableError | None = None
    for source in indexes.sources(wanted.primary):
        try:
            entries = project_files(source, project, session=session, cache=cache) or []
        except (requests.RequestException, OSError, ValueError) as exc:
            unreachable = unreachable or IndexUnreachableError(source.location, unreachable_cause(exc, source.location))
            continue
        ours = {e.filename: e for e in entries if (file_kind_and_version(e.filename, project) or ("", None))[0] == "wheel"}
        status, chosen = classify_files(ours, wanted.version, wanted.python)
        if status is Availability.AVAILABLE:
            entry = ours[chosen]
            return ReleaseFile(dist=project, version=wanted.version, filename=entry.filename, url=entry.url,
                               sha256=entry.sha256, index=source.location)
    if unreachable is not None:
        raise unreachable
    raise WheelFileError(f"no {wanted.dist}=={wanted.version} wheel for Python {wanted.python} on linux x86_64 "
                         f"at {indexes.describe() if wanted.primary == 'pypi' else wanted.primary}")
