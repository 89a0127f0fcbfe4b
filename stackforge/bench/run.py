"""Bench glue: plan bench jobs and run their scripts through the job runner (:mod:`stackforge.jobs.job_runner`).

The pure half: :func:`plan_bench` (kept cells x benches -> :class:`~stackforge.jobs.job_runner.Job`,
preconditions decided up front), :func:`script_args` (the spec's declared inputs), :func:`gate_on_probes`
(``--from-probes``), and the bench :class:`~stackforge.jobs.job_runner.JobKind` (evidence, statuses, the
link peak added to all-reduce metrics). Running, outcomes, records, GPU assignment and the job loop
are the runner's: :func:`run_bench_jobs` drives it one job at a time, since benchmarks sharing GPUs
would measure each other.
"""

from __future__ import annotations

import dataclasses
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from stackforge.bench.catalog import SCRIPTS_DIR, BenchSpec
from stackforge.bench.stats import efficiency, link_peak_for
from stackforge.core.model import Stack, Target
from stackforge.core.records import ResultRecord, Status, decisive_record, undecided_text
from stackforge.edges.gpus import HostGpus
from stackforge.jobs import job_runner
from stackforge.jobs.campaign import plan_jobs
from stackforge.jobs.job_runner import Job, JobKind, unmet_gpus

#: Where the bench scripts and the model are mounted (the runner mounts the in-image package, with
#: the shared probe helper ``_sfprobe.py``, for every script).
CONTAINER_BENCH = "/stackforge/bench"
CONTAINER_MODEL = "/stackforge/model"
#: Evidence kept in a record: a bench's table or a server log tail decides its result.
EVIDENCE_CHARS = 8000
_SCRIPT_STATUSES = frozenset({Status.PASS, Status.FAIL, Status.SKIP, Status.ERROR})


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


# ---------------------------------------------------------------------------------------------- planning


def unmet_precondition(spec: BenchSpec, target: Target, host_gpus: HostGpus,
                       options: BenchOptions) -> tuple[str, str] | None:
    """(reason, evidence) when ``spec`` cannot run for ``target`` here, else None."""
    unmet = unmet_gpus(spec, target, host_gpus, spec.min_gpus)
    if unmet:
        return unmet
    if spec.needs_multicast and not target.multicast:
        return (f"target {target.name} has no NVLS multicast ({target.interconnect.value}); {spec.id} needs it",
                f"{target.name}: multicast={target.multicast}")
    if spec.needs_model and options.model_dir is None:
        return "no model directory given (stackforge bench --model DIR)", ""
    return None


#: The arguments of each declared script input (:data:`stackforge.bench.catalog.SCRIPT_INPUTS`).
_INPUTS: Mapping[str, Callable[[Target, BenchOptions, str], list[str]]] = {
    "repeats": lambda target, options, model_path: ["--repeats", str(options.repeats)],
    "world-size": lambda target, options, model_path: ["--world-size", str(target.gpu_count)],
    "max-bytes": lambda target, options, model_path: (
        [] if options.max_bytes is None else ["--max-bytes", str(options.max_bytes)]),
    "model": lambda target, options, model_path: ["--model", model_path],
    "tp": lambda target, options, model_path: ["--tp", str(target.gpu_count)],
    "serve-args": lambda target, options, model_path: list(options.serve_args),
}


def script_args(spec: BenchSpec, target: Target, options: BenchOptions, *, model_path: str) -> tuple[str, ...]:
    """The arguments of ``spec``'s script for ``target`` (after the script path): its fixed ones, then
    the inputs it declares."""
    return (*spec.args, *(arg for name in spec.inputs for arg in _INPUTS[name](target, options, model_path)))


def plan_bench(plan: Any, specs: Sequence[BenchSpec], options: BenchOptions, *, host_gpus: HostGpus,
               local: bool, stacks: Sequence[Stack] | None = None) -> tuple[Job, ...]:
    """One job per kept (stack, target) cell of ``plan`` and bench (pure).

    Args:
        plan: a :class:`stackforge.plan.planner.Plan` (pruned cells are not benchmarked: the rules said why).
        specs: the benches (see :func:`stackforge.bench.catalog.select_benches`).
        options: the user's choices.
        host_gpus: what this host offers (:func:`stackforge.edges.gpus.detect_host_gpus`).
        local: True when scripts run in this machine's Python (the model path is the host path);
            False for containers (the model is mounted at :data:`CONTAINER_MODEL`).
        stacks: only these stacks (a shard), default all kept ones.
    """
    model_path = str(options.model_dir) if local and options.model_dir else CONTAINER_MODEL
    planned = []
    for cell_job in plan_jobs(plan, specs, stacks):
        spec, target = cell_job.spec, cell_job.target
        timeout = float(options.timeout_s or spec.default_timeout_s)
        unmet = unmet_precondition(spec, target, host_gpus, options)
        args = script_args(spec, target, options, model_path=model_path)
        planned.append(Job(cell_job.stack, target, spec, args, timeout, *(unmet or (None, ""))))
    return tuple(planned)


def gate_on_probes(jobs: Sequence[Job], records: Sequence[ResultRecord],
                   probe_features: frozenset[str]) -> tuple[Job, ...]:
    """``--from-probes``: a bench for a feature the probes decide runs only where they said ``pass`` (pure).

    The probe records of a (stack, target, feature) decide as in the matrix (the highest tier that
    said something, the worst outcome within it). Any other verdict, or no probe record at all,
    turns the job into a skip that names the deciding probe and carries its evidence, so a dead
    backend (custom all-reduce on PCIe, symmetric memory on sm_120) is not measured, and the
    bench record says why. Benches whose feature no probe speaks for (plain NCCL, GEMM) are kept.
    """
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
        said = _probes_say(feature, job.target.name, grouped.get((job.stack.id, job.target.name, feature), ()))
        if said is None:
            gated.append(job)
            continue
        reason, evidence = said
        gated.append(dataclasses.replace(job, skip_reason=reason, skip_evidence=evidence))
    return tuple(gated)


def _probes_say(feature: str, target: str, probe_records: Sequence[ResultRecord]) -> tuple[str, str] | None:
    """None when the probes say ``pass`` (the matrix's deciding record, :func:`decisive_record`), else
    (the skip reason, its evidence): a failing probe, probes that only skipped or stayed undecided, or none."""
    records = sorted(probe_records, key=lambda r: (r.tier.value, r.probe))
    decisive = decisive_record(records)
    if decisive is not None:
        if decisive.outcome.status is Status.PASS:
            return None
        return (f"--from-probes: {decisive.tier.value} probe {decisive.probe} says {feature} is "
                f"{decisive.outcome.status.value}: {decisive.outcome.reason}", decisive.outcome.evidence)
    undecided = [r for r in records if r.outcome.status is Status.UNDECIDED]
    if undecided:
        return (f"--from-probes: the probes leave {feature} undecided: {undecided_text(undecided)}",
                undecided[0].outcome.evidence)
    if records:   # only skips: not applicable here
        first = records[0]
        skipped = "; ".join(f"{r.probe} skipped: {r.outcome.reason}" for r in records)
        return (f"--from-probes: {first.tier.value} says {feature} is skip: {first.outcome.reason}",
                first.outcome.evidence or skipped)
    return (f"--from-probes: no probe result for {feature} on {target}; "
            "run `stackforge probe` into the same --results first", "")


def bench_argv(job: Job, *, python: str, scripts_root: str) -> list[str]:
    """The command line of one bench script."""
    return job_runner.argv(job, python=python, scripts_root=scripts_root)


# ---------------------------------------------------------------------------------------------- the kind


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


def bench_kind(options: BenchOptions = BenchOptions(), scripts_dir: Path = SCRIPTS_DIR) -> JobKind:
    """How bench scripts run: the shared probe helper importable, the model mounted for serving, metrics
    in strict JSON with the link peak, a long evidence tail."""
    return JobKind(name="bench", scripts_dir=scripts_dir, container_root=CONTAINER_BENCH,
                   evidence_chars=EVIDENCE_CHARS, tail_chars=64000, statuses=_SCRIPT_STATUSES, tidy_reason=True,
                   strict_metrics=True, finish_metrics=with_link_context,
                   mounts=lambda job: container_mounts(job, options))


def container_mounts(job: Job, options: BenchOptions) -> list[Any]:
    """Bench scripts and (for serving) the model, both read-only (the runner adds the in-image package).

    The scripts are copied into the container when the engine is remote; the model never is (it must
    be at the same path on the engine's machine)."""
    from stackforge.edges import docker_engine

    mounts = [docker_engine.Bind(SCRIPTS_DIR, CONTAINER_BENCH, copy_to_remote=True)]
    if job.spec.needs_model and options.model_dir is not None:
        mounts.append(docker_engine.Bind(Path(options.model_dir), CONTAINER_MODEL))
    return mounts


# ---------------------------------------------------------------------------------------------- running


def run_bench_jobs(planned: Sequence[Job], options: BenchOptions, *, run_id: str, host_gpus: HostGpus,
                   write: Callable[[ResultRecord], Any], client: Any | None = None,
                   local_python: str | None = None, log_dir: Path | None = None, builds_dir: Path | None = None,
                   on_done: Callable[[ResultRecord], None] = lambda record: None,
                   host_check: job_runner.HostGate = job_runner.NO_HOST_CHECK) -> list[ResultRecord]:
    """Run bench jobs one at a time (in images via ``client``, or locally with ``local_python``),
    writing each record as it finishes so that an interrupted run keeps what completed.

    One at a time on purpose: two benchmarks on the same GPUs would measure each other. ``host_check``: the
    run's host check (:func:`stackforge.jobs.job_runner.check_host`), honoured as for probes: a driver below
    the stack's floor or a busy GPU is a skip, a figure measured on a card the check failed is ``undecided``.
    """
    return job_runner.run_jobs(bench_kind(options), planned, run_id=run_id, host_gpus=host_gpus, write=write,
                         client=client, local_python=local_python if client is not None else
                         local_python or sys.executable, parallel=1, log_dir=log_dir, builds_dir=builds_dir,
                         on_done=on_done, host_check=host_check)


__all__ = ["BenchOptions", "bench_argv", "bench_kind", "plan_bench", "run_bench_jobs", "script_args",
           "with_link_context"]
