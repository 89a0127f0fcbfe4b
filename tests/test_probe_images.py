"""Which image a probe job runs in, and what a stack without one records: the build records of ``--builds`` say
whether it was built here; a stack they did not build is a skip saying why, not an error."""

from __future__ import annotations

from pathlib import Path

from _build_helpers import small_cell

from stackforge.build.records import BuildRecord, BuildStatus
from stackforge.build.records import write_record as write_build_record
from stackforge.core.model import Interconnect, Target
from stackforge.core.records import Status
from stackforge.edges.gpus import HostGpus
from stackforge.jobs.campaign import CellJob
from stackforge.probes.campaign import run_probe_jobs
from stackforge.probes.catalog import Preconditions, ProbeSpec

MISBEHAVE = Path(__file__).resolve().parent / "probes_misbehave"
RTX = Target(name="rtx-pro-6000-x8-pcie", gpu="NVIDIA RTX PRO 6000 Blackwell", arch="12.0", gpu_count=2,
             interconnect=Interconnect.PCIE)
GATE = ProbeSpec(id="t.gate.visible", feature="p2p-access", tier="gate", script="visible_gpus.py",
                 description="reports CUDA_VISIBLE_DEVICES", preconditions=Preconditions(), default_timeout_s=30)


def test_a_stack_the_build_records_did_not_build_is_a_skip_not_an_error(tmp_path):
    """probe --builds DIR: a stack without a build record there (the main job does not build the registry-based
    devel stack) or whose build failed is 'skip: not built here (...)', out of the error counts; nothing broke."""
    stack = small_cell()[0]
    builds = tmp_path / "builds"
    builds.mkdir()
    client = object()            # never asked: the build records answer first
    (record,) = run_probe_jobs([CellJob(stack, RTX, GATE)], run_id="t", host_gpus=HostGpus(False, "none"),
                               write=lambda r: None, client=client, builds_dir=builds, scripts_dir=MISBEHAVE)
    assert (record.outcome.status, record.outcome.reason) == (Status.SKIP,
                                                              f"not built here (no build record for it in {builds})")
    write_build_record(builds, BuildRecord(stack_id=stack.id, stack=stack.to_json(), derived={},
                                           status=BuildStatus.FAILED, reason="base image needs a registry"))
    (record,) = run_probe_jobs([CellJob(stack, RTX, GATE)], run_id="t2", host_gpus=HostGpus(False, "none"),
                               write=lambda r: None, client=client, builds_dir=builds, scripts_dir=MISBEHAVE)
    assert record.outcome.reason == f"not built here (its build in {builds} failed: base image needs a registry)"
