"""The final, metadata-only build step: labels known only once the image exists.

The Dockerfile's own LABEL block carries every pin and choice (and feeds the content hash). Added here,
FROM the built image, without running anything: the content hash itself, the resolved package set
(``pip freeze --all`` as a JSON list, read from ``/opt/stackforge/freeze.txt`` in the image), the base
image's id and digest, the stackforge version, and the image's creation time. A LABEL-only step adds
no layer, and with unchanged inputs it is a cache hit, so a no-op rebuild keeps the same image id.
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
        "org.opencontainers.image.created": body_created,
    }
    if base.digest:
        labels["org.opencontainers.image.base.digest"] = base.digest.rsplit("@", 1)[-1]
    labels.update(dict(extra))
    return labels


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
