"""Running probes: inside an image (Docker) or in the current Python environment (``--local``).

The probe scripts (``stackforge/probes/scripts``) are mounted read-only into the container at run
time, never baked into images. Each runs in its own process with a hard timeout; a hang becomes
``timeout``, a death by signal becomes ``crash`` (with the signal and the log tail as evidence),
and a script that prints no result line becomes ``error``. Every container is removed afterwards.

Only the software under test decides a result: a probe cut short by its run's interruption (the
``cancel`` flag) raises :class:`~stackforge.errors.Interrupted`, and one whose container the engine
stopped raises :class:`~stackforge.errors.ContainerStoppedByEngine`; neither becomes a record.
"""

from __future__ import annotations

import platform
import shutil
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from stackforge import runner
from stackforge.errors import Interrupted
from stackforge.model import Stack, Target
from stackforge.probes.scripts._sfshared import parse_result_line
from stackforge.records import Outcome, Provenance, ResultRecord, Status, Tier, utc_now

SCRIPTS_DIR = Path(__file__).resolve().parent / "scripts"
CONTAINER_SCRIPTS = "/stackforge/probes"
EVIDENCE_CHARS = 4000


@dataclass(frozen=True, slots=True)
class ImageRef:
    """The image a stack's probes run in, as it really is."""

    ref: str
    image_id: str
    digest: str | None = None


@dataclass(frozen=True, slots=True)
class HostGpu:
    """One GPU as nvidia-smi lists it: its index, name and compute capability (``"12.0"``; None
    when the driver's nvidia-smi is too old to report ``compute_cap``)."""

    index: int
    name: str
    arch: str | None = None

    def describe(self) -> str:
        return f"{self.index}: {self.name} ({self.arch or 'arch unknown'})"


@dataclass(frozen=True, slots=True)
class HostGpus:
    """What the probing host offers for GPU probes, and the evidence for it."""

    available: bool
    evidence: str
    names: tuple[str, ...] = ()
    driver: str | None = None
    devices: tuple[HostGpu, ...] = ()


@dataclass(frozen=True, slots=True)
class GpuAssignment:
    """The host GPUs one run for one target gets.

    On a mixed host (say four H100 and two RTX PRO 6000) a run for an sm_120 target must see only
    the sm_120 cards: a rank on the wrong card would measure the wrong GPU. ``devices`` None means
    every GPU (nvidia-smi did not report compute capabilities; the scripts then check the arch of
    what they see themselves); an empty tuple means none.
    """

    devices: tuple[int, ...] | None
    skip_reason: str | None = None

    def docker_gpus(self) -> str | None:
        """The ``docker run --gpus`` value: ``all``, ``device=4,5``, or None for no GPU."""
        if self.devices is None:
            return "all"
        return f"device={','.join(map(str, self.devices))}" if self.devices else None

    def environment(self) -> dict[str, str]:
        """``CUDA_VISIBLE_DEVICES`` for a process on this host (``--local``); empty when all are given.

        The indices are nvidia-smi's, which orders GPUs by PCI bus id; CUDA's own default order is
        fastest first, so on a mixed host ``CUDA_VISIBLE_DEVICES=4,5`` alone may name other cards.
        ``CUDA_DEVICE_ORDER=PCI_BUS_ID`` makes CUDA number them as nvidia-smi does.
        """
        if self.devices is None:
            return {}
        return {"CUDA_DEVICE_ORDER": "PCI_BUS_ID", "CUDA_VISIBLE_DEVICES": ",".join(map(str, self.devices))}


NO_GPUS = GpuAssignment(devices=())


def assign_gpus(host_gpus: HostGpus, target: Target) -> GpuAssignment:
    """The GPUs of this host whose compute capability is the target's (pure).

    Args:
        host_gpus: from :func:`detect_host_gpus`.
        target: the target the run speaks for; its ``arch`` is ``"major.minor"``.
    """
    if not host_gpus.available:
        return GpuAssignment((), f"no GPU on this host: {host_gpus.evidence}")
    if not host_gpus.devices or any(d.arch is None for d in host_gpus.devices):
        return GpuAssignment(None)
    matching = tuple(d.index for d in host_gpus.devices if d.arch == target.arch)
    if not matching:
        listed = "; ".join(d.describe() for d in host_gpus.devices)
        return GpuAssignment((), f"no GPU of compute capability {target.arch} ({target.name}) on this host: {listed}")
    return GpuAssignment(matching)


@dataclass(frozen=True, slots=True)
class ProbeContext:
    """Everything a probe run needs besides the probe itself (passed explicitly)."""

    run_id: str
    target: Target
    host_gpus: HostGpus
    timeout_s: float | None = None          # overrides each probe's default
    scripts_dir: Path = SCRIPTS_DIR
    extra_env: dict[str, str] = field(default_factory=dict)


def probe_argv(spec: Any, target: Target, *, python: str, scripts_root: str) -> list[str]:
    """The command line of one probe script for one target."""
    return [python, f"{scripts_root}/{spec.script}", "--arch", target.arch, "--gpus", str(target.gpu_count),
            "--interconnect", target.interconnect.value, *spec.args]


def timeout_for(spec: Any, ctx: ProbeContext) -> float:
    return float(ctx.timeout_s or spec.default_timeout_s)


def outcome_from_ending(*, exit_code: int | None, timed_out: bool, signal: int | None, output: str,
                        duration_s: float, timeout_s: float) -> tuple[Outcome, dict[str, Any]]:
    """Pure: turn how a probe process ended (and what it printed) into an Outcome and its facts."""
    tail = output[-EVIDENCE_CHARS:]
    if timed_out:
        return Outcome(Status.TIMEOUT, f"killed at its {timeout_s:g} s timeout", evidence=tail,
                       duration_s=duration_s), {}
    if signal is not None:
        name = runner.signal_name(signal)
        return Outcome(Status.CRASH, f"probe process died by {name} (exit status {exit_code})",
                       evidence=tail, metrics={"signal": signal}, duration_s=duration_s), {}
    payload = parse_result_line(output)
    if payload is None:
        return Outcome(Status.ERROR, f"probe printed no STACKFORGE_RESULT line (exit status {exit_code})",
                       evidence=tail, duration_s=duration_s), {}
    return _outcome_from_payload(payload, tail, duration_s), dict(payload.get("facts") or {})


def _outcome_from_payload(payload: dict[str, Any], tail: str, duration_s: float) -> Outcome:
    try:
        status = Status(payload.get("status"))
    except ValueError:
        return Outcome(Status.ERROR, f"probe reported unknown status {payload.get('status')!r}", evidence=tail,
                       duration_s=duration_s)
    if status in (Status.TIMEOUT, Status.CRASH):
        # Only the runner observes timeouts and crashes; a script cannot claim them.
        return Outcome(Status.ERROR, f"probe claimed status {status.value}", evidence=tail, duration_s=duration_s)
    evidence = str(payload.get("evidence") or "")
    return Outcome(status, str(payload.get("reason") or ""), evidence=evidence[-EVIDENCE_CHARS:],
                   metrics=dict(payload.get("metrics") or {}), duration_s=duration_s)


def provenance_from_facts(facts: dict[str, Any], image: ImageRef | None, host_gpus: HostGpus,
                          runner_kind: str) -> Provenance:
    """What was observed about the image and host (installed versions, not requested ones)."""
    versions = {str(k): str(v) for k, v in (facts.get("versions") or {}).items() if v is not None}
    return Provenance(
        image=image.ref if image else "", image_id=image.image_id if image else None,
        digest=image.digest if image else None, versions=versions,
        torch_arch_list=[str(a) for a in facts.get("torch_arch_list") or []],
        torch_git_version=facts.get("torch_git_version"), torch_cuda=facts.get("torch_cuda"),
        nvcc=facts.get("nvcc"), driver=facts.get("driver") or host_gpus.driver,
        gpus=[str(g) for g in facts.get("gpus") or host_gpus.names], host=platform.node(), runner=runner_kind)


def gpus_for(spec: Any, ctx: ProbeContext) -> GpuAssignment:
    """Gate probes get no GPU (their arch comes from ``--target``, so a visible card of another arch
    cannot colour the answer); runtime probes get the host GPUs of the target's arch."""
    if spec.tier != "runtime":
        return NO_GPUS
    return assign_gpus(ctx.host_gpus, ctx.target)


def skip_record(stack: Stack, spec: Any, ctx: ProbeContext, reason: str, image: ImageRef | None,
                runner_kind: str) -> ResultRecord:
    """A runtime probe the host cannot serve, skipped up front with the host evidence."""
    return make_record(stack, spec, ctx, Outcome(Status.SKIP, reason, evidence=ctx.host_gpus.evidence),
                       provenance_from_facts({}, image, ctx.host_gpus, runner_kind))


def make_record(stack: Stack, spec: Any, ctx: ProbeContext, outcome: Outcome, provenance: Provenance) -> ResultRecord:
    return ResultRecord(run_id=ctx.run_id, stack_id=stack.id, stack=stack.to_json(), target=ctx.target.name,
                        probe=spec.id, feature=spec.feature, tier=Tier(spec.tier), outcome=outcome,
                        provenance=provenance, kind="probe", created_at=utc_now())


def cut_short(stack: Stack, spec: Any, ctx: ProbeContext) -> Interrupted:
    """The error for a probe its run's interruption stopped: nothing was measured, so no record."""
    return Interrupted(f"probe {spec.id} on {stack.id} for {ctx.target.name} was cut short by the run's "
                       f"interruption; not recorded")


def run_in_container(client: Any, image: ImageRef, stack: Stack, spec: Any, ctx: ProbeContext,
                     *, log_path: Path | None = None, cancel: runner.CancelFlag | None = None) -> ResultRecord:
    """Run one probe in a fresh container of ``image`` (always removed afterwards).

    Raises:
        Interrupted: ``cancel`` was set while the probe ran (the run is being interrupted).
        ContainerStoppedByEngine / DockerUnavailableError: the engine stopped the container or went away.
    """
    from stackforge import docker_engine

    gpus = gpus_for(spec, ctx)
    if gpus.skip_reason:
        return skip_record(stack, spec, ctx, gpus.skip_reason, image, "docker")
    timeout = timeout_for(spec, ctx)
    docker_gpus = gpus.docker_gpus()
    run = docker_engine.run_container(
        client, image.image_id, probe_argv(spec, ctx.target, python="python3", scripts_root=CONTAINER_SCRIPTS),
        timeout=timeout, mounts=[docker_engine.Bind(ctx.scripts_dir, CONTAINER_SCRIPTS, copy_to_remote=True)],
        env={"PYTHONDONTWRITEBYTECODE": "1", "PYTHONUNBUFFERED": "1", **ctx.extra_env},
        labels={docker_engine.RUN_LABEL: ctx.run_id}, gpus=docker_gpus,
        ipc_mode="host" if docker_gpus else None, shm_size="16g" if docker_gpus else None,
        log_path=log_path, tail_chars=16000, cancel=cancel)
    if run.cancelled:
        raise cut_short(stack, spec, ctx)
    outcome, facts = outcome_from_ending(exit_code=run.exit_code, timed_out=run.timed_out, signal=run.signal,
                                         output=run.logs_tail, duration_s=run.duration_s, timeout_s=timeout)
    return make_record(stack, spec, ctx, outcome, provenance_from_facts(facts, image, ctx.host_gpus, "docker"))


def run_locally(stack: Stack, spec: Any, ctx: ProbeContext, *, python: str = sys.executable,
                log_path: Path | None = None, cancel: runner.CancelFlag | None = None) -> ResultRecord:
    """Run one probe in this machine's Python environment (bare-metal boxes: ``--local``).

    Raises:
        Interrupted: ``cancel`` was set while the probe ran (the run is being interrupted).
    """
    gpus = gpus_for(spec, ctx)
    if gpus.skip_reason:
        return skip_record(stack, spec, ctx, gpus.skip_reason, None, "local")
    timeout = timeout_for(spec, ctx)
    # A gate probe on a bare-metal GPU box sees no GPU either: CUDA_VISIBLE_DEVICES="" hides them.
    result = runner.run(probe_argv(spec, ctx.target, python=python, scripts_root=str(ctx.scripts_dir)),
                        timeout=timeout, env={"PYTHONDONTWRITEBYTECODE": "1", "PYTHONUNBUFFERED": "1",
                                              **gpus.environment(), **ctx.extra_env},
                        log_path=log_path, tail_chars=16000, cancel=cancel)
    if result.cancelled:
        raise cut_short(stack, spec, ctx)
    outcome, facts = outcome_from_ending(exit_code=result.returncode, timed_out=result.timed_out,
                                         signal=result.signal, output=result.output_tail,
                                         duration_s=result.duration_s, timeout_s=timeout)
    return make_record(stack, spec, ctx, outcome, provenance_from_facts(facts, None, ctx.host_gpus, "local"))


def detect_host_gpus(client: Any | None) -> HostGpus:
    """Whether this host can give containers (or local processes) a GPU, with the evidence."""
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return HostGpus(False, "nvidia-smi not found on the host")
    result = runner.run([smi, f"--query-gpu={SMI_FIELDS}", "--format=csv,noheader"], timeout=30)
    if not result.succeeded and "compute_cap" in result.output_tail:  # drivers before 510 lack the field
        result = runner.run([smi, f"--query-gpu={SMI_FIELDS_OLD}", "--format=csv,noheader"], timeout=30)
    rows = [r.split(",") for r in result.output_tail.strip().splitlines() if "," in r]
    if not result.succeeded or not rows:
        return HostGpus(False, f"nvidia-smi failed: {result.describe()}: {result.output_tail.strip()[-300:]}")
    devices = tuple(parse_smi_row(row) for row in rows)
    names = tuple(d.name for d in devices)
    driver = rows[0][2].strip()
    if client is not None:
        runtimes = sorted((client.info().get("Runtimes") or {}).keys())
        if "nvidia" not in runtimes:
            return HostGpus(False, f"GPUs {', '.join(names)} present but the engine has no nvidia runtime "
                                   f"(runtimes: {', '.join(runtimes)})", names, driver, devices)
    listed = "; ".join(d.describe() for d in devices)
    return HostGpus(True, f"{len(devices)} GPU(s): {listed}; driver {driver}", names, driver, devices)


#: nvidia-smi columns: index, name, driver_version[, compute_cap].
SMI_FIELDS = "index,name,driver_version,compute_cap"
SMI_FIELDS_OLD = "index,name,driver_version"


def parse_smi_row(row: list[str]) -> HostGpu:
    """One ``nvidia-smi --query-gpu=SMI_FIELDS`` CSV row (already split on commas)."""
    arch = row[3].strip() if len(row) > 3 and row[3].strip() not in ("", "[N/A]") else None
    return HostGpu(index=int(row[0]), name=row[1].strip(), arch=arch)
