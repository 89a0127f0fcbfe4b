"""Probes in real containers: misbehaving probes, the GPU skip, and the gate answers of two real images.

* A probe that hangs is killed at its timeout and reported ``timeout``; one that segfaults is
  reported ``crash`` with its signal and log tail; the rest of the suite still runs; no container
  is left behind (the probes are real scripts in real containers of the bootstrapped base).
* Runtime probes on a machine without a GPU are skipped with the host's evidence.
* Two small real stack images (CPU torch from the wheelhouse, the CUDA 13.0 toolkit wheels, real
  FlashInfer from PyPI) judged for sm_120 give different answers for FlashInfer allreduce fusion,
  each with FlashInfer's own output as evidence: 0.6.6 still gates trtllm_comm on SM90/SM100,
  0.7.2 admits SM12x.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
from _build_helpers import SYSTEM_CA, WHEELHOUSE, small_cell
from _probe_runs import ProbeContext, run_in_container

from stackforge.core.model import Interconnect, Target
from stackforge.core.records import Status
from stackforge.edges.docker_engine import MANAGED_LABEL
from stackforge.edges.gpus import HostGpus
from stackforge.jobs.campaign import CellJob
from stackforge.probes.campaign import run_probe_jobs
from stackforge.probes.catalog import Preconditions, ProbeSpec, catalog
from stackforge.probes.execute import ImageRef

pytestmark = [pytest.mark.docker]

MISBEHAVE = Path(__file__).resolve().parent / "probes_misbehave"
RTX = Target(name="rtx-pro-6000-x8-pcie", gpu="NVIDIA RTX PRO 6000 Blackwell", arch="12.0", gpu_count=8,
             interconnect=Interconnect.PCIE)
NO_GPU = HostGpus(False, "nvidia-smi not found on the host")
PROBES = {probe.id: probe for probe in catalog()}


def spec(probe_id: str, script: str, tier: str = "gate", timeout: float = 5.0) -> ProbeSpec:
    return ProbeSpec(id=probe_id, feature="flashinfer-jit", tier=tier, script=script, description=probe_id,
                     preconditions=Preconditions(), default_timeout_s=timeout, args=())


def left_over(client) -> list:
    return client.containers.list(all=True, filters={"label": MANAGED_LABEL})


def test_hang_crash_and_good_probes_in_real_containers(docker_client, base_image, tmp_path):
    stack, _ = small_cell()
    image = ImageRef(ref=base_image, image_id=docker_client.images.get(base_image).id)
    before = {c.id for c in left_over(docker_client)}
    ctx = ProbeContext(run_id="test-misbehave", target=RTX, host_gpus=NO_GPU, scripts_dir=MISBEHAVE)

    hung = run_in_container(docker_client, image, stack, spec("t.hang", "hang.py", timeout=4), ctx)
    assert hung.outcome.status is Status.TIMEOUT
    assert "killed at its 4 s timeout" in hung.outcome.reason
    assert "this line is the last output" in hung.outcome.evidence

    crashed = run_in_container(docker_client, image, stack, spec("t.segv", "segv.py"), ctx)
    assert crashed.outcome.status is Status.CRASH
    assert "SIGSEGV" in crashed.outcome.reason and crashed.outcome.metrics["signal"] == 11
    assert crashed.outcome.evidence.strip(), "the log tail is the evidence"

    assert {c.id for c in left_over(docker_client)} == before, "no probe container may be left behind"


def test_suite_goes_on_after_a_hang_and_a_crash(docker_client, base_image):
    stack, _ = small_cell()
    image = ImageRef(ref=base_image, image_id=docker_client.images.get(base_image).id)
    jobs = [CellJob(stack, RTX, spec("t.hang", "hang.py", timeout=3)), CellJob(stack, RTX, spec("t.segv", "segv.py")),
            CellJob(stack, RTX, spec("t.ok", "ok.py"))]
    written = []
    records = run_probe_jobs(jobs, run_id="test-suite", host_gpus=NO_GPU, write=written.append, client=docker_client,
                             parallel=2, images={stack.id: image}, scripts_dir=MISBEHAVE)
    statuses = {r.probe: r.outcome.status for r in records}
    assert statuses == {"t.hang": Status.TIMEOUT, "t.segv": Status.CRASH, "t.ok": Status.PASS}
    assert len(written) == 3


def test_runtime_probes_skip_without_a_gpu(docker_client, base_image):
    stack, _ = small_cell()
    image = ImageRef(ref=base_image, image_id=docker_client.images.get(base_image).id)
    ctx = ProbeContext(run_id="test-skip", target=RTX, host_gpus=NO_GPU)
    record = run_in_container(docker_client, image, stack, PROBES["runtime.nccl.graph-tree"], ctx)
    assert record.outcome.status is Status.SKIP
    assert record.outcome.reason == "no GPU on this host: nvidia-smi not found on the host"


@pytest.fixture(scope="module")
def two_fi_images(docker_client, base_image, tmp_path_factory):
    """Two small real images that differ in FlashInfer (0.6.6 vs 0.7.2), built with BuildKit."""
    from stackforge.build import Builder, BuildOptions, build_stacks
    from stackforge.edges.docker_engine import buildx_available, remove_labelled
    if not buildx_available():
        pytest.skip("docker buildx is not installed (scripts/setup-engine.sh installs it)")
    if not Path(WHEELHOUSE).is_dir():
        pytest.skip(f"needs the wheelhouse {WHEELHOUSE} (torch CPU wheel)")
    from _session import SESSION_ID, TEST_LABEL, TEST_SESSION_LABEL
    labels = {TEST_LABEL: "1", TEST_SESSION_LABEL: SESSION_ID, "io.stackforge.test.fi-gate": "1"}
    options = BuildOptions(find_links=Path(WHEELHOUSE), ca_bundle=Path(SYSTEM_CA) if Path(SYSTEM_CA).is_file() else None,
                           out_dir=tmp_path_factory.mktemp("fi-build"), no_deps=frozenset({"sglang"}),
                           labels=tuple(sorted(labels.items())), builder=Builder.BUILDX, timeout_s=1800.0)
    cells = [small_cell(flashinfer="0.6.6"), small_cell(flashinfer="0.7.2", sglang="0.5.23")]
    summary = build_stacks(cells, options, client=docker_client)
    assert not summary.failed, [(r.stack_id, r.reason) for r in summary.records]
    yield {c[0].flashinfer: (c[0], ImageRef(ref=r.image_tag, image_id=r.image_id))
           for c, r in zip(cells, summary.records)}
    remove_labelled(docker_client, "io.stackforge.test.fi-gate=1")


@pytest.mark.slow
def test_fi_allreduce_fusion_gate_differs_between_real_images(docker_client, two_fi_images):
    ctx = ProbeContext(run_id="test-fi-gate", target=RTX, host_gpus=NO_GPU)
    # The gate alone (no --build): this test is about FlashInfer's arch gate differing between releases;
    # building the module in these small images is the build step's question (test_flashinfer_gate_builds).
    fusion = dataclasses.replace(PROBES["gate.flashinfer.ar-fusion"], args=("--feature", "flashinfer-ar-fusion"))
    old_stack, old_image = two_fi_images["0.6.6"]
    new_stack, new_image = two_fi_images["0.7.2"]
    old = run_in_container(docker_client, old_image, old_stack, fusion, ctx)
    new = run_in_container(docker_client, new_image, new_stack, fusion, ctx)
    assert old.outcome.status is Status.FAIL, old.outcome
    assert "No supported CUDA architectures found for major versions [9, 10]" in old.outcome.evidence
    assert new.outcome.status is Status.PASS, new.outcome
    assert "compute_120" in new.outcome.evidence
    assert old.provenance.versions.get("flashinfer-python", "").startswith("0.6.6")
    assert new.provenance.versions.get("flashinfer-python", "").startswith("0.7.2")
