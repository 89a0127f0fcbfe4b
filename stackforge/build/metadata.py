"""The final, metadata-only build step: labels known only once the image exists.

The Dockerfile's own LABEL block carries every pin and choice (and feeds the content hash). Added here,
FROM the built image, without running anything: the content hash itself, the resolved package set
(``pip freeze --all`` as a JSON list, read from ``/opt/stackforge/freeze.txt`` in the image), the base
image's id and digest, the stackforge version, and the ``org.opencontainers.image.*`` labels that name
this build (created, revision, source, description; title and version are static, in the Dockerfile).
A LABEL-only step adds no layer, and with unchanged inputs it is a cache hit, so a no-op rebuild keeps
the same image id. ``created`` lives here, never in the Dockerfile text, so it cannot enter the content
hash or the tag.

Build provenance (an in-toto SLSA attestation) needs a builder that can keep one beside the image: BuildKit
with an ``oci`` or ``registry`` output. stackforge loads every image into the engine's image store
(``buildx --load``, or the classic builder), which keeps no attestation, so the build record says so in
its ``provenance`` field (:func:`provenance_note`) instead of claiming one.
"""

from __future__ import annotations

import io
import json
from collections.abc import Sequence
from pathlib import Path

import docker
import docker.errors

from stackforge import __version__
from stackforge.build.records import BaseImage
from stackforge.compose.dockerfile import LABEL_PREFIX, Composed
from stackforge.core.errors import BuildError
from stackforge.edges import docker_engine, runner

FREEZE_PATH = "/opt/stackforge/freeze.txt"
CONTENT_HASH_LABEL = f"{LABEL_PREFIX}.content-hash"
FREEZE_LABEL = f"{LABEL_PREFIX}.freeze"
_FREEZE_LIMIT = 4_000_000
OCI = "org.opencontainers.image"
#: Where the source that builds these images lives: the project's own namespace (its schemas' ids use it).
SOURCE_URL = "https://stackforge.dev"


def read_freeze(client: docker.DockerClient, image_id: str, *, labels: Sequence[tuple[str, str]],
                log_path: Path, timeout: float = 120.0) -> list[str]:
    """The image's resolved package set, one ``name==version`` line each (from a short container)."""
    run = docker_engine.run_container(client, image_id, ["cat", FREEZE_PATH], timeout=timeout,
                                      labels=dict(labels), tail_chars=_FREEZE_LIMIT, init=False,
                                      log_path=None)
    if not run.succeeded:
        with runner.open_log(log_path) as log:
            runner.write_log(log, f"[stackforge] cat {FREEZE_PATH}: {run.describe()}\n{run.logs_tail}\n")
        raise BuildError(f"cannot read {FREEZE_PATH} from the image: container {run.describe()}: "
                         f"{run.logs_tail.strip()[-300:]}")
    return [line.strip() for line in run.logs_tail.splitlines() if line.strip()]


def dynamic_labels(composed: Composed, base: BaseImage, freeze: Sequence[str], body_created: str,
                   extra: Sequence[tuple[str, str]]) -> dict[str, str]:
    """Labels added after the build (pure)."""
    labels = {
        CONTENT_HASH_LABEL: composed.content_hash,
        FREEZE_LABEL: json.dumps(list(freeze), separators=(",", ":")),
        f"{LABEL_PREFIX}.version": __version__,
        f"{LABEL_PREFIX}.base.id": base.image_id or "unknown",
        f"{LABEL_PREFIX}.base.digest": base.digest or "none",
        f"{LABEL_PREFIX}.base.how": base.how,
        f"{OCI}.created": body_created,
        # The exact inputs the image was built from (Dockerfile and context): stackforge's revision of it.
        f"{OCI}.revision": composed.content_hash,
        f"{OCI}.source": SOURCE_URL,
        f"{OCI}.description": _description(composed),
    }
    if base.digest:
        labels["org.opencontainers.image.base.digest"] = base.digest.rsplit("@", 1)[-1]
    labels.update(dict(extra))
    return labels


def provenance_note(builder: str) -> str:
    """What the build record says about a build provenance attestation for ``builder`` (buildkit | classic)."""
    if builder == "buildkit":
        return ("not kept: the image is loaded into the engine's image store (buildx --load), which keeps no "
                "attestation; BuildKit keeps one (--provenance) only with an oci or registry output")
    return "not kept: the classic builder makes no provenance attestation (BuildKit with an oci or registry output does)"


def _description(composed: Composed) -> str:
    labels = dict(composed.labels)
    parts = [(name, labels.get(f"{LABEL_PREFIX}.{key}")) for name, key in
             (("CUDA", "cuda"), ("torch", "torch"), ("FlashInfer", "flashinfer"), ("SGLang", "sglang"),
              ("Python", "python"))]
    versions = ", ".join(f"{name} {value}" for name, value in parts if value)
    flavour = labels.get(f"{LABEL_PREFIX}.flavour")
    return f"stackforge stack {composed.stack_id}: {versions}" + (f" ({flavour})" if flavour else "")


def add_labels(client: docker.DockerClient, body_id: str, tag: str, labels: dict[str, str], *,
               log_path: Path, timeout: float = 300.0) -> str:
    """Build ``FROM <body_id>`` with ``labels`` (classic builder: no RUN, nothing to mount); return its id."""
    dockerfile = io.BytesIO(f"FROM {body_id}\n".encode())
    image_id: str | None = None
    with runner.open_log(log_path) as log:
        runner.write_log(log, f"[stackforge] metadata step: FROM {body_id} + {len(labels)} labels -> {tag}\n")
        try:
            for chunk in client.api.build(fileobj=dockerfile, tag=tag, labels=labels, rm=True, forcerm=True,
                                          pull=False, network_mode="host", decode=True, timeout=int(timeout)):
                if "error" in chunk:
                    raise BuildError(f"metadata step failed: {chunk['error']}")
                if isinstance(chunk.get("aux"), dict) and "ID" in chunk["aux"]:
                    image_id = str(chunk["aux"]["ID"])
        except docker.errors.APIError as exc:
            raise BuildError(f"metadata step failed: {exc.explanation or exc}") from None
    if image_id is None:
        raise BuildError("metadata step reported no image id")
    return image_id
