"""What ``stackforge watch`` saw last: per distribution, the newest release the index had and when.

The state is one JSON file under the results folder (``<results>/watch-state.json``), written
atomically and only when a watch finishes, after its reports: an unreachable index, an interrupted
watch or a report that could not be written leaves the old one. Two watches on one state file do not
interleave: the second waits for the first's lock up to a few seconds, then stops with exit 2 naming
the holder. A state file that does not parse is an error with the remedy, never reset silently (that
would make every release look new, or none): so is a folder where the file belongs, or a seen version
that is not a PEP 440 version.
"""

from __future__ import annotations

import fcntl
import json
import os
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from stackforge.core.envelope import document_text
from stackforge.core.errors import EnvironmentFault, SpecError, StackforgeError
from stackforge.core.fsio import atomic_write_text
from stackforge.core.versions import validate_version

STATE_NAME = "watch-state.json"
STATE_SCHEMA = "stackforge.watch-state/1"
LOCK_WAIT_S = 5.0


class WatchBusyError(StackforgeError):
    """Another watch holds the state file's lock."""

    code = "watch.busy"
    exit_code = 2


@dataclass(frozen=True, slots=True)
class SeenRelease:
    """The newest final release of a distribution at the last watch, and the latest upload seen then.

    ``last_upload`` is the latest upload time of any release the index listed (a yanked one included):
    a release is new when it was uploaded after it, whatever its version (a backport is new; a yanked
    release already reported is not). ``""`` in a state written before it was kept: versions decide.
    """

    version: str
    uploaded: str = ""
    last_upload: str = ""

    def to_json(self) -> dict[str, str]:
        return {"version": self.version, "uploaded": self.uploaded, "last_upload": self.last_upload}


@dataclass(frozen=True, slots=True)
class WatchState:
    """Per distribution the newest release seen, and when the index was last read."""

    seen: Mapping[str, SeenRelease] = field(default_factory=dict)
    checked_at: str = ""
    index: str = ""

    def to_json(self) -> dict[str, Any]:
        return {"schema": STATE_SCHEMA, "checked_at": self.checked_at, "index": self.index,
                "seen": {dist: release.to_json() for dist, release in sorted(self.seen.items())}}


def state_path(results_root: Path) -> Path:
    return results_root / STATE_NAME


def read_state(path: Path) -> WatchState | None:
    """The saved state; ``None`` when there is none yet.

    Raises:
        SpecError: the file is corrupt (exit 2), with the remedy.
    """
    remedy = (f"restore {path} from a backup, or move it away to start over (the next watch then records "
              "a new baseline and reports nothing as new)")
    if not path.exists() and not path.is_symlink():
        return None
    if not path.is_file():   # a folder (or a dangling link) where the state belongs: never read as "no state"
        raise SpecError(f"corrupt watch state {path}: not a file", remedy=remedy)
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        if not isinstance(data, dict) or data.get("schema") != STATE_SCHEMA:
            raise ValueError(f"schema is {data.get('schema') if isinstance(data, dict) else 'missing'!r}, "
                             f"expected {STATE_SCHEMA}")
        seen = {str(dist): _seen_release(dist, item) for dist, item in dict(data.get("seen") or {}).items()}
    except (OSError, ValueError, KeyError, TypeError, AttributeError, RecursionError) as exc:
        raise SpecError(f"corrupt watch state {path}: {type(exc).__name__}: {_short(exc)}", remedy=remedy) from None
    return WatchState(seen, str(data.get("checked_at", "")), str(data.get("index", "")))


def _seen_release(dist: object, item: Any) -> SeenRelease:
    """One entry of ``seen``; its version must parse, or every later watch would stop on it.

    Raises:
        ValueError: the version is not a plain PEP 440 version string (named with the distribution).
    """
    version = item["version"]
    try:
        validate_version(version, what=f"seen[{dist!r}].version")
    except SpecError as exc:
        raise ValueError(exc.message) from None
    last_upload = str(item.get("last_upload", ""))
    if last_upload and upload_instant(last_upload) is None:
        raise ValueError(f"seen[{dist!r}].last_upload {_short(ValueError(last_upload))!r} is not an ISO 8601 time")
    return SeenRelease(str(version), str(item.get("uploaded", "")), last_upload)


def upload_instant(text: str) -> datetime | None:
    """An index's upload time (``2026-08-11T05:18:50.216537Z``) as an aware datetime; None when it is not one.

    Compared as instants, never as strings: indexes differ in fractional seconds and zone spelling."""
    try:
        instant = datetime.fromisoformat(text.strip().replace("Z", "+00:00"))
    except ValueError:
        return None
    return instant if instant.tzinfo is not None else instant.replace(tzinfo=timezone.utc)


def _short(exc: BaseException) -> str:
    """The first line of an error, at most 200 characters: a state file's content never floods the line."""
    text = str(exc).splitlines()[0] if str(exc) else ""
    return text if len(text) <= 200 else text[:197] + "..."


def write_state(path: Path, state: WatchState) -> None:
    atomic_write_text(path, document_text(state.to_json()))


@contextmanager
def state_lock(path: Path, *, wait_s: float = LOCK_WAIT_S) -> Iterator[None]:
    """Hold ``<state>.lock`` for the length of one watch.

    Raises:
        WatchBusyError: another watch held it for ``wait_s`` seconds (exit 2).
        EnvironmentFault: the lock cannot be created (a read-only or full results folder; exit 3).
    """
    lock_file = path.with_name(path.name + ".lock")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        handle = os.open(lock_file, os.O_RDWR | os.O_CREAT, 0o644)
    except OSError as exc:
        raise EnvironmentFault.from_os_error(exc, doing="locking the watch state") from None
    try:
        deadline = time.monotonic() + wait_s
        while True:
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    holder = os.pread(handle, 64, 0).decode(errors="replace").strip() or "unknown"
                    raise WatchBusyError(f"another stackforge watch (pid {holder}) is using {path}",
                                         remedy="wait for it to finish, or give this one another --results") from None
                time.sleep(0.2)
        os.ftruncate(handle, 0)
        os.pwrite(handle, str(os.getpid()).encode(), 0)
        yield
    finally:
        os.close(handle)   # closing the descriptor releases the lock
