"""``probe --image REF``: an image stackforge did not build, read as the stack it IS.

A reference is parsed here (a bad one is refused before the engine is asked, exit 2), found on the engine or
pulled (by digest when the reference has one; a tag is pulled and pinned to the digest the registry gave), and
its facts are read in ONE container run (``stackforge/inimage/_sfimage.py``: Python, torch and its CUDA,
FlashInfer and its add-ons, the kernel package, SGLang, nvcc, the CUDA libraries, OS and glibc). From them
and the image's identity comes an :class:`ImageStack`: ``image-<name>-<id12>``, the same image the same id on
every machine (the id is the engine's content-addressed image id), never a matrix stack's id (those start
with ``cu``), marked ``external`` with its ``image`` (``name@sha256:...``) in every record. An image the
probes cannot run in (another platform, no Python, no torch) keeps its facts and says why
(:attr:`ImageStack.why_not`): the campaign records every probe of it as a ``skip`` with that reason.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from stackforge.core.errors import CommandError, HostError, SpecError
from stackforge.edges import runner
from stackforge.edges.registry import DIGEST, Repository, validate_tag
from stackforge.inimage import CONTAINER_DIR as INIMAGE_CONTAINER_DIR
from stackforge.inimage import HOST_DIR as INIMAGE_HOST_DIR
from stackforge.inimage._sfimage import MARKER, SHELL_READER

__all__ = ["IMAGE_PREFIX", "FoundImage", "ImageFacts", "ImageName", "ImageStack", "find_image", "parse_image_ref",
           "read_image_facts", "read_image_refs"]

IMAGE_PREFIX = "image-"
#: Seconds the one facts run may take (it imports nothing heavy; nvcc --version is the slowest part).
FACTS_TIMEOUT_S = 120.0
#: Seconds a pull may take (a serving image is 7-20 GB).
PULL_TIMEOUT_S = 3600.0
#: What a pull that never reached its registry prints (dockerd's words).
_UNREACHABLE = re.compile(r"connection refused|no such host|i/o timeout|dial tcp|TLS handshake timeout|"
                          r"context deadline exceeded|network is unreachable|server misbehaving", re.IGNORECASE)
_UNSAFE = re.compile(r"[^a-z0-9.-]+")
_KERNELS = ("sglang-kernel", "sgl-kernel")


# ---------------------------------------------------------------------------------------------- references


@dataclass(frozen=True, slots=True)
class ImageName:
    """A reference as given (``text``) and its parts: repository, tag, digest (a bare image id has none)."""

    text: str
    repository: Repository | None
    tag: str | None = None
    digest: str | None = None

    @property
    def short(self) -> str:
        """The repository's last component (``sglang``), for the stack id; ``id`` for a bare image id."""
        return self.repository.path.rsplit("/", 1)[-1] if self.repository else "id"


def parse_image_ref(text: str) -> ImageName:
    """``[host[:port]/]path[:tag][@sha256:...]``, or a bare ``sha256:<64 hex>`` image id.

    Raises:
        SpecError: the reference does not parse (exit 2), with what is wrong.
    """
    given = str(text).strip()
    if DIGEST.fullmatch(given):
        return ImageName(text=given, repository=None, digest=None)
    name, at, digest = given.partition("@")
    if at and not DIGEST.fullmatch(digest):
        raise SpecError(f"image reference {given!r}: {digest!r} is not a digest (sha256:<64 hex digits>)",
                        remedy="give REPO[:TAG] or REPO@sha256:<digest>")
    head, _, last = name.rpartition("/")
    tag = None
    if ":" in last:
        last, _, tag = last.partition(":")
        validate_tag(tag)
    try:
        repository = Repository.parse(f"{head}/{last}" if head else last)
    except SpecError as exc:
        raise SpecError(f"image reference {given!r} does not parse: {exc.message}",
                        remedy="give REPO[:TAG] or REPO@sha256:<digest>, e.g. lmsysorg/sglang:latest") from None
    return ImageName(text=given, repository=repository, tag=tag, digest=digest or None)


def read_image_refs(refs: Sequence[str], files: Sequence[Any] = ()) -> tuple[ImageName, ...]:
    """The references of ``--image`` and of each ``--images-file`` (one a line, ``#`` comments), parsed, in order.

    Raises:
        SpecError: a reference that does not parse, naming the file and line it came from.
    """
    parsed = [parse_image_ref(ref) for ref in refs]
    for path in files:
        try:
            lines = open(path, encoding="utf-8").read().splitlines()
        except OSError as exc:
            raise SpecError(f"cannot read --images-file {path}: {exc.strerror or exc}") from None
        for number, line in enumerate(lines, start=1):
            text = line.split("#", 1)[0].strip()
            if not text:
                continue
            try:
                parsed.append(parse_image_ref(text))
            except SpecError as exc:
                raise SpecError(f"{path}:{number}: {exc.one_line()}") from None
    if not parsed:
        raise SpecError("--images-file holds no image reference", remedy="one REPO[:TAG][@sha256:...] a line")
    return tuple(parsed)


# ---------------------------------------------------------------------------------------------- the engine


@dataclass(frozen=True, slots=True)
class FoundImage:
    """An image on the engine: its id (content-addressed, the same on every machine), the ``name@sha256``
    a registry knows it by (None for an image only built here), its platform, the references that named it."""

    name: ImageName
    image_id: str
    repo_digest: str | None
    platform: str
    refs: tuple[str, ...] = ()

    @property
    def subject(self) -> str:
        """``name@sha256:...`` when a registry knows it, else the reference given (an image only built here has
        no registry digest; its content id is :attr:`image_id`, never dressed up as one)."""
        return self.repo_digest or self.name.text


def find_image(client: Any, name: ImageName, *, pull_timeout_s: float = PULL_TIMEOUT_S) -> FoundImage:
    """The local image ``name`` names, else pulled (by digest when the reference has one).

    Raises:
        HostError: the registry does not answer (exit 3), naming it.
        CommandError: the registry answered and refused (no such image, not logged in), in docker's words.
        SpecError: a bare image id that is not on this engine.
    """
    attrs = _local_attrs(client, name.text)
    if attrs is None:
        if name.repository is None:
            raise SpecError(f"image {name.text} is not on this engine, and an image id cannot be pulled",
                            remedy="give REPO@sha256:<digest> to pull it")
        _pull(name, pull_timeout_s)
        attrs = _local_attrs(client, name.text)
        if attrs is None:
            raise CommandError(f"docker pull {name.text} ended, but the engine does not list the image")
    return FoundImage(name=name, image_id=str(attrs["Id"]), repo_digest=_repo_digest(name, attrs),
                      platform=image_platform(attrs), refs=(name.text,))


def image_platform(attrs: Mapping[str, Any]) -> str:
    """``linux/amd64`` (``linux/arm64/v8`` with a variant) from the image's inspect data."""
    parts = [str(attrs.get("Os") or "?"), str(attrs.get("Architecture") or "?")]
    return "/".join(parts + ([str(attrs["Variant"])] if attrs.get("Variant") else []))


def engine_platform(client: Any) -> str:
    """The platform the engine runs containers for natively (``linux/amd64``)."""
    info = client.info()
    arch = {"x86_64": "amd64", "aarch64": "arm64"}.get(str(info.get("Architecture")), str(info.get("Architecture")))
    return f"{str(info.get('OSType') or 'linux')}/{arch}"


def _local_attrs(client: Any, ref: str) -> dict[str, Any] | None:
    import docker.errors
    try:
        return dict(client.images.get(ref).attrs)
    except docker.errors.ImageNotFound:
        return None
    except docker.errors.APIError as exc:   # e.g. "invalid reference format": the engine's own refusal
        if getattr(exc, "status_code", None) == 400:
            raise SpecError(f"image reference {ref!r}: the engine refuses it ({exc.explanation})") from None
        raise


def _repo_digest(name: ImageName, attrs: Mapping[str, Any]) -> str | None:
    """The ``name@sha256`` of the reference's own repository when the engine lists one, else the first."""
    entries = [str(e) for e in attrs.get("RepoDigests") or []]
    if name.digest and name.repository is not None:
        return name.repository.at(name.digest)
    mine = [e for e in entries if name.repository is not None and _same_repo(e, name.repository)]
    return (mine or entries or [None])[0]


def _same_repo(entry: str, repository: Repository) -> bool:
    try:
        return Repository.parse(entry.partition("@")[0]) == repository
    except SpecError:
        return False


def _pull(name: ImageName, timeout_s: float) -> None:
    """``docker pull`` (through the one runner); a registry that does not answer is the host's, exit 3."""
    assert name.repository is not None
    ref = name.repository.at(name.digest) if name.digest else name.text
    result = runner.run(["docker", "pull", ref], timeout=timeout_s, tail_chars=8000)
    if result.succeeded:
        return
    tail = " ".join(result.output_tail.split())[-300:]
    if _UNREACHABLE.search(result.output_tail) or result.timed_out:
        raise HostError(f"registry {name.repository.host} does not answer: docker pull {ref} {result.describe()}: "
                        f"{tail}", remedy=f"is {name.repository.host} up and reachable from the Docker engine?")
    raise CommandError(f"cannot pull {ref}: docker {result.describe()}: {tail}", argv=result.argv,
                       returncode=result.returncode, output_tail=result.output_tail,
                       remedy="check the reference (docker pull it by hand), or docker login to its registry")


# ---------------------------------------------------------------------------------------------- facts


@dataclass(frozen=True, slots=True)
class ImageFacts:
    """What one run inside the image read (:mod:`stackforge.inimage._sfimage`), or why nothing could be read.

    ``unreadable``: the image could not run the reader (another platform, no shell); ``python`` None: no Python.
    """

    python: str | None = None
    versions: Mapping[str, str] = field(default_factory=dict)
    torch_cuda: str | None = None
    nvcc: str | None = None
    nvcc_line: str = ""
    cuda_libraries: Mapping[str, str] = field(default_factory=dict)
    libcudart: tuple[str, ...] = ()
    os: str = ""
    glibc: str | None = None
    machine: str = ""
    unreadable: str | None = None

    @property
    def kernel(self) -> tuple[str, str] | None:
        """(``sgl-kernel`` / ``sglang-kernel``, version) when one is installed."""
        return next(((name, self.versions[name]) for name in _KERNELS if name in self.versions), None)

    def to_json(self) -> dict[str, Any]:
        return {"python": self.python, "versions": dict(self.versions), "torch_cuda": self.torch_cuda,
                "nvcc": self.nvcc, "nvcc_line": self.nvcc_line, "cuda_libraries": dict(self.cuda_libraries),
                "libcudart": list(self.libcudart), "os": self.os, "glibc": self.glibc, "machine": self.machine,
                "unreadable": self.unreadable}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> ImageFacts:
        """From the reader's JSON (``STACKFORGE_IMAGE`` line) or :meth:`to_json`."""
        os_field = data.get("os")
        os_text = (os_field.get("PRETTY_NAME") or f"{os_field.get('ID', '')} {os_field.get('VERSION_ID', '')}".strip()
                   if isinstance(os_field, Mapping) else str(os_field or ""))
        return cls(python=_optional(data.get("python")),
                   versions={str(k): str(v) for k, v in (data.get("versions") or {}).items()},
                   torch_cuda=_optional(data.get("torch_cuda")), nvcc=_optional(data.get("nvcc")),
                   nvcc_line=str(data.get("nvcc_line") or ""),
                   cuda_libraries={str(k): str(v) for k, v in (data.get("cuda_libraries") or {}).items()},
                   libcudart=tuple(str(x) for x in data.get("libcudart") or ()), os=os_text,
                   glibc=_optional(data.get("glibc")), machine=str(data.get("machine") or ""),
                   unreadable=_optional(data.get("unreadable")))


def parse_reader_output(output: str) -> ImageFacts | None:
    """The facts in the reader's output: its JSON line, or the shell's lines when the image has no Python."""
    lines = output.splitlines()
    found = [line for line in lines if line.startswith(MARKER)]
    if found:
        return ImageFacts.from_json(json.loads(found[-1][len(MARKER):]))
    if "STACKFORGE_NO_PYTHON" not in lines:
        return None
    osrel = dict(line[len("OSREL "):].partition("=")[::2] for line in lines if line.startswith("OSREL "))
    osrel = {k: v.strip().strip('"') for k, v in osrel.items()}
    libc = next((line[len("LIBC "):] for line in lines if line.startswith("LIBC ")), "")
    glibc = re.search(r"(\d+\.\d+)\s*$", libc) if re.search(r"glibc|gnu libc|GLIBC", libc, re.IGNORECASE) else None
    machine = next((line[len("MACHINE "):].strip() for line in lines if line.startswith("MACHINE ")), "")
    return ImageFacts(python=None, os=osrel.get("PRETTY_NAME", ""), glibc=glibc.group(1) if glibc else None,
                      machine=machine)


def read_image_facts(client: Any, found: FoundImage, *, native: str, run_id: str = "") -> ImageFacts:
    """The facts of ``found``, read in one container run; an image for another platform than ``native``
    (the engine's) is not run at all: its facts say so."""
    from stackforge.edges import docker_engine

    if found.platform.split("/")[:2] != native.split("/")[:2]:
        return ImageFacts(unreadable=f"the image is for {found.platform}, this engine runs {native}: not run here")
    labels = {docker_engine.RUN_LABEL: run_id} if run_id else {}
    try:
        ended = _run_reader(client, found, labels)
    except CommandError as exc:   # the engine could not start it (no /bin/sh): the image's fact, not ours
        return ImageFacts(unreadable=f"the facts reader does not start in the image: {exc.message[:300]}")
    facts = parse_reader_output(ended.logs_tail)
    if facts is None:
        tail = " ".join(ended.logs_tail.split())[-300:]
        return ImageFacts(unreadable=f"the facts reader {ended.describe()} in the image{': ' + tail if tail else ''}")
    return facts


def _run_reader(client: Any, found: FoundImage, labels: Mapping[str, str]) -> Any:
    """The one container run of the facts reader (no network: it reads files)."""
    from stackforge.edges import docker_engine

    return docker_engine.run_container(
        client, found.image_id, ["/bin/sh", "-c", SHELL_READER, "sh", f"{INIMAGE_CONTAINER_DIR}/_sfimage.py"],
        timeout=FACTS_TIMEOUT_S, mounts=[docker_engine.Bind(INIMAGE_HOST_DIR, INIMAGE_CONTAINER_DIR,
                                                            copy_to_remote=True)],
        env={"PYTHONPATH": INIMAGE_CONTAINER_DIR, "PYTHONDONTWRITEBYTECODE": "1"}, labels=labels,
        network_mode="none", tail_chars=64_000)


# ---------------------------------------------------------------------------------------------- the stack


@dataclass(frozen=True, slots=True)
class ImageStack:
    """An image from elsewhere, as its facts make it a stack: stands where a matrix
    :class:`~stackforge.core.model.Stack` stands in a job (``id``, ``to_json``).

    The axes a report shows: ``cuda`` is the image's nvcc release when it has one, else the CUDA its torch
    was built for (the family ``--from-cuda`` / ``--to-cuda`` compare it in).
    """

    image: FoundImage
    facts: ImageFacts

    @property
    def id(self) -> str:
        """``image-sglang-1a2b3c4d5e6f``: the repository's last component and the image id's first 12 digits."""
        name = _UNSAFE.sub("_", self.image.name.short.lower())[:40].strip("_-") or "image"
        return f"{IMAGE_PREFIX}{name}-{self.image.image_id.split(':')[-1][:12]}"

    @property
    def cuda(self) -> str:
        return self.facts.nvcc or self.facts.torch_cuda or ""

    @property
    def python(self) -> str:
        return ".".join((self.facts.python or "").split(".")[:2])

    @property
    def torch(self) -> str | None:
        return self.facts.versions.get("torch")

    @property
    def flashinfer(self) -> str | None:
        return self.facts.versions.get("flashinfer-python")

    @property
    def sglang(self) -> str | None:
        return self.facts.versions.get("sglang")

    @property
    def kernel(self) -> str | None:
        kernel = self.facts.kernel
        return kernel[1] if kernel else None

    @property
    def why_not(self) -> str | None:
        """Why the image's probes cannot run (every probe is a ``skip`` with it), None when they can."""
        if self.facts.unreadable:
            return self.facts.unreadable
        if self.facts.python is None:
            return "the image has no Python (no python3 or python on its PATH)"
        if self.torch is None:
            return f"the image has no torch (its Python {self.facts.python} has no torch distribution installed)"
        return None

    def derived(self) -> dict[str, Any]:
        """What a plan would derive for a matrix stack, as read in the image (the wheel tier's read context)."""
        kernel = self.facts.kernel
        return {"has_nvcc": self.facts.nvcc is not None, "torch_cuda": self.facts.torch_cuda,
                "kernel_package": kernel[0] if kernel else None, "kernel_version": kernel[1] if kernel else None}

    def to_json(self) -> dict[str, Any]:
        """The ``stack`` of its records: ``external``, the ``image`` (``name@sha256:...``), the axes a report
        shows, ``derived`` (what the wheel tier's readings depend on) and every fact read."""
        addons = [name.split("-", 1)[1] for name in ("flashinfer-cubin", "flashinfer-jit-cache")
                  if name in self.facts.versions]
        return {"external": True, "image": self.image.subject, "image_id": self.image.image_id,
                "platform": self.image.platform, "refs": list(self.image.refs), "cuda": self.cuda,
                "python": self.python, "torch": self.torch or "", "flashinfer": self.flashinfer or "",
                "sglang": self.sglang or "", "kernel": self.kernel, "flashinfer_addons": addons,
                "flavour": "external", "os": self.facts.os, "derived": self.derived(), "facts": self.facts.to_json()}


def matches_image(stack: Mapping[str, Any], ref: str) -> bool:
    """Whether a record's ``stack`` is the external image ``ref`` names: its ``name@sha256``, its digest or
    image id (full or the 12 digits of its id), or a reference it was probed under."""
    if not stack.get("external"):
        return False
    text = ref.strip()
    image, image_id = str(stack.get("image") or ""), str(stack.get("image_id") or "")
    digests = {image.partition("@")[2], image_id}
    if text in (image, *(stack.get("refs") or ())) or text in digests:
        return True
    digest = text.partition("@")[2]
    if digest and digest in digests:
        return True
    bare = text.split(":")[-1]
    return len(bare) >= 12 and bool(re.fullmatch(r"[0-9a-f]+", bare)) and image_id.split(":")[-1].startswith(bare)


def _optional(value: Any) -> str | None:
    return str(value) if value not in (None, "") else None
