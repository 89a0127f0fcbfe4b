"""``stackforge bench``: throughput benchmarks inside each built image (or locally with ``--local``)."""

from __future__ import annotations

import sys
from pathlib import Path

import click

from stackforge.cli._runs import connect_engine, summary_line
from stackforge.cli._compat import user_compat
from stackforge.cli.options import refuse_together, refuse_unused, shard_option, stack_selection
from stackforge.errors import SpecError
from stackforge.records import ResultRecord
from stackforge.shard import select


@click.command(name="bench")
@stack_selection
@shard_option
@click.option("--suite", "suites", multiple=True, type=click.Choice(["allreduce", "gemm", "serve"]),
              help="Bench suite (repeatable; default: allreduce and gemm, plus serve when --model is given).")
@click.option("--allreduce-backend", "variants", multiple=True, metavar="VARIANT",
              help="All-reduce variant to measure: nccl, nccl-ring, nccl-tree, custom, symm-mem, "
                   "symm-mem-multimem, gloo (repeatable; default nccl). Choose from what the probes said works.")
@click.option("--bench", "ids", multiple=True, metavar="ID", help="Run exactly this bench id (repeatable).")
@click.option("--model", "model_dir", type=click.Path(exists=True, file_okay=False, path_type=Path), default=None,
              help="Model directory for the serving bench (mounted read-only into the image).")
@click.option("--repeats", type=click.IntRange(min=1), default=5, show_default=True,
              help="Timed repeats per measurement (the median is reported, with min, max and CV).")
@click.option("--max-bytes", type=click.IntRange(min=1), default=None,
              help="Largest all-reduce message in bytes (default 1 GiB).")
@click.option("--serve-arg", "serve_args", multiple=True, metavar="ARG",
              help="Extra serve.py argument, e.g. --serve-arg=--cuda-graph-max-bs=256 (repeatable).")
@click.option("--timeout", "timeout_s", type=float, default=None, help="Hard timeout per bench (seconds).")
@click.option("--local", "local", is_flag=True,
              help="Run in a Python environment of this machine (one stack: select it with --only).")
@click.option("--python", "python", default=None, metavar="PATH",
              help="With --local: the interpreter whose packages are measured (default: this one).")
@click.option("--builds", "builds_dir", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="A `stackforge build --out` folder: use the images its records name, pulled by digest when "
                   "not local. Default: local images by stack-id label.")
@click.option("--results", "results_root", type=click.Path(file_okay=False, path_type=Path), default=Path("results"),
              show_default=True, help="Results folder; each run writes one sub-folder.")
@click.option("--from-probes", "from_probes", is_flag=True,
              help="Measure a backend the probes decide (custom all-reduce, symmetric memory, NCCL Tree) only "
                   "where the probe records under --results say pass; skip it elsewhere with their evidence.")
@click.option("--list", "list_only", is_flag=True, help="List the known benches and exit.")
def command(matrix, cuda, targets, only, shard, suites, variants, ids, model_dir, repeats, max_bytes, serve_args,
            timeout_s, local, python, builds_dir, results_root, from_probes, list_only) -> None:
    """Measure all-reduce bandwidth, GEMM TFLOP/s and serving throughput for every kept stack x target."""
    from stackforge.bench.catalog import catalog, select_benches

    refuse_unused("--python", python is not None, needs="--local", present=local)
    refuse_together("--local", "--builds", local and builds_dir is not None,
                    why="--local measures this machine's Python, not the images of a build folder")
    if list_only:
        for spec in catalog():
            click.echo(f"{spec.id:<32} {spec.feature:<22} {spec.description}")
        return
    specs = select_benches(catalog(), suites=suites or _default_suites(model_dir), allreduce_variants=variants,
                           ids=ids)
    _run(matrix, cuda, targets, only, shard, specs, model_dir, repeats, max_bytes, serve_args, timeout_s, local,
         python, builds_dir, results_root, from_probes)


def _default_suites(model_dir: Path | None) -> tuple[str, ...]:
    return ("allreduce", "gemm", "serve") if model_dir else ("allreduce", "gemm")


def _run(matrix, cuda, targets, only, shard, specs, model_dir, repeats, max_bytes, serve_args, timeout_s, local,
         python, builds_dir, results_root, from_probes) -> None:
    from stackforge.bench.run import BenchOptions, plan_bench, run_bench_jobs
    from stackforge.data import resolve_matrix_path
    from stackforge.plan import plan_file
    from stackforge.probes.execute import detect_host_gpus
    from stackforge.results import finish_run, start_run, write_record

    matrix_path = resolve_matrix_path(matrix)
    plan = plan_file(matrix_path, targets=targets, cuda=cuda, only=only, user_compat=user_compat())
    stacks = select(plan.kept_stacks(), shard)
    if local and len(stacks) != 1:
        raise SpecError(f"--local measures this machine's Python environment, which holds one stack; "
                        f"{len(stacks)} are selected", remedy="choose the stack it holds with --only STACK_ID")
    client = None if local else connect_engine()
    host_gpus = detect_host_gpus(client)
    options = BenchOptions(repeats=repeats, model_dir=model_dir, max_bytes=max_bytes, serve_args=tuple(serve_args),
                           timeout_s=timeout_s)
    jobs = plan_bench(plan, specs, options, host_gpus=host_gpus, local=local, stacks=stacks)
    if from_probes:
        jobs = _gate_on_probes(jobs, results_root)
    run_dir = start_run(results_root, command=sys.argv, matrix_source=str(matrix_path),
                        shard=str(shard) if shard else None)
    click.echo(f"benchmarking {len(stacks)} stack(s), {len(jobs)} bench run(s) -> {run_dir}")
    records = run_bench_jobs(jobs, options, run_id=run_dir.name, host_gpus=host_gpus,
                             write=lambda record: write_record(run_dir, record), client=client,
                             local_python=(python or sys.executable) if local else None, log_dir=run_dir / "logs",
                             builds_dir=builds_dir, on_done=_echo)
    finish_run(run_dir)
    click.echo(summary_line(records))


def _gate_on_probes(jobs, results_root: Path):
    """The jobs after ``--from-probes``: probe records are read (strictly) before anything runs."""
    from stackforge.bench.run import gate_on_probes
    from stackforge.probes.catalog import catalog as probe_catalog
    from stackforge.errors import RecordError
    from stackforge.results import describe_problems, load_results

    loaded = load_results(results_root)
    if loaded.problems:
        raise RecordError(describe_problems(loaded.problems, loaded.source),
                          remedy="fix or remove these files before benchmarking --from-probes")
    return gate_on_probes(jobs, loaded.records, frozenset(spec.feature for spec in probe_catalog()))


def _echo(record: ResultRecord) -> None:
    from stackforge.bench.run import describe_metrics

    outcome = record.outcome
    numbers = describe_metrics(record)
    click.echo(f"  {outcome.status.value:<7} {record.stack_id}  {record.target}  {record.probe}: {outcome.reason}"
               + (f" [{numbers}]" if numbers and numbers not in outcome.reason else ""))
