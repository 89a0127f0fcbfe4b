"""The all-reduce sweep in a real container: an image with the CPU torch wheel, the bench scripts and
the shared probe helper mounted read-only, two gloo ranks spawned inside it (behind the engine's
init process), the result line read from the container's output, and the container removed.

Builds a small test image (about a minute) from the registry-free Debian base and removes it after.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from stackforge.bench import catalog as bench_catalog
from stackforge.bench import run as bench_run
from stackforge.bench.run import BenchOptions
from stackforge.core.data import resolve_matrix_path
from stackforge.core.records import Status
from stackforge.edges import docker_engine, runner
from stackforge.edges.gpus import HostGpus
from stackforge.jobs import job_runner
from stackforge.jobs.job_runner import ImageRef
from stackforge.plan.planner import plan_file

pytestmark = [pytest.mark.docker, pytest.mark.slow]

NO_GPU = HostGpus(False, "nvidia-smi not found on the host")
STACK_ID = "cu131-torch2.14.1-fi0.7.2-sgl0.5.23-py311-wheels-debian12"
DOCKERFILE = """\
FROM {base}
COPY wheels/ /tmp/wheels/
RUN python3 -m venv /opt/venv \\
 && /opt/venv/bin/pip install --no-index --find-links /tmp/wheels torch==2.13.0 \\
 && rm -rf /tmp/wheels /root/.cache
ENV PATH=/opt/venv/bin:$PATH
"""


@pytest.fixture(scope="module")
def cpu_torch_image(docker_client, base_image, tmp_path_factory):
    """A throw-away image: the Debian base plus torch 2.13.0+cpu from the wheelhouse (no index inside)."""
    import _session

    context = tmp_path_factory.mktemp("cpu-torch-image")
    download = runner.run([sys.executable, "-m", "pip", "download", "-q", "--only-binary=:all:", "--python-version",
                           "3.11", "--platform", "manylinux_2_28_x86_64", "--implementation", "cp", "--dest",
                           str(context / "wheels"), "torch==2.13.0"], timeout=900)
    if not download.succeeded:
        pytest.skip(f"cannot fetch the CPU torch wheel and its dependencies: {download.output_tail[-500:]}")
    (context / "Dockerfile").write_text(DOCKERFILE.format(base=base_image))
    tag = f"stackforge-test/bench-cpu-torch:{_session.SESSION_ID}"
    labels = {_session.TEST_LABEL: "1", _session.TEST_SESSION_LABEL: _session.SESSION_ID}
    label_args = [arg for key, value in labels.items() for arg in ("--label", f"{key}={value}")]
    build = runner.run(["docker", "build", "--network", "host", *label_args, "-t", tag, str(context)], timeout=1200)
    assert build.succeeded, build.output_tail[-3000:]
    image = docker_client.images.get(tag)
    try:
        yield ImageRef(tag, image.id)
    finally:
        docker_client.images.remove(image.id, force=True)


def test_gloo_sweep_runs_in_a_container(docker_client, cpu_torch_image, tmp_path):
    plan = plan_file(resolve_matrix_path(None), targets=("rtx-pro-6000-x2-pcie",), only=(STACK_ID,))
    spec = next(s for s in bench_catalog.catalog() if s.id == "bench.allreduce.gloo")
    options = BenchOptions(repeats=2, max_bytes=1 << 16)
    job = bench_run.plan_bench(plan, (spec,), options, host_gpus=NO_GPU, local=False)[0]
    record = job_runner.run_job_in_container(bench_run.bench_kind(options), docker_client, cpu_torch_image, job,
                                             run_id="sf-bench-ctr", host_gpus=NO_GPU, log_path=tmp_path / "log")
    outcome = record.outcome
    assert outcome.status is Status.PASS, outcome.reason + "\n" + outcome.evidence
    rows = outcome.metrics["rows"]
    assert rows[-1]["size_bytes"] == 1 << 16 and all(r["wrong"] == 0 for r in rows)
    assert record.provenance.versions["torch"] == "2.13.0+cpu"       # observed inside the image
    assert record.provenance.image_id == cpu_torch_image.image_id and record.provenance.runner == "docker"
    assert "STACKFORGE_RESULT" in Path(tmp_path / "log").read_text()
    assert not docker_client.containers.list(all=True, filters={"label": f"{docker_engine.RUN_LABEL}=sf-bench-ctr"})
