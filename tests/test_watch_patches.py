"""The watch's proposed patches move the bound the release moved: the upper bound of a rule written open,
both bounds of a single-version rule, a bound at a pre-release; and never propose an empty or inverted range.
Stub readings, releases listed up to the one replayed (as the watch lists them)."""

from __future__ import annotations

import textwrap
from dataclasses import replace

from stackforge.core.versions import parse_version
from stackforge.core.wheel_readings import CodeSite, Reading, ReadingStatus
from stackforge.plan.rules import load_rules, load_targets
from stackforge.watch.patches import propose_patch
from stackforge.wheels.verify import WitnessResult, verify_rules

TARGETS = load_targets()


def _rule(tmp_path, bound: str):
    text = textwrap.dedent(f"""\
        schema: 1
        rules:
          - id: fake-jit-gate
            when:
              arch: {{in: ["12.0"]}}
              flashinfer: "{bound}"
            then: {{effect: feature_unavailable, feature: flashinfer-jit, component: flashinfer.jit}}
            reason: "a gate"
            witness: {{dist: flashinfer-python, fact: flashinfer-jit, inside: unavailable}}
            sources:
              - {{ref: "PyPI flashinfer-python wheel", confidence: verified}}
        """)
    path = tmp_path / "compat" / "rules" / "fake.yaml"
    path.parent.mkdir(parents=True)
    path.write_text(text)
    (rule,) = load_rules([path])
    return replace(rule, origin="compat/rules/fake.yaml:3"), text


def _replay(rule, text: str, releases: list[str], refused, version: str):
    """Verify ``rule`` with the releases up to ``version`` where ``refused(v)`` reads unavailable; the patch."""
    def evaluate(fact, dist, v, ctx):
        status = ReadingStatus.UNAVAILABLE if refused(v) else ReadingStatus.AVAILABLE
        return Reading(fact, status, f"gate {status.value} in {v}", (CodeSite("flashinfer/jit/core.py", 7, "gate"),))
    seen = releases[:releases.index(version) + 1]
    (check,) = verify_rules([rule], TARGETS, evaluate=evaluate, list_releases=lambda dist: seen).rules
    assert check.result is WitnessResult.WRONG, check.why
    return propose_patch(rule, check, version, text)


def _between(low: str, high: str):
    return lambda v: parse_version(low) <= parse_version(v) < parse_version(high)


def test_a_rule_written_open_gets_the_upper_bound_the_release_moved(tmp_path):
    # The FlashInfer 0.7.1 case: the old patch was ">=0.6.7,<0.6.7" (the first measured bound).
    rule, text = _rule(tmp_path, ">=0.6.7")
    releases = ["0.6.6", "0.6.7", "0.6.16.post4", "0.7.0.post1", "0.7.1"]
    patch = _replay(rule, text, releases, _between("0.6.7", "0.7.1"), "0.7.1")
    assert patch.summary.startswith("flashinfer >=0.6.7 -> >=0.6.7,<0.7.1: flashinfer-python 0.7.1 reads available")
    assert '-      flashinfer: ">=0.6.7"\n+      flashinfer: ">=0.6.7,<0.7.1"\n' in patch.diff
    assert "PyPI flashinfer-python==0.7.1 wheel: flashinfer/jit/core.py:7 (first release outside" in patch.diff


def test_a_lower_bound_one_release_early_moves_up_not_the_inverse(tmp_path):
    rule, text = _rule(tmp_path, ">=0.6.6,<0.7.1")
    releases = ["0.6.5", "0.6.6", "0.6.7", "0.6.16.post4", "0.7.0.post1", "0.7.1"]
    patch = _replay(rule, text, releases, _between("0.6.7", "0.7.1"), "0.7.1")
    assert '+      flashinfer: ">=0.6.7,<0.7.1"\n' in patch.diff, patch.summary


def test_a_single_version_rule_becomes_the_two_bounds_it_stands_for(tmp_path):
    rule, text = _rule(tmp_path, "==0.5.0")
    releases = ["0.4.1", "0.5.0", "0.5.0.post1", "0.5.1"]
    patch = _replay(rule, text, releases, _between("0.5.0", "0.5.1"), "0.5.1")
    assert '+      flashinfer: ">=0.5.0,<0.5.1"\n' in patch.diff, patch.summary


def test_an_upper_bound_moves_to_a_pre_release(tmp_path):
    rule, text = _rule(tmp_path, ">=0.6.0,<0.6.9")
    releases = ["0.5.3", "0.6.0", "0.6.9", "0.7.0rc1", "0.7.0"]
    patch = _replay(rule, text, releases, _between("0.6.0", "0.7.0rc1"), "0.7.0rc1")
    assert '+      flashinfer: ">=0.6.0,<0.7.0rc1"\n' in patch.diff, patch.summary


def test_a_lower_bound_moves_to_a_post_release(tmp_path):
    rule, text = _rule(tmp_path, ">=0.6.7")
    releases = ["0.6.6", "0.6.7", "0.6.7.post1", "0.6.8"]
    patch = _replay(rule, text, releases, _between("0.6.7.post1", "9"), "0.6.8")
    assert '+      flashinfer: ">=0.6.7.post1"\n' in patch.diff, patch.summary
    assert "(first release inside; 0.6.7 reads available" in patch.diff


def test_readings_that_would_invert_the_range_get_words_never_a_diff(tmp_path):
    # Refused below 0.6.7 and again from 0.7.1, admitted between: for a rule written ">=0.6.7" the measured
    # changes cross (turns away at 0.6.7, back at 0.7.1); the old patch was the empty ">=0.6.7,<0.6.7".
    rule, text = _rule(tmp_path, ">=0.6.7")
    releases = ["0.6.5", "0.6.6", "0.6.7", "0.6.16.post4", "0.7.0.post1", "0.7.1", "0.7.2"]
    patch = _replay(rule, text, releases, lambda v: not _between("0.6.7", "0.7.1")(v), "0.7.2")
    assert patch.diff == "" and "needs a hand edit" in patch.summary, patch.summary
    assert "the rule linter refuses" in patch.summary and "->" not in patch.summary.split(":")[0]
