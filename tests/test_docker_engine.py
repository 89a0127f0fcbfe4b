"""stackforge.edges.docker_engine against a real engine: timeouts, crashes, labels, cleanup, unreachable hosts."""

from __future__ import annotations

import os
import signal
import socket
import threading
import time
import uuid
from pathlib import Path

import docker
import docker.errors
import pytest
from _session import TEST_LABEL
from _skips import skip_gpu_only

from stackforge.core.errors import CommandError, DockerUnavailableError, HostError
from stackforge.edges import docker_engine
from stackforge.edges.docker_engine import MANAGED_LABEL, RUN_LABEL, Bind


def _containers_with(client: docker.DockerClient, label: str) -> list[object]:
    return client.containers.list(all=True, filters={"label": label})


@pytest.fixture
def run_labels(test_labels: dict[str, str]) -> dict[str, str]:
    """Test labels plus a RUN_LABEL unique to this test, to find exactly its containers."""
    return {**test_labels, RUN_LABEL: f"test-{uuid.uuid4().hex[:10]}"}


def _run_selector(labels: dict[str, str]) -> str:
    return f"{RUN_LABEL}={labels[RUN_LABEL]}"


# --------------------------------------------------------------------------- engine not reachable (no engine needed)


def test_unreachable_unix_socket_is_one_line_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DOCKER_HOST", "unix:///nonexistent.sock")
    with pytest.raises(DockerUnavailableError) as caught:
        docker_engine.connect(timeout=2)
    line = caught.value.one_line()
    assert "\n" not in line
    assert line.startswith("no Docker engine answers at unix:///nonexistent.sock: ")
    assert "does not exist" in line
    assert "setup-engine.sh" in caught.value.remedy


def test_stale_socket_file_without_engine_is_connection_refused(monkeypatch: pytest.MonkeyPatch,
                                                               tmp_path: Path) -> None:
    # A socket file left behind by an engine that died: it exists, but nobody listens.
    path = tmp_path / "stale.sock"
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(str(path))
    listener.close()
    monkeypatch.setenv("DOCKER_HOST", f"unix://{path}")
    with pytest.raises(DockerUnavailableError) as caught:
        docker_engine.connect(timeout=2)
    assert caught.value.one_line().startswith(f"no Docker engine answers at unix://{path}: Connection refused")


def test_unreachable_tcp_host_is_one_line_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DOCKER_HOST", "tcp://127.0.0.1:1")
    with pytest.raises(DockerUnavailableError) as caught:
        docker_engine.connect(timeout=2)
    line = caught.value.one_line()
    assert "\n" not in line and "Traceback" not in line
    assert "tcp://127.0.0.1:1: Connection refused" in line


# --------------------------------------------------------------------------- pure helpers


@pytest.mark.parametrize(("exit_code", "expected"), [(0, None), (1, None), (128, None), (137, 9),
                                                     (139, 11), (143, 15), (134, 6), (255, None)])
def test_signal_from_exit_code(exit_code: int, expected: int | None) -> None:
    assert docker_engine.signal_from_exit_code(exit_code) == expected


def test_device_requests_follow_docker_run_gpus() -> None:
    assert docker_engine.device_requests(None) == []
    (every,) = docker_engine.device_requests("all")
    assert every["Count"] == -1 and every["Capabilities"] == [["gpu"]]
    (two,) = docker_engine.device_requests("2")
    assert two["Count"] == 2
    (chosen,) = docker_engine.device_requests("device=0,3")
    assert chosen["DeviceIDs"] == ["0", "3"]
    for bad in ("", "0", "-1", "device=", "gpu0", "all; rm -rf /"):
        with pytest.raises(ValueError):
            docker_engine.device_requests(bad)


def test_buildx_unavailable_without_docker_cli(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    assert docker_engine.buildx_available() is False


# --------------------------------------------------------------------------- real containers


@pytest.mark.docker
def test_an_idle_container_is_labelled_with_its_owner_has_a_lifetime_and_is_removed(
        docker_client: docker.DockerClient, base_image: str, run_labels: dict[str, str]) -> None:
    """Verification's container (commands exec'd into it) is made here too: owner labels, so
    reap_orphans can find it, a bounded lifetime, and removal when the block ends."""
    with docker_engine.idle_container(docker_client, base_image, labels=run_labels, lifetime_s=60) as container_id:
        container = docker_client.containers.get(container_id)
        assert container.status == "running" and container.attrs["Config"]["Cmd"] == ["sleep", "60"]
        labels = container.labels
        assert labels[MANAGED_LABEL] == "true" and labels[docker_engine.PID_LABEL] == str(os.getpid())
        assert container.exec_run(["true"]).exit_code == 0
    with pytest.raises(docker.errors.NotFound):
        docker_client.containers.get(container_id)
    with pytest.raises(CommandError, match="does not exist"):
        with docker_engine.idle_container(docker_client, "stackforge-test/no-such-image:0", lifetime_s=60):
            pass


@pytest.mark.docker
def test_exit_status_and_logs_are_reported(docker_client: docker.DockerClient, base_image: str,
                                           run_labels: dict[str, str], tmp_path: Path) -> None:
    log = tmp_path / "container.log"
    result = docker_engine.run_container(
        docker_client, base_image, ["sh", "-c", 'echo "out $GREETING"; echo err >&2; exit 3'],
        timeout=60, env={"GREETING": "hello"}, labels=run_labels, log_path=log)

    assert result.exit_code == 3 and result.signal is None and not result.timed_out
    assert not result.oom_killed
    assert "out hello\n" in result.logs_tail and "err\n" in result.logs_tail
    assert "out hello" in log.read_text() and "exited with status 3" in log.read_text()
    assert _containers_with(docker_client, _run_selector(run_labels)) == []


@pytest.mark.docker
def test_sleeping_container_is_stopped_at_timeout_and_removed(docker_client: docker.DockerClient,
                                                              base_image: str,
                                                              run_labels: dict[str, str]) -> None:
    started = time.monotonic()
    result = docker_engine.run_container(docker_client, base_image, ["sleep", "300"], timeout=2, grace=1,
                                         labels=run_labels)
    elapsed = time.monotonic() - started

    assert result.timed_out
    assert result.signal in (signal.SIGTERM, signal.SIGKILL)
    assert result.exit_code in (128 + signal.SIGTERM, 128 + signal.SIGKILL)
    assert 2 <= result.duration_s < 15 and elapsed < 20
    assert "timed out" in result.describe()
    assert _containers_with(docker_client, _run_selector(run_labels)) == []


@pytest.mark.docker
def test_sigterm_ignoring_container_is_killed_after_grace(docker_client: docker.DockerClient, base_image: str,
                                                          run_labels: dict[str, str]) -> None:
    script = 'trap "" TERM; while true; do sleep 1; done'
    result = docker_engine.run_container(docker_client, base_image, ["sh", "-c", script], timeout=1, grace=1,
                                         labels=run_labels)
    assert result.timed_out
    assert result.signal == signal.SIGKILL
    assert _containers_with(docker_client, _run_selector(run_labels)) == []


@pytest.mark.docker
def test_segfaulting_container_reports_signal_11(docker_client: docker.DockerClient, base_image: str,
                                                 run_labels: dict[str, str]) -> None:
    result = docker_engine.run_container(docker_client, base_image, ["sh", "-c", "kill -SEGV $$"], timeout=60,
                                         labels=run_labels)
    assert result.exit_code == 139
    assert result.signal == signal.SIGSEGV
    assert not result.timed_out
    assert result.describe() == "killed by SIGSEGV"
    assert _containers_with(docker_client, _run_selector(run_labels)) == []


@pytest.mark.docker
def test_container_carries_labels_host_network_and_read_only_mounts(docker_client: docker.DockerClient,
                                                                    base_image: str,
                                                                    run_labels: dict[str, str],
                                                                    tmp_path: Path) -> None:
    (tmp_path / "probe.txt").write_text("mounted\n")
    seen: list[dict[str, object]] = []
    result_box: list[docker_engine.ContainerExit] = []
    script = 'cat /stackforge/probe.txt; touch /stackforge/new 2>&1 || true; sleep 4'

    def run() -> None:
        result_box.append(docker_engine.run_container(
            docker_client, base_image, ["sh", "-c", script], timeout=60, labels=run_labels,
            mounts=[Bind(tmp_path, "/stackforge")]))

    worker = threading.Thread(target=run)
    worker.start()
    deadline = time.monotonic() + 30
    while not seen and time.monotonic() < deadline:
        seen.extend(c.attrs for c in _containers_with(docker_client, _run_selector(run_labels)))
        time.sleep(0.2)
    worker.join(timeout=90)

    assert seen, "the container never appeared"
    attrs = seen[0]
    labels = attrs["Config"]["Labels"]  # type: ignore[index]
    assert labels[MANAGED_LABEL] == "true"
    assert labels[TEST_LABEL] == "1"
    assert labels[RUN_LABEL] == run_labels[RUN_LABEL]
    assert attrs["HostConfig"]["NetworkMode"] == "host"  # type: ignore[index]
    assert attrs["HostConfig"]["Init"] is True  # type: ignore[index]
    (mount,) = attrs["Mounts"]  # type: ignore[misc]
    assert mount["Destination"] == "/stackforge" and mount["RW"] is False
    (result,) = result_box
    assert result.exit_code == 0
    assert "mounted\n" in result.logs_tail
    assert "Read-only file system" in result.logs_tail
    assert not (tmp_path / "new").exists()
    assert _containers_with(docker_client, _run_selector(run_labels)) == []


@pytest.mark.docker
def test_secrets_are_redacted_from_container_logs(docker_client: docker.DockerClient, base_image: str,
                                                  run_labels: dict[str, str], tmp_path: Path) -> None:
    secret = "tok-" + uuid.uuid4().hex
    log = tmp_path / "c.log"
    result = docker_engine.run_container(docker_client, base_image, ["sh", "-c", 'echo "token=$TOKEN"'],
                                         timeout=60, env={"TOKEN": secret}, labels=run_labels, log_path=log,
                                         redact=[secret])
    assert "token=***" in result.logs_tail
    assert secret not in result.logs_tail and secret not in log.read_text()


@pytest.mark.docker
def test_keyboard_interrupt_removes_the_container(docker_client: docker.DockerClient, base_image: str,
                                                  run_labels: dict[str, str]) -> None:
    timer = threading.Timer(2.0, os.kill, (os.getpid(), signal.SIGINT))
    timer.start()
    try:
        with pytest.raises(KeyboardInterrupt):
            docker_engine.run_container(docker_client, base_image, ["sleep", "300"], timeout=120,
                                        labels=run_labels)
    finally:
        timer.cancel()
    assert _containers_with(docker_client, _run_selector(run_labels)) == []


@pytest.mark.docker
def test_cancel_flag_stops_and_removes_the_container(docker_client: docker.DockerClient, base_image: str,
                                                     run_labels: dict[str, str]) -> None:
    cancel = threading.Event()
    timer = threading.Timer(1.0, cancel.set)
    timer.start()
    try:
        result = docker_engine.run_container(docker_client, base_image, ["sleep", "300"], timeout=120, grace=1,
                                             labels=run_labels, cancel=cancel)
    finally:
        timer.cancel()
    assert result.cancelled and not result.timed_out and not result.succeeded
    assert result.duration_s < 15
    assert result.describe().startswith("cancelled after")
    assert _containers_with(docker_client, _run_selector(run_labels)) == []


@pytest.mark.docker
def test_missing_image_is_a_command_error_and_leaves_nothing(docker_client: docker.DockerClient,
                                                             run_labels: dict[str, str]) -> None:
    with pytest.raises(CommandError, match="does not exist on this engine"):
        docker_engine.run_container(docker_client, "stackforge/no-such-image:0", ["true"], timeout=30,
                                    labels=run_labels)
    assert _containers_with(docker_client, _run_selector(run_labels)) == []


@pytest.mark.docker
def test_missing_mount_source_is_a_host_error(docker_client: docker.DockerClient, base_image: str,
                                              run_labels: dict[str, str], tmp_path: Path) -> None:
    with pytest.raises(HostError, match="does not exist"):
        docker_engine.run_container(docker_client, base_image, ["true"], timeout=30, labels=run_labels,
                                    mounts={tmp_path / "absent": "/x"})
    assert _containers_with(docker_client, _run_selector(run_labels)) == []


@pytest.mark.docker
def test_gpu_request_without_gpu_runtime_is_a_host_error(docker_client: docker.DockerClient, base_image: str,
                                                         run_labels: dict[str, str]) -> None:
    runtimes = docker_client.info().get("Runtimes", {})
    if "nvidia" in runtimes or docker_client.info().get("CDISpecDirs"):
        skip_gpu_only("this engine has a GPU runtime; the no-GPU error path cannot be exercised")
    with pytest.raises(HostError, match="cannot give GPUs"):
        docker_engine.run_container(docker_client, base_image, ["true"], timeout=30, labels=run_labels,
                                    gpus="all")
    assert _containers_with(docker_client, _run_selector(run_labels)) == []


@pytest.mark.docker
def test_remove_labelled_removes_containers_and_images(docker_client: docker.DockerClient, base_image: str,
                                                       run_labels: dict[str, str]) -> None:
    selector = _run_selector(run_labels)
    container = docker_client.containers.create(base_image, ["true"], labels=run_labels, network_mode="host")
    label_changes = " ".join(f"{key}={value}" for key, value in run_labels.items())
    image = container.commit(repository="stackforge-test/labelled", tag=run_labels[RUN_LABEL],
                             changes=[f"LABEL {label_changes}"])
    assert _containers_with(docker_client, selector) != []

    removed = docker_engine.remove_labelled(docker_client, selector)

    assert removed.containers == (container.id,)
    assert removed.images == (image.id,)
    assert _containers_with(docker_client, selector) == []
    assert docker_client.images.list(filters={"label": selector}) == []
    docker_client.images.get(base_image)  # the base it was derived from is untouched


# --------------------------------------------------------------------------- remote engines: copy instead of bind


@pytest.mark.parametrize(("url", "shares"), [
    ("unix:///var/run/docker.sock", True),
    ("npipe:////./pipe/docker_engine", True),
    ("tcp://127.0.0.1:2375", True),
    ("tcp://localhost:2376", True),
    ("tcp://[::1]:2375", True),
    ("tcp://10.0.0.7:2376", False),
    ("tcp://gpu-box.example:2376", False),
    ("ssh://ci@gpu-box", False),
])
def test_engine_shares_host_files_only_on_this_machine(url: str, shares: bool) -> None:
    assert docker_engine.engine_shares_host_files(url) is shares


@pytest.mark.docker
def test_copied_folder_arrives_read_only_and_other_mounts_stay_bound(docker_client: docker.DockerClient,
                                                                      base_image: str, run_labels: dict[str, str],
                                                                      tmp_path: Path) -> None:
    """What a remote engine gets: the scripts copied in (no bind), the model still bound."""
    scripts = tmp_path / "scripts"
    (scripts / "sub").mkdir(parents=True)
    (scripts / "sub" / "probe.py").write_text("print('copied')\n")
    (scripts / "__pycache__").mkdir()
    (scripts / "__pycache__" / "junk.pyc").write_bytes(b"\0")
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text("{}\n")
    script = ("cat /stackforge/probes/sub/probe.py; stat -c '%a %U' /stackforge/probes/sub/probe.py /stackforge; "
              "ls -A /stackforge/probes; cat /model/config.json; grep -c ' /stackforge' /proc/mounts || true")
    result = docker_engine.run_container(
        docker_client, base_image, ["sh", "-c", script], timeout=60, labels=run_labels, copy_binds=True,
        mounts=[Bind(scripts, "/stackforge/probes", copy_to_remote=True), Bind(model, "/model")])
    assert result.exit_code == 0, result.logs_tail
    lines = result.logs_tail.splitlines()
    assert lines[0] == "print('copied')"
    assert lines[1:3] == ["444 root", "555 root"]
    assert "__pycache__" not in result.logs_tail
    assert "{}" in lines and lines[-1] == "0", result.logs_tail  # /stackforge is not a mount: it was copied
    assert _containers_with(docker_client, _run_selector(run_labels)) == []


@pytest.mark.docker
def test_remote_engine_url_makes_run_container_copy(docker_client: docker.DockerClient, base_image: str,
                                                    run_labels: dict[str, str], tmp_path: Path,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """DOCKER_HOST naming another machine: the same call copies instead of binding."""
    (tmp_path / "probe.txt").write_text("via copy\n")
    monkeypatch.setattr(docker_engine, "engine_url", lambda: "ssh://ci@gpu-box")
    result = docker_engine.run_container(
        docker_client, base_image, ["sh", "-c", "cat /sf/probe.txt; grep -c ' /sf ' /proc/mounts || true"],
        timeout=60, labels=run_labels, mounts=[Bind(tmp_path, "/sf", copy_to_remote=True)])
    assert result.logs_tail.splitlines() == ["via copy", "0"], result.logs_tail


@pytest.mark.docker
def test_copying_a_file_instead_of_a_folder_is_a_host_error(docker_client: docker.DockerClient, base_image: str,
                                                            run_labels: dict[str, str], tmp_path: Path) -> None:
    (tmp_path / "one.py").write_text("")
    with pytest.raises(HostError, match="not a folder"):
        docker_engine.run_container(docker_client, base_image, ["true"], timeout=30, labels=run_labels,
                                    copy_binds=True, mounts=[Bind(tmp_path / "one.py", "/x", copy_to_remote=True)])
    assert _containers_with(docker_client, _run_selector(run_labels)) == []
