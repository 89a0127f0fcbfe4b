"""Stable identity of a build (issue #32, items 11, 12 and 14's render bits), without an engine:

* nothing host-local (the asset server's port) enters the Dockerfile, so two builds of one stack
  planned with different ports render the same bytes and the same tag;
* two runs building one stack into one --out take turns, and each run has its own log;
* ``--locked`` names a wheel URL that moved; the default mode checks recorded sha256s against the index
  before any image work;
* ``render --out X`` keeps its locks inside X.
"""

from __future__ import annotations

import dataclasses
import http.server
import json
import threading
import time
from pathlib import Path

import pytest

from _build_helpers import small_cell
from stackforge.build import locking
from stackforge.build.buildkit import buildx_argv
from stackforge.build.cancel import Cancel
from stackforge.build.locking import LockMode, obtain_lock
from stackforge.build.options import BuildOptions
from stackforge.build.progress import Board
from stackforge.build.records import BaseImage, BuildStatus
from stackforge.compose.stack_lock import LockedFile, LockedPackage, LockRequest, StackLock, lock_changes
from stackforge.core.errors import SpecError
from stackforge.edges.resolver import ResolverIndexes


def _job(tmp_path: Path, *, port: int | None, run_id: str, out: Path):
    """One stack's build as the scheduler sets it up: classic builder, CA bundle and wheelhouse served
    from the asset server on ``port``."""
    from stackforge.build.scheduler import _Run, _StackBuild
    (tmp_path / "wheels").mkdir(exist_ok=True)
    (tmp_path / "ca.pem").write_text("-----BEGIN CERTIFICATE-----\n")
    stack, derived = small_cell()
    options = BuildOptions(out_dir=out, find_links=tmp_path / "wheels", ca_bundle=tmp_path / "ca.pem",
                           dependency_layers=False)
    run = _Run(client=None, options=options, builder="classic", named_contexts=False, asset_port=port,
               run_id=run_id, cancel=Cancel(), board=Board([stack.id]), resolver=None, requirements=None, redact=())
    return _StackBuild(run, stack, derived)


def test_two_builds_with_different_asset_ports_render_the_same_dockerfile_and_tag(tmp_path):
    first = _job(tmp_path, port=38751, run_id="r1", out=tmp_path / "a")
    second = _job(tmp_path, port=40123, run_id="r2", out=tmp_path / "b")
    base = BaseImage(requested="python:3.11-slim-bookworm", used="python:3.11-slim-bookworm", how="local")
    one, two = first.compose(base), second.compose(base)
    assert one.dockerfile == two.dockerfile and one.tag == two.tag and one.content_hash == two.content_hash
    assert "38751/" not in one.dockerfile and "40123" not in one.dockerfile
    from stackforge.compose.dockerfile import ASSET_PORT_ARG
    assert f"${{{ASSET_PORT_ARG}}}/wheelhouse/" in one.dockerfile and f"ARG {ASSET_PORT_ARG}=" in one.dockerfile
    # the port reaches the build as a build argument instead, the one each run's server got
    assert first._asset_args() == {ASSET_PORT_ARG: "38751"} and second._asset_args() == {ASSET_PORT_ARG: "40123"}
    argv = buildx_argv(tmp_path, iidfile=tmp_path / "iid", ca_bundle=None, wheelhouse_context=None, labels=(),
                       proxy_args=(), build_args=second._asset_args())
    assert argv[argv.index(f"{ASSET_PORT_ARG}=40123") - 1] == "--build-arg"


def test_a_dockerfile_that_fetches_nothing_from_the_asset_server_declares_no_port_argument(tmp_path):
    from stackforge.compose.dockerfile import ASSET_PORT_ARG, ComposeOptions, compose_stack
    stack, derived = small_cell()
    text = compose_stack(stack, derived, ComposeOptions(buildkit=True, wheelhouse=True, ca_bundle=True)).dockerfile
    assert ASSET_PORT_ARG not in text and "127.0.0.1" not in text


def test_each_build_run_writes_its_own_log_and_its_record_names_it(tmp_path):
    out = tmp_path / "out"
    first = _job(tmp_path, port=None, run_id="20260101T000000Z-aaaaaa", out=out)
    second = _job(tmp_path, port=None, run_id="20260101T000001Z-bbbbbb", out=out)
    first.log("first run's line")
    second.log("second run's line")
    assert first.log_path != second.log_path
    assert "first run's line" in first.log_path.read_text() and "second" not in first.log_path.read_text()
    record = second.record(BuildStatus.FAILED, "x")
    assert record.log_path == str(second.log_path) and "bbbbbb" in record.log_path


def test_two_runs_building_one_stack_into_one_out_take_turns(tmp_path):
    from stackforge.build.claim import stack_claim
    held, released, order = threading.Event(), threading.Event(), []

    def first() -> None:
        with stack_claim(tmp_path, "s", cancel=Cancel(), holder="run-1") as ours:
            assert ours
            order.append("first in")
            held.set()
            released.wait(5)
            order.append("first out")

    thread = threading.Thread(target=first)
    thread.start()
    held.wait(5)
    told: list[str] = []
    threading.Timer(0.5, released.set).start()
    with stack_claim(tmp_path, "s", cancel=Cancel(), holder="run-2", tell=told.append) as ours:
        assert ours
        order.append("second in")
    thread.join(5)
    assert order == ["first in", "first out", "second in"]
    assert told and "run-1" in told[0]


def test_a_run_cancelled_while_waiting_for_its_turn_builds_nothing(tmp_path):
    from stackforge.build.claim import stack_claim
    held, released = threading.Event(), threading.Event()

    def first() -> None:
        with stack_claim(tmp_path, "s", cancel=Cancel(), holder="run-1"):
            held.set()
            released.wait(5)

    thread = threading.Thread(target=first)
    thread.start()
    held.wait(5)
    cancel = Cancel()
    threading.Timer(0.3, cancel.cancel).start()
    started = time.monotonic()
    with stack_claim(tmp_path, "s", cancel=cancel, holder="run-2") as ours:
        assert ours is False
    assert time.monotonic() - started < 3
    released.set()
    thread.join(5)


# --------------------------------------------------------------------------- lock checks

SHA_OLD, SHA_INDEX = "a" * 64, "b" * 64
WHEEL = "demo-1.0-py3-none-any.whl"


def _request(index_url: str | None = None) -> LockRequest:
    return LockRequest(stack_id="s", python="3.11", platform="x86_64-manylinux_2_36",
                       layers=(("sglang", ("demo==1.0",)),), index_url=index_url)


def _lock(request: LockRequest, *, url: str, sha256: str) -> StackLock:
    return StackLock(stack_id="s", request_key=request.key(), python="3.11", platform=request.platform,
                     resolver="uv test", packages=(LockedPackage("demo", "1.0", (LockedFile("wheel", url, sha256),),
                                                                 layer="sglang"),))


def test_locked_names_a_wheel_url_that_moved(tmp_path, monkeypatch):
    request = _request()
    recorded = _lock(request, url=f"https://old.example/files/{WHEEL}", sha256=SHA_OLD)
    fresh = _lock(request, url=f"https://new.example/files/{WHEEL}", sha256=SHA_OLD)
    assert lock_changes(recorded, fresh) == [
        f"other URLs for the same files: demo https://old.example/files/{WHEEL} -> https://new.example/files/{WHEEL}"]
    path = locking.lock_path(tmp_path, "s")
    path.parent.mkdir(parents=True)
    path.write_text(recorded.to_toml())
    monkeypatch.setattr(locking, "resolve_lock", lambda *args, **kwargs: fresh)
    with pytest.raises(SpecError, match="new.example") as raised:
        obtain_lock(request, LockMode.LOCKED, tmp_path, ResolverIndexes())
    assert raised.value.exit_code == 2 and "old.example" in raised.value.one_line()


class _Index(http.server.BaseHTTPRequestHandler):
    """A PEP 691 index listing one wheel of ``demo`` with sha256 ``SHA_INDEX``."""

    def do_GET(self) -> None:  # noqa: N802 - http.server API
        if self.path.rstrip("/").rsplit("/", 1)[-1] != "demo":
            self.send_response(404)
            self.end_headers()
            return
        body = json.dumps({"meta": {"api-version": "1.0"}, "name": "demo",
                           "files": [{"filename": WHEEL, "url": f"/files/{WHEEL}",
                                      "hashes": {"sha256": SHA_INDEX}}]}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/vnd.pypi.simple.v1+json")
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args) -> None:
        pass


@pytest.fixture
def index(monkeypatch, tmp_path):
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Index)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    monkeypatch.setenv("HOME", str(tmp_path / "home"))   # the index pages' cache
    yield f"http://127.0.0.1:{server.server_address[1]}/simple"
    server.shutdown()
    server.server_close()


def test_a_hand_edited_hash_is_found_before_any_image_work(tmp_path, index, monkeypatch):
    monkeypatch.setattr(locking, "resolve_lock", lambda *a, **k: (_ for _ in ()).throw(AssertionError("resolved")))
    request = _request(index)
    path = locking.lock_path(tmp_path, "s")
    path.parent.mkdir(parents=True)
    wheel_url = index.replace("/simple", f"/files/{WHEEL}")   # where the index page's link points
    path.write_text(_lock(request, url=wheel_url, sha256=SHA_OLD).to_toml())
    with pytest.raises(SpecError) as raised:
        obtain_lock(request, LockMode.RESOLVE, tmp_path, ResolverIndexes(index_url=index))
    line = raised.value.one_line()
    assert raised.value.exit_code == 2 and "\n" not in line and WHEEL in line and str(path) in line
    assert SHA_OLD[:16] in line and SHA_INDEX[:16] in line and "--relock" in line
    # the hash the index lists passes, from the recorded lock alone
    path.write_text(_lock(request, url=wheel_url, sha256=SHA_INDEX).to_toml())
    assert obtain_lock(request, LockMode.RESOLVE, tmp_path, ResolverIndexes(index_url=index)).how == "recorded"
    # the same file name from elsewhere (a wheelhouse's own build) is not compared with the index's file
    path.write_text(_lock(request, url=f"/wheelhouse/{WHEEL}", sha256=SHA_OLD).to_toml())
    assert obtain_lock(request, LockMode.RESOLVE, tmp_path, ResolverIndexes(index_url=index)).how == "recorded"


# --------------------------------------------------------------------------- render --out


def test_render_keeps_its_locks_inside_its_out_folder(tmp_path, monkeypatch):
    from click.testing import CliRunner

    from stackforge.cli import cli
    seen: list[Path] = []

    def lock_stacks(cells, mode, *, out_dir, compose, indexes, timeout=300.0):
        seen.append(Path(out_dir))
        return {}
    monkeypatch.setattr(locking, "lock_stacks", lock_stacks)
    out = tmp_path / "out" / "contexts"
    result = CliRunner().invoke(cli, ["render", "--cuda", "13.1", "--ca-bundle", "none", "--no-dependency-layers",
                                      "--out", str(out)])
    assert seen == [out], result.output
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["contexts"]


def test_dataclass_replace_keeps_options_valid():
    # BuildOptions checks its index URLs on every construction, replace() included.
    options = BuildOptions(index_url="https://mirror.example/simple")
    with pytest.raises(SpecError, match="carries credentials"):
        dataclasses.replace(options, index_url="https://u:p@mirror.example/simple")
