"""``stackforge doctor``: what this host offers, as a report of checks (pure).

The facts are gathered at the edge (:mod:`stackforge.doctor.facts`: the engine, ``docker buildx``,
disk, ``nvidia-smi``, the package index, a registry, pip's CA bundle); :func:`build_report` turns
them into checks, each with a status word and the facts it found, so the whole judgement is
unit-testable with made-up facts.

Statuses: ``ok``; ``warn`` (works, with a caveat); ``missing`` (not there: a tool, the engine, a
GPU); ``fail`` (there, but broken: an index that does not answer, a CA bundle path that does not
exist). Only **required** checks decide the exit code: the Docker engine, which ``build``,
``probe`` and ``bench`` need. Exit 1 when a required check is ``missing`` or ``fail``, else 0;
everything else is reported and never fails the command (``plan``, ``matrix``, ``pick`` and gate
work go on without a GPU, a registry or buildx).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum
from typing import Any

from stackforge.core.model import Target
from stackforge.doctor.disk_budget import NEEDS, DiskBudget, free_lines, gb_text, need_bytes_by_filesystem
from stackforge.edges.gpu_host import FindingStatus, HostGpuFacts, judge_gpu_host
from stackforge.edges.gpus import HostGpus, assign_gpus
from stackforge.edges.pip_config import redact_urls, without_credentials

DOCTOR_SCHEMA = "stackforge.doctor"
DOCTOR_SCHEMA_VERSION = 1
GIB = 1024 ** 3
#: A CUDA stack image is ~11 GiB (docs/measurements.md: the CUDA 13.1 wheels image is 11.6 GB).
ENGINE_DISK_WARN_GIB = 30
WORKDIR_DISK_WARN_GIB = 1
ENGINE_REMEDY = "start one: sudo scripts/setup-engine.sh (or set DOCKER_HOST to a running engine)"


class CheckStatus(str, Enum):
    OK = "ok"
    WARN = "warn"
    MISSING = "missing"
    FAIL = "fail"


# --------------------------------------------------------------------------- facts (gathered at the edge)

@dataclass(frozen=True, slots=True)
class EngineFacts:
    """The Docker engine at DOCKER_HOST (or the local socket)."""

    url: str
    docker_host_set: bool
    reachable: bool
    error: str = ""
    server_version: str = ""
    api_version: str = ""
    platform: str = ""
    data_root: str = ""
    runtimes: tuple[str, ...] = ()
    local: bool = True      # bind-mount paths here are paths the engine sees (unix socket, loopback TCP)


@dataclass(frozen=True, slots=True)
class BuildxFacts:
    docker_cli: bool
    version: str = ""
    error: str = ""


@dataclass(frozen=True, slots=True)
class DiskFacts:
    """Free space where something is written."""

    label: str          # "engine data root" | "working directory"
    path: str
    free_bytes: int | None = None
    total_bytes: int | None = None
    error: str = ""     # why it could not be measured


@dataclass(frozen=True, slots=True)
class IndexFacts:
    """One package index pip would use, and whether it answered."""

    url: str
    source: str          # --index-url | PIP_INDEX_URL | pip config (global.index-url) | pip's default
    role: str = "index"  # index | extra index
    reachable: bool | None = None   # None: not asked
    detail: str = ""


@dataclass(frozen=True, slots=True)
class RegistryFacts:
    ref: str
    host: str
    reachable: bool
    detail: str = ""


@dataclass(frozen=True, slots=True)
class CaFacts:
    """The CA bundle pip uses (a path only; its content is never read or shown)."""

    path: str = ""       # "" = none configured: pip's default trust store
    source: str = ""
    exists: bool = False


@dataclass(frozen=True, slots=True)
class HostFacts:
    engine: EngineFacts
    buildx: BuildxFacts
    disks: tuple[DiskFacts, ...]
    gpus: HostGpus
    machine: str                               # platform.machine(): x86_64, aarch64
    indexes: tuple[IndexFacts, ...] = ()
    registry: RegistryFacts | None = None
    ca: CaFacts = field(default_factory=CaFacts)
    budget: DiskBudget | None = None           # None: not gathered (no check line)
    gpu_host: HostGpuFacts | None = None       # ``doctor --gpu``: the runtime runs' host check; None: not asked


# --------------------------------------------------------------------------- the report

@dataclass(frozen=True, slots=True)
class HostCheck:
    name: str
    status: CheckStatus
    summary: str
    facts: dict[str, Any] = field(default_factory=dict)
    hint: str = ""
    required: bool = False

    @property
    def blocking(self) -> bool:
        return self.required and self.status in (CheckStatus.MISSING, CheckStatus.FAIL)

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "status": self.status.value, "required": self.required, "summary": self.summary,
                "hint": self.hint, "facts": self.facts}


@dataclass(frozen=True, slots=True)
class DoctorReport:
    checks: tuple[HostCheck, ...]

    @property
    def exit_code(self) -> int:
        return 1 if any(c.blocking for c in self.checks) else 0

    def to_json(self) -> dict[str, Any]:
        return {"schema": DOCTOR_SCHEMA, "schema_version": DOCTOR_SCHEMA_VERSION, "exit_code": self.exit_code,
                "checks": [c.to_json() for c in self.checks]}

    def render(self) -> str:
        width = max(len(c.name) for c in self.checks)
        lines = []
        for check in self.checks:
            lines.append(f"{check.status.value:<8} {check.name:<{width}}  {check.summary}")
            if check.hint:
                lines.append(f"{'':<8} {'':<{width}}  hint: {check.hint}")
        blocking = [c.name for c in self.checks if c.blocking]
        lines.append("")
        lines.append(f"required check(s) not ok: {', '.join(blocking)} (exit 1)" if blocking else
                     "every required check is ok (exit 0)")
        return "\n".join(lines)


def build_report(facts: HostFacts, targets: dict[str, Target]) -> DoctorReport:
    """Judge the gathered facts (pure)."""
    checks = [engine_check(facts.engine), buildx_check(facts.buildx),
              *(disk_check(d) for d in facts.disks), *budget_checks(facts.budget), gpu_check(facts.gpus),
              targets_check(facts.gpus, targets, facts.machine),
              *(index_check(i) for i in facts.indexes), registry_check(facts.registry), ca_check(facts.ca),
              *gpu_host_checks(facts, targets)]
    return DoctorReport(tuple(checks))


#: How a host-check finding reads as a doctor line: "not readable" is a fact, not a caveat.
_FINDING_STATUS = {FindingStatus.OK: CheckStatus.OK, FindingStatus.WARN: CheckStatus.WARN,
                   FindingStatus.FAIL: CheckStatus.FAIL, FindingStatus.NOT_READABLE: CheckStatus.OK}


def gpu_host_checks(facts: HostFacts, targets: dict[str, Target]) -> tuple[HostCheck, ...]:
    """``doctor --gpu``: the host check every runtime probe and bench run starts with
    (:func:`stackforge.edges.gpu_host.judge_gpu_host`), one line per finding for each target this host can run.
    A failing finding is required (exit 1): the runs would record that target's results ``undecided (host: ...)``."""
    if facts.gpu_host is None:
        return ()
    verdicts = runnable_targets(facts.gpus, targets, facts.machine)
    runnable = [name for name, verdict in verdicts.items() if not verdict.startswith("not runnable")]
    if not runnable:
        return (HostCheck("gpu host", CheckStatus.MISSING, "no target is runnable here: nothing to check "
                          "(see the targets line)", {"targets": []}),)
    checks = []
    for name in runnable:
        verdict = judge_gpu_host(facts.gpu_host, targets[name])
        for finding in verdict.findings:
            status = _FINDING_STATUS[finding.status]
            checks.append(HostCheck(f"gpu host ({name}) {finding.check}", status, finding.text,
                                    {"target": name, **finding.to_json(), "host": facts.gpu_host.to_json()},
                                    required=status is CheckStatus.FAIL))
    return tuple(checks)


def engine_check(engine: EngineFacts) -> HostCheck:
    facts = {"url": engine.url, "docker_host": engine.url if engine.docker_host_set else None,
             "api_reachable": engine.reachable}
    if not engine.reachable:
        return HostCheck("engine", CheckStatus.MISSING, f"no Docker engine answers at {engine.url}: {engine.error}",
                         {**facts, "error": engine.error}, hint=ENGINE_REMEDY, required=True)
    facts.update(server_version=engine.server_version, api_version=engine.api_version, platform=engine.platform,
                 data_root=engine.data_root, runtimes=list(engine.runtimes), local=engine.local)
    where = "" if engine.local else " (remote: build contexts and mounts are copied)"
    return HostCheck("engine", CheckStatus.OK, f"Docker {engine.server_version} (API {engine.api_version}, "
                     f"{engine.platform}) at {engine.url}{where}", facts, required=True)


def buildx_check(buildx: BuildxFacts) -> HostCheck:
    if not buildx.docker_cli:
        return HostCheck("buildx", CheckStatus.MISSING, "no docker CLI on PATH: builds use the SDK's classic builder",
                         {"version": None}, hint="install docker-cli and docker-buildx (scripts/setup-engine.sh)")
    if not buildx.version:
        return HostCheck("buildx", CheckStatus.MISSING, f"docker buildx does not run ({buildx.error}): builds use the "
                         "classic builder", {"version": None, "error": buildx.error},
                         hint="install the buildx plugin (scripts/setup-engine.sh)")
    return HostCheck("buildx", CheckStatus.OK, buildx.version, {"version": buildx.version})


def disk_check(disk: DiskFacts) -> HostCheck:
    name = "disk (engine)" if disk.label == "engine data root" else "disk (cwd)"
    facts = {"label": disk.label, "path": disk.path, "free_bytes": disk.free_bytes, "total_bytes": disk.total_bytes}
    if disk.free_bytes is None:
        where = f"{disk.label}{' ' + disk.path if disk.path else ''}"
        return HostCheck(name, CheckStatus.WARN, f"{where}: not measured ({disk.error})",
                         {**facts, "error": disk.error})
    free_gib = disk.free_bytes / GIB
    text = f"{free_gib:.1f} GiB free of {disk.total_bytes / GIB:.1f} GiB at {disk.path} ({disk.label})"
    floor = ENGINE_DISK_WARN_GIB if disk.label == "engine data root" else WORKDIR_DISK_WARN_GIB
    if free_gib < floor:
        why = "a CUDA stack image takes ~11 GiB" if disk.label == "engine data root" else "logs and results"
        return HostCheck(name, CheckStatus.WARN, f"{text}: under {floor} GiB ({why})", facts,
                         hint="free space (docker image prune removes only unused images)")
    return HostCheck(name, CheckStatus.OK, text, facts)


def budget_checks(budget: DiskBudget | None) -> tuple[HostCheck, ...]:
    """The ``disk budget`` line: free space against what scripts/test.sh and scripts/main-job.sh need
    (the figures of :data:`stackforge.doctor.disk_budget.NEEDS`, which both scripts check before they
    start), and what stackforge itself holds with the command that frees each."""
    if budget is None:
        return ()
    needs, short = [], []
    for need in NEEDS.values():
        for fs, wanted in need_bytes_by_filesystem(budget, need):
            enough = fs.free_bytes >= wanted
            needs.append(f"{need.command} needs {gb_text(wanted)} on {fs.mount} ({'enough' if enough else 'short'})")
            if not enough:
                short.append(need.command)
    free = ", ".join(f"{gb_text(fs.free_bytes)} free on {fs.mount}" for fs in budget.filesystems)
    held = ", ".join(f"{h.what} {gb_text(h.size_bytes)}" for h in budget.holdings)
    facts = {"filesystems": [{"mount": fs.mount, "free_bytes": fs.free_bytes, "roles": list(fs.roles)}
                             for fs in budget.filesystems],
             "engine_root": budget.engine_root, "engine_root_note": budget.engine_note or None,
             "needs_gb": {n.command: {"engine": n.engine_gb, "scratch": n.scratch_gb, "basis": n.basis}
                          for n in NEEDS.values()},
             "override_gb": budget.override_gb,
             "held": [{"what": h.what, "path": h.path, "bytes": h.size_bytes, "free_command": h.free_command,
                       "detail": h.detail} for h in budget.holdings]}
    summary = f"{free}; {'; '.join(needs)}; stackforge holds: {held}"
    hint = "; ".join(line.strip() for line in free_lines(budget))
    status = CheckStatus.WARN if short else CheckStatus.OK
    return (HostCheck("disk budget", status, summary, facts, hint=hint if short or hint else ""),)


def gpu_check(gpus: HostGpus) -> HostCheck:
    devices = [{"index": d.index, "name": d.name, "compute_cap": d.arch} for d in gpus.devices]
    facts = {"available": gpus.available, "driver": gpus.driver, "devices": devices, "evidence": gpus.evidence}
    if gpus.available:
        return HostCheck("gpus", CheckStatus.OK, gpus.evidence, facts)
    if gpus.devices:   # cards are there, but containers cannot get them
        return HostCheck("gpus", CheckStatus.WARN, gpus.evidence, facts,
                         hint="install nvidia-container-toolkit and register the nvidia runtime with the engine")
    return HostCheck("gpus", CheckStatus.MISSING, f"no GPU (gate tier only): {gpus.evidence}", facts)


def runnable_targets(gpus: HostGpus, targets: dict[str, Target], machine: str) -> dict[str, str]:
    """For each target: ``runnable``, or why runtime probes cannot run for it here (pure)."""
    verdicts = {}
    for name in sorted(targets):
        target = targets[name]
        assignment = assign_gpus(gpus, target)
        if machine not in ("x86_64", "amd64"):
            verdicts[name] = f"not runnable: images are linux/amd64, this host is {machine}"
        elif assignment.skip_reason:
            # The reason names what the host has (model, count, links): the runtime jobs skip with the same words.
            verdicts[name] = f"not runnable: {assignment.skip_reason}"
        elif assignment.devices is None:
            verdicts[name] = "unsure: nvidia-smi reports no compute capability (probes check the arch themselves)"
        else:
            verdicts[name] = f"runnable on GPUs {','.join(map(str, assignment.devices))}"
    return verdicts


def targets_check(gpus: HostGpus, targets: dict[str, Target], machine: str) -> HostCheck:
    verdicts = runnable_targets(gpus, targets, machine)
    runnable = [n for n, v in verdicts.items() if v.startswith("runnable")]
    unsure = [n for n, v in verdicts.items() if v.startswith("unsure")]
    facts = {"machine": machine, "targets": verdicts}
    if runnable:
        extra = f"; unsure: {', '.join(unsure)}" if unsure else ""
        return HostCheck("targets", CheckStatus.OK, f"runtime probes can run for: {', '.join(runnable)}{extra}", facts)
    if unsure:
        return HostCheck("targets", CheckStatus.WARN,
                         f"runtime probes may run for (nvidia-smi reports no compute capability): {', '.join(unsure)}",
                         facts)
    return HostCheck("targets", CheckStatus.MISSING, f"runtime probes can run for none of the {len(verdicts)} targets "
                     "(gate probes run for all)", facts)


def index_check(index: IndexFacts) -> HostCheck:
    # The URL may carry a user and token (PIP_INDEX_URL=https://user:token@...): shown and in --json, so redacted.
    url, detail = without_credentials(index.url), redact_urls(index.detail, [index.url])
    facts = {"url": url, "source": index.source, "role": index.role, "reachable": index.reachable,
             "detail": detail}
    name = "index" if index.role == "index" else "extra index"
    if index.reachable:
        return HostCheck(name, CheckStatus.OK, f"{url} answers ({index.source})", facts)
    return HostCheck(name, CheckStatus.FAIL, f"{url} does not answer ({index.source}): {detail}", facts,
                     hint="check the proxy and CA bundle, or build from a wheelhouse (--find-links, --index-url)")


def registry_check(registry: RegistryFacts | None) -> HostCheck:
    if registry is None:
        return HostCheck("registry", CheckStatus.OK, "none configured: images stay in the local engine "
                         "(--registry REF checks one)", {"ref": None})
    facts = {"ref": registry.ref, "host": registry.host, "reachable": registry.reachable, "detail": registry.detail}
    if registry.reachable:
        return HostCheck("registry", CheckStatus.OK, f"{registry.host} answers ({registry.detail})", facts)
    return HostCheck("registry", CheckStatus.FAIL, f"{registry.host} does not answer: {registry.detail}", facts,
                     hint="check the registry address and TLS, or hand images over with docker save/load")


def ca_check(ca: CaFacts) -> HostCheck:
    facts = {"path": ca.path or None, "source": ca.source or None, "exists": ca.exists}
    if not ca.path:
        return HostCheck("ca bundle", CheckStatus.OK, "none configured: pip uses its default trust store", facts)
    if not ca.exists:
        return HostCheck("ca bundle", CheckStatus.FAIL, f"{ca.path} ({ca.source}) does not exist: pip's TLS would fail",
                         facts, hint="fix pip's cert setting (pip config list) or PIP_CERT")
    return HostCheck("ca bundle", CheckStatus.OK, f"{ca.path} ({ca.source})", facts)
