"""``stackforge ci``: generate the nightly GitHub Actions workflow, and fan a plan out into CI jobs."""

from __future__ import annotations

import sys
from pathlib import Path

import click

from stackforge.cli.options import check_out_path, out_path_error


@click.group(name="ci")
def command() -> None:
    """Generate CI workflows for the nightly matrix."""


@command.command(name="github")
@click.option("--matrix", default="matrices/default.yaml", show_default=True, metavar="FILE",
              help="Matrix file the workflow runs (relative to the repository root), or a shipped name.")
@click.option("--gpu-label", "gpu_labels", multiple=True, metavar="LABEL",
              help="Arch label of self-hosted GPU runners, e.g. sm_120 (repeatable). Runners must carry the "
                   "labels self-hosted, linux, gpu and LABEL. Without any: CPU jobs only.")
@click.option("--registry", default=None, metavar="REF",
              help="Repository images are pushed to, host/path (default: ghcr.io/<owner>/<repo>).")
@click.option("--shards", type=int, default=4, show_default=True, help="Split every stage into N shards.")
@click.option("--cron", default=None, metavar="'M H D M W'",
              help="Nightly schedule, UTC (default: 17 3 * * *).")
@click.option("--watch-cron", "watch_cron", default=None, metavar="'M H D M W'",
              help="Schedule of the runs that only watch the index and propose a pull request on news, UTC "
                   "(default: */10 * * * *, every 10 minutes).")
@click.option("--runner", default=None, metavar="LABEL", help="CPU runner label (default: ubuntu-latest).")
@click.option("--install", default=None, metavar="SPEC",
              help="What runners pip-install (default: '.', the workflow's own checkout of stackforge; "
                   "elsewhere e.g. git+https://github.com/<owner>/stackforge@<tag>).")
@click.option("--python", default=None, metavar="VERSION", help="Python on the runners (default: 3.12).")
@click.option("--out", "out", default=".github/workflows/stackforge-nightly.yml", show_default=True,
              metavar="PATH", help="Where to write the workflow; '-' prints it.")
@click.option("--check", is_flag=True,
              help="Write nothing; exit 1 if the file at --out differs from the output.")
def github(matrix: str, gpu_labels: tuple[str, ...], registry: str | None, shards: int, cron: str | None,
           watch_cron: str | None, runner: str | None, install: str | None, python: str | None, out: str, check: bool) -> None:
    """Generate a sharded nightly workflow: watch the index and verify the rules, build and gate on CPU
    runners, runtime probes and benchmarks on self-hosted GPU runners per arch, then merge, diff against
    the last run, and publish. A schedule every 10 minutes runs the watch alone and opens or updates
    a pull request on news."""
    from stackforge.ci.github import WorkflowConfig, check_workflow_inputs, sync_workflow, write_workflow

    given = {"cron": cron, "watch_cron": watch_cron, "runner": runner, "install": install, "python": python}
    config = WorkflowConfig(matrix=matrix, gpu_labels=gpu_labels, registry=registry, shards=shards,
                            workflow_path=out if out != "-" else ".github/workflows/stackforge-nightly.yml",
                            **{key: value for key, value in given.items() if value is not None})
    if out == "-":
        for warning in check_workflow_inputs(config):
            click.echo(f"stackforge: warning: {warning}", err=True)
        click.echo(write_workflow(config), nl=False)
        return
    if not check:
        check_out_path(Path(out))
    try:
        done = sync_workflow(config, Path(out), check=check)
    except OSError as exc:
        raise out_path_error("--out", Path(out), exc) from None
    for warning in done.warnings:
        click.echo(f"stackforge: warning: {warning}", err=True)
    if done.state == "out-of-date":
        click.echo(f"{out} is out of date; regenerate it with: {config.command_line()}", err=True)
        sys.exit(1)
    click.echo(f"{out} is up to date" if done.state == "up-to-date" else f"wrote {out}")
    if done.state == "written" and gpu_labels:
        click.echo("note: for actionlint, declare the self-hosted runner labels in "
                   ".github/actionlint.yaml (self-hosted-runner: labels: [gpu, sm_*])", err=True)


@command.command(name="shards")
@click.option("--plan", "plan_path", required=True,
              type=click.Path(exists=True, dir_okay=False, path_type=Path),
              help="Output of `stackforge plan --json`.")
@click.option("--shards", type=int, required=True, help="N: how many shards the workflow splits into.")
@click.option("--gpu-label", "gpu_labels", multiple=True, metavar="LABEL",
              help="GPU runner arch label (repeatable).")
@click.option("--since", "since_path", default=None, type=click.Path(exists=True, dir_okay=False, path_type=Path),
              help="The previous run's plan: jobs only for the stacks it lacks or planned with other inputs.")
def shards(plan_path: Path, shards: int, gpu_labels: tuple[str, ...], since_path: Path | None) -> None:
    """Print the job matrices of a nightly run as key=value lines for $GITHUB_OUTPUT."""
    from stackforge.ci.github import ci_fan_out
    from stackforge.plan.planner import Plan

    fan_out = ci_fan_out(Plan.read(plan_path), shards, gpu_labels,
                         since=Plan.read(since_path) if since_path is not None else None)
    if fan_out.incremental:
        click.echo(f"::notice::{len(fan_out.unchanged)} stack(s) unchanged since the previous run keep its "
                   "results; the rest are built and probed", err=True)
    for label in fan_out.unmatched_labels:
        # stderr: stdout goes into $GITHUB_OUTPUT. The runner turns this line into an annotation.
        click.echo(f"::warning::no target in the plan has arch {label}; its GPU runners get no jobs",
                   err=True)
    click.echo(fan_out.github_output(), nl=False)


@command.command(name="pull-request")
@click.option("--repo", required=True, metavar="OWNER/NAME", help="The repository (in a workflow: $GITHUB_REPOSITORY).")
@click.option("--branch", required=True, metavar="BRANCH",
              help="The pushed head branch of the change set, e.g. watch/<hash>; an open pull request from it "
                   "is updated, else one is opened.")
@click.option("--base", default=None, metavar="BRANCH", help="Branch to merge into (default: the repository's default branch).")
@click.option("--title", required=True, help="One line.")
@click.option("--body-file", "body_file", required=True, type=click.Path(exists=True, dir_okay=False, path_type=Path),
              help="Markdown for the body (the watch report, `stackforge watch --md`).")
def pull_request(repo: str, branch: str, base: str | None, title: str, body_file: Path) -> None:
    """Open or update the one pull request of a change set through the GitHub REST API.

    The token is read from GITHUB_TOKEN and never printed; the API from GITHUB_API_URL (default
    https://api.github.com, as Actions sets it)."""
    import os

    from stackforge.ci.pull_request import PullRequestSpec, open_or_update
    from stackforge.core.errors import SpecError

    try:
        body = body_file.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        raise SpecError(f"--body-file {body_file} is not UTF-8 text") from None
    spec = PullRequestSpec(repo=repo, branch=branch, base=base, title=title, body=body)
    outcome = open_or_update(spec, token=os.environ.get("GITHUB_TOKEN", ""),
                             api=os.environ.get("GITHUB_API_URL") or "https://api.github.com")
    click.echo(outcome.one_line())
