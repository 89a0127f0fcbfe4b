"""``stackforge build``: render and build the images of a matrix (BuildKit, or the classic builder)."""

from __future__ import annotations

import re
from pathlib import Path

import click

from stackforge.cli.options import (
    ca_choice,
    image_options,
    positive_seconds,
    selection,
    shard_option,
    stack_selection,
)
from stackforge.core.errors import BuildError, SpecError, UnsafeValueError


@click.command(name="build")
@stack_selection
@shard_option
@image_options
@click.option("-j", "--jobs", type=int, default=1, show_default=True, help="Stacks built at the same time.")
@click.option("--resume", is_flag=True, help="Skip stacks already built with the same content hash.")
@click.option("--out", "out_dir", type=click.Path(file_okay=False, path_type=Path), default=Path("out"),
              show_default=True, help="Folder for logs/, builds/ (records) and contexts/.")
@click.option("--builder", type=click.Choice(["auto", "buildx", "classic"]), default="auto", show_default=True,
              help="buildx (BuildKit) or the Docker SDK's classic builder; auto prefers buildx.")
@click.option("--push", metavar="REGISTRY", default=None, callback=lambda ctx, param, value: _push_checked(value),
              help="Push each image to this registry prefix (log in with `docker login` first).")
@click.option("--timeout", "timeout_s", type=float, default=3600.0, show_default=True, callback=positive_seconds,
              help="Limit for one stack's image build, in seconds.")
@click.option("--retries", type=int, default=2, show_default=True,
              help="Extra attempts after a transient network failure.")
@click.option("--no-cache", is_flag=True, help="Build without the layer cache.")
@click.option("--no-verify", is_flag=True, help="Skip checking the installed versions inside each image.")
@click.option("--label", "labels", metavar="KEY=VALUE", multiple=True, help="Extra image label (repeatable).")
@click.option("--progress/--no-progress", default=True, show_default=True, help="Live progress view.")
@click.option("--locked", is_flag=True,
              help="Refuse to build a stack whose recorded lock is not what the index resolves to now.")
@click.option("--relock", is_flag=True, help="Resolve every stack's lock afresh and record it.")
@click.option("--no-lock", is_flag=True,
              help="Build without stack locks: each layer's pip resolves on its own (the old way).")
@click.option("--installer", type=click.Choice(["uv", "pip"]), default=None,
              help="What installs each layer of the stack lock in the image. Default: uv (the uv of this host, "
                   "locked and installed first into its own prefix; half the cold build time of pip here); pip "
                   "with --no-lock.")
@click.option("--cache-from", "cache_from", metavar="CACHE", multiple=True,
              help="BuildKit cache to read, e.g. type=registry,ref=REG/cache:{stack} (repeatable).")
@click.option("--cache-to", "cache_to", metavar="CACHE", multiple=True,
              help="BuildKit cache to write, e.g. type=registry,ref=REG/cache:{stack},mode=max (repeatable; needs "
                   "a docker-container or kubernetes builder).")
@click.option("--buildx-builder", "builder_name", metavar="NAME", default=None,
              help="Build on this named buildx builder (docker buildx create --name NAME ...).")
def command(matrix, cuda, targets, only, shard, base_image, index_url, extra_index_urls, find_links, ca_bundle,
            no_deps, dependency_layers, jobs, resume, out_dir, builder, push, timeout_s, retries, no_cache, no_verify,
            labels, progress, locked, relock, no_lock, installer, cache_from, cache_to, builder_name) -> None:
    """Build the images of every kept stack of a matrix; one log per run and one record per stack.

    Each stack's lock (every package, file and sha256; PEP 751 pylock.toml in OUT/locks/STACK/) is
    resolved on the host first, and each image layer installs its part of it exactly: a conflict is
    reported in seconds (exit 2), before any image work.
    """
    from stackforge.build import Builder, BuildOptions, build_stacks
    from stackforge.build.locking import LockMode
    from stackforge.cli._runs import connect_engine
    from stackforge.plan.selection import cells_to_build

    cells = cells_to_build(selection(matrix, cuda, targets, only, shard))
    if not cells:
        click.echo(f"shard {shard} holds none of the kept stacks: nothing to build", err=True)
        return
    ca = ca_choice(ca_bundle)
    lock = _lock_mode(LockMode, locked=locked, relock=relock, no_lock=no_lock)
    installer = installer or ("pip" if lock is LockMode.OFF else "uv")
    options = BuildOptions(base_image=base_image, index_url=index_url, extra_index_urls=tuple(extra_index_urls),
                           find_links=find_links, ca_bundle=ca.path, push=push, jobs=jobs, resume=resume,
                           out_dir=out_dir, builder=Builder(builder), timeout_s=timeout_s,
                           no_deps=frozenset(no_deps), labels=_labels(labels), retries=retries,
                           verify=not no_verify, no_cache=no_cache, dependency_layers=dependency_layers,
                           lock=lock, cache_from=tuple(cache_from), cache_to=tuple(cache_to),
                           builder_name=builder_name, installer=installer)
    click.echo(f"building {len(cells)} stack(s) -> {out_dir}; {ca.describe()}", err=True)
    summary = build_stacks(cells, options, client=connect_engine(), progress=progress)
    for warning in summary.warnings:
        click.echo(f"stackforge: warning: {warning}", err=True)
    if not progress:
        for record in summary.records:
            click.echo(f"  {record.status.value:<11} {record.stack_id}  {record.image_tag or '-'}  {record.reason}")
    if summary.failed:
        raise BuildError(f"{len(summary.failed)} of {len(summary.records)} stack(s) failed: "
                         f"{', '.join(summary.failed)}", failed=summary.failed,
                         remedy=f"see {out_dir}/builds/<stack-id>.json and the log it names "
                                f"({out_dir}/logs/<stack-id>.<run-id>.log)")


def _lock_mode(modes, *, locked: bool, relock: bool, no_lock: bool):
    chosen = [name for name, on in (("--locked", locked), ("--relock", relock), ("--no-lock", no_lock)) if on]
    if len(chosen) > 1:
        raise SpecError(f"{' and '.join(chosen)} exclude each other")
    return {"--locked": modes.LOCKED, "--relock": modes.RELOCK, "--no-lock": modes.OFF}.get(
        chosen[0] if chosen else "", modes.RESOLVE)


def _labels(pairs: tuple[str, ...]) -> tuple[tuple[str, str], ...]:
    labels = []
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise SpecError(f"--label {pair!r} is not KEY=VALUE")
        # A label goes into the Dockerfile and the build record: a newline would start another instruction.
        if any(ch.isspace() for ch in key) or any(ord(ch) < 32 or ord(ch) == 127 for ch in value):
            raise UnsafeValueError(f"--label {pair!r}: a key has no white space and a value is one line of text",
                                   remedy="e.g. --label org.example.team=infra")
        labels.append((key, value))
    return tuple(labels)


# ``[scheme://]user:password@host/...``: the part before the host's ``@`` is a credential.
_USERINFO = re.compile(r"^(?P<scheme>[A-Za-z][A-Za-z0-9+.-]*://)?(?P<userinfo>[^/@]*)@")


def _push_checked(value: str | None) -> str | None:
    """Refuse, before any work, a --push that is no registry prefix; one with credentials without echoing them."""
    if value is None:
        return None
    found = _USERINFO.match(value)
    if found:
        user = found["userinfo"].partition(":")[0] if ":" in found["userinfo"] else ""
        shown = f"{found['scheme'] or ''}{user + ':' if user else ''}***@{value[found.end():]}"
        raise UnsafeValueError(f"--push {shown}: a registry prefix carries no credentials",
                               remedy="log in with `docker login HOST` and give --push HOST/PATH; stackforge "
                                      "never handles registry passwords")
    from stackforge.edges.registry import Repository

    Repository.parse(value)
    return value
