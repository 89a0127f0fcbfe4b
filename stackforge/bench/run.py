"""Bench glue: plan bench jobs, run their scripts (in images or locally), turn results into records.

The pure half: :func:`plan_bench` (kept cells x benches -> :class:`BenchJob`, preconditions decided up
front), :func:`script_args`, :func:`outcome_from_payload` / :func:`outcome_from_ending` (a script's
``STACKFORGE_RESULT`` payload or its death -> :class:`~stackforge.records.Outcome`) and
:func:`bench_record` (tier ``bench``, kind ``bench``). The edge: :func:`run_job_locally` (a subprocess
through :mod:`stackforge.runner`) and :func:`run_job_in_container` (through
:func:`stackforge.docker_engine.run_container`), driven one at a time by :func:`run_bench_jobs`:
benchmarks sharing GPUs would measure each other.
"""

from __future__ import annotations

import dataclasses
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from stackforge import runner
from stackforge.bench.catalog import SCRIPTS_DIR, BenchSpec
from stackforge.bench.stats import efficiency, link_peak_for
from stackforge.model import Stack, Target
from stackforge.probes import execute
from stackforge.probes.campaign import plan_jobs, stack_image
from stackforge.probes.execute import NO_GPUS, GpuAssignment, HostGpus, ImageRef, assign_gpus
from stackforge.probes.scripts._sfshared import json_safe, parse_result_line
from stackforge.records import Outcome, Provenance, ResultRecord, Status, Tier, utc_now

#: Where the bench scripts, the shared probe helper (``_sfprobe.py``) and the model are mounted.
CONTAINER_BENCH = "/stackforge/bench"
CONTAINER_PROBES = execute.CONTAINER_SCRIPTS
CONTAINER_MODEL = "/stackforge/model"
PROBE_SCRIPTS_DIR = execute.SCRIPTS_DIR
#: Evidence kept in a record: a bench's table or a server log tail decides its result.
EVIDENCE_CHARS = 8000
_SCRIPT_STATUSES = (Status.PASS, Status.FAIL, Status.SKIP, Status.ERROR)
_ENV = {"PYTHONDONTWRITEBYTECODE": "1", "PYTHONUNBUFFERED": "1"}


@dataclass(frozen=True, slots=True)
class BenchOptions:
    """What the user chose for this bench run (passed explicitly; no globals).

    Attributes:
        repeats: timed repeats per measurement (the median is reported).
        model_dir: host directory of the model served by ``bench.serve``.
        max_bytes: largest all-reduce message (default: the script's, 1 GiB).
        serve_args: extra ``serve.py`` arguments (``--cuda-graph-max-bs 256``, ``--custom-allreduce off``...).
        timeout_s: overrides every bench's default hard timeout.
    """

    repeats: int = 5
    model_dir: Path | None = None
    max_bytes: int | None = None
    serve_args: tuple[str, ...] = ()
    timeout_s: float | None = None


@dataclass(frozen=True, slots=True)
class BenchJob:
    """One bench for one (stack, target): its script arguments, or why it is skipped."""

    stack: Stack
    target: Target
    spec: BenchSpec
    args: tuple[str, ...]
    timeout_s: float
    skip_reason: str | None = None
    skip_evidence: str = ""


# ---------------------------------------------------------------------------------------------- planning


def unmet_precondition(spec: BenchSpec, target: Target, host_gpus: HostGpus,
                       options: BenchOptions) -> tuple[str, str] | None:
    """(reason, evidence) when ``spec`` cannot run for ``target`` here, else None."""
    if spec.needs_gpu:
        unserved = gpus_for(spec, target, host_gpus).skip_reason
        if unserved:
            return unserved, host_gpus.evidence
    if target.gpu_count < spec.min_gpus:
        return (f"target {target.name} has {target.gpu_count} GPU(s); {spec.id} needs {spec.min_gpus}",
                f"{target.name}: gpu_count={target.gpu_count}")
    if spec.needs_multicast and not target.multicast:
        return (f"target {target.name} has no NVLS multicast ({target.interconnect.value}); {spec.id} needs it",
                f"{target.name}: multicast={target.multicast}")
    if spec.needs_model and options.model_dir is None:
        return "no model directory given (stackforge bench --model DIR)", ""
    return None


def gpus_for(spec: BenchSpec, target: Target, host_gpus: HostGpus) -> GpuAssignment:
    """The host GPUs of the target's arch for a GPU bench (a mixed host gives each target its own
    cards); none for the CPU harness self-test."""
    return assign_gpus(host_gpus, target) if spec.needs_gpu else NO_GPUS


def script_args(spec: BenchSpec, target: Target, options: BenchOptions, *, model_path: str) -> tuple[str, ...]:
    """The arguments of ``spec``'s script for ``target`` (after the script path)."""
    args = list(spec.args) + ["--repeats", str(options.repeats)]
    if spec.suite == "allreduce":
        if spec.needs_gpu:  # every GPU of the target is a rank; gloo runs 2 CPU ranks
            args += ["--world-size", str(target.gpu_count)]
        if options.max_bytes is not None:
            args += ["--max-bytes", str(options.max_bytes)]
    elif spec.suite == "serve":
        args = list(spec.args) + ["--model", model_path, "--tp", str(target.gpu_count), *options.serve_args]
    return tuple(args)


def plan_bench(plan: Any, specs: Sequence[BenchSpec], options: BenchOptions, *, host_gpus: HostGpus,
               local: bool, stacks: Sequence[Stack] | None = None) -> tuple[BenchJob, ...]:
    """One :class:`BenchJob` per kept (stack, target) cell of ``plan`` and bench (pure).

    Args:
        plan: a :class:`stackforge.plan.Plan` (pruned cells are not benchmarked: the rules said why).
        specs: the benches (see :func:`stackforge.bench.catalog.select_benches`).
        options: the user's choices.
        host_gpus: what this host offers (:func:`stackforge.probes.execute.detect_host_gpus`).
        local: True when scripts run in this machine's Python (the model path is the host path);
            False for containers (the model is mounted at :data:`CONTAINER_MODEL`).
        stacks: only these stacks (a shard), default all kept ones.
    """
    model_path = str(options.model_dir) if local and options.model_dir else CONTAINER_MODEL
    jobs = []
    for probe_job in plan_jobs(plan, specs, stacks):
        spec, target = probe_job.spec, probe_job.target
        timeout = float(options.timeout_s or spec.default_timeout_s)
        unmet = unmet_precondition(spec, target, host_gpus, options)
        args = script_args(spec, target, options, model_path=model_path)
        jobs.append(BenchJob(probe_job.stack, target, spec, args, timeout, *(unmet or (None, ""))))
    return tuple(jobs)


def gate_on_probes(jobs: Sequence[BenchJob], records: Sequence[ResultRecord],
                   probe_features: frozenset[str]) -> tuple[BenchJob, ...]:
    """``--from-probes``: a bench for a feature the probes decide runs only where they said ``pass`` (pure).

    The probe records of a (stack, target, feature) decide as in the matrix (the highest tier that
    said something, the worst outcome within it). Any other verdict, or no probe record at all,
    turns the job into a skip that names the deciding probe and carries its evidence, so a dead
    backend (custom all-reduce on PCIe, symmetric memory on sm_120) is not measured, and the
    bench record says why. Benches whose feature no probe speaks for (plain NCCL, GEMM) are kept.
    """
    from stackforge.report import CellStatus, decide_cell

    grouped: dict[tuple[str, str, str], list[ResultRecord]] = {}
    for record in records:
        if record.kind == "probe":
            grouped.setdefault((record.stack_id, record.target, record.feature), []).append(record)
    gated = []
    for job in jobs:
        feature = job.spec.feature
        if job.skip_reason or feature not in probe_features:
            gated.append(job)
            continue
        cell = decide_cell(feature, grouped.get((job.stack.id, job.target.name, feature), ()))
        if cell.status is CellStatus.PASS:
            gated.append(job)
            continue
        if cell.status is CellStatus.UNTESTED:
            reason = (f"--from-probes: no probe result for {feature} on {job.target.name}; "
                      "run `stackforge probe` into the same --results first")
        else:
            decisive = cell.decisive
            said = f"{cell.how} probe {decisive.probe}" if decisive else cell.how or "the probes"
            reason = f"--from-probes: {said} says {feature} is {cell.status.value}: {cell.reason}"
        gated.append(dataclasses.replace(job, skip_reason=reason, skip_evidence=cell.evidence))
    return tuple(gated)


def bench_argv(job: BenchJob, *, python: str, scripts_root: str) -> list[str]:
    """The command line of one bench script."""
    return [python, f"{scripts_root}/{job.spec.script}", *job.args]


# ---------------------------------------------------------------------------------------------- outcomes


def with_link_context(metrics: dict[str, Any], target: Target | None) -> dict[str, Any]:
    """Add the target's link peak and the all-reduce's efficiency against it (busbw / peak)."""
    if (target is None or metrics.get("collective") != "allreduce" or "peak_busbw_gbps" not in metrics
            or metrics.get("backend") == "gloo"):  # gloo moves CPU memory: no GPU link to compare with
        return metrics
    peak = link_peak_for(target.interconnect.value, target.arch)
    if peak is None:
        return {**metrics, "link_peak": None}
    extra: dict[str, Any] = {"link_peak": peak.to_json(),
                             "peak_busbw_efficiency": efficiency(metrics["peak_busbw_gbps"], peak.gbps)}
    if "avg_busbw_gbps" in metrics:
        extra["avg_busbw_efficiency"] = efficiency(metrics["avg_busbw_gbps"], peak.gbps)
    return {**metrics, **extra}


def outcome_from_payload(payload: Mapping[str, Any], *, duration_s: float = 0.0,
                         target: Target | None = None) -> Outcome:
    """A bench script's ``STACKFORGE_RESULT`` payload -> :class:`Outcome` (status, reason, evidence,
    metrics in strict JSON, with the link peak for context). A malformed payload is an ``error``;
    ``timeout``/``crash`` are the runner's to observe, so a script claiming them is an ``error`` too."""
    evidence = str(payload.get("evidence") or "")[-EVIDENCE_CHARS:]
    try:
        status = Status(payload.get("status"))
    except ValueError:
        return Outcome(Status.ERROR, f"bench reported unknown status {payload.get('status')!r}",
                       evidence=evidence, duration_s=duration_s)
    if status not in _SCRIPT_STATUSES:
        return Outcome(Status.ERROR, f"bench claimed status {status.value}", evidence=evidence,
                       duration_s=duration_s)
    metrics = payload.get("metrics") or {}
    if not isinstance(metrics, Mapping):
        return Outcome(Status.ERROR, f"bench metrics are a {type(metrics).__name__}, not an object",
                       evidence=evidence, duration_s=duration_s)
    metrics = with_link_context(json_safe(metrics), target)
    return Outcome(status, " ".join(str(payload.get("reason") or "").split()), evidence=evidence,
                   metrics=metrics, duration_s=duration_s)


def outcome_from_ending(*, exit_code: int | None, timed_out: bool, signal: int | None, output: str,
                        duration_s: float, timeout_s: float,
                        target: Target | None = None) -> tuple[Outcome, dict[str, Any]]:
    """How a bench process ended (and what it printed) -> (Outcome, facts).

    Timeouts, deaths by signal and missing result lines are judged exactly as for probes
    (:func:`stackforge.probes.execute.outcome_from_ending`); a result line goes through
    :func:`outcome_from_payload`.
    """
    payload = None if timed_out or signal is not None else parse_result_line(output)
    if payload is None:
        return execute.outcome_from_ending(exit_code=exit_code, timed_out=timed_out, signal=signal,
                                           output=output, duration_s=duration_s, timeout_s=timeout_s)
    facts = payload.get("facts")
    return (outcome_from_payload(payload, duration_s=duration_s, target=target),
            dict(facts) if isinstance(facts, Mapping) else {})


def bench_provenance(facts: Mapping[str, Any], image: ImageRef | None, host_gpus: HostGpus,
                     runner_kind: str) -> Provenance:
    """Provenance of a bench result: what the script saw installed (``_sfprobe.collect_facts``: versions,
    torch build, nvcc, GPUs, driver), the image, the host -- read exactly as for probes."""
    return execute.provenance_from_facts(dict(facts), image, host_gpus, runner_kind)


def bench_record(job: BenchJob, outcome: Outcome, provenance: Provenance, *, run_id: str) -> ResultRecord:
    """The result record of one bench (tier ``bench``, kind ``bench``)."""
    return ResultRecord(run_id=run_id, stack_id=job.stack.id, stack=job.stack.to_json(), target=job.target.name,
                        probe=job.spec.id, feature=job.spec.feature, tier=Tier.BENCH, outcome=outcome,
                        provenance=provenance, kind="bench", created_at=utc_now())


def skipped_record(job: BenchJob, *, run_id: str, image: ImageRef | None, host_gpus: HostGpus,
                   runner_kind: str) -> ResultRecord:
    """The record of a bench whose preconditions are unmet (nothing ran)."""
    outcome = Outcome(Status.SKIP, job.skip_reason or "", evidence=job.skip_evidence)
    return bench_record(job, outcome, bench_provenance({}, image, host_gpus, runner_kind), run_id=run_id)


# ---------------------------------------------------------------------------------------------- running


def run_job_locally(job: BenchJob, *, run_id: str, host_gpus: HostGpus, python: str = sys.executable,
                    log_path: Path | None = None, scripts_dir: Path = SCRIPTS_DIR) -> ResultRecord:
    """Run one bench in this machine's Python environment (``--local``), through :func:`runner.run`.

    The script finds the shared ``_sfprobe.py`` in the repository layout (``../../probes/scripts``).
    """
    if job.skip_reason:
        return skipped_record(job, run_id=run_id, image=None, host_gpus=host_gpus, runner_kind="local")
    gpus = gpus_for(job.spec, job.target, host_gpus)
    result = runner.run(bench_argv(job, python=python, scripts_root=str(scripts_dir)), timeout=job.timeout_s,
                        env={**_ENV, **gpus.environment()}, log_path=log_path, tail_chars=64000)
    outcome, facts = outcome_from_ending(exit_code=result.returncode, timed_out=result.timed_out,
                                         signal=result.signal, output=result.output_tail,
                                         duration_s=result.duration_s, timeout_s=job.timeout_s, target=job.target)
    return bench_record(job, outcome, bench_provenance(facts, None, host_gpus, "local"), run_id=run_id)


def container_mounts(job: BenchJob, options: BenchOptions) -> list[Any]:
    """Bench scripts, the shared probe helper beside them, and (for serving) the model, all read-only.

    The scripts are copied into the container when the engine is remote; the model never is (it must
    be at the same path on the engine's machine)."""
    from stackforge import docker_engine

    mounts = [docker_engine.Bind(SCRIPTS_DIR, CONTAINER_BENCH, copy_to_remote=True),
              docker_engine.Bind(PROBE_SCRIPTS_DIR, CONTAINER_PROBES, copy_to_remote=True)]
    if job.spec.needs_model and options.model_dir is not None:
        mounts.append(docker_engine.Bind(Path(options.model_dir), CONTAINER_MODEL))
    return mounts


def run_job_in_container(client: Any, image: ImageRef, job: BenchJob, options: BenchOptions, *, run_id: str,
                         host_gpus: HostGpus, log_path: Path | None = None) -> ResultRecord:
    """Run one bench in a fresh container of ``image`` (removed afterwards), with the GPUs, host IPC and
    a large /dev/shm NCCL needs."""
    from stackforge import docker_engine

    if job.skip_reason:
        return skipped_record(job, run_id=run_id, image=image, host_gpus=host_gpus, runner_kind="docker")
    gpus = gpus_for(job.spec, job.target, host_gpus).docker_gpus()
    run = docker_engine.run_container(
        client, image.image_id, bench_argv(job, python="python3", scripts_root=CONTAINER_BENCH),
        timeout=job.timeout_s, mounts=container_mounts(job, options), env=_ENV,
        labels={docker_engine.RUN_LABEL: run_id}, gpus=gpus, ipc_mode="host" if gpus else None,
        shm_size="16g" if gpus else None, log_path=log_path, tail_chars=64000)
    outcome, facts = outcome_from_ending(exit_code=run.exit_code, timed_out=run.timed_out, signal=run.signal,
                                         output=run.logs_tail, duration_s=run.duration_s,
                                         timeout_s=job.timeout_s, target=job.target)
    return bench_record(job, outcome, bench_provenance(facts, image, host_gpus, "docker"), run_id=run_id)


def missing_image_record(job: BenchJob, *, run_id: str, host_gpus: HostGpus) -> ResultRecord:
    """A stack without a built image cannot be benchmarked: an honest error record, not a gap."""
    outcome = Outcome(Status.ERROR, f"no image built for stack {job.stack.id}",
                      evidence=f"no local image carries the label io.stackforge.stack.id={job.stack.id}")
    return bench_record(job, outcome, bench_provenance({}, None, host_gpus, "docker"), run_id=run_id)


def run_bench_jobs(jobs: Sequence[BenchJob], options: BenchOptions, *, run_id: str, host_gpus: HostGpus,
                   write: Callable[[ResultRecord], Any], client: Any | None = None,
                   local_python: str | None = None, log_dir: Path | None = None, builds_dir: Path | None = None,
                   on_done: Callable[[ResultRecord], None] = lambda record: None) -> list[ResultRecord]:
    """Run jobs one at a time (in images via ``client``, or locally with ``local_python``), writing
    each record as it finishes so that an interrupted run keeps what completed.

    One at a time on purpose: two benchmarks on the same GPUs would measure each other.
    """
    images: dict[str, ImageRef | None] = {}
    records = []
    for job in jobs:
        log = log_dir / f"{job.stack.id}--{job.target.name}--{job.spec.id}.log" if log_dir else None
        if client is None:
            record = run_job_locally(job, run_id=run_id, host_gpus=host_gpus,
                                     python=local_python or sys.executable, log_path=log)
        else:
            if job.stack.id not in images:
                images[job.stack.id] = stack_image(client, job.stack, builds_dir)
            image = images[job.stack.id]
            record = (missing_image_record(job, run_id=run_id, host_gpus=host_gpus) if image is None else
                      run_job_in_container(client, image, job, options, run_id=run_id, host_gpus=host_gpus,
                                           log_path=log))
        write(record)
        on_done(record)
        records.append(record)
    return records


def describe_metrics(record: ResultRecord) -> str:
    """A short headline of a bench record's numbers for the terminal."""
    m = record.outcome.metrics
    if "peak_busbw_gbps" in m:
        share = m.get("peak_busbw_efficiency")
        context = f" ({share:.0%} of {m['link_peak']['name']})" if share is not None else ""
        return f"peak busbw {m['peak_busbw_gbps']:.2f} GB/s{context}"
    if m.get("best_tflops"):
        return "best TFLOP/s " + ", ".join(f"{k} {v:.1f}" for k, v in m["best_tflops"].items() if v is not None)
    if "output_tok_s" in m:
        return f"{m['output_tok_s']:.1f} output tok/s"
    return ""


__all__ = ["BenchJob", "BenchOptions", "bench_argv", "bench_record", "outcome_from_ending", "outcome_from_payload",
           "plan_bench", "run_bench_jobs", "run_job_in_container", "run_job_locally", "script_args",
           "with_link_context"]
