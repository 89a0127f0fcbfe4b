"""Review fixes: ``--no-plan`` shows measured results only (external images included); md_document passes a line
through raw only where markdown itself sees a fence."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from stackforge.cli import cli
from stackforge.core.markdown import md_document
from test_external_predictions import IMAGE_ID, TARGET, image_stack, results_with


def test_no_plan_gives_an_external_image_no_predictions(tmp_path: Path):
    results = results_with(tmp_path, image_stack())
    result = CliRunner().invoke(cli, ["matrix", "--results", str(results), "--target", TARGET, "--format", "json",
                                      "--no-plan"])
    assert result.exit_code == 0, result.output
    row = next(r for r in json.loads(result.stdout)["rows"] if r["stack_id"] == IMAGE_ID)
    assert all(c["source"] != "predicted" and c["prediction"] is None for c in row["cells"]), row["cells"]
    assert next(c for c in row["cells"] if c["feature"] == "torch-kernels")["status"] == "pass"   # measured stays


# --------------------------------------------------------------------------- md_document's fences

@pytest.mark.parametrize("doc", [
    "x\n```a`b\n<img src=x onerror=alert(1)>",            # a backtick in the info string: no fence in markdown
    "<details>\n```diff\n<img src=x onerror=alert(1)>",   # inside the HTML block a tag at a line's start opens
    "~~~\n```diff\n~~~\n<img src=x onerror=alert(1)>",    # markdown's tilde fence closes under the ``` one
    "- a\n  ```x\n<img src=x onerror=alert(1)>",          # a list item's fence ends with the list item
    "```diff\n-a\n```x\n```\n<img src=x onerror=alert(1)>",  # ```x closes nothing; ``` does
])
def test_record_text_that_looks_like_a_fence_never_makes_the_next_lines_raw(doc: str):
    assert "<img" not in md_document(doc)


def test_a_real_language_fence_is_still_kept_as_written():
    assert md_document("```diff\n-a <b>\n```x\n+b\n```\n<i>") == "```diff\n-a <b>\n```x\n+b\n```\n&lt;i&gt;"


# --------------------------------------------------------------------------- probe's error line for --image

def test_an_errored_probe_of_an_external_image_is_not_told_to_build_it_or_pass_builds():
    from stackforge.cli.probe import refuse_errored
    from stackforge.core.errors import ProbeError
    from stackforge.core.records import Outcome, Provenance, ResultRecord, Status, Tier

    record = ResultRecord(run_id="run-x", stack_id=IMAGE_ID, stack=image_stack(), target=TARGET,
                          probe="gate.torch.arch-list", feature="torch-kernels", tier=Tier.GATE,
                          outcome=Outcome(Status.ERROR, "the probe script crashed"), provenance=Provenance(),
                          created_at="2026-12-05T00:00:00+00:00")
    with pytest.raises(ProbeError) as raised:
        refuse_errored([record])
    line = raised.value.one_line()
    assert "--builds" not in line and "stackforge build" not in line and "--image" in line
