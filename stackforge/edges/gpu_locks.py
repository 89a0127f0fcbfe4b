"""GPUs held exclusively across every stackforge process on this host, and whether a GPU is idle.

A job that gets GPUs holds one lock file per GPU, ``gpu-<uuid>.lock`` in the host's GPU lock folder
(:func:`lock_dir`), with ``fcntl.flock``: the kernel drops the lock when its holder exits or dies,
so a crashed or SIGKILLed stackforge frees its cards without any cleanup. ``flock`` locks belong to
an open file, not a process, so two jobs of one run exclude each other through the same files.

Before a job starts on the GPUs it holds, :func:`busy_reason` decides from ``nvidia-smi``'s view
(:func:`read_gpu_usage`, the edge, through :mod:`stackforge.edges.runner`) whether anything else
uses them: another user's process, or a process stackforge does not know about. Such a job is a
``skip`` saying ``busy: pid ...``: a hang or an OOM on a shared card says nothing about the stack.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import re
import shutil
import stat
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from stackforge.core.errors import HostError
from stackforge.edges import runner

#: The host's GPU lock folder when set (the same value for every process that must exclude the others).
RUN_DIR_ENV = "STACKFORGE_RUN_DIR"
#: One folder for every user of the host: exclusivity that held only per user would let two users share
#: a card. Created world-writable with the sticky bit (as /tmp itself); lock files are opened without
#: following a symlink.
DEFAULT_LOCK_DIR = Path("/tmp/stackforge-gpu-locks")
#: A GPU using more memory than this (MiB) with no compute process listed is still not idle (a process
#: in another PID namespace, or a context nvidia-smi cannot attribute). An idle H100 or RTX PRO 6000
#: shows a few MiB; a desktop session on a workstation card a few hundred.
BUSY_MEMORY_MIB_ENV = "STACKFORGE_GPU_BUSY_MIB"
DEFAULT_BUSY_MEMORY_MIB = 1024
_POLL_S = 0.25
SMI_TIMEOUT_S = 30.0


def lock_dir(env: Mapping[str, str] | None = None) -> Path:
    """``$STACKFORGE_RUN_DIR``, else :data:`DEFAULT_LOCK_DIR` (shared by every user of the host)."""
    configured = (os.environ if env is None else env).get(RUN_DIR_ENV)
    return Path(configured).expanduser() if configured else DEFAULT_LOCK_DIR


def lock_name(key: str) -> str:
    """``gpu-<uuid>.lock``; a key with anything but letters, digits, ``-`` and ``_`` is made safe."""
    return f"gpu-{re.sub(r'[^A-Za-z0-9_-]', '_', key)}.lock"


def _prepare(folder: Path) -> None:
    """Create the lock folder (sticky, writable by all) unless it is there; refuse a symlink in its place."""
    try:
        folder.mkdir(parents=True, mode=0o1777)
        os.chmod(folder, 0o1777)    # mkdir's mode passes through the umask
    except FileExistsError:
        pass
    if folder.is_symlink() or not folder.is_dir():
        raise OSError(errno.ENOTDIR, f"GPU lock folder {folder} is not a directory")


def _open_lock(path: Path) -> int:
    """The lock file's descriptor (created when missing, readable and writable by every user). Another
    user's file may be read-only for us: a read-only descriptor takes an flock as well. An existing file
    is opened without O_CREAT: Linux's ``fs.protected_regular`` refuses O_CREAT on another user's file in a
    sticky folder."""
    flags = os.O_NOFOLLOW | os.O_CLOEXEC
    for _ in range(3):
        try:
            try:
                return os.open(path, flags | os.O_RDWR)
            except PermissionError:
                return os.open(path, flags | os.O_RDONLY)
        except FileNotFoundError:
            pass
        try:
            fd = os.open(path, flags | os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o666)
        except FileExistsError:
            continue   # another process created it between the two opens: open theirs
        with contextlib.suppress(OSError):
            os.fchmod(fd, 0o666)   # the umask took the group's and others' write bits
        return fd
    raise OSError(errno.EAGAIN, f"cannot open GPU lock file {path}")


def holder_pid(path: Path) -> int | None:
    """The pid the lock file's holder wrote into it (None when unknown)."""
    try:
        text = path.read_text(encoding="utf-8", errors="replace").strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None


@dataclass(frozen=True, slots=True)
class LockWait:
    """How taking a job's GPU locks ended: ``held`` (the job may start), or ``cancelled`` (the run was
    interrupted while another process held one)."""

    held: bool
    cancelled: bool = False


class GpuFileLocks:
    """The host's GPU locks as one run uses them: one ``flock`` per GPU key (its UUID)."""

    def __init__(self, folder: Path | None = None) -> None:
        self.folder = folder or lock_dir()

    @contextlib.contextmanager
    def holding(self, keys: Sequence[str], cancel: threading.Event | None = None) -> Iterator[LockWait]:
        """Hold every key's lock (in sorted order, so two processes never deadlock), waiting while another
        process or job holds one; yields ``LockWait(held=False, cancelled=True)`` when ``cancel`` is set
        while waiting (the job must not start). Released on leaving, also on an exception."""
        fds: list[int] = []
        try:
            for key in sorted(set(keys)):
                fds.append(self._open(key))
                fd = fds[-1]
                while True:
                    try:
                        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                        break
                    except BlockingIOError:
                        if cancel is not None and cancel.is_set():
                            yield LockWait(held=False, cancelled=True)
                            return
                        time.sleep(_POLL_S)
                _note_holder(fd)
            cancelled = cancel is not None and cancel.is_set()
            yield LockWait(held=not cancelled, cancelled=cancelled)
        finally:
            for fd in reversed(fds):
                with contextlib.suppress(OSError):
                    fcntl.flock(fd, fcntl.LOCK_UN)
                os.close(fd)

    def _open(self, key: str) -> int:
        """The descriptor of ``key``'s lock file (the folder made first).

        Raises:
            HostError: the folder or file cannot be made or opened (a read-only /tmp, a foreign symlink).
        """
        try:
            _prepare(self.folder)
            return _open_lock(self.folder / lock_name(key))
        except OSError as exc:
            raise HostError(f"cannot take the host-wide GPU lock {self.folder / lock_name(key)}: "
                            f"{exc.strerror or exc}",
                            remedy=f"set {RUN_DIR_ENV} to a folder every stackforge process here can write") from None

    def held_by_other(self, key: str) -> int | None:
        """The pid holding ``key``'s lock when another open file holds it now, else None (a probe: the lock
        is taken and released at once when free)."""
        path = self.folder / lock_name(key)
        if not path.exists():
            return None
        fd = _open_lock(path)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return holder_pid(path) or -1
        finally:
            os.close(fd)
        return None


def _note_holder(fd: int) -> None:
    """Write our pid into the lock file (what ``held_by_other`` and a person reading the folder see)."""
    with contextlib.suppress(OSError):
        if os.fstat(fd).st_mode & stat.S_IWUSR:
            os.ftruncate(fd, 0)
            os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)


# ---------------------------------------------------------------------------------------------- idle or busy


@dataclass(frozen=True, slots=True)
class GpuUsage:
    """What nvidia-smi says runs on the host's GPUs: ``(uuid, pid, used MiB)`` per compute process and
    ``(uuid, used MiB)`` per GPU; ``error`` when it could not say (then nothing is known)."""

    processes: tuple[tuple[str, int, int | None], ...] = ()
    memory_used: tuple[tuple[str, int], ...] = ()
    error: str = ""


def busy_memory_mib(env: Mapping[str, str] | None = None) -> int:
    """``$STACKFORGE_GPU_BUSY_MIB`` when it is a whole number, else :data:`DEFAULT_BUSY_MEMORY_MIB`."""
    value = (os.environ if env is None else env).get(BUSY_MEMORY_MIB_ENV, "")
    return int(value) if value.strip().isdigit() else DEFAULT_BUSY_MEMORY_MIB


def busy_reason(usage: GpuUsage, uuids: Sequence[str], *, threshold_mib: int,
                own_pids: frozenset[int] = frozenset()) -> str | None:
    """Why these GPUs are not idle (``busy: pid 4242 on GPU-... (3000 MiB)``), or None when they are (pure).

    Busy means a compute process other than ``own_pids`` runs on one of them, or one uses more than
    ``threshold_mib`` of memory. A usage nvidia-smi could not read is not idle either: nothing is known.
    """
    if usage.error:
        return f"busy: cannot tell whether GPUs {', '.join(uuids)} are idle ({usage.error})"
    wanted = set(uuids)
    if any(not key.startswith("GPU-") for key in uuids):
        # Keys without a UUID (nvidia-smi gave none: ``index-N``, ``all``) match no usage row: every GPU counts,
        # so an unknown card is never taken for an idle one.
        wanted = {uuid for uuid, _, _ in usage.processes} | {uuid for uuid, _ in usage.memory_used}
    others = [(uuid, pid, mib) for uuid, pid, mib in usage.processes if uuid in wanted and pid not in own_pids]
    if others:
        listed = ", ".join(f"pid {pid} on {uuid}" + (f" ({mib} MiB)" if mib is not None else "")
                           for uuid, pid, mib in others)
        return f"busy: {listed}"
    heavy = [(uuid, mib) for uuid, mib in usage.memory_used if uuid in wanted and mib > threshold_mib]
    if heavy:
        listed = ", ".join(f"{uuid} uses {mib} MiB" for uuid, mib in heavy)
        return f"busy: {listed} (over {threshold_mib} MiB, no compute process listed)"
    return None


def _number(text: str) -> int | None:
    text = text.strip().split()[0] if text.strip() else ""
    return int(text) if text.isdigit() else None


def parse_compute_apps(text: str) -> tuple[tuple[str, int, int | None], ...]:
    """``nvidia-smi --query-compute-apps=gpu_uuid,pid,used_memory --format=csv,noheader,nounits`` rows
    (rows that are not of that shape are left out)."""
    rows = []
    for line in text.splitlines():
        cells = [c.strip() for c in line.split(",")]
        if len(cells) >= 2 and cells[0].startswith("GPU-") and cells[1].isdigit():
            rows.append((cells[0], int(cells[1]), _number(cells[2]) if len(cells) > 2 else None))
    return tuple(rows)


def parse_memory_used(text: str) -> tuple[tuple[str, int], ...]:
    """``nvidia-smi --query-gpu=uuid,memory.used --format=csv,noheader,nounits`` rows."""
    rows = []
    for line in text.splitlines():
        cells = [c.strip() for c in line.split(",")]
        if len(cells) >= 2 and cells[0].startswith("GPU-") and _number(cells[1]) is not None:
            rows.append((cells[0], _number(cells[1]) or 0))
    return tuple(rows)


def read_gpu_usage() -> GpuUsage:
    """Ask nvidia-smi which compute processes run and how much memory each GPU uses (the edge)."""
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return GpuUsage(error="nvidia-smi not found on the host")
    apps = runner.run([smi, "--query-compute-apps=gpu_uuid,pid,used_memory", "--format=csv,noheader,nounits"],
                      timeout=SMI_TIMEOUT_S)
    memory = runner.run([smi, "--query-gpu=uuid,memory.used", "--format=csv,noheader,nounits"],
                        timeout=SMI_TIMEOUT_S)
    for result in (apps, memory):
        if not result.succeeded:
            return GpuUsage(error=f"nvidia-smi {result.describe()}: {result.output_tail.strip()[-200:]}")
    return GpuUsage(parse_compute_apps(apps.output_tail), parse_memory_used(memory.output_tail))
