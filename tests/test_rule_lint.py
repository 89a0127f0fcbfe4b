"""The rule linter (stackforge/plan/rule_lint.py): contradictory requirements, a `when` matching every cell,
empty ranges; hooked into `plan`, `compat verify` and `--compat` directories (exit 2, both rules named with
file:line). And `compat verify` on a rule whose range holds no release on the index (exit 1, named)."""

from __future__ import annotations

import textwrap

import pytest
from click.testing import CliRunner

from stackforge.cli import cli
from stackforge.core.errors import SpecError
from stackforge.plan.planner import load_knowledge, plan_file
from stackforge.plan.rule_lint import LintKind, check_rules, lint_rules
from stackforge.plan.rules import load_rules, load_targets
from stackforge.plan.user_compat import load_user_compat
from stackforge.wheels.verify import WitnessResult, verify_rules, write_verification_text

SOURCES = 'sources: [{ref: "test", confidence: inferred}]'


def rule(rule_id: str, when: str, then: str, extra: str = "") -> str:
    return textwrap.dedent(f"""\
        - id: {rule_id}
          when: {when}
          then: {then}
          reason: "test rule"
          unwitnessed: "test rule"
          {SOURCES}
        """) + extra


def write_rules(folder, *rules: str, name: str = "mine.yaml"):
    folder.mkdir(exist_ok=True)
    path = folder / name
    path.write_text("schema: 1\nrules:\n" + textwrap.indent("".join(rules), "  "))
    return path


def lint(tmp_path, *rules: str):
    return lint_rules(load_rules([write_rules(tmp_path / "compat", *rules)]))


DRIVER_HIGH = rule("driver-high", '{arch: {in: ["12.0"]}}', '{effect: requires, requires: {driver: ">=600"}}')
DRIVER_LOW = rule("driver-low", '{arch: {in: ["12.0", "9.0"]}}',
                  '{effect: requires, requires: {driver: "<500"}}')
TREE = rule("nccl-tree", "{interconnect: pcie}", "{effect: requires, requires: {env: {NCCL_ALGO: Tree}}}")
RING = rule("nccl-ring", "{gpu_count: {gt: 2}}", "{effect: requires, requires: {env: {NCCL_ALGO: Ring}}}")


def test_the_shipped_rules_lint_clean():
    assert lint_rules(load_knowledge().rules) == ()


def test_two_driver_requirements_with_no_driver_in_common_contradict(tmp_path):
    problems = lint(tmp_path, DRIVER_HIGH, DRIVER_LOW)
    assert [p.kind for p in problems] == [LintKind.CONTRADICTION]
    line = problems[0].line()
    assert "driver-high (" in line and "driver-low (" in line
    assert "mine.yaml:3)" in line and "mine.yaml:9)" in line         # both rules' file:line
    assert "driver >=600 against driver <500" in line


def test_nccl_tree_and_ring_both_required_contradict(tmp_path):
    problems = lint(tmp_path, TREE, RING)
    assert [p.kind for p in problems] == [LintKind.CONTRADICTION]
    assert "NCCL_ALGO=Tree against NCCL_ALGO=Ring" in problems[0].line()


@pytest.mark.parametrize("other_when", ['{arch: {in: ["9.0"]}}', '{arch: {not_in: ["12.0"]}}',
                                        '{arch: "==9.0.*"}', '{arch: {in: ["12.0"]}, gpu_count: {lt: 1}}'])
def test_requirements_that_never_meet_on_one_cell_do_not_contradict(tmp_path, other_when):
    low = rule("driver-low", other_when, '{effect: requires, requires: {driver: "<500"}}')
    assert [p.kind for p in lint(tmp_path, DRIVER_HIGH, low) if p.kind is LintKind.CONTRADICTION] == []


def test_agreeing_requirements_are_clean(tmp_path):
    also_high = rule("driver-also", "{gpu_count: {ge: 2}}",
                     '{effect: requires, requires: {driver: ">=580,<700"}}')
    same = rule("nccl-tree-too", "{gpu_count: {gt: 2}}",
                "{effect: requires, requires: {env: {NCCL_ALGO: Tree}}}")
    assert lint(tmp_path, DRIVER_HIGH, also_high, TREE, same) == ()


@pytest.mark.parametrize("when", ["{}", "{gpu_count: {ge: 1}}", '{flashinfer: ">=0"}', '{cuda: {not: "<0"}}',
                                  "{os: {not_in: []}}"])
@pytest.mark.parametrize("then", ["{effect: incompatible}",
                                  "{effect: feature_unavailable, feature: flashinfer-jit}"])
def test_a_pruning_or_blocking_rule_whose_when_matches_everything_is_refused(tmp_path, when, then):
    problems = lint(tmp_path, rule("catch-all", when, then))
    assert [p.kind for p in problems] == [LintKind.MATCHES_EVERYTHING]
    assert problems[0].line().startswith("rule catch-all (")


def test_a_requirement_for_every_cell_or_a_narrow_prune_is_fine(tmp_path):
    everywhere = rule("driver-floor", "{}", '{effect: requires, requires: {driver: ">=525"}}')
    narrow = rule("narrow", '{flashinfer: ">=0.1"}', "{effect: incompatible}")
    assert lint(tmp_path, everywhere, narrow) == ()


@pytest.mark.parametrize("when, shown", [
    ('{flashinfer: ">=0.6.7,<0.6.7"}', "flashinfer: '<0.6.7,>=0.6.7'"),
    ('{sglang: ">1,<1"}', "sglang: '<1,>1'"),
    ('{torch: "==1.0,!=1.0"}', "torch: '!=1.0,==1.0'"),
    ('{torch: {not: ">=0.dev0"}}', "torch: not"),
    ('{sglang: ">0.5.3,<=0.5.3.post1"}', "sglang:"),   # PEP 440: >V excludes V's post-releases
    ('{sglang: {in: []}}', "sglang: in []"),
    ("{gpu_count: {lt: 1}}", "gpu_count: lt 1"),
    ("{gpu_count: {in: [0]}}", "gpu_count: in ['0']"),
])
def test_an_empty_range_never_fires_and_is_refused(tmp_path, when, shown):
    problems = lint(tmp_path, rule("never", when, "{effect: feature_unavailable, feature: flashinfer-jit}"))
    assert [p.kind for p in problems] == [LintKind.EMPTY_RANGE]
    assert shown in problems[0].text and "never fires" in problems[0].text


def test_an_empty_driver_requirement_or_witness_over_is_refused(tmp_path):
    driver = rule("no-driver", "{}", '{effect: requires, requires: {driver: ">=600,<600"}}')
    over = textwrap.dedent("""\
        - id: over-nothing
          when: {arch: {in: ["12.0"]}, sglang: ">=0.5"}
          then: {effect: feature_unavailable, feature: torch-symm-mem}
          reason: "test rule"
          witness: {dist: sglang, fact: torch-symm-mem, inside: unavailable, over: ">0.5.3,<0.5.3"}
          %s
        """) % SOURCES
    texts = [p.text for p in lint(tmp_path, driver, over)]
    assert any("requires driver '>=600,<600' holds no version" in t for t in texts)
    assert any("witness over '<0.5.3,>0.5.3' holds no version" in t for t in texts)


def test_nonempty_ranges_are_clean(tmp_path):
    fine = [rule(f"r{i}", when, "{effect: feature_unavailable, feature: flashinfer-jit}")
            for i, when in enumerate(['{flashinfer: ">=0.6.7,<0.6.8"}', '{sglang: "==0.5.3.*"}',
                                      '{torch: "~=2.9.0"}', '{sglang: ">0.5.3,<=0.5.4"}'])]
    assert lint(tmp_path, *fine) == ()


def test_check_rules_raises_one_line_spec_error_naming_the_first_problem_and_the_count(tmp_path):
    rules = load_rules([write_rules(tmp_path / "compat", DRIVER_HIGH, DRIVER_LOW, TREE, RING)])
    with pytest.raises(SpecError) as caught:
        check_rules(rules)
    assert caught.value.exit_code == 2
    text = caught.value.one_line()
    assert "\n" not in text and "driver-high" in text and "driver-low" in text
    assert "(and 1 more problem(s))" in text and "hint:" in text


# ------------------------------------------------------------------- hooks: --compat, plan, compat verify


def test_a_user_compat_directory_with_contradicting_rules_is_refused(tmp_path):
    write_rules(tmp_path / "compat", TREE, RING)
    with pytest.raises(SpecError, match="nccl-tree .*nccl-ring"):
        load_user_compat(tmp_path / "compat")


# A user rule against a shipped one: compat/rules/driver.yaml driver-blackwell-570 asks >=570 on 12.0.
LOW_ON_BLACKWELL = rule("old-driver", '{arch: {in: ["12.0"]}}',
                        '{effect: requires, requires: {driver: "<550"}}')


def test_plan_refuses_a_user_rule_that_contradicts_a_shipped_one(tmp_path):
    folder = tmp_path / "compat"
    write_rules(folder, LOW_ON_BLACKWELL)
    named = r"driver-blackwell-570 \(compat/rules/driver.yaml:\d+\) and old-driver"
    with pytest.raises(SpecError, match=named):
        plan_file(_default_matrix(), user_compat=load_user_compat(folder))


def test_cli_plan_exits_2_naming_both_rules(tmp_path):
    folder = tmp_path / "compat"
    write_rules(folder, LOW_ON_BLACKWELL)
    result = CliRunner().invoke(cli, ["--compat", str(folder), "plan"])
    assert result.exit_code == 2, result.output
    assert "stackforge: error: rules driver-blackwell-570 (compat/rules/driver.yaml:" in result.output
    assert "old-driver (" in result.output and "mine.yaml:3)" in result.output


def test_cli_compat_verify_exits_2_on_a_contradiction_before_reading_any_wheel(tmp_path, monkeypatch):
    def no_index(**_):
        raise AssertionError("the index was asked")
    monkeypatch.setattr("stackforge.cli.compat.wheel_sources", no_index)
    folder = tmp_path / "compat"
    write_rules(folder, LOW_ON_BLACKWELL)
    result = CliRunner().invoke(cli, ["--compat", str(folder), "compat", "verify"])
    assert result.exit_code == 2, result.output
    assert "driver-blackwell-570" in result.output and "old-driver" in result.output


def _default_matrix():
    from stackforge.core.data import resolve_matrix_path
    return resolve_matrix_path(None)


# ------------------------------------------------------------------- compat verify: a range with no release

SGLANG = ["0.5.12", "0.5.13", "0.5.13.post1", "0.5.14", "0.5.15", "0.5.16"]

ABOVE_THE_INDEX = textwrap.dedent("""\
    - id: symm-future
      when:
        arch: {in: ["12.0", "12.1"]}
        sglang: ">=0.6.0,<0.6.1"
      then: {effect: feature_unavailable, feature: torch-symm-mem}
      reason: "disabled on SM12x"
      witness: {dist: sglang, fact: torch-symm-mem, inside: unavailable}
      %s
    """) % SOURCES


def _no_reading(*_):
    raise AssertionError("a release outside every range was read")


def test_verify_calls_a_range_with_no_release_on_the_index_empty_not_unwitnessed(tmp_path):
    rules = load_rules([write_rules(tmp_path / "compat", ABOVE_THE_INDEX)])
    report = verify_rules(rules, load_targets(), evaluate=_no_reading, list_releases=lambda dist: SGLANG)
    (check,) = report.rules
    assert check.result is WitnessResult.EMPTY and not report.ok
    assert check.why == ("range sglang >=0.6.0,<0.6.1 holds no release of sglang on the index "
                         "(releases 0.5.12..0.5.16)")
    text = write_verification_text(report)
    assert "EMPTY          symm-future: range sglang >=0.6.0,<0.6.1 holds no release" in text
    assert report.to_json()["empty"] == 1


def test_verify_leaves_a_distribution_absent_from_the_index_unwitnessed(tmp_path):
    rules = load_rules([write_rules(tmp_path / "compat", ABOVE_THE_INDEX)])
    report = verify_rules(rules, load_targets(), evaluate=_no_reading, list_releases=lambda dist: [])
    assert report.rules[0].result is WitnessResult.UNWITNESSED and report.ok


def test_cli_compat_verify_exits_1_naming_a_rule_whose_range_holds_no_release(tmp_path, monkeypatch):
    monkeypatch.setattr("stackforge.cli.compat.wheel_sources", lambda **_: (_no_reading, lambda dist: SGLANG))
    folder = tmp_path / "compat"
    write_rules(folder, ABOVE_THE_INDEX)
    result = CliRunner().invoke(cli, ["--compat", str(folder), "compat", "verify", "--rule", "symm-future"])
    assert result.exit_code == 1, result.output
    assert ("stackforge: error: rule symm-future: range sglang >=0.6.0,<0.6.1 holds no release of sglang "
            "on the index") in result.output
    assert "0 unwitnessed, 1 empty" in result.output
