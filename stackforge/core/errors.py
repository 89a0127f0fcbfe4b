"""One exception root for stackforge.

Every error a user can cause or meet derives from :class:`StackforgeError`. Subclasses carry the
context needed to act on them; only the CLI turns them into one-line messages and exit codes.
"""

from __future__ import annotations

import errno as _errno
import signal as _signal


class StackforgeError(Exception):
    """Root of all stackforge errors.

    Attributes:
        code: a stable machine-readable code (``spec.invalid``, ``docker.unavailable``...).
        exit_code: the process exit status the CLI uses for this error.
        remedy: a one-line hint on how to fix it, or "".
    """

    code = "stackforge.error"
    exit_code = 1

    def __init__(self, message: str, *, remedy: str = "") -> None:
        super().__init__(message)
        self.message = message
        self.remedy = remedy

    def one_line(self) -> str:
        """The message and remedy on a single line, as the CLI prints it."""
        text = " ".join(self.message.split())
        return f"{text} (hint: {self.remedy})" if self.remedy else text


class SpecError(StackforgeError):
    """Invalid input: a matrix, rule, target or version string that cannot be used."""

    code = "spec.invalid"
    exit_code = 2

    def __init__(self, message: str, *, source: str = "", line: int | None = None, remedy: str = "") -> None:
        where = source + (f":{line}" if line is not None else "") if source else ""
        super().__init__(f"{where}: {message}" if where else message, remedy=remedy)
        self.source = source
        self.line = line


class UnsafeValueError(SpecError):
    """A value that could inject shell or Dockerfile instructions (whitespace, metacharacters)."""

    code = "spec.unsafe_value"


class RecordError(StackforgeError):
    """A result or build record that is corrupt, partial, or from a newer schema."""

    code = "record.invalid"
    exit_code = 2

    def __init__(self, message: str, *, path: str = "", remedy: str = "") -> None:
        super().__init__(f"{path}: {message}" if path else message, remedy=remedy)
        self.path = path


class DockerUnavailableError(StackforgeError):
    """No Docker engine answers (not installed, not started, wrong DOCKER_HOST)."""

    code = "docker.unavailable"
    exit_code = 3


class ContainerStoppedByEngine(DockerUnavailableError):
    """The engine itself stopped a container (engine shutdown, ``docker stop``/``kill`` from outside).

    The program in the container did not decide how it ended, so its ending is no measurement.
    """

    code = "docker.stopped"


class HostError(StackforgeError):
    """A host tool or facility is missing (buildx, debootstrap, nvidia runtime...)."""

    code = "host.missing"
    exit_code = 3


class CommandError(StackforgeError):
    """A subprocess failed; carries the command, exit status and a bounded output tail."""

    code = "command.failed"
    exit_code = 1

    def __init__(self, message: str, *, argv: tuple[str, ...] = (), returncode: int | None = None,
                 output_tail: str = "", remedy: str = "") -> None:
        super().__init__(message, remedy=remedy)
        self.argv = argv
        self.returncode = returncode
        self.output_tail = output_tail


class CommandTimeout(CommandError):
    """A subprocess ran past its timeout and was killed."""

    code = "command.timeout"


class BuildError(StackforgeError):
    """One or more stacks failed to build; carries the stack ids and log paths."""

    code = "build.failed"
    exit_code = 1

    def __init__(self, message: str, *, failed: tuple[str, ...] = (), remedy: str = "") -> None:
        super().__init__(message, remedy=remedy)
        self.failed = failed


class ProbeError(StackforgeError):
    """A probe could not be run at all (not: a probe that ran and failed, which is a result)."""

    code = "probe.error"
    exit_code = 1


class NothingQualifiesError(StackforgeError):
    """``pick`` found no image that meets the requirements."""

    code = "pick.none"
    exit_code = 4


class Interrupted(StackforgeError):
    """The run was interrupted (Ctrl-C, SIGTERM, SIGHUP); finished work was kept.

    ``signum`` is the signal that interrupted it; the exit status is 128 + signum (130 for Ctrl-C).
    """

    code = "interrupted"
    exit_code = 128 + _signal.SIGINT

    def __init__(self, message: str, *, signum: int = _signal.SIGINT, remedy: str = "") -> None:
        super().__init__(message, remedy=remedy)
        self.signum = signum
        self.exit_code = 128 + signum


class Terminated(KeyboardInterrupt):
    """SIGTERM or SIGHUP, raised in the main thread like the KeyboardInterrupt of Ctrl-C.

    A KeyboardInterrupt on purpose, not a StackforgeError: every ``except KeyboardInterrupt`` cleanup
    path (stop process groups, remove the run's containers, keep finished records) then serves these
    signals too, and ``except Exception`` never swallows it.
    """

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum


def interrupt_signal(exc: BaseException) -> int:
    """The signal behind an interruption: a :class:`Terminated`'s or :class:`Interrupted`'s, else SIGINT."""
    return int(getattr(exc, "signum", _signal.SIGINT))


class EnvironmentFault(StackforgeError):
    """The host refused an operation on a file or a socket: disk full, read-only file system, permission
    denied, or any other OS error. The environment, not the stack, so exit 3 (as for a missing engine),
    never 1, which means that something under test failed (or, for ``watch``, news).

    Attributes:
        path: the file or folder the operation was on ("" when the OS named none).
        reason: the OS's words and the errno's name, e.g. ``No space left on device (ENOSPC)``.
    """

    code = "host.os_error"
    exit_code = 3

    def __init__(self, message: str, *, path: str = "", reason: str = "", remedy: str = "") -> None:
        super().__init__(message, remedy=remedy)
        self.path = path
        self.reason = reason

    @classmethod
    def from_os_error(cls, exc: OSError, *, doing: str = "") -> EnvironmentFault:
        """The fault for ``exc``; ``doing`` (``writing --out x.html``) when the caller knows what it was doing."""
        path = " -> ".join(str(name) for name in (exc.filename, exc.filename2) if name is not None)
        name = _errno.errorcode.get(exc.errno or 0, "")
        words = exc.strerror or str(exc) or type(exc).__name__
        reason = f"{words} ({name})" if name else words
        what = f"{doing} ({path})" if doing and path and path not in doing else doing or path
        remedy = _OS_REMEDIES.get(name, "check the path, its file system and this host (mounts, permissions, limits)")
        return cls(f"{what}: {reason}" if what else reason, path=path, reason=reason, remedy=remedy)


# What to do about the OS errors a user meets most; the rest get a generic hint.
_OS_REMEDIES = {
    "ENOSPC": "free space on the file system that holds it (df -h), or write elsewhere",
    "EDQUOT": "free space in your disk quota, or write elsewhere",
    "EROFS": "the file system is mounted read-only: choose a folder on a writable one",
    "EACCES": "give this user access to it, or choose another folder",
    "EPERM": "give this user access to it, or choose another folder",
    "EMFILE": "raise the open-file limit (ulimit -n), or run fewer jobs at once (-j)",
    "ENFILE": "the system's open-file table is full: close files, or run fewer jobs at once (-j)",
    "EIO": "the disk or mount reports an I/O error: check the device (dmesg)",
}
