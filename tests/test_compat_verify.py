"""``stackforge compat verify`` logic with a fake evaluator: which releases are read, the results, the
measured bound of a wrong rule, the witness schema, and the CLI (exit 1 naming the rule and the bound)."""

from __future__ import annotations

import json
import textwrap

import pytest
from click.testing import CliRunner

from stackforge.cli import cli
from stackforge.core.errors import SpecError
from stackforge.core.versions import parse_version
from stackforge.core.wheel_readings import CodeSite, Reading, ReadingStatus
from stackforge.plan.rules import load_rules, load_targets
from stackforge.wheels.verify import WitnessResult, bound_points, write_verification_text, verify_rules

SGLANG = ["0.5.12", "0.5.13", "0.5.13.post1", "0.5.14", "0.5.15", "0.5.16"]
FLASHINFER = ["0.3.0", "0.3.1", "0.4.1", "0.5.0", "0.6.6", "0.6.7", "0.6.16.post4", "0.6.17", "0.7.0.post1",
              "0.7.1", "0.7.2"]
SDIST_ONLY = ("0.3.0", "0.3.1", "0.4.1")


def fake_evaluate(calls: list | None = None):
    """SGLang disables torch symm-mem on SM12x from 0.5.14 (before: KeyError, read as available to index);
    FlashInfer's SM12.0 JIT gate refuses CUDA 12.8 from 0.6.7 to 0.7.0.post1."""

    def evaluate(fact, dist, version, ctx):
        if calls is not None:
            calls.append((fact, dist, version, ctx))
        if fact == "torch-symm-mem":
            refused = ctx.arch.startswith("12.") and version >= "0.5.14"
            status = ReadingStatus.UNAVAILABLE if refused else ReadingStatus.AVAILABLE
        elif fact == "flashinfer-jit":
            refused = ctx.arch == "12.0" and ctx.cuda == "12.8" and version in ("0.6.7", "0.6.16.post4", "0.6.17",
                                                                                "0.7.0.post1")
            status = ReadingStatus.UNAVAILABLE if refused else ReadingStatus.AVAILABLE
        elif fact == "flashinfer-ar-fusion":
            if version in SDIST_ONLY:
                return Reading(fact, ReadingStatus.UNDECIDED, "sdist only: not built")
            admitted = parse_version(version) >= parse_version("0.6.17")
            status = ReadingStatus.AVAILABLE if admitted else ReadingStatus.UNAVAILABLE
        elif fact == "ep-a2a":
            status = ReadingStatus.UNDECIDED
        else:
            raise AssertionError(fact)
        return Reading(fact, status, f"{fact} {status.value} in {version}",
                       (CodeSite("pkg/mod.py", 78, "x = TABLE.get(cap)"),))
    return evaluate


def list_releases(dist):
    return {"sglang": SGLANG, "flashinfer-python": FLASHINFER}[dist]


def rules_from(tmp_path, body: str):
    path = tmp_path / "rules.yaml"
    path.write_text("schema: 1\nrules:\n" + textwrap.indent(textwrap.dedent(body), "  "))
    return load_rules([path])


SYMM_RULE = """\
- id: symm-disabled
  when:
    arch: {{in: ["12.0", "12.1"]}}
    sglang: "{bound}"
  then: {{effect: feature_unavailable, feature: torch-symm-mem}}
  reason: "disabled on SM12x"
  sources: [{{ref: "PyPI sglang==0.5.14 wheel", confidence: verified}}]
  witness: {{dist: sglang, fact: torch-symm-mem, inside: unavailable}}
"""


def verify(rules, calls=None):
    return verify_rules(rules, load_targets(), evaluate=fake_evaluate(calls), list_releases=list_releases)


def test_bound_points_are_the_releases_on_both_sides_of_each_bound():
    #            0      1     2     3     4      5      6
    inside = [False, False, True, True, True, False, False]
    assert bound_points(inside) == ((1, "last release outside"), (2, "first release inside"),
                                    (4, "last release inside"), (5, "first release outside"))
    assert bound_points([True, True, False]) == ((0, "first release inside"), (1, "last release inside"),
                                                 (2, "first release outside"))
    assert bound_points([False, True]) == ((0, "last release outside"), (1, "first release inside"))


def test_a_right_bound_is_confirmed_from_the_releases_around_it(tmp_path):
    calls: list = []
    report = verify(rules_from(tmp_path, SYMM_RULE.format(bound=">=0.5.14")), calls)
    (rule_check,) = report.rules
    assert rule_check.result is WitnessResult.CONFIRMED, rule_check.why
    assert {c.version for c in rule_check.checks} == {"0.5.13.post1", "0.5.14", "0.5.16"}
    # The rule's own targets: every sm_120 profile; the x8/x2/x1 PCIe ones share one context per size.
    assert {t for c in rule_check.checks for t in c.targets} == {"rtx-pro-6000-x8-pcie", "rtx-pro-6000-x2-pcie",
                                                              "rtx-5090-x1"}
    assert all(ctx.arch == "12.0" for *_, ctx in calls)
    assert report.ok and report.witnessed == 1


@pytest.mark.parametrize("moved", [">=0.5.15", ">=0.5.13.post1"])
def test_a_bound_moved_by_one_release_is_wrong_with_the_measured_bound(tmp_path, moved):
    report = verify(rules_from(tmp_path, SYMM_RULE.format(bound=moved)))
    (rule_check,) = report.rules
    assert rule_check.result is WitnessResult.WRONG
    assert not report.ok
    assert {(m.before, m.after) for m in rule_check.measured} == {("0.5.13.post1", "0.5.14")}
    assert "measured bound sglang >=0.5.14" in rule_check.measured[0].text


def test_an_upper_bound_moved_is_measured_too(tmp_path):
    body = SYMM_RULE.format(bound=">=0.5.12,<0.5.15").replace("inside: unavailable", "inside: available")
    (rule_check,) = verify(rules_from(tmp_path, body)).rules
    assert rule_check.result is WitnessResult.WRONG
    assert [m.text.split(": ")[-1] for m in rule_check.measured] == ["measured bound sglang <0.5.14"]


def test_stack_conditions_are_read_with_a_value_inside_them(tmp_path):
    body = """\
    - id: jit-gate
      when:
        arch: {in: ["12.0"]}
        flashinfer: ">=0.6.7,<0.7.1"
        nvcc: true
        cuda: "<12.9"
      then: {effect: feature_unavailable, feature: flashinfer-jit}
      reason: "gate"
      sources: [{ref: "PyPI flashinfer-python==0.7.1 wheel", confidence: verified}]
      witness: {dist: flashinfer-python, fact: flashinfer-jit, inside: unavailable}
    """
    calls: list = []
    (rule_check,) = verify(rules_from(tmp_path, body), calls).rules
    assert rule_check.result is WitnessResult.CONFIRMED, rule_check.why
    assert {(ctx.cuda, ctx.nvcc) for *_, ctx in calls} == {("12.8", True)}
    assert "cuda=12.8 (inside the rule's condition)" in rule_check.contexts[0]
    assert [c.version for c in rule_check.checks if c.targets[0] == "rtx-pro-6000-x8-pcie"] == [
        "0.6.6", "0.6.7", "0.7.0.post1", "0.7.1"]


FUSION_RULE = """\
- id: fusion-gate
  when:
    arch: {{in: ["12.0"]}}
    flashinfer: "{bound}"
  then: {{effect: feature_unavailable, feature: flashinfer-ar-fusion}}
  reason: "gate"
  sources: [{{ref: "PyPI flashinfer-python wheels", confidence: verified}}]
  witness: {{dist: flashinfer-python, fact: flashinfer-ar-fusion, inside: unavailable}}
"""


def test_a_bound_in_sdist_only_releases_is_left_unread_and_the_other_checked(tmp_path):
    report = verify(rules_from(tmp_path, FUSION_RULE.format(bound=">=0.3.1,<0.6.17")))
    (rule_check,) = report.rules
    # The upper bound is read on both sides; the lower one only in sdists: half-witnessed, never confirmed.
    assert rule_check.result is WitnessResult.HALF_WITNESSED, rule_check.why
    assert "last release outside 0.3.0 undecided: sdist only" in rule_check.why
    assert "first release inside 0.3.1 undecided: sdist only" in rule_check.why
    assert report.count(WitnessResult.CONFIRMED) == 0 and report.ok
    assert "0 confirmed, 1 half-witnessed, 0 wrong" in write_verification_text(report)
    assert "    half-witnessed: " in write_verification_text(report)
    (rule_check,) = verify(rules_from(tmp_path, FUSION_RULE.format(bound=">=0.3.1,<0.4.1"))).rules
    assert rule_check.result is WitnessResult.UNWITNESSED and "sdist only" in rule_check.why


def test_the_measured_bound_steps_over_sdist_only_releases(tmp_path):
    (rule_check,) = verify(rules_from(tmp_path, FUSION_RULE.format(bound=">=0.3.0,<0.6.7"))).rules
    assert rule_check.result is WitnessResult.WRONG
    assert [(m.before, m.after) for m in rule_check.measured] == [("0.6.16.post4", "0.6.17")]
    (rule_check,) = verify(rules_from(tmp_path, FUSION_RULE.format(bound=">=0.6.6,<0.6.17"))).rules
    # 0.5.0 reads unavailable too; below it only sdists: the reading is measured from 0.5.0 on.
    assert rule_check.result is WitnessResult.WRONG
    assert "0.5.0 (unavailable) and 0.6.16.post4 (unavailable) both read unavailable" in rule_check.measured[0].text


def test_rules_without_a_witness_or_with_an_undecided_reading_are_unwitnessed(tmp_path):
    body = """\
    - id: no-reader
      when: {torch_cuda: "<12.8"}
      then: {effect: incompatible}
      reason: "r"
      unwitnessed: "torch wheel variants live on download.pytorch.org"
      sources: [{ref: "x", confidence: verified}]
    - id: no-bound
      when: {multicast: false}
      then: {effect: feature_unavailable, feature: nccl-nvls}
      reason: "r"
      sources: [{ref: "x", confidence: verified}]
    - id: undecided
      when: {sglang: "<0.5.14"}
      then: {effect: feature_unavailable, feature: ep-a2a}
      reason: "r"
      sources: [{ref: "x", confidence: verified}]
      witness: {dist: sglang, fact: ep-a2a, inside: absent, context: {arch: "9.0", gpu_count: 8, interconnect: nvswitch}}
    """
    report = verify(rules_from(tmp_path, body))
    why = {v.rule_id: (v.result, v.why) for v in report.rules}
    assert why["no-reader"] == (WitnessResult.UNWITNESSED, "torch wheel variants live on download.pytorch.org")
    assert why["no-bound"][0] is WitnessResult.UNWITNESSED and "no version bound" in why["no-bound"][1]
    assert why["undecided"][0] is WitnessResult.UNWITNESSED and "undecided at sglang" in why["undecided"][1]
    assert report.witnessed == 0 and report.ok


def test_a_rule_with_no_own_target_is_read_for_its_witness_context(tmp_path):
    body = SYMM_RULE.format(bound=">=0.5.14").replace('["12.0", "12.1"]', '["12.1"]').replace(
        "inside: unavailable}", 'inside: unavailable, context: {arch: "12.1", gpu_count: 2, interconnect: pcie}}')
    (rule_check,) = verify(rules_from(tmp_path, body)).rules
    assert rule_check.result is WitnessResult.CONFIRMED
    assert rule_check.checks[0].targets == ("arch 12.1 x2 pcie (witness context)",)


@pytest.mark.parametrize(("witness", "message"), [
    ("{dist: torch, fact: torch-symm-mem, inside: unavailable}", "witness dist 'torch'"),
    ("{dist: sglang, fact: no-such-fact, inside: unavailable}", "unknown witness fact 'no-such-fact' for sglang"),
    ("{dist: sglang, fact: torch-symm-mem, inside: broken}", "is not a reading status"),
    ("{dist: sglang, fact: torch-symm-mem, inside: absent, context: {gpus: 2}}", "unknown witness context key"),
    ("{dist: sglang, fact: torch-symm-mem, inside: absent, colour: red}", "unknown"),
])
def test_bad_witness_data_is_a_load_error(tmp_path, witness, message):
    body = SYMM_RULE.format(bound=">=0.5.14").replace(
        "{dist: sglang, fact: torch-symm-mem, inside: unavailable}", witness)
    with pytest.raises(SpecError, match=message):
        rules_from(tmp_path, body)


# --------------------------------------------------------------------------- CLI

@pytest.fixture()
def fake_wheels(monkeypatch):
    monkeypatch.setattr("stackforge.cli.compat.wheel_sources", lambda **_: (fake_evaluate(), list_releases))


def user_compat_dir(tmp_path, bound: str):
    folder = tmp_path / "compat"
    folder.mkdir()
    (folder / "mine.yaml").write_text("schema: 1\nrules:\n" + textwrap.indent(SYMM_RULE.format(bound=bound), "  "))
    return folder


def test_cli_exits_1_naming_the_wrong_rule_and_its_measured_bound(tmp_path, fake_wheels):
    folder = user_compat_dir(tmp_path, ">=0.5.15")
    result = CliRunner().invoke(cli, ["--compat", str(folder), "compat", "verify", "--rule", "symm-disabled"])
    assert result.exit_code == 1, result.output
    assert "WRONG          symm-disabled" in result.output
    assert "measured bound sglang >=0.5.14" in result.output
    assert "witnessed 1 / 1 rules: 0 confirmed, 0 half-witnessed, 1 wrong, 0 unwitnessed" in result.output


def test_cli_exits_0_and_prints_json_when_the_bound_is_right(tmp_path, fake_wheels):
    folder = user_compat_dir(tmp_path, ">=0.5.14")
    result = CliRunner().invoke(cli, ["--compat", str(folder), "compat", "verify", "--rule", "symm-disabled",
                                      "--json"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.output)
    assert data["schema"] == "stackforge.compat-verify/1"
    assert (data["witnessed"], data["total"], data["wrong"]) == (1, 1, 0)
    assert data["rules"][0]["verdict"] == "confirmed"


def test_cli_unknown_rule_is_bad_input(fake_wheels):
    result = CliRunner().invoke(cli, ["compat", "verify", "--rule", "no-such-rule"])
    assert result.exit_code == 2
    assert "unknown rule no-such-rule; valid:" in result.output


def test_a_witness_context_stands_in_for_the_targets_hardware(tmp_path):
    """No shipped target has 6 GPUs; a rule about 6 PCIe GPUs is read on the PCIe targets as 6 GPUs."""
    body = """\
    - id: six-gpus
      when:
        arch: {in: ["12.0"]}
        sglang: ">=0.5.14"
        interconnect: pcie
        gpu_count: {not_in: [1, 2, 4, 8]}
      then: {effect: feature_unavailable, feature: torch-symm-mem}
      reason: "six"
      sources: [{ref: "x", confidence: verified}]
      witness: {dist: sglang, fact: torch-symm-mem, inside: unavailable, context: {gpu_count: 6}}
    """
    calls: list = []
    (rule_check,) = verify(rules_from(tmp_path, body), calls).rules
    assert rule_check.result is WitnessResult.CONFIRMED, rule_check.why
    assert {ctx.gpu_count for *_, ctx in calls} == {6}
    assert {t for c in rule_check.checks for t in c.targets} == {
        "rtx-pro-6000-x8-pcie as gpu_count=6", "rtx-pro-6000-x2-pcie as gpu_count=6", "rtx-5090-x1 as gpu_count=6"}


def test_a_witness_without_a_registered_reader_reads_undecided(tmp_path):
    """A fact the loader knows but no reader registers leaves the rule unwitnessed, not the run broken."""
    from stackforge.core.wheel_readings import ReadContext
    from stackforge.wheels.readings import WheelReadings

    readings = WheelReadings(indexes=None, cache=None)  # no index or cache is touched before the reader
    reading = readings.evaluate("no-such-fact", "flashinfer-python", "0.7.4", ReadContext("12.0", 8, "pcie"))
    assert reading.status is ReadingStatus.UNDECIDED
    assert "no wheel reader for fact 'no-such-fact'" in reading.summary


def test_every_shipped_witness_has_a_registered_reader():
    """A witness whose (fact, dist) no reader registers could never be checked: the data must not promise it."""
    from stackforge.wheels.readers import READERS

    registered = {(spec.fact, spec.dist) for spec in READERS}
    missing = sorted({(r.id, r.witness.fact, r.witness.dist) for r in load_rules()
                      if r.witness is not None and (r.witness.fact, r.witness.dist) not in registered})
    assert not missing, missing
    assert sum(1 for r in load_rules() if r.witness is not None) >= 30


def test_a_witness_context_outside_the_rules_own_conditions_is_unwitnessed(tmp_path):
    body = SYMM_RULE.format(bound=">=0.5.14").replace(
        "inside: unavailable}", 'inside: unavailable, context: {arch: "9.0", gpu_count: 2, interconnect: pcie}}')
    (rule_check,) = verify(rules_from(tmp_path, body)).rules
    assert rule_check.result is WitnessResult.UNWITNESSED
    assert rule_check.why == "the witness context's arch is outside the rule's own conditions"


def test_the_text_says_which_stack_values_were_read(tmp_path, fake_wheels):
    folder = tmp_path / "compat"
    folder.mkdir()
    (folder / "gate.yaml").write_text("schema: 1\nrules:\n" + textwrap.indent(textwrap.dedent("""\
    - id: jit-gate
      when: {arch: {in: ["12.0"]}, flashinfer: ">=0.6.7,<0.7.1", nvcc: true, cuda: "<12.9"}
      then: {effect: feature_unavailable, feature: flashinfer-jit}
      reason: "gate"
      sources: [{ref: "PyPI flashinfer-python==0.7.1 wheel", confidence: verified}]
      witness: {dist: flashinfer-python, fact: flashinfer-jit, inside: unavailable}
    """), "  "))
    result = CliRunner().invoke(cli, ["--compat", str(folder), "compat", "verify", "--rule", "jit-gate"])
    assert result.exit_code == 0, result.output
    assert "read with cuda=12.8 (inside the rule's condition); nvcc=True (inside the rule's condition)" in result.output


@pytest.mark.parametrize("site, cited", [
    (CodeSite("sglang/a.py", 0, ""), "sglang/a.py (not in this release) no communicator"),
    (CodeSite("sglang/b.py", 0, "no TABLE in this file"), "sglang/b.py (no TABLE in this file) no communicator"),
])
def test_the_text_cites_an_absence_as_such_not_as_line_0(tmp_path, site, cited):
    """A reading decided on a file's absence (a line-0 site) prints "not in this release"; one on a
    name missing from a file that is there prints what it lacks; never ``path:0``."""
    from stackforge.wheels.verify import write_verification_text

    def evaluate(fact, dist, version, ctx):
        if version < "0.5.14":
            return Reading(fact, ReadingStatus.ABSENT, "no communicator in this SGLang", (site,))
        return Reading(fact, ReadingStatus.UNAVAILABLE, "disabled", (CodeSite("sglang/b.py", 78, "TABLE.get(cap)"),))

    rules = rules_from(tmp_path, SYMM_RULE.format(bound=">=0.5.14"))
    text = write_verification_text(verify_rules(rules, load_targets(), evaluate=evaluate, list_releases=list_releases))
    assert ":0 " not in text, text
    assert cited in text, text
    assert "sglang/b.py:78 disabled" in text
