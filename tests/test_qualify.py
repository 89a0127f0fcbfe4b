"""Qualification records (issue #34 items 2-4): `stackforge qualify`, the record attached to the image in a
real registry (Debian's docker-registry on 127.0.0.1) and read back by `pick --verify`, refusals (missing,
tampered, another digest, stale), and the ecosystem labels of built images."""

from __future__ import annotations

import dataclasses
import io
import json
import tarfile
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner
from matrix_fixtures import CU131, DIGESTS, TARGET, plan_dict, record, seed_workspace
from registry_fixture import LocalRegistry, free_loopback_port, local_registry  # noqa: F401

from stackforge.cli import cli
from stackforge.core.records import Status
from stackforge.plan.planner import Plan
from stackforge.report.compat_matrix import build_matrix
from stackforge.report.qualification import (
    ARTIFACT_TYPE,
    PAYLOAD_MEDIA_TYPE,
    AttachedDocument,
    EvidenceLevel,
    KnowledgeVersion,
    Qualification,
    VerifyStatus,
    current_knowledge,
    judge_attached,
    knowledge_of,
    qualify,
    schema_problem,
    statement_text,
)
from stackforge.results.store import finish_run, start_run, write_record

IMAGE = DIGESTS[CU131]   # ghcr.io/acme/stackforge@sha256:ccc...
OTHER = "ghcr.io/acme/stackforge@sha256:" + "d" * 64


def _report(records=None):
    from matrix_fixtures import seed_records
    return build_matrix(records if records is not None else seed_records(), Plan.from_json(plan_dict()), TARGET)


def _qualification(knowledge: KnowledgeVersion | None = None, ref: str = IMAGE) -> Qualification:
    return qualify(_report(), ref, builds={}, knowledge=knowledge or current_knowledge(),
                   judged_at="2026-12-05T10:00:00+00:00")


def _attached(q: Qualification, *, annotations: dict[str, str] | None = None) -> AttachedDocument:
    return AttachedDocument(payload=statement_text(q).encode(), annotations=annotations or q.annotations())


def _edited(q: Qualification, edit) -> Qualification:
    statement = json.loads(json.dumps(q.statement))
    edit(statement)
    return Qualification(image=q.image, statement=statement)


# ------------------------------------------------------------------------------------------- pure: record


def test_statement_is_an_in_toto_statement_the_schema_accepts() -> None:
    q = _qualification()
    statement = q.statement
    assert statement["_type"] == "https://in-toto.io/Statement/v1"
    assert statement["subject"] == [{"name": "ghcr.io/acme/stackforge", "digest": {"sha256": "c" * 64}}]
    assert statement["predicateType"] == "https://stackforge.dev/qualification/v1"
    assert schema_problem(json.loads(statement_text(q))) == ""
    features = {f["feature"]: f for f in q.predicate["targets"][0]["features"]}
    # Every feature has an explicit level; the GPU evidence names its host; a rule's word is "predicted".
    assert {f["evidence_level"] for f in features.values()} <= {level.value for level in EvidenceLevel}
    jit = features["flashinfer-jit"]
    assert jit["evidence_level"] == "measured-gpu" and jit["decided_by"] == "runtime probe flashinfer-jit-runtime"
    assert jit["host"] == {"gpu_model": "NVIDIA RTX PRO 6000 Blackwell", "gpu_count": 8, "driver": "595.10",
                           "topology": "pcie (target profile)", "host": "gpu-box-1"}
    import hashlib
    assert jit["evidence_sha256"] == hashlib.sha256(b"rmsnorm max abs err 0.0").hexdigest()
    untested = [name for name, f in features.items() if f["evidence_level"] == "not-tested"]
    assert untested and q.predicate["not_tested"] == untested
    assert all(features[name]["evidence_sha256"] is None and features[name]["decided_by"] == "nothing"
               for name in untested)
    assert q.predicate["knowledge"]["sha256"] == current_knowledge().sha256


def test_gate_built_and_admitted_levels_are_said_as_such() -> None:
    records = [record(CU131, "flashinfer-jit", "pass", tier="gate", reason="module built for sm_120",
                      evidence="ninja ok", digest=IMAGE)]
    report = _report(records)
    q = qualify(report, IMAGE, builds={}, knowledge=current_knowledge(), judged_at="t")
    level = {f["feature"]: f["evidence_level"] for f in q.predicate["targets"][0]["features"]}["flashinfer-jit"]
    assert level in ("measured-gate", "built", "admitted")
    assert level != "measured-gpu"


def test_knowledge_version_changes_with_any_byte_of_the_rules() -> None:
    base = knowledge_of({"compat/rules/a.yaml": b"x: 1\n", "compat/targets.yaml": b"t\n"})
    assert base == knowledge_of({"compat/targets.yaml": b"t\n", "compat/rules/a.yaml": b"x: 1\n"})
    assert base != knowledge_of({"compat/rules/a.yaml": b"x: 2\n", "compat/targets.yaml": b"t\n"})


def test_a_ref_no_record_names_is_refused_in_one_line(tmp_path: Path) -> None:
    seed_workspace(tmp_path)
    result = CliRunner().invoke(cli, ["qualify", OTHER, "--results", str(tmp_path / "results"),
                                      "--plan", str(tmp_path / "plan.json")])
    assert result.exit_code == 2, result.output
    assert result.output.count("stackforge: error:") == 1 and "name the image" in result.output
    result = CliRunner().invoke(cli, ["qualify", "not a ref", "--results", str(tmp_path / "results")])
    assert result.exit_code == 2 and "Traceback" not in result.output


def test_qualify_writes_the_statement_to_out(tmp_path: Path) -> None:
    seed_workspace(tmp_path)
    out = tmp_path / "q" / "record.json"
    result = CliRunner().invoke(cli, ["qualify", IMAGE, "--results", str(tmp_path / "results"),
                                      "--plan", str(tmp_path / "plan.json"), "--out", str(out)])
    assert result.exit_code == 0, result.output
    assert schema_problem(json.loads(out.read_text())) == ""
    assert "never tested:" in result.output


# ------------------------------------------------------------------------------------ pure: verification


def test_verified_record_says_its_levels_and_what_was_never_tested() -> None:
    q = _qualification()
    verdict = judge_attached(IMAGE, [_attached(q)], current_knowledge(), TARGET)
    assert verdict.status is VerifyStatus.VERIFIED, verdict.line
    assert "measured-gpu" in verdict.levels and verdict.not_tested == tuple(q.predicate["not_tested"])
    assert any(line.startswith("  never tested: ") for line in verdict.lines())


@pytest.mark.parametrize("case, status, words", [
    ("missing", VerifyStatus.MISSING, "no qualification record is attached"),
    ("unpinned", VerifyStatus.MISSING, "not pinned by digest"),
    ("tampered", VerifyStatus.TAMPERED, "tampered"),
    ("schema", VerifyStatus.TAMPERED, "schema violation"),
    ("bytes", VerifyStatus.TAMPERED, "sha256"),
    ("other", VerifyStatus.OTHER_DIGEST, "names sha256:dddddddddddd"),
    ("stale", VerifyStatus.STALE, "re-qualify: rules changed since 2026-12-05T10:00:00+00:00"),
])
def test_each_bad_record_is_refused_with_one_line(case: str, status: VerifyStatus, words: str) -> None:
    q = _qualification()
    image, attached = IMAGE, [_attached(q)]
    if case == "missing":
        attached = []
    elif case == "unpinned":
        image = "stackforge/x:abc"
    elif case == "tampered":   # a pass turned into... an edited predicate, its attached sha256 unchanged
        edited = _edited(q, lambda s: s["predicate"]["targets"][0]["features"][0].update(status="fail"))
        attached = [_attached(edited, annotations=q.annotations())]
    elif case == "schema":
        edited = _edited(q, lambda s: s["predicate"].pop("knowledge"))
        attached = [_attached(edited)]
    elif case == "bytes":
        attached = [dataclasses.replace(attached[0], payload=b"", integrity="the document's sha256 is sha256:00, "
                                        "not the sha256:11 that names it")]
    elif case == "other":
        other = _qualification(ref=IMAGE)
        other = _edited(other, lambda s: (s["subject"][0]["digest"].update(sha256="d" * 64),
                                          s["predicate"].update(image=OTHER)))
        attached = [_attached(other)]
    elif case == "stale":
        old = _qualification(knowledge=KnowledgeVersion(sha256="0" * 64, files=10))
        attached = [_attached(old)]
    verdict = judge_attached(image, attached, current_knowledge(), TARGET)
    assert verdict.status is status, verdict.line
    assert words in verdict.line and "\n" not in verdict.line
    assert len(verdict.lines()) == 1


def test_a_registry_that_does_not_answer_is_exit_3_naming_it(tmp_path: Path) -> None:
    host = f"127.0.0.1:{free_loopback_port()}"
    ref = f"{host}/q/none@sha256:" + "e" * 64
    results = _one_stack_results(tmp_path, ref)
    result = CliRunner().invoke(cli, ["pick", "--verify", "--results", str(results), "--no-plan",
                                      "--target", TARGET, "--require", "flashinfer-jit"])
    assert result.exit_code == 3, result.output
    assert f"registry {host} does not answer" in result.output and "Traceback" not in result.output


# ------------------------------------------------------------------------------ real registry round trip


def _one_stack_results(tmp_path: Path, image_ref: str) -> Path:
    results = tmp_path / "results"
    run_dir = start_run(results, command=["stackforge", "probe"], run_id="run-q")
    for feature, status in (("flashinfer-jit", Status.PASS), ("flashinfer-ar-fusion", Status.PASS)):
        write_record(run_dir, dataclasses.replace(record(CU131, feature, status, digest=image_ref), run_id="run-q"))
    finish_run(run_dir)
    return results


@pytest.fixture(scope="module")
def pushed_image(local_registry: LocalRegistry, docker_client: object,  # noqa: F811
                 tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A one-file image (docker import), pushed to the local registry under four repositories (referrers are
    per repository, so each case gets its own); yields the image digest. The local image is removed after."""
    from stackforge.edges import registry, runner
    from stackforge.edges.registry import Repository

    folder = tmp_path_factory.mktemp("tiny")
    content = f"stackforge qualify test {uuid.uuid4()}\n".encode()
    with tarfile.open(folder / "tiny.tar", "w") as tar:
        info = tarfile.TarInfo("stackforge-test.txt")
        info.size = len(content)
        tar.addfile(info, io.BytesIO(content))
    tag = f"stackforge-test/qualify:{uuid.uuid4().hex[:12]}"
    from _session import SESSION_ID, TEST_LABEL, TEST_SESSION_LABEL

    changes = [arg for key, value in {TEST_LABEL: "1", TEST_SESSION_LABEL: SESSION_ID}.items()
               for arg in ("--change", f"LABEL {key}={value}")]
    runner.check_run(["docker", "import", *changes, str(folder / "tiny.tar"), tag], timeout=120)
    image_id = registry.local_image_id(tag)
    try:
        digests = {registry.push(tag, Repository.parse(f"{local_registry.host}/q/{case}"), "t").digest
                   for case in ("ok", "tampered", "other", "stale")}
        assert len(digests) == 1
        yield digests.pop()
    finally:
        for case in ("ok", "tampered", "other", "stale"):
            runner.run(["docker", "image", "rm", f"{local_registry.host}/q/{case}:t"], timeout=120)
        runner.run(["docker", "image", "rm", "--force", image_id], timeout=120)


def _pick_verify(results: Path) -> object:
    return CliRunner().invoke(cli, ["pick", "--verify", "--results", str(results), "--no-plan", "--target", TARGET,
                                    "--require", "flashinfer-jit"])


@pytest.mark.docker
def test_record_pushed_to_a_registry_is_read_back_by_pick_verify(local_registry: LocalRegistry,  # noqa: F811
                                                                  pushed_image: str, tmp_path: Path) -> None:
    image = f"{local_registry.host}/q/ok@{pushed_image}"
    results = _one_stack_results(tmp_path, image)
    before = _pick_verify(results)
    assert before.exit_code == 4, before.output            # nothing attached yet: refused
    assert "no qualification record is attached" in before.output

    qualified = CliRunner().invoke(cli, ["qualify", image, "--results", str(results), "--no-plan",
                                         "--target", TARGET, "--push", "--out", str(tmp_path / "q.json")])
    assert qualified.exit_code == 0, qualified.output
    assert "(tag-schema)" in qualified.output               # distribution 2.x has no referrers API

    after = _pick_verify(results)
    assert after.exit_code == 0, after.output
    assert after.stdout.strip() == image
    assert "verified" in after.output and "evidence levels: " in after.output
    assert "never tested: " in after.output


def _attach(image: str, q: Qualification, annotations: dict[str, str] | None = None) -> None:
    from stackforge.edges.oci_artifacts import push_artifact

    push_artifact(image, statement_text(q).encode(), artifact_type=ARTIFACT_TYPE, media_type=PAYLOAD_MEDIA_TYPE,
                  annotations=annotations or q.annotations())


@pytest.mark.docker
@pytest.mark.parametrize("case, words", [
    ("tampered", "tampered (its predicate's sha256 is"),
    ("other", "names sha256:dddddddddddd"),
    ("stale", "re-qualify: rules changed since"),
])
def test_bad_records_in_the_registry_are_refused_with_one_line(local_registry: LocalRegistry,  # noqa: F811
                                                                pushed_image: str, tmp_path: Path,
                                                                case: str, words: str) -> None:
    image = f"{local_registry.host}/q/{case}@{pushed_image}"
    results = _one_stack_results(tmp_path, image)
    report = build_matrix(_records_of(results), Plan.from_json(plan_dict()), TARGET)
    knowledge = KnowledgeVersion(sha256="0" * 64, files=10) if case == "stale" else current_knowledge()
    q = qualify(report, image, builds={}, knowledge=knowledge, judged_at="2026-12-05T10:00:00+00:00")
    if case == "tampered":
        edited = _edited(q, lambda s: s["predicate"]["targets"][0]["features"][0].update(status="pass!"))
        _attach(image, edited, annotations=q.annotations())
    elif case == "other":
        other = _edited(q, lambda s: (s["subject"][0]["digest"].update(sha256="d" * 64),
                                      s["predicate"].update(image=f"{local_registry.host}/q/x@sha256:" + "d" * 64)))
        _attach(image, other)
    else:
        _attach(image, q)
    result = _pick_verify(results)
    assert result.exit_code == 4, result.output
    refusals = [line for line in result.output.splitlines() if "refused:" in line]
    assert len(refusals) == 1 and words in refusals[0], result.output
    assert result.output.splitlines()[-1].startswith("stackforge: error: no image qualifies")


def _records_of(results: Path):
    from stackforge.results.store import load_results

    return load_results(results).records


# -------------------------------------------------------------------------------- item 4: ecosystem labels


def test_built_images_carry_the_oci_labels_and_created_stays_out_of_the_content_hash() -> None:
    from _build_helpers import small_cell

    from stackforge.build.metadata import dynamic_labels, provenance_note
    from stackforge.build.records import BaseImage
    from stackforge.compose.dockerfile import compose_stack

    stack, derived = small_cell()
    composed = compose_stack(stack, derived)
    base = BaseImage(requested="python:3.11-slim-bookworm", used="stackforge/debian:bookworm", how="local")
    labels = {**dict(composed.labels), **dynamic_labels(composed, base, [], "2026-01-01T00:00:00Z", [])}
    oci = "org.opencontainers.image"
    for key in ("created", "revision", "source", "version", "title", "description"):
        assert labels.get(f"{oci}.{key}"), f"{oci}.{key} missing"
    assert labels[f"{oci}.revision"] == composed.content_hash
    assert labels[f"{oci}.created"] == "2026-01-01T00:00:00Z"
    assert f"torch {stack.torch}" in labels[f"{oci}.description"]
    # created is a metadata-step label: never in the Dockerfile text, so never in the content hash or tag.
    assert "2026-01-01T00:00:00Z" not in composed.dockerfile and f"{oci}.created" not in dict(composed.labels)
    assert compose_stack(stack, derived).content_hash == composed.content_hash
    # Where the builder cannot keep a provenance attestation, the build record says why.
    for builder in ("buildkit", "classic"):
        assert provenance_note(builder).startswith("not kept: ")


def test_pick_verify_refuses_an_unpinned_image_and_says_so_in_json(tmp_path: Path) -> None:
    results = _one_stack_results(tmp_path, "")   # probed from a local image only: no digest, nothing to verify
    result = CliRunner().invoke(cli, ["pick", "--verify", "--results", str(results), "--no-plan", "--target", TARGET,
                                      "--require", "flashinfer-jit", "--format", "json"])
    assert result.exit_code == 4, result.output
    payload = json.loads(result.stdout)
    assert payload["verification"][CU131]["status"] == "missing"
    assert "not pinned by digest" in payload["verification"][CU131]["line"]
    plain = CliRunner().invoke(cli, ["pick", "--results", str(results), "--no-plan", "--target", TARGET,
                                     "--require", "flashinfer-jit"])
    assert plain.exit_code == 0, plain.output    # without --verify the same candidate is picked


def test_qualify_out_under_a_file_is_one_line_exit_2_before_any_work(tmp_path: Path) -> None:
    seed_workspace(tmp_path)
    (tmp_path / "a-file").write_text("x\n")
    result = CliRunner().invoke(cli, ["qualify", IMAGE, "--results", str(tmp_path / "results"), "--plan",
                                      str(tmp_path / "plan.json"), "--out", str(tmp_path / "a-file" / "q.json")])
    assert result.exit_code == 2, result.output
    assert result.stderr.count("stackforge: error: --out ") == 1 and (tmp_path / "a-file").read_text() == "x\n"
