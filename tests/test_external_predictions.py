"""The rules judge an external image (``probe --image``) as they judge a matrix stack, from what the image was
read to have: its row is planned (kept or pruned, with predictions), never "unplanned" for lack of a matrix."""

from __future__ import annotations

import json
from pathlib import Path

from click.testing import CliRunner

from stackforge.cli import cli
from stackforge.core.model import Flavour
from stackforge.core.records import Outcome, Provenance, ResultRecord, Status, Tier
from stackforge.plan.external import external_plan_cells, external_stack
from stackforge.plan.planner import Plan, load_knowledge
from stackforge.results.store import finish_run, start_run, write_record

TARGET = "rtx-pro-6000-x8-pcie"
IMAGE_ID = "image-sglang-abababababab"


def image_stack(**changes) -> dict:
    derived = {"has_nvcc": False, "torch_cuda": "12.8", "kernel_package": "sgl-kernel", "kernel_version": "0.3.21"}
    derived.update(changes.pop("derived", {}))
    return {"external": True, "image": "ghcr.io/acme/sglang@sha256:" + "ab" * 32, "image_id": "sha256:" + "ab" * 32,
            "refs": ["ghcr.io/acme/sglang:v1"], "cuda": "12.8", "python": "3.12", "torch": "2.9.1+cu128",
            "flashinfer": "0.6.3", "sglang": "0.5.9", "kernel": "0.3.21", "flavour": "external", "os": "ubuntu22.04",
            "derived": derived, **changes}


def results_with(tmp_path: Path, stack: dict) -> Path:
    run = start_run(tmp_path / "results", command=["stackforge", "probe", "--image", "ghcr.io/acme/sglang:v1"],
                    run_id="run-x")
    write_record(run, ResultRecord(run_id="run-x", stack_id=IMAGE_ID, stack=stack, target=TARGET,
                                   probe="gate.torch.arch-list", feature="torch-kernels", tier=Tier.GATE,
                                   outcome=Outcome(Status.PASS, "sm_120 in torch's arch list"),
                                   provenance=Provenance(), created_at="2026-12-05T00:00:00+00:00"))
    finish_run(run)
    return tmp_path / "results"


def image_row(results: Path) -> tuple[dict, str]:
    result = CliRunner().invoke(cli, ["matrix", "--results", str(results), "--target", TARGET, "--format", "json"])
    assert result.exit_code == 0, result.output
    return next(r for r in json.loads(result.stdout)["rows"] if r["stack_id"] == IMAGE_ID), result.stderr


def cell(row: dict, feature: str) -> dict:
    return next(c for c in row["cells"] if c["feature"] == feature)


def test_an_image_without_nvcc_gets_the_rules_predictions_and_keeps_what_it_was_read_to_have(tmp_path):
    row, _ = image_row(results_with(tmp_path, image_stack()))
    assert row["plan_status"] == "kept"
    assert row["stack"]["external"] is True and row["stack"]["torch"] == "2.9.1+cu128"   # the image, as read
    assert cell(row, "torch-kernels")["status"] == "pass"                               # the measurement stays
    jit = cell(row, "flashinfer-jit")
    assert (jit["status"], jit["source"], jit["prediction"]["rule"]) == ("unavailable", "predicted",
                                                                         "flashinfer-jit-needs-nvcc")


def test_the_images_nvcc_not_a_guess_decides_the_nvcc_rules(tmp_path):
    row, _ = image_row(results_with(tmp_path, image_stack(cuda="12.9", derived={"has_nvcc": True})))
    assert cell(row, "flashinfer-jit")["prediction"]["rule"] != "flashinfer-jit-needs-nvcc"
    assert cell(row, "nvcc-codegen")["prediction"]["rule"] != "no-nvcc-no-codegen"


def test_an_image_the_rules_cannot_judge_stays_unplanned_saying_why(tmp_path):
    row, stderr = image_row(results_with(tmp_path, image_stack(torch="")))
    assert row["plan_status"] == "unplanned"
    assert f"{IMAGE_ID}: no predictions (the image has no torch" in stderr


def test_the_stack_the_rules_see_and_the_cell_keeps_the_images_id():
    model, overrides = external_stack(image_stack())
    assert (model.torch, model.torch_variant, model.flavour) == ("2.9.1", "cu128", Flavour.RUNTIME)
    assert overrides["has_nvcc"] is False and overrides["kernel_package"] == "sgl-kernel"
    knowledge = load_knowledge()
    made = external_plan_cells({IMAGE_ID: image_stack()}, (knowledge.targets[TARGET],), knowledge)
    (only,) = made.cells
    assert only.stack_id == IMAGE_ID and only.derived.has_nvcc is False
    # The plan JSON keeps the image's id: a plan written and read back still names the image.
    plan = Plan(matrix=Plan.empty().matrix, targets=(only.target,), cells=(only,))
    assert [c.stack_id for c in Plan.from_json(plan.to_json()).cells] == [IMAGE_ID]
    assert plan.kept_stacks() == ()                                     # an image is no stack to build
    assert "cannot compare" in external_stack(image_stack(flashinfer="nightly"))


def test_what_the_image_lacks_is_not_filled_in_from_sglangs_pins():
    knowledge = load_knowledge()
    bare = image_stack(kernel=None, derived={"kernel_package": None, "kernel_version": None})
    (only,) = external_plan_cells({IMAGE_ID: bare}, (knowledge.targets[TARGET],), knowledge).cells
    assert (only.derived.kernel_package, only.derived.kernel_version) == (None, None)
