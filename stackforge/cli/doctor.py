"""``stackforge doctor``: check this host (engine, buildx, disk, GPUs, runnable targets, index, registry,
CA bundle). Gathering is :mod:`stackforge.doctor.facts`; judging is :mod:`stackforge.doctor.checks`."""

from __future__ import annotations

import click

from stackforge.cli._compat import user_compat
from stackforge.core.envelope import report_json_text


@click.command(name="doctor")
@click.option("--json", "as_json", is_flag=True, help="Print versioned JSON (schema stackforge.doctor/1).")
@click.option("--index-url", metavar="URL", default=None,
              help="The index to check (default: pip's: PIP_INDEX_URL, pip config, else PyPI).")
@click.option("--registry", metavar="REF", default=None,
              help="Also check that this registry answers (host[:port]/path, as for build --push).")
@click.option("--ca-bundle", metavar="FILE", default=None,
              help="The CA bundle to check and use (default: pip's cert setting).")
@click.option("--gpu", "gpu", is_flag=True,
              help="Also run the host check every runtime probe and bench run starts with, for each target this "
                   "host can run: driver, persistence mode, Fabric Manager (NVSwitch), Xid/ECC errors, IOMMU/ACS, "
                   "the nvidia_uvm HMM setting.")
def command(as_json: bool, index_url: str | None, registry: str | None, ca_bundle: str | None, gpu: bool) -> None:
    """Check what this host offers and print one line per check: ok, warn, missing or fail.

    \b
    Exit codes: 0 every required check (the Docker engine, for build/probe/bench) is ok
                1 a required check is missing or failed (with --gpu: also a failing host check)
    """
    from stackforge.doctor.checks import build_report
    from stackforge.doctor.facts import gather
    from stackforge.plan.planner import load_knowledge

    targets = load_knowledge(user=user_compat()).targets
    report = build_report(gather(index_url=index_url, registry=registry, ca_bundle=ca_bundle, gpu=gpu), targets)
    click.echo(report_json_text(report.to_json()) if as_json else report.render(), nl=not as_json)
    if report.exit_code:
        raise click.exceptions.Exit(report.exit_code)
