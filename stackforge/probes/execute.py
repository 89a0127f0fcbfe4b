"""Running probes: inside an image (Docker) or in the current Python environment (``--local``).

The probe side of the job runner (:mod:`stackforge.jobs.job_runner`): the probe :class:`~stackforge.jobs.job_runner.JobKind`,
a probe's arguments for a target, and the preconditions a probe is scheduled under. The probe
scripts (``stackforge/probes/scripts``) are mounted read-only into the container at run time, never
baked into images. Each runs in its own process with a hard timeout; a hang becomes ``timeout``, a
death by signal becomes ``crash`` (with the signal and the log tail as evidence), and a script that
prints no result line becomes ``error``. Every container is removed afterwards.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from stackforge.core.model import Stack, Target
from stackforge.core.records import Status
from stackforge.edges.gpus import HostGpus
from stackforge.jobs.job_runner import (
    ImageRef,
    Job,
    JobKind,
    unmet_gpus,
)

SCRIPTS_DIR = Path(__file__).resolve().parent / "scripts"
CONTAINER_SCRIPTS = "/stackforge/probes"
EVIDENCE_CHARS = 4000
#: A probe script may report any status but ``crash`` (only the runner sees a death by signal); its own
#: ``timeout`` is a step it watched under its own limit (a JIT build), the runner's a kill of the whole script.
PROBE_STATUSES = frozenset(set(Status) - {Status.CRASH})

__all__ = ["CONTAINER_SCRIPTS", "EVIDENCE_CHARS", "SCRIPTS_DIR", "ImageRef", "plan_probe_job", "probe_kind",
           "unmet_precondition"]


def probe_kind(scripts_dir: Path = SCRIPTS_DIR, extra_env: dict[str, str] | None = None) -> JobKind:
    """How probe scripts run: mounted at :data:`CONTAINER_SCRIPTS`, any status but crash."""
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
    return unmet_gpus(spec, target, host_gpus, spec.preconditions.min_gpus)


def plan_probe_job(stack: Stack, spec: Any, target: Target, host_gpus: HostGpus,
                   timeout_s: float | None = None) -> Job:
    """One probe for one (stack, target), skipped up front when its preconditions are unmet (pure)."""
    unmet = unmet_precondition(spec, target, host_gpus)
    return Job(stack, target, spec, probe_args(spec, target), float(timeout_s or spec.default_timeout_s),
               *(unmet or (None, "")))
