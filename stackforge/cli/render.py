"""``stackforge render``: write each stack's Dockerfile and build context (no Docker needed)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import click

from stackforge.cli.options import (
    ca_choice,
    image_options,
    out_folder_checked,
    selection,
    shard_option,
    stack_selection,
)


@click.command(name="render")
@stack_selection
@shard_option
@image_options
@click.option("--out", "out_dir", type=click.Path(path_type=Path), default=Path("out/contexts"),
              show_default=True, callback=out_folder_checked,
              help="One sub-folder per stack id is written here.")
@click.option("--builder", type=click.Choice(["buildkit", "classic"]), default="buildkit", show_default=True,
              help="Render for BuildKit (RUN --mount) or for the classic builder.")
@click.option("--no-lock", is_flag=True, help="Render without stack locks (as `build --no-lock` builds).")
@click.option("--max-cells", "max_cells", type=click.IntRange(min=1), default=None, metavar="N",
              help="Plan up to N cells (default: the cap `stackforge plan` has, docs/matrix-format.md).")
def command(matrix, cuda, targets, only, shard, base_image, index_url, extra_index_urls, find_links, ca_bundle,
            no_deps, dependency_layers, out_dir, builder, no_lock, max_cells) -> None:
    """Render the Dockerfile and context of every kept stack; print each stack's folder and image tag.

    The base image is the derived one (or --base-image): a build may still substitute a local one.
    Each stack's lock is resolved first, as `build` does, and kept inside the --out folder
    (OUT/locks/STACK/pylock.toml); nothing is written outside it.
    """
    from stackforge.build.contexts import ContextsRequest, RenderRequest, render_stacks
    from stackforge.compose.dockerfile import ComposeOptions

    # The same CA default as `build`: a bundle adds its secret mount to the Dockerfile, so render and
    # build must agree on it for the tags to match.
    ca = ca_choice(ca_bundle)
    click.echo(ca.describe(), err=True)
    options = ComposeOptions(buildkit=builder == "buildkit", base_image=base_image, index_url=index_url,
                             extra_index_urls=tuple(extra_index_urls), wheelhouse=find_links is not None,
                             ca_bundle=ca.path is not None, no_deps=frozenset(no_deps))
    contexts = ContextsRequest(options, out_dir=Path(out_dir), dependency_layers=dependency_layers, ca_bundle=ca.path)
    stacks = dataclasses.replace(selection(matrix, cuda, targets, only, shard), max_cells=max_cells)
    request = RenderRequest(stacks, contexts, lock=not no_lock, find_links=find_links)
    for written in render_stacks(request, tell=lambda line: click.echo(line, err=True)):
        if written.warning:
            click.echo(f"stackforge: warning: {written.warning}", err=True)
        click.echo(f"{written.folder}  {written.tag}")
