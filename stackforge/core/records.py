"""Versioned JSON records: what a probe or benchmark observed, and where.

One :class:`ResultRecord` per (stack, target, probe). Records are plain JSON so that any stage can
be rerun, sharded across machines, or resumed, and results from many machines merge by key.
A record keeps what was *measured*; rule predictions live in :class:`Prediction` and never mix in.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from enum import Enum
from pathlib import Path
from typing import Any, Protocol

from stackforge.core.envelope import check_envelope, document_text
from stackforge.core.errors import RecordError

RESULT_SCHEMA = "stackforge.result"
RESULT_SCHEMA_VERSION = 1


class Status(str, Enum):
    """Outcome of one probe or benchmark run."""

    PASS = "pass"
    FAIL = "fail"
    SKIP = "skip"        # preconditions not met (no GPU, no nvcc...): not applicable, not a failure
    ERROR = "error"      # the probe itself broke (import error, bad output)
    # The probe ran but could not reach the decisive code path honestly (it needs a context the probe
    # cannot provide, e.g. a running server's published config): kept with its evidence, deciding nothing.
    UNDECIDED = "undecided"
    TIMEOUT = "timeout"  # killed at its hard timeout (assigned by the runner)
    CRASH = "crash"      # died by a signal (assigned by the runner)


class Tier(str, Enum):
    """Where a result comes from: gate (no GPU), runtime (GPU), bench (GPU measurements), wheel (a
    release's wheel read from the index: no image, no GPU; :mod:`stackforge.wheels.tier`)."""

    GATE = "gate"
    RUNTIME = "runtime"
    BENCH = "bench"
    WHEEL = "wheel"


class Verdict(str, Enum):
    """What a rule predicts for a feature (never a measurement)."""

    UNAVAILABLE = "unavailable"
    HAZARD = "hazard"
    REQUIRES = "requires"
    NO_RULE = "no-rule"   # no rule speaks for it: unknown until probed


@dataclass(frozen=True, slots=True)
class Outcome:
    """What one run decided, and on what evidence."""

    status: Status
    reason: str
    evidence: str = ""
    metrics: dict[str, Any] = field(default_factory=dict)
    duration_s: float = 0.0


@dataclass(frozen=True, slots=True)
class Provenance:
    """Where a result was observed: the image as it really is, and the hardware."""

    image: str = ""                 # reference used to run (tag or repo@digest)
    image_id: str | None = None
    digest: str | None = None       # repo digest when pushed
    versions: dict[str, str] = field(default_factory=dict)   # installed, not requested
    torch_arch_list: list[str] = field(default_factory=list)
    torch_git_version: str | None = None
    torch_cuda: str | None = None
    nvcc: str | None = None
    driver: str | None = None
    gpus: list[str] = field(default_factory=list)
    host: str = ""
    runner: str = "docker"          # docker | local | wheel


@dataclass(frozen=True, slots=True)
class ResultRecord:
    """One measurement: (stack, target, probe) -> outcome, with provenance."""

    run_id: str
    stack_id: str
    stack: dict[str, Any]
    target: str
    probe: str
    feature: str
    tier: Tier
    outcome: Outcome
    provenance: Provenance
    kind: str = "probe"             # probe | bench
    created_at: str = ""

    @property
    def key(self) -> tuple[str, str, str]:
        """Merge key: results from many machines merge by (stack, target, probe)."""
        return (self.stack_id, self.target, self.probe)

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["tier"] = self.tier.value
        data["outcome"]["status"] = self.outcome.status.value
        return {"schema": RESULT_SCHEMA, "schema_version": RESULT_SCHEMA_VERSION, **data}

    def dumps(self) -> str:
        return document_text(self.to_json())

    @classmethod
    def from_json(cls, data: Any, *, path: str = "") -> "ResultRecord":
        """Validate and load a record; corrupt, partial or newer-schema records raise RecordError."""
        check_envelope(data, schema=RESULT_SCHEMA, supported=RESULT_SCHEMA_VERSION, what="result record", path=path)
        try:
            outcome = dict(data["outcome"])
            outcome["status"] = Status(outcome["status"])
            return cls(run_id=str(data["run_id"]), stack_id=str(data["stack_id"]), stack=dict(data["stack"]),
                       target=str(data["target"]), probe=str(data["probe"]), feature=str(data["feature"]),
                       tier=Tier(data["tier"]), outcome=Outcome(**outcome),
                       provenance=Provenance(**data.get("provenance", {})), kind=str(data.get("kind", "probe")),
                       created_at=str(data.get("created_at", "")))
        except (KeyError, TypeError, ValueError) as exc:
            raise RecordError(f"partial or corrupt record: {type(exc).__name__}: {exc}", path=path) from None


@dataclass(frozen=True, slots=True)
class Prediction:
    """What the rules predict for one feature of one (stack, target) cell."""

    feature: str
    verdict: Verdict
    rule: str = ""
    reason: str = ""
    error: str = ""
    remedy: str = ""
    sources: tuple[dict[str, str], ...] = ()
    unwitnessed: str = ""   # the rule's word on why no wheel reading can decide it (a runtime bug...)

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["verdict"] = self.verdict.value
        data["sources"] = [dict(s) for s in self.sources]
        if not self.unwitnessed:
            del data["unwitnessed"]
        return data

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> "Prediction":
        """Inverse of :meth:`to_json`."""
        return cls(feature=str(data["feature"]), verdict=Verdict(data["verdict"]),
                   rule=str(data.get("rule", "")), reason=str(data.get("reason", "")),
                   error=str(data.get("error", "")), remedy=str(data.get("remedy", "")),
                   sources=tuple(dict(s) for s in data.get("sources", ())),
                   unwitnessed=str(data.get("unwitnessed", "")))


#: The runner of a record no probe wrote: a job a partial run planned and never reached, which the reports
#: show as "not run (run interrupted)" (``stackforge.report.evidence.with_not_run``); it measured nothing.
NOT_RUN_RUNNER = "not run"


# ---------------------------------------------------------------------------------------------- evidence levels

#: The metric in which a probe says how far its pass went: ``built`` (it compiled and linked the module the
#: target uses, nothing loaded or run) or ``admitted`` (the code admits the target, nothing was built).
EVIDENCE_LEVEL_METRIC = "evidence_level"
BUILT = "built"
#: The metric in which a gate probe says whether the image can JIT-compile what the target needs (False: no
#: compiler and nothing prebuilt covers the modules).
JIT_POSSIBLE_METRIC = "jit_possible"


def says_built(record: ResultRecord) -> bool:
    """A pass whose probe compiled and linked the module the target uses."""
    return record.outcome.status is Status.PASS and record.outcome.metrics.get(EVIDENCE_LEVEL_METRIC) == BUILT


def says_cannot_jit(record: ResultRecord) -> bool:
    """A gate record that measured the image cannot JIT-compile (no compiler, nothing prebuilt)."""
    return record.tier is Tier.GATE and record.outcome.metrics.get(JIT_POSSIBLE_METRIC) is False


# ---------------------------------------------------------------------------------------------- the deciding record

#: Statuses that say nothing about the feature: the cell is decided by the other records.
UNINFORMATIVE = frozenset({Status.SKIP, Status.UNDECIDED})
#: Within one level, the worst outcome decides.
_SEVERITY = {Status.CRASH: 5, Status.TIMEOUT: 4, Status.FAIL: 3, Status.PASS: 2, Status.ERROR: 1}
#: GPU tiers outrank gate, which outranks the wheel tier (code read, nothing run or imported).
_LEVEL = {Tier.WHEEL: 0, Tier.GATE: 1, Tier.RUNTIME: 2, Tier.BENCH: 2}
#: Among records of one level, which tier's record to show first.
TIER_PREFERENCE = {Tier.WHEEL: -1, Tier.GATE: 0, Tier.RUNTIME: 1, Tier.BENCH: 2}


def decisive_record(records: Sequence[ResultRecord]) -> ResultRecord | None:
    """The record that decides a (stack, target, feature): from the highest tier that said something,
    the worst outcome within it. None when every record skipped or was undecided (or there is none).

    The matrix decides its measured cells with this, and ``bench --from-probes`` its gate, so the two
    never disagree on what the probes said.
    """
    informative = [r for r in records if r.outcome.status not in UNINFORMATIVE]
    if not informative:
        return None
    level = max(_LEVEL[r.tier] for r in informative)
    top = [r for r in informative if _LEVEL[r.tier] == level]
    return max(top, key=lambda r: (_SEVERITY.get(r.outcome.status, 0), TIER_PREFERENCE[r.tier], r.probe))


def undecided_text(records: Sequence[ResultRecord]) -> str:
    """``undecided by <probe>: <why>`` for each undecided record, joined by ``; ``."""
    return "; ".join(f"undecided by {r.probe}: {r.outcome.reason}"
                     for r in records if r.outcome.status is Status.UNDECIDED)


def utc_now() -> str:
    """ISO-8601 UTC timestamp used in records."""
    return datetime.now(timezone.utc).replace(microsecond=0).isoformat()


def new_run_id(now: datetime | None = None, *, salt: str | None = None) -> str:
    """A sortable, unique id of one invocation (a results run, a build's containers and cache labels):
    ``20260301T020000Z-3f9a1c`` (UTC time, then 6 random hex digits)."""
    moment = (now or datetime.now(timezone.utc)).astimezone(timezone.utc)
    return f"{moment:%Y%m%dT%H%M%SZ}-{salt if salt is not None else os.urandom(3).hex()}"


@dataclass(frozen=True, slots=True)
class PlannedJob:
    """One job a run sets out to run, written before it starts (``planned.json``): a run cut short then says
    which of its jobs never ran. ``stack`` is the stack's description as its records would carry it."""

    stack_id: str
    stack: dict[str, Any]
    target: str
    probe: str
    feature: str
    tier: Tier

    @property
    def key(self) -> tuple[str, str, str]:
        """The key its record would have (:attr:`ResultRecord.key`)."""
        return (self.stack_id, self.target, self.probe)


class RunStore(Protocol):
    """Where a campaign (probe, bench, bisect) writes: a run folder and its records.

    :class:`stackforge.results.store.ResultsFolder` is the one implementation; campaigns sit below the
    store and receive it as a value.
    """

    def start(self, *, matrix_source: str, shard: str | None, planned: int | None = None,
              jobs: Sequence[PlannedJob] = ()) -> Path: ...

    def end_early(self, run_dir: Path, why: str) -> Any: ...

    def write(self, run_dir: Path, record: ResultRecord) -> Any: ...

    def note_host(self, run_dir: Path, facts: dict[str, Any]) -> Any: ...

    def finish(self, run_dir: Path) -> Any: ...
