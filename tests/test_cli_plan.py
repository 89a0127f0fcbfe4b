"""``stackforge plan`` through click's CliRunner on the real entry point."""

from __future__ import annotations

import json

from click.testing import CliRunner

from stackforge.cli import cli

CU131 = "cu131-torch2.14.1-fi0.7.2-sgl0.5.23-py311-wheels-debian12"


def invoke(*args: str):
    return CliRunner().invoke(cli, list(args))


def test_plan_cuda_filter_shows_kept_and_pruned():
    result = invoke("plan", "--cuda", "13.1")
    assert result.exit_code == 0, result.output
    assert CU131 in result.output
    assert "cu128-" not in result.output
    assert "PRUNED" in result.output and "sglang-0.5.9-pins-torch" in result.output


def test_plan_json_for_another_target():
    result = invoke("plan", "--json", "--target", "h200-x8-nvswitch")
    payload = json.loads(result.output)
    assert set(payload["targets"]) == {"h200-x8-nvswitch"}
    cell = next(c for c in payload["cells"] if c["stack_id"] == CU131)
    # Schema 2: a cell names its prediction set; the set names, per feature, the rule that predicts it.
    fusion_rule = payload["prediction_sets"][cell["prediction_set"]].get("flashinfer-ar-fusion")
    assert fusion_rule is None or payload["rules"][fusion_rule]["effect"] != "feature_unavailable"  # Hopper + NVSwitch


def test_explain_lists_rules_with_sources():
    result = invoke("plan", "--explain", CU131)
    assert result.exit_code == 0
    assert "sglang-ar-fusion-rejects-sm12" in result.output
    assert "source:" in result.output and "defined at compat/rules/" in result.output


def test_explain_unknown_stack_is_one_line_exit_2():
    result = invoke("plan", "--explain", "cu999-nothing")
    assert result.exit_code == 2
    assert result.output.startswith("stackforge: error: unknown stack id 'cu999-nothing'; known: ")
    assert len(result.output.strip().splitlines()) == 1


def test_unknown_target_lists_known_ones():
    result = invoke("plan", "--target", "tpu-v5")
    assert result.exit_code == 2
    assert "unknown target(s): tpu-v5; known: " in result.output and "rtx-pro-6000-x8-pcie" in result.output


def test_hostile_cuda_filter_rejected():
    result = invoke("plan", "--cuda", "13.1;id")
    assert result.exit_code == 2
    assert "not a plain version string" in result.output
