"""Build records: one versioned JSON file per stack (``<out>/builds/<stack-id>.json``).

A record says what was built and how: the stack and its derived facts, the image (tag, id, digest,
size), the base image asked for and the one actually used, the builder, per-phase durations, the
log, and what verification found *inside* the image (installed versions), not what the tag says.
Records are written atomically (temporary file + ``os.replace``) so an interrupted run never leaves a
half-written record behind.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from enum import Enum
from pathlib import Path
from typing import Any

from stackforge.core.envelope import check_envelope, document_text
from stackforge.core.errors import RecordError
from stackforge.core.fsio import atomic_write_text

BUILD_SCHEMA = "stackforge.build"
BUILD_SCHEMA_VERSION = 1


class BuildStatus(str, Enum):
    """How one stack's build ended."""

    BUILT = "built"              # the builder ran and produced a verified image
    CACHED = "cached"            # nothing to do: --resume found the image, or every layer was cached
    FAILED = "failed"            # the build, the base image, or verification failed (see reason)
    SKIPPED = "skipped"          # not attempted (the run was interrupted before it started)
    INTERRUPTED = "interrupted"  # Ctrl-C while it was building; its build process was stopped

    @property
    def ok(self) -> bool:
        """True for statuses that leave a usable image behind."""
        return self in (BuildStatus.BUILT, BuildStatus.CACHED)


@dataclass(frozen=True, slots=True)
class BaseImage:
    """The base image: what the stack asked for and what the build really started FROM.

    Attributes:
        requested: the derived base (or ``--base-image``).
        used: the reference in the Dockerfile's FROM line.
        how: ``local`` (present), ``pulled``, ``override`` (``--base-image``) or ``substituted``
            (the requested base could not be had; an equivalent local one was used instead).
        image_id / digest: of the image used (digest only when it came from a registry).
        note: one line explaining a substitution or a failed pull.
    """

    requested: str
    used: str
    how: str
    image_id: str | None = None
    digest: str | None = None
    note: str = ""

    @property
    def substituted(self) -> bool:
        return self.used != self.requested


@dataclass(frozen=True, slots=True)
class BuildRecord:
    """Everything known about one stack's build."""

    stack_id: str
    stack: dict[str, Any]
    derived: dict[str, Any]
    status: BuildStatus
    reason: str = ""
    phase: str = ""                  # the phase that failed or was interrupted
    cause: str = ""                  # a failed build's cause (stackforge.build.classify.Cause), else ""
    image_tag: str | None = None
    image_id: str | None = None
    body_image_id: str | None = None  # the builder's image, before the metadata step added labels
    repo_digest: str | None = None   # registry digest when pushed
    image_size: int | None = None    # bytes, as the engine reports it
    base: BaseImage | None = None
    builder: str = ""                # buildkit | classic
    content_hash: str = ""
    lock_sha256: str = ""            # sha256 of the stack lock the image installed (empty: built unlocked)
    lock_path: str = ""
    durations: dict[str, float] = field(default_factory=dict)
    log_path: str = ""
    attempts: int = 0
    installed: dict[str, str] = field(default_factory=dict)   # measured inside the image
    freeze: list[str] = field(default_factory=list)           # pip freeze --all of the image
    verify: dict[str, Any] = field(default_factory=dict)      # VerifyReport.to_json()
    created_at: str = ""
    stackforge_version: str = ""
    provenance: str = ""             # a build provenance attestation kept, or why none was (metadata.provenance_note)

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["status"] = self.status.value
        return {"schema": BUILD_SCHEMA, "schema_version": BUILD_SCHEMA_VERSION, **data}

    def dumps(self) -> str:
        return document_text(self.to_json())

    @classmethod
    def from_json(cls, data: Any, *, path: str = "") -> "BuildRecord":
        """Validate and load; corrupt, partial or newer-schema records raise RecordError."""
        check_envelope(data, schema=BUILD_SCHEMA, supported=BUILD_SCHEMA_VERSION, what="build record", path=path)
        fields = {k: v for k, v in data.items() if k not in ("schema", "schema_version")}
        try:
            fields["status"] = BuildStatus(fields["status"])
            if fields.get("base") is not None:
                fields["base"] = BaseImage(**fields["base"])
            fields["freeze"] = list(fields.get("freeze", []))
            return cls(**fields)
        except (KeyError, TypeError, ValueError) as exc:
            raise RecordError(f"partial or corrupt build record: {type(exc).__name__}: {exc}", path=path) from None


@dataclass(frozen=True, slots=True)
class BuildSummary:
    """The outcome of one build run: a record per stack, in the order given."""

    records: tuple[BuildRecord, ...]
    builder: str
    duration_s: float
    interrupted: bool = False
    warnings: tuple[str, ...] = ()   # one line each, e.g. dependency layers dropped (index unreachable)

    @property
    def failed(self) -> tuple[str, ...]:
        """Ids of the stacks whose build failed."""
        return tuple(r.stack_id for r in self.records if r.status is BuildStatus.FAILED)

    @property
    def ok(self) -> bool:
        """True when every stack has a usable image."""
        return all(r.status.ok for r in self.records) and not self.interrupted

    def count(self, status: BuildStatus) -> int:
        return sum(1 for r in self.records if r.status is status)


def record_path(out_dir: Path, stack_id: str) -> Path:
    """``<out>/builds/<stack-id>.json``."""
    return Path(out_dir) / "builds" / f"{stack_id}.json"


def log_path(out_dir: Path, stack_id: str, run_id: str) -> Path:
    """``<out>/logs/<stack-id>.<run-id>.log``: one log per build run, so two runs never write into one
    and each record names its own run's log."""
    return Path(out_dir) / "logs" / f"{stack_id}.{run_id}.log"


def write_record(out_dir: Path, record: BuildRecord) -> Path:
    """Write ``record`` under ``out_dir`` atomically: a reader sees the old record or the new one, never
    a mix. (Folder first, record second: the argument order of every store's ``write_record``.)"""
    path = record_path(out_dir, record.stack_id)
    atomic_write_text(path, record.dumps())
    return path


def read_record(out_dir: Path, stack_id: str) -> BuildRecord | None:
    """The stack's record, or None when there is none. A corrupt record raises RecordError."""
    path = record_path(out_dir, stack_id)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise RecordError(f"not valid JSON: {exc}", path=str(path)) from None
    return BuildRecord.from_json(data, path=str(path))
