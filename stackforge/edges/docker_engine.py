"""The Docker SDK edge: connect to an engine, run containers safely, clean up what stackforge made.

This module is the container half of stackforge's one choke point (host processes are the other half,
in :mod:`stackforge.edges.runner`). Every container stackforge starts goes through :func:`run_container`,
which guarantees a timeout, labels that identify it, host networking, and removal afterwards, even on
Ctrl-C. Everything that can be cleaned up carries :data:`MANAGED_LABEL`, so :func:`remove_labelled` can
sweep up after an interrupted run.

A run that could not clean up (stackforge killed by SIGKILL, the engine restarted under it) leaves
containers behind; each names its owner process (:data:`HOST_LABEL`, :data:`PID_LABEL`,
:data:`PROCESS_LABEL`, :data:`BOOT_LABEL`), and :func:`reap_orphans` removes those whose owner is gone
at the start of the next run. A container the engine itself stopped (shutdown, ``docker stop`` from
outside) raises :class:`~stackforge.core.errors.ContainerStoppedByEngine` instead of reporting an ending its
program chose.
"""

from __future__ import annotations

import io
import os
import re
import socket
import tarfile
import threading
import time
import urllib.parse
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path, PurePosixPath
from typing import Any

import docker
import docker.errors
import docker.types
import requests.exceptions

from stackforge.core.errors import CommandError, ContainerStoppedByEngine, DockerUnavailableError, HostError
from stackforge.edges import runner
from stackforge.edges.registry import is_loopback_host

#: Prefix of every label stackforge puts on images and containers.
LABEL_PREFIX = "io.stackforge"
#: Marks objects stackforge created and may remove (value "true").
MANAGED_LABEL = f"{LABEL_PREFIX}.managed"
#: Identifies one stackforge invocation, so an interrupted run can remove exactly its own containers.
RUN_LABEL = f"{LABEL_PREFIX}.run"
#: The owner of a container: the host name, the process id, that process's identity (its pid
#: namespace and start time, so that a reused pid or a process in another namespace is not mistaken
#: for the owner) and the machine's boot id (host names and the initial pid namespace repeat across
#: machines sharing one remote engine). Set on every container by :func:`run_container`; read by
#: :func:`reap_orphans`.
HOST_LABEL = f"{LABEL_PREFIX}.host"
PID_LABEL = f"{LABEL_PREFIX}.pid"
PROCESS_LABEL = f"{LABEL_PREFIX}.process"
BOOT_LABEL = f"{LABEL_PREFIX}.boot"
#: Linux never hands out a pid above this (PID_MAX_LIMIT on 64-bit); a larger label names no process.
_PID_MAX = 4 * 1024 * 1024

#: Where docker-py and the CLI look when DOCKER_HOST is unset.
DEFAULT_DOCKER_HOST = "unix:///var/run/docker.sock"
START_ENGINE_REMEDY = "start one: sudo scripts/setup-engine.sh (or set DOCKER_HOST)"
# Unix exit statuses above 128 mean "killed by signal (status - 128)"; 64 covers every Linux signal.
_SIGNAL_EXIT_BASE = 128
_MAX_SIGNAL = 64
# Slice length of a container wait when a cancel flag must be watched.
_CANCEL_POLL_S = 1.0
# RFC 3339 with nanoseconds, as the engine writes times: seconds, fraction, zone.
_ENGINE_TIME = re.compile(r"(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d)(?:\.(\d+))?(Z|[+-]\d\d:\d\d)")


@dataclass(frozen=True, slots=True)
class Bind:
    """A host path mounted into a container; read-only unless said otherwise.

    ``copy_to_remote``: when the engine runs on another machine (``DOCKER_HOST=tcp://`` or
    ``ssh://`` to a remote host) a bind mount would name a path on THAT machine, so a small folder
    such as the probe scripts is copied into the container before it starts instead (files
    0444, folders 0555). Large inputs (a model directory) keep ``False``: they must already exist at
    the same path on the engine's machine.
    """

    source: Path
    target: str
    read_only: bool = True
    copy_to_remote: bool = False


@dataclass(frozen=True, slots=True)
class ContainerExit:
    """How a container ended (its exit). Never an exception: the caller decides what it means.

    Attributes:
        exit_code: the container's exit status (137 / 143 after a kill at the timeout).
        timed_out: True when stackforge stopped the container because it ran past its timeout.
        signal: the signal that ended the main process (exit status 128+N -> N), or None.
        logs_tail: the last ``tail_chars`` characters of combined stdout+stderr, redacted.
        duration_s: wall-clock seconds from start to exit.
        oom_killed: True when the kernel's OOM killer ended the container.
        cancelled: True when stackforge stopped the container because its cancel flag was set.
    """

    exit_code: int
    timed_out: bool
    signal: int | None
    logs_tail: str
    duration_s: float
    oom_killed: bool
    cancelled: bool = False

    @property
    def succeeded(self) -> bool:
        """True when the container exited with status 0 within its timeout."""
        return self.exit_code == 0 and not self.timed_out and not self.cancelled

    def describe(self) -> str:
        """A short human phrase for how the container ended, e.g. ``killed by SIGSEGV``."""
        ending = runner.describe_ending(self.exit_code, self.signal, self.timed_out, self.duration_s,
                                        self.cancelled)
        return f"{ending} (out of memory)" if self.oom_killed else ending


@dataclass(frozen=True, slots=True)
class Owner:
    """The process that created a container, as its labels name it (see :func:`this_process`)."""

    host: str
    pid: int
    identity: str = ""   # "<pid namespace>:<start time>" on Linux, "" where /proc is missing
    boot: str = ""       # the machine's boot id (see :func:`boot_id`), "" where it cannot be read

    def labels(self) -> dict[str, str]:
        return {HOST_LABEL: self.host, PID_LABEL: str(self.pid), PROCESS_LABEL: self.identity,
                BOOT_LABEL: self.boot}

    @classmethod
    def from_labels(cls, labels: Mapping[str, str]) -> Owner | None:
        """The owner named by a container's labels; None when they name none (older stackforge) or
        no process could have the pid they name (a hand-made label): such containers are left alone."""
        pid = labels.get(PID_LABEL, "")
        usable_pid = pid.isascii() and pid.isdigit() and 0 < int(pid) <= _PID_MAX
        if not labels.get(HOST_LABEL) or not usable_pid:
            return None
        return cls(labels[HOST_LABEL], int(pid), labels.get(PROCESS_LABEL, ""), labels.get(BOOT_LABEL, ""))


@dataclass(frozen=True, slots=True)
class Orphans:
    """What :func:`reap_orphans` removed: container ids and the runs they belonged to."""

    containers: tuple[str, ...]
    runs: tuple[str, ...]

    def describe(self) -> str:
        """One line for the terminal, e.g. ``removed 4 container(s) left by run(s) R (owner process gone)``."""
        return (f"removed {len(self.containers)} container(s) left by run(s) {', '.join(self.runs) or '?'} "
                f"whose stackforge process is gone")


@dataclass(frozen=True, slots=True)
class Removed:
    """Ids of what :func:`remove_labelled` removed."""

    containers: tuple[str, ...]
    images: tuple[str, ...]


def engine_url() -> str:
    """The engine address the SDK will use: DOCKER_HOST, or the default local socket."""
    return os.environ.get("DOCKER_HOST") or DEFAULT_DOCKER_HOST


def engine_shares_host_files(url: str) -> bool:
    """Whether a bind-mount source on this machine is also a path the engine sees: a unix socket or
    named pipe, or TCP to this machine's loopback. ``ssh://`` and TCP to another host do not."""
    if url.startswith(("unix://", "npipe://")):
        return True
    address = urllib.parse.urlsplit(url.replace("tcp://", "http://", 1)).netloc.rpartition("@")[2]
    return is_loopback_host(address)


def connect(*, timeout: float = 10.0, api_timeout: float = 120.0) -> docker.DockerClient:
    """A client for the engine at DOCKER_HOST (or the local socket), checked with a ping.

    Args:
        timeout: seconds to wait for the engine to answer the first request.
        api_timeout: per-request timeout for later calls (removing a big image takes a while).

    Raises:
        DockerUnavailableError: no engine answers; the message is one line with the reason.
    """
    url = engine_url()
    missing = _missing_socket(url)
    if missing is not None:
        raise DockerUnavailableError(f"no Docker engine answers at {url}: socket {missing} does not exist",
                                     remedy=START_ENGINE_REMEDY)
    try:
        # from_env reads DOCKER_HOST / DOCKER_TLS_VERIFY / DOCKER_CERT_PATH and asks the engine's version.
        client = docker.DockerClient.from_env(timeout=max(1, round(timeout)))
    except docker.errors.DockerException as exc:
        raise _unavailable(url, exc) from None
    try:
        client.ping()
    except (docker.errors.DockerException, requests.exceptions.RequestException) as exc:
        client.close()
        raise _unavailable(url, exc) from None
    client.api.timeout = api_timeout
    return client


def run_container(
    client: docker.DockerClient,
    image: str,
    command: Sequence[str],
    *,
    timeout: float,
    mounts: Sequence[Bind] | Mapping[str | os.PathLike[str], str] = (),
    env: Mapping[str, str] | None = None,
    labels: Mapping[str, str] | None = None,
    network_mode: str = "host",
    ipc_mode: str | None = None,
    shm_size: str | None = None,
    gpus: str | None = None,
    name: str | None = None,
    init: bool = True,
    log_path: Path | None = None,
    tail_chars: int = 8000,
    redact: Sequence[str] = (),
    grace: float = runner.DEFAULT_KILL_GRACE_S,
    cancel: runner.CancelFlag | None = None,
    copy_binds: bool | None = None,
) -> ContainerExit:
    """Create, start and wait for a container; stop it at the timeout; always remove it.

    Args:
        client: from :func:`connect`.
        image: image reference or id; it must exist locally (nothing is ever pulled).
        command: argv run in the container (no shell unless you pass one).
        timeout: seconds before the container is stopped (SIGTERM, ``grace``, SIGKILL).
        mounts: :class:`Bind` objects, or a mapping of host path -> container path (read-only).
        env: environment variables for the container.
        labels: extra labels; :data:`MANAGED_LABEL` is always added.
        network_mode: ``host`` by default: development machines run the engine without a bridge.
        ipc_mode: e.g. ``host`` for NCCL; None keeps the engine default.
        shm_size: e.g. ``16g`` for NCCL / PyTorch data loaders.
        gpus: like ``docker run --gpus``: ``all``, a count (``2``) or ``device=0,1``.
        name: container name; default is an engine-chosen one.
        init: run an init process (tini) as PID 1, so signals reach the command, zombies are
            reaped, and a crash by signal N shows up as exit status 128+N.
        log_path: file that receives the container's output (appended, live).
        tail_chars: how many characters of output to keep in :attr:`ContainerExit.logs_tail`.
        redact: secret strings replaced by ``***`` in the log and the tail.
        grace: seconds between SIGTERM and SIGKILL when stopping at the timeout.
        cancel: when this flag (e.g. a :class:`threading.Event`) becomes set by another thread, the
            container is stopped like at a timeout and the result says ``cancelled``.
        copy_binds: copy the ``copy_to_remote`` mounts into the container instead of binding them;
            None decides from DOCKER_HOST (:func:`engine_shares_host_files`).

    Raises:
        HostError: a mount source is missing, or GPUs were asked for but the engine has no GPU runtime.
        CommandError: the engine refused to create or start the container (e.g. image not found).
        DockerUnavailableError: the engine stopped answering.
        KeyboardInterrupt: re-raised after the container has been removed.
    """
    if isinstance(command, (str, bytes)) or not command:
        raise TypeError("command must be a non-empty sequence of arguments, not a string")
    if not timeout > 0:
        raise ValueError(f"timeout must be positive, got {timeout!r}")
    if copy_binds is None:
        copy_binds = not engine_shares_host_files(engine_url())
    bound, copied = _split_mounts(_as_binds(mounts), copy_binds)
    create_args = _create_args(image, command, mounts=bound, env=env, labels=labels,
                               network_mode=network_mode, ipc_mode=ipc_mode, shm_size=shm_size,
                               gpus=gpus, name=name, init=init)
    archives = [_folder_archive(bind) for bind in copied]  # before create: a bad source leaves nothing behind
    container = _create(client, image, gpus, create_args)
    try:
        for bind, archive in zip(copied, archives):
            _copy_into(container, bind, archive, image, command)
        with runner.open_log(log_path) as log:
            capture = runner.OutputCapture(tail_chars=tail_chars, redact=redact, log=log)
            runner.write_log(log, f"$ docker run {image} {runner.format_argv(command, redact)}\n")
            return _start_and_wait(client, container, capture, log, image=image, gpus=gpus, command=command,
                                   timeout=timeout, grace=grace, cancel=cancel)
    except requests.exceptions.RequestException as exc:
        raise _unavailable(engine_url(), exc) from None
    finally:
        _remove_quietly(container)


@contextmanager
def idle_container(client: docker.DockerClient, image: str, *, lifetime_s: float,
                   labels: Mapping[str, str] | None = None, network_mode: str = "host") -> Iterator[str]:
    """A container idling in ``image`` for commands run into it (``docker exec``, testinfra); its id.

    Labelled like every container :func:`run_container` makes (managed, owner), so a run that dies
    leaves it to :func:`reap_orphans`; it sleeps ``lifetime_s`` and then ends by itself, and it is
    force-removed when the block ends.

    Raises:
        CommandError: the engine could not create or start it (e.g. image not found).
        DockerUnavailableError: the engine stopped answering.
    """
    if not lifetime_s > 0:
        raise ValueError(f"lifetime_s must be positive, got {lifetime_s!r}")
    command = ["sleep", str(int(lifetime_s))]
    container = _create(client, image, None, _create_args(
        image, command, mounts=(), env=None, labels=labels, network_mode=network_mode, ipc_mode=None,
        shm_size=None, gpus=None, name=None, init=True))
    try:
        try:
            container.start()
        except docker.errors.APIError as exc:
            raise _api_error("start", image, None, exc, command) from None
        except requests.exceptions.RequestException as exc:
            raise _unavailable(engine_url(), exc) from None
        yield container.id
    finally:
        _remove_quietly(container)


def remove_labelled(client: docker.DockerClient, label_selector: str) -> Removed:
    """Force-remove every container, then every image, that matches a label selector.

    Args:
        label_selector: ``key`` or ``key=value``, e.g. ``io.stackforge.test=1`` or
            ``io.stackforge.run=<id>``.

    Returns:
        The ids removed. Images still used by a container that is not selected are left alone.
    """
    containers = client.containers.list(all=True, filters={"label": label_selector})
    for container in containers:
        _remove_quietly(container)
    return Removed(tuple(c.id for c in containers), _remove_images(client, label_selector))


def remove_run_containers(client: docker.DockerClient, run_id: str) -> None:
    """Best effort: force-remove the containers of one run while it is being interrupted.

    An engine that stopped answering is not an error here: the error that ends the run says so, and
    :func:`reap_orphans` removes what is left once the engine is back.
    """
    try:
        for container in client.containers.list(all=True, filters={"label": f"{RUN_LABEL}={run_id}"},
                                                ignore_removed=True):
            _remove_quietly(container)
    except (docker.errors.DockerException, requests.exceptions.RequestException):
        pass


def this_process() -> Owner:
    """The :class:`Owner` labels of containers started by this process."""
    return Owner(socket.gethostname(), os.getpid(), process_identity(os.getpid()), boot_id())


def boot_id() -> str:
    """This machine's boot id (the kernel's, else systemd's machine id); "" when neither can be read."""
    for path in ("/proc/sys/kernel/random/boot_id", "/etc/machine-id"):
        try:
            found = Path(path).read_text().strip()
        except OSError:
            continue
        if found:
            return found
    return ""


def process_identity(pid: int) -> str:
    """``"<pid namespace>:<start time>"`` of a process on this host; "" when /proc cannot tell."""
    try:
        namespace = os.readlink(f"/proc/{pid}/ns/pid")
    except OSError:
        return ""
    fields = _stat_fields(pid)
    return f"{namespace}:{fields[19]}" if len(fields) > 19 else ""


def _stat_fields(pid: int) -> list[str]:
    """``/proc/<pid>/stat`` from field 3 (state) on; empty when the process or /proc is missing."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return []
    # The command name (field 2) is in parentheses and may itself contain spaces and parentheses.
    return stat.rpartition(")")[2].split()


def owner_is_gone(owner: Owner, here: Owner) -> bool:
    """True only when ``owner`` surely ran on this host and is no longer alive.

    Containers of other hosts (another host name or boot id, or none recorded), of another pid
    namespace and of live processes are never judged gone; a pid that is alive but now belongs to
    a process started later (pid reuse) is.
    """
    if owner.host != here.host or not owner.boot or owner.boot != here.boot:
        return False
    namespace = here.identity.rpartition(":")[0]
    if owner.identity and namespace and owner.identity.rpartition(":")[0] != namespace:
        return False
    try:
        os.kill(owner.pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        pass  # alive, owned by another user
    if _stat_fields(owner.pid)[:1] in (["Z"], ["X"]):
        return True   # killed, and only waiting for its parent to collect the exit status
    current = process_identity(owner.pid)
    return bool(owner.identity and current and current != owner.identity)


def reap_orphans(client: docker.DockerClient) -> Orphans:
    """Remove the containers of stackforge runs on this host whose process is gone.

    Such containers outlive a run that could not clean up: stackforge killed by SIGKILL, or the
    engine stopped under it (the engine keeps the stopped containers). Containers of live runs, of
    other hosts (or other machines of the same name) and those without usable owner labels are left alone.
    """
    here = this_process()
    # ignore_removed: other runs remove their containers while this lists them.
    found = client.containers.list(all=True, filters={"label": [MANAGED_LABEL, f"{HOST_LABEL}={here.host}"]},
                                   ignore_removed=True)
    orphans = []
    for container in found:
        owner = Owner.from_labels(container.labels or {})
        if owner is not None and owner_is_gone(owner, here):
            _remove_quietly(container)
            orphans.append(container)
    runs = sorted({(c.labels or {}).get(RUN_LABEL, "?") for c in orphans})
    return Orphans(tuple(c.id for c in orphans), tuple(runs))


def buildx_available(*, timeout: float = 30.0) -> bool:
    """True when ``docker buildx version`` works (the CLI plugin is installed and runs)."""
    if runner.which("docker") is None:
        return False
    return runner.run(["docker", "buildx", "version"], timeout=timeout).succeeded


def signal_from_exit_code(exit_code: int) -> int | None:
    """``139`` -> ``11`` (SIGSEGV): the shell / init convention for a process killed by a signal."""
    if _SIGNAL_EXIT_BASE < exit_code <= _SIGNAL_EXIT_BASE + _MAX_SIGNAL:
        return exit_code - _SIGNAL_EXIT_BASE
    return None


def device_requests(gpus: str | None) -> list[docker.types.DeviceRequest]:
    """Translate a ``docker run --gpus`` value into the SDK's device requests."""
    if gpus is None:
        return []
    value = gpus.strip()
    if value == "all":
        return [docker.types.DeviceRequest(count=-1, capabilities=[["gpu"]])]
    if value.isdigit() and int(value) > 0:
        return [docker.types.DeviceRequest(count=int(value), capabilities=[["gpu"]])]
    ids = value.removeprefix("device=").strip('"').split(",")
    if value.startswith("device=") and all(i.strip() for i in ids):
        return [docker.types.DeviceRequest(device_ids=[i.strip() for i in ids], capabilities=[["gpu"]])]
    raise ValueError(f"gpus must be 'all', a count or 'device=ID[,ID...]', got {gpus!r}")


# ---------------------------------------------------------------------------------------------- internals


def _missing_socket(url: str) -> str | None:
    """The socket path when a unix:// URL points at nothing (fast and clearer than a connect error)."""
    if not url.startswith("unix://"):
        return None
    path = url.removeprefix("unix://")
    return None if os.path.exists(path) else path


def _unavailable(url: str, exc: BaseException) -> DockerUnavailableError:
    reason = _short_reason(exc)
    remedy = START_ENGINE_REMEDY
    if "permission denied" in reason.lower():
        remedy = "run as root or add your user to the docker group (or set DOCKER_HOST)"
    return DockerUnavailableError(f"no Docker engine answers at {url}: {reason}", remedy=remedy)


def _short_reason(exc: BaseException) -> str:
    """The root cause of a connection failure in a few words (``Connection refused``)."""
    seen: set[int] = set()
    pending: list[BaseException] = [exc]
    while pending:
        current = pending.pop(0)
        if id(current) in seen:
            continue
        seen.add(id(current))
        if isinstance(current, OSError) and current.strerror:
            return current.strerror
        if isinstance(current, TimeoutError):
            return "timed out"
        pending.extend(e for e in (current.__cause__, current.__context__) if e is not None)
        pending.extend(arg for arg in current.args if isinstance(arg, BaseException))
    text = " ".join(str(exc).split())
    return text if len(text) <= 160 else text[:157] + "..."


def _as_binds(mounts: Sequence[Bind] | Mapping[str | os.PathLike[str], str]) -> list[Bind]:
    if isinstance(mounts, Mapping):
        return [Bind(Path(source), target) for source, target in mounts.items()]
    return list(mounts)


def _copy_into(container: Any, bind: Bind, archive: bytes, image: str, command: Sequence[str]) -> None:
    try:
        accepted = container.put_archive("/", archive)
    except docker.errors.APIError as exc:
        raise _api_error(f"copy {bind.source} into", image, None, exc, command) from None
    if not accepted:
        raise CommandError(f"cannot copy {bind.source} into a container from {image}: the engine refused the archive",
                           argv=tuple(command))


def _split_mounts(binds: list[Bind], copy_binds: bool) -> tuple[list[Bind], list[Bind]]:
    """(mounted, copied): the ``copy_to_remote`` binds are copied when ``copy_binds`` is set."""
    copied = [b for b in binds if copy_binds and b.copy_to_remote]
    return [b for b in binds if b not in copied], copied


def _folder_archive(bind: Bind) -> bytes:
    """A tar of ``bind.source`` that unpacks at ``bind.target`` from ``/``, read-only modes, owned by root."""
    source = Path(bind.source).resolve()
    if not source.is_dir():
        raise HostError(f"cannot copy {bind.source} into the container: it is not a folder")
    target = PurePosixPath(bind.target)
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as archive:
        for parent in reversed(target.parents[:-1]):  # /a/b/c needs entries for a and a/b first
            archive.addfile(_tar_entry(str(parent).lstrip("/"), directory=True))
        archive.addfile(_tar_entry(str(target).lstrip("/"), directory=True))
        for path in sorted(source.rglob("*")):
            if "__pycache__" in path.parts or not (path.is_dir() or path.is_file()):
                continue
            name = str(target / path.relative_to(source).as_posix()).lstrip("/")
            if path.is_dir():
                archive.addfile(_tar_entry(name, directory=True))
            else:
                data = path.read_bytes()
                archive.addfile(_tar_entry(name, size=len(data)), io.BytesIO(data))
    return buffer.getvalue()


def _tar_entry(name: str, *, directory: bool = False, size: int = 0) -> tarfile.TarInfo:
    entry = tarfile.TarInfo(name)
    entry.type = tarfile.DIRTYPE if directory else tarfile.REGTYPE
    entry.mode = 0o555 if directory else 0o444
    entry.size = size
    entry.mtime = int(time.time())
    return entry


def _docker_mounts(mounts: Sequence[Bind] | Mapping[str | os.PathLike[str], str]) -> list[docker.types.Mount]:
    """Bind mounts with absolute, existing sources; the engine would silently create missing ones."""
    result = []
    for bind in _as_binds(mounts):
        source = Path(bind.source).resolve()
        if not source.exists():
            raise HostError(f"cannot mount {bind.source} into the container: it does not exist")
        result.append(docker.types.Mount(bind.target, str(source), type="bind", read_only=bind.read_only))
    return result


def _create_args(image: str, command: Sequence[str], *, mounts: Sequence[Bind] | Mapping[Any, str],
                 env: Mapping[str, str] | None, labels: Mapping[str, str] | None, network_mode: str,
                 ipc_mode: str | None, shm_size: str | None, gpus: str | None, name: str | None,
                 init: bool) -> dict[str, Any]:
    args: dict[str, Any] = {
        "image": image,
        "command": list(command),
        "labels": {**(labels or {}), MANAGED_LABEL: "true", **this_process().labels()},
        "environment": dict(env or {}),
        "mounts": _docker_mounts(mounts),
        "network_mode": network_mode,
        "init": init,
        "detach": True,
    }
    optional = {"ipc_mode": ipc_mode, "shm_size": shm_size, "name": name}
    args.update({key: value for key, value in optional.items() if value is not None})
    if gpus is not None:
        args["device_requests"] = device_requests(gpus)
    return args


def _create(client: docker.DockerClient, image: str, gpus: str | None, create_args: dict[str, Any]) -> Any:
    """Create the container, turning SDK errors into stackforge errors with a remedy."""
    try:
        return client.containers.create(**create_args)
    except docker.errors.ImageNotFound:
        raise CommandError(f"cannot run a container: image {image} does not exist on this engine",
                           argv=tuple(create_args["command"]),
                           remedy="build it first; stackforge never pulls images") from None
    except docker.errors.APIError as exc:
        raise _api_error("create", image, gpus, exc, create_args["command"]) from None
    except requests.exceptions.RequestException as exc:
        raise _unavailable(engine_url(), exc) from None


def _api_error(step: str, image: str, gpus: str | None, exc: docker.errors.APIError,
               command: Sequence[str]) -> Exception:
    explanation = " ".join(str(exc.explanation or exc).split())
    if gpus is not None and "device driver" in explanation:
        return HostError(f"the engine cannot give GPUs to containers: {explanation}",
                         remedy="install the NVIDIA Container Toolkit and restart the engine")
    return CommandError(f"cannot {step} a container from {image}: {explanation}", argv=tuple(command))


def _start_and_wait(client: docker.DockerClient, container: Any, capture: runner.OutputCapture,
                    log: Any, *, image: str, gpus: str | None, command: Sequence[str], timeout: float,
                    grace: float, cancel: runner.CancelFlag | None) -> ContainerExit:
    started = time.monotonic()
    try:
        container.start()
    except docker.errors.APIError as exc:
        # GPU requests fail here, not at create, when the engine has no NVIDIA runtime.
        raise _api_error("start", image, gpus, exc, command) from None
    follower = threading.Thread(target=_follow_logs, args=(container, capture), daemon=True)
    follower.start()
    ending = _wait_for_exit(container, timeout, cancel)
    if ending in ("exited", "removed") and cancel is not None and cancel.is_set():
        # The run is being interrupted: its own cleanup may have removed this container just now.
        ending = "cancelled"
    if ending == "removed":
        raise ContainerStoppedByEngine(f"container {container.id[:12]} of {image} was removed from outside "
                                       f"while it ran; its ending is not a result",
                                       remedy="leave the io.stackforge.managed containers of a running run alone")
    if ending != "exited":
        _stop_quietly(container, grace)
    duration = time.monotonic() - started
    # The log stream ends when the container stops; give a slow engine a moment to flush it.
    follower.join(timeout=max(grace, 10.0))
    state = _state(client, container, missing_ok=ending == "cancelled")
    exit_code = int(state.get("ExitCode", -1))
    if ending == "exited":
        # Whatever the exit code: a program may catch the engine's SIGTERM and exit 0 (the serve bench does).
        _refuse_engine_stop(client, container, state, image)
    result = ContainerExit(exit_code=exit_code, timed_out=ending == "timeout",
                          signal=signal_from_exit_code(exit_code), logs_tail=capture.tail(), duration_s=duration,
                          oom_killed=bool(state.get("OOMKilled", False)), cancelled=ending == "cancelled")
    runner.write_log(log, f"[stackforge] container {result.describe()} ({duration:.1f} s)\n")
    return result


def _wait_for_exit(container: Any, timeout: float, cancel: runner.CancelFlag | None) -> str:
    """Wait for the container; returns ``exited``, ``timeout``, ``cancelled`` or ``removed`` (gone)."""
    deadline = time.monotonic() + timeout
    while True:
        if cancel is not None and cancel.is_set():
            return "cancelled"
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            return "timeout"
        try:
            # With a cancel flag, wait in short slices so that a cancel is seen within a second.
            container.wait(timeout=remaining if cancel is None else min(remaining, _CANCEL_POLL_S))
            return "exited"
        except docker.errors.NotFound:
            return "removed"
        except (requests.exceptions.ReadTimeout, requests.exceptions.ConnectionError):
            # docker-py reports the wait deadline as a read timeout on the HTTP request. A dropped
            # connection looks similar, so ask the engine (this raises if the engine is really gone).
            try:
                container.reload()
            except docker.errors.NotFound:
                return "removed"
            if container.status not in ("running", "restarting", "created"):
                return "exited"


def _follow_logs(container: Any, capture: runner.OutputCapture) -> None:
    """Stream stdout+stderr into the capture until the container stops (runs in a thread)."""
    try:
        for chunk in container.logs(stdout=True, stderr=True, stream=True, follow=True):
            capture.feed(chunk)
    except (docker.errors.DockerException, requests.exceptions.RequestException):
        pass  # the container went away mid-stream (removed on Ctrl-C); what we have is kept
    finally:
        capture.finish()


def _state(client: docker.DockerClient, container: Any, *, missing_ok: bool = False) -> dict[str, Any]:
    try:
        state: dict[str, Any] = client.api.inspect_container(container.id)["State"]
    except docker.errors.NotFound:
        if not missing_ok:
            raise
        return {}
    return state


def _stop_quietly(container: Any, grace: float) -> None:
    """SIGTERM, then SIGKILL after ``grace``; a container already removed is fine."""
    try:
        container.stop(timeout=max(1, round(grace)))
    except docker.errors.NotFound:
        pass


def _refuse_engine_stop(client: docker.DockerClient, container: Any, state: Mapping[str, Any], image: str) -> None:
    """Raise when the engine, not the container's program, ended a container stackforge did not stop.

    An engine shutting down (or ``docker stop`` / ``docker kill`` from outside) sends the container a
    signal; its program then dies by SIGTERM like a real crash would. The engine logs a ``kill`` event
    for every signal it sends, and none for a program that died on its own, so asking for those
    events tells the two apart. An engine that no longer answers raises the connection error, which
    :func:`run_container` turns into DockerUnavailableError; one that cannot list events (an API
    error) leaves the ending as observed.
    """
    started = _engine_time(state.get("StartedAt"))
    if started is None:
        return
    try:
        # Both bounds on the engine's own clock. `until` is the engine's present, not FinishedAt: the
        # engine logs the kill event just after sending the signal, possibly after the exit. A bound
        # in the engine's past also makes the call return at once instead of waiting for new events.
        now = _engine_time(client.info().get("SystemTime")) or _engine_time(state.get("FinishedAt"))
        if now is None:
            return
        events = list(client.api.events(since=started, until=now,
                                        filters={"container": container.id, "event": "kill"}, decode=True))
    except docker.errors.APIError:
        return
    signals = [str((event.get("Actor") or {}).get("Attributes", {}).get("signal", "?")) for event in events]
    if signals:
        names = ", ".join(runner.signal_name(int(s)) if s.isdigit() else s for s in signals)
        raise ContainerStoppedByEngine(
            f"the Docker engine stopped container {container.id[:12]} of {image} from outside ({names}): "
            f"engine shutdown, `docker stop` or `docker kill`; its ending is not a result",
            remedy="check the engine (`docker info`) and run again")


def _engine_time(value: Any) -> float | None:
    """An engine timestamp (``2026-12-01T03:49:09.620525497Z``, or with an offset) as Unix seconds;
    None when unset or unreadable. Nanoseconds are kept as far as a float holds them."""
    match = _ENGINE_TIME.fullmatch(value) if isinstance(value, str) else None
    if match is None or value.startswith("0001-"):
        return None
    seconds, fraction, zone = match.groups()
    moment = datetime.fromisoformat(seconds + ("+00:00" if zone == "Z" else zone))
    return moment.timestamp() + float(f"0.{fraction or '0'}")


def _remove_quietly(container: Any) -> None:
    """Force-remove a container; one that is already gone is fine."""
    try:
        container.remove(force=True, v=True)
    except docker.errors.NotFound:
        pass
    except docker.errors.APIError as exc:
        if "already in progress" not in str(exc):
            raise
    except requests.exceptions.RequestException:
        pass  # the engine is gone, and its containers with it; the caller gets that error instead


def _remove_images(client: docker.DockerClient, label_selector: str) -> tuple[str, ...]:
    """Remove labelled images, children before parents (a parent with children cannot go first)."""
    remaining = {image.id: image for image in client.images.list(all=True, filters={"label": label_selector})}
    removed: list[str] = []
    while remaining:
        progress = False
        for image_id in sorted(remaining, key=lambda i: remaining[i].attrs.get("Created", ""), reverse=True):
            try:
                client.images.remove(image_id, force=True, noprune=False)
            except docker.errors.NotFound:
                pass  # removed as the parent of an image removed before it
            except docker.errors.APIError:
                continue  # still has a child or a container; retry after the others
            removed.append(image_id)
            del remaining[image_id]
            progress = True
        if not progress:
            break
    return tuple(removed)
