"""Build failures say their real cause; builds trust pip's CA by default; render never drops a layer silently.

The log excerpts under tests/data/build_logs/ are real pip output captured on this kind of machine
(see tests/data/build_logs/README.md for the command behind each one).
"""

from __future__ import annotations

import json
import uuid
from pathlib import Path

import pytest
from _build_helpers import derived_by_hand, devel_stack, small_cell
from click.testing import CliRunner

import stackforge.build
import stackforge.edges.docker_engine
from stackforge.build import BuildOptions, BuildRecord, BuildStatus, BuildSummary
from stackforge.build.buildkit import BuildAttempt
from stackforge.build.cancel import Cancel
from stackforge.build.classify import Cause, FailureKind, diagnose
from stackforge.build.progress import Board, summary_table
from stackforge.build.requires import (
    LookupStatus,
    RequirementsLookup,
    declared_for,
    dropped_warning,
    lookup_declared,
)
from stackforge.build.trust import CaSource, choose_ca_bundle
from stackforge.cli import cli
from stackforge.compose.dockerfile import INLINE_DEPS_SUFFIX, ComposeOptions, compose_stack
from stackforge.core.errors import SpecError
from stackforge.edges.pip_config import PipSetting, parse_pip_config_list, read_pip_config

LOGS = Path(__file__).resolve().parent / "data" / "build_logs"
UNREACHABLE_INDEX = "http://127.0.0.1:9/simple"   # port 9 (discard): nothing listens, connection refused
SYSTEM_CA = "/etc/ssl/certs/ca-certificates.crt"


def log(name: str) -> str:
    return (LOGS / name).read_text(encoding="utf-8")


# --------------------------------------------------------------------------- classification (pure)

REAL_LOGS = [
    # file, cause, words of the evidence, words of the remedy
    ("pip-tls-self-signed.txt", Cause.TLS, "self-signed certificate in certificate chain", "--ca-bundle"),
    ("pip-tls-then-resolution-impossible.txt", Cause.TLS, "certificate verify failed", "--ca-bundle"),
    ("pip-cuda-tile-build-deps-tls.txt", Cause.TLS, "https://pypi.org/simple/wheel-stub/", "--ca-bundle"),
    ("pip-dns-unresolvable-index.txt", Cause.DNS, "Name or service not known (https://pypi.invalid/simple)",
     "--index-url"),
    ("pip-proxy-refused.txt", Cause.PROXY, "Cannot connect to proxy", "HTTPS_PROXY"),
    ("pip-index-refused.txt", Cause.UNREACHABLE, "Connection refused (http://127.0.0.1:9/simple)", "--index-url"),
    ("pip-no-space.txt", Cause.NO_SPACE, "No space left on device", "docker system df"),
    ("pip-no-such-version.txt", Cause.NO_SUCH_VERSION, "No matching distribution found for flashinfer-python==0.0.0.99",
     "stackforge plan --preflight"),
    ("pip-cuda-tile-sdist-fetch.txt", Cause.SDIST_BUILD_FETCH, "cuda-tile for version 1.6.0rc5",
     "--extra-index-url https://pypi.nvidia.com/"),
    ("pip-sdist-fetches-at-build.txt", Cause.SDIST_BUILD_FETCH, "Connection refused", "--extra-index-url"),
]


@pytest.mark.parametrize(("name", "cause", "evidence", "remedy"), REAL_LOGS, ids=[r[0] for r in REAL_LOGS])
def test_real_pip_output_is_told_by_its_cause(name, cause, evidence, remedy):
    diagnosis = diagnose(log(name))
    assert diagnosis.cause is cause, diagnosis
    assert evidence in diagnosis.line and remedy in diagnosis.remedy
    line = diagnosis.one_line()
    assert line.startswith(f"{cause.value}: ") and "\n" not in line and f"(remedy: {diagnosis.remedy})" in line


@pytest.mark.parametrize(("name", "cause", "evidence", "remedy"), REAL_LOGS, ids=[r[0] for r in REAL_LOGS])
def test_the_cause_survives_buildkit_framing(name, cause, evidence, remedy):
    """Inside `docker buildx build --progress plain` every line has a step prefix, and BuildKit ends
    with its own "failed to solve" line: neither may hide the cause."""
    framed = "".join(f"#9 {3 + i / 10:.3f} {line}\n" for i, line in enumerate(log(name).splitlines()))
    framed += ('#9 ERROR: process "/bin/bash -o pipefail -c pip install ..." did not complete successfully: '
               'exit code: 1\nERROR: failed to solve: process "/bin/bash -o pipefail -c pip install ..." did '
               'not complete successfully: exit code: 1\n')
    diagnosis = diagnose(framed)
    assert diagnosis.cause is cause and evidence in diagnosis.line


def test_tls_error_wins_over_the_no_matching_distribution_line_that_follows_it():
    """A TLS failure whose last pip line is "No matching distribution found for torch==2.14.1" is tls."""
    text = log("pip-tls-self-signed.txt")
    assert text.index("SSLCertVerificationError") < text.index("No matching distribution found for torch==2.14.1")
    diagnosis = diagnose(text)
    assert diagnosis.cause is Cause.TLS and not diagnosis.retryable
    assert "No matching distribution" not in diagnosis.one_line()
    assert diagnosis.one_line().startswith(
        "tls: certificate verify failed: self-signed certificate in certificate chain (https://pypi.org/simple/torch/)")


def test_an_sdist_fetching_elsewhere_wins_over_the_dns_error_inside_its_build():
    text = log("pip-cuda-tile-sdist-fetch.txt")
    assert "Name or service not known" in text
    assert diagnose(text).cause is Cause.SDIST_BUILD_FETCH


def test_no_space_wins_over_everything_else():
    text = log("pip-tls-self-signed.txt") + log("pip-no-space.txt")
    assert diagnose(text).cause is Cause.NO_SPACE


def test_pip_verdict_wins_over_transient_retry_warnings_but_not_over_a_refused_index():
    verdict = log("pip-no-such-version.txt")
    retried = ("WARNING: Retrying (Retry(total=4, connect=None, read=None, redirect=None, status=None)) after "
               "connection broken by 'ReadTimeoutError(\"HTTPSConnectionPool(host='pypi.org', port=443): Read "
               "timed out. (read timeout=60)\")': /simple/flashinfer-python/\n")
    assert diagnose(retried).cause is Cause.NETWORK_OTHER and diagnose(retried).retryable
    assert diagnose(retried + verdict).cause is Cause.NO_SUCH_VERSION
    assert diagnose(log("pip-index-refused.txt") + verdict).cause is Cause.UNREACHABLE


def test_a_temporary_dns_failure_is_retried_and_an_unknown_name_is_not():
    temporary = ("WARNING: Retrying (Retry(total=4)) after connection broken by 'NewConnectionError(': Failed to "
                 "establish a new connection: [Errno -3] Temporary failure in name resolution')': /simple/torch/\n")
    assert diagnose(temporary).cause is Cause.DNS and diagnose(temporary).kind is FailureKind.TRANSIENT
    assert not diagnose(log("pip-dns-unresolvable-index.txt")).retryable


def test_a_dns_retry_pip_got_past_does_not_override_its_no_such_version_verdict():
    """The index answered (it listed versions): the retried name lookup is not the cause."""
    text = ("WARNING: Retrying (Retry(total=4)) after connection broken by 'NewConnectionError(': Failed to "
            "establish a new connection: [Errno -3] Temporary failure in name resolution')': /simple/sglang/\n"
            "ERROR: Could not find a version that satisfies the requirement sglang==9.9.9 (from versions: "
            "0.5.1, 0.5.2)\n"
            "ERROR: No matching distribution found for sglang==9.9.9\n")
    diagnosis = diagnose(text)
    assert diagnosis.cause is Cause.NO_SUCH_VERSION and not diagnosis.retryable, diagnosis
    assert "No matching distribution found for sglang==9.9.9" in diagnosis.line


def test_a_tls_retry_pip_got_past_does_not_override_its_conflict_verdict():
    retried = ("WARNING: Retrying (Retry(total=4, connect=None, read=None, redirect=None, status=None)) after "
               "connection broken by 'SSLError(SSLEOFError(8, '[SSL: UNEXPECTED_EOF_WHILE_READING] EOF occurred "
               "in violation of protocol (_ssl.c:1006)'))': /simple/torch/\n")
    # The real conflict, without the two lines where pip gave up on the index (it got past the retry here).
    conflict = log("pip-tls-then-resolution-impossible.txt").split("\n", 2)[2]
    text = retried + conflict
    diagnosis = diagnose(text)
    assert diagnosis.cause is Cause.CONFLICT, diagnosis


def test_a_connection_failure_still_wins_when_the_index_gave_nothing():
    verdict_nothing = ("ERROR: Could not find a version that satisfies the requirement sglang==9.9.9 "
                       "(from versions: none)\nERROR: No matching distribution found for sglang==9.9.9\n")
    temporary = ("WARNING: Retrying (Retry(total=0)) after connection broken by 'NewConnectionError(': Failed to "
                 "establish a new connection: [Errno -3] Temporary failure in name resolution')': /simple/sglang/\n")
    assert diagnose(temporary + verdict_nothing).cause is Cause.DNS
    assert diagnose(log("pip-tls-then-resolution-impossible.txt")).cause is Cause.TLS   # "Could not fetch URL"


def test_an_unknown_failure_keeps_its_last_error_line():
    diagnosis = diagnose("#5 0.3 something\n#5 0.4 ERROR: the sky fell\n#5 DONE\n")
    assert diagnosis.cause is Cause.UNKNOWN and diagnosis.line == "ERROR: the sky fell"
    assert diagnosis.one_line() == "unknown: ERROR: the sky fell (remedy: see the build log)"


# --------------------------------------------------------------------------- the record and the summary


def _job(tmp_path: Path, retries: int = 0, requirements: RequirementsLookup | None = None):
    from stackforge.build.scheduler import _StackBuild, _Run
    stack, derived = small_cell()
    options = BuildOptions(out_dir=tmp_path, retries=retries, retry_backoff_s=0.0)
    run = _Run(client=None, options=options, builder="buildkit", named_contexts=True, asset_port=0, run_id="t",
               cancel=Cancel(), board=Board([stack.id]), resolver=None, requirements=requirements, redact=())
    return _StackBuild(run, stack, derived)


def test_a_failed_build_records_cause_evidence_and_remedy_in_one_line(tmp_path):
    from stackforge.build.scheduler import _Stop
    job = _job(tmp_path)
    attempt = BuildAttempt(ok=False, image_id=None, tail=log("pip-tls-self-signed.txt"), duration_s=1.0,
                           timed_out=False, ending="exited with status 1")
    with pytest.raises(_Stop) as stop:
        job._after_failure(attempt, 1)
    record = job.record(stop.value.status, stop.value.reason)
    assert record.status is BuildStatus.FAILED and record.cause == "tls"
    assert record.reason.startswith("build exited with status 1: tls: certificate verify failed: self-signed")
    assert "(remedy: pass --ca-bundle PATH" in record.reason and "\n" not in record.reason
    assert BuildRecord.from_json(json.loads(record.dumps())).cause == "tls"   # survives the JSON round trip
    assert "[stackforge] CA bundle: none" in Path(record.log_path).read_text()


def test_the_summary_shows_the_cause_and_remedy(tmp_path):
    from rich.console import Console
    reason = "build exited with status 1: " + diagnose(log("pip-no-space.txt")).one_line()
    stack, derived = small_cell()
    record = BuildRecord(stack_id=stack.id, stack=stack.to_json(), derived=derived.to_json(),
                         status=BuildStatus.FAILED, reason=reason, cause="no-space")
    console = Console(record=True, width=400)
    console.print(summary_table(BuildSummary((record,), "buildkit", 1.0)))
    text = console.export_text()
    assert "no-space: No space left on device (remedy: free disk space" in text


def test_build_reports_dropped_dependency_layers_in_the_log_and_the_summary(tmp_path):
    job = _job(tmp_path, requirements=RequirementsLookup(index_url=UNREACHABLE_INDEX))
    declared, dropped = job.declared()
    assert declared == () and dropped == ("flashinfer", "sglang")
    assert len(job.run.warnings) == 1 and "Connection refused" in job.run.warnings[0]
    assert f"render: warning: {job.run.warnings[0]}" in job.log_path.read_text()


def test_build_cli_prints_the_summarys_warnings(monkeypatch, tmp_path):
    def fake_build(cells, options, *, client, progress):
        records = tuple(BuildRecord(stack_id=s.id, stack=s.to_json(), derived=d.to_json(), status=BuildStatus.BUILT)
                        for s, d in cells)
        return BuildSummary(records, "buildkit", 1.0, warnings=("no dependency layer for sglang==0.5.23 (why)",))

    monkeypatch.setattr(stackforge.build, "build_stacks", fake_build)
    monkeypatch.setattr(stackforge.edges.docker_engine, "connect", lambda: object())
    monkeypatch.setattr(stackforge.edges.docker_engine, "reap_orphans",
                        lambda client: stackforge.edges.docker_engine.Orphans((), ()))
    result = CliRunner().invoke(cli, ["build", "--out", str(tmp_path), "--no-progress", "--ca-bundle", "none"])
    assert result.exit_code == 0, result.output
    assert "stackforge: warning: no dependency layer for sglang==0.5.23 (why)" in result.stderr


# --------------------------------------------------------------------------- the CA bundle default


def test_an_explicit_bundle_wins_and_none_disables(tmp_path):
    bundle = tmp_path / "corp.pem"
    bundle.write_text("-----BEGIN CERTIFICATE-----\n")
    environ = {"PIP_CERT": SYSTEM_CA}
    pip_cert = PipSetting(SYSTEM_CA, "PIP_CERT")
    assert choose_ca_bundle(str(bundle), pip_cert=pip_cert, environ=environ).path == bundle
    disabled = choose_ca_bundle("none", pip_cert=pip_cert, environ=environ)
    assert disabled.path is None and disabled.source is CaSource.DISABLED
    with pytest.raises(SpecError, match="no such file"):
        choose_ca_bundle(str(tmp_path / "missing.pem"), pip_cert=None, environ={})


def test_the_default_follows_pips_cert_then_requests(tmp_path):
    first, second, third = (tmp_path / name for name in ("a.pem", "b.pem", "c.pem"))
    for path in (first, second, third):
        path.write_text("pem")
    config = parse_pip_config_list(f"global.cert='{first}'\n")
    environ = {"REQUESTS_CA_BUNDLE": str(third)}
    from_files = choose_ca_bundle(None, pip_cert=config.setting("cert", environ), environ=environ)
    assert (from_files.path, from_files.source) == (first, CaSource.PIP_CONFIG)
    environ["PIP_CERT"] = str(second)   # pip reads PIP_CERT before its files
    from_env = choose_ca_bundle(None, pip_cert=config.setting("cert", environ), environ=environ)
    assert (from_env.path, from_env.source) == (second, CaSource.PIP_CERT)
    gone = PipSetting(str(tmp_path / "gone.pem"), "pip config global.cert")
    assert choose_ca_bundle(None, pip_cert=gone, environ={"REQUESTS_CA_BUNDLE": str(third)}
                            ).source is CaSource.REQUESTS_CA_BUNDLE
    nothing = choose_ca_bundle(None, pip_cert=None, environ={})
    assert nothing.path is None and nothing.describe() == "CA bundle: none (none configured)"


def test_pip_config_list_output_follows_pips_precedence():
    listing = ("global.cert='/etc/ssl/certs/ca-certificates.crt'\nglobal.index-url='https://global/simple'\n"
               "install.index-url='https://install/simple'\n:env:.cert='/elsewhere.pem'\n"
               "global.find-links='/opt/wheels'\nglobal.extra-index-url=''\n")
    config = parse_pip_config_list(listing)
    assert config.setting("cert") == PipSetting("/elsewhere.pem", "PIP_CERT")
    assert config.setting("index-url") == PipSetting("https://install/simple", "pip config install.index-url")
    assert config.setting("index-url", {"PIP_INDEX_URL": "https://env/simple"}).origin == "PIP_INDEX_URL"
    assert config.setting("extra-index-url") is None   # an empty value is no setting
    assert parse_pip_config_list("global.cert='/a.pem'\n").setting("cert").origin == "pip config global.cert"


def test_read_pip_config_asks_the_real_pip(tmp_path, monkeypatch):
    """PIP_CONFIG_FILE is the highest-precedence config file; pip itself says what it holds."""
    config = tmp_path / "pip.conf"
    config.write_text(f"[global]\ncert = {tmp_path / 'corp.pem'}\n")
    monkeypatch.setenv("PIP_CONFIG_FILE", str(config))
    monkeypatch.delenv("PIP_CERT", raising=False)
    assert read_pip_config().setting("cert") == PipSetting(str(tmp_path / "corp.pem"), "pip config global.cert")


@pytest.fixture
def captured(monkeypatch):
    """The engine and the builder replaced; what the CLI passed to build_stacks is kept."""
    seen = {}

    def fake_build(cells, options, *, client, progress):
        seen.update(options=options)
        records = tuple(BuildRecord(stack_id=s.id, stack=s.to_json(), derived=d.to_json(), status=BuildStatus.BUILT)
                        for s, d in cells)
        return BuildSummary(records, builder="buildkit", duration_s=1.0)

    monkeypatch.setattr(stackforge.build, "build_stacks", fake_build)
    monkeypatch.setattr(stackforge.edges.docker_engine, "connect", lambda: object())
    monkeypatch.setattr(stackforge.edges.docker_engine, "reap_orphans",
                        lambda client: stackforge.edges.docker_engine.Orphans((), ()))
    return seen


def test_build_uses_pips_bundle_by_default_and_says_which(captured, tmp_path, monkeypatch):
    bundle = tmp_path / "corp.pem"
    bundle.write_text("-----BEGIN CERTIFICATE-----\n")
    config = tmp_path / "pip.conf"
    config.write_text(f"[global]\ncert = {bundle}\n")
    monkeypatch.setenv("PIP_CONFIG_FILE", str(config))
    monkeypatch.delenv("PIP_CERT", raising=False)      # it would win over the file, as in pip
    result = CliRunner().invoke(cli, ["build", "--out", str(tmp_path / "out"), "--no-progress", "--cuda", "13.1"])
    assert result.exit_code == 0, result.output
    assert captured["options"].ca_bundle == bundle
    assert f"CA bundle: {bundle} (from pip config cert)" in result.stderr
    assert "BEGIN CERTIFICATE" not in result.output


def test_build_ca_bundle_none_and_an_explicit_path(captured, tmp_path, monkeypatch):
    monkeypatch.setenv("PIP_CERT", SYSTEM_CA)
    result = CliRunner().invoke(cli, ["build", "--out", str(tmp_path), "--no-progress", "--ca-bundle", "none"])
    assert result.exit_code == 0, result.output
    assert captured["options"].ca_bundle is None and "CA bundle: none (--ca-bundle none)" in result.stderr
    explicit = tmp_path / "mine.pem"
    explicit.write_text("-----BEGIN CERTIFICATE-----\n")
    result = CliRunner().invoke(cli, ["build", "--out", str(tmp_path), "--no-progress", "--ca-bundle", str(explicit)])
    assert result.exit_code == 0 and captured["options"].ca_bundle == explicit
    missing = CliRunner().invoke(cli, ["build", "--out", str(tmp_path), "--ca-bundle", str(tmp_path / "no.pem")])
    assert missing.exit_code == 2 and "stackforge: error: --ca-bundle" in missing.stderr


# --------------------------------------------------------------------------- render: dropped layers (defect 9)


def test_lookup_against_an_unreachable_index_says_why():
    found = lookup_declared("flashinfer-python", "0.7.2", index_url=UNREACHABLE_INDEX, timeout=5)
    assert found.status is LookupStatus.UNREACHABLE
    assert found.reason.startswith(f"{UNREACHABLE_INDEX}: unreachable: ") and "Connection refused" in found.reason


def test_lookup_reasons_never_show_index_credentials():
    found = lookup_declared("sglang", "0.5.23", index_url="http://me:s3cret@127.0.0.1:9/simple", timeout=5)
    assert found.status is LookupStatus.UNREACHABLE and "s3cret" not in found.reason


def test_dropped_layers_mark_the_tag_and_a_label():
    with_lists = compose_stack(devel_stack(), derived_by_hand(),
                              ComposeOptions(declared=(("flashinfer", ("numpy",)), ("sglang", ("aiohttp",)))))
    dropped = compose_stack(devel_stack(), derived_by_hand(), ComposeOptions(dropped_layers=("flashinfer", "sglang")))
    assert not with_lists.tag.endswith(INLINE_DEPS_SUFFIX)
    assert dropped.tag.endswith(f":{dropped.hash12}{INLINE_DEPS_SUFFIX}")
    assert dropped.label("io.stackforge.dependency-layers.dropped") == "flashinfer,sglang"
    again = compose_stack(devel_stack(), derived_by_hand(), ComposeOptions(dropped_layers=("flashinfer", "sglang")))
    assert again.tag == dropped.tag   # the same inputs, the same tag
    with pytest.raises(SpecError):
        compose_stack(devel_stack(), derived_by_hand(), ComposeOptions(dropped_layers=("kernel",)))


def test_declared_for_names_every_dropped_layer_with_its_cause():
    lookup = RequirementsLookup(index_url=UNREACHABLE_INDEX)
    found, dropped = declared_for(devel_stack(), lookup, no_deps=frozenset({"sglang"}))
    assert found == () and [d.layer for d in dropped] == ["flashinfer"]
    warning = dropped_warning(dropped, INLINE_DEPS_SUFFIX)
    assert warning.startswith("no dependency layer for flashinfer-python==0.7.2 (http://127.0.0.1:9/simple: "
                              "unreachable: ") and INLINE_DEPS_SUFFIX in warning


def _render(tmp_path: Path, *extra: str):
    only = "cu131-torch2.14.1-fi0.7.2-sgl0.5.23-py311-wheels-debian12"
    return CliRunner().invoke(cli, ["render", "--only", only, "--ca-bundle", "none", "--no-lock", "--out", str(tmp_path),
                                      *extra])


def test_render_with_the_index_unreachable_warns_once_and_marks_the_tag(tmp_path):
    result = _render(tmp_path / "down", "--index-url", UNREACHABLE_INDEX)
    assert result.exit_code == 0, result.output
    warnings = [line for line in result.stderr.splitlines() if line.startswith("stackforge: warning:")]
    assert len(warnings) == 1
    assert "flashinfer-python==0.7.2, sglang==0.5.23" in warnings[0] and "Connection refused" in warnings[0]
    folder, tag = result.stdout.split()
    assert tag.endswith(INLINE_DEPS_SUFFIX)
    assert not (Path(folder) / "requires").exists()
    again = _render(tmp_path / "down-again", "--index-url", UNREACHABLE_INDEX)
    assert again.stdout.split()[1] == tag   # the same inputs, the same tag


def test_render_without_dependency_layers_neither_warns_nor_marks(tmp_path):
    result = _render(tmp_path, "--index-url", UNREACHABLE_INDEX, "--no-dependency-layers")
    assert result.exit_code == 0, result.output
    assert "warning" not in result.stderr and not result.stdout.split()[1].endswith(INLINE_DEPS_SUFFIX)


# --------------------------------------------------------------------------- end to end on the real engine


@pytest.mark.docker
def test_buildkit_failure_against_real_indexes_is_classified(docker_client, base_image, test_labels, tmp_path):
    """Two real pip runs inside a real BuildKit build: an index that refuses, then PyPI through this
    machine's re-signing proxy without the CA. Each classified from the builder's own output."""
    from stackforge.build import buildkit
    from stackforge.edges.docker_engine import buildx_available
    if not buildx_available():
        pytest.skip("docker buildx is not installed (scripts/setup-engine.sh installs it)")
    cases = {
        Cause.UNREACHABLE: f"--index-url {UNREACHABLE_INDEX}",
        Cause.TLS: "--index-url https://pypi.org/simple",
    }
    for cause, index in cases.items():
        context = tmp_path / cause.value
        context.mkdir()
        # A fresh token per run: BuildKit must not answer a failed step from its cache.
        (context / "Dockerfile").write_text(
            f"FROM {base_image}\n"
            f"RUN python3 -m venv /v && PIP_CONFIG_FILE=/dev/null /v/bin/pip download --no-deps --retries 1 "
            f"--timeout 10 -d /tmp/dl {index} torch==2.14.1 # {uuid.uuid4().hex}\n")
        attempt = buildkit.build(context, ca_bundle=None, wheelhouse_context=None, labels=list(test_labels.items()),
                                 timeout=300, log_path=tmp_path / f"{cause.value}.txt", cancel=Cancel())
        assert not attempt.ok
        diagnosis = diagnose(attempt.tail)
        if cause is Cause.TLS and "self-signed" not in attempt.tail and "CERTIFICATE_VERIFY_FAILED" not in attempt.tail:
            pytest.skip("PyPI is reached without a re-signing proxy here: no TLS failure to classify")
        assert diagnosis.cause is cause, attempt.tail[-2000:]
        assert "No matching distribution found for torch==2.14.1" in attempt.tail


@pytest.mark.docker
@pytest.mark.slow
def test_a_build_without_the_ca_records_tls_not_a_missing_package(docker_client, base_image, test_labels, tmp_path):
    """The same end to end (~30 s): the small stack built with --ca-bundle none behind this
    machine's re-signing proxy. pip's last words are "No matching distribution found for ..." and
    BuildKit's "failed to solve"; the record must say tls, with the remedy."""
    from _build_helpers import WHEELHOUSE

    from stackforge.build import Builder, build_stacks
    from stackforge.edges.docker_engine import buildx_available
    if not buildx_available() or not Path(WHEELHOUSE).is_dir():
        pytest.skip("needs docker buildx and the wheelhouse /opt/wheels")
    options = BuildOptions(find_links=Path(WHEELHOUSE), ca_bundle=None, out_dir=tmp_path, builder=Builder.BUILDX,
                           no_deps=frozenset({"sglang"}), labels=tuple(sorted(test_labels.items())), retries=0,
                           verify=False, timeout_s=900)
    record = build_stacks([small_cell()], options, client=docker_client).records[0]
    log_text = Path(record.log_path).read_text()
    if record.status.ok or "CERTIFICATE_VERIFY_FAILED" not in log_text:
        pytest.skip("PyPI is reached without a re-signing proxy here: no TLS failure to classify")
    assert "No matching distribution found for" in log_text and "failed to solve" in log_text
    assert record.status is BuildStatus.FAILED and record.cause == "tls", record.reason
    assert "tls: certificate verify failed: self-signed certificate in certificate chain" in record.reason
    assert "(remedy: pass --ca-bundle PATH" in record.reason
    assert "[stackforge] CA bundle: none" in log_text
