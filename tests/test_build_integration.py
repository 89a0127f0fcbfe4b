"""Real builds on the local engine, through both builders (docker + slow).

The stack (tests/_build_helpers.py ``small_cell``) is small but real: torch 2.13.0+cpu from the
machine's wheelhouse, the CUDA 13.0 toolkit wheels (real nvcc), FlashInfer 0.6.x with its
dependencies from PyPI, SGLang with ``--no-deps`` (its dependency tree is torch 2.9.1 + CUDA kernels,
gigabytes) and no separate kernel package. The base image python:3.11-slim-bookworm cannot be pulled
here, so the bootstrapped stackforge/debian:bookworm stands in, and the record must say so.

Every build passes a CA bundle made of this machine's real bundle (PyPI traffic is re-signed by a
local CA) plus a comment line with a unique marker. pip reads the bundle during the build; the marker
must then appear nowhere: not in ``docker history``, ``docker inspect``, any layer (``docker save``),
the log, the record or the rendered context.

Everything created carries the test session's labels and is removed when the session ends.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import docker.errors
import pytest
from packaging.utils import canonicalize_name
from _build_helpers import SYSTEM_CA, WHEELHOUSE, small_cell, wait_while_running

from stackforge.build import Builder, BuildOptions, BuildStatus, build_stacks, read_record
from stackforge.build.locking import LockMode, lock_path
from stackforge.build.records import record_path
from stackforge.compose.stack_lock import read_stack_lock
from stackforge.core.model import Flavour, Stack
from stackforge.edges import runner
from stackforge.plan.derive import derive, load_tables

pytestmark = [pytest.mark.docker, pytest.mark.slow]

TESTS = Path(__file__).resolve().parent
NO_DEPS = frozenset({"sglang"})


@pytest.fixture(scope="module")
def marker() -> str:
    return f"STACKFORGE-CA-MARKER-{uuid.uuid4().hex}"


@pytest.fixture(scope="module")
def marker_ca(tmp_path_factory: pytest.TempPathFactory, marker: str) -> Path:
    """This machine's real CA bundle with a unique marker line (PEM allows text between blocks)."""
    if not Path(WHEELHOUSE).is_dir() or not Path(SYSTEM_CA).is_file():
        pytest.skip(f"needs the wheelhouse {WHEELHOUSE} and the CA bundle {SYSTEM_CA}")
    path = tmp_path_factory.mktemp("ca") / "bundle.pem"
    path.write_text(f"# {marker}\n" + Path(SYSTEM_CA).read_text())
    return path


@pytest.fixture(scope="module")
def out_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("build-out")


@pytest.fixture(scope="module")
def module_labels() -> dict[str, str]:
    # Same keys and values as the session's test_labels fixture (which is function-scoped).
    from _session import SESSION_ID, TEST_LABEL, TEST_SESSION_LABEL
    return {TEST_LABEL: "1", TEST_SESSION_LABEL: SESSION_ID}


def options_for(out_dir: Path, ca: Path, labels: dict[str, str], **overrides) -> BuildOptions:
    values = dict(find_links=Path(WHEELHOUSE), ca_bundle=ca, out_dir=out_dir, no_deps=NO_DEPS,
                  labels=tuple(sorted(labels.items())), builder=Builder.BUILDX, timeout_s=1800.0)
    values.update(overrides)
    return BuildOptions(**values)


@pytest.fixture(scope="module")
def buildkit_built(docker_client, base_image, out_dir, marker_ca, module_labels):
    """The small stack built from scratch with BuildKit (no layer cache: every RUN uses the CA)."""
    from stackforge.edges.docker_engine import buildx_available
    if not buildx_available():
        pytest.skip("docker buildx is not installed (scripts/setup-engine.sh installs it)")
    options = options_for(out_dir / "buildkit", marker_ca, module_labels, no_cache=True)
    started = time.monotonic()
    summary = build_stacks([small_cell()], options, client=docker_client)
    print(f"\nbuildkit cold build: {time.monotonic() - started:.1f} s, "
          f"image {summary.records[0].image_size} bytes")
    return summary, options


def assert_marker_nowhere(docker_client, marker: str, tag: str, paths: list[Path], tmp_path: Path) -> None:
    """The CA marker is in no image metadata, no layer, no log, record or rendered file."""
    for argv in (["docker", "history", "--no-trunc", tag], ["docker", "inspect", tag]):
        result = runner.run(argv, timeout=120, tail_chars=10_000_000)
        assert result.succeeded and marker not in result.output_tail, argv
    image = docker_client.images.get(tag)
    assert marker not in json.dumps(image.attrs)
    archive = tmp_path / "image.tar"
    saved = runner.run(["docker", "save", "-o", str(archive), tag], timeout=900)
    assert saved.succeeded, saved.output_tail
    try:
        assert archive.stat().st_size > 100_000_000   # really the image, not an empty archive
        assert not _file_contains(archive, marker.encode())
    finally:
        archive.unlink(missing_ok=True)
    for root in paths:
        for path in [root] if root.is_file() else [p for p in root.rglob("*") if p.is_file()]:
            assert not _file_contains(path, marker.encode()), path


def _file_contains(path: Path, needle: bytes, chunk: int = 16 * 1024 * 1024) -> bool:
    """Stream a (large) file and look for ``needle``, also across chunk boundaries."""
    tail = b""
    with path.open("rb") as handle:
        while block := handle.read(chunk):
            if needle in tail + block:
                return True
            tail = block[-len(needle):]
    return False


# --------------------------------------------------------------------------- BuildKit


def test_buildkit_builds_and_records_what_is_inside(buildkit_built, docker_client):
    summary, options = buildkit_built
    record = summary.records[0]
    assert record.status is BuildStatus.BUILT, record.reason
    assert summary.builder == "buildkit" and record.builder == "buildkit"
    # Measured inside the image, not taken from the tag.
    assert record.installed["torch"] == "2.13.0+cpu"
    assert record.installed["flashinfer-python"] == "0.6.6" and record.installed["sglang"] == "0.5.9"
    checks = {c["name"]: c for c in record.verify["checks"]}
    assert record.verify["status"] == "pass", record.verify
    assert checks["nvcc"]["status"] == "pass" and checks["nvcc"]["actual"].startswith("release 13.0")
    assert checks["jit-link"]["status"] == "pass", checks["jit-link"]   # the lib64 layout and libcuda link stub
    assert checks["torch-variant"]["actual"] == "cpu, cuda None"
    assert "--no-deps" in checks["pip-check"]["actual"]
    # The honest base substitution.
    assert record.base.requested == "python:3.11-slim-bookworm"
    assert record.base.used == "stackforge/debian:bookworm" and record.base.how == "substituted"
    labels = docker_client.images.get(record.image_tag).labels
    assert labels["io.stackforge.base.requested"] == "python:3.11-slim-bookworm"
    assert labels["io.stackforge.base.image"] == "stackforge/debian:bookworm"
    assert labels["io.stackforge.content-hash"] == record.content_hash
    assert "torch==2.13.0+cpu" in json.loads(labels["io.stackforge.freeze"])
    assert labels["io.stackforge.no-deps"] == "sglang" and labels["io.stackforge.test"] == "1"
    # The record on disk is the one returned.
    assert read_record(options.out_dir, record.stack_id) == record
    assert set(record.durations) >= {"base", "render", "build", "metadata", "verify"}


def test_buildkit_leaves_the_ca_bundle_nowhere(buildkit_built, docker_client, marker, tmp_path):
    summary, options = buildkit_built
    record = summary.records[0]
    assert record.status is BuildStatus.BUILT
    log = Path(record.log_path).read_text()
    assert "--secret id=ca,src=" in log and "pip install" in log   # the CA was really used by pip
    pip_steps = set(re.findall(r"^#(\d+) \[[^\]]*\] RUN .*pip install", log, flags=re.MULTILINE))
    assert len(pip_steps) == 5   # toolkit, torch, FlashInfer's dependencies, FlashInfer, SGLang
    assert not any(f"#{step} CACHED" in log for step in pip_steps)   # every pip step ran, with the CA
    assert_marker_nowhere(docker_client, marker, record.image_tag,
                          [Path(record.log_path), record_path(options.out_dir, record.stack_id),
                           options.out_dir / "contexts"], tmp_path)


@pytest.fixture(scope="module")
def locked_built(docker_client, base_image, out_dir, marker_ca, module_labels):
    """The small stack built from its lock (resolved on the host first), as `stackforge build` does."""
    from stackforge.edges.docker_engine import buildx_available
    if not buildx_available():
        pytest.skip("docker buildx is not installed (scripts/setup-engine.sh installs it)")
    options = options_for(out_dir / "locked", marker_ca, module_labels, lock=LockMode.RESOLVE)
    started = time.monotonic()
    summary = build_stacks([small_cell()], options, client=docker_client)
    print(f"\nlocked cold build: {time.monotonic() - started:.1f} s ({summary.records[0].durations})")
    return summary, options


def test_a_locked_build_installs_exactly_its_lock_and_says_which(locked_built, docker_client):
    summary, options = locked_built
    record = summary.records[0]
    assert record.status is BuildStatus.BUILT, record.reason
    lock_file = lock_path(options.out_dir, record.stack_id)
    lock = read_stack_lock(lock_file.read_text(), source=str(lock_file))
    assert record.lock_sha256 == lock.sha256() and record.lock_path == str(lock_file)
    assert docker_client.images.get(record.image_tag).labels["io.stackforge.lock.sha256"] == lock.sha256()
    checks = {c["name"]: c for c in record.verify["checks"]}
    assert checks["lock"]["status"] == "pass", checks["lock"]   # pip freeze in the image == the lock
    frozen = {canonicalize_name(name): version for name, _, version in (line.partition("==") for line in record.freeze)}
    frozen.pop("pip")   # the venv's own
    assert frozen == {p.name: p.version for p in lock.venv_packages}
    # No step resolves: every pip install takes a lock file, --no-deps, every file's hash required.
    log = Path(record.log_path).read_text()
    installs = re.findall(r"^#\d+ \[[^\]]*\] RUN .*?pip install[^\n]*", log, flags=re.MULTILINE)
    assert len(installs) == 5, installs   # torch, toolkit, deps, FlashInfer, SGLang
    assert all("--no-deps --require-hashes" in line and "-r /opt/stackforge/lock/" in line for line in installs)
    assert "lock resolved" in log or "lock recorded" in log


def test_a_rebuild_from_the_same_lock_gives_the_same_packages_and_locked_checks_the_index(locked_built,
                                                                                           docker_client):
    summary, options = locked_built
    first = summary.records[0]
    again = build_stacks([small_cell()], dataclasses.replace(options, lock=LockMode.LOCKED), client=docker_client)
    record = again.records[0]
    assert record.status is BuildStatus.CACHED, record.reason
    assert record.lock_sha256 == first.lock_sha256 and sorted(record.freeze) == sorted(first.freeze)
    assert "lock checked" in Path(record.log_path).read_text()


def test_uv_installs_the_lock_as_the_cli_builds_by_default(docker_client, base_image, out_dir, marker_ca,
                                                           module_labels):
    options = options_for(out_dir / "locked-uv", marker_ca, module_labels, lock=LockMode.RESOLVE, installer="uv")
    started = time.monotonic()
    record = build_stacks([small_cell()], options, client=docker_client).records[0]
    print(f"\nlocked uv build: {time.monotonic() - started:.1f} s ({record.durations})")
    assert record.status is BuildStatus.BUILT, record.reason
    checks = {c["name"]: c for c in record.verify["checks"]}
    assert checks["lock"]["status"] == "pass" and checks["pip-check"]["status"] == "pass", checks
    log = Path(record.log_path).read_text()
    installs = re.findall(r"^#\d+ \[[^\]]*\] RUN .*?/opt/stackforge/uv/bin/uv pip install[^\n]*", log, flags=re.MULTILINE)
    assert len(installs) == 5, installs   # torch, toolkit, deps, FlashInfer, SGLang (uv itself: by pip)
    assert all("--no-deps --require-hashes" in line for line in installs)
    assert docker_client.images.get(record.image_tag).labels["io.stackforge.installer"] == "uv"


def test_noop_rebuild_comes_from_the_cache(buildkit_built, docker_client):
    summary, options = buildkit_built
    first = summary.records[0]
    started = time.monotonic()
    again = build_stacks([small_cell()], options_for(options.out_dir, options.ca_bundle, dict(options.labels)),
                         client=docker_client)
    elapsed = time.monotonic() - started
    record = again.records[0]
    print(f"\nbuildkit no-op rebuild: {elapsed:.1f} s ({record.durations})")
    assert record.status is BuildStatus.CACHED, record.reason
    assert record.image_id == first.image_id and elapsed < 20


def test_resume_skips_a_built_stack(buildkit_built, docker_client):
    summary, options = buildkit_built
    resumed = build_stacks([small_cell()], options_for(options.out_dir, options.ca_bundle, dict(options.labels),
                                                       resume=True), client=docker_client)
    record = resumed.records[0]
    assert record.status is BuildStatus.CACHED and "--resume" in record.reason
    log = Path(record.log_path).read_text()
    assert "resume:" in log and "phase build" not in log


def test_a_failing_stack_does_not_stop_a_passing_one(buildkit_built, docker_client):
    summary, options = buildkit_built
    good = small_cell()
    bad = small_cell(flashinfer="0.0.0.99")   # no such FlashInfer on PyPI
    result = build_stacks([bad, good], options_for(options.out_dir, options.ca_bundle, dict(options.labels),
                                                   jobs=2), client=docker_client)
    by_id = {r.stack_id: r for r in result.records}
    assert [r.stack_id for r in result.records] == [bad[0].id, good[0].id]   # input order
    assert by_id[good[0].id].status.ok
    failed = by_id[bad[0].id]
    assert failed.status is BuildStatus.FAILED and failed.phase == "build"
    assert "flashinfer-python==0.0.0.99" in failed.reason, failed.reason
    assert failed.attempts == 1   # a permanent error is not retried
    assert result.failed == (bad[0].id,) and not result.ok
    assert read_record(options.out_dir, bad[0].id).status is BuildStatus.FAILED
    assert "No matching distribution found" in Path(failed.log_path).read_text()


def test_a_missing_base_image_fails_that_stack_only(buildkit_built, docker_client):
    summary, options = buildkit_built
    stack = Stack(cuda="13.0", torch="2.13.0", flashinfer="0.6.6", sglang="0.5.9", python="3.12",
                  flavour=Flavour.DEVEL, torch_variant="cpu")
    cell = (stack, derive(stack, load_tables()))
    result = build_stacks([cell], options_for(options.out_dir, options.ca_bundle, dict(options.labels),
                                              pull_timeout_s=30), client=docker_client)
    record = result.records[0]
    assert record.status is BuildStatus.FAILED and record.phase == "base"
    assert "nvidia/cuda:13.0" in record.reason and "docker pull" in record.reason


# --------------------------------------------------------------------------- Ctrl-C

INTERRUPT_SCRIPT = r"""
import json, sys
from pathlib import Path
sys.path.insert(0, sys.argv[1])
from _build_helpers import small_cell
from stackforge.build import Builder, BuildOptions, build_stacks
from stackforge.edges.docker_engine import connect
from stackforge.core.errors import Interrupted
from stackforge.core.model import Flavour, Stack
from stackforge.plan.derive import derive, load_tables

out, ca, labels = Path(sys.argv[2]), Path(sys.argv[3]), tuple(tuple(p) for p in json.loads(sys.argv[4]))
builder = Builder(sys.argv[5])
fails_fast = Stack(cuda="13.0", torch="2.13.0", flashinfer="0.6.6", sglang="0.5.9", python="3.12",
                   flavour=Flavour.DEVEL, torch_variant="cpu")
options = BuildOptions(find_links=Path("/opt/wheels"), ca_bundle=ca, out_dir=out, no_deps=frozenset({"sglang"}),
                       labels=labels, builder=builder, no_cache=True, jobs=1, pull_timeout_s=30)
try:
    build_stacks([(fails_fast, derive(fails_fast, load_tables())), small_cell(flashinfer="0.6.7")], options,
                 client=connect())
except Interrupted as exc:
    print("INTERRUPTED", exc.one_line(), flush=True)
    sys.exit(exc.exit_code)
sys.exit(0)
"""


@pytest.mark.parametrize("builder", ["buildx", "classic"])
def test_ctrl_c_stops_the_build_and_keeps_finished_records(docker_client, base_image, marker_ca, module_labels,
                                                           tmp_path, builder):
    from stackforge.edges.docker_engine import buildx_available
    if builder == "buildx" and not buildx_available():
        pytest.skip("docker buildx is not installed")
    out = tmp_path / "out"
    slow_id = small_cell(flashinfer="0.6.7")[0].id
    started = time.time()
    process = subprocess.Popen(
        [sys.executable, "-c", INTERRUPT_SCRIPT, str(TESTS), str(out), str(marker_ca),
         json.dumps(sorted(module_labels.items())), builder],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        # one log per run (logs/<stack>.<run-id>.log)
        wait_while_running(lambda: any("pip install" in log.read_text()
                                       for log in (out / "logs").glob(f"{slow_id}.2*.log")), process,
                           timeout=300, what="pip install")
        finished = sorted((out / "builds").glob("*.json"))
        assert len(finished) == 1   # the stack that failed fast at its base image
        before = finished[0].read_bytes()
        os.kill(process.pid, signal.SIGINT)
        output, _ = process.communicate(timeout=120)
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
    assert process.returncode == 130, output
    assert "INTERRUPTED" in output
    assert finished[0].read_bytes() == before   # the finished record is intact
    interrupted = read_record(out, slow_id)
    assert interrupted.status is BuildStatus.INTERRUPTED and interrupted.phase == "build"
    time.sleep(2)
    assert not _processes_mentioning(str(out / "contexts" / slow_id)), "a buildx process survived"
    assert not _processes_mentioning("/stackforge/wheelhouse"), "a build step survived"
    session = module_labels["io.stackforge.test.session"]
    assert docker_client.containers.list(all=True, filters={"label": f"io.stackforge.test.session={session}"}) == []
    # Classic build steps run in unlabelled containers; the engine removes them once the client is gone.
    deadline = time.monotonic() + 60
    while _build_step_containers(docker_client, since=started):
        assert time.monotonic() < deadline, "a classic build step container survived"
        time.sleep(1)
    _remove_unlabelled_step_images(docker_client, since=started)


def _remove_unlabelled_step_images(docker_client, *, since: float) -> None:
    """The classic builder keeps the steps it finished before the interrupt as unlabelled cache images."""
    created_after = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(since))
    for image in docker_client.images.list(all=True, filters={"dangling": True}):
        env = (image.attrs.get("Config") or {}).get("Env") or []
        if "PIP_CONSTRAINT=/opt/stackforge/constraints.txt" in env and image.attrs.get("Created", "") >= created_after:
            try:
                docker_client.images.remove(image.id, force=True)
            except docker.errors.APIError:
                pass   # removed with a child already


def _build_step_containers(docker_client, *, since: float) -> list[str]:
    """Containers created since ``since`` that run a stackforge pip step (wheelhouse from the asset server)."""
    found = []
    for container in docker_client.containers.list(all=True, filters={"status": "running"}) + \
            docker_client.containers.list(all=True, filters={"status": "created"}):
        command = " ".join(container.attrs["Config"].get("Cmd") or [])
        created = container.attrs.get("Created", "")
        if "pip install" in command and "/wheelhouse" in command and created >= time.strftime(
                "%Y-%m-%dT%H:%M:%S", time.gmtime(since)):
            found.append(container.id)
    return found


def _processes_mentioning(text: str) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and int(entry.name) != os.getpid():
            try:
                if text.encode() in (entry / "cmdline").read_bytes():
                    found.append(int(entry.name))
            except OSError:
                continue
    return found


# --------------------------------------------------------------------------- classic builder


def test_classic_builder_builds_the_same_templates_and_leaves_no_ca(docker_client, base_image, out_dir, marker_ca,
                                                                    marker, module_labels, tmp_path):
    options = options_for(out_dir / "classic", marker_ca, module_labels, builder=Builder.CLASSIC, no_cache=True)
    started = time.monotonic()
    summary = build_stacks([small_cell()], options, client=docker_client)
    record = summary.records[0]
    print(f"\nclassic cold build: {time.monotonic() - started:.1f} s, image {record.image_size} bytes")
    assert summary.builder == "classic" and record.status is BuildStatus.BUILT, record.reason
    assert record.verify["status"] == "pass" and record.installed["torch"] == "2.13.0+cpu"
    assert docker_client.images.get(record.image_tag).labels["io.stackforge.builder"] == "classic"
    log = Path(record.log_path).read_text()
    assert "http://127.0.0.1:" in log and "Using cache" not in log   # pip fetched the CA; no step cached
    assert_marker_nowhere(docker_client, marker, record.image_tag,
                          [Path(record.log_path), record_path(options.out_dir, record.stack_id),
                           options.out_dir / "contexts"], tmp_path)
    started = time.monotonic()
    again = build_stacks([small_cell()], options_for(options.out_dir, marker_ca, module_labels,
                                                     builder=Builder.CLASSIC), client=docker_client)
    print(f"classic no-op rebuild: {time.monotonic() - started:.1f} s")
    assert again.records[0].status is BuildStatus.CACHED and again.records[0].image_id == record.image_id


# --------------------------------------------------------------------------- push

from registry_fixture import LocalRegistry, local_registry  # noqa: E402,F401


def test_push_records_the_registry_digest(buildkit_built, docker_client, local_registry: LocalRegistry):  # noqa: F811
    summary, options = buildkit_built
    pushed = build_stacks([small_cell()], options_for(options.out_dir, options.ca_bundle, dict(options.labels),
                                                      push=local_registry.host), client=docker_client)
    record = pushed.records[0]
    assert record.status.ok, record.reason
    repository = f"{local_registry.host}/{record.image_tag.rsplit(':', 1)[0]}"
    assert record.repo_digest is not None and record.repo_digest.startswith(f"{repository}@sha256:")
    assert "push" in record.durations
    assert read_record(options.out_dir, record.stack_id).repo_digest == record.repo_digest
    pulled = runner.run(["docker", "pull", record.repo_digest], timeout=300)
    assert pulled.succeeded, pulled.output_tail
