"""The one place where stackforge runs host subprocesses.

Every external command (``docker buildx build``, ``debootstrap``, ``tar``, ``umount``...) goes through
:func:`run` or :func:`check_run`, so that all of them get the same guarantees:

* a mandatory timeout, enforced on the whole process group: SIGTERM, a grace period, then SIGKILL;
* the child starts in a new session, so a Ctrl-C in the terminal reaches stackforge only; stackforge
  then stops the child's whole group the same way and re-raises :class:`KeyboardInterrupt`;
* when the main process exits, anything it left running in its process group is stopped too, so no
  command leaks background processes (a process that starts its own session escapes this, by design);
* combined stdout+stderr streamed line by line into an optional log file, plus a bounded tail kept in
  memory for error messages and records;
* secrets listed in ``redact`` are replaced by ``***`` before anything is written or kept;
* a missing program is a one-line :class:`~stackforge.core.errors.HostError`, not a traceback;
* a ``cancel`` flag (e.g. a :class:`threading.Event`) set by another thread stops the command the
  same way: worker threads cannot see Ctrl-C, so the thread that does sets the flag.

:func:`signals_as_interrupts` makes SIGTERM and SIGHUP take the Ctrl-C path as well (the CLI wraps
every command in it), so ``timeout``, ``kill`` or a closed terminal clean up like Ctrl-C does.

Containers are the other half of the choke point; they live in :mod:`stackforge.edges.docker_engine`
(:func:`stackforge.edges.docker_engine.run_container`) and follow the same rules.
"""

from __future__ import annotations

import codecs
import collections
import concurrent.futures
import contextlib
import os
import shlex
import shutil
import signal as signal_module
import subprocess
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, Protocol, TypeVar

from stackforge.core.errors import CommandError, CommandTimeout, HostError, Terminated

#: Seconds between SIGTERM and SIGKILL when a command has to be stopped.
DEFAULT_KILL_GRACE_S = 5.0
#: Signals turned into :class:`~stackforge.core.errors.Terminated` by :func:`signals_as_interrupts`.
INTERRUPT_SIGNALS = (signal_module.SIGTERM, signal_module.SIGHUP)
#: Text put in place of every redacted secret.
REDACTED = "***"
# Read output in bounded chunks so one endless line (a progress bar using \r) cannot exhaust memory.
_READ_CHUNK_BYTES = 64 * 1024
# How often the stop loop checks whether the process group is gone.
_POLL_S = 0.05
# How often a running command's cancel flag is looked at.
_CANCEL_POLL_S = 0.1
# How often the main thread wakes while it waits for worker threads, to run pending signal handlers.
_SIGNAL_POLL_S = 0.25


T = TypeVar("T")


class CancelFlag(Protocol):
    """Anything with ``is_set()``, such as :class:`threading.Event`: set it to stop a running command."""

    def is_set(self) -> bool: ...


@dataclass(frozen=True, slots=True)
class CommandResult:
    """What happened when a command ran. Never an exception: the caller decides what a failure means.

    Attributes:
        argv: the command as run, with redacted strings replaced by ``***``.
        returncode: the exit status; negative (``-N``) when the process died by signal N.
        output_tail: the last ``tail_chars`` characters of combined stdout+stderr (redacted).
        duration_s: wall-clock seconds from start to the end of the process group.
        timed_out: True when stackforge stopped the command because it ran past its timeout.
        signal: the number of the signal that killed the process, or None when it exited normally.
        cancelled: True when stackforge stopped the command because its cancel flag was set.
    """

    argv: tuple[str, ...]
    returncode: int
    output_tail: str
    duration_s: float
    timed_out: bool
    signal: int | None
    cancelled: bool = False

    @property
    def succeeded(self) -> bool:
        """True when the command exited with status 0 within its timeout."""
        return self.returncode == 0 and not self.timed_out and not self.cancelled

    def describe(self) -> str:
        """A short human phrase for how the command ended, e.g. ``killed by SIGSEGV``."""
        return describe_ending(self.returncode, self.signal, self.timed_out, self.duration_s, self.cancelled)


def describe_ending(returncode: int | None, signal: int | None, timed_out: bool, duration_s: float,
                    cancelled: bool = False) -> str:
    """Phrase an ending (exit status, signal, timeout, cancel) the same way for processes and containers."""
    if cancelled:
        return f"cancelled after {duration_s:.1f} s and was stopped"
    if timed_out:
        return f"timed out after {duration_s:.1f} s and was stopped"
    if signal is not None:
        return f"killed by {signal_name(signal)}"
    return f"exited with status {returncode}"


def signal_name(number: int) -> str:
    """``11`` -> ``SIGSEGV``; unknown numbers come back as ``signal N``."""
    try:
        return signal_module.Signals(number).name
    except ValueError:
        return f"signal {number}"


@contextlib.contextmanager
def signals_as_interrupts(signals: Sequence[signal_module.Signals] = INTERRUPT_SIGNALS) -> Iterator[None]:
    """Within the block, SIGTERM / SIGHUP raise :class:`~stackforge.core.errors.Terminated` in the main thread.

    Terminated is a KeyboardInterrupt, so the code that cleans up after Ctrl-C (stop process groups,
    remove the run's containers, keep finished records) runs for these signals too. Only the first
    such signal raises: a second one (``timeout`` and service managers repeat theirs) must not cut
    that cleanup short. A signal the process inherited as ignored (``nohup`` ignores SIGHUP) stays
    ignored. Outside the main thread Python cannot install handlers; nothing changes then.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    received: list[int] = []

    def interrupt(signum: int, frame: object) -> None:
        received.append(signum)
        if len(received) == 1:
            raise Terminated(signum)

    previous = {sig: signal_module.signal(sig, interrupt) for sig in signals
                if signal_module.getsignal(sig) is not signal_module.SIG_IGN}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal_module.signal(sig, handler)


def finished_futures(futures: Iterable[concurrent.futures.Future[T]], poll_s: float = _SIGNAL_POLL_S, *,
                     on_tick: Callable[[], object] | None = None) -> Iterator[concurrent.futures.Future[T]]:
    """Each future as it finishes, like :func:`concurrent.futures.as_completed`, but a signal always gets through.

    The kernel hands a process-directed SIGTERM, SIGHUP or SIGINT to any thread that does not block
    it, often a worker blocked in a socket read. Python then only marks the signal pending; its
    handler (which raises :class:`~stackforge.core.errors.Terminated` or KeyboardInterrupt) runs when the
    main thread next executes bytecode. A main thread parked in ``as_completed`` without a timeout
    never does, so the run would wait for its workers instead of stopping. Waking every ``poll_s``
    seconds bounds that delay. ``on_tick`` runs at each wake (a progress view's refresh).
    """
    pending = set(futures)
    while pending:
        done, pending = concurrent.futures.wait(pending, timeout=poll_s,
                                                return_when=concurrent.futures.FIRST_COMPLETED)
        yield from done
        if on_tick is not None:
            on_tick()


def result_of(future: concurrent.futures.Future[T], poll_s: float = _SIGNAL_POLL_S) -> T:
    """``future.result()``, waking every ``poll_s`` seconds so that a signal gets through (see
    :func:`finished_futures`)."""
    (done,) = finished_futures((future,), poll_s)
    return done.result()


def which(program: str) -> str | None:
    """The full path of ``program`` on PATH (or the path itself when it is executable), else None."""
    return shutil.which(program)


def format_argv(argv: Sequence[str], redact: Sequence[str] = ()) -> str:
    """A copy-pasteable shell rendering of ``argv`` with secrets replaced, for logs and messages."""
    return _redact(shlex.join(argv), _secrets(redact))


def run(
    argv: Sequence[str],
    *,
    timeout: float,
    env: Mapping[str, str] | None = None,
    cwd: str | os.PathLike[str] | None = None,
    log_path: Path | None = None,
    input_text: str | None = None,
    tail_chars: int = 8000,
    redact: Sequence[str] = (),
    grace: float = DEFAULT_KILL_GRACE_S,
    cancel: CancelFlag | None = None,
) -> CommandResult:
    """Run ``argv`` to completion (or to its timeout) and report what happened.

    Args:
        argv: program and arguments; never passed through a shell.
        timeout: seconds before the whole process group is stopped (SIGTERM, ``grace``, SIGKILL).
        env: variables set on top of the current environment (so PATH, HOME and DOCKER_HOST survive).
        cwd: working directory of the command.
        log_path: file that receives a header line, every output line and a footer line (appended;
            parent folders are created).
        input_text: text written to the command's stdin; without it stdin is /dev/null, so a command
            never waits for a terminal.
        tail_chars: how many characters of output to keep in :attr:`CommandResult.output_tail`.
        redact: secret strings replaced by ``***`` in the log, the tail and the reported argv.
        grace: seconds between SIGTERM and SIGKILL.
        cancel: when this flag becomes set (from another thread), the command is stopped like at a
            timeout and the result says ``cancelled`` (already set: it is stopped at once).

    Returns:
        The :class:`CommandResult`; a non-zero exit, a signal, a timeout or a cancel are reported,
        not raised.

    Raises:
        HostError: the program does not exist or cannot be executed, or ``cwd`` does not exist.
        KeyboardInterrupt: re-raised after the command's process group has been stopped.
    """
    argv = _checked_argv(argv, timeout)
    secrets = _secrets(redact)
    shown_argv = tuple(_redact(arg, secrets) for arg in argv)
    with open_log(log_path) as log:
        write_log(log, f"$ {_redact(shlex.join(argv), secrets)}\n")
        started = time.monotonic()
        process = _start(argv, env=env, cwd=cwd, with_stdin=input_text is not None)
        pump: threading.Thread | None = None
        feeder: threading.Thread | None = None
        try:
            # Everything after the start is in here: a Ctrl-C or SIGTERM (Terminated) that lands while
            # the output and input threads start must stop the command too.
            capture = OutputCapture(tail_chars=tail_chars, redact=secrets, log=log)
            pump = threading.Thread(target=_pump_output, args=(process.stdout, capture), daemon=True)
            pump.start()
            feeder = _feed_stdin(process, input_text)
            ending = _wait_or_stop(process, timeout, grace, cancel)
        except BaseException:
            # KeyboardInterrupt (or anything else): never leave the command running behind us.
            _stop_group(process, grace)
            raise
        finally:
            # The pipe reaches EOF once every process holding it is gone; the group is gone by now.
            for thread in (pump, feeder):
                if thread is not None and thread.ident is not None:   # a thread never started: no join
                    thread.join(timeout=grace)
        duration = time.monotonic() - started
        returncode = process.returncode
        signal = -returncode if returncode < 0 else None
        result = CommandResult(shown_argv, returncode, capture.tail(), duration, ending == "timeout", signal,
                               cancelled=ending == "cancelled")
        write_log(log, f"[stackforge] {result.describe()} ({duration:.1f} s)\n")
    return result


def check_run(argv: Sequence[str], **options: Any) -> CommandResult:
    """:func:`run` with the same keyword arguments, but a timeout, a cancel or a non-zero exit raises.

    Raises:
        CommandTimeout: the command ran past ``timeout`` and was stopped.
        CommandError: the command exited non-zero, died by a signal, or was cancelled.
        HostError: as in :func:`run`.
    """
    result = run(argv, **options)
    if result.succeeded:
        return result
    error = CommandTimeout if result.timed_out else CommandError
    log_path = options.get("log_path")
    where = f"; log: {log_path}" if log_path is not None else ""
    raise error(f"{shlex.join(result.argv[:3])}{' ...' if len(result.argv) > 3 else ''} "
                f"{result.describe()}{where}",
                argv=result.argv, returncode=result.returncode, output_tail=result.output_tail)


# ---------------------------------------------------------------------------------------------- internals


def _checked_argv(argv: Sequence[str], timeout: float) -> tuple[str, ...]:
    """Refuse the mistakes that would otherwise surface as confusing OS errors."""
    if isinstance(argv, (str, bytes)):
        raise TypeError("argv must be a sequence of arguments, not a string (no shell is used)")
    args = tuple(argv)
    if not args or not all(isinstance(arg, str) for arg in args):
        raise TypeError(f"argv must be a non-empty sequence of str, got {argv!r}")
    if not timeout > 0:
        raise ValueError(f"timeout must be positive, got {timeout!r}")
    return args


def _secrets(redact: Sequence[str]) -> tuple[str, ...]:
    """Non-empty secrets, longest first, so a secret containing another is replaced whole."""
    return tuple(sorted({s for s in redact if s}, key=len, reverse=True))


def _redact(text: str, secrets: tuple[str, ...]) -> str:
    for secret in secrets:
        text = text.replace(secret, REDACTED)
    return text


def _start(argv: tuple[str, ...], *, env: Mapping[str, str] | None, cwd: str | os.PathLike[str] | None,
           with_stdin: bool) -> subprocess.Popen[bytes]:
    """Start the command as the leader of a new session (and so of a new process group)."""
    if cwd is not None and not Path(cwd).is_dir():
        raise HostError(f"cannot run {argv[0]}: working directory {cwd} does not exist")
    full_env = None if env is None else {**os.environ, **env}
    try:
        return subprocess.Popen(
            argv,
            stdin=subprocess.PIPE if with_stdin else subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            env=full_env,
            cwd=cwd,
            start_new_session=True,
        )
    except FileNotFoundError:
        raise HostError(f"program not found: {argv[0]} (not on PATH)",
                        remedy=f"install {os.path.basename(argv[0])} or fix PATH") from None
    except PermissionError:
        raise HostError(f"program not executable: {argv[0]} (permission denied)") from None


def _feed_stdin(process: subprocess.Popen[bytes], input_text: str | None) -> threading.Thread | None:
    """Write stdin from a thread: a large input must not block us from reading the output."""
    if input_text is None or process.stdin is None:
        return None

    def feed() -> None:
        assert process.stdin is not None
        try:
            process.stdin.write(input_text.encode("utf-8"))
            process.stdin.close()
        except (BrokenPipeError, ValueError, OSError):
            pass  # the command exited or closed stdin without reading everything: its choice.

    thread = threading.Thread(target=feed, daemon=True)
    thread.start()
    return thread


def _wait_or_stop(process: subprocess.Popen[bytes], timeout: float, grace: float,
                  cancel: CancelFlag | None) -> str:
    """Wait for the main process; stop its group on timeout or cancel, and stop leftovers after an exit.

    Returns how it ended: ``exited``, ``timeout`` or ``cancelled``.
    """
    deadline = time.monotonic() + timeout
    while True:
        if cancel is not None and cancel.is_set():
            _stop_group(process, grace)
            return "cancelled"
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            _stop_group(process, grace)
            return "timeout"
        try:
            process.wait(timeout=remaining if cancel is None else min(remaining, _CANCEL_POLL_S))
            break
        except subprocess.TimeoutExpired:
            continue
    if _group_alive(process.pid):
        # The main process is done; background children it left are strays of this command.
        _stop_group(process, grace)
    return "exited"


def _stop_group(process: subprocess.Popen[bytes], grace: float) -> None:
    """SIGTERM the process group, give it ``grace`` seconds, then SIGKILL whatever is left."""
    _signal_group(process.pid, signal_module.SIGTERM)
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline:
        # Reap the leader as soon as it exits so that it stops counting as a group member.
        if process.poll() is not None and not _group_alive(process.pid):
            return
        time.sleep(_POLL_S)
    _signal_group(process.pid, signal_module.SIGKILL)
    process.wait()
    # SIGKILL is delivered asynchronously; wait until the kernel has removed the other members too.
    deadline = time.monotonic() + grace
    while _group_alive(process.pid) and time.monotonic() < deadline:
        time.sleep(_POLL_S)


def _signal_group(pgid: int, sig: signal_module.Signals) -> None:
    try:
        os.killpg(pgid, sig)
    except ProcessLookupError:
        pass  # the group is already gone


def _group_alive(pgid: int) -> bool:
    """True while any process (zombies included) is still in the group."""
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # exists, but (after a setuid exec) is no longer ours to signal
    return True


class OutputCapture:
    """Redacts a stream of output bytes, appends it to a log and keeps a bounded tail.

    Shared by :func:`run` and :func:`stackforge.edges.docker_engine.run_container` so that processes and
    containers treat output and secrets identically. Thread-safe for one writer and any readers.
    """

    def __init__(self, *, tail_chars: int, redact: Sequence[str] = (), log: IO[str] | None = None) -> None:
        self._limit = max(0, tail_chars)
        self._secrets = _secrets(redact)
        self._log = log
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._chunks: collections.deque[str] = collections.deque()
        self._size = 0
        self._lock = threading.Lock()

    def feed(self, data: bytes) -> None:
        """Take the next piece of output (any size; a multi-byte character may be split)."""
        self._add(self._decoder.decode(data))

    def finish(self) -> None:
        """Flush a trailing incomplete character (as U+FFFD) once the stream has ended."""
        self._add(self._decoder.decode(b"", final=True))

    def tail(self) -> str:
        """The last ``tail_chars`` characters seen so far, redacted."""
        with self._lock:
            joined = "".join(self._chunks)
        return joined[-self._limit:] if self._limit else ""

    def _add(self, text: str) -> None:
        if not text:
            return
        # Redacting per piece: a secret split across two pieces (only possible inside lines longer
        # than the 64 KiB read size) would slip through; secrets live in short lines in practice.
        text = _redact(text, self._secrets)
        write_log(self._log, text)
        with self._lock:
            self._chunks.append(text)
            self._size += len(text)
            # Drop whole pieces from the left while the rest still covers the limit.
            while self._chunks and self._size - len(self._chunks[0]) >= self._limit:
                self._size -= len(self._chunks.popleft())


def _pump_output(stream: IO[bytes] | None, capture: OutputCapture) -> None:
    """Copy the command's output, line by line, into the capture until every writer has closed it."""
    if stream is None:
        return
    with stream:
        while chunk := stream.readline(_READ_CHUNK_BYTES):
            capture.feed(chunk)
    capture.finish()


class _NoLog:
    """Stands in for a log file when none was asked for."""

    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        return None


def open_log(log_path: Path | None) -> IO[str] | _NoLog:
    """Open ``log_path`` for appending (creating folders), or a stand-in yielding None when no path."""
    if log_path is None:
        return _NoLog()
    log_path = Path(log_path)
    log_path.parent.mkdir(parents=True, exist_ok=True)
    # Line-buffered so that `tail -f` on the log follows a long build as it happens.
    return open(log_path, "a", encoding="utf-8", buffering=1)


def write_log(log: IO[str] | None, text: str) -> None:
    """Append ``text`` to an open log (from :func:`open_log`); None means no log."""
    if log is None:
        return
    try:
        log.write(text)
    except ValueError:
        pass  # closed: a process that left our group still holds the pipe after we finished
