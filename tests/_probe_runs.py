"""One probe on one stack, run as a campaign runs it: :func:`stackforge.probes.execute.plan_probe_job`
(preconditions first), then the job runner with the probe kind. For tests that look at one record."""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from stackforge.core.model import Stack, Target
from stackforge.core.records import ResultRecord
from stackforge.edges.gpus import HostGpus
from stackforge.jobs import job_runner as jobs
from stackforge.probes.execute import SCRIPTS_DIR, ImageRef, plan_probe_job, probe_kind


@dataclass(frozen=True)
class ProbeContext:
    """Everything a probe run needs besides the probe itself."""

    run_id: str
    target: Target
    host_gpus: HostGpus
    timeout_s: float | None = None          # overrides each probe's default
    scripts_dir: Path = SCRIPTS_DIR
    extra_env: dict[str, str] = field(default_factory=dict)

    def job(self, stack: Stack, spec: Any) -> jobs.Job:
        return plan_probe_job(stack, spec, self.target, self.host_gpus, self.timeout_s)

    def kind(self) -> jobs.JobKind:
        return probe_kind(self.scripts_dir, self.extra_env)


def run_locally(stack: Stack, spec: Any, ctx: ProbeContext, *, python: str = sys.executable,
                log_path: Path | None = None) -> ResultRecord:
    """The probe in the Python environment of ``python`` (``--local``)."""
    return jobs.run_job_locally(ctx.kind(), ctx.job(stack, spec), run_id=ctx.run_id, host_gpus=ctx.host_gpus,
                                python=python, log_path=log_path)


def run_in_container(client: Any, image: ImageRef, stack: Stack, spec: Any, ctx: ProbeContext, *,
                     log_path: Path | None = None) -> ResultRecord:
    """The probe in a fresh container of ``image`` (removed afterwards)."""
    return jobs.run_job_in_container(ctx.kind(), client, image, ctx.job(stack, spec), run_id=ctx.run_id,
                                     host_gpus=ctx.host_gpus, log_path=log_path)


def script_result_in(client: Any, image: str, script_command: str, workspace: Path, *, before: str = "") -> dict:
    """One probe script's result line in ``image``, run by hand the way the runner mounts it: the scripts at
    /stackforge/probes, the in-image package on PYTHONPATH, ``workspace`` as the kept JIT cache at
    /stackforge/jit-cache. ``before`` is shell run first (e.g. to break the image on purpose)."""
    import json

    from _session import session_labels
    from _sfprobe import RESULT_PREFIX   # the in-image package is on sys.path (tests/conftest.py)

    from stackforge.inimage import HOST_DIR as INIMAGE_DIR
    output = client.containers.run(
        image, ["sh", "-c", f"{before}python3 /stackforge/probes/{script_command}"], remove=True,
        environment={"PYTHONPATH": "/stackforge/inimage"},
        volumes={str(SCRIPTS_DIR): {"bind": "/stackforge/probes", "mode": "ro"},
                 str(INIMAGE_DIR): {"bind": "/stackforge/inimage", "mode": "ro"},
                 str(workspace): {"bind": "/stackforge/jit-cache", "mode": "rw"}},
        labels=session_labels()).decode()
    line = output.strip().splitlines()[-1] if output.strip() else ""
    assert line.startswith(RESULT_PREFIX), output[-3000:]
    return json.loads(line[len(RESULT_PREFIX):])
