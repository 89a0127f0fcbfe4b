"""An image on Docker Hub (``lmsysorg/sglang@sha256:...``): its attached records are asked of docker.io's
registry API host, registry-1.docker.io, as the Docker client asks it (docker.io serves no /v2/)."""

from __future__ import annotations

import requests

from stackforge.edges import oci_artifacts

IMAGE = "lmsysorg/sglang@sha256:" + "a" * 64


def test_a_docker_hub_image_is_read_through_the_registry_api_host(monkeypatch) -> None:
    asked: list[str] = []

    def answer(self, url, method="GET", data=None, headers=None, **kwargs):
        asked.append(url)
        response = requests.Response()
        response.status_code = 404
        return response

    monkeypatch.setattr(oci_artifacts._OneTryRegistry, "do_request", answer)
    assert oci_artifacts.attached_artifacts(IMAGE, artifact_type="x") == ()
    assert asked and all(url.startswith("https://registry-1.docker.io/v2/lmsysorg/sglang/") for url in asked), asked
