"""Find the base image a stack builds FROM: local, pulled, overridden, or honestly substituted.

Order: ``--base-image`` wins. Otherwise the derived base is used when the engine has it; else stackforge
tries ``docker pull`` with a short timeout. When no registry answers and the stack is the ``wheels``
flavour on Debian 12 with Python 3.11, the registry-free ``stackforge/debian:bookworm`` (debootstrap,
same Debian release, same Python) stands in, and the build record and labels say so: requested
``python:3.11-slim-bookworm``, used ``stackforge/debian:bookworm``.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from pathlib import Path

import docker
import docker.errors

from stackforge.build.classify import last_error_line
from stackforge.build.options import BuildOptions
from stackforge.build.records import BaseImage
from stackforge.core.errors import BuildError
from stackforge.core.model import Flavour, Stack
from stackforge.edges import bootstrap, runner
from stackforge.plan.derive import Derived

#: (os, python) -> a registry-free image with the same OS release and the same Python.
SUBSTITUTES: dict[tuple[str, str], str] = {("debian12", "3.11"): bootstrap.DEFAULT_REF}


@dataclass
class BaseResolver:
    """Resolves base images for one build run; each reference is looked up (and pulled) once.

    Thread-safe: parallel builds of stacks with the same base wait for one pull.
    """

    client: docker.DockerClient
    options: BuildOptions
    _cache: dict[str, BaseImage | BuildError] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def resolve(self, stack: Stack, derived: Derived, log_path: Path) -> BaseImage:
        """The base image for ``stack``; raises BuildError when there is none to be had."""
        requested = self.options.base_image or derived.base_image
        with self._lock:
            if requested not in self._cache:
                self._cache[requested] = self._find(requested, log_path)
            found = self._cache[requested]
        if isinstance(found, BaseImage):
            return found
        substitute = self._substitute(stack, requested)
        if substitute is None:
            raise found
        return substitute

    def _find(self, ref: str, log_path: Path) -> BaseImage | BuildError:
        how = "override" if self.options.base_image else "local"
        local = _inspect(self.client, ref)
        if local is not None:
            return BaseImage(requested=ref, used=ref, how=how, image_id=local[0], digest=local[1])
        pulled = runner.run(["docker", "pull", ref], timeout=self.options.pull_timeout_s, log_path=log_path)
        if pulled.succeeded:
            found = _inspect(self.client, ref)
            if found is not None:
                return BaseImage(requested=ref, used=ref, how="pulled", image_id=found[0], digest=found[1])
        why = last_error_line(pulled.output_tail) or pulled.describe()
        return BuildError(f"base image {ref} is not on this engine and `docker pull` failed: {why}",
                          remedy="pull or load it, or pass --base-image REF")

    def _substitute(self, stack: Stack, requested: str) -> BaseImage | None:
        """The honest stand-in for an unreachable base, or None when there is none."""
        if self.options.base_image or stack.flavour is not Flavour.WHEELS:
            return None
        ref = SUBSTITUTES.get((stack.os, stack.python))
        found = _inspect(self.client, ref) if ref else None
        if ref is None or found is None:
            return None
        note = (f"{requested} could not be pulled (no registry answered); used {ref} instead: the same "
                f"Debian release and Python {stack.python}, built with debootstrap")
        return BaseImage(requested=requested, used=ref, how="substituted", image_id=found[0], digest=found[1],
                         note=note)


def _inspect(client: docker.DockerClient, ref: str) -> tuple[str, str | None] | None:
    """(image id, first repo digest or None) of a local image, or None when the engine lacks it."""
    try:
        image = client.images.get(ref)
    except docker.errors.ImageNotFound:
        return None
    except docker.errors.APIError:
        return None   # e.g. an invalid reference: treated like a missing image, pull says why
    digests = image.attrs.get("RepoDigests") or []
    return image.id, (digests[0] if digests else None)
