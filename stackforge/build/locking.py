"""Resolve each stack's lock on the host before any image work, and keep it (``<out>/locks/<stack>/``).

A stack's lock (:mod:`stackforge.compose.stack_lock`) is resolved in up to three calls of the resolver
(:mod:`stackforge.edges.resolver`), each a few seconds:

1. torch alone, from the index the image takes it from: what it resolves to is the torch layer, the
   same for every stack that locks the same torch;
2. every requirement installed with its dependencies, the torch layer's pins as constraints; when
   that fails, once more without them (the torch layer then takes the full resolution's versions, and
   the lock's notes say so), and when that fails too, the stack is refused with the resolver's words;
3. the packages installed exactly (the toolkit, ``--no-deps`` layers), without dependencies.

The lock modes (``stackforge build``): ``resolve`` reuses a recorded lock made for the same inputs (after
checking its sha256s against the index pages) and resolves otherwise; ``locked`` resolves afresh and refuses when the index now answers differently from
the recorded lock (naming what moved); ``relock`` resolves afresh and records it.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from urllib.parse import unquote, urlsplit

import requests
from dataclasses import dataclass, replace
from enum import Enum
from pathlib import Path

from stackforge.compose.dockerfile import ComposeOptions, lock_request
from stackforge.compose.stack_lock import (
    LOCK_FILE,
    LockRequest,
    StackLock,
    assign_layers,
    check_lock_matches,
    lock_changes,
    packages_from_pylock,
    read_stack_lock,
    stack_lock_text,
)
from stackforge.core.errors import SpecError, StackforgeError
from stackforge.core.fsio import atomic_write_text
from stackforge.core.textfit import brief
from stackforge.core.model import Stack
from stackforge.edges.index import IndexSource, project_files
from stackforge.edges.pip_config import PYPI_SIMPLE, without_credentials
from stackforge.edges.resolver import ResolutionConflict, ResolverIndexes, compile_pylock, uv_version
from stackforge.plan.derive import Derived, load_tables


class LockMode(str, Enum):
    """How ``stackforge build`` treats each stack's lock."""

    OFF = "off"            # no lock: each layer's pip resolves on its own (the old way)
    RESOLVE = "resolve"    # reuse a recorded lock made for the same inputs, else resolve and record
    LOCKED = "locked"      # the recorded lock must still be what the index resolves to; else refuse
    RELOCK = "relock"      # resolve afresh and record


@dataclass(frozen=True, slots=True)
class LockOutcome:
    """A stack's lock and how it was had (``recorded`` / ``resolved`` / ``checked``), for the log."""

    lock: StackLock
    how: str
    path: Path
    seconds: float

    def line(self) -> str:
        took = f" in {self.seconds:.1f} s" if self.how != "recorded" else ""
        notes = "".join(f"; {brief(note, 150)}" for note in self.lock.notes)   # whole in the lock file
        return (f"lock {self.how}{took}: {len(self.lock.packages)} packages, sha256 {self.lock.sha256()[:12]} "
                f"({self.path}){notes}")


def lock_stacks(cells: Sequence[tuple[Stack, Derived]], mode: LockMode, *, out_dir: Path, compose: ComposeOptions,
                indexes: ResolverIndexes, timeout: float = 300.0) -> dict[str, LockOutcome]:
    """Every stack's lock under ``mode``, before any image work (empty when locks are off).

    ``compose`` says how the images install (indexes, wheelhouse, ``--no-deps`` layers), ``indexes``
    where the resolver looks (the same places). The first stack that cannot be locked stops the run:
    a conflict is exit 2, an unreachable index exit 3, each naming the stack; no image has been started.
    """
    if mode is LockMode.OFF:
        return {}
    glibc_of = load_tables().os_glibc
    outcomes = {}
    for stack, derived in cells:
        request = _request(stack, derived, compose, indexes, glibc_of)
        log = Path(out_dir) / "logs" / f"{stack.id}.lock.log"
        try:
            outcomes[stack.id] = obtain_lock(request, mode, Path(out_dir), indexes, log_path=log, timeout=timeout)
        except StackforgeError as exc:
            exc.message = f"stack {stack.id}: {exc.message}"
            exc.args = (exc.message,)
            raise
    return outcomes


@dataclass(frozen=True, slots=True)
class LockCheck:
    """``plan --preflight``: one stack resolved (``lock``) or refused (``error``, the resolver's words)."""

    stack_id: str
    seconds: float
    lock: StackLock | None = None
    error: StackforgeError | None = None

    def line(self) -> str:
        if self.lock is not None:
            return f"  resolved    {self.stack_id}  {len(self.lock.packages)} packages in {self.seconds:.1f} s"
        assert self.error is not None
        return f"  refused     {self.stack_id}  after {self.seconds:.1f} s: {self.error.one_line()}"

    def to_json(self) -> dict[str, object]:
        return {"stack_id": self.stack_id, "seconds": round(self.seconds, 2),
                "status": "resolved" if self.lock is not None else "refused",
                "packages": len(self.lock.packages) if self.lock is not None else None,
                "error": self.error.one_line() if self.error is not None else None}


def check_locks(cells: Sequence[tuple[Stack, Derived]], *, compose: ComposeOptions, indexes: ResolverIndexes,
                timeout: float = 300.0) -> list[LockCheck]:
    """Resolve every stack (nothing recorded): which resolve, in how long, and which the resolver refuses.

    A conflict is reported per stack and the others go on; an index the host cannot reach stops it
    (HostError, exit 3): every later stack would fail the same way.
    """
    glibc_of = load_tables().os_glibc
    checks = []
    for stack, derived in cells:
        started = time.monotonic()
        try:
            lock = resolve_lock(_request(stack, derived, compose, indexes, glibc_of), indexes, timeout=timeout)
            checks.append(LockCheck(stack.id, time.monotonic() - started, lock=lock))
        except SpecError as exc:
            checks.append(LockCheck(stack.id, time.monotonic() - started, error=exc))
    return checks


def _request(stack: Stack, derived: Derived, compose: ComposeOptions, indexes: ResolverIndexes,
             glibc_of: dict[str, str]) -> LockRequest:
    """What ``stack`` asks the resolver for, on the platform of its base OS's glibc."""
    if stack.os not in glibc_of:
        raise SpecError(f"stack {stack.id}: no glibc is known for {stack.os}, so its lock has no platform",
                        remedy="add the OS to compat/tables.yaml os_glibc (with a source), or build with --no-lock")
    return lock_request(stack, derived, compose, glibc=glibc_of[stack.os], find_links=indexes.find_links)


def lock_path(out_dir: Path, stack_id: str) -> Path:
    """Where a stack's lock is recorded: ``<out>/locks/<stack-id>/pylock.toml``."""
    return Path(out_dir) / "locks" / stack_id / LOCK_FILE


def resolve_lock(request: LockRequest, indexes: ResolverIndexes, *, log_path: Path | None = None,
                 timeout: float = 300.0) -> StackLock:
    """Resolve ``request`` afresh (the three steps in the module's docstring).

    Raises:
        ResolutionConflict: the stack's requirements cannot be satisfied together (exit 2).
        HostError: an index could not be reached (exit 3).
    """
    def resolved(requirements: Sequence[str], where: ResolverIndexes, what: str, **options: object) -> list:
        if not requirements:
            return []
        text = compile_pylock(requirements, python=request.python, platform=request.platform, indexes=where,
                              log_path=log_path, timeout=timeout, **options)
        return packages_from_pylock(text, source=f"the resolver's answer for {what}")

    torch_index = request.torch_index_url
    torch_set = resolved(dict(request.layers).get("torch", ()),
                         replace(indexes, index_url=torch_index, extra_index_urls=(), find_links=()) if torch_index
                         else indexes, "torch")
    rest_indexes = (replace(indexes, extra_index_urls=(*indexes.extra_index_urls, torch_index)) if torch_index
                    else indexes)
    notes: list[str] = []
    try:
        stack = resolved(request.requirements(), rest_indexes, "the stack", constraints=[p.pin() for p in torch_set])
        torch_files = {p.name: p for p in torch_set}
    except ResolutionConflict as conflict:
        stack = resolved(request.requirements(), rest_indexes, "the stack")
        notes.append("the torch layer holds the full resolution's versions: torch alone resolves to versions the "
                     f"rest does not accept ({conflict.explanation})")
        torch_files = {}
    exact = resolved(request.requirements(exact=True), indexes, "the exact packages", no_deps=True)
    lock = StackLock(stack_id=request.stack_id, request_key=request.key(), python=request.python,
                     platform=request.platform, resolver=uv_version(), notes=tuple(notes),
                     packages=assign_layers(request, [torch_files.get(p.name, p) for p in stack],
                                            {p.name for p in torch_set}, exact))
    if lock.unhashed:
        lock = replace(lock, notes=(*lock.notes, f"the index gave no sha256 for: {', '.join(lock.unhashed)}"))
    return lock


def obtain_lock(request: LockRequest, mode: LockMode, out_dir: Path, indexes: ResolverIndexes, *,
                log_path: Path | None = None, timeout: float = 300.0) -> LockOutcome:
    """The stack's lock under ``mode`` (not OFF), recorded under ``out_dir``.

    Raises:
        SpecError: a recorded lock edited into an inconsistent state (with its line); ``locked`` with no
            recorded lock, a stale or unhashed one, or an index that now resolves differently.
        ResolutionConflict / HostError: from the resolver.
    """
    path = lock_path(out_dir, request.stack_id)
    recorded = _recorded(path)
    started = time.monotonic()
    if mode is LockMode.RESOLVE and recorded is not None and recorded.request_key == request.key():
        check_lock_matches(recorded, request, text=_recorded_text(path) or "", source=str(path))
        # A hand-edited sha256 would otherwise surface only inside the image, as pip's hash error.
        check_recorded_hashes(recorded, request, indexes, source=str(path))
        return LockOutcome(recorded, "recorded", path, time.monotonic() - started)
    if mode is LockMode.LOCKED:
        return _checked(request, recorded, path, indexes, log_path=log_path, timeout=timeout)
    fresh = resolve_lock(request, indexes, log_path=log_path, timeout=timeout)
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(path, fresh.to_toml())
    return LockOutcome(fresh, "resolved", path, time.monotonic() - started)


def check_recorded_hashes(lock: StackLock, request: LockRequest, indexes: ResolverIndexes, *, source: str,
                          session: requests.Session | None = None, cache: Path | None = None) -> None:
    """Every recorded file's sha256 against the one its index lists for the same file (the same URL: a
    wheelhouse may hold another build under a name PyPI also has).

    A file no location lists, or a location that does not answer, is not checked here (the image's
    ``--require-hashes`` install still is); the index pages come from the preflight's on-disk cache.

    Raises:
        SpecError: a recorded sha256 differs from the index's (exit 2), naming the file and both hashes.
    """
    locations = [*([IndexSource(request.torch_index_url, index=True)] if request.torch_index_url else []),
                 IndexSource(indexes.index_url or PYPI_SIMPLE, index=True),
                 *(IndexSource(url, index=True) for url in indexes.extra_index_urls),
                 *(IndexSource(location, index=False) for location in indexes.find_links)]
    session = session or requests.Session()
    if indexes.ca_bundle is not None:
        session.verify = str(indexes.ca_bundle)
    cache = cache or Path.home() / ".cache" / "stackforge" / "preflight"
    silent: set[str] = set()   # locations that did not answer: asked once, not once per package
    for package in lock.packages:
        recorded = {_same_file(f.location): f.sha256 for f in package.files if f.sha256}
        if recorded:
            _compare_hashes(package.name, recorded, locations, session=session, cache=cache, source=source,
                            silent=silent)


def _compare_hashes(project: str, recorded: dict[str, str], locations: Sequence[IndexSource], *,
                    session: requests.Session, cache: Path, source: str, silent: set[str]) -> None:
    for location in locations:
        if location.location in silent:
            continue
        try:
            entries = project_files(location, project, session=session, cache=cache) or []
        except (requests.RequestException, OSError, ValueError):
            silent.add(location.location)   # the install inside the image still checks every hash
            continue
        listed = {_same_file(entry.url): entry.sha256 for entry in entries if entry.sha256}
        for url, sha256 in recorded.items():
            if url in listed and listed[url] != sha256:
                raise SpecError(f"the lock's sha256 of {_file_name(url)} ({sha256[:16]}...) is not the one "
                                f"{without_credentials(location.location)} lists ({listed[url][:16]}...)",
                                source=source, remedy="resolve it again with stackforge build --relock")
        if recorded.keys() <= listed.keys():
            return


def _same_file(location: str) -> str:
    """A file's URL as compared: no fragment, percent-escapes undone (``%2B`` and ``+`` name one file)."""
    return unquote(location.partition("#")[0])


def _file_name(location: str) -> str:
    """The file name at the end of a lock's file location (a URL or a path)."""
    return unquote(urlsplit(location).path.rsplit("/", 1)[-1])


def _checked(request: LockRequest, recorded: StackLock | None, path: Path, indexes: ResolverIndexes, *,
             log_path: Path | None, timeout: float) -> LockOutcome:
    """``--locked``: the recorded lock, after checking the index still resolves the stack to it."""
    if recorded is None:
        raise SpecError(f"--locked: stack {request.stack_id} has no recorded lock ({path})",
                        remedy="record one with stackforge build --relock")
    check_lock_matches(recorded, request, text=_recorded_text(path) or "", source=str(path))
    if recorded.unhashed:
        raise SpecError(f"--locked: the lock of {request.stack_id} has no sha256 for "
                        f"{', '.join(recorded.unhashed)} (the index gave none)", source=str(path),
                        remedy="use an index that serves hashes (PEP 503/691), or build without --locked")
    started = time.monotonic()
    fresh = resolve_lock(request, indexes, log_path=log_path, timeout=timeout)
    moved = lock_changes(recorded, fresh)
    if moved:
        shown = "; ".join(moved[:8]) + (f"; and {len(moved) - 8} more" if len(moved) > 8 else "")
        raise SpecError(f"--locked: the index now resolves {request.stack_id} differently from its lock: {shown}",
                        source=str(path), remedy="stackforge build --relock takes the new set")
    return LockOutcome(recorded, "checked", path, time.monotonic() - started)


def _recorded(path: Path) -> StackLock | None:
    """The recorded lock, None when there is none; a corrupt one raises (it is never replaced silently)."""
    text = _recorded_text(path)
    return None if text is None else read_stack_lock(text, source=str(path))


def _recorded_text(path: Path) -> str | None:
    """The recorded lock's text, None when there is none; a folder in its place or a file that is not UTF-8
    raises SpecError with the path (exit 2), before any resolving."""
    if path.is_dir():
        raise SpecError("a folder stands where the stack lock belongs", source=str(path),
                        remedy="remove it; the next build records the lock there")
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return None
    return stack_lock_text(data, source=str(path))
