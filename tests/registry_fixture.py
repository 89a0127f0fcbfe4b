"""A real, throw-away container registry for tests: Debian's ``docker-registry`` (distribution 2.x).

``local_registry`` starts ``docker-registry serve`` on ``127.0.0.1:<free port>`` with a temporary
storage folder and config, waits until ``/v2/`` answers, and stops it and removes its storage
afterwards. dockerd allows plain HTTP to ``127.0.0.0/8`` registries by default, so the engine can
push and pull without TLS. Use it from a test module with::

    from registry_fixture import local_registry  # noqa: F401  (pytest finds the fixture by name)

This is test scaffolding, so it starts the server with :mod:`subprocess` directly: stackforge's own
runner runs commands to completion and has no notion of a server that outlives the call.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

REGISTRY_BINARY = "docker-registry"
START_TIMEOUT_S = 20.0

_CONFIG = """\
version: 0.1
log:
  level: warn
storage:
  filesystem:
    rootdirectory: {storage}
  delete:
    enabled: true
http:
  addr: {host}
"""


@dataclass(frozen=True, slots=True)
class LocalRegistry:
    """A running registry: ``host`` is what image references use (``127.0.0.1:PORT``)."""

    host: str
    storage: Path
    log_path: Path

    @property
    def url(self) -> str:
        return f"http://{self.host}"


def free_loopback_port() -> int:
    """A TCP port nothing listens on right now (the kernel picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _v2_answers(url: str) -> bool:
    # No proxy: a proxy from the environment must never see (or answer for) a loopback registry.
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    try:
        with opener.open(f"{url}/v2/", timeout=2) as response:
            return response.status == 200
    except (urllib.error.URLError, OSError):
        return False


def _stop(process: subprocess.Popen[bytes]) -> None:
    if process.poll() is None:
        os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait(timeout=10)


@pytest.fixture(scope="module")
def local_registry(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalRegistry]:
    """Start a registry on a free loopback port for the module's tests; stop and delete it afterwards."""
    binary = shutil.which(REGISTRY_BINARY)
    if binary is None:
        pytest.skip("needs Debian's docker-registry (apt-get install -y docker-registry)")
    root = tmp_path_factory.mktemp("registry")
    registry = LocalRegistry(host=f"127.0.0.1:{free_loopback_port()}", storage=root / "storage",
                             log_path=root / "registry.log")
    config = root / "config.yml"
    config.write_text(_CONFIG.format(storage=registry.storage, host=registry.host), encoding="utf-8")
    with open(registry.log_path, "wb") as log:
        process = subprocess.Popen([binary, "serve", str(config)], stdout=log, stderr=subprocess.STDOUT,
                                   stdin=subprocess.DEVNULL, start_new_session=True)
    try:
        deadline = time.monotonic() + START_TIMEOUT_S
        while not _v2_answers(registry.url):
            if process.poll() is not None or time.monotonic() > deadline:
                log_text = registry.log_path.read_text(encoding="utf-8", errors="replace")[-2000:]
                pytest.fail(f"docker-registry did not answer on {registry.url}/v2/ "
                            f"(exit status {process.poll()}); log:\n{log_text}")
            time.sleep(0.1)
        yield registry
    finally:
        _stop(process)
        shutil.rmtree(root, ignore_errors=True)
