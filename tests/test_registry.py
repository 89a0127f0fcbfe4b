"""Tests for stackforge.edges.registry: reference parsing and cache flags (pure), and a real push/pull
round trip through a local registry (Debian's docker-registry on 127.0.0.1)."""

from __future__ import annotations

import io
import tarfile
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from registry_fixture import LocalRegistry, free_loopback_port, local_registry  # noqa: F401

from stackforge.core.errors import CommandError, SpecError, UnsafeValueError
from stackforge.edges import registry, runner
from stackforge.edges.registry import Repository

DIGEST_A = "sha256:" + "a" * 64

# ----------------------------------------------------------------------------------------- pure: refs


@pytest.mark.parametrize("text, host, path", [
    ("ghcr.io/acme/stackforge", "ghcr.io", "acme/stackforge"),
    ("127.0.0.1:5000/sf", "127.0.0.1:5000", "sf"),
    ("localhost/sf/images", "localhost", "sf/images"),
    ("acme/stackforge", "docker.io", "acme/stackforge"),
    ("ubuntu", "docker.io", "library/ubuntu"),
    ("index.docker.io/acme/sf", "docker.io", "acme/sf"),
    ("registry.example.com:8443/a/b/c/", "registry.example.com:8443", "a/b/c"),
])
def test_repository_parse_follows_dockers_rules(text: str, host: str, path: str) -> None:
    repo = Repository.parse(text)
    assert (repo.host, repo.path) == (host, path)
    assert str(repo) == f"{host}/{path}"


@pytest.mark.parametrize("text", ["", "ghcr.io/Acme/sf", "ghcr.io/acme/sf:tag@x", "ghcr.io/a b",
                                  "ghcr.io/acme/sf,mode=min", "ghcr.io/acme/sf\nRUN x", "bad_host:x/sf",
                                  "ghcr.io/acme//sf"])
def test_repository_parse_rejects_unsafe_or_invalid_refs(text: str) -> None:
    with pytest.raises(UnsafeValueError):
        Repository.parse(text)


def test_tagged_and_at_validate_their_parts() -> None:
    repo = Repository.parse("127.0.0.1:5000/sf")
    assert repo.tagged("cu131-torch2.14.1") == "127.0.0.1:5000/sf:cu131-torch2.14.1"
    assert repo.at(DIGEST_A) == f"127.0.0.1:5000/sf@{DIGEST_A}"
    with pytest.raises(UnsafeValueError):
        repo.tagged("torch2.9.1+cu128")  # '+' is not allowed in a Docker tag
    with pytest.raises(SpecError):
        repo.at("sha256:abc")


@pytest.mark.parametrize("host, loopback", [("127.0.0.1:5000", True), ("127.9.9.9", True), ("localhost:5000", True),
                                            ("[::1]:5000", True), ("ghcr.io", False), ("10.0.0.1:5000", False)])
def test_is_loopback_host(host: str, loopback: bool) -> None:
    assert registry.is_loopback_host(host) is loopback


def test_split_digest_ref_requires_a_digest() -> None:
    repo, digest = registry.split_digest_ref(f"ghcr.io/acme/sf@{DIGEST_A}")
    assert (str(repo), digest) == ("ghcr.io/acme/sf", DIGEST_A)
    with pytest.raises(SpecError, match="not a digest reference"):
        registry.split_digest_ref("ghcr.io/acme/sf:latest")


def test_digest_is_read_from_the_push_report_for_the_right_tag() -> None:
    output = ("The push refers to repository [127.0.0.1:5000/sf]\n65793349cf97: Pushed\n"
              f"other: digest: sha256:{'b' * 64} size: 1\nt1: digest: {DIGEST_A} size: 523\n")
    assert registry._digest_from_push(output, "t1") == DIGEST_A
    assert registry._digest_from_push(output, "t2") is None


# ------------------------------------------------------------------------------ real engine + registry


@pytest.fixture
def tiny_image(docker_client: object, test_labels: dict[str, str], tmp_path: Path) -> Iterator[str]:
    """A one-file image made with `docker import` (no registry needed), removed afterwards."""
    content = f"stackforge registry test {uuid.uuid4()}\n".encode()
    tar_path = tmp_path / "tiny.tar"
    with tarfile.open(tar_path, "w") as tar:
        info = tarfile.TarInfo("stackforge-test.txt")
        info.size = len(content)
        tar.addfile(info, io.BytesIO(content))
    tag = f"stackforge-test/tiny:{uuid.uuid4().hex[:12]}"
    changes = [arg for key, value in test_labels.items() for arg in ("--change", f"LABEL {key}={value}")]
    runner.check_run(["docker", "import", *changes, str(tar_path), tag], timeout=120)
    image_id = registry.local_image_id(tag)
    try:
        yield tag
    finally:
        runner.run(["docker", "image", "rm", "--force", image_id], timeout=120)


def _served_digest(local: LocalRegistry, repo: Repository, reference: str) -> str:
    """The manifest digest the registry itself serves for a tag or digest (its HTTP API, not the engine)."""
    request = urllib.request.Request(f"{local.url}/v2/{repo.path}/manifests/{reference}", method="HEAD", headers={
        "Accept": "application/vnd.docker.distribution.manifest.v2+json, application/vnd.oci.image.manifest.v1+json"})
    with urllib.request.urlopen(request, timeout=30) as response:
        return response.headers["Docker-Content-Digest"]


def _remove_image(image: str) -> bool:
    return runner.run(["docker", "image", "rm", image], timeout=120).succeeded


def _labels(image: str) -> str:
    return runner.check_run(["docker", "image", "inspect", "--format", "{{json .Config.Labels}}", image],
                            timeout=60).output_tail


@pytest.mark.docker
def test_push_then_pull_by_digest_gives_back_the_same_image(local_registry: LocalRegistry,  # noqa: F811
                                                             tiny_image: str) -> None:
    repo = Repository.parse(f"{local_registry.host}/stackforge-test/tiny")
    original_id = registry.local_image_id(tiny_image)

    pushed = registry.push(tiny_image, repo, "t1")
    assert pushed.image_id == original_id
    assert pushed.tagged == f"{repo}:t1"
    assert registry.DIGEST.fullmatch(pushed.digest)
    assert pushed.ref == f"{repo}@{pushed.digest}"
    assert _served_digest(local_registry, repo, "t1") == pushed.digest, "the registry serves what the push reported"
    assert pushed.ref in registry.repo_digests(original_id)

    # Forget the image locally, so the pull must really come from the registry.
    # Removing the last tag deletes the image, its repo digest reference included.
    assert _remove_image(pushed.tagged) and _remove_image(tiny_image)
    assert not _remove_image(pushed.ref)
    with pytest.raises(CommandError):
        registry.local_image_id(original_id)

    pulled = registry.pull(pushed.ref)
    assert pulled.image_id == original_id
    assert pushed.ref in registry.repo_digests(pulled.image_id)
    assert '"io.stackforge.test":"1"' in _labels(pulled.image_id)
    print(f"\n[timing] push {pushed.duration_s:.3f} s, pull by digest {pulled.duration_s:.3f} s "
          f"({pushed.ref})")


@pytest.mark.docker
def test_same_content_under_another_tag_has_the_same_digest(local_registry: LocalRegistry,  # noqa: F811
                                                            tiny_image: str) -> None:
    repo = Repository.parse(f"{local_registry.host}/stackforge-test/same")
    first = registry.push(tiny_image, repo, "a")
    second = registry.push(tiny_image, repo, "b")
    assert first.digest == second.digest
    assert _served_digest(local_registry, repo, "b") == first.digest
    assert _served_digest(local_registry, repo, first.digest) == first.digest


@pytest.mark.docker
def test_pull_of_an_unknown_digest_fails_with_a_hint(local_registry: LocalRegistry,  # noqa: F811
                                                     docker_client: object) -> None:
    ref = f"{local_registry.host}/stackforge-test/tiny@sha256:{'0' * 64}"
    with pytest.raises(CommandError) as info:
        registry.pull(ref, timeout=120)
    assert "could not pull" in info.value.message
    assert "no such image" in info.value.remedy


@pytest.mark.docker
def test_push_to_a_registry_that_is_not_running_says_so(tiny_image: str) -> None:
    repo = Repository.parse(f"127.0.0.1:{free_loopback_port()}/stackforge-test/tiny")
    with pytest.raises(CommandError) as info:
        registry.push(tiny_image, repo, "t1", timeout=120)
    assert "could not push" in info.value.message
    assert "running and reachable" in info.value.remedy
    _remove_image(repo.tagged("t1"))


def test_pull_refuses_a_tag() -> None:
    with pytest.raises(SpecError, match="not a digest reference"):
        registry.pull("127.0.0.1:5000/sf:latest")
