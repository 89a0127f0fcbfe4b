"""pick --verify judges the record of the target asked about: another target's record verifies nothing here."""

from __future__ import annotations

import json

from matrix_fixtures import CU131, DIGESTS, TARGET, plan_dict, seed_records

from stackforge.plan.planner import Plan
from stackforge.report.compat_matrix import build_matrix
from stackforge.report.qualification import (
    AttachedDocument,
    Qualification,
    VerifyStatus,
    current_knowledge,
    judge_attached,
    qualify,
    statement_text,
)

IMAGE = DIGESTS[CU131]


def _record(target: str, judged_at: str) -> AttachedDocument:
    q = qualify(build_matrix(seed_records(), Plan.from_json(plan_dict()), TARGET), IMAGE, builds={},
                knowledge=current_knowledge(), judged_at=judged_at)
    statement = json.loads(json.dumps(q.statement))
    statement["predicate"]["targets"][0]["target"] = target
    q = Qualification(image=q.image, statement=statement)
    return AttachedDocument(payload=statement_text(q).encode(), annotations=q.annotations())


def test_a_record_of_another_target_is_no_record_for_this_one() -> None:
    verdict = judge_attached(IMAGE, [_record("h200-x8-nvlink", "2026-12-05T10:00:00+00:00")],
                             current_knowledge(), TARGET)
    assert verdict.status is VerifyStatus.MISSING, verdict.line
    assert f"judges target {TARGET}" in verdict.line and len(verdict.lines()) == 1


def test_the_record_of_this_target_is_judged_though_another_targets_record_is_newer() -> None:
    attached = [_record(TARGET, "2026-12-05T10:00:00+00:00"), _record("h200-x8-nvlink", "2026-12-05T11:00:00+00:00")]
    verdict = judge_attached(IMAGE, attached, current_knowledge(), TARGET)
    assert verdict.status is VerifyStatus.VERIFIED, verdict.line
    assert "measured-gpu" in verdict.levels


def test_a_probe_that_itself_broke_is_not_tested_not_measured() -> None:
    from matrix_fixtures import record

    records = [record(CU131, "flashinfer-jit", "error", reason="probe harness crashed: ImportError", digest=IMAGE)]
    q = qualify(build_matrix(records, Plan.from_json(plan_dict()), TARGET), IMAGE, builds={},
                knowledge=current_knowledge(), judged_at="t")
    entry = {f["feature"]: f for f in q.predicate["targets"][0]["features"]}["flashinfer-jit"]
    assert entry["status"] == "error"
    assert entry["evidence_level"] == "not-tested" and entry["host"] is None
    assert "flashinfer-jit" in q.predicate["not_tested"]
