"""BuildKit builds through ``docker buildx build`` (a subprocess, through stackforge's runner).

docker-py cannot drive BuildKit (docker/docker-py#2230), so the CLI plugin does the build: host
network, ``--load`` into the engine, the CA bundle as ``--secret id=ca`` (mounted only into the RUN
steps that need it, never stored), and the wheelhouse as a named build context (BuildKit >= 0.10).
Older engines (dockerd 20.10 embeds BuildKit 0.8, whose built-in Dockerfile frontend rejects
``--build-context`` with "unsupported frontend capability moby.buildkit.frontend.contexts") get the
wheelhouse from stackforge's 127.0.0.1 asset server instead, as classic builds do.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from stackforge.build.cancel import Cancel
from stackforge.edges import runner

PROXY_VARIABLES = ("HTTP_PROXY", "HTTPS_PROXY", "NO_PROXY", "FTP_PROXY", "ALL_PROXY",
                   "http_proxy", "https_proxy", "no_proxy", "ftp_proxy", "all_proxy")
_VERSION = re.compile(r"v(\d+)\.(\d+)")
NAMED_CONTEXTS_SINCE = (0, 10)


@dataclass(frozen=True, slots=True)
class BuildAttempt:
    """One run of a builder: did it produce an image, and what did it print."""

    ok: bool
    image_id: str | None
    tail: str
    duration_s: float
    timed_out: bool
    ending: str          # "exited with status 1", "timed out after ...", ...


def buildkit_version(*, timeout: float = 30.0) -> tuple[int, int] | None:
    """BuildKit version of the default builder (``docker buildx inspect``), or None if unknown."""
    result = runner.run(["docker", "buildx", "inspect"], timeout=timeout)
    if not result.succeeded:
        return None
    for line in result.output_tail.splitlines():
        if "buildkit" in line.lower():
            found = _VERSION.search(line)
            if found:
                return int(found.group(1)), int(found.group(2))
    return None


def supports_named_contexts(version: tuple[int, int] | None) -> bool:
    return version is not None and version >= NAMED_CONTEXTS_SINCE


def proxy_build_args(environ: Mapping[str, str]) -> list[str]:
    """Names of the proxy variables set here; Docker's predefined proxy ARGs stay out of history."""
    return [name for name in PROXY_VARIABLES if environ.get(name)]


def buildx_argv(context_dir: Path, *, iidfile: Path, ca_bundle: Path | None,
                wheelhouse_context: Path | None, labels: Sequence[tuple[str, str]],
                proxy_args: Sequence[str], no_cache: bool = False, cache_from: Sequence[str] = (),
                cache_to: Sequence[str] = (), builder_name: str | None = None,
                build_args: Mapping[str, str] | None = None) -> list[str]:
    """The ``docker buildx build`` command line (pure).

    The image is left untagged: the metadata step tags the final image, so the tag never points at
    an image without its labels, and the previous image under the tag stays visible until then.
    Proxy values are not on the command line: ``--build-arg NAME`` makes the CLI read them from the
    environment, so credentials in a proxy URL never reach the log.
    ``cache_from`` / ``cache_to`` are BuildKit cache locations (``type=registry,ref=...``; exporting one
    needs a builder of the docker-container or kubernetes driver, named by ``builder_name``).
    """
    argv = ["docker", "buildx", "build", "--progress", "plain", "--network", "host", "--load",
            "--iidfile", str(iidfile)]
    if builder_name:
        argv += ["--builder", builder_name]
    if no_cache:
        argv.append("--no-cache")
    for location in cache_from:
        argv += ["--cache-from", location]
    for location in cache_to:
        argv += ["--cache-to", location]
    if ca_bundle is not None:
        argv += ["--secret", f"id=ca,src={Path(ca_bundle).resolve()}"]
    if wheelhouse_context is not None:
        argv += ["--build-context", f"wheelhouse={Path(wheelhouse_context).resolve()}"]
    for name in proxy_args:
        argv += ["--build-arg", name]
    for name, value in (build_args or {}).items():   # stackforge's own (the asset server's port): no secrets
        argv += ["--build-arg", f"{name}={value}"]
    for key, value in labels:
        argv += ["--label", f"{key}={value}"]
    return [*argv, str(context_dir)]


def build(context_dir: Path, *, ca_bundle: Path | None, wheelhouse_context: Path | None,
          labels: Sequence[tuple[str, str]], timeout: float, log_path: Path, cancel: Cancel,
          redact: Sequence[str] = (), no_cache: bool = False, cache_from: Sequence[str] = (),
          cache_to: Sequence[str] = (), builder_name: str | None = None,
          build_args: Mapping[str, str] | None = None) -> BuildAttempt:
    """Run one ``docker buildx build``; a Ctrl-C elsewhere (``cancel``) makes the runner stop its process group."""
    iidfile = Path(context_dir) / ".stackforge-iid"
    iidfile.unlink(missing_ok=True)
    argv = buildx_argv(context_dir, iidfile=iidfile, ca_bundle=ca_bundle,
                       wheelhouse_context=wheelhouse_context, labels=labels,
                       proxy_args=proxy_build_args(os.environ), no_cache=no_cache, cache_from=cache_from,
                       cache_to=cache_to, builder_name=builder_name, build_args=build_args)
    result = runner.run(argv, timeout=timeout, log_path=log_path, redact=redact, cancel=cancel)
    image_id = iidfile.read_text().strip() if result.succeeded and iidfile.exists() else None
    return BuildAttempt(ok=result.succeeded and bool(image_id), image_id=image_id, tail=result.output_tail,
                        duration_s=result.duration_s, timed_out=result.timed_out, ending=result.describe())

