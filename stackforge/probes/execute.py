"""Running probes: inside an image (Docker) or in the current Python environment (``--local``).

The probe side of the job runner (:mod:`stackforge.probes.jobs`): the probe :class:`~stackforge.probes.jobs.JobKind`,
a probe's arguments for a target, and the preconditions a probe is scheduled under. The probe
scripts (``stackforge/probes/scripts``) are mounted read-only into the container at run time, never
baked into images. Each runs in its own process with a hard timeout; a hang becomes ``timeout``, a
death by signal becomes ``crash`` (with the signal and the log tail as evidence), and a script that
prints no result line becomes ``error``. Every container is removed afterwards.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from stackforge.core.model import Stack, Target
from stackforge.core.records import Outcome, ResultRecord, Status
from stackforge.edges import runner
from stackforge.edges.gpus import HostGpus
from stackforge.probes import jobs
from stackforge.probes.jobs import (
    ImageRef,
    Job,
    JobKind,
    run_job_in_container,
    run_job_locally,
    unserved_gpus,
)

SCRIPTS_DIR = Path(__file__).resolve().parent / "scripts"
CONTAINER_SCRIPTS = "/stackforge/probes"
EVIDENCE_CHARS = 4000
#: A probe script may report any status but the two only the runner observes.
PROBE_STATUSES = frozenset(set(Status) - {Status.TIMEOUT, Status.CRASH})

__all__ = ["CONTAINER_SCRIPTS", "EVIDENCE_CHARS", "SCRIPTS_DIR", "ImageRef", "ProbeContext", "outcome_from_ending", "plan_probe_job", "probe_kind", "run_in_container", "run_locally", "unmet_precondition"]


@dataclass(frozen=True, slots=True)
class ProbeContext:
    """Everything a probe run needs besides the probe itself (passed explicitly)."""

    run_id: str
    target: Target
    host_gpus: HostGpus
    timeout_s: float | None = None          # overrides each probe's default
    scripts_dir: Path = SCRIPTS_DIR
    extra_env: dict[str, str] = field(default_factory=dict)


def probe_kind(scripts_dir: Path = SCRIPTS_DIR, extra_env: dict[str, str] | None = None) -> JobKind:
    """How probe scripts run: mounted at :data:`CONTAINER_SCRIPTS`, any status but timeout/crash."""
    return JobKind(name="probe", scripts_dir=scripts_dir, container_root=CONTAINER_SCRIPTS,
                   evidence_chars=EVIDENCE_CHARS, tail_chars=16000, statuses=PROBE_STATUSES,
                   env=dict(extra_env or {}))


def probe_args(spec: Any, target: Target) -> tuple[str, ...]:
    """A probe script's arguments for one target: the target's, then the spec's fixed ones."""
    return ("--arch", target.arch, "--gpus", str(target.gpu_count), "--interconnect", target.interconnect.value,
            *spec.args)


def unmet_precondition(spec: Any, target: Target, host_gpus: HostGpus) -> tuple[str, str] | None:
    """(reason, evidence) when the host or target cannot meet the probe's preconditions, else None.

    Only what is known before a container starts: the host's GPUs of the target's arch (the runtime
    tier) and the target's GPU count. What the image holds (nvcc, packages) each script checks itself.
    """
    unserved = unserved_gpus(spec, target, host_gpus)
    if unserved:
        return unserved
    min_gpus = spec.preconditions.min_gpus
    if target.gpu_count < min_gpus:
        return (f"target {target.name} has {target.gpu_count} GPU(s); {spec.id} needs {min_gpus}",
                f"{target.name}: gpu_count={target.gpu_count}")
    return None


def plan_probe_job(stack: Stack, spec: Any, target: Target, host_gpus: HostGpus,
                   timeout_s: float | None = None) -> Job:
    """One probe for one (stack, target), skipped up front when its preconditions are unmet (pure)."""
    unmet = unmet_precondition(spec, target, host_gpus)
    return Job(stack, target, spec, probe_args(spec, target), float(timeout_s or spec.default_timeout_s),
               *(unmet or (None, "")))


def outcome_from_ending(*, exit_code: int | None, timed_out: bool, signal: int | None, output: str,
                        duration_s: float, timeout_s: float) -> tuple[Outcome, dict[str, Any]]:
    """Pure: turn how a probe process ended (and what it printed) into an Outcome and its facts."""
    return jobs.outcome_from_ending(probe_kind(), exit_code=exit_code, timed_out=timed_out, signal=signal,
                                    output=output, duration_s=duration_s, timeout_s=timeout_s)


def run_in_container(client: Any, image: ImageRef, stack: Stack, spec: Any, ctx: ProbeContext,
                     *, log_path: Path | None = None, cancel: runner.CancelFlag | None = None) -> ResultRecord:
    """Run one probe in a fresh container of ``image`` (always removed afterwards); see
    :func:`stackforge.probes.jobs.run_job_in_container`."""
    job = plan_probe_job(stack, spec, ctx.target, ctx.host_gpus, ctx.timeout_s)
    return run_job_in_container(probe_kind(ctx.scripts_dir, ctx.extra_env), client, image, job, run_id=ctx.run_id,
                                host_gpus=ctx.host_gpus, log_path=log_path, cancel=cancel)


def run_locally(stack: Stack, spec: Any, ctx: ProbeContext, *, python: str = sys.executable,
                log_path: Path | None = None, cancel: runner.CancelFlag | None = None) -> ResultRecord:
    """Run one probe in this machine's Python environment (bare-metal boxes: ``--local``); see
    :func:`stackforge.probes.jobs.run_job_locally`."""
    job = plan_probe_job(stack, spec, ctx.target, ctx.host_gpus, ctx.timeout_s)
    return run_job_locally(probe_kind(ctx.scripts_dir, ctx.extra_env), job, run_id=ctx.run_id,
                           host_gpus=ctx.host_gpus, python=python, log_path=log_path, cancel=cancel)
