"""One job runner for the probe and bench scripts: plan a job, run it (in an image or locally), record it.

A :class:`Job` is one script for one (stack, target): its spec (anything with the :class:`JobSpec`
attributes: a probe or a bench), its full argument list, its hard timeout, and -- decided where the
job is scheduled -- why it is skipped without starting anything. A :class:`JobKind` says what
differs between the two families of scripts: the record kind, where the scripts are mounted, how
much of their output is evidence, which statuses a script may report and how its metrics are
finished (the bench adds the link peak).

A job's process ends (:func:`end_locally` through :mod:`stackforge.edges.runner`, :func:`end_in_container`
through :func:`stackforge.edges.docker_engine.run_container`: an :class:`Ending`, nothing judged) and
:func:`judge` is the one place that turns the ending into its record; :func:`run_job_locally` and
:func:`run_job_in_container` are the two joined, and :func:`run_jobs` the job loop.

Pure: :func:`judge`, :func:`outcome_from_ending` (how the process ended ->
:class:`~stackforge.core.records.Outcome`), :func:`outcome_from_payload` (a ``STACKFORGE_RESULT`` payload
-> Outcome), :func:`make_record`, :func:`skip_record`, :func:`missing_image_record`, :func:`gpus_for`.

Only the software under test decides a result: a job cut short by its run's interruption (the
``cancel`` flag) raises :class:`~stackforge.core.errors.Interrupted`, and one whose container the engine
stopped raises :class:`~stackforge.core.errors.ContainerStoppedByEngine`; neither becomes a record.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import os
import platform
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from stackforge.core.errors import Interrupted, ProbeError
from stackforge.core.model import Stack, Target
from stackforge.core.records import Outcome, Provenance, ResultRecord, Status, Tier, utc_now
from stackforge.edges import runner
from stackforge.edges.gpu_host import GpuHostVerdict, HostGpuFacts, driver_below, judge_gpu_host, read_gpu_host_facts
from stackforge.edges.gpu_locks import GpuFileLocks, GpuUsage, busy_memory_mib, busy_reason, read_gpu_usage
from stackforge.edges.gpus import NO_GPUS, GpuAssignment, HostGpus, assign_gpus, lock_keys
from stackforge.edges.turns import file_turn
from stackforge.inimage import CONTAINER_DIR as INIMAGE_CONTAINER_DIR
from stackforge.inimage import HOST_DIR as INIMAGE_HOST_DIR
from stackforge.inimage._sfshared import json_safe, parse_result_line

STACK_ID_LABEL = "io.stackforge.stack.id"
#: Kept JIT build caches (FlashInfer's workspace of the gate probe), one folder per (image, target arch) under
#: ``~/.cache/stackforge/jit`` unless this variable names another root: a rerun over the same image finds
#: its modules built and ninja proves them up to date in seconds; a rebuilt image (new id) starts cold.
JIT_CACHE_ENV = "STACKFORGE_JIT_CACHE"
#: Where a job's kept JIT workspace is mounted (its ninja files hold absolute paths: always the same one).
JIT_CACHE_CONTAINER_DIR = "/stackforge/jit-cache"
#: Every script runs with these (no stale bytecode in a read-only mount; output as it happens).
SCRIPT_ENV = {"PYTHONDONTWRITEBYTECODE": "1", "PYTHONUNBUFFERED": "1"}


def script_env(inimage_dir: str | Path, inherited_path: str | None = None) -> dict[str, str]:
    """:data:`SCRIPT_ENV` with the in-image package first on the import path (``import _sfprobe``),
    before ``inherited_path`` (a local run's own ``PYTHONPATH``; stack images set none: ``dockerfiles/``
    never does)."""
    return {**SCRIPT_ENV, "PYTHONPATH": os.pathsep.join(p for p in (str(inimage_dir), inherited_path) if p)}


# ---------------------------------------------------------------------------------------------- the host


@dataclass(frozen=True, slots=True)
class ImageRef:
    """The image a stack's jobs run in, as it really is."""

    ref: str
    image_id: str
    digest: str | None = None


# ---------------------------------------------------------------------------------------------- jobs


class JobSpec(Protocol):
    """What the runner reads of a probe or bench spec."""

    @property
    def id(self) -> str: ...          # the record's ``probe`` field
    @property
    def feature(self) -> str: ...
    @property
    def tier(self) -> str: ...        # a :class:`~stackforge.core.records.Tier` value
    @property
    def script(self) -> str: ...      # file name under the kind's scripts folder
    @property
    def args(self) -> tuple[str, ...]: ...
    @property
    def default_timeout_s(self) -> float: ...
    @property
    def needs_gpu(self) -> bool: ...  # gets the host GPUs of the target's arch


@dataclass(frozen=True, slots=True)
class Job:
    """One script for one (stack, target): its arguments and timeout, or why it is skipped."""

    stack: Stack
    target: Target
    spec: Any   # a JobSpec: stackforge.probes.catalog.ProbeSpec or stackforge.bench.catalog.BenchSpec
    args: tuple[str, ...]
    timeout_s: float
    skip_reason: str | None = None
    skip_evidence: str = ""


def _same_metrics(metrics: dict[str, Any], target: Target | None) -> dict[str, Any]:
    return metrics


@dataclass(frozen=True, slots=True)
class JobKind:
    """What differs between probe and bench scripts (passed explicitly to the runner).

    Attributes:
        name: the record's ``kind`` and the word in messages (``probe``, ``bench``).
        scripts_dir: the host folder of the scripts.
        container_root: where ``scripts_dir`` is mounted in a container.
        evidence_chars: how much of a script's evidence (or output tail) a record keeps.
        tail_chars: how much output the runner keeps to find the result line in.
        statuses: what a script may report itself (timeouts and crashes are the runner's to observe).
        tidy_reason: collapse the reason's whitespace to one line.
        strict_metrics: turn non-finite floats and tuples of the metrics into strict JSON.
        finish_metrics: adds context to a script's metrics (the bench: the target's link peak).
        mounts: a job's container mounts, the scripts' folder included; None: only the scripts' folder
            (the in-image package :mod:`stackforge.inimage` is mounted for every kind besides).
        env: extra environment for every script.
    """

    name: str
    scripts_dir: Path
    container_root: str
    evidence_chars: int
    tail_chars: int
    statuses: frozenset[Status]
    tidy_reason: bool = False
    strict_metrics: bool = False
    finish_metrics: Callable[[dict[str, Any], Target | None], dict[str, Any]] = _same_metrics
    mounts: Callable[[Job], list[Any]] | None = None
    env: Mapping[str, str] = field(default_factory=dict)

    def container_mounts(self, job: Job) -> list[Any]:
        """The job's mounts: the kind's own (else its scripts' folder), and the in-image package, both
        copied to a remote engine."""
        from stackforge.edges import docker_engine
        own = self.mounts(job) if self.mounts is not None else [
            docker_engine.Bind(self.scripts_dir, self.container_root, copy_to_remote=True)]
        return [*own, docker_engine.Bind(INIMAGE_HOST_DIR, INIMAGE_CONTAINER_DIR, copy_to_remote=True)]


def jit_cache_root(env: Mapping[str, str] | None = None) -> Path:
    """``$STACKFORGE_JIT_CACHE``, else ``~/.cache/stackforge/jit``."""
    configured = (os.environ if env is None else env).get(JIT_CACHE_ENV)
    return Path(configured).expanduser() if configured else Path.home() / ".cache" / "stackforge" / "jit"


def jit_cache_dir(image: ImageRef, target: Target, root: Path | None = None) -> Path:
    """The kept JIT workspace of one (image, target arch): keyed by the image id (content, not tag) and the
    target's compute capability, the only part of a target a JIT build depends on, so the targets of one
    arch (8 and 4 cards, PCIe or NVLink) share their builds; jobs take turns in it (:func:`jit_cache_turn`)."""
    return (root or jit_cache_root()) / image.image_id.replace(":", "-") / f"arch-{target.arch}"


#: In a kept JIT workspace: held by the job building in it, naming its run, probe and target; one per
#: builder script (``.stackforge-turn-flashinfer_gates``), see :func:`jit_cache_turn_file`.
JIT_CACHE_TURN_FILE = ".stackforge-turn"


def jit_cache_turn_file(folder: Path, spec: Any) -> Path:
    """The turn file of ``spec``'s builder in a kept JIT workspace. Each builder script writes a tree of its
    own there (FlashInfer's workspace; SGLang's and tvm-ffi's caches under ``sglang/``), so jobs of one script
    take turns and jobs of two scripts build side by side."""
    return folder / f"{JIT_CACHE_TURN_FILE}-{Path(spec.script).stem}"


@contextmanager
def jit_cache_turn(folder: Path | None, job: Job, run_id: str,
                   cancel: runner.CancelFlag | None) -> Iterator[bool]:
    """Hold the job's builder's part of its JIT workspace (``folder``; None: the job keeps none) alone while
    its container runs: two ninja runs in one build directory would race. Yields False when ``cancel`` was
    set while waiting."""
    if folder is None:
        yield True
        return

    def cancelled(seconds: float) -> bool:
        time.sleep(seconds)
        return cancel is not None and cancel.is_set()
    holder = f"run {run_id}: {job.spec.id} for {job.target.name}"
    with file_turn(jit_cache_turn_file(folder, job.spec), holder=holder, cancelled=cancelled) as ours:
        yield ours


def jit_cache_mount(job: Job, image: ImageRef, run_id: str, *, shares_host_files: bool,
                    root: Path | None = None) -> tuple[list[Any], list[str]]:
    """(mounts, script arguments) that give a spec keeping a JIT build cache (``jit_cache``) its
    per-(image, target arch) workspace, labelled with the run that fills it; nothing for other specs, or for
    an engine on another machine (a bind would name a folder over there)."""
    if not getattr(job.spec, "jit_cache", False) or not shares_host_files:
        return [], []
    from stackforge.edges import docker_engine
    folder = jit_cache_dir(image, job.target, root)
    folder.mkdir(parents=True, exist_ok=True)
    return ([docker_engine.Bind(folder, JIT_CACHE_CONTAINER_DIR, read_only=False)],
            ["--workspace", JIT_CACHE_CONTAINER_DIR, "--cache-label", run_id])


def argv(job: Job, *, python: str, scripts_root: str) -> list[str]:
    """The command line of one job's script."""
    return [python, f"{scripts_root}/{job.spec.script}", *job.args]


def gpus_for(spec: Any, target: Target, host_gpus: HostGpus) -> GpuAssignment:
    """The host GPUs of the target's arch for a spec that needs a GPU (a mixed host gives each target
    its own cards); none otherwise, so a visible card of another arch cannot colour a gate's answer."""
    return assign_gpus(host_gpus, target) if spec.needs_gpu else NO_GPUS


def unserved_gpus(spec: Any, target: Target, host_gpus: HostGpus) -> tuple[str, str] | None:
    """(reason, host evidence) when ``spec`` needs GPUs this host cannot give ``target``, else None."""
    reason = gpus_for(spec, target, host_gpus).skip_reason
    return (reason, host_gpus.evidence) if reason else None


def unmet_gpus(spec: Any, target: Target, host_gpus: HostGpus, min_gpus: int) -> tuple[str, str] | None:
    """(reason, evidence) when this host cannot give ``target`` the GPUs ``spec`` needs, or the target
    has fewer than ``min_gpus``; else None. What every job kind checks before it starts anything."""
    unserved = unserved_gpus(spec, target, host_gpus)
    if unserved:
        return unserved
    if target.gpu_count < min_gpus:
        return (f"target {target.name} has {target.gpu_count} GPU(s); {spec.id} needs {min_gpus}",
                f"{target.name}: gpu_count={target.gpu_count}")
    return None


# ---------------------------------------------------------------------------------------------- outcomes


def outcome_from_ending(kind: JobKind, *, exit_code: int | None, timed_out: bool, signal: int | None, output: str,
                        duration_s: float, timeout_s: float,
                        target: Target | None = None) -> tuple[Outcome, dict[str, Any]]:
    """Pure: how a script's process ended (and what it printed) -> (Outcome, the facts it reported)."""
    tail = output[-kind.evidence_chars:]
    if timed_out:
        return Outcome(Status.TIMEOUT, f"killed at its {timeout_s:g} s timeout", evidence=tail,
                       duration_s=duration_s), {}
    if signal is not None:
        name = runner.signal_name(signal)
        return Outcome(Status.CRASH, f"{kind.name} process died by {name} (exit status {exit_code})",
                       evidence=tail, metrics={"signal": signal}, duration_s=duration_s), {}
    payload = parse_result_line(output)
    if payload is None:
        return Outcome(Status.ERROR, f"{kind.name} printed no STACKFORGE_RESULT line (exit status {exit_code})",
                       evidence=tail, duration_s=duration_s), {}
    facts = payload.get("facts")
    return (outcome_from_payload(kind, payload, duration_s=duration_s, target=target),
            dict(facts) if isinstance(facts, Mapping) else {})


def outcome_from_payload(kind: JobKind, payload: Mapping[str, Any], *, duration_s: float = 0.0,
                         target: Target | None = None) -> Outcome:
    """A script's ``STACKFORGE_RESULT`` payload -> :class:`Outcome`. A malformed payload is an ``error``;
    ``timeout``/``crash`` are the runner's to observe, so a script claiming them is an ``error`` too."""
    evidence = str(payload.get("evidence") or "")[-kind.evidence_chars:]
    try:
        status = Status(payload.get("status"))
    except ValueError:
        return Outcome(Status.ERROR, f"{kind.name} reported unknown status {payload.get('status')!r}",
                       evidence=evidence, duration_s=duration_s)
    if status not in kind.statuses:
        return Outcome(Status.ERROR, f"{kind.name} claimed status {status.value}", evidence=evidence,
                       duration_s=duration_s)
    metrics = payload.get("metrics") or {}
    if not isinstance(metrics, Mapping):
        return Outcome(Status.ERROR, f"{kind.name} metrics are a {type(metrics).__name__}, not an object",
                       evidence=evidence, duration_s=duration_s)
    metrics = kind.finish_metrics(json_safe(metrics) if kind.strict_metrics else dict(metrics), target)
    reason = str(payload.get("reason") or "")
    return Outcome(status, " ".join(reason.split()) if kind.tidy_reason else reason, evidence=evidence,
                   metrics=metrics, duration_s=duration_s)


# ---------------------------------------------------------------------------------------------- records


def provenance_from_facts(facts: Mapping[str, Any], image: ImageRef | None, host_gpus: HostGpus,
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


def make_record(kind: JobKind, job: Job, outcome: Outcome, provenance: Provenance, *, run_id: str) -> ResultRecord:
    """The result record of one job (its tier is the spec's)."""
    return ResultRecord(run_id=run_id, stack_id=job.stack.id, stack=job.stack.to_json(), target=job.target.name,
                        probe=job.spec.id, feature=job.spec.feature, tier=Tier(job.spec.tier), outcome=outcome,
                        provenance=provenance, kind=kind.name, created_at=utc_now())


def skip_record(kind: JobKind, job: Job, *, run_id: str, image: ImageRef | None, host_gpus: HostGpus,
                runner_kind: str) -> ResultRecord:
    """The record of a job skipped where it was scheduled (nothing ran): its reason and evidence."""
    outcome = Outcome(Status.SKIP, job.skip_reason or "", evidence=job.skip_evidence)
    return make_record(kind, job, outcome, provenance_from_facts({}, image, host_gpus, runner_kind), run_id=run_id)


def missing_image_record(kind: JobKind, job: Job, *, run_id: str, host_gpus: HostGpus,
                         not_built: str | None = None) -> ResultRecord:
    """A stack without an image cannot run its jobs. When the build records say it was not built here
    (``not_built``: no record, a failed or skipped build) that is a skip saying why, not an error: nothing
    broke. An image the records or labels promise and that is missing stays an honest error."""
    if not_built is not None:
        outcome = Outcome(Status.SKIP, f"not built here ({not_built})", evidence=not_built)
    else:
        outcome = Outcome(Status.ERROR, f"no image built for stack {job.stack.id}",
                          evidence=f"no local image carries the label {STACK_ID_LABEL}={job.stack.id}")
    return make_record(kind, job, outcome, provenance_from_facts({}, None, host_gpus, "docker"), run_id=run_id)


def not_built_reason(builds_dir: Path, stack: Stack) -> str | None:
    """Why the build records of ``builds_dir`` hold no image of ``stack`` (None: they say it was built)."""
    from stackforge.build.records import read_record

    record = read_record(builds_dir, stack.id)
    if record is None:
        return f"no build record for it in {builds_dir}"
    if record.status.ok:
        return None
    because = f": {record.reason}" if record.reason else ""
    return f"its build in {builds_dir} {record.status.value}{because}"


def cut_short(kind: JobKind, job: Job) -> Interrupted:
    """The error for a job its run's interruption stopped: nothing was measured, so no record."""
    return Interrupted(f"{kind.name} {job.spec.id} on {job.stack.id} for {job.target.name} was cut short by the "
                       f"run's interruption; not recorded")


# ---------------------------------------------------------------------------------------------- images


def find_stack_image(client: Any, stack: Stack) -> ImageRef | None:
    """The newest local image built for ``stack`` (found by its stack-id label)."""
    images = client.images.list(filters={"label": f"{STACK_ID_LABEL}={stack.id}"})
    if not images:
        return None
    newest = max(images, key=lambda image: image.attrs.get("Created", ""))
    tags = newest.tags or [newest.id]
    digests = newest.attrs.get("RepoDigests") or []
    return ImageRef(ref=tags[0], image_id=newest.id, digest=digests[0] if digests else None)


def image_from_build_record(client: Any, builds_dir: Path, stack: Stack) -> ImageRef | None:
    """The image a build record names: the local image if it is here, else pulled by its digest.

    This is the registry hand-off: images built (and pushed) on one machine are probed on another
    by digest, never by a tag that may have moved since.
    """
    from stackforge.build.records import read_record
    from stackforge.edges.registry import pull

    record = read_record(builds_dir, stack.id)
    if record is None or not record.status.ok:
        return None
    for candidate in (record.image_id, record.repo_digest):
        local_id = _local_image(client, candidate) if candidate else None
        if local_id is not None:
            return ImageRef(ref=record.repo_digest or record.image_tag or candidate, image_id=local_id,
                            digest=record.repo_digest)
    if record.repo_digest:
        pulled = pull(record.repo_digest)
        return ImageRef(ref=pulled.ref, image_id=pulled.image_id, digest=record.repo_digest)
    return None


def _local_image(client: Any, ref: str) -> str | None:
    import docker.errors
    try:
        return client.images.get(ref).id
    except docker.errors.ImageNotFound:
        return None


def stack_image(client: Any, stack: Stack, builds_dir: Path | None = None) -> ImageRef | None:
    """The image to run ``stack``'s probes or benchmarks in: from a build record, else by label."""
    return image_from_build_record(client, builds_dir, stack) if builds_dir else find_stack_image(client, stack)


# ---------------------------------------------------------------------------------------------- running


@dataclass(frozen=True, slots=True)
class Ending:
    """How one job's process ended, as the runner observed it (nothing judged yet)."""

    exit_code: int | None
    timed_out: bool
    signal: int | None
    output: str            # the tail of what it printed
    duration_s: float
    cancelled: bool        # the run's cancel flag stopped it
    image: ImageRef | None
    runner_kind: str       # local | docker


#: How much of a job's log is read back for a result line longer than the output tail the runner keeps.
RESULT_LOG_READ_BYTES = 8 * 1024 * 1024


def with_result_line(tail: str, log_path: Path | None) -> str:
    """The output a job's ending is judged on: the ``tail`` the runner kept; when the script's result line is
    longer than that tail (its start cut off, so no ``STACKFORGE_RESULT`` line is left in it), the end of the
    job's log (redacted like the tail), which holds the whole line, so a long result is still the script's answer."""
    if parse_result_line(tail) is not None or log_path is None or not log_path.is_file():
        return tail
    with log_path.open("rb") as handle:
        handle.seek(max(0, log_path.stat().st_size - RESULT_LOG_READ_BYTES))
        text = handle.read().decode("utf-8", errors="replace")
    return text if parse_result_line(text) is not None else tail


def judge(kind: JobKind, job: Job, ending: Ending, *, run_id: str, host_gpus: HostGpus) -> ResultRecord:
    """The one place a job's ending becomes its record.

    Raises:
        Interrupted: the run's interruption stopped the job (its ending is not the software's answer).
    """
    if ending.cancelled:
        raise cut_short(kind, job)
    outcome, facts = outcome_from_ending(kind, exit_code=ending.exit_code, timed_out=ending.timed_out,
                                         signal=ending.signal, output=ending.output, duration_s=ending.duration_s,
                                         timeout_s=job.timeout_s, target=job.target)
    provenance = provenance_from_facts(facts, ending.image, host_gpus, ending.runner_kind)
    return make_record(kind, job, outcome, provenance, run_id=run_id)


def unstarted_record(kind: JobKind, job: Job, *, run_id: str, host_gpus: HostGpus, image: ImageRef | None,
                     in_image: bool, not_built: str | None = None) -> ResultRecord | None:
    """The record of a job that starts nothing: skipped where it was scheduled, or (``in_image``) its
    stack has no image; None for a job that runs."""
    if job.skip_reason:
        return skip_record(kind, job, run_id=run_id, image=image, host_gpus=host_gpus,
                           runner_kind="docker" if in_image else "local")
    if in_image and image is None:
        return missing_image_record(kind, job, run_id=run_id, host_gpus=host_gpus, not_built=not_built)
    return None


def run_job_locally(kind: JobKind, job: Job, *, run_id: str, host_gpus: HostGpus, python: str,
                    log_path: Path | None = None, cancel: runner.CancelFlag | None = None) -> ResultRecord:
    """Run one job in this machine's Python environment (``--local``), through :func:`runner.run`.

    Raises:
        Interrupted: ``cancel`` was set while the script ran (the run is being interrupted).
    """
    return unstarted_record(kind, job, run_id=run_id, host_gpus=host_gpus, image=None, in_image=False) or judge(
        kind, job, end_locally(kind, job, python=python, host_gpus=host_gpus, log_path=log_path, cancel=cancel),
        run_id=run_id, host_gpus=host_gpus)


def end_locally(kind: JobKind, job: Job, *, python: str, host_gpus: HostGpus, log_path: Path | None,
                cancel: runner.CancelFlag | None) -> Ending:
    """Start the job's script in ``python`` and wait for it to end (the edge of :func:`run_job_locally`)."""
    gpus = gpus_for(job.spec, job.target, host_gpus)
    # A job without a GPU on a bare-metal GPU box sees none either: CUDA_VISIBLE_DEVICES="" hides them.
    env = {**script_env(INIMAGE_HOST_DIR, os.environ.get("PYTHONPATH")), **gpus.environment(), **kind.env}
    result = runner.run(argv(job, python=python, scripts_root=str(kind.scripts_dir)), timeout=job.timeout_s,
                        env=env, log_path=log_path, tail_chars=kind.tail_chars, cancel=cancel)
    return Ending(result.returncode, result.timed_out, result.signal, with_result_line(result.output_tail, log_path),
                  result.duration_s, result.cancelled, None, "local")


def run_job_in_container(kind: JobKind, client: Any, image: ImageRef, job: Job, *, run_id: str,
                         host_gpus: HostGpus, log_path: Path | None = None,
                         cancel: runner.CancelFlag | None = None) -> ResultRecord:
    """Run one job in a fresh container of ``image`` (always removed afterwards).

    Raises:
        Interrupted: ``cancel`` was set while the script ran (the run is being interrupted).
        ContainerStoppedByEngine / DockerUnavailableError: the engine stopped the container or went away.
    """
    return unstarted_record(kind, job, run_id=run_id, host_gpus=host_gpus, image=image, in_image=True) or judge(
        kind, job, end_in_container(kind, client, image, job, run_id=run_id, host_gpus=host_gpus, log_path=log_path,
                                    cancel=cancel), run_id=run_id, host_gpus=host_gpus)


def end_in_container(kind: JobKind, client: Any, image: ImageRef, job: Job, *, run_id: str, host_gpus: HostGpus,
                     log_path: Path | None, cancel: runner.CancelFlag | None) -> Ending:
    """Run the job's script in a fresh container of ``image``, with the GPUs, host IPC and the large
    /dev/shm NCCL needs when it gets GPUs, and wait for it to end (the edge of :func:`run_job_in_container`)."""
    from stackforge.edges import docker_engine

    docker_gpus = gpus_for(job.spec, job.target, host_gpus).docker_gpus()
    cache_mounts, cache_args = jit_cache_mount(
        job, image, run_id, shares_host_files=docker_engine.engine_shares_host_files(docker_engine.engine_url()))
    cache_folder = Path(cache_mounts[0].source) if cache_mounts else None   # jit_cache_mount's one folder
    with jit_cache_turn(cache_folder, job, run_id, cancel) as ours:
        if not ours:
            return Ending(None, False, None, "cancelled while waiting for its turn in the JIT build cache", 0.0,
                          True, image, "docker")
        run = docker_engine.run_container(
            client, image.image_id, [*argv(job, python="python3", scripts_root=kind.container_root), *cache_args],
            timeout=job.timeout_s, mounts=[*kind.container_mounts(job), *cache_mounts],
            env={**script_env(INIMAGE_CONTAINER_DIR), **kind.env},
            labels={docker_engine.RUN_LABEL: run_id}, gpus=docker_gpus,
            ipc_mode="host" if docker_gpus else None, shm_size="16g" if docker_gpus else None,
            log_path=log_path, tail_chars=kind.tail_chars, cancel=cancel)
    return Ending(run.exit_code, run.timed_out, run.signal, with_result_line(run.logs_tail, log_path), run.duration_s,
                  run.cancelled, image, "docker")


# ---------------------------------------------------------------------------------------------- the host check


@dataclass(frozen=True, slots=True)
class HostGate:
    """The host check of one run, as its GPU jobs honour it (:func:`check_host` reads it at the run's start).

    ``verdicts``: one per target of the run's GPU jobs (:func:`stackforge.edges.gpu_host.judge_gpu_host`);
    ``floors``: each (stack id, target)'s driver floor from the plan; ``driver``: the host's. A GPU job whose
    stack's floor is above the driver is a skip naming both; a record of a job on a GPU a finding fails is
    ``undecided (host: ...)``, never a verdict on the stack.
    """

    verdicts: Mapping[str, GpuHostVerdict] = field(default_factory=dict)
    floors: Mapping[tuple[str, str], str | None] = field(default_factory=dict)
    driver: str | None = None
    facts: HostGpuFacts | None = None

    def skip_reason(self, job: Job) -> str | None:
        """Why a GPU job of this stack cannot run on this driver, or None (pure)."""
        floor = self.floors.get((job.stack.id, job.target.name))
        if driver_below(self.driver, floor):
            return (f"host: driver {self.driver} is below the stack's driver floor >= {floor} "
                    f"({job.stack.id} on {job.target.name})")
        return None

    def fault(self, job: Job, assignment: GpuAssignment) -> str | None:
        """The host finding that makes this job's record undecided, as ``check: text``, or None (pure)."""
        verdict = self.verdicts.get(job.target.name)
        finding = verdict.fault_for(assignment.devices) if verdict is not None else None
        return f"{finding.check}: {finding.text}" if finding is not None else None

    def to_json(self) -> dict[str, Any]:
        """What ``host.json`` gets: ``host_check`` (the facts, and each target's verdict) and ``check``, the
        run's one word the reports read (:func:`stackforge.report.compat_matrix.host_check_faults`): ``status``
        (``fail``, ``warn``, ``pass``, or ``not run`` where no job got a GPU), ``reason``, the failing
        ``gpus`` (absent: every GPU) and ``p2p`` (every failing finding concerns P2P only: multi-GPU jobs)."""
        return {"host_check": {"checked_at": utc_now(), "driver": self.driver,
                               "facts": self.facts.to_json() if self.facts is not None else None,
                               "targets": {name: verdict.to_json() for name, verdict in sorted(self.verdicts.items())}},
                "check": self.run_check()}

    def run_check(self) -> dict[str, Any]:
        """The run's host check in one word (see :meth:`to_json`), over every target's findings (pure)."""
        if not self.verdicts:
            return {"status": "not run", "reason": "no job of this run gets a GPU here"}
        findings = [f for verdict in self.verdicts.values() for f in verdict.findings]
        failing = [f for f in findings if f.status.value == "fail"]
        if not failing:
            warned = [f"{f.check}: {f.text}" for f in findings if f.status.value == "warn"]
            return {"status": "warn" if warned else "pass", "reason": "; ".join(warned) or "every check passed"}
        # A P2P-only finding touches multi-GPU jobs alone, so it never widens the failing GPUs to "every GPU": a
        # mix of it and a fault on listed GPUs is read by those GPUs (the job runner judged each job as it ran).
        per_gpu = [f for f in failing if not f.multi_gpu_only]
        check: dict[str, Any] = {"status": "fail", "reason": "; ".join(f"{f.check}: {f.text}" for f in failing),
                                 "p2p": not per_gpu}
        if per_gpu and all(f.gpus is not None for f in per_gpu):
            check["gpus"] = sorted({g for f in per_gpu for g in f.gpus or ()})
        return check


NO_HOST_CHECK = HostGate()


def driver_floors(cells: Sequence[Any]) -> dict[tuple[str, str], str | None]:
    """(stack id, target) -> the driver floor a plan's cells show (``PlanCell.driver_floor``; an external
    image's cell under the image's own id)."""
    return {(cell.stack_id, cell.target.name): cell.driver_floor.version for cell in cells}


def check_host(host_gpus: HostGpus, jobs: Sequence[Any], floors: Mapping[tuple[str, str], str | None], *,
               read: Callable[[HostGpus], HostGpuFacts] = read_gpu_host_facts) -> HostGate:
    """The host check of a run, read once at its start for the targets whose GPU jobs this host can run
    (``jobs``: anything with a ``spec`` and a ``target``; the edge is ``read``); the floors alone when no
    job gets a GPU here (nothing on the host to check)."""
    targets = {job.target.name: job.target for job in jobs
               if gpus_for(job.spec, job.target, host_gpus).docker_gpus() is not None}
    if not targets or not host_gpus.available:
        return HostGate(floors=dict(floors), driver=host_gpus.driver)
    facts = read(host_gpus)
    return HostGate({name: judge_gpu_host(facts, target) for name, target in targets.items()}, dict(floors),
                    host_gpus.driver, facts)


def host_undecided(record: ResultRecord, why: str, gpus: tuple[int, ...] | None) -> ResultRecord:
    """``record`` as ``undecided (host: why)``: the script's own status and reason kept in the reason, its
    evidence and metrics kept, ``metrics.host_fault`` saying what and where (pure). A skip stays a skip."""
    outcome = record.outcome
    if outcome.status is Status.SKIP:
        return record
    reason = f"host: {why} (the job ended {outcome.status.value}: {outcome.reason})"
    metrics = {**outcome.metrics, "host_fault": {"why": why, "gpus": None if gpus is None else list(gpus),
                                                 "ended": outcome.status.value}}
    return dataclasses.replace(record, outcome=dataclasses.replace(outcome, status=Status.UNDECIDED, reason=reason,
                                                                   metrics=metrics))


def busy_record(kind: JobKind, job: Job, reason: str, *, run_id: str, host_gpus: HostGpus,
                runner_kind: str) -> ResultRecord:
    """The skip of a job whose GPUs were not idle (``busy: pid ...``) or whose driver is below the floor."""
    return skip_record(kind, dataclasses.replace(job, skip_reason=reason, skip_evidence=host_gpus.evidence),
                       run_id=run_id, image=None, host_gpus=host_gpus, runner_kind=runner_kind)


#: Statuses a busy GPU can cause (a hang, an OOM, a collective timing out): re-checked after the job.
_HOST_SENSITIVE = frozenset({Status.FAIL, Status.ERROR, Status.TIMEOUT, Status.CRASH})


def run_jobs(kind: JobKind, jobs: Sequence[Job], *, run_id: str, host_gpus: HostGpus,
             write: Callable[[ResultRecord], Any], client: Any | None = None, local_python: str | None = None,
             parallel: int = 1, log_dir: Path | None = None, builds_dir: Path | None = None,
             images: Mapping[str, ImageRef | None] | None = None,
             on_done: Callable[[ResultRecord], None] = lambda record: None,
             host_check: HostGate = NO_HOST_CHECK, gpu_locks: GpuFileLocks | None = None,
             read_usage: Callable[[], GpuUsage] = read_gpu_usage) -> list[ResultRecord]:
    """Run jobs (in containers via ``client``, or locally with ``local_python``), writing each record as
    it finishes so that an interrupted run keeps what completed.

    ``parallel`` jobs at a time (benchmarks take 1: two on the same GPUs would measure each other); jobs that
    get GPUs also hold them, host-wide (:class:`~stackforge.edges.gpu_locks.GpuFileLocks`: one lock file per
    GPU UUID, honoured by every stackforge process), so at most one job runs on a card at a time. Holding
    them, a job starts only on idle cards (else a ``busy: pid ...`` skip, read by ``read_usage``), on a driver
    at its stack's floor (``host_check``), and its record is ``undecided (host: ...)`` when the host check
    failed for a card it used or when a failure coincides with another process on its cards.
    ``images`` maps stack ids to images to use; other stacks' images come from ``builds_dir`` records
    or, by default, from the local images' stack-id labels.

    When the calling thread is interrupted (KeyboardInterrupt, which SIGTERM / SIGHUP become too) or a
    job raises (the engine went away), the running jobs are stopped, the run's containers removed,
    and the exception re-raised; jobs stopped that way write no record.
    """
    if client is None and local_python is None:
        raise ProbeError(f"{kind.name} scripts need a Docker client or --local")
    found = dict(images or {})
    not_built: dict[str, str | None] = {}
    if client is not None:
        for job in jobs:
            if job.stack.id not in found:
                found[job.stack.id] = stack_image(client, job.stack, builds_dir)
            if found[job.stack.id] is None and builds_dir is not None and job.stack.id not in not_built:
                not_built[job.stack.id] = not_built_reason(builds_dir, job.stack)

    # Worker threads never see a signal: the calling thread sets this flag for them.
    cancel = threading.Event()
    locks = gpu_locks or GpuFileLocks()
    threshold = busy_memory_mib()
    runner_kind = "local" if client is None else "docker"

    def one(job: Job) -> ResultRecord | None:
        assignment = gpus_for(job.spec, job.target, host_gpus)
        starts = not job.skip_reason and (client is None or found.get(job.stack.id) is not None)
        uses_gpus = starts and not assignment.skip_reason and assignment.docker_gpus() is not None
        if not uses_gpus:
            return run_one(job)
        keys = lock_keys(host_gpus, assignment)
        with locks.holding(keys, cancel) as wait:
            if not wait.held:
                return None
            unfit = host_check.skip_reason(job) or busy_reason(read_usage(), keys, threshold_mib=threshold)
            if unfit:
                if cancel.is_set():
                    return None
                return keep(busy_record(kind, job, unfit, run_id=run_id, host_gpus=host_gpus,
                                        runner_kind=runner_kind))
            return run_one(job, lambda record: on_host(record, job, assignment, keys))

    def on_host(record: ResultRecord, job: Job, assignment: GpuAssignment, keys: tuple[str, ...]) -> ResultRecord:
        fault = host_check.fault(job, assignment)
        if fault is None and record.outcome.status in _HOST_SENSITIVE:
            # Still holding the cards: a process on them now came from outside this run. Memory alone is not
            # asked: the driver may not have freed the job's own yet.
            usage = read_usage()
            busy = None if usage.error else busy_reason(GpuUsage(usage.processes), keys, threshold_mib=threshold)
            fault = f"{busy} after the job" if busy else None
        return host_undecided(record, fault, assignment.devices) if fault else record

    def end(job: Job, image: ImageRef | None) -> Ending:
        log = log_dir / f"{job.stack.id}--{job.target.name}--{job.spec.id}.log" if log_dir else None
        if client is None:
            return end_locally(kind, job, python=local_python or "python3", host_gpus=host_gpus, log_path=log,
                               cancel=cancel)
        # ``image`` is set: unstarted_record() recorded the jobs of a stack without one
        return end_in_container(kind, client, image, job, run_id=run_id, host_gpus=host_gpus, log_path=log,
                                cancel=cancel)

    def run_one(job: Job, checked: Callable[[ResultRecord], ResultRecord] | None = None) -> ResultRecord | None:
        """``checked``: the host's word on a GPU job's judged record (kept as it is without one)."""
        image = found.get(job.stack.id)
        try:
            record = (unstarted_record(kind, job, run_id=run_id, host_gpus=host_gpus, image=image,
                                       in_image=client is not None, not_built=not_built.get(job.stack.id))
                      or judge(kind, job, end(job, image), run_id=run_id, host_gpus=host_gpus))
            if checked is not None and record.outcome.status is not Status.SKIP:
                record = checked(record)
        except Interrupted:
            return None
        if cancel.is_set():
            return None   # ended while the run was being interrupted: its ending may be the cleanup's doing
        return keep(record)

    def keep(record: ResultRecord) -> ResultRecord:
        write(record)
        on_done(record)
        return record

    records: list[ResultRecord] = []
    pool = concurrent.futures.ThreadPoolExecutor(max_workers=max(1, parallel), thread_name_prefix="sf-job")
    try:
        futures = [pool.submit(one, job) for job in jobs]
        for future in runner.finished_futures(futures):
            record = future.result()
            if record is not None:
                records.append(record)
    except BaseException:
        # Flag first, then remove the containers: a worker released by the removal sees the flag and
        # writes nothing, instead of recording the SIGKILL of the removal as a crash.
        cancel.set()
        pool.shutdown(wait=False, cancel_futures=True)
        if client is not None:
            from stackforge.edges.docker_engine import remove_run_containers
            remove_run_containers(client, run_id)
        raise
    finally:
        pool.shutdown(wait=True, cancel_futures=True)
    return records
