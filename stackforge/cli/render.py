"""``stackforge render``: write each stack's Dockerfile and build context (no Docker needed)."""

from __future__ import annotations

from pathlib import Path

import click

from stackforge.cli.options import ca_choice, image_options, out_folder_checked, selection, shard_option, stack_selection


@click.command(name="render")
@stack_selection
@shard_option
@image_options
@click.option("--out", "out_dir", type=click.Path(path_type=Path), default=Path("out/contexts"),
              show_default=True, callback=out_folder_checked,
              help="One sub-folder per stack id is written here.")
@click.option("--builder", type=click.Choice(["buildkit", "classic"]), default="buildkit", show_default=True,
              help="Render for BuildKit (RUN --mount) or for the classic builder.")
def command(matrix, cuda, targets, only, shard, base_image, index_url, extra_index_urls, find_links, ca_bundle,
            no_deps, dependency_layers, out_dir, builder) -> None:
    """Render the Dockerfile and context of every kept stack; print each stack's folder and image tag.

    The base image is the derived one (or --base-image): a build may still substitute a local one.
    """
    import dataclasses

    from stackforge.build.requires import RequirementsLookup, declared_for, dropped_warning
    from stackforge.render import INLINE_DEPS_SUFFIX, RenderOptions, render_stack, write_context
    from stackforge.selection import cells_to_build

    # The same CA default as `build`: a bundle adds its secret mount to the Dockerfile, so render and
    # build must agree on it for the tags to match.
    ca = ca_choice(ca_bundle)
    click.echo(ca.describe(), err=True)
    options = RenderOptions(buildkit=builder == "buildkit", base_image=base_image, index_url=index_url,
                            extra_index_urls=tuple(extra_index_urls), wheelhouse=find_links is not None,
                            ca_bundle=ca.path is not None, no_deps=frozenset(no_deps))
    lookup = RequirementsLookup(index_url, ca.path)
    cells = cells_to_build(selection(matrix, cuda, targets, only, shard))
    if not cells:
        click.echo(f"shard {shard} holds none of the kept stacks: nothing to render", err=True)
    warned: set[str] = set()
    for stack, derived in cells:
        declared, dropped = ((), ())
        if dependency_layers:
            declared, dropped = declared_for(stack, lookup, no_deps=frozenset(no_deps))
        warning = dropped_warning(dropped, INLINE_DEPS_SUFFIX) if dropped else ""
        if warning and warning not in warned:   # stacks sharing a release share the warning
            warned.add(warning)
            click.echo(f"stackforge: warning: {warning}", err=True)
        rendered = render_stack(stack, derived, dataclasses.replace(
            options, declared=declared, dropped_layers=tuple(d.layer for d in dropped)))
        folder = Path(out_dir) / stack.id
        write_context(rendered, folder)
        click.echo(f"{folder}  {rendered.tag}")

