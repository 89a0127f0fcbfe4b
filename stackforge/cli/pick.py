"""``stackforge pick``: the best known-good image for a target, by evidence.

stdout carries only the image reference (``IMAGE=$(stackforge pick ...)`` works); the reasons go
to stderr. Exit codes (see :mod:`stackforge.report.pick`): 0 picked on measured evidence, 5 picked on gate
evidence only (the reference is still printed), 4 nothing qualifies (also: predictions only, no probe
results; no image is printed), 2 bad input.
"""

from __future__ import annotations

from pathlib import Path

import click

from stackforge.cli._evidence import evidence_options, load_evidence, say_currency, warn
from stackforge.cli.options import cuda_option, only_option
from stackforge.core.envelope import report_json_text
from stackforge.report.pick import OPTIMIZE, PickAnswer, Scope, pick, with_verification


@click.command(name="pick")
@evidence_options
@click.option("--require", "require", metavar="FEATURE[,FEATURE]", multiple=True,
              help="A feature that must work (repeatable or comma-separated), e.g. flashinfer-ar-fusion.")
@click.option("--driver", metavar="VERSION", default=None,
              help="The host's NVIDIA driver (e.g. 580.95.05); stacks needing a newer one are excluded.")
@cuda_option
@only_option
@click.option("--optimize", type=click.Choice(OPTIMIZE), default="throughput", show_default=True,
              help="throughput: serving output throughput, else all-reduce busbw, else GEMM TFLOP/s; "
                   "newest: the newest qualifying stack.")
@click.option("--format", "fmt", type=click.Choice(("text", "json")), default="text", show_default=True)
@click.option("--verify", is_flag=True,
              help="Read each qualifying candidate's qualification record attached to its image digest "
                   "(stackforge qualify --push) and refuse one whose record is missing, names another digest, "
                   "was tampered with or was judged with older rules; print each one's evidence levels and "
                   "what was never tested.")
def command(results: Path, runs: tuple[str, ...], plan_path: Path | None, matrix: str | None, no_plan: bool,
            target: str | None, skip_bad: bool, require: tuple[str, ...], driver: str | None,
            cuda: tuple[str, ...], only: tuple[str, ...], optimize: str, fmt: str, verify: bool) -> None:
    """Print the image (repo@digest) that meets the requirements with the best evidence, and why.

    \b
    Exit codes: 0 picked (measured evidence) · 5 picked on gate evidence only ·
                4 nothing qualifies (closest stack and its blockers on stderr; also with predictions
                only, no probe results: the stacks the rules allow are named) · 2 bad input
    Given --plan or --matrix, only the stacks of that plan are candidates.

    \b
    Example:
      stackforge pick --target rtx-pro-6000-x8-pcie --require flashinfer-ar-fusion --driver 580.95.05
    """
    evidence = load_evidence(results=results, runs=runs, plan_path=plan_path, matrix=matrix, no_plan=no_plan,
                             target=target, skip_bad=skip_bad)
    features = tuple(dict.fromkeys(f.strip() for item in require for f in item.split(",") if f.strip()))
    scope = Scope(cuda=cuda, only=only, plan_only=plan_path is not None or matrix is not None)
    answer = pick(evidence.records, evidence.plan, evidence.target, features, driver, optimize, scope=scope,
                  predictions_only=evidence.predictions_only, hosts=evidence.hosts)
    verifications = _verify(answer, evidence.target) if verify else {}
    if verifications:
        answer = with_verification(answer, {s: (v.ok, v.line) for s, v in verifications.items()}, optimize)
        if fmt == "text":
            # A refusal is a blocker: the shortfall lists it when nothing is picked, so it is said here only
            # beside a pick (once either way).
            shown = [v for v in verifications.values() if v.ok or answer.chosen is not None]
            for line in (line for v in shown for line in v.lines()):
                click.echo(line, err=True)
    if fmt == "json":
        payload = answer.to_json()
        if verify:
            payload["verification"] = {s: v.to_json() for s, v in verifications.items()}
        payload["currency"] = evidence.currency.to_json() if evidence.currency else None
        click.echo(report_json_text(payload), nl=False)
    if answer.chosen is None:
        if fmt == "text":
            for line in answer.shortfall_lines():
                click.echo(line, err=True)
            say_currency(evidence, results)
        raise answer.shortfall("listed above" if fmt == "text" else "see the JSON's candidates")
    if fmt == "text":
        click.echo(answer.chosen.reference)
        for line in answer.chosen.why():
            click.echo(f"  {line}", err=True)
        for message in answer.chosen.warnings():
            warn(message)
        say_currency(evidence, results)
    if answer.chosen.exit_code:
        raise click.exceptions.Exit(answer.chosen.exit_code)


def _verify(answer: PickAnswer, target: str) -> dict:
    """Each qualifying candidate's attached qualification record, read from its registry and judged."""
    from stackforge.cli._compat import user_compat
    from stackforge.edges.oci_artifacts import attached_artifacts
    from stackforge.report.qualification import ARTIFACT_TYPE, AttachedDocument, current_knowledge, judge_attached

    overlay = user_compat()
    knowledge = current_knowledge(overlay.files if overlay else ())
    verified = {}
    for candidate in (c for c in answer.candidates if c.qualifies):
        attached = ()
        if candidate.pinned:
            attached = tuple(AttachedDocument(payload=a.payload, annotations=a.annotations, integrity=a.integrity,
                                              found_by=a.found_by)
                             for a in attached_artifacts(candidate.image, artifact_type=ARTIFACT_TYPE))
        verified[candidate.stack_id] = judge_attached(candidate.image, attached, knowledge, target)
    return verified
