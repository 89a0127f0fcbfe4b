"""Shared fixtures: a real Docker client, the registry-free base image, and labels for cleanup.

* ``docker_client``: session-wide client from :func:`stackforge.edges.docker_engine.connect`; tests that use
  it are skipped, with the reason, when no engine answers.
* ``base_image``: ``stackforge/debian:bookworm`` (Python 3.11). Built once with debootstrap (about a
  minute, needs root) when missing. It is the project's base image, not a test artifact, so it stays.
* ``default_13_1_image``: the default CUDA 13.1 stack's image; built once per session with `stackforge
  build --cuda 13.1` (labelled as this session's, removed at its end) when this engine has none.
* ``test_labels``: put these on every image and container a test creates. Everything carrying this
  session's label is removed when the session ends, so a failing test leaves nothing behind, and
  concurrent sessions on the same engine never remove each other's objects.

Skips are classified (GPU-only or not) and counted by reason at the end of the run: see _skips.py.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator

import docker
import pytest
from _session import SESSION_ID, TEST_LABEL, TEST_SESSION_LABEL
from _skips import pytest_runtest_makereport, pytest_terminal_summary  # noqa: F401  (hooks, found by name)

from stackforge.core.errors import DockerUnavailableError
from stackforge.edges import bootstrap, docker_engine, runner
from stackforge.inimage import HOST_DIR as INIMAGE_DIR
from stackforge.jobs.job_runner import STACK_ID_LABEL as STACK_LABEL

# The in-image scripts import ``_sfprobe`` / ``_sfshared`` / ``_sglang_source`` by file name from the
# in-image package, which the job runner puts on PYTHONPATH for every script. Tests that import a
# script, or start one as ``python <script>``, get the same: in this process and in every child.
sys.path.insert(0, str(INIMAGE_DIR))
os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (str(INIMAGE_DIR), os.environ.get("PYTHONPATH")) if p)


@pytest.fixture(autouse=True)
def _own_gpu_lock_folder(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory,
                         monkeypatch: pytest.MonkeyPatch) -> None:
    """GPU locks of tests that need no GPU go to a folder of this session, not the host's shared one: the
    stand-in GPUs of one session never queue behind another's. GPU tests honour the host's real locks."""
    if request.node.get_closest_marker("gpu") is None and "STACKFORGE_RUN_DIR" not in os.environ:
        monkeypatch.setenv("STACKFORGE_RUN_DIR", str(tmp_path_factory.getbasetemp() / "gpu-locks"))


def pytest_addoption(parser: pytest.Parser) -> None:
    # Declared here too so that `pytest --update-golden` works from the repository root
    # (tests/golden/conftest.py tolerates the second declaration).
    parser.addoption("--update-golden", action="store_true", default=False,
                     help="Rewrite golden files from the current output instead of comparing.")


#: What keeps a test out of the fast loop (`pytest -m fast`): an engine, a browser, the network, a GPU, a build.
HEAVY_MARKERS = ("docker", "slow", "browser", "pypi", "gpu", "heavy")
HEAVY_FIXTURES = frozenset({"docker_client", "base_image", "cuda_torch_python", "torch_python"})
#: Modules whose tests create Python environments (pip installs of torch, FlashInfer, SGLang) or compile,
#: or run real servers and process groups against their timeouts (seconds each, by design).
HEAVY_MODULES = frozenset({"test_probe_scripts", "test_probes_catalog", "test_sglang_custom_ar_dispatch",
                           "test_bench_serve", "test_bench_allreduce", "test_bench_gemm", "test_runner",
                           "test_shell_scripts", "test_flashinfer_run_checks", "test_wheel_abi"})


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark ``fast`` every test that needs no engine, browser, network, GPU, venv or compiler: the loop a
    developer runs between edits (`pytest -m fast`, a few minutes on 2 cores); `.ci/run` runs everything."""
    for item in items:
        heavy = (any(item.get_closest_marker(name) for name in HEAVY_MARKERS)
                 or HEAVY_FIXTURES & set(getattr(item, "fixturenames", ()))
                 or item.module is not None and item.module.__name__.rpartition(".")[2] in HEAVY_MODULES)
        if not heavy:
            item.add_marker(pytest.mark.fast)


@pytest.fixture(scope="session")
def docker_client() -> Iterator[docker.DockerClient]:
    """A connected client; skips the test when no Docker engine answers."""
    try:
        client = docker_engine.connect(timeout=5)
    except DockerUnavailableError as error:
        pytest.skip(f"needs a Docker engine: {error.one_line()}")
    try:
        yield client
    finally:
        # An image built FROM another (the metadata step over the builder's body image) keeps its
        # parent in use until it is gone: sweep until a pass removes nothing (a few passes at most).
        for _ in range(4):
            removed = docker_engine.remove_labelled(client, f"{TEST_SESSION_LABEL}={SESSION_ID}")
            if not removed.images and not removed.containers:
                break
        client.close()


@pytest.fixture(scope="session")
def base_image(docker_client: docker.DockerClient) -> str:
    """The reference of the debootstrap base image, built first if this engine lacks it."""
    ref = bootstrap.DEFAULT_REF
    try:
        docker_client.images.get(ref)
        return ref
    except docker.errors.ImageNotFound:
        pass
    if os.geteuid() != 0 or runner.which("debootstrap") is None and runner.which("/usr/sbin/debootstrap") is None:
        pytest.skip(f"needs {ref}: build it with `sudo python -m stackforge.edges.bootstrap` (root + debootstrap)")
    bootstrap.bootstrap_base(docker_client, ref=ref)
    return ref


@pytest.fixture
def test_labels() -> dict[str, str]:
    """Labels for anything a test creates: the shared test marker plus this session's id."""
    return {TEST_LABEL: "1", TEST_SESSION_LABEL: SESSION_ID}


#: The default matrix's CUDA 13.1 stack: the image `stackforge build --cuda 13.1` makes (about 11.6 GB).
DEFAULT_13_1_STACK = "cu131-torch2.14.1-fi0.7.2-sgl0.5.23-py311-wheels-debian12"
DEFAULT_13_1_BUILD_TIMEOUT_S = 2700.0


@pytest.fixture(scope="session")
def default_13_1_image(docker_client: docker.DockerClient, base_image: str,
                       tmp_path_factory: pytest.TempPathFactory) -> str:
    """The id of the default CUDA 13.1 stack's image. An image this engine already has (a main job's) is
    used as it is; otherwise this session builds it with the README's headline command, `stackforge build
    --cuda 13.1`, labelled as this session's, so the sweep at the end of the session removes it again."""
    stack_filter = {"label": f"{STACK_LABEL}={DEFAULT_13_1_STACK}"}
    kept = [image for image in docker_client.images.list(filters=stack_filter)
            if TEST_SESSION_LABEL not in (image.labels or {})]
    if kept:
        return kept[0].id
    out = tmp_path_factory.mktemp("default-13-1-build")
    argv = [sys.executable, "-m", "stackforge", "build", "--cuda", "13.1", "--only", DEFAULT_13_1_STACK,
            "--out", str(out), "--no-progress", "--label", f"{TEST_LABEL}=1",
            "--label", f"{TEST_SESSION_LABEL}={SESSION_ID}"]
    done = runner.run(argv, timeout=DEFAULT_13_1_BUILD_TIMEOUT_S, tail_chars=4000)
    assert done.succeeded, f"stackforge build --cuda 13.1 failed (exit {done.returncode}):\n{done.output_tail}"
    built = docker_client.images.list(filters={"label": [f"{STACK_LABEL}={DEFAULT_13_1_STACK}",
                                                         f"{TEST_SESSION_LABEL}={SESSION_ID}"]})
    assert built, f"stackforge build --cuda 13.1 exited 0 but no image carries {STACK_LABEL}={DEFAULT_13_1_STACK}"
    return built[0].id
