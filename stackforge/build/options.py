"""Options of a build run (frozen; the CLI builds one from its flags and passes it down)."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path

from stackforge.build.locking import LockMode
from stackforge.compose.dockerfile import NO_DEPS_LAYERS, ComposeOptions
from stackforge.compose.stack_lock import StackLock
from stackforge.core.errors import SpecError
from stackforge.edges.index import IndexConfig, IndexRequest, image_indexes, resolver_indexes
from stackforge.edges.pip_config import refuse_credentials
from stackforge.edges.resolver import ResolverIndexes

DEFAULT_TIMEOUT_S = 3600.0
DEFAULT_PULL_TIMEOUT_S = 60.0
#: BuildKit cache attributes whose values are credentials (type=gha token, type=s3 / azblob keys).
_SECRET_CACHE_ATTRIBUTES = frozenset({"token", "access_key_id", "secret_access_key", "session_token"})


class Builder(str, Enum):
    """Which builder runs the Dockerfiles."""

    AUTO = "auto"        # buildx when `docker buildx version` works, else classic
    BUILDX = "buildx"    # BuildKit through `docker buildx build` (cache mounts, secrets)
    CLASSIC = "classic"  # the Docker SDK's classic builder (no mounts; CA over 127.0.0.1)


@dataclass(frozen=True, slots=True)
class BuildOptions:
    """How to build a set of stacks.

    Attributes:
        base_image: FROM image for every stack instead of the derived one (``--base-image``).
        index_url / extra_index_urls: pip indexes for everything except torch from its PyTorch index.
        find_links: a wheelhouse directory (pip ``--find-links``); torch comes from it when given.
        ca_bundle: a PEM bundle pip must trust (corporate TLS); passed as a build secret, never stored.
            The CLI defaults it to the bundle pip on this host trusts (stackforge.build.trust).
        push: registry prefix to push images to (``registry.example.com/team``), or None.
        jobs: stacks built at the same time.
        resume: skip stacks whose record says built and whose image still exists with the same hash.
        out_dir: where logs, build records and composed contexts go.
        builder: auto | buildx | classic.
        timeout_s: limit for one stack's image build (each attempt).
        no_deps: layers installed with ``--no-deps`` (flashinfer, kernel, sglang); the image says so.
        labels: extra labels for every image (tests put ``io.stackforge.test=1`` here).
        retries: extra attempts after a transient network failure.
        retry_backoff_s: wait before the first retry; doubled for each later one.
        verify: check the built image from the inside (versions, nvcc, pip check, labels).
        pull_timeout_s: how long ``docker pull`` of a missing base image may try.
        no_cache: build without the layer cache (pip's download cache mount is kept).
        dependency_layers: look up what FlashInfer / SGLang declare they need (index metadata) and
            install that in a layer of its own, shared across their releases; off, or when the index
            cannot tell, each package brings its dependencies in its own layer.
        lock: how each stack's lock is had before any image work (:class:`LockMode`; ``off``: none,
            each layer's pip resolves on its own). The CLI's default is ``resolve``.
        resolve_timeout_s: limit for one call of the resolver.
        cache_from / cache_to: BuildKit ``--cache-from`` / ``--cache-to`` values (``type=registry,ref=...``)
            so a fresh machine reuses the layers another one built; ``{stack}`` is replaced by the
            stack's image repository name.
        installer: what installs each layer of a stack lock in the image: ``pip`` or ``uv`` (the uv of
            this host's version, locked and installed first into its own prefix).
        builder_name: a named buildx builder (``docker buildx create --name ...``, e.g. the kubernetes
            driver) to build on instead of the current one.
    """

    base_image: str | None = None
    index_url: str | None = None
    extra_index_urls: tuple[str, ...] = ()
    find_links: Path | None = None
    ca_bundle: Path | None = None
    push: str | None = None
    jobs: int = 1
    resume: bool = False
    out_dir: Path = Path("out")
    builder: Builder = Builder.AUTO
    timeout_s: float = DEFAULT_TIMEOUT_S
    no_deps: frozenset[str] = field(default_factory=frozenset)
    labels: tuple[tuple[str, str], ...] = ()
    retries: int = 2
    retry_backoff_s: float = 10.0
    verify: bool = True
    pull_timeout_s: float = DEFAULT_PULL_TIMEOUT_S
    no_cache: bool = False
    dependency_layers: bool = True
    lock: LockMode = LockMode.OFF
    resolve_timeout_s: float = 300.0
    cache_from: tuple[str, ...] = ()
    cache_to: tuple[str, ...] = ()
    builder_name: str | None = None
    installer: str = "pip"

    def __post_init__(self) -> None:
        if self.installer == "uv" and self.lock is LockMode.OFF:
            raise SpecError("--installer uv installs the stack lock, which --no-lock turns off")
        if self.jobs < 1:
            raise SpecError(f"--jobs must be at least 1, not {self.jobs}")
        if self.retries < 0:
            raise SpecError(f"retries must be >= 0, not {self.retries}")
        if not self.timeout_s > 0:
            raise SpecError(f"the build timeout must be positive, not {self.timeout_s}")
        for spec in (*self.cache_from, *self.cache_to):
            refuse_credentials(spec, what="--cache-from/--cache-to value", remedy="log in to the registry instead (docker login)")
        if self.push:
            refuse_credentials(self.push, what="--push", remedy="log in to the registry instead (docker login)")
        self.index_config()   # an index URL with credentials is refused before anything else happens
        unknown = set(self.no_deps) - NO_DEPS_LAYERS
        if unknown:
            raise SpecError(f"--no-deps takes {', '.join(sorted(NO_DEPS_LAYERS))}; unknown: "
                            f"{', '.join(sorted(unknown))}")

    def index_config(self) -> IndexConfig:
        """The places the images' pip installs from (the same function gives ``plan --preflight`` its own)."""
        return image_indexes(IndexRequest(self.index_url, self.extra_index_urls, self.find_links),
                             ca_bundle=self.ca_bundle)

    def resolver_indexes(self) -> ResolverIndexes:
        """Where the stack locks are resolved: the places the images' pip installs from."""
        return resolver_indexes(self.index_config())

    def cache_secrets(self) -> tuple[str, ...]:
        """Values of ``--cache-from`` / ``--cache-to`` attributes that are secrets (``token=`` of the GitHub
        cache, the S3 keys): they stay out of every log and printed command line."""
        return tuple(value for spec in (*self.cache_from, *self.cache_to) for key, _, value in
                     (field.partition("=") for field in spec.split(","))
                     if key.strip() in _SECRET_CACHE_ATTRIBUTES and value)

    def compose_options(self, *, buildkit: bool, base_image: str | None,
                        declared: tuple[tuple[str, tuple[str, ...]], ...] = (),
                        dropped_layers: tuple[str, ...] = (),
                        wheelhouse_mount: bool = True, lock: StackLock | None = None) -> ComposeOptions:
        """The compose options for one stack under the chosen builder and resolved base image."""
        return ComposeOptions(buildkit=buildkit, base_image=base_image, index_url=self.index_url,
                              extra_index_urls=tuple(self.extra_index_urls),
                              wheelhouse=self.find_links is not None, wheelhouse_mount=wheelhouse_mount,
                              ca_bundle=self.ca_bundle is not None,
                              no_deps=frozenset(self.no_deps), declared=declared,
                              dropped_layers=dropped_layers, lock=lock, installer=self.installer,
                              uv_requirement=_uv_requirement() if self.installer == "uv" else None)


def _uv_requirement() -> str:
    """The uv an image installs with: the version this host resolves with (the ``uv`` dependency)."""
    from importlib.metadata import PackageNotFoundError, version
    try:
        return f"uv=={version('uv')}"
    except PackageNotFoundError:
        raise SpecError("--installer uv needs the uv package on this host", remedy="pip install uv") from None
