"""stackforge.build without building images: classification, records, argv, asset server, cancel."""

from __future__ import annotations

import json
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from _build_helpers import small_cell
from rich.console import Console

from stackforge.build import BuildOptions, BuildRecord, BuildStatus, BuildSummary
from stackforge.build.assets import AssetServer
from stackforge.build.buildkit import buildx_argv, proxy_build_args, supports_named_contexts
from stackforge.build.cancel import Cancel
from stackforge.build.classify import FailureKind, diagnose, last_error_line
from stackforge.build.metadata import CONTENT_HASH_LABEL, FREEZE_LABEL, dynamic_labels
from stackforge.build.progress import Board, progress_table, summary_table
from stackforge.build.records import BaseImage, read_record, record_path, write_record
from stackforge.build.verify import _no_deps_packages, _torch_checks
from stackforge.compose.dockerfile import compose_stack
from stackforge.core.errors import RecordError, SpecError
from stackforge.core.records import Status
from stackforge.edges import runner

# --------------------------------------------------------------------------- classification

PIP_GIVES_UP = """\
#9 3.1 WARNING: Retrying (Retry(total=4, connect=None, read=None)) after connection broken by 'ReadTimeoutError("HTTPSConnectionPool(host='pypi.org', port=443): Read timed out. (read timeout=60)")': /simple/flashinfer-python/
#9 9.2 ERROR: Could not find a version that satisfies the requirement flashinfer-python==0.0.0.99 (from versions: 0.2.0, 0.6.6)
#9 9.2 ERROR: No matching distribution found for flashinfer-python==0.0.0.99
#9 ERROR: process "/bin/bash -o pipefail -c pip install ..." did not complete successfully: exit code: 1
"""

CONNECTION_RESET = """\
#9 12.0 Collecting numpy
#9 40.1 ERROR: Exception:
#9 40.1 urllib3.exceptions.ProtocolError: ("Connection broken: ConnectionResetError(104, 'Connection reset by peer')", ConnectionResetError(104, 'Connection reset by peer'))
#9 ERROR: process "/bin/bash -o pipefail -c pip install" did not complete successfully: exit code: 2
"""


def test_pip_giving_up_is_permanent_even_after_retry_warnings():
    diagnosis = diagnose(PIP_GIVES_UP)
    assert diagnosis.kind is FailureKind.PERMANENT and not diagnosis.retryable
    assert diagnosis.line == "No matching distribution found for flashinfer-python==0.0.0.99"


def test_connection_reset_is_transient():
    diagnosis = diagnose(CONNECTION_RESET)
    assert diagnosis.kind is FailureKind.TRANSIENT and diagnosis.retryable
    assert "Connection reset by peer" in diagnosis.line


def test_unknown_failure_reports_the_last_error_line_without_buildkit_prefix():
    tail = "#5 0.3 something\n#5 0.4 ERROR: the sky fell\n#5 DONE\n"
    diagnosis = diagnose(tail)
    assert diagnosis.kind is FailureKind.UNKNOWN and diagnosis.line == "ERROR: the sky fell"
    assert last_error_line("") == ""


# --------------------------------------------------------------------------- records


def make_record(**overrides) -> BuildRecord:
    stack, derived = small_cell()
    values = dict(stack_id=stack.id, stack=stack.to_json(), derived=derived.to_json(), status=BuildStatus.BUILT,
                  image_tag="stackforge/x:abc", image_id="sha256:1", content_hash="abc",
                  base=BaseImage(requested="python:3.11-slim-bookworm", used="stackforge/debian:bookworm",
                                 how="substituted", note="no registry"),
                  durations={"build": 1.5}, installed={"torch": "2.13.0+cpu"})
    values.update(overrides)
    return BuildRecord(**values)


def test_record_round_trips_through_json(tmp_path):
    record = make_record()
    path = write_record(tmp_path, record)
    assert path == record_path(tmp_path, record.stack_id)
    assert read_record(tmp_path, record.stack_id) == record
    data = json.loads(path.read_text())
    assert data["schema"] == "stackforge.build" and data["status"] == "built"
    assert data["base"]["requested"] != data["base"]["used"]
    assert [p.name for p in path.parent.iterdir()] == [path.name]   # no temporary files left


def test_missing_record_is_none_and_broken_records_raise(tmp_path):
    assert read_record(tmp_path, "nope") is None
    path = record_path(tmp_path, "broken")
    path.parent.mkdir(parents=True)
    path.write_text("{not json")
    with pytest.raises(RecordError, match="not valid JSON"):
        read_record(tmp_path, "broken")
    path.write_text(json.dumps({**make_record().to_json(), "schema_version": 99}))
    with pytest.raises(RecordError, match="newer"):
        read_record(tmp_path, "broken")
    path.write_text(json.dumps({"schema": "stackforge.build", "schema_version": 1, "status": "built"}))
    with pytest.raises(RecordError, match="partial or corrupt"):
        read_record(tmp_path, "broken")


def test_summary_counts_and_failed_ids():
    summary = BuildSummary((make_record(), make_record(stack_id="b", status=BuildStatus.FAILED, reason="boom")),
                           builder="buildkit", duration_s=3.0)
    assert summary.failed == ("b",) and not summary.ok
    assert summary.count(BuildStatus.BUILT) == 1
    console = Console(record=True, width=200)
    console.print(summary_table(summary))
    text = console.export_text()
    assert "1 built, 1 failed" in text and "boom" in text


def test_progress_board_tracks_phases():
    board = Board(["a", "b"])
    board.update("a", phase="build")
    board.update("b", status="failed", done=True)
    rows = {row.stack_id: row for row in board.snapshot()}
    assert rows["a"].phase == "build" and rows["b"].status == "failed" and rows["b"].finished is not None
    console = Console(record=True, width=120)
    console.print(progress_table(board.snapshot(), time.monotonic()))
    assert "build" in console.export_text()


# --------------------------------------------------------------------------- options


def test_build_options_validate():
    with pytest.raises(SpecError):
        BuildOptions(jobs=0)
    with pytest.raises(SpecError, match="no-deps"):
        BuildOptions(no_deps=frozenset({"torch"}))
    render = BuildOptions(find_links=Path("/opt/wheels"), ca_bundle=Path("/x.pem")).compose_options(
        buildkit=True, base_image="b:1")
    assert render.wheelhouse and render.ca_bundle and render.base_image == "b:1"


# --------------------------------------------------------------------------- buildx argv


def test_buildx_argv_passes_the_ca_as_a_secret_file_and_proxies_by_name(tmp_path):
    ca = tmp_path / "ca.pem"
    ca.write_text("-----BEGIN CERTIFICATE-----\nSECRET-CONTENT\n")
    argv = buildx_argv(tmp_path / "ctx", iidfile=tmp_path / "iid", ca_bundle=ca, wheelhouse_context=tmp_path,
                       labels=[("io.stackforge.test", "1")], proxy_args=["HTTPS_PROXY"], no_cache=True)
    text = " ".join(argv)
    assert argv[:3] == ["docker", "buildx", "build"]
    assert "--network host" in text and "--load" in text and "--no-cache" in text
    assert f"--secret id=ca,src={ca.resolve()}" in text
    assert f"--build-context wheelhouse={tmp_path.resolve()}" in text
    assert "--build-arg HTTPS_PROXY" in text and "SECRET-CONTENT" not in text
    assert argv[-1] == str(tmp_path / "ctx")


def test_proxy_build_args_only_names_variables_that_are_set():
    assert proxy_build_args({"HTTPS_PROXY": "http://u:p@proxy:3128", "NO_PROXY": ""}) == ["HTTPS_PROXY"]


def test_named_contexts_need_buildkit_0_10():
    assert not supports_named_contexts((0, 8)) and not supports_named_contexts(None)
    assert supports_named_contexts((0, 10)) and supports_named_contexts((1, 0))


# --------------------------------------------------------------------------- asset server


def fetch(url: str) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=10) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as error:
        return error.code, b""


def test_asset_server_serves_the_ca_and_the_wheelhouse_only(tmp_path):
    ca = tmp_path / "ca.pem"
    ca.write_bytes(b"-----BEGIN CERTIFICATE-----\nMARKER\n")
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    (wheels / "pkg-1.0-py3-none-any.whl").write_bytes(b"wheel-bytes")
    (wheels / "notes.txt").write_text("not a wheel")
    (tmp_path / "secret.txt").write_text("private")
    with AssetServer(ca_bundle=ca, wheelhouse=wheels, port=0) as server:
        base = f"http://127.0.0.1:{server.port}"
        assert fetch(f"{base}/ca.pem") == (200, ca.read_bytes())
        status, index = fetch(f"{base}/wheelhouse/")
        assert status == 200 and b'href="pkg-1.0-py3-none-any.whl"' in index and b"notes.txt" not in index
        assert fetch(f"{base}/wheelhouse/pkg-1.0-py3-none-any.whl") == (200, b"wheel-bytes")
        assert fetch(f"{base}/wheelhouse/notes.txt")[0] == 404
        assert fetch(f"{base}/wheelhouse/../secret.txt")[0] == 404
        assert fetch(f"{base}/wheelhouse/%2e%2e/secret.txt")[0] == 404
        assert fetch(f"{base}/secret.txt")[0] == 404
    with pytest.raises(urllib.error.URLError):   # closed with the build run: nothing serves the CA any more
        fetch(f"{base}/ca.pem")


def test_asset_server_moves_to_a_free_port_when_its_port_is_taken():
    with AssetServer(ca_bundle=None, wheelhouse=None, port=0) as first:
        with AssetServer(ca_bundle=None, wheelhouse=None, port=first.port) as second:
            assert second.port != first.port
            assert fetch(f"http://127.0.0.1:{second.port}/ca.pem")[0] == 404   # no CA configured


# --------------------------------------------------------------------------- cancellation


def test_cancel_runs_registered_callbacks_once_and_wakes_waiters():
    cancel = Cancel()
    calls: list[str] = []
    with cancel.on_cancel(lambda: calls.append("a")):
        cancel.cancel()
        cancel.cancel()
    assert calls == ["a"] and cancel.requested and cancel.wait(5)
    with cancel.on_cancel(lambda: calls.append("late")):
        pass
    assert calls == ["a", "late"]   # registered after the cancel: stopped right away


def test_a_cancel_stops_a_running_command_through_the_runners_hook():
    """buildkit hands its Cancel to runner.run: a cancel from another thread stops the command's group."""
    cancel = Cancel()
    results = []
    worker = threading.Thread(target=lambda: results.append(
        runner.run(["sh", "-c", "sleep 60"], timeout=120, cancel=cancel)))
    started = time.monotonic()
    worker.start()
    time.sleep(0.3)
    cancel.cancel()
    worker.join(timeout=20)
    assert not worker.is_alive() and time.monotonic() - started < 30
    assert results[0].cancelled and not results[0].timed_out and not results[0].succeeded


# --------------------------------------------------------------------------- metadata and verify


def test_dynamic_labels_carry_hash_freeze_and_base():
    stack, derived = small_cell()
    rendered = compose_stack(stack, derived)
    base = BaseImage(requested="python:3.11-slim-bookworm", used="stackforge/debian:bookworm", how="substituted",
                     image_id="sha256:b", digest="stackforge/debian@sha256:d")
    labels = dynamic_labels(rendered, base, ["torch==2.13.0+cpu", "sglang==0.5.9"], "2026-01-01T00:00:00Z",
                            [("io.stackforge.test", "1")])
    assert labels[CONTENT_HASH_LABEL] == rendered.content_hash
    assert json.loads(labels[FREEZE_LABEL]) == ["torch==2.13.0+cpu", "sglang==0.5.9"]
    assert labels["org.opencontainers.image.base.digest"] == "sha256:d"
    assert labels["io.stackforge.base.how"] == "substituted" and labels["io.stackforge.test"] == "1"


def test_torch_checks_catch_a_silently_replaced_torch():
    stack, derived = small_cell()   # wants torch 2.13.0, variant cpu
    good = {"torch": {"version": "2.13.0+cpu", "cuda": None}}
    assert [c.status for c in _torch_checks(stack, derived, good)] == [Status.PASS, Status.PASS]
    replaced = {"torch": {"version": "2.13.0+cu130", "cuda": "13.0"}}
    checks = _torch_checks(stack, derived, replaced)
    assert checks[0].status is Status.PASS and checks[1].status is Status.FAIL
    assert "cu130" in checks[1].actual
    drifted = {"torch": {"version": "2.9.1+cpu", "cuda": None}}
    assert _torch_checks(stack, derived, drifted)[0].status is Status.FAIL
    missing = {"torch_error": "ModuleNotFoundError: No module named 'torch'"}
    assert _torch_checks(stack, derived, missing)[0].status is Status.FAIL


def test_no_deps_packages_are_named_as_pip_check_prints_them():
    stack, derived = small_cell()
    assert _no_deps_packages(stack, derived, frozenset({"sglang"})) == {"sglang"}
    assert "flashinfer-python" in _no_deps_packages(stack, derived, frozenset({"flashinfer"}))
    assert _no_deps_packages(stack, derived, frozenset()) == set()


# --------------------------------------------------------------------------- declared requirements


def test_pick_wheel_takes_a_pure_or_linux_x86_64_wheel_of_the_release():
    from stackforge.build.requires import _pick_wheel
    from stackforge.edges.index import IndexEntry
    files = [IndexEntry("pkg-1.0.tar.gz", "u0"),
             IndexEntry("pkg-1.0-cp310-abi3-manylinux2014_aarch64.whl", "u1"),
             IndexEntry("pkg-1.0-cp310-abi3-manylinux2014_x86_64.whl", "u2"),
             IndexEntry("pkg-1.1-py3-none-any.whl", "u3"),
             IndexEntry("pkg-1.0-py3-none-any.whl", "u4", yanked=True)]
    assert _pick_wheel(files, "pkg", "1.0").url == "u2"
    assert _pick_wheel(files, "pkg", "1.1").url == "u3"
    assert _pick_wheel(files, "pkg", "2.0") is None


def test_declared_requirements_read_through_the_index_client_from_a_file_index(tmp_path):
    """requires lists files through stackforge.edges.index, so a file:// (PEP 503 folder) index works too."""
    import zipfile

    from stackforge.build.requires import LookupStatus, lookup_declared
    project = tmp_path / "simple" / "pkg"
    project.mkdir(parents=True)
    with zipfile.ZipFile(project / "pkg-1.0-py3-none-any.whl", "w") as wheel:
        wheel.writestr("pkg-1.0.dist-info/METADATA", "Metadata-Version: 2.1\nName: pkg\nVersion: 1.0\n"
                                                    "Requires-Dist: numpy>=1.26\nRequires-Dist: torch; extra == 'x'\n\n")
    found = lookup_declared("pkg", "1.0", index_url=(tmp_path / "simple").as_uri())
    assert found.status is LookupStatus.FOUND, found.reason
    assert found.requirements == ("numpy>=1.26", "torch; extra == 'x'")
    assert lookup_declared("pkg", "2.0", index_url=(tmp_path / "simple").as_uri()).status is LookupStatus.NOT_LISTED


def test_declared_requirements_of_a_real_release():
    """Reads FlashInfer 0.6.6's Requires-Dist from PyPI (range requests into the wheel if need be)."""
    from stackforge.build.requires import LookupStatus, lookup_declared
    try:
        urllib.request.urlopen("https://pypi.org/simple/", timeout=10).close()
    except OSError as error:
        pytest.skip(f"PyPI is not reachable: {error}")
    found = lookup_declared("flashinfer-python", "0.6.6")
    assert found.status is LookupStatus.FOUND, found.reason
    assert "torch" in found.requirements
    assert any(line.startswith("nvidia-cutlass-dsl") for line in found.requirements)
    assert lookup_declared("flashinfer-python", "0.0.0.99").status is LookupStatus.NOT_LISTED


@pytest.mark.parametrize("width", [80, 100, 200])
def test_summary_table_keeps_stack_ids_whole_at_any_width(width):
    long_id = "cu131-torch2.14.1-fi0.7.2-sgl0.5.23-py311-wheels-debian12"
    summary = BuildSummary((make_record(stack_id=long_id),
                            make_record(stack_id="cu128-torch2.9.1-fi0.6.3-sgl0.5.9-py312", status=BuildStatus.FAILED,
                                        reason="pip could not resolve flashinfer-python==0.6.3 " * 3)),
                           builder="buildkit", duration_s=3.0)
    console = Console(record=True, width=width)
    console.print(summary_table(summary, console.width))
    text = console.export_text()
    assert long_id in text and "cu128-torch2.9.1-fi0.6.3-sgl0.5.9-py312" in text     # each id on one line
    assert max(len(line) for line in text.splitlines()) <= width
    assert "…" not in text and text.count("pip could not resolve") == 3               # reasons wrap, never cut


@pytest.mark.parametrize("width", [80, 200])
def test_summary_says_what_verification_found(width):
    passed = {"status": "pass", "checks": [{"name": "python", "status": "pass"}, {"name": "torch", "status": "pass"}]}
    failed = {"status": "fail", "checks": [{"name": "python", "status": "pass"}, {"name": "nvcc", "status": "fail"}]}
    ids = [f"cu131-torch2.14.1-fi0.7.2-sgl0.5.23-py311-wheels-debian12-{n}" for n in "abc"]
    summary = BuildSummary((make_record(stack_id=ids[0], verify=passed), make_record(stack_id=ids[1], verify=failed),
                            make_record(stack_id=ids[2])), builder="buildkit", duration_s=3.0)
    console = Console(record=True, width=width)
    console.print(summary_table(summary, console.width))
    text = console.export_text()
    assert "verified (2 checks)" in text and "verification failed (nvcc)" in text
    assert text.count("verif") == 2                                    # c was not verified: nothing claimed
