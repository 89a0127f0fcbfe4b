"""``stackforge qualify REF``: the qualification record of one image digest (an in-toto Statement v1).

stdout carries the statement (or ``--out FILE`` holds it); the summary goes to stderr. ``--push``
attaches it to the image in its registry as an OCI artifact referring to the image. Exit codes: 0
written (and attached), 2 bad input (a REF no record names, an unpinned stack), 3 a registry that does
not answer or refuses the write.
"""

from __future__ import annotations

from pathlib import Path

import click

from stackforge.cli._compat import user_compat
from stackforge.cli._evidence import evidence_options, load_evidence, write_output
from stackforge.cli.options import check_out_path
from stackforge.core.errors import SpecError


@click.command(name="qualify")
@click.argument("ref", metavar="REF")
@evidence_options
@click.option("--builds", "builds_dir", type=click.Path(file_okay=False, path_type=Path), default=Path("out"),
              show_default=True, help="The `stackforge build --out` folder whose build records give a built-here "
                                      "stack's lock hash and image digest.")
@click.option("--out", "out_file", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="Write the statement to FILE (atomically) instead of stdout.")
@click.option("--push", is_flag=True,
              help="Attach the statement to the image in its registry (OCI referrers API, or the "
                   "sha256-<digest> tag schema where the registry has no referrers API).")
def command(ref: str, results: Path, runs: tuple[str, ...], plan_path: Path | None, matrix: str | None,
            no_plan: bool, target: str | None, skip_bad: bool, builds_dir: Path, out_file: Path | None,
            push: bool) -> None:
    """Write what the image REF (repo@sha256:..., or a stack id whose records name one digest) was proven
    to do on the target: per feature its status, evidence level (measured-gpu, measured-gate, built,
    admitted, predicted, not-tested...), what decided it and the sha256 of its evidence; the GPU host;
    the lock hash when built here; the knowledge version (sha256 of the rules and pins) it was judged with.

    \b
    Example:
      stackforge qualify 127.0.0.1:5000/sf/cu131@sha256:... --target rtx-pro-6000-x8-pcie --push
    """
    from stackforge.build.records import read_record
    from stackforge.core.records import utc_now
    from stackforge.report.compat_matrix import build_matrix
    from stackforge.report.qualification import current_knowledge, qualify, statement_text

    if not ref.strip() or any(ch.isspace() for ch in ref):
        raise SpecError(f"REF {ref!r} is not an image reference or a stack id")
    if out_file is not None:
        check_out_path(out_file)    # before any work: nothing half-written
    evidence = load_evidence(results=results, runs=runs, plan_path=plan_path, matrix=matrix, no_plan=no_plan,
                             target=target, skip_bad=skip_bad)
    report = build_matrix(evidence.records, evidence.plan, evidence.target)
    builds = {row.stack_id: record for row in report.rows
              if (record := read_record(builds_dir, row.stack_id)) is not None}
    overlay = user_compat()
    knowledge = current_knowledge(overlay.files if overlay else ())
    qualification = qualify(report, ref, builds=builds, knowledge=knowledge, judged_at=utc_now())
    text = statement_text(qualification)
    write_output(text, out_file)
    for line in qualification.summary_lines():
        click.echo(line, err=True)
    if push:
        from stackforge.edges.oci_artifacts import push_artifact
        from stackforge.report.qualification import ARTIFACT_TYPE, PAYLOAD_MEDIA_TYPE

        pushed = push_artifact(qualification.image, text.encode(), artifact_type=ARTIFACT_TYPE,
                               media_type=PAYLOAD_MEDIA_TYPE, annotations=qualification.annotations())
        click.echo(f"attached to {qualification.image} as {pushed.ref} ({pushed.linked_by})", err=True)
