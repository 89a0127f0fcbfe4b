"""Qualification records: what one image digest was proven to do, as an in-toto Statement v1.

``stackforge qualify REF`` writes one (:func:`qualify`), ``--push`` attaches it to the image in its
registry (:mod:`stackforge.edges.oci_artifacts`), ``pick --verify`` reads it back and judges it
(:func:`judge_attached`). The predicate keeps, for the image's stack on each target of the evidence:

* the stack's versions, whether it is external (probed with ``probe --image``) and, when it was built
  here, its lock's sha256 and content hash (from the build record);
* per feature: the report cell's status, its **evidence level** (always explicit, ``not-tested``
  included: :class:`EvidenceLevel`), what decided it (a probe, a rule, the target profile, nothing)
  and the sha256 of the evidence text it was decided on; for GPU evidence the host (GPU model and
  count, driver, the target's topology);
* the **knowledge version**: the sha256 of the compat/ files (rules, pins, targets) it was judged
  with, so that a verifier knows when the rules changed since (:func:`current_knowledge`).

The document is checked against ``stackforge/schemas/qualification-1.schema.json``; the sha256 of its
predicate travels beside it (an annotation of the attached artifact), so an edited predicate is told
apart from one the registry merely serves.
"""

from __future__ import annotations

import hashlib
import json
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from enum import Enum
from functools import lru_cache
from importlib import resources
from pathlib import Path
from typing import Any

from stackforge import __version__
from stackforge.build.records import BuildRecord
from stackforge.core.data import data_dir
from stackforge.core.envelope import document_text
from stackforge.core.errors import SpecError
from stackforge.core.records import Tier
from stackforge.edges.registry import split_digest_ref
from stackforge.report.compat_matrix import CellSource, CellStatus, MatrixReport, ReportCell, ReportRow, image_reference

__all__ = ["ARTIFACT_TYPE", "AttachedDocument", "PAYLOAD_MEDIA_TYPE", "PREDICATE_DIGEST_ANNOTATION", "PREDICATE_TYPE",
           "STATEMENT_TYPE", "EvidenceLevel", "KnowledgeVersion", "Qualification", "Verification", "VerifyStatus",
           "current_knowledge", "evidence_level", "judge_attached", "knowledge_of", "predicate_sha256",
           "qualify", "schema_problem", "statement_text"]

STATEMENT_TYPE = "https://in-toto.io/Statement/v1"
PREDICATE_TYPE = "https://stackforge.dev/qualification/v1"
PREDICATE_SCHEMA = "stackforge.qualification"
PREDICATE_SCHEMA_VERSION = 1
#: The attached artifact's type, and its one layer's media type (an in-toto statement, as cosign and
#: the in-toto tools read it).
ARTIFACT_TYPE = "application/vnd.stackforge.qualification.v1+json"
PAYLOAD_MEDIA_TYPE = "application/vnd.in-toto+json"
PREDICATE_DIGEST_ANNOTATION = "dev.stackforge.qualification.predicate.sha256"
JUDGED_AT_ANNOTATION = "org.opencontainers.image.created"
_GPU_TIERS = (Tier.RUNTIME, Tier.BENCH)


class EvidenceLevel(str, Enum):
    """How strong what decided a feature is, strongest first; ``not-tested`` is said, never left out."""

    MEASURED_GPU = "measured-gpu"        # a runtime or bench probe ran it on a GPU
    MEASURED_GATE = "measured-gate"      # a gate probe decided it in the image, no GPU
    MEASURED_WHEEL = "measured-wheel"    # the release's own code, read from its wheel
    BUILT = "built"                      # the module compiled and linked for the target; nothing ran it
    ADMITTED = "admitted"                # the code admits the target; nothing that decides it ran
    PREDICTED = "predicted"              # a compat rule's word; nothing measured it
    TARGET_HARDWARE = "target-hardware"  # the target's hardware cannot have it (n/a)
    NOT_TESTED = "not-tested"            # nothing measured it and no rule speaks


@dataclass(frozen=True, slots=True)
class KnowledgeVersion:
    """The knowledge a judgement rests on: sha256 over the compat/ files (name and content), and how many."""

    sha256: str
    files: int

    def to_json(self) -> dict[str, Any]:
        return {"sha256": self.sha256, "files": self.files}


def knowledge_of(files: Mapping[str, bytes]) -> KnowledgeVersion:
    """The knowledge version of ``files`` (relative name -> content): order-free, any byte changed changes it."""
    if not files:
        raise SpecError("no compat files to judge with", remedy="reinstall stackforge (pip install .)")
    digest = hashlib.sha256()
    for name in sorted(files):
        digest.update(f"{name}\0{hashlib.sha256(files[name]).hexdigest()}\n".encode())
    return KnowledgeVersion(sha256=digest.hexdigest(), files=len(files))


def current_knowledge(extra: Sequence[str | Path] = ()) -> KnowledgeVersion:
    """The knowledge this stackforge judges with now: the shipped compat/ folder's YAML files, and the
    ``--compat`` overlay's files (``extra``) when one is given."""
    root = data_dir("compat")
    files = {f"compat/{p.relative_to(root).as_posix()}": p.read_bytes()
             for p in sorted(root.rglob("*")) if p.is_file() and p.suffix in (".yaml", ".yml")}
    files |= {f"overlay/{Path(p).name}": Path(p).read_bytes() for p in extra}
    return knowledge_of(files)


def evidence_level(cell: ReportCell) -> EvidenceLevel:
    """The level of what decides ``cell`` (a skip, an undecided probe or one that itself broke, ``error``,
    decides nothing: not tested)."""
    if cell.status in (CellStatus.SKIP, CellStatus.UNDECIDED, CellStatus.UNTESTED, CellStatus.ERROR):
        return EvidenceLevel.NOT_TESTED
    if cell.source is CellSource.TARGET:
        return EvidenceLevel.TARGET_HARDWARE
    if cell.source is CellSource.PREDICTED:
        return EvidenceLevel.PREDICTED
    if cell.source is not CellSource.MEASURED or cell.decisive is None:
        return EvidenceLevel.NOT_TESTED
    if cell.status is CellStatus.BUILT:
        return EvidenceLevel.BUILT
    if cell.status is CellStatus.ADMITTED:
        return EvidenceLevel.ADMITTED
    return {Tier.GATE: EvidenceLevel.MEASURED_GATE, Tier.WHEEL: EvidenceLevel.MEASURED_WHEEL}.get(
        cell.decisive.tier, EvidenceLevel.MEASURED_GPU)


@dataclass(frozen=True, slots=True)
class Qualification:
    """One image's qualification: the in-toto statement and its subject."""

    image: str                 # repo@sha256:...
    statement: dict[str, Any]

    @property
    def predicate(self) -> dict[str, Any]:
        return self.statement["predicate"]

    def annotations(self) -> dict[str, str]:
        """What the attached artifact carries beside the document: the predicate's sha256 and when it was judged."""
        return {PREDICATE_DIGEST_ANNOTATION: predicate_sha256(self.predicate),
                JUDGED_AT_ANNOTATION: self.predicate["judged_at"]}

    def summary_lines(self) -> tuple[str, ...]:
        """For people: the subject, the levels counted, what was never tested."""
        lines = [f"qualification of {self.image} ({self.predicate['stack_id']}), knowledge "
                 f"sha256:{self.predicate['knowledge']['sha256'][:12]}"]
        for target in self.predicate["targets"]:
            lines.append(f"  {target['target']}: {_level_counts(target['features'])}")
        untested = self.predicate["not_tested"]
        lines.append(f"  never tested: {', '.join(untested)}" if untested else "  never tested: nothing")
        return tuple(lines)


def qualify(report: MatrixReport, ref: str, *, builds: Mapping[str, BuildRecord], knowledge: KnowledgeVersion,
            judged_at: str) -> Qualification:
    """The qualification of the image ``ref`` (``repo@sha256:...``, or a stack id whose records name one
    image digest) on ``report``'s target.

    Raises:
        SpecError: no stack's records or build record name that image; a stack id whose image is not
            pinned by a digest, or that names several.
    """
    row, image = _row_for(report, ref, builds)
    build = builds.get(row.stack_id)
    repo, digest = image.split("@", 1)
    features = [_feature_entry(cell, report.target, report.target_info) for cell in row.cells]
    predicate: dict[str, Any] = {
        "schema": PREDICATE_SCHEMA, "schema_version": PREDICATE_SCHEMA_VERSION, "image": image,
        "stack_id": row.stack_id, "stack": dict(row.stack), "external": bool(row.stack.get("external")),
        "lock_sha256": (build.lock_sha256 or None) if build else None,
        "content_hash": (build.content_hash or None) if build else None,
        "knowledge": knowledge.to_json(), "judged_at": judged_at, "stackforge_version": __version__,
        "targets": [{"target": report.target, "features": features}],
        "not_tested": [f["feature"] for f in features if f["evidence_level"] == EvidenceLevel.NOT_TESTED.value],
    }
    statement = {"_type": STATEMENT_TYPE, "subject": [{"name": repo, "digest": {"sha256": digest.split(":", 1)[1]}}],
                 "predicateType": PREDICATE_TYPE, "predicate": predicate}
    return Qualification(image=image, statement=statement)


def statement_text(qualification: Qualification) -> str:
    """The statement as stored and attached: the layout of every stored document (sorted keys)."""
    return document_text(qualification.statement)


def predicate_sha256(predicate: Any) -> str:
    """sha256 of the predicate in canonical JSON (sorted keys, no spaces): independent of its layout."""
    return hashlib.sha256(json.dumps(predicate, sort_keys=True, separators=(",", ":"),
                                     ensure_ascii=False).encode()).hexdigest()


def schema_problem(document: Any) -> str:
    """"" when ``document`` is a valid qualification statement, else where and why it is not (one line)."""
    import jsonschema

    validator = jsonschema.Draft202012Validator(_schema())
    error = jsonschema.exceptions.best_match(validator.iter_errors(document))
    if error is None:
        return ""
    where = "/".join(str(p) for p in error.absolute_path) or "(top)"
    return f"{where}: {' '.join(error.message.split())[:200]}"


# --------------------------------------------------------------------------------------- verification


class VerifyStatus(str, Enum):
    """What ``pick --verify`` found attached to a candidate's image."""

    VERIFIED = "verified"
    MISSING = "missing"            # nothing attached, or the image is not pinned by digest
    OTHER_DIGEST = "other-digest"  # the record's subject is another image
    STALE = "stale"                # judged with other knowledge than the rules now say
    TAMPERED = "tampered"          # bytes, predicate hash or schema do not hold


@dataclass(frozen=True, slots=True)
class Verification:
    """One candidate image's attached record, judged. ``line`` is the one line that says so."""

    image: str
    status: VerifyStatus
    line: str
    levels: str = ""                     # "3 measured-gpu, 1 built, 2 not-tested" (a verified record)
    not_tested: tuple[str, ...] = ()

    @property
    def ok(self) -> bool:
        return self.status is VerifyStatus.VERIFIED

    def lines(self) -> tuple[str, ...]:
        """For people: the verdict line; for a verified record its evidence levels and, plainly, what was
        never tested."""
        if not self.ok:
            return (f"verify: ✘ {self.line}",)
        untested = (f"never tested: {', '.join(self.not_tested)}" if self.not_tested
                    else "never tested: nothing (every feature has evidence or a rule's word)")
        return (f"verify: ✔ {self.line}", f"  evidence levels: {self.levels}", f"  {untested}")

    def to_json(self) -> dict[str, Any]:
        return {"image": self.image, "status": self.status.value, "line": self.line, "levels": self.levels,
                "not_tested": list(self.not_tested)}


@dataclass(frozen=True, slots=True)
class AttachedDocument:
    """A document attached to an image, as read from the registry (the edge's answer, in the report's words).

    ``integrity``: "" when every byte matched the digest naming it, else what did not.
    """

    payload: bytes
    annotations: Mapping[str, str]
    integrity: str = ""
    found_by: str = ""


def judge_attached(image: str, attached: Sequence[AttachedDocument], knowledge: KnowledgeVersion,
                   target: str | None = None) -> Verification:
    """Judge the newest qualification record attached to ``image`` (``repo@sha256:...``) against the
    knowledge the rules now have. Refusals, each one line: missing, tampered (bytes, predicate hash or
    schema), another digest, stale (``re-qualify: rules changed since ...``)."""
    if "@sha256:" not in image:
        return Verification(image, VerifyStatus.MISSING,
                            f"{image or 'the image'} is not pinned by digest: no record can be attached to it")
    if not attached:
        return Verification(image, VerifyStatus.MISSING, f"no qualification record is attached to {image} "
                            f"(hint: stackforge qualify {image} --push)")
    # One record judges one target: the newest of those that judge ``target`` (another target's newer
    # record says nothing about it), else the newest of all.
    covering = [d for d in attached if target is None or _judges_target(d.payload, target)]
    newest = max(covering or attached, key=lambda d: str(d.annotations.get(JUDGED_AT_ANNOTATION, "")))
    if newest.integrity:
        return Verification(image, VerifyStatus.TAMPERED, f"qualification record of {image} refused: {newest.integrity}")
    try:
        document = json.loads(newest.payload)
    except ValueError as exc:
        return Verification(image, VerifyStatus.TAMPERED,
                            f"qualification record of {image} refused: not JSON ({' '.join(str(exc).split())})")
    problem = schema_problem(document)
    if problem:
        return Verification(image, VerifyStatus.TAMPERED,
                            f"qualification record of {image} refused: schema violation at {problem}")
    predicate = document["predicate"]
    stored = str(newest.annotations.get(PREDICATE_DIGEST_ANNOTATION, ""))
    actual = predicate_sha256(predicate)
    if stored != actual:
        return Verification(image, VerifyStatus.TAMPERED,
                            f"qualification record of {image} refused: tampered (its predicate's sha256 is "
                            f"{actual[:12]}, the record was attached with {stored[:12] or 'none'})")
    wanted = image.rsplit("@sha256:", 1)[1]
    named = document["subject"][0]["digest"]["sha256"]
    if named != wanted or predicate["image"].rsplit("@sha256:", 1)[1] != wanted:
        return Verification(image, VerifyStatus.OTHER_DIGEST,
                            f"qualification record of {image} refused: it names sha256:{named[:12]}, "
                            f"not this image's sha256:{wanted[:12]}")
    judged = predicate["knowledge"]["sha256"]
    if judged != knowledge.sha256:
        return Verification(image, VerifyStatus.STALE,
                            f"qualification record of {image} refused: re-qualify: rules changed since "
                            f"{predicate['judged_at']} (judged with knowledge {judged[:12]}, the rules now say "
                            f"{knowledge.sha256[:12]})")
    judged_targets = [t for t in predicate["targets"] if target is None or t["target"] == target]
    if not judged_targets:
        return Verification(image, VerifyStatus.MISSING,
                            f"no qualification record attached to {image} judges target {target} "
                            f"(hint: stackforge qualify {image} --target {target} --push)")
    entries = [f for t in judged_targets for f in t["features"]]
    not_tested = tuple(f["feature"] for f in entries if f["evidence_level"] == EvidenceLevel.NOT_TESTED.value)
    levels = _level_counts(entries)
    found = f", found by {newest.found_by}" if newest.found_by else ""
    return Verification(image, VerifyStatus.VERIFIED,
                        f"qualification record of {image} verified (judged {predicate['judged_at']}, knowledge "
                        f"current{found})", levels=levels, not_tested=not_tested)


# ---------------------------------------------------------------------------------------------- internals


def _judges_target(payload: bytes, target: str) -> bool:
    try:
        document = json.loads(payload)
        return any(t.get("target") == target for t in document["predicate"]["targets"])
    except (ValueError, TypeError, KeyError, AttributeError):
        return False


@lru_cache(maxsize=1)
def _schema() -> dict[str, Any]:
    text = resources.files("stackforge").joinpath(
        f"schemas/qualification-{PREDICATE_SCHEMA_VERSION}.schema.json").read_text(encoding="utf-8")
    return json.loads(text)


def _row_for(report: MatrixReport, ref: str, builds: Mapping[str, BuildRecord]) -> tuple[ReportRow, str]:
    """The row whose image is ``ref``, and the image as ``repo@sha256:...``."""
    if "@" in ref:
        repo, digest = split_digest_ref(ref)
        for row in report.rows:
            if digest in _digests_of(row, builds.get(row.stack_id)):
                return row, f"{repo}@{digest}"
        raise SpecError(f"no records or build record of target {report.target} name the image {ref}",
                        remedy="probe it first (stackforge probe --image REF, or build and probe the stack)")
    rows = [r for r in report.rows if r.stack_id == ref]
    if not rows:
        raise SpecError(f"{ref!r} is neither an image digest reference (<repo>@sha256:...) nor a stack id "
                        f"with records for {report.target}", remedy="copy an id from `stackforge matrix`")
    pinned = sorted({image_reference(r)[0] for r in rows[0].records if image_reference(r)[1]})
    build = builds.get(ref)
    if build is not None and build.repo_digest:
        pinned = sorted({*pinned, build.repo_digest})
    if len(pinned) != 1:
        what = "no image pinned by digest" if not pinned else f"{len(pinned)} images ({', '.join(pinned)})"
        raise SpecError(f"stack {ref} has {what}: a qualification names one image digest",
                        remedy="push the image (stackforge build --push) and probe it, or pass REF as repo@sha256:...")
    return rows[0], pinned[0]


def _digests_of(row: ReportRow, build: BuildRecord | None) -> set[str]:
    refs = {image_reference(r)[0] for r in row.records if image_reference(r)[1]}
    if build is not None and build.repo_digest:
        refs.add(build.repo_digest)
    refs |= {str(row.stack["image"])} if "@" in str(row.stack.get("image", "")) else set()
    return {r.rsplit("@", 1)[-1] for r in refs}


def _feature_entry(cell: ReportCell, target: str, target_info: Mapping[str, Any]) -> dict[str, Any]:
    level = evidence_level(cell)
    decisive = cell.decisive
    host = None
    if level is EvidenceLevel.NOT_TESTED:
        decided_by, evidence = "nothing", ""
    elif level is EvidenceLevel.TARGET_HARDWARE:
        decided_by, evidence = f"target profile {target}", cell.reason
    elif level is EvidenceLevel.PREDICTED:
        rule = cell.prediction.rule if cell.prediction is not None else ""
        decided_by = f"rule {rule}" if rule else "the plan"
        evidence = "\n".join(filter(None, (cell.reason, cell.prediction.error if cell.prediction else "")))
    else:
        decided_by = f"{decisive.tier.value} probe {decisive.probe}" if decisive else "a probe"
        evidence = decisive.outcome.evidence if decisive else cell.evidence
        if decisive is not None and decisive.tier in _GPU_TIERS:
            host = _host(decisive.provenance, target_info)
    return {"feature": cell.feature, "status": cell.status.value, "evidence_level": level.value,
            "decided_by": decided_by, "reason": " ".join(cell.reason.split())[:500],
            "evidence_sha256": hashlib.sha256(evidence.encode()).hexdigest() if evidence else None,
            "host": host}


def _host(provenance: Any, target_info: Mapping[str, Any]) -> dict[str, Any]:
    gpus = list(provenance.gpus)
    model = Counter(gpus).most_common(1)[0][0] if gpus else "unknown"
    # The records keep no measured topology: the target profile's interconnect is what the run was for.
    topology = f"{target_info.get('interconnect', 'unknown')} (target profile)"
    return {"gpu_model": model, "gpu_count": len(gpus), "driver": provenance.driver, "topology": topology,
            "host": provenance.host}


def _level_counts(entries: Sequence[Mapping[str, Any]]) -> str:
    counts = Counter(str(e["evidence_level"]) for e in entries)
    order = [level.value for level in EvidenceLevel]
    return ", ".join(f"{counts[name]} {name}" for name in order if counts[name]) or "no feature"
