"""The rules engine on a small, self-contained knowledge base (tests/data/compat_min)."""

from __future__ import annotations

from pathlib import Path

import pytest

from stackforge.core.errors import SpecError
from stackforge.core.model import Flavour, Stack
from stackforge.core.records import Verdict
from stackforge.core.yamlio import load_text
from stackforge.plan.matrix_file import load_matrix
from stackforge.plan.planner import evaluate_cell, load_knowledge, plan_matrix
from stackforge.plan.rules import load_rules

COMPAT = Path(__file__).parent / "data" / "compat_min"


@pytest.fixture(scope="module")
def knowledge():
    return load_knowledge(COMPAT)


def stack(**overrides) -> Stack:
    values = dict(cuda="13.1", torch="2.14.1", flashinfer="0.7.2", sglang="0.5.23", python="3.11",
                  flavour=Flavour.WHEELS, os="debian12")
    values.update(overrides)
    return Stack(**values)


def fired(cell) -> set[str]:
    return {f.rule.id for f in cell.findings}


def test_coherent_stack_is_kept_with_predictions(knowledge):
    cell = evaluate_cell(stack(), knowledge.targets["rtx-pro-6000-x8-pcie"], knowledge)
    assert not cell.pruned
    assert fired(cell) == {"custom-ar-pcie", "tree-hazard", "driver-13"}
    predictions = {p.feature: p for p in cell.predictions}
    assert predictions["custom-allreduce"].verdict is Verdict.UNAVAILABLE
    assert predictions["custom-allreduce"].rule == "custom-ar-pcie"
    assert predictions["nccl-graph-tree"].verdict is Verdict.HAZARD
    assert predictions["flashinfer-ar-fusion"].verdict is Verdict.NO_RULE


def test_derived_facts(knowledge):
    cell = evaluate_cell(stack(), knowledge.targets["rtx-pro-6000-x8-pcie"], knowledge)
    derived = cell.derived
    assert derived.torch_variant == "cu130" and derived.torch_cuda == "13.0"
    assert derived.torch_index_url is None            # cu130 is PyPI's default for 2.14
    assert derived.kernel_package == "sglang-kernel" and derived.kernel_version == "0.4.10"
    assert derived.base_image == "python:3.11-slim-bookworm"
    assert derived.has_nvcc and derived.toolkit_wheels == {"nvidia-cuda-nvcc": "13.1.80"}
    # The driver floor is CUDA 13.x minor-version compatibility; 590.44.01 is only the toolkit's bundled driver.
    assert derived.min_driver == "580" and "minor-version compatibility" in derived.min_driver_reason
    assert derived.toolkit_driver == "590.44.01"
    assert derived.expected_arch_list[-1] == "12.0+PTX"


def test_non_default_variant_uses_pytorch_index(knowledge):
    derived = evaluate_cell(stack(torch="2.9.1", sglang="0.5.9", flashinfer="0.6.3"),
                            knowledge.targets["h200-x8-nvswitch"], knowledge).derived
    assert derived.torch_index_url == "https://download.pytorch.org/whl/cu130"


def test_pins_prune_with_reason(knowledge):
    cell = evaluate_cell(stack(torch="2.13.0"), knowledge.targets["h200-x8-nvswitch"], knowledge)
    assert cell.pruned
    assert "sglang-0.5.23-pins-torch" in fired(cell)
    pin = next(f.rule for f in cell.findings if f.rule.id == "sglang-0.5.23-pins-torch")
    assert "torch==2.14.1" in pin.reason and pin.sources


def test_python_pin_specifier(knowledge):
    cell = evaluate_cell(stack(python="3.10"), knowledge.targets["h200-x8-nvswitch"], knowledge)
    assert "sglang-0.5.23-pins-python" in fired(cell)


def test_toolkit_prunes_for_arch(knowledge):
    cell = evaluate_cell(stack(cuda="12.6", flavour=Flavour.DEVEL, os="ubuntu24.04", python="3.12"),
                         knowledge.targets["rtx-pro-6000-x8-pcie"], knowledge)
    assert cell.pruned and "toolkit-too-old-for-blackwell" in fired(cell)


def test_unknown_toolkit_is_a_clear_error(knowledge):
    with pytest.raises(SpecError, match="CUDA toolkit 14.2 is not in compat/tables.yaml"):
        evaluate_cell(stack(cuda="14.2"), knowledge.targets["h200-x8-nvswitch"], knowledge)


def test_wheels_flavour_needs_debian(knowledge):
    with pytest.raises(SpecError, match="flavour 'wheels' builds on a Debian base"):
        evaluate_cell(stack(os="ubuntu24.04"), knowledge.targets["h200-x8-nvswitch"], knowledge)


@pytest.mark.parametrize("when, message", [
    ("{gpu_arch: '12.0'}", "unknown fact 'gpu_arch'"),
    ("{flashinfer: '>=0.3.1,<<0.6'}", "not a valid PEP 440 specifier"),
    ("{gpu_count: {gt: many}}", "takes an integer"),
    ("{multicast: maybe}", "takes true or false"),
    ("{interconnect: {gt: 2}}", "does not apply to identifier fact"),
    ("{torch: '>=2.9; rm -rf /'}", "characters not allowed in a specifier"),
])
def test_bad_rules_are_load_errors(tmp_path, when, message):
    path = tmp_path / "r.yaml"
    path.write_text(f"schema: 1\nrules:\n  - id: r\n    when: {when}\n    then: {{effect: incompatible}}\n"
                    f"    reason: x\n    sources: [{{ref: x, confidence: verified}}]\n")
    with pytest.raises(SpecError, match=message) as info:
        load_rules([path])
    assert f"{path}:" in str(info.value)


def test_duplicate_rule_ids_rejected(tmp_path):
    text = "schema: 1\nrules:\n" + "".join(
        "  - {id: dup, when: {cuda: '>=13'}, then: {effect: incompatible}, reason: x, "
        "sources: [{ref: x, confidence: verified}]}\n" for _ in range(2))
    path = tmp_path / "r.yaml"
    path.write_text(text)
    with pytest.raises(SpecError, match="duplicate rule id 'dup'"):
        load_rules([path])


def test_feature_effect_needs_known_feature(tmp_path):
    path = tmp_path / "r.yaml"
    path.write_text("schema: 1\nrules:\n  - {id: r, when: {cuda: '>=13'}, then: {effect: hazard, feature: warp-drive},"
                    " reason: x, sources: [{ref: x, confidence: verified}]}\n")
    with pytest.raises(SpecError, match="unknown feature 'warp-drive'"):
        load_rules([path])


def test_plan_keeps_every_pruned_cell(knowledge, tmp_path):
    path = tmp_path / "m.yaml"
    path.write_text("schema: 1\ntargets: [rtx-pro-6000-x8-pcie, h200-x8-nvswitch]\n"
                    "defaults: {python: '3.11', flavour: wheels, os: debian12}\n"
                    "axes: {cuda: ['13.1'], torch: ['2.13.0', '2.14.1'], flashinfer: ['0.7.2'], sglang: ['0.5.23']}\n")
    plan = plan_matrix(load_matrix(path), knowledge)
    assert len(plan.cells) == 4
    assert [c.status for c in plan.cells] == ["pruned", "pruned", "kept", "kept"]
    assert [s.id for s in plan.kept_stacks()] == ["cu131-torch2.14.1-fi0.7.2-sgl0.5.23-py311-wheels-debian12"]
    data = plan.to_json()
    assert data["summary"] == {"cells": 4, "kept": 2, "pruned": 2, "excluded_by_matrix": 0}
    assert data["rules"][data["cells"][0]["findings"][0]]["sources"]


def test_yaml_mapping_lines():
    doc = load_text("a: 1\nb:\n  c: 2\n", source="x.yaml")
    assert doc.line_of("b") == 2 and doc["b"].line_of("c") == 3
