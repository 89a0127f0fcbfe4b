"""OCI artifacts that refer to an image: attach a document to ``repo@sha256:...`` and read it back.

The one edge between stackforge and a registry's artifact API, through ``oras`` (oras-py, the OCI
project's Python client): its client keeps the session, the token auth and the registry's URLs, and
uploads the blobs. An attached document is an OCI image manifest whose ``subject`` is the image's
manifest and whose single layer is the document:

* where the registry has the referrers API (OCI distribution 1.1: it answers a manifest push with
  ``OCI-Subject``, and serves ``/v2/<repo>/referrers/<digest>``), the registry links the two itself;
* otherwise (Debian's docker-registry, distribution 2.x) the referrers **tag schema**: an image index
  under the tag ``sha256-<hex of the image digest>`` lists every artifact that refers to the image,
  and stackforge adds the new one to it.

oras-py 0.2 has no call for the referrers endpoint, for an image index, or for a manifest PUT of exact
bytes (its ``upload_manifest`` re-serializes the JSON, so the digest would not be known beforehand):
those three go through its own request method (``Registry.do_request``: same session, same auth),
never a second HTTP client. Every byte read back is checked against the digest that named it.
"""

from __future__ import annotations

import hashlib
import json
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import oras.provider
import requests
import requests.adapters

from stackforge.core.errors import HostError, SpecError
from stackforge.edges.registry import DOCKER_HUB, Repository, split_digest_ref

OCI_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
OCI_INDEX = "application/vnd.oci.image.index.v1+json"
OCI_EMPTY = "application/vnd.oci.empty.v1+json"
_MANIFEST_TYPES = (OCI_MANIFEST, OCI_INDEX, "application/vnd.docker.distribution.manifest.v2+json",
                   "application/vnd.docker.distribution.manifest.list.v2+json")
_EMPTY_CONFIG = b"{}"
#: A document larger than this is no qualification record (and is not read into memory).
MAX_DOCUMENT_BYTES = 8_000_000
_TIMEOUT_S = 30
#: Where docker.io's registry API lives (docker.io itself serves no /v2/), as the Docker client maps it.
_DOCKER_HUB_API = "registry-1.docker.io"


@dataclass(frozen=True, slots=True)
class AttachedArtifact:
    """One artifact that refers to an image, as the registry serves it.

    Attributes:
        manifest_digest: the artifact manifest's digest.
        artifact_type: its ``artifactType``.
        annotations: the manifest's annotations.
        payload: the document (its first layer), or b"" when ``integrity`` names a problem reading it.
        integrity: "" when every byte matched the digest that named it, else what did not.
        found_by: ``referrers`` (the registry's API) or ``tag-schema`` (the ``sha256-<hex>`` index).
    """

    manifest_digest: str
    artifact_type: str
    annotations: dict[str, str] = field(default_factory=dict)
    payload: bytes = b""
    integrity: str = ""
    found_by: str = ""


@dataclass(frozen=True, slots=True)
class PushedArtifact:
    """An artifact the registry now holds: ``ref`` (``repo@sha256:...``) and how it refers to the image."""

    ref: str
    digest: str
    linked_by: str      # referrers | tag-schema


def push_artifact(image_ref: str, payload: bytes, *, artifact_type: str, media_type: str,
                  annotations: Mapping[str, str]) -> PushedArtifact:
    """Attach ``payload`` to the image ``image_ref`` (``repo@sha256:...``) as an artifact referring to it.

    Raises:
        SpecError: ``image_ref`` is not a digest reference, or the registry does not hold that image.
        HostError: the registry does not answer, or refuses a write (exit 3, naming it).
    """
    repo, image_digest = split_digest_ref(image_ref)
    client = _client(repo)
    subject = _subject_descriptor(client, repo, image_digest)
    container = client.get_container(f"{_api_host(repo)}/{repo.path}@{image_digest}")
    layer = {"mediaType": media_type, "digest": _digest(payload), "size": len(payload)}
    config = {"mediaType": OCI_EMPTY, "digest": _digest(_EMPTY_CONFIG), "size": len(_EMPTY_CONFIG)}
    for blob, descriptor in ((payload, layer), (_EMPTY_CONFIG, config)):
        _upload_blob(client, container, repo, blob, descriptor)
    manifest = {"schemaVersion": 2, "mediaType": OCI_MANIFEST, "artifactType": artifact_type, "config": config,
                "layers": [layer], "subject": subject, "annotations": dict(annotations)}
    body = json.dumps(manifest, sort_keys=True, separators=(",", ":")).encode()
    digest = _digest(body)
    response = _put_manifest(client, repo, digest, body, OCI_MANIFEST)
    linked_by = "referrers"
    if not response.headers.get("OCI-Subject"):
        # No referrers API: list the artifact in the tag schema's index for the image.
        _add_to_tag_index(client, repo, image_digest, {"mediaType": OCI_MANIFEST, "digest": digest,
                                                       "size": len(body), "artifactType": artifact_type,
                                                       "annotations": dict(annotations)})
        linked_by = "tag-schema"
    return PushedArtifact(ref=f"{repo}@{digest}", digest=digest, linked_by=linked_by)


def attached_artifacts(image_ref: str, *, artifact_type: str) -> tuple[AttachedArtifact, ...]:
    """The artifacts of ``artifact_type`` that refer to ``image_ref``, each read and checked against its digest.

    Raises:
        SpecError: ``image_ref`` is not a digest reference.
        HostError: the registry does not answer (exit 3, naming it).
    """
    repo, image_digest = split_digest_ref(image_ref)
    client = _client(repo)
    descriptors, found_by = _referrers(client, repo, image_digest)
    wanted = [d for d in descriptors if isinstance(d, dict) and d.get("artifactType") == artifact_type]
    return tuple(_read_artifact(client, repo, d, found_by) for d in wanted)


def tag_schema_tag(image_digest: str) -> str:
    """The referrers tag schema's tag for an image digest: ``sha256:abc...`` -> ``sha256-abc...``."""
    return image_digest.replace(":", "-", 1)


# ---------------------------------------------------------------------------------------------- internals


class _OneTryRegistry(oras.provider.Registry):
    # oras retries a failed request five times, sleeping up to 83 s: a registry that does not answer
    # must be one line (exit 3) in seconds, so each request is tried once.
    do_request = oras.provider.Registry.do_request.__wrapped__   # type: ignore[attr-defined]


class _TimeoutAdapter(requests.adapters.HTTPAdapter):
    # oras sets no timeout: a registry that accepts the connection and never answers would hang forever.
    def send(self, request, **kwargs):   # type: ignore[override]
        kwargs["timeout"] = kwargs.get("timeout") or _TIMEOUT_S
        return super().send(request, **kwargs)


def _client(repo: Repository) -> _OneTryRegistry:
    # Plain HTTP only for a loopback registry, as dockerd allows by default; TLS everywhere else.
    client = _OneTryRegistry(hostname=_api_host(repo), insecure=repo.loopback)
    for scheme in ("http://", "https://"):
        client.session.mount(scheme, _TimeoutAdapter())
    return client


def _request(client, repo: Repository, url: str, method: str = "GET", *, data: bytes | None = None,
             headers: dict[str, str] | None = None):
    try:
        return client.do_request(url, method, data=data, headers=dict(headers or {}))
    except requests.exceptions.RequestException as exc:
        raise HostError(f"registry {repo.host} does not answer: {type(exc).__name__}: {_first_line(exc)}",
                        remedy=f"check that {repo.host} is up and reachable from this host") from None
    except ValueError as exc:   # oras: "Cannot respond to request for authentication."
        raise HostError(f"registry {repo.host} refused {method} {url.split('/v2/', 1)[-1]}: {_first_line(exc)}",
                        remedy="log in (docker login) with a user that may read and write the repository") from None


def _api_host(repo: Repository) -> str:
    return _DOCKER_HUB_API if repo.host == DOCKER_HUB else repo.host


def _url(client, repo: Repository, tail: str) -> str:
    return f"{client.prefix}://{_api_host(repo)}/v2/{repo.path}/{tail}"


def _subject_descriptor(client, repo: Repository, image_digest: str) -> dict[str, Any]:
    response = _request(client, repo, _url(client, repo, f"manifests/{image_digest}"),
                        headers={"Accept": ", ".join(_MANIFEST_TYPES)})
    if response.status_code == 404:
        raise SpecError(f"registry {repo.host} holds no image {repo}@{image_digest}",
                        remedy="push the image first (stackforge build --push, or docker push); "
                               "an artifact refers to an image the registry has")
    _check(response, repo, "read the image manifest")
    body = response.content
    if _digest(body) != image_digest:
        raise HostError(f"registry {repo.host} served a manifest for {image_digest} whose sha256 is {_digest(body)}")
    media_type = response.headers.get("Content-Type", "").split(";")[0] or OCI_MANIFEST
    return {"mediaType": media_type, "digest": image_digest, "size": len(body)}


def _upload_blob(client, container, repo: Repository, blob: bytes, descriptor: dict[str, Any]) -> None:
    with tempfile.TemporaryDirectory(prefix="stackforge-oci-") as folder:
        path = Path(folder) / "blob"
        path.write_bytes(blob)
        try:
            response = client.upload_blob(str(path), container, descriptor)
        except requests.exceptions.RequestException as exc:
            raise HostError(f"registry {repo.host} does not answer: {type(exc).__name__}: {_first_line(exc)}",
                            remedy=f"check that {repo.host} is up and reachable from this host") from None
        except ValueError as exc:
            raise HostError(f"registry {repo.host} refused a blob upload: {_first_line(exc)}") from None
    _check(response, repo, "upload a blob")


def _put_manifest(client, repo: Repository, reference: str, body: bytes, media_type: str):
    response = _request(client, repo, _url(client, repo, f"manifests/{reference}"), "PUT", data=body,
                        headers={"Content-Type": media_type})
    _check(response, repo, f"store a manifest under {reference}")
    return response


def _add_to_tag_index(client, repo: Repository, image_digest: str, descriptor: dict[str, Any]) -> None:
    tag = tag_schema_tag(image_digest)
    index = _tag_index(client, repo, tag) or {"schemaVersion": 2, "mediaType": OCI_INDEX, "manifests": []}
    manifests = [m for m in index.get("manifests", []) if isinstance(m, dict) and m.get("digest") != descriptor["digest"]]
    index["manifests"] = [*manifests, descriptor]
    body = json.dumps(index, sort_keys=True, separators=(",", ":")).encode()
    _put_manifest(client, repo, tag, body, OCI_INDEX)


def _tag_index(client, repo: Repository, tag: str) -> dict[str, Any] | None:
    response = _request(client, repo, _url(client, repo, f"manifests/{tag}"), headers={"Accept": OCI_INDEX})
    if response.status_code == 404:
        return None
    _check(response, repo, f"read the referrers index {tag}")
    index = _json(response.content)
    return index if isinstance(index, dict) else None


def _referrers(client, repo: Repository, image_digest: str) -> tuple[list[Any], str]:
    response = _request(client, repo, _url(client, repo, f"referrers/{image_digest}"),
                        headers={"Accept": OCI_INDEX})
    if response.status_code == 200 and response.headers.get("Content-Type", "").startswith(OCI_INDEX):
        index = _json(response.content)
        if isinstance(index, dict) and isinstance(index.get("manifests"), list):
            return index["manifests"], "referrers"
    # 404 (no referrers API): the tag schema.
    index = _tag_index(client, repo, tag_schema_tag(image_digest))
    manifests = index.get("manifests") if index else None
    return (manifests if isinstance(manifests, list) else []), "tag-schema"


def _read_artifact(client, repo: Repository, descriptor: dict[str, Any], found_by: str) -> AttachedArtifact:
    digest = str(descriptor.get("digest", ""))
    artifact_type = str(descriptor.get("artifactType", ""))

    def broken(why: str, annotations: dict[str, str] | None = None) -> AttachedArtifact:
        return AttachedArtifact(manifest_digest=digest, artifact_type=artifact_type,
                                annotations=annotations or {}, integrity=why, found_by=found_by)

    response = _request(client, repo, _url(client, repo, f"manifests/{digest}"), headers={"Accept": OCI_MANIFEST})
    if response.status_code == 404:
        return broken(f"the artifact manifest {digest} is listed but the registry does not hold it")
    _check(response, repo, f"read the artifact manifest {digest}")
    if _digest(response.content) != digest:
        return broken(f"the artifact manifest's sha256 is {_digest(response.content)}, not the {digest} that names it")
    manifest = _json(response.content)
    layers = manifest.get("layers") if isinstance(manifest, dict) else None
    annotations = manifest.get("annotations") if isinstance(manifest, dict) else None
    annotations = {str(k): str(v) for k, v in annotations.items()} if isinstance(annotations, dict) else {}
    if not isinstance(layers, list) or len(layers) != 1 or not isinstance(layers[0], dict):
        return broken("the artifact manifest does not hold exactly one document layer", annotations)
    layer = layers[0]
    if not isinstance(layer.get("size"), int) or layer["size"] > MAX_DOCUMENT_BYTES:
        return broken(f"the document layer's size {layer.get('size')!r} is not a size up to {MAX_DOCUMENT_BYTES}",
                      annotations)
    blob = _request(client, repo, _url(client, repo, f"blobs/{layer.get('digest')}"))
    if blob.status_code == 404:
        return broken(f"the document blob {layer.get('digest')} is missing from the registry", annotations)
    _check(blob, repo, f"read the document blob {layer.get('digest')}")
    if _digest(blob.content) != layer.get("digest"):
        return broken(f"the document's sha256 is {_digest(blob.content)}, not the {layer.get('digest')} that names it",
                      annotations)
    return AttachedArtifact(manifest_digest=digest, artifact_type=artifact_type, annotations=annotations,
                            payload=blob.content, found_by=found_by)


def _check(response, repo: Repository, what: str) -> None:
    if response.status_code in (200, 201, 202):
        return
    raise HostError(f"registry {repo.host} could not {what}: HTTP {response.status_code} "
                    f"{_first_line(response.text)[:200]}",
                    remedy="check the registry's permissions and that it accepts OCI artifacts")


def _json(body: bytes) -> Any:
    try:
        return json.loads(body)
    except ValueError:
        return None


def _digest(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def _first_line(value: object) -> str:
    text = str(value).strip()
    return text.splitlines()[0] if text else ""
