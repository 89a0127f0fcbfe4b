"""``stackforge bootstrap-base``: a Debian base image without any registry (debootstrap + import)."""

from __future__ import annotations

from pathlib import Path

import click


@click.command(name="bootstrap-base")
@click.option("--ref", default="stackforge/debian:bookworm", show_default=True, help="Image reference to create.")
@click.option("--suite", default="bookworm", show_default=True, help="Debian suite (bookworm: python 3.11).")
@click.option("--mirror", default="http://deb.debian.org/debian", show_default=True, help="Debian mirror.")
@click.option("--force", is_flag=True, help="Recreate the image even if it exists.")
@click.option("--log", "log_path", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="Write debootstrap's output to this file.")
def command(ref: str, suite: str, mirror: str, force: bool, log_path: Path | None) -> None:
    """Create a Debian base image from Debian packages (debootstrap, docker import), for air-gapped builds."""
    from stackforge.edges.bootstrap import bootstrap_base
    from stackforge.edges.docker_engine import connect

    result = bootstrap_base(connect(), ref=ref, suite=suite, mirror=mirror, force=force, log_path=log_path,
                            report=click.echo)
    click.echo(result.describe())
