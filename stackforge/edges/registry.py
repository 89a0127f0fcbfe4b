"""The registry hand-off: push an image and learn its digest, pull by digest.

Build machines push, probe machines pull, and records name images by *digest*
(``<registry>/<repo>@sha256:...``), never by a moving tag. Everything here goes through the ``docker``
CLI via :mod:`stackforge.edges.runner`, so it honours ``DOCKER_HOST`` (remote engines), the CLI's credential
store (``docker login`` / ``docker/login-action``) and its proxy settings. stackforge itself never
handles registry passwords. ``stackforge build --push`` pushes through :func:`push`; probe machines
pull through :func:`pull`.

Plain-HTTP registries: dockerd allows ``127.0.0.0/8`` (and ``localhost``) without TLS by default; other
plain-HTTP registries must be listed in the engine's ``insecure-registries``.

The pure helpers (:class:`Repository`, :func:`split_digest_ref`) never touch the engine.
"""

from __future__ import annotations

import ipaddress
import json
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from stackforge.core.errors import CommandError, DockerUnavailableError, SpecError, UnsafeValueError
from stackforge.edges import runner

#: Seconds a push or a pull of one image may take (an SGLang image is 7-11 GB).
TRANSFER_TIMEOUT_S = 3600.0
#: Seconds for quick engine and registry queries (inspect, tag, manifest lookup).
QUERY_TIMEOUT_S = 120.0
#: The registry Docker assumes when a reference names none.
DOCKER_HUB = "docker.io"

DIGEST = re.compile(r"sha256:[0-9a-f]{64}")
# Docker's reference grammar (distribution/reference), restricted to what stackforge needs.
_HOST_COMPONENT = r"(?:[a-zA-Z0-9]|[a-zA-Z0-9][a-zA-Z0-9-]*[a-zA-Z0-9])"
_HOST = re.compile(rf"(?:{_HOST_COMPONENT}(?:\.{_HOST_COMPONENT})*|\[[0-9a-fA-F:]+\])(?::[0-9]{{1,5}})?")
_PATH_COMPONENT = re.compile(r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*")
_TAG = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}")
# "t1: digest: sha256:... size: 523" is how `docker push` reports what the registry stored.
_PUSH_DIGEST_LINE = re.compile(r"^(?P<tag>\S+): digest: (?P<digest>sha256:[0-9a-f]{64}) size: \d+",
                               re.MULTILINE)
_ENGINE_DOWN = ("Cannot connect to the Docker daemon", "error during connect")


# ----------------------------------------------------------------------------------------- references


@dataclass(frozen=True, slots=True)
class Repository:
    """An image repository in a registry, e.g. ``ghcr.io/acme/stackforge`` or ``127.0.0.1:5000/sf``.

    Attributes:
        host: registry host with optional port (``docker.io`` when the reference names none).
        path: repository path inside the registry (lower-case components separated by ``/``).
    """

    host: str
    path: str

    @classmethod
    def parse(cls, ref: str) -> Repository:
        """Parse ``[host[:port]/]path`` the way Docker does (first component is a host if it has . or :).

        Raises:
            UnsafeValueError: whitespace, a tag/digest suffix, or characters Docker does not allow.
        """
        text = str(ref).strip().rstrip("/")
        if not text or any(ch.isspace() for ch in str(ref).strip()) or "@" in text or "," in text:
            raise UnsafeValueError(
                f"registry repository {ref!r} is not of the form host[:port]/path",
                remedy="e.g. --registry ghcr.io/acme/stackforge or 127.0.0.1:5000/stackforge")
        first, _, rest = text.partition("/")
        if rest and ("." in first or ":" in first or first == "localhost"):
            host, path = first, rest
        else:
            host, path = DOCKER_HUB, text
        return cls(host=_normal_host(host), path=_normal_path(host, path, ref))

    def __str__(self) -> str:
        return f"{self.host}/{self.path}"

    def tagged(self, tag: str) -> str:
        """``<host>/<path>:<tag>`` after checking the tag against Docker's grammar."""
        return f"{self}:{validate_tag(tag)}"

    def at(self, digest: str) -> str:
        """``<host>/<path>@sha256:...``: the immutable reference records keep."""
        return f"{self}@{validate_digest(digest)}"

    @property
    def loopback(self) -> bool:
        """True for ``localhost`` / ``127.0.0.0/8`` / ``::1`` registries (plain HTTP allowed by default)."""
        return is_loopback_host(self.host)


def _normal_host(host: str) -> str:
    if not _HOST.fullmatch(host):
        raise UnsafeValueError(f"registry host {host!r} is not a valid host[:port]")
    # Docker Hub has several spellings; records should carry one.
    return DOCKER_HUB if host in ("index.docker.io", "registry-1.docker.io") else host


def _normal_path(host: str, path: str, ref: str) -> str:
    components = path.split("/")
    if not all(_PATH_COMPONENT.fullmatch(c) for c in components):
        raise UnsafeValueError(
            f"registry repository {ref!r}: path {path!r} must be lower-case letters, digits and . _ - "
            f"separated by /", remedy="repository names are lower case (a tag goes into --tag, not here)")
    if _normal_host(host) == DOCKER_HUB and len(components) == 1:
        components.insert(0, "library")  # Docker Hub's official images: "ubuntu" is "library/ubuntu"
    return "/".join(components)


def validate_tag(tag: str) -> str:
    """Return ``tag`` if Docker accepts it as a tag (``[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}``), else raise."""
    if not isinstance(tag, str) or not _TAG.fullmatch(tag):
        raise UnsafeValueError(f"image tag {tag!r} is not a valid Docker tag "
                               "(letters, digits, _ . -; at most 128)")
    return tag


def validate_digest(digest: str) -> str:
    """Return ``digest`` if it is ``sha256:`` plus 64 lower-case hex digits, else raise."""
    if not isinstance(digest, str) or not DIGEST.fullmatch(digest):
        raise SpecError(f"{digest!r} is not an image digest (sha256:<64 hex digits>)")
    return digest


def split_digest_ref(ref: str) -> tuple[Repository, str]:
    """``host/path@sha256:...`` -> (repository, digest); a reference without a digest is a SpecError."""
    name, sep, digest = str(ref).partition("@")
    if not sep:
        raise SpecError(f"{ref!r} is not a digest reference (<registry>/<repo>@sha256:...)",
                        remedy="pull by digest, as recorded by a push; tags move, digests do not")
    return Repository.parse(name), validate_digest(digest)


def is_loopback_host(host: str) -> bool:
    """True when ``host`` (optionally with ``:port``) is ``localhost`` or a loopback IP address."""
    name = host[1:].partition("]")[0] if host.startswith("[") else host.partition(":")[0]
    if name == "localhost":
        return True
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        return False


# --------------------------------------------------------------------------------------- engine side


@dataclass(frozen=True, slots=True)
class PushedImage:
    """An image the registry now holds.

    Attributes:
        image_id: the local image id (config digest) that was pushed.
        tagged: the tag it was pushed under, ``<repo>:<tag>``.
        ref: the immutable reference, ``<repo>@sha256:...`` (what records and probe machines use).
        digest: the manifest digest alone.
        duration_s: wall-clock seconds of the push.
    """

    image_id: str
    tagged: str
    ref: str
    digest: str
    duration_s: float


@dataclass(frozen=True, slots=True)
class PulledImage:
    """An image pulled by digest: the reference asked for and the local image id it produced."""

    ref: str
    image_id: str
    duration_s: float


def push(image: str, repository: Repository, tag: str, *, timeout: float = TRANSFER_TIMEOUT_S,
         log_path: Path | None = None, redact: Sequence[str] = ()) -> PushedImage:
    """Tag a local image as ``<repository>:<tag>``, push it, and return the digest the registry stored.

    The digest comes from the push's own report and is checked against the engine's RepoDigests.
    ``redact``: secrets (proxy credentials) kept out of the log and the error.

    Raises:
        DockerUnavailableError: no engine answers.
        CommandError: the image does not exist, or the registry refused or could not be reached
            (the message says which and what to do).
    """
    image_id = local_image_id(image)
    tagged = repository.tagged(tag)
    _docker(["tag", image_id, tagged], timeout=QUERY_TIMEOUT_S, what=f"tag {image} as {tagged}")
    result = _docker(["push", tagged], timeout=timeout, log_path=log_path, what=f"push {tagged}",
                     registry=repository.host, redact=redact)
    digest = _digest_from_push(result.output_tail, tag) or _only_repo_digest(image_id, repository)
    ref = repository.at(digest)
    if ref not in repo_digests(image_id):
        raise CommandError(f"pushed {tagged}, but the engine does not list {ref} for it",
                           argv=result.argv, output_tail=result.output_tail)
    return PushedImage(image_id=image_id, tagged=tagged, ref=ref, digest=digest, duration_s=result.duration_s)


def pull(ref: str, *, timeout: float = TRANSFER_TIMEOUT_S, log_path: Path | None = None) -> PulledImage:
    """Pull ``<repo>@sha256:...`` (only by digest: a tag could have moved since the build).

    Raises:
        SpecError: ``ref`` has no digest.
        DockerUnavailableError, CommandError: as in :func:`push`.
    """
    repository, digest = split_digest_ref(ref)
    canonical = repository.at(digest)
    result = _docker(["pull", canonical], timeout=timeout, log_path=log_path, what=f"pull {canonical}",
                     registry=repository.host)
    return PulledImage(ref=canonical, image_id=local_image_id(canonical), duration_s=result.duration_s)


def local_image_id(image: str) -> str:
    """The id (``sha256:...``) of a local image given by tag, digest reference or id."""
    result = _docker(["image", "inspect", "--format", "{{.Id}}", image], timeout=QUERY_TIMEOUT_S,
                     what=f"find image {image}")
    image_id = result.output_tail.strip().splitlines()[-1].strip() if result.output_tail.strip() else ""
    if not DIGEST.fullmatch(image_id):
        raise CommandError(f"docker image inspect {image} did not print an image id", argv=result.argv,
                           output_tail=result.output_tail)
    return image_id


def repo_digests(image: str) -> tuple[str, ...]:
    """The ``<repo>@sha256:...`` references the engine knows for a local image, normalised."""
    result = _docker(["image", "inspect", "--format", "{{json .RepoDigests}}", image],
                     timeout=QUERY_TIMEOUT_S, what=f"read the repo digests of {image}")
    entries = _json_in(result.output_tail, what=f"RepoDigests of {image}") or []
    normalised = []
    for entry in entries:
        name, _, digest = entry.partition("@")
        normalised.append(Repository.parse(name).at(digest))
    return tuple(normalised)


# ------------------------------------------------------------------------------------------ internals


def _docker(args: list[str], *, timeout: float, what: str, log_path: Path | None = None, registry: str = "",
            tail_chars: int = 64_000, redact: Sequence[str] = ()) -> runner.CommandResult:
    """Run ``docker <args>``; turn failures into errors that say what to do."""
    result = runner.run(["docker", *args], timeout=timeout, log_path=log_path, tail_chars=tail_chars, redact=redact)
    if result.succeeded:
        return result
    _raise_if_engine_down(result)
    raise CommandError(f"could not {what}: docker {result.describe()}: {_last_line(result.output_tail)}",
                       argv=result.argv, returncode=result.returncode, output_tail=result.output_tail,
                       remedy=_remedy(result.output_tail, registry))


def _raise_if_engine_down(result: runner.CommandResult) -> None:
    if any(marker in result.output_tail for marker in _ENGINE_DOWN):
        raise DockerUnavailableError(f"no Docker engine answers: {_last_line(result.output_tail)}",
                                     remedy="start one, or point DOCKER_HOST at a remote engine")


def _remedy(output: str, registry: str) -> str:
    """A hint for the registry failures people actually meet."""
    lowered = output.lower()
    if "unauthorized" in lowered or "denied" in lowered or "authentication required" in lowered:
        return f"log in first: docker login {registry}" if registry else "log in to the registry first"
    if "server gave http response to https client" in lowered:
        return (f"{registry} speaks plain HTTP: add it to dockerd's insecure-registries "
                "(127.0.0.0/8 is allowed by default)")
    if "connection refused" in lowered or "no such host" in lowered or "i/o timeout" in lowered:
        return f"is the registry {registry} running and reachable from the engine?"
    if "manifest unknown" in lowered or "not found" in lowered or "no such manifest" in lowered:
        return "the registry has no such image; push it first, or check the digest in the record"
    return ""


def _digest_from_push(output: str, tag: str) -> str | None:
    for match in _PUSH_DIGEST_LINE.finditer(output):
        if match.group("tag") == tag:
            return match.group("digest")
    return None


def _only_repo_digest(image_id: str, repository: Repository) -> str:
    """Fallback when the push output format changed: the one digest the engine lists for the repository."""
    matches = [ref for ref in repo_digests(image_id) if split_digest_ref(ref)[0] == repository]
    if len(matches) != 1:
        raise CommandError(f"cannot tell which digest the push of {image_id} to {repository} produced "
                           f"(engine lists {len(matches)})")
    return split_digest_ref(matches[0])[1]


def _json_in(output: str, *, what: str) -> Any:
    """The JSON document in a command's output (warnings on stderr may precede it)."""
    lines = output.splitlines()
    for index, line in enumerate(lines):
        if line.lstrip().startswith(("{", "[", "null")):
            try:
                return json.loads("\n".join(lines[index:]))
            except json.JSONDecodeError:
                continue
    raise CommandError(f"{what}: no JSON in the output", output_tail=output[-2000:])


def _last_line(text: str) -> str:
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    return lines[-1][:300] if lines else "(no output)"
