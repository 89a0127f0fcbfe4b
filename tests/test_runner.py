"""stackforge.edges.runner against real subprocesses: timeouts, process groups, signals, tails, secrets."""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
from pathlib import Path

import pytest

from stackforge.core.errors import CommandError, CommandTimeout, HostError
from stackforge.edges import runner


def _running(pid: int) -> bool:
    """True while ``pid`` exists and is not a zombie (a zombie has stopped running)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    state = stat.rsplit(")", 1)[1].split()[0]
    return state != "Z"


def _wait_gone(pids: list[int], within_s: float = 5.0) -> list[int]:
    """The pids still running after ``within_s`` (the kernel finishes SIGKILL asynchronously)."""
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        alive = [pid for pid in pids if _running(pid)]
        if not alive:
            return []
        time.sleep(0.05)
    return alive


def _pids(output: str, key: str) -> list[int]:
    return [int(line.split("=", 1)[1]) for line in output.splitlines() if line.startswith(key + "=")]


# Prints the pids of a child and a grandchild (both sleeping), then waits forever.
FAMILY = (
    'sleep 300 & echo child=$!; '
    'sh -c \'sleep 300 & echo grandchild=$!; wait\' & '
    'wait'
)


def test_success_reports_exit_output_and_no_signal() -> None:
    result = runner.run(["sh", "-c", "echo hello; echo oops >&2"], timeout=30)
    assert result.returncode == 0
    assert result.succeeded
    assert result.signal is None
    assert not result.timed_out
    assert "hello\n" in result.output_tail and "oops\n" in result.output_tail
    assert result.argv == ("sh", "-c", "echo hello; echo oops >&2")
    assert 0 <= result.duration_s < 30


def test_nonzero_exit_is_reported_not_raised() -> None:
    result = runner.run(["sh", "-c", "echo failing; exit 3"], timeout=30)
    assert result.returncode == 3
    assert not result.succeeded
    assert result.signal is None
    assert result.describe() == "exited with status 3"


def test_check_run_raises_command_error_with_context() -> None:
    with pytest.raises(CommandError) as caught:
        runner.check_run(["sh", "-c", "echo the-reason; exit 4"], timeout=30)
    error = caught.value
    assert not isinstance(error, CommandTimeout)
    assert error.returncode == 4
    assert error.argv[0] == "sh"
    assert "the-reason" in error.output_tail
    assert "exited with status 4" in error.one_line()
    assert "\n" not in error.one_line()


def test_timeout_kills_whole_process_group_including_grandchildren() -> None:
    started = time.monotonic()
    result = runner.run(["sh", "-c", FAMILY], timeout=2, grace=1)
    elapsed = time.monotonic() - started

    assert result.timed_out
    assert result.signal == signal.SIGTERM  # sh dies by the first, polite signal
    assert result.returncode == -signal.SIGTERM
    assert elapsed < 10
    pids = _pids(result.output_tail, "child") + _pids(result.output_tail, "grandchild")
    assert len(pids) == 2, result.output_tail
    assert _wait_gone(pids) == []


def test_timeout_escalates_to_sigkill_when_sigterm_is_ignored() -> None:
    # Ignored signals are inherited across exec, so the sleep ignores SIGTERM too.
    script = 'trap "" TERM; sleep 300 & echo child=$!; wait'
    started = time.monotonic()
    result = runner.run(["sh", "-c", script], timeout=1, grace=1)
    elapsed = time.monotonic() - started

    assert result.timed_out
    assert result.signal == signal.SIGKILL
    assert 2 <= elapsed < 10  # timeout + the whole grace period, then the kill
    assert _wait_gone(_pids(result.output_tail, "child")) == []


def test_check_run_timeout_raises_command_timeout() -> None:
    with pytest.raises(CommandTimeout) as caught:
        runner.check_run(["sleep", "300"], timeout=0.5, grace=1)
    assert "timed out" in caught.value.one_line()


def test_background_leftovers_are_stopped_when_the_command_exits() -> None:
    started = time.monotonic()
    result = runner.run(["sh", "-c", "sleep 300 & echo child=$!"], timeout=60, grace=1)

    assert result.returncode == 0 and not result.timed_out
    assert time.monotonic() - started < 10  # did not wait for the stray sleep
    assert _wait_gone(_pids(result.output_tail, "child")) == []


@pytest.mark.parametrize(("signal_name", "number"), [("SEGV", 11), ("ABRT", 6), ("KILL", 9)])
def test_crash_by_signal_is_reported(signal_name: str, number: int) -> None:
    result = runner.run(["sh", "-c", f"kill -{signal_name} $$"], timeout=30)
    assert result.signal == number
    assert result.returncode == -number
    assert not result.timed_out
    assert result.describe() == f"killed by SIG{signal_name}"


def test_tail_is_bounded_but_log_has_everything(tmp_path: Path) -> None:
    log = tmp_path / "logs" / "big.log"
    code = "for i in range(20000): print(f'line {i:05d}')\nprint('THE-END')"
    result = runner.run([sys.executable, "-c", code], timeout=60, log_path=log, tail_chars=1000)

    assert len(result.output_tail) == 1000
    assert result.output_tail.endswith("THE-END\n")
    text = log.read_text()
    assert text.startswith("$ ")
    assert "line 00000\n" in text and "line 19999\n" in text
    assert "exited with status 0" in text.splitlines()[-1]


def test_endless_line_without_newline_keeps_tail_bounded() -> None:
    code = "import sys\nsys.stdout.write('x' * 3_000_000 + 'END')"
    result = runner.run([sys.executable, "-c", code], timeout=60, tail_chars=500)
    assert len(result.output_tail) == 500
    assert result.output_tail.endswith("xEND")


def test_redact_hides_secrets_in_log_tail_and_argv(tmp_path: Path) -> None:
    secret = "s3cr3t-T0KEN"
    log = tmp_path / "cmd.log"
    result = runner.run(["sh", "-c", f"echo token is {secret}; echo {secret} >&2"], timeout=30,
                        log_path=log, redact=[secret, ""])

    assert secret not in result.output_tail
    assert result.output_tail.count("***") == 2
    assert all(secret not in arg for arg in result.argv)
    assert secret not in log.read_text()
    assert "token is ***" in log.read_text()


def test_redact_hides_secrets_in_check_run_error() -> None:
    secret = "hunter2-password"
    with pytest.raises(CommandError) as caught:
        runner.check_run(["sh", "-c", f"echo {secret}; exit 1"], timeout=30, redact=[secret])
    assert secret not in caught.value.one_line()
    assert secret not in caught.value.output_tail
    assert all(secret not in arg for arg in caught.value.argv)


def test_missing_program_is_a_one_line_host_error() -> None:
    with pytest.raises(HostError) as caught:
        runner.run(["stackforge-no-such-program", "--version"], timeout=5)
    line = caught.value.one_line()
    assert "stackforge-no-such-program" in line
    assert "\n" not in line


def test_missing_working_directory_is_a_host_error(tmp_path: Path) -> None:
    with pytest.raises(HostError, match="does not exist"):
        runner.run(["true"], timeout=5, cwd=tmp_path / "absent")


def test_input_text_reaches_stdin_and_no_input_means_devnull() -> None:
    assert runner.run(["cat"], timeout=30, input_text="piped\n").output_tail == "piped\n"
    # Without input, stdin is /dev/null: cat ends at once instead of waiting for a terminal.
    quiet = runner.run(["cat"], timeout=30)
    assert quiet.returncode == 0 and quiet.output_tail == ""


def test_env_is_added_to_the_current_environment(tmp_path: Path) -> None:
    result = runner.run(["sh", "-c", 'echo "$SF_RUNNER_TEST:$HOME"'], timeout=30,
                        env={"SF_RUNNER_TEST": "added"}, cwd=tmp_path)
    assert result.output_tail == f"added:{os.environ['HOME']}\n"


def test_keyboard_interrupt_stops_the_group_and_is_reraised(tmp_path: Path) -> None:
    log = tmp_path / "interrupted.log"
    # Deliver a real SIGINT to this (main) thread while run() is waiting.
    timer = threading.Timer(1.0, os.kill, (os.getpid(), signal.SIGINT))
    timer.start()
    try:
        with pytest.raises(KeyboardInterrupt):
            runner.run(["sh", "-c", FAMILY], timeout=60, log_path=log, grace=1)
    finally:
        timer.cancel()
    pids = _pids(log.read_text(), "child") + _pids(log.read_text(), "grandchild")
    assert len(pids) == 2
    assert _wait_gone(pids) == []


@pytest.mark.parametrize("where", ["_feed_stdin", "_pump_output"])
def test_an_interrupt_while_the_threads_start_stops_the_group(monkeypatch, where: str) -> None:
    # The command runs in its own session from the start: an interrupt between its start and the
    # wait (here: while the stdin feeder or the output pump starts) must stop it all the same.
    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    started = []

    def start(*args, **kwargs):
        started.append(real_start(*args, **kwargs))
        return started[-1]

    real_start = runner._start
    monkeypatch.setattr(runner, "_start", start)
    if where == "_pump_output":
        monkeypatch.setattr(threading.Thread, "start", interrupted)
    else:
        monkeypatch.setattr(runner, "_feed_stdin", interrupted)
    with pytest.raises(KeyboardInterrupt):
        runner.run(["sleep", "60"], timeout=60, input_text="", grace=1)
    monkeypatch.undo()
    try:
        assert _wait_gone([started[0].pid], within_s=3) == []
    finally:
        started[0].kill()
        started[0].wait()


def test_argv_must_not_be_a_string_or_empty() -> None:
    with pytest.raises(TypeError):
        runner.run("echo hi", timeout=5)  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        runner.run([], timeout=5)
    with pytest.raises(ValueError):
        runner.run(["true"], timeout=0)


def test_which_finds_programs_on_path() -> None:
    assert runner.which("sh") is not None
    assert runner.which("stackforge-no-such-program") is None


def test_cancel_flag_from_another_thread_stops_the_group() -> None:
    cancel = threading.Event()
    timer = threading.Timer(1.0, cancel.set)
    timer.start()
    started = time.monotonic()
    try:
        result = runner.run(["sh", "-c", FAMILY], timeout=120, grace=1, cancel=cancel)
    finally:
        timer.cancel()

    assert result.cancelled and not result.timed_out and not result.succeeded
    assert time.monotonic() - started < 10
    assert result.describe().startswith("cancelled after")
    pids = _pids(result.output_tail, "child") + _pids(result.output_tail, "grandchild")
    assert len(pids) == 2
    assert _wait_gone(pids) == []


def test_check_run_raises_when_cancelled() -> None:
    cancel = threading.Event()
    cancel.set()
    with pytest.raises(CommandError) as caught:
        runner.check_run(["sleep", "300"], timeout=120, grace=1, cancel=cancel)
    assert not isinstance(caught.value, CommandTimeout)
    assert "cancelled" in caught.value.one_line()


def test_result_of_lets_a_signal_through_while_it_waits():
    """The main thread waiting on a worker's future must still run its signal handler: a SIGTERM the
    kernel hands to the worker thread raises Terminated in the waiting thread, not when the work ends."""
    import concurrent.futures
    import signal
    import threading
    import time

    from stackforge.core.errors import Terminated

    release = threading.Event()

    def work() -> str:
        time.sleep(0.5)   # the main thread is blocked in result_of by now
        signal.pthread_kill(threading.get_ident(), signal.SIGTERM)   # lands on this worker thread
        release.wait(30)
        return "done"

    with concurrent.futures.ThreadPoolExecutor(max_workers=1) as pool:
        started = time.monotonic()
        try:
            with runner.signals_as_interrupts(), pytest.raises(Terminated):
                runner.result_of(pool.submit(work))
        finally:
            release.set()
    assert time.monotonic() - started < 10
