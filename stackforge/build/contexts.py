"""``stackforge render`` without building: each stack's Dockerfile and build context, written to a folder.

The same rendering a build does (:mod:`stackforge.build.scheduler`), including the dependency layers
read from the index, so the tags printed here are the tags a build with the same options gives.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from stackforge.build.requires import RequirementsLookup, declared_for, dropped_warning
from stackforge.compose.dockerfile import INLINE_DEPS_SUFFIX, ComposeOptions, compose_stack, write_context
from stackforge.compose.stack_lock import StackLock
from stackforge.core.model import Stack
from stackforge.plan.selection import StackSelection


@dataclass(frozen=True, slots=True)
class ContextsRequest:
    """What to render and where: one sub-folder per stack id under ``out_dir``.

    ``dependency_layers``: ask the index (``options.index_url``, trusting ``ca_bundle``) what
    FlashInfer and SGLang declare, for a shared layer of their dependencies (a stack with a lock in
    ``locks`` installs its lock instead, as a build does).
    """

    options: ComposeOptions
    out_dir: Path
    dependency_layers: bool = True
    ca_bundle: Path | None = None
    locks: Mapping[str, StackLock] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class RenderRequest:
    """One ``stackforge render``: the stacks (the kept ones of ``selection``), the contexts to write, and
    whether each stack is locked first as ``build`` locks it (``find_links``: a wheelhouse the resolver
    reads too)."""

    selection: StackSelection
    contexts: ContextsRequest
    lock: bool = True
    find_links: Path | None = None


def render_stacks(request: RenderRequest, tell: Callable[[str], None] = lambda line: None) -> Iterator[WrittenContext]:
    """``stackforge render``'s one library entry: plan the selection, lock every kept stack as ``build``
    does (recorded, or resolved and recorded inside the render folder: OUT/locks/STACK/pylock.toml, so
    the tags are the build's), telling one line per lock, then write each stack's context.

    Raises:
        SpecError: the selection keeps no stack at all.
        ResolutionConflict / HostError: a stack's lock cannot be resolved (as in ``build``).
    """
    from stackforge.plan.selection import cells_to_build

    cells = cells_to_build(request.selection)
    if not cells:
        tell(f"shard {request.selection.shard_text} holds none of the kept stacks: nothing to render")
    contexts = request.contexts
    if request.lock:
        from stackforge.build.locking import LockMode, lock_stacks
        from stackforge.edges.index import IndexRequest, image_indexes, resolver_indexes

        options = contexts.options
        indexes = resolver_indexes(image_indexes(IndexRequest(options.index_url, options.extra_index_urls,
                                                              request.find_links), ca_bundle=contexts.ca_bundle))
        # Inside --out (OUT/locks/STACK/pylock.toml): render writes nothing outside the folder it was given.
        locks = lock_stacks(cells, LockMode.RESOLVE, out_dir=contexts.out_dir, compose=options, indexes=indexes)
        contexts = dataclasses.replace(contexts, locks={stack_id: done.lock for stack_id, done in locks.items()})
        for done in locks.values():
            tell(f"{done.lock.stack_id}: {done.line()}")
    yield from compose_contexts(cells, contexts)


@dataclass(frozen=True, slots=True)
class WrittenContext:
    """One stack's context on disk; ``warning`` is a dropped-layer notice not told for an earlier stack."""

    folder: Path
    tag: str
    warning: str = ""


def compose_contexts(cells: Sequence[tuple[Stack, Any]], request: ContextsRequest) -> Iterator[WrittenContext]:
    """Compose and write each (stack, derived) cell's context, in order, one :class:`WrittenContext` each."""
    lookup = RequirementsLookup(request.options.index_url, request.ca_bundle)
    no_deps = frozenset(request.options.no_deps)
    told: set[str] = set()
    for stack, derived in cells:
        declared, dropped = ((), ())
        lock = request.locks.get(stack.id)
        if request.dependency_layers and lock is None:
            declared, dropped = declared_for(stack, lookup, no_deps=no_deps)
        warning = dropped_warning(dropped, INLINE_DEPS_SUFFIX) if dropped else ""
        if warning in told:   # stacks sharing a release share the warning
            warning = ""
        told.add(warning)
        composed = compose_stack(stack, derived, dataclasses.replace(
            request.options, declared=declared, dropped_layers=tuple(d.layer for d in dropped), lock=lock))
        folder = request.out_dir / stack.id
        write_context(composed, folder)
        yield WrittenContext(folder=folder, tag=composed.tag, warning=warning)
