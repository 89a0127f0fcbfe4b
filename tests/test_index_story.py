"""One index story (issue #32, item 10 and 14's --cache-from / --push bits): ``plan --preflight`` and
``build`` look in the same places, produced by one function (:func:`stackforge.edges.index.image_indexes`),
and a URL or reference that carries credentials is refused, redacted, before any resolver sees it."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from click.testing import CliRunner

from stackforge.build.options import BuildOptions
from stackforge.cli import cli
from stackforge.core.errors import SpecError
from stackforge.edges import runner
from stackforge.edges.pip_config import redact_urls

MATRIX = ("schema: 1\ntargets: [rtx-pro-6000-x8-pcie]\naxes: {cuda: ['13.1'], torch: ['2.14.1'], "
          "flashinfer: ['0.7.2'], sglang: ['0.5.23'], python: ['3.12']}\n")


@pytest.fixture
def matrix(tmp_path, monkeypatch):
    # pip on this host is configured with a mirror and a wheelhouse the images never see
    monkeypatch.setenv("PIP_INDEX_URL", "https://host-mirror.example/simple")
    monkeypatch.setenv("PIP_EXTRA_INDEX_URL", "file:///host/only/simple")
    monkeypatch.setenv("PIP_FIND_LINKS", str(tmp_path))
    path = tmp_path / "m.yaml"
    path.write_text(MATRIX)
    return path


def test_preflight_and_build_resolve_with_the_same_index_configuration(matrix, tmp_path, monkeypatch):
    import stackforge.build.locking as locking
    import stackforge.plan.preflight as preflight
    from stackforge.cli.options import ca_choice
    wheelhouse = tmp_path / "wheels"
    wheelhouse.mkdir()
    seen = {}

    def run_preflight(plan, *, cache_dir=None, session=None, indexes=None, abi=None):
        seen["files"] = indexes
        return preflight.PreflightReport((), indexes)

    def check_locks(cells, *, compose, indexes, timeout=300.0):
        seen["locks"] = indexes
        return []
    monkeypatch.setattr(preflight, "run_preflight", run_preflight)
    monkeypatch.setattr(locking, "check_locks", check_locks)
    result = CliRunner().invoke(cli, ["plan", "--matrix", str(matrix), "--preflight", "--index-url",
                                      "https://mirror.example/simple", "--extra-index-url", "https://extra.example/simple",
                                      "--find-links", str(wheelhouse)])
    assert result.exit_code == 0, result.output
    build = BuildOptions(index_url="https://mirror.example/simple", extra_index_urls=("https://extra.example/simple",),
                         find_links=wheelhouse, ca_bundle=ca_choice(None).path)
    assert seen["files"] == build.index_config()
    assert seen["locks"] == build.resolver_indexes()
    described = seen["files"].describe()
    assert "host-mirror" not in described and "/host/only" not in described and str(tmp_path) + " " not in described


def test_without_index_options_preflight_asks_pypi_as_the_images_do(matrix, monkeypatch):
    import stackforge.plan.preflight as preflight
    seen = {}
    monkeypatch.setattr(preflight, "run_preflight", lambda plan, **kw: seen.setdefault("files", kw["indexes"]) and
                        preflight.PreflightReport((), kw["indexes"]))
    CliRunner().invoke(cli, ["plan", "--matrix", str(matrix), "--preflight", "--no-resolve"])
    assert seen["files"].sources() == BuildOptions().index_config().sources()
    assert [s.location for s in seen["files"].sources()] == ["https://pypi.org/simple"]


@pytest.mark.parametrize("args", [
    ["plan", "--preflight", "--index-url", "https://alice:S3CRET@mirror.example/simple"],
    ["plan", "--preflight", "--extra-index-url", "https://alice:S3CRET@mirror.example/simple"],
    ["build", "--index-url", "https://alice:S3CRET@mirror.example/simple"],
    ["build", "--cache-from", "type=registry,ref=alice:S3CRET@registry.example/cache:{stack}"],
    ["build", "--cache-to", "type=registry,ref=alice:S3CRET@registry.example/cache:{stack},mode=max"],
    ["build", "--push", "alice:S3CRET@registry.example/team"],
])
def test_credentials_are_refused_before_any_resolver_in_one_redacted_line(matrix, monkeypatch, args):
    import stackforge.build.locking as locking
    import stackforge.plan.preflight as preflight

    def never(*a, **k):
        raise AssertionError("reached a resolver or an index")
    monkeypatch.setattr(preflight, "run_preflight", never)
    monkeypatch.setattr(locking, "check_locks", never)
    monkeypatch.setattr(locking, "lock_stacks", never)
    result = CliRunner().invoke(cli, [args[0], "--matrix", str(matrix), *args[1:]])
    assert result.exit_code == 2, result.output
    assert "S3CRET" not in result.output
    [line] = [line for line in result.output.splitlines() if line.startswith("stackforge: error:")]
    assert "credentials" in line and "example" in line


def test_cache_secrets_never_reach_a_log(tmp_path):
    options = BuildOptions(cache_from=("type=gha,token=GHTOKEN123,scope=x",),
                           cache_to=("type=s3,region=eu,bucket=b,access_key_id=AKIA1,secret_access_key=SK2",))
    assert set(options.cache_secrets()) == {"GHTOKEN123", "AKIA1", "SK2"}
    log = tmp_path / "build.log"
    result = runner.run(["echo", *options.cache_from, *options.cache_to], timeout=10, log_path=log,
                        redact=options.cache_secrets())
    shown = log.read_text() + " ".join(result.argv) + result.output_tail
    assert "GHTOKEN123" not in shown and "AKIA1" not in shown and "SK2" not in shown and "scope=x" in shown


def test_one_redaction_covers_urls_and_registry_references():
    assert redact_urls("https://u:p@host/simple") == "https://host/simple"
    assert redact_urls("type=registry,ref=u:tok@reg.example/c:x,mode=max") == "type=registry,ref=reg.example/c:x,mode=max"
    assert redact_urls("u:tok@reg.example/team") == "reg.example/team"
    # no credentials: left alone (a port, a digest)
    for text in ("reg.example:5000/team", "repo@sha256:" + "a" * 64, "ref=reg.example/c:{stack}"):
        assert redact_urls(text) == text


def test_build_options_refuse_a_credentialed_index_whichever_way_they_are_made():
    with pytest.raises(SpecError, match="carries credentials") as raised:
        BuildOptions(extra_index_urls=("https://x:TOKEN@mirror.example/simple",))
    assert "TOKEN" not in raised.value.one_line() and "mirror.example" in raised.value.one_line()
    assert BuildOptions(find_links=Path("/")).index_config().find_links == ("/",)
