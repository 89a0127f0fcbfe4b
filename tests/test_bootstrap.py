"""stackforge.edges.bootstrap: the registry-free base image, its guards, and the safe scratch removal."""

from __future__ import annotations

import os
import uuid
from pathlib import Path

import docker
import pytest

from stackforge.core.errors import HostError, UnsafeValueError
from stackforge.edges import bootstrap, docker_engine, runner

needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="needs root (mount / debootstrap)")


def _has_debootstrap() -> bool:
    return runner.which("debootstrap") is not None or runner.which("/usr/sbin/debootstrap") is not None


@pytest.mark.parametrize("kwargs", [
    {"suite": "bookworm --foreign"},
    {"suite": "-x"},
    {"ref": "Stackforge/UPPER:tag"},
    {"ref": "a b"},
    {"mirror": "ftp://deb.debian.org/debian"},
    {"mirror": "http://x/debian --keyring=/tmp/k"},
])
def test_unsafe_arguments_are_rejected_before_anything_runs(kwargs: dict[str, str]) -> None:
    with pytest.raises(UnsafeValueError):
        bootstrap.bootstrap_base(object(), **kwargs)  # type: ignore[arg-type]


@pytest.mark.docker
def test_existing_image_is_left_alone(docker_client: docker.DockerClient, base_image: str) -> None:
    result = bootstrap.bootstrap_base(docker_client, ref=base_image)
    assert not result.created
    assert result.image_id == docker_client.images.get(base_image).id
    assert "already exists" in result.describe()


@pytest.mark.docker
def test_not_root_is_a_one_line_host_error(docker_client: docker.DockerClient,
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    if not _has_debootstrap():
        pytest.skip("debootstrap is not installed; the missing-program error comes first")
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    with pytest.raises(HostError, match="must run as root") as caught:
        bootstrap.bootstrap_base(docker_client, ref=f"stackforge-test/absent:{uuid.uuid4().hex[:8]}")
    assert "\n" not in caught.value.one_line()


@pytest.mark.docker
def test_missing_debootstrap_is_a_host_error_with_remedy(docker_client: docker.DockerClient,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(runner, "which", lambda program: None)
    with pytest.raises(HostError, match="debootstrap is not installed") as caught:
        bootstrap.bootstrap_base(docker_client, ref=f"stackforge-test/absent:{uuid.uuid4().hex[:8]}")
    assert "setup-engine.sh" in caught.value.remedy


def test_import_changes_set_shell_locale_path_and_labels() -> None:
    changes = bootstrap.import_changes("bookworm")
    assert 'CMD ["/bin/bash"]' in changes
    assert "ENV LANG=C.UTF-8" in changes
    assert any(c.startswith("ENV PATH=/usr/local/sbin:") for c in changes)
    assert f"LABEL {bootstrap.BASE_LABEL}=debootstrap {bootstrap.BASE_LABEL}.suite=bookworm" in changes
    # The base must survive run cleanup, which removes everything carrying MANAGED_LABEL.
    assert not any(docker_engine.MANAGED_LABEL in c for c in changes)


@needs_root
def test_remove_tree_unmounts_what_a_killed_debootstrap_left_mounted(tmp_path: Path) -> None:
    scratch = tmp_path / "stackforge-rootfs-x"
    inner = scratch / "root" / "proc with space"
    inner.mkdir(parents=True)
    runner.check_run(["mount", "-t", "tmpfs", "tmpfs", str(inner)], timeout=30)
    (inner / "file").write_text("on the tmpfs")
    try:
        assert bootstrap.mounts_under(scratch) == [inner]
        bootstrap.remove_tree(scratch)
    finally:
        if bootstrap.mounts_under(scratch):
            runner.run(["umount", "--lazy", str(inner)], timeout=30)
    assert not scratch.exists()
    assert bootstrap.mounts_under(tmp_path) == []


@pytest.mark.docker
@pytest.mark.slow
@needs_root
def test_bootstrap_builds_a_working_python_image(docker_client: docker.DockerClient, tmp_path: Path,
                                                 test_labels: dict[str, str]) -> None:
    if not _has_debootstrap():
        pytest.skip("debootstrap is not installed")
    ref = f"stackforge-test/debian:bookworm-{uuid.uuid4().hex[:8]}"
    messages: list[str] = []
    try:
        result = bootstrap.bootstrap_base(docker_client, ref=ref, workdir=tmp_path, report=messages.append,
                                          log_path=tmp_path / "bootstrap.log")
        assert result.created and result.duration_s > 0 and result.size_bytes > 50_000_000
        assert len(messages) == 2
        assert list(tmp_path.glob("stackforge-rootfs-*")) == []  # scratch root removed
        config = docker_client.images.get(ref).attrs["Config"]
        assert config["Cmd"] == ["/bin/bash"]
        assert "LANG=C.UTF-8" in config["Env"]
        assert config["Labels"][bootstrap.BASE_LABEL] == "debootstrap"
        script = ("python3 --version && python3 -m venv /tmp/v && /tmp/v/bin/pip --version"
                  " && test -s /etc/ssl/certs/ca-certificates.crt && echo OK")
        run = docker_engine.run_container(docker_client, ref, ["sh", "-c", script], timeout=120,
                                          labels=test_labels)
        assert run.exit_code == 0, run.logs_tail
        assert "Python 3.11." in run.logs_tail and run.logs_tail.rstrip().endswith("OK")
    finally:
        try:
            docker_client.images.remove(ref, force=True)
        except docker.errors.ImageNotFound:
            pass
