"""``stackforge watch`` against a loopback index: a new release appears, is read, and the report says what moved.

The readers and rules are narrowed to FlashInfer's allreduce-fusion gate (tests/_wheel_helpers.py's
reader and the shipped rule ``flashinfer-ar-fusion-sm12-gate``), over small real wheels; the real
index and the shipped readers are exercised in test_watch_pypi.py.
"""

from __future__ import annotations

import json
import os
import threading

import pytest
from click.testing import CliRunner

from stackforge.cli import cli
from stackforge.plan.planner import load_knowledge
from stackforge.plan.rules import Condition, Rule, Witness
from stackforge.core.versions import validate_specifier
from stackforge.core.wheel_readings import CodeSite, ReadContext, Reading, ReadingStatus
from stackforge.watch.patches import propose_patch
from stackforge.watch.state import state_lock
from stackforge.wheels.verify import verify_rules
from tests._wheel_helpers import LoopbackIndex, comm_py, make_wheel, watched_comm_index

TARGET = "rtx-pro-6000-x8-pcie"


@pytest.fixture()
def index(tmp_path, monkeypatch):
    with watched_comm_index(tmp_path, monkeypatch) as served:
        for version, majors in (("0.6.15", [9, 10]), ("0.6.16.post4", [9, 10])):
            _release(served, tmp_path, version, majors)
        yield served


def _release(served: LoopbackIndex, tmp_path, version: str, majors: list[int] | None, **kwargs) -> None:
    wheel = make_wheel(tmp_path / "wheels", "flashinfer-python", version, {"flashinfer/jit/comm.py": comm_py(majors)})
    served.add("flashinfer-python", wheel, upload_time=f"2026-08-{len(served.files) + 1:02d}T00:00:00Z", **kwargs)


def _watch(index, tmp_path, *args: str):
    return CliRunner().invoke(cli, ["watch", "--package", "flashinfer-python", "--target", TARGET,
                                    "--results", str(tmp_path / "results"), "--index-url", index.url, *args])


def test_a_new_release_is_read_with_the_code_on_both_sides(tmp_path, index):
    first = _watch(index, tmp_path)
    assert first.exit_code == 0, first.output
    assert "flashinfer-python: first watch; baseline 0.6.16.post4 recorded" in first.stdout
    _release(index, tmp_path, "0.6.17", [9, 10, 12])
    second = _watch(index, tmp_path, "--json", "--md", str(tmp_path / "watch.md"))
    assert second.exit_code == 1, second.output
    report = json.loads(second.stdout)
    (release,) = report["releases"]
    assert (release["version"], release["previous"]) == ("0.6.17", "0.6.16.post4")
    (change,) = release["changed"]
    assert change["fact"] == "flashinfer-ar-fusion" and change["target"] == TARGET
    assert (change["before"]["status"], change["after"]["status"]) == ("unavailable", "available")
    assert change["before"]["sites"][0]["code"].replace(" ", "") == "supported_major_versions=[9,10]"
    assert change["after"]["sites"][0]["code"].replace(" ", "") == "supported_major_versions=[9,10,12]"
    assert release["unblocks"] == [f"flashinfer-ar-fusion on {TARGET}"]
    (rule,) = release["rules"]
    assert rule["rule"] == "flashinfer-ar-fusion-sm12-gate" and rule["verdict"] == "confirmed"
    assert release["proposed_patches"] == []
    assert release["uploaded"].startswith("2026-08-")
    markdown = (tmp_path / "watch.md").read_text()
    assert "### flashinfer-python 0.6.17 (after 0.6.16.post4)" in markdown and "<details>" in markdown
    third = _watch(index, tmp_path)
    assert third.exit_code == 0 and "nothing new on the index since flashinfer-python 0.6.17" in third.stdout


def test_a_release_that_breaks_a_rule_gets_a_proposal(tmp_path, index):
    assert _watch(index, tmp_path).exit_code == 0
    _release(index, tmp_path, "0.6.17", [9, 10])      # the gate stays: the rule's bound <0.6.17 is now wrong
    result = _watch(index, tmp_path, "--json")
    assert result.exit_code == 1, result.output
    (release,) = json.loads(result.stdout)["releases"]
    (rule,) = release["rules"]
    assert rule["verdict"] == "wrong"
    (patch,) = release["proposed_patches"]
    assert patch["rule"] == "flashinfer-ar-fusion-sm12-gate" and patch["file"] == "compat/rules/flashinfer.yaml"
    assert "needs a hand edit" in patch["summary"] and patch["evidence"]


def test_a_release_the_reader_can_no_longer_decide_is_news(tmp_path, index):
    assert _watch(index, tmp_path).exit_code == 0
    _release(index, tmp_path, "0.6.17", None)          # the gate line is gone: the reader cannot decide
    result = _watch(index, tmp_path, "--json")
    assert result.exit_code == 1
    (release,) = json.loads(result.stdout)["releases"]
    assert release["changed"] == [] and release["unchanged"] == []
    (lost,) = release["no_longer_decided"]
    assert lost["fact"] == "flashinfer-ar-fusion" and lost["after"]["status"] == "undecided"
    text = _watch(index, tmp_path, "--after", "0.6.16.post4", "--until", "0.6.17").stdout
    assert "no longer decided: flashinfer-ar-fusion on rtx-pro-6000-x8-pcie" in text


def test_a_yanked_release_is_reported_and_never_read(tmp_path, index):
    assert _watch(index, tmp_path).exit_code == 0
    _release(index, tmp_path, "0.6.17", [9, 10, 12], yanked=True)
    result = _watch(index, tmp_path, "--json")
    assert result.exit_code == 1
    (release,) = json.loads(result.stdout)["releases"]
    assert release["yanked"] and release["unread"].startswith("yanked") and release["changed"] == []


def test_replay_reads_history_and_leaves_the_state_alone(tmp_path, index):
    _release(index, tmp_path, "0.6.17", [9, 10, 12])
    result = _watch(index, tmp_path, "--after", "0.6.15", "--until", "0.6.17")
    assert result.exit_code == 1
    assert "flashinfer-python 0.6.16.post4 (after 0.6.15)" in result.stdout
    assert "flashinfer-python 0.6.17 (after 0.6.16.post4)" in result.stdout
    assert not (tmp_path / "results" / "watch-state.json").exists()


def test_an_unreachable_index_is_exit_3_and_the_state_is_untouched(tmp_path, index):
    assert _watch(index, tmp_path).exit_code == 0
    state = (tmp_path / "results" / "watch-state.json").read_bytes()
    result = CliRunner().invoke(cli, ["watch", "--package", "flashinfer-python", "--results",
                                      str(tmp_path / "results"), "--index-url", "http://127.0.0.1:9/simple"])
    assert result.exit_code == 3
    assert "http://127.0.0.1:9/simple could not be read: refused" in result.output
    assert (tmp_path / "results" / "watch-state.json").read_bytes() == state


def test_a_corrupt_state_is_an_error_never_a_reset(tmp_path, index):
    (tmp_path / "results").mkdir()
    (tmp_path / "results" / "watch-state.json").write_text("{not json")
    result = _watch(index, tmp_path)
    assert result.exit_code == 2
    assert "corrupt watch state" in result.output and "move it away to start over" in result.output
    assert (tmp_path / "results" / "watch-state.json").read_text() == "{not json"


def test_a_second_watch_on_the_same_state_waits_then_stops(tmp_path, index):
    state = tmp_path / "results" / "watch-state.json"
    held, release = threading.Event(), threading.Event()

    def hold() -> None:
        with state_lock(state):
            held.set()
            release.wait(10)
    holder = threading.Thread(target=hold)
    holder.start()
    held.wait(5)
    try:
        with pytest.raises(Exception, match=f"another stackforge watch \\(pid {os.getpid()}\\)"):
            with state_lock(state, wait_s=0.3):
                pass
    finally:
        release.set()
        holder.join()


@pytest.mark.parametrize(("args", "message"), [
    (["--after", "0.6.x"], "--after '0.6.x' is not a PEP 440 version"),
    (["--package", "sglang", "--after", "0.6.15"], "replay one distribution's history"),
])
def test_bad_replay_input_is_exit_2(tmp_path, index, args, message):
    result = _watch(index, tmp_path, *args)
    assert result.exit_code == 2 and message in result.output


def test_a_rule_with_an_open_upper_bound_gets_a_diff_that_moves_it():
    text = ('rules:\n  - id: fake-gate\n    when:\n      arch: {in: ["12.0"]}\n      flashinfer: ">=0.6.7"\n'
            '    then: {effect: feature_unavailable, feature: flashinfer-ar-fusion}\n    sources:\n'
            '      - {ref: "PyPI flashinfer-python==0.6.7 wheel", confidence: verified}\n')
    rule = Rule(id="fake-gate", conditions=(Condition("flashinfer", "spec", validate_specifier(">=0.6.7", what="x")),),
                effect=None, component="x", sources=(), origin="compat/rules/fake.yaml:2", reason="", remedy="",
                witness=Witness(dist="flashinfer-python", fact="flashinfer-ar-fusion",
                                inside=(ReadingStatus.UNAVAILABLE,)))

    def evaluate(fact: str, dist: str, version: str, ctx: ReadContext) -> Reading:
        # Outside the rule's range on both sides (0.6.6 below, 0.6.9 above), inside it between.
        status = ReadingStatus.AVAILABLE if version in ("0.6.6", "0.6.9") else ReadingStatus.UNAVAILABLE
        return Reading(fact, status, f"gate in {version}", (CodeSite("flashinfer/jit/comm.py", 190, "gate"),))
    knowledge = load_knowledge()
    (rule_check,) = verify_rules([rule], knowledge.targets, evaluate=evaluate,
                                 list_releases=lambda dist: ["0.6.6", "0.6.7", "0.6.8", "0.6.9"]).rules
    patch = propose_patch(rule, rule_check, "0.6.9", text)
    assert patch is not None and patch.summary.startswith("flashinfer >=0.6.7 -> >=0.6.7,<0.6.9")
    assert '-      flashinfer: ">=0.6.7"' in patch.diff and '+      flashinfer: ">=0.6.7,<0.6.9"' in patch.diff
    assert "+      - {ref: \"PyPI flashinfer-python==0.6.9 wheel: flashinfer/jit/comm.py:190" in patch.diff
