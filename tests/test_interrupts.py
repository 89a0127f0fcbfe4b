"""Interruptions and a dying engine: real ``stackforge probe`` processes, real containers, real signals.

* SIGTERM, SIGHUP and SIGINT sent to a ``stackforge probe`` process while one probe's container runs
  (a probe that sleeps) and another probe has finished: the process exits 143 / 129 / 130, the run's
  containers are gone, no process of the run is left, the finished record is intact, and the probe
  that was cut short has no record at all (above all, no ``crash``).
* The same with ``--local``: the probe processes stackforge started are stopped too.
* ``stackforge bench`` under SIGTERM (exit 143), or with its container stopped from outside (exit 3):
  its container removed, no record for the cut bench.
* ``stackforge build`` (BuildKit) under SIGHUP while pip runs: exit 129, the buildx process stopped,
  the stack's record says ``interrupted``.
* A dockerd of the test's own (own data root, socket, exec root; the shared engine is never
  touched) is stopped while a probe runs in it: a one-line error and exit 3, no record for the cut
  probe; once that engine is back, the next run removes the container the dead run left.
* ``docker stop`` of a running container from outside: :func:`run_container` raises
  ContainerStoppedByEngine instead of reporting a death by SIGTERM as the program's own ending, and
  also when the program catches SIGTERM and exits 0 (as the serve bench does).
* SIGTERM / SIGHUP inside :func:`runner.signals_as_interrupts` raise Terminated once; a signal
  inherited as ignored (``nohup``) stays ignored.
* Reaping: a container whose owner process is dead is removed; one of a live process, one of
  another host (or another machine of the same name: another boot id, or none), one without owner
  labels and one with an impossible pid label are left alone.
"""

from __future__ import annotations

import dataclasses
import io
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tarfile
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import docker
import pytest
from _session import session_labels

from stackforge.core.errors import ContainerStoppedByEngine, Terminated
from stackforge.core.records import ResultRecord
from stackforge.edges import docker_engine, runner
from stackforge.jobs.job_runner import STACK_ID_LABEL
from stackforge.plan.planner import plan_file

#: Its one stack is labelled onto the sleepy images below. Python 3.12 keeps that stack out of every
#: shipped matrix (test_the_sleepy_stack_is_in_no_shipped_matrix): a sleepy image left by a killed test
#: session can then never be the newest image of a stack that `stackforge probe` runs for real.
MATRIX = """\
schema: 1
targets: [rtx-pro-6000-x8-pcie]
defaults: {python: "3.12", flavour: wheels, os: debian12, cuda: "13.1"}
include:
  - {torch: "2.14.1", flashinfer: "0.7.2", sglang: "0.5.23"}
"""
#: Two gate probes run side by side (-j 2): gate.torch.arch-list finishes at once (the base image
#: has no torch: an honest non-pass), gate.kernels.arch-coverage sleeps (see SLEEPY_PYTHON).
FEATURES = ("--feature", "torch-kernels", "--feature", "kernel-arch-coverage")
FINISHED_PROBE = "gate.torch.arch-list"
CUT_PROBE = "gate.kernels.arch-coverage"
#: Stands in for python3: the kernel-coverage probe and the all-reduce bench sleep; the rest runs for real.
SLEEPY_PYTHON = """#!/bin/sh
case "$1" in *kernel_cubins.py|*allreduce_sweep.py) exec sleep 600;; esac
exec /usr/bin/python3 "$@"
"""
REPO = Path(__file__).resolve().parent.parent
#: ``python -m stackforge`` with Ctrl-C's KeyboardInterrupt back in place: a test session started in
#: the background inherits SIGINT ignored, and Python then leaves it ignored.
WITH_CTRL_C = ("import runpy, signal, sys; signal.signal(signal.SIGINT, signal.default_int_handler); "
               "sys.argv[0] = 'stackforge'; runpy.run_module('stackforge', run_name='__main__')")


def stack_id(matrix: Path) -> str:
    (stack,) = plan_file(matrix).kept_stacks()
    return stack.id


@pytest.fixture
def matrix(tmp_path: Path) -> Path:
    path = tmp_path / "m.yaml"
    path.write_text(MATRIX)
    return path


def test_the_sleepy_stack_is_in_no_shipped_matrix(matrix):
    sleepy = stack_id(matrix)
    shipped = {stack.id for path in sorted((REPO / "matrices").glob("*.yaml")) for stack in plan_file(path).matrix.stacks}
    assert shipped and sleepy not in shipped


def sleepy_image(client: docker.DockerClient, base: str, stack: str) -> str:
    """An image of ``base`` whose python3 sleeps for one probe script, labelled as ``stack``'s image."""
    archive = io.BytesIO()
    with tarfile.open(fileobj=archive, mode="w") as tar:
        data = SLEEPY_PYTHON.encode()
        entry = tarfile.TarInfo("usr/local/bin/python3")
        entry.size, entry.mode = len(data), 0o755
        tar.addfile(entry, io.BytesIO(data))
    container = client.containers.create(base, ["true"], labels=session_labels())
    try:
        container.put_archive("/", archive.getvalue())
        image = container.commit(conf={"Labels": {**session_labels(), STACK_ID_LABEL: stack}})
    finally:
        container.remove(force=True)
    return image.id


def start_probe(matrix: Path, results: Path, *extra: str, env: dict[str, str] | None = None,
                features: tuple[str, ...] = FEATURES) -> subprocess.Popen:
    argv = [sys.executable, "-c", WITH_CTRL_C, "probe", "--matrix", str(matrix), *features, "-j", "2",
            "--timeout", "300", "--results", str(results), *extra]
    return subprocess.Popen(argv, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})})


def records(results: Path) -> dict[str, ResultRecord]:
    """The records of every run under ``results``, by probe id."""
    found = {}
    for path in results.glob("*/*/*/*.json"):
        found[path.stem] = ResultRecord.from_json(json.loads(path.read_text()), path=str(path))
    return found


def wait_for(condition, what: str, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.2)


def descendants(pid: int) -> set[int]:
    """Every live process below ``pid`` (children, grandchildren, ... also in other sessions)."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(ppid, []).append(int(entry.name))
    found, pending = set(), [pid]
    while pending:
        for child in children.get(pending.pop(), []):
            found.add(child)
            pending.append(child)
    return found


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"


def run_containers(client: docker.DockerClient, image_id: str) -> list:
    return client.containers.list(all=True, filters={"ancestor": image_id}, ignore_removed=True)


def assert_cut_probe_left_no_trace(results: Path) -> None:
    found = records(results)
    assert FINISHED_PROBE in found, f"the finished record must be kept: {sorted(found)}"
    assert CUT_PROBE not in found, f"the cut probe must not be recorded: {found.get(CUT_PROBE)}"
    assert all(r.outcome.status.value != "crash" for r in found.values())
    assert not list(results.glob("*/*/*/.*.tmp")), "no half-written record may be left"


@pytest.mark.docker
@pytest.mark.parametrize("signum, code", [(signal.SIGTERM, 143), (signal.SIGHUP, 129), (signal.SIGINT, 130)])
def test_signal_stops_a_probe_run_and_records_only_what_finished(docker_client, base_image, matrix, tmp_path,
                                                                 signum, code):
    image = sleepy_image(docker_client, base_image, stack_id(matrix))
    results = tmp_path / "results"
    process = start_probe(matrix, results)
    try:
        wait_for(lambda: FINISHED_PROBE in records(results) or process.poll() is not None, "the finished probe")
        wait_for(lambda: any(c.status == "running" for c in run_containers(docker_client, image))
                 or process.poll() is not None, "the sleeping probe's container")
        assert process.poll() is None, process.communicate()
        below = descendants(process.pid)
        process.send_signal(signum)
        out, err = process.communicate(timeout=60)
    finally:
        if process.poll() is None:
            process.kill()
    assert_cut_probe_left_no_trace(results)
    assert run_containers(docker_client, image) == [], "every container of the run must be removed"
    assert not [pid for pid in below if alive(pid)], "no process of the run may be left"
    assert process.returncode == code, (out, err)
    assert f"interrupted by {signal.Signals(signum).name}" in err


def test_sighup_stops_local_probe_processes(matrix, tmp_path):
    python = tmp_path / "python3"
    python.write_text(SLEEPY_PYTHON.replace("/usr/bin/python3", sys.executable))
    python.chmod(0o755)
    results = tmp_path / "results"
    process = start_probe(matrix, results, "--local", "--python", str(python))
    try:
        wait_for(lambda: FINISHED_PROBE in records(results) or process.poll() is not None, "the finished probe")

        def sleeping() -> list[int]:
            return [p for p in descendants(process.pid) if Path(f"/proc/{p}/cmdline").read_bytes().startswith(b"sleep\0")]

        wait_for(lambda: sleeping() or process.poll() is not None, "the sleeping probe process")
        assert process.poll() is None, process.communicate()
        below = descendants(process.pid)
        process.send_signal(signal.SIGHUP)
        out, err = process.communicate(timeout=60)
    finally:
        if process.poll() is None:
            process.kill()
    assert process.returncode == 129, (out, err)
    assert not [pid for pid in below if alive(pid)], "the probe processes must be stopped"
    assert_cut_probe_left_no_trace(results)


@pytest.mark.docker
@pytest.mark.parametrize("how, code", [("sigterm", 143), ("docker-stop", 3)])
def test_a_bench_cut_short_is_not_recorded(docker_client, base_image, matrix, tmp_path, how, code):
    """SIGTERM to stackforge, or `docker stop` of its container from outside: no record either way."""
    image = sleepy_image(docker_client, base_image, stack_id(matrix))
    results = tmp_path / "results"
    argv = [sys.executable, "-m", "stackforge", "bench", "--matrix", str(matrix), "--bench", "bench.allreduce.gloo",
            "--timeout", "300", "--results", str(results)]
    process = subprocess.Popen(argv, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        wait_for(lambda: any(c.status == "running" for c in run_containers(docker_client, image))
                 or process.poll() is not None, "the sleeping bench's container")
        assert process.poll() is None, process.communicate()
        if how == "sigterm":
            process.send_signal(signal.SIGTERM)
        else:
            subprocess.run(["docker", "stop", "-t", "1", *[c.id for c in run_containers(docker_client, image)]],
                           check=True, capture_output=True)
        out, err = process.communicate(timeout=60)
    finally:
        if process.poll() is None:
            process.kill()
    assert records(results) == {}, "the cut bench must not be recorded"
    assert run_containers(docker_client, image) == []
    assert process.returncode == code, (out, err)
    if how == "docker-stop":
        assert "stopped container" in err and "from outside (SIGTERM)" in err, err


BUILD_MATRIX = """\
schema: 1
targets: [rtx-pro-6000-x8-pcie]
defaults: {python: "3.11", flavour: wheels, os: debian12}
include:
  - {cuda: "13.1", torch: "2.13.0", flashinfer: "0.6.17", sglang: "0.5.18", torch_variant: cpu}
"""


@pytest.mark.docker
@pytest.mark.slow
def test_sighup_stops_a_build_and_records_it_interrupted(docker_client, base_image, tmp_path):
    from _build_helpers import SYSTEM_CA, WHEELHOUSE

    from stackforge.build.records import BuildStatus, read_record
    if not docker_engine.buildx_available():
        pytest.skip("docker buildx is not installed")
    if not Path(WHEELHOUSE).is_dir() or not Path(SYSTEM_CA).is_file():
        pytest.skip(f"needs the wheelhouse {WHEELHOUSE} and {SYSTEM_CA}")
    matrix = tmp_path / "b.yaml"
    matrix.write_text(BUILD_MATRIX)
    (stack,) = plan_file(matrix).kept_stacks()
    out = tmp_path / "out"
    labels = [arg for key, value in session_labels().items() for arg in ("--label", f"{key}={value}")]
    argv = [sys.executable, "-m", "stackforge", "build", "--matrix", str(matrix), "--builder", "buildx",
            "--find-links", WHEELHOUSE, "--ca-bundle", SYSTEM_CA, "--no-deps", "sglang", "--no-dependency-layers",
            "--out", str(out), "--no-progress", *labels]
    process = subprocess.Popen(argv, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    logs = out / "logs"   # one log per run: <stack>.<run-id>.log
    try:
        wait_for(lambda: any("pip install" in log.read_text() for log in logs.glob(f"{stack.id}.2*.log"))
                 or process.poll() is not None,
                 "pip running in the build", timeout=300)
        assert process.poll() is None, process.communicate()
        below = descendants(process.pid)
        assert below, "buildx runs as a child process"
        process.send_signal(signal.SIGHUP)
        out_text, err = process.communicate(timeout=120)
    finally:
        if process.poll() is None:
            process.kill()
    assert process.returncode == 129, (out_text, err)
    assert not [pid for pid in below if alive(pid)], "the buildx process must be stopped"
    record = read_record(out, stack.id)
    assert record is not None and record.status is BuildStatus.INTERRUPTED, record


@pytest.mark.docker
def test_a_container_stopped_from_outside_is_no_result(docker_client, base_image, test_labels):
    marker = {**test_labels, "io.stackforge.test.stopped-outside": os.urandom(4).hex()}
    selector = "io.stackforge.test.stopped-outside=" + marker["io.stackforge.test.stopped-outside"]

    def stop_from_outside() -> None:
        wait_for(lambda: docker_client.containers.list(filters={"label": selector}), "the container", timeout=60)
        subprocess.run(["docker", "stop", "-t", "1", *[c.id for c in docker_client.containers.list(
            filters={"label": selector})]], check=True, capture_output=True)

    stopper = threading.Thread(target=stop_from_outside)
    stopper.start()
    with pytest.raises(ContainerStoppedByEngine, match=r"stopped container .* from outside \(SIGTERM\)"):
        docker_engine.run_container(docker_client, base_image, ["sleep", "60"], timeout=120, labels=marker)
    stopper.join()
    assert docker_client.containers.list(all=True, filters={"label": selector}) == []


@pytest.mark.docker
def test_a_container_that_exits_0_when_stopped_from_outside_is_no_result(docker_client, base_image, test_labels):
    # Like bench/scripts/serve.py: SIGTERM is caught, a result line printed, and the program exits 0.
    marker = {**test_labels, "io.stackforge.test.stopped-outside": os.urandom(4).hex()}
    selector = "io.stackforge.test.stopped-outside=" + marker["io.stackforge.test.stopped-outside"]
    program = "trap 'echo RESULT error; exit 0' TERM; echo ready; sleep 60 & wait"

    def stop_from_outside() -> None:
        def ready() -> list:
            return [c for c in docker_client.containers.list(filters={"label": selector}) if b"ready" in c.logs()]
        wait_for(ready, "the container's trap", timeout=60)
        subprocess.run(["docker", "stop", "-t", "10", *[c.id for c in ready()]], check=True, capture_output=True)

    stopper = threading.Thread(target=stop_from_outside)
    stopper.start()
    try:
        with pytest.raises(ContainerStoppedByEngine, match=r"stopped container .* from outside \(SIGTERM\)"):
            docker_engine.run_container(docker_client, base_image, ["sh", "-c", program], timeout=120,
                                        labels=marker)
    finally:
        stopper.join()
    assert docker_client.containers.list(all=True, filters={"label": selector}) == []


# ------------------------------------------------------------------------------------- reaping


def dead_pid() -> int:
    process = subprocess.Popen(["true"])
    process.wait()
    return process.pid


@pytest.mark.docker
def test_reap_removes_containers_of_dead_runs_only(docker_client, base_image):
    here = docker_engine.this_process()
    dead_here = docker_engine.Owner(here.host, dead_pid(), here.identity.rpartition(":")[0] + ":1", here.boot)
    owners = {
        "dead": dead_here,
        "live": here,
        "other-host": docker_engine.Owner(f"not-{here.host}", dead_pid()),
        # Same host name and (initial) pid namespace, another machine on the same remote engine.
        "other-machine": dataclasses.replace(dead_here, boot=f"not-{here.boot}"),
        "no-boot-id": dataclasses.replace(dead_here, boot=""),
    }
    made = {name: docker_client.containers.create(
        base_image, ["true"], labels={**session_labels(), docker_engine.MANAGED_LABEL: "true",
                                      docker_engine.RUN_LABEL: f"test-reap-{name}", **owner.labels()})
        for name, owner in owners.items()}
    made["no-owner"] = docker_client.containers.create(
        base_image, ["true"], labels={**session_labels(), docker_engine.MANAGED_LABEL: "true"})
    # A hand-made pid label no process can have (os.kill would raise OverflowError on it).
    made["huge-pid"] = docker_client.containers.create(
        base_image, ["true"], labels={**session_labels(), docker_engine.MANAGED_LABEL: "true",
                                      **dead_here.labels(), docker_engine.PID_LABEL: "99999999999999999999"})
    try:
        orphans = docker_engine.reap_orphans(docker_client)
        left = {c.id for c in docker_client.containers.list(all=True, filters={"label": docker_engine.MANAGED_LABEL},
                                                             sparse=True)}
        assert made["dead"].id not in left and made["dead"].id in orphans.containers
        assert "test-reap-dead" in orphans.runs and "test-reap-dead" in orphans.describe()
        assert {made[name].id for name in ("live", "other-host", "other-machine", "no-boot-id", "no-owner",
                                           "huge-pid")} <= left
    finally:
        for container in made.values():
            docker_engine._remove_quietly(container)


def test_sigterm_and_sighup_raise_terminated_once():
    previous = signal.getsignal(signal.SIGTERM)
    with runner.signals_as_interrupts():
        with pytest.raises(Terminated) as raised:
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(5)   # the handler runs at the next bytecode; never reached
        assert raised.value.signum == signal.SIGTERM
        os.kill(os.getpid(), signal.SIGHUP)   # the second one must not cut the cleanup short
        time.sleep(0.1)
    assert signal.getsignal(signal.SIGTERM) == previous


def test_a_signal_a_worker_thread_receives_still_stops_the_run(tmp_path):
    """The kernel hands a process-directed SIGTERM to any thread, often a job's worker blocked in a
    read; Python then runs the handler only when the main thread runs. The job loop must still stop
    at once (not when the job ends by itself), with the job's process stopped and no record."""
    from _build_helpers import small_cell

    from stackforge.core.model import Interconnect, Target
    from stackforge.edges.gpus import HostGpus
    from stackforge.jobs.campaign import CellJob
    from stackforge.probes.campaign import run_probe_jobs
    from stackforge.probes.catalog import ProbeSpec

    pid_file = tmp_path / "pid"
    (tmp_path / "sleep.py").write_text(
        f"import os, time\nopen({str(pid_file)!r}, 'w').write(str(os.getpid()))\ntime.sleep(600)\n")
    spec = ProbeSpec(id="t.gate.sleep", feature="torch-kernels", tier="gate", script="sleep.py",
                     description="sleeps until stopped")
    target = Target(name="rtx-x2", gpu="NVIDIA RTX PRO 6000 Blackwell", arch="12.0", gpu_count=2,
                    interconnect=Interconnect.PCIE)
    job_timeout_s = 60.0

    def signal_the_worker() -> None:
        wait_for(lambda: pid_file.exists() and pid_file.read_text(), "the sleeping job", timeout=30)
        (worker,) = [t for t in threading.enumerate() if t.name.startswith("sf-job")]
        signal.pthread_kill(worker.ident, signal.SIGTERM)

    sender = threading.Thread(target=signal_the_worker, daemon=True)
    written: list = []
    started = time.monotonic()
    with runner.signals_as_interrupts(), pytest.raises(Terminated):
        sender.start()
        run_probe_jobs([CellJob(small_cell()[0], target, spec)], run_id="t", host_gpus=HostGpus(False, "none"),
                       write=written.append, local_python=sys.executable, scripts_dir=tmp_path, timeout_s=job_timeout_s)
    elapsed = time.monotonic() - started
    sender.join(timeout=5)
    assert elapsed < job_timeout_s / 2, f"the run stopped only after {elapsed:.0f} s, when its job ended by itself"
    assert written == [], "the cut job must not be recorded"
    assert not alive(int(pid_file.read_text())), "the job's process must be stopped"


def test_an_ignored_sighup_stays_ignored():
    previous = signal.signal(signal.SIGHUP, signal.SIG_IGN)
    try:
        with runner.signals_as_interrupts():
            os.kill(os.getpid(), signal.SIGHUP)
            time.sleep(0.1)
            assert signal.getsignal(signal.SIGHUP) is signal.SIG_IGN
    finally:
        signal.signal(signal.SIGHUP, previous)


def test_pid_reuse_counts_as_gone():
    here = docker_engine.this_process()
    namespace = here.identity.rpartition(":")[0]
    assert not docker_engine.owner_is_gone(here, here)
    assert docker_engine.owner_is_gone(docker_engine.Owner(here.host, here.pid, f"{namespace}:1", here.boot), here)
    other_namespace = docker_engine.Owner(here.host, dead_pid(), "pid:[1]:1", here.boot)
    assert not docker_engine.owner_is_gone(other_namespace, here)


def test_owners_of_other_machines_and_unusable_pids_are_not_judged():
    here = docker_engine.this_process()
    assert here.boot, "this machine has a boot id"
    dead = docker_engine.Owner(here.host, dead_pid(), here.identity.rpartition(":")[0] + ":1", here.boot)
    assert docker_engine.owner_is_gone(dead, here)
    assert not docker_engine.owner_is_gone(dataclasses.replace(dead, boot="another-machine"), here)
    assert not docker_engine.owner_is_gone(dataclasses.replace(dead, boot=""), here)
    for pid in ("99999999999999999999", "0", "\u00b2", "-1", str(2 ** 40)):
        labels = {**dead.labels(), docker_engine.PID_LABEL: pid}
        assert docker_engine.Owner.from_labels(labels) is None, pid
    assert docker_engine.Owner.from_labels(dead.labels()) == dead


def test_a_killed_owner_not_yet_collected_counts_as_gone():
    # A stackforge killed by SIGKILL stays a zombie until its parent collects it (or forever, under
    # an init that does not): its containers are orphans all the same.
    zombie = subprocess.Popen(["sleep", "60"])
    try:
        owner = docker_engine.Owner(socket.gethostname(), zombie.pid, docker_engine.process_identity(zombie.pid),
                                    docker_engine.boot_id())
        assert not docker_engine.owner_is_gone(owner, docker_engine.this_process())
        os.kill(zombie.pid, signal.SIGKILL)
        wait_for(lambda: Path(f"/proc/{zombie.pid}/stat").read_text().rpartition(")")[2].split()[0] == "Z",
                 "the zombie", timeout=10)
        assert docker_engine.owner_is_gone(owner, docker_engine.this_process())
    finally:
        zombie.kill()
        zombie.wait()


# ------------------------------------------------------------------------------- a dying engine


class OwnEngine:
    """A dockerd of this test's own: own data root, exec root, socket and pid file; no bridge."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.socket = root / "docker.sock"
        self.url = f"unix://{self.socket}"
        self.process: subprocess.Popen | None = None

    def start(self) -> None:
        with open(self.root / "dockerd.log", "a") as log:   # the child keeps its own copy of the descriptor
            self.process = subprocess.Popen(
                ["dockerd", "--data-root", str(self.root / "data"), "--exec-root", str(self.root / "exec"),
                 "-H", self.url, "--pidfile", str(self.root / "docker.pid"), "--bridge=none", "--iptables=false",
                 "--ip-masq=false", "--containerd-namespace", "sftest",
                 "--containerd-plugins-namespace", "sftest-plugins"],
                stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        wait_for(lambda: self.answers() or self.process.poll() is not None, "the test's own dockerd", timeout=60)
        assert self.process.poll() is None, (self.root / "dockerd.log").read_text()[-2000:]

    def answers(self) -> bool:
        if not self.socket.exists():
            return False
        try:
            docker.DockerClient(base_url=self.url, timeout=5).ping()
        except Exception:  # noqa: BLE001 - not up yet
            return False
        return True

    def client(self) -> docker.DockerClient:
        return docker.DockerClient(base_url=self.url, timeout=120)

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            self.process.wait(timeout=60)


@pytest.fixture
def own_engine(docker_client, base_image) -> Iterator[OwnEngine]:
    if shutil.which("dockerd") is None:
        pytest.skip("needs the dockerd binary to start an engine of the test's own")
    # A short path: a unix socket path must stay under 108 bytes.
    root = Path(tempfile.mkdtemp(prefix="sf-engine-"))
    engine = OwnEngine(root)
    try:
        engine.start()
        saved = subprocess.Popen(["docker", "save", base_image], stdout=subprocess.PIPE)
        loaded = subprocess.run(["docker", "-H", engine.url, "load"], stdin=saved.stdout, capture_output=True,
                                timeout=300, check=False)
        saved.wait(timeout=60)
        assert loaded.returncode == 0, loaded.stderr
        yield engine
    finally:
        engine.stop()
        unmount_below(root)
        shutil.rmtree(root, ignore_errors=True)


def unmount_below(root: Path) -> None:
    """Unmount what dockerd left mounted under ``root`` (its network namespace file, for one), deepest first."""
    points = [line.split()[1] for line in Path("/proc/self/mounts").read_text().splitlines()]
    for point in sorted((p for p in points if p.startswith(f"{root}/")), key=len, reverse=True):
        subprocess.run(["umount", "-l", point], capture_output=True, check=False)


@pytest.mark.docker
def test_engine_stopping_mid_probe_exits_3_and_the_next_run_reaps(own_engine, matrix, tmp_path):
    client = own_engine.client()
    image = sleepy_image(client, docker_engine_base(client), stack_id(matrix))
    results = tmp_path / "results"
    env = {"DOCKER_HOST": own_engine.url}
    process = start_probe(matrix, results, env=env)
    try:
        wait_for(lambda: FINISHED_PROBE in records(results) or process.poll() is not None, "the finished probe")
        wait_for(lambda: any(c.status == "running" for c in run_containers(client, image))
                 or process.poll() is not None, "the sleeping probe's container")
        assert process.poll() is None, process.communicate()
        own_engine.stop()
        out, err = process.communicate(timeout=120)
    finally:
        if process.poll() is None:
            process.kill()
    assert process.returncode == 3, (out, err)
    lines = [line for line in err.splitlines() if line.startswith("stackforge: error:")]
    assert len(lines) == 1 and ("Docker engine" in lines[0]), err
    assert_cut_probe_left_no_trace(results)

    own_engine.start()
    client = own_engine.client()
    left = run_containers(client, image)
    assert left, "the stopped engine kept the container of the dead run (what the next run must reap)"
    process = start_probe(matrix, tmp_path / "again", env=env, features=("--feature", "torch-kernels"))
    out, err = process.communicate(timeout=300)
    assert f"removed {len(left)} container(s) left by run(s)" in err, (out, err)
    assert run_containers(client, image) == []


def docker_engine_base(client: docker.DockerClient) -> str:
    from stackforge.edges.bootstrap import DEFAULT_REF
    return client.images.get(DEFAULT_REF).id
