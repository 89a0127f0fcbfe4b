"""Registry hand-off, end to end: build records name an image by digest; the image is pushed to a
real local registry, removed here, then probed by that digest (pulled back), with the digest in the
result's provenance."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest
from _build_helpers import small_cell
from _session import session_labels
from registry_fixture import LocalRegistry, local_registry  # noqa: F401  (fixture by name)

from stackforge.build.records import BuildRecord, BuildStatus, write_record
from stackforge.core.model import Interconnect, Target
from stackforge.core.records import Status
from stackforge.edges import registry, runner
from stackforge.edges.gpus import HostGpus
from stackforge.jobs.campaign import CellJob
from stackforge.probes.campaign import run_probe_jobs
from stackforge.probes.catalog import Preconditions, ProbeSpec

pytestmark = [pytest.mark.docker]
MISBEHAVE = Path(__file__).resolve().parent / "probes_misbehave"
TARGET = Target(name="t", gpu="g", arch="12.0", gpu_count=8, interconnect=Interconnect.PCIE)


def test_probe_by_digest_from_build_records(docker_client, base_image, local_registry: LocalRegistry,  # noqa: F811
                                            tmp_path):
    unique = uuid.uuid4().hex[:12]
    labels = [arg for key, value in {**session_labels(), "io.stackforge.test.handoff": unique}.items()
              for arg in ("--label", f"{key}={value}")]
    context = tmp_path / "ctx"
    context.mkdir()
    (context / "Dockerfile").write_text(f"FROM {base_image}\n")
    tag = f"stackforge-test/handoff:{unique}"
    built = runner.run(["docker", "build", "--network", "host", *labels, "-t", tag, str(context)], timeout=300)
    assert built.succeeded, built.output_tail
    image_id = docker_client.images.get(tag).id
    pushed = registry.push(tag, registry.Repository.parse(f"{local_registry.host}/stackforge-test/handoff"), unique)

    stack, derived = small_cell()
    out = tmp_path / "build-out"
    write_record(out, BuildRecord(stack_id=stack.id, stack=stack.to_json(), derived=derived.to_json(),
                                  status=BuildStatus.BUILT, image_tag=pushed.tagged, image_id=image_id,
                                  repo_digest=pushed.ref))
    docker_client.images.remove(image_id, force=True)          # gone here: the probe must pull it
    assert not docker_client.images.list(filters={"label": f"io.stackforge.test.handoff={unique}"})

    ok = ProbeSpec(id="t.ok", feature="flashinfer-jit", tier="gate", script="ok.py", description="ok",
                   preconditions=Preconditions(), default_timeout_s=60, args=())
    records = run_probe_jobs([CellJob(stack, TARGET, ok)], run_id="handoff", host_gpus=HostGpus(False, "none"),
                             write=lambda r: None, client=docker_client, builds_dir=out, scripts_dir=MISBEHAVE)
    try:
        (record,) = records
        assert record.outcome.status is Status.PASS, record.outcome
        assert record.provenance.digest == pushed.ref
        assert record.provenance.image_id == image_id           # the very image that was built and pushed
    finally:
        for image in docker_client.images.list(filters={"label": f"io.stackforge.test.handoff={unique}"}):
            docker_client.images.remove(image.id, force=True)
