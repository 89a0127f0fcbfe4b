"""``stackforge upgrade``: how two stacks are compared, and the CLI's handling of bad input."""

from __future__ import annotations

import json
import re

import pytest
from click.testing import CliRunner
from matrix_fixtures import (
    CU128,
    CU130,
    CU131,
    PRUNED,
    STACKS,
    TARGET,
    plan_dict,
    record,
    seed_records,
    serve_metrics,
)
from upgrade_fixtures import UPGRADE_DATA, write_workspace

from stackforge.build.records import BuildRecord, BuildStatus
from stackforge.build.records import write_record as write_build_record
from stackforge.cli import cli
from stackforge.core.errors import SpecError
from stackforge.plan.planner import Plan
from stackforge.report.compat_matrix import CellStatus
from stackforge.report.formats import write_upgrade
from stackforge.report.upgrade import (
    ChangeKind,
    StackChoice,
    build_upgrade,
    change_of,
    image_sizes_from_builds,
    upgrade_to_json,
)


def upgrade(records, before: StackChoice, after: StackChoice, plan=None, **kwargs):
    return build_upgrade(records, Plan.from_json(plan or plan_dict()), TARGET, before, after, **kwargs)


def by_cuda(old: str, new: str) -> tuple[StackChoice, StackChoice]:
    return StackChoice(cuda=old), StackChoice(cuda=new)


def invoke(*args: str, workspace=UPGRADE_DATA):
    return CliRunner().invoke(cli, ["upgrade", *args, "--results", str(workspace / "results"),
                                    "--plan", str(workspace / "plan.json")])


# ---------------------------------------------------------------------------------------------- judging


@pytest.mark.parametrize(("before", "after", "change"), [
    (CellStatus.FAIL, CellStatus.PASS, ChangeKind.GAINED),
    (CellStatus.UNAVAILABLE, CellStatus.HAZARD, ChangeKind.GAINED),
    (CellStatus.PASS, CellStatus.CRASH, ChangeKind.LOST),
    (CellStatus.REQUIRES, CellStatus.PRUNED, ChangeKind.LOST),
    (CellStatus.PASS, CellStatus.HAZARD, ChangeKind.UNCHANGED),
    (CellStatus.TIMEOUT, CellStatus.UNAVAILABLE, ChangeKind.UNCHANGED),
    (CellStatus.UNTESTED, CellStatus.PASS, ChangeKind.UNDECIDED),     # nothing says it was dead before
    (CellStatus.PASS, CellStatus.SKIP, ChangeKind.UNDECIDED),         # nothing says it is dead after
    (CellStatus.FAIL, CellStatus.ERROR, ChangeKind.UNDECIDED),        # a broken probe is no verdict
])
def test_change_of_a_feature(before, after, change):
    assert change_of(before, after) == change


def test_best_stack_of_each_family_and_the_evidence_of_each_side():
    report = upgrade(seed_records(), *by_cuda("12.8", "13.1"))
    assert (report.before.stack_id, report.after.stack_id) == (CU128, CU131)
    assert "best CUDA 12.8 stack by pick's ranking" in report.before.why and "out of 2" in report.before.why
    changes = {f.feature: (f.change, f.before.evidence, f.after.evidence) for f in report.features}
    assert changes["flashinfer-jit"] == ("gained", "measured (runtime)", "measured (runtime)")
    assert changes["custom-allreduce"] == ("unchanged", "measured (runtime)", "predicted by rule custom-ar-pcie")
    assert changes["serve"][1:] == ("measured (bench)", "measured (bench)")
    assert changes["nccl-graph-tree"] == ("undecided", "measured (runtime)", "no evidence")
    changes = [f.change for f in report.features]
    assert changes == sorted(changes, key=ChangeKind.ORDER.index)
    assert report.before.driver_floor.version == "570.26" and report.after.driver_floor.version == "590.44.01"


def test_the_upgrade_is_read_off_one_matrix_built_once(monkeypatch):
    """Both sides, pick's ranking of each CUDA family and the remaining dead ends come from one build of
    the compatibility matrix (it was built three times: once here, twice through pick)."""
    from stackforge.report import compat_matrix, pick, upgrade as upgrade_module

    built = []

    def counting(*args, **kwargs):
        built.append(args[2])
        return compat_matrix.build_matrix(*args, **kwargs)

    monkeypatch.setattr(upgrade_module, "build_matrix", counting)
    monkeypatch.setattr(pick, "build_matrix", counting)
    report = upgrade(seed_records(), *by_cuda("12.8", "13.1"))
    assert (report.before.stack_id, report.after.stack_id) == (CU128, CU131)
    assert built == [TARGET]


def test_an_nvcc_only_feature_gained_between_flavours_is_the_flavours_change_not_the_upgrades():
    plan = plan_dict()
    for cell in plan["cells"]:
        if cell["stack_id"] == CU128:
            cell["derived"]["has_nvcc"] = False       # the FROM image is a flavour without nvcc
    # The FROM image's gate measured it cannot JIT (no nvcc, nothing prebuilt): its dead end is its flavour's.
    records = [r for r in seed_records() if (r.stack_id, r.feature) != (CU128, "flashinfer-jit")]
    records.append(record(CU128, "flashinfer-jit", "fail", tier="gate", probe="gate.flashinfer.jit",
                          reason="no nvcc in this flavour: FlashInfer would JIT for 12.0a",
                          metrics={"jit_possible": False}))
    same_flavour = upgrade(records, *by_cuda("12.8", "13.1"), nvcc_features=frozenset({"flashinfer-jit"}))
    other_flavour = upgrade(records, *by_cuda("12.8", "13.1"), plan=plan,
                            nvcc_features=frozenset({"flashinfer-jit"}))
    change = {f.feature: f.change for f in same_flavour.features}
    assert change["flashinfer-jit"] == ChangeKind.GAINED
    change = {f.feature: f.change for f in other_flavour.features}
    assert change["flashinfer-jit"] == ChangeKind.FLAVOUR
    # FlashInfer's own arch gate refusing sm_120 is the stack's, whatever the flavours: the upgrade gains it.
    refused = upgrade(seed_records(), *by_cuda("12.8", "13.1"), plan=plan, nvcc_features=frozenset({"flashinfer-jit"}))
    assert {f.feature: f.change for f in refused.features}["flashinfer-jit"] == ChangeKind.GAINED
    assert change["custom-allreduce"] == ChangeKind.UNCHANGED       # not an nvcc-only feature
    assert "1 flavour" in write_upgrade(other_flavour, "md")
    assert "flavour" not in write_upgrade(same_flavour, "md").split("\n")[2]


def test_the_shipped_rules_name_the_features_only_nvcc_decides():
    from stackforge.plan.planner import load_knowledge
    from stackforge.plan.rules import features_only_nvcc_decides

    assert features_only_nvcc_decides(load_knowledge().rules) == {"flashinfer-jit", "nvcc-codegen"}


def test_gate_evidence_is_labelled_gate():
    report = upgrade(seed_records(), StackChoice(stack_id=CU128), StackChoice(stack_id=CU130))
    jit = next(f for f in report.features if f.feature == "flashinfer-jit")
    # The JIT gate compiles, it does not run: the code admits sm_120, which is not "gained".
    assert (jit.change, jit.after.evidence, jit.after.probe) == ("admitted", "measured (gate)", "flashinfer-jit-gate")
    assert jit.after.status == "admitted"


def test_a_feature_that_breaks_is_lost_and_remains_a_dead_end():
    records = [r for r in seed_records() if (r.stack_id, r.feature) != (CU131, "flashinfer-jit")]
    records += [record(CU128, "nccl-graph-tree", "pass", run_id="later", created_at="2026-03-02T00:00:00+00:00"),
                record(CU131, "nccl-graph-tree", "fail", reason="graph capture broke with NCCL_ALGO=Tree")]
    records = [r for r in records if not (r.stack_id == CU128 and r.feature == "nccl-graph-tree"
                                          and r.outcome.status.value == "timeout")]
    report = upgrade(records, *by_cuda("12.8", "13.1"))
    tree = next(f for f in report.features if f.feature == "nccl-graph-tree")
    assert tree.change == "lost" and report.count("lost") == 1
    dead = {d.feature: d for d in report.dead_ends}
    assert set(dead) == {"nccl-graph-tree", "torch-symm-mem"}
    assert dead["nccl-graph-tree"].history() == "new with the upgrade (it works on FROM)"
    assert dead["torch-symm-mem"].history() == "dead on FROM too"
    # the way out is the stack measured to pass, with the versions that differ from the new stack
    assert dead["nccl-graph-tree"].unblock.startswith(f"measured to pass (runtime) on {CU128} (cuda 13.1 → 12.8")


def test_remaining_dead_end_names_the_rule_remedy_and_the_unblocking_stack():
    records = [r for r in seed_records() if r.stack_id not in (CU128, CU131)]
    report = upgrade(records, StackChoice(stack_id=CU130), StackChoice(stack_id=CU128))
    dead = {d.feature: d for d in report.dead_ends}
    fusion = dead["flashinfer-ar-fusion"]
    assert fusion.cell.evidence == "predicted by rule fi-arfusion-sm120"
    assert fusion.remedy == "use FlashInfer >= 0.6.14"
    assert fusion.unblock.startswith(f"the code admits it (gate) on {CU130} (cuda 12.8 → 13.0, torch 2.9.1 → 2.11.0")
    assert "not measured working" in fusion.unblock
    # no measurement anywhere: the first kept stack no rule blocks, flagged as a prediction
    assert dead["torch-symm-mem"].unblock.startswith(f"predicted to work on {CU131} (")
    assert "not measured" in dead["torch-symm-mem"].unblock


def test_a_side_without_measurement_says_predicted_only_and_never_measured():
    records = [r for r in seed_records() if r.stack_id != CU128]
    report = upgrade(records, *by_cuda("12.8", "13.1"))
    assert report.before.stack_id == CU128 and not report.before.measured and report.after.measured
    assert "none of them was probed" in report.before.why
    assert all(not f.before.evidence.startswith("measured") for f in report.features)
    md = write_upgrade(report, "md")
    assert f"from `{CU128}` (predicted only)" in md and f"to `{CU131}` |" in md
    assert json.loads(write_upgrade(report, "json"))["from"]["evidence"] == "predicted only"
    assert "predicted only</span>" in write_upgrade(report, "html")


def test_no_records_at_all_is_predictions_only_on_both_sides():
    report = upgrade([], *by_cuda("12.8", "13.1"))
    assert report.predictions_only and not report.before.measured and not report.after.measured
    assert write_upgrade(report, "md").count("(predicted only)") == 2
    assert report.metrics == ()


def test_benchmark_deltas_with_their_spread_and_direction():
    records = [r for r in seed_records() if r.feature != "serve"]
    records += [record(CU128, "serve", "pass", tier="bench", probe="serve-bench", metrics={
        **serve_metrics(100.0, spread=4.0), "ttft_ms": {"median": 80.0, "min": 78.0, "max": 82.0, "n": 5}}),
        record(CU131, "serve", "pass", tier="bench", probe="serve-bench", metrics={
            **serve_metrics(101.0, spread=4.0), "ttft_ms": {"median": 95.0, "min": 94.0, "max": 96.0, "n": 5}})]
    report = upgrade(records, *by_cuda("12.8", "13.1"))
    deltas = {m.metric: m for m in report.metrics}
    assert deltas["output_throughput"].trend == "within noise" and deltas["output_throughput"].higher_is_better
    assert (deltas["ttft_ms"].trend, deltas["ttft_ms"].higher_is_better) == ("regression", False)
    assert deltas["ttft_ms"].delta == pytest.approx(15.0) and deltas["ttft_ms"].noise == pytest.approx(4.0)
    md = write_upgrade(report, "md")
    assert "| `serve-bench` · ttft_ms | 80 (78–82, n=5) | 95 (94–96, n=5) | +15 (+18.8%) | regression" in md


def test_probe_numbers_are_evidence_not_benchmarks():
    records = seed_records() + [record(stack, "custom-allreduce", "pass", probe="custom-ar-extra",
                                       metrics={"graph_us": us, "graph_max_abs_diff": 0.0})
                                for stack, us in ((CU128, 40.0), (CU131, 90.0))]
    assert [m.probe for m in upgrade(records, *by_cuda("12.8", "13.1")).metrics] == ["serve-bench"]


def test_failed_benchmarks_are_not_compared():
    records = seed_records() + [record(CU131, "serve", "fail", tier="bench", probe="serve-bench",
                                       metrics=serve_metrics(5.0), created_at="2026-03-02T00:00:00+00:00")]
    records = [r for r in records
               if not (r.stack_id == CU131 and r.feature == "serve" and r.outcome.status.value == "pass")]
    assert upgrade(records, *by_cuda("12.8", "13.1")).metrics == ()


def test_image_sizes_from_build_records(tmp_path):
    write_build_record(tmp_path, BuildRecord(stack_id=CU128, stack=STACKS[CU128], derived={},
                                             status=BuildStatus.FAILED, image_size=None))
    write_build_record(tmp_path, BuildRecord(stack_id=CU131, stack=STACKS[CU131], derived={},
                                             status=BuildStatus.CACHED, image_size=11_604_000_000))
    report = upgrade(seed_records(), *by_cuda("12.8", "13.1"), size_of=image_sizes_from_builds(tmp_path))
    assert report.before.image_size.text() == "unknown (its build failed)"
    assert report.after.image_size.text() == "11.60 GB (build record)"
    payload = upgrade_to_json(report)
    assert payload["summary"]["image_size"] == "unknown (a side has no build record)"
    assert payload["to"]["image_size_bytes"] == 11_604_000_000
    plain = upgrade(seed_records(), *by_cuda("12.8", "13.1"))
    assert plain.after.image_size.bytes is None and "pass --builds" in plain.after.image_size.text()


def test_a_pruned_stack_compared_says_so_and_keeps_no_dead_end_list():
    report = upgrade(seed_records(), StackChoice(stack_id=CU128), StackChoice(stack_id=PRUNED))
    assert {f.after.status for f in report.features} == {"pruned"}
    assert {f.after.evidence for f in report.features} == {"predicted by rule torch-no-cu128-from-212 (stack pruned)"}
    assert report.dead_ends == ()


def test_a_family_the_plan_prunes_entirely_is_refused():
    plan = plan_dict()
    for cell in plan["cells"]:
        if cell["stack_id"] == CU128:
            cell["status"] = "pruned"
            cell["findings"] = [{"rule": "r", "effect": "incompatible", "feature": None, "reason": "no"}]
    records = [r for r in seed_records() if r.stack_id != CU128]
    with pytest.raises(SpecError, match=r"every CUDA 12\.8 stack for --from-cuda is pruned by the plan"):
        upgrade(records, *by_cuda("12.8", "13.1"), plan=plan)


# ---------------------------------------------------------------------------------------------- CLI


def test_cli_by_cuda_family():
    result = invoke("--from-cuda", "12.8", "--to-cuda", "13.1", "--target", TARGET)
    assert result.exit_code == 0, result.output
    assert result.stdout.startswith("upgrade CUDA 12.8 -> 13.1 on rtx-pro-6000-x8-pcie:")    # one screen
    full = invoke("--from-cuda", "12.8", "--to-cuda", "13.1", "--target", TARGET, "--evidence")
    assert full.stdout.startswith("### stackforge upgrade · CUDA 12.8 → 13.1 on rtx-pro-6000-x8-pcie")


def test_cli_stack_ids_and_a_mix_with_a_family():
    result = invoke(CU130, "--to-cuda", "13.1", "--format", "json")
    assert result.exit_code == 0, result.output
    payload = json.loads(result.stdout)
    assert (payload["from"]["stack_id"], payload["to"]["stack_id"]) == (CU130, CU131)
    assert payload["from"]["why"] == "given as FROM"
    result = invoke(CU128, CU130)
    assert result.exit_code == 0, result.output


def test_cli_html_to_a_file(tmp_path):
    out = tmp_path / "upgrade.html"
    result = invoke("--from-cuda", "12.8", "--to-cuda", "13.1", "--format", "html", "--out", str(out))
    assert result.exit_code == 0, result.output
    html = out.read_text(encoding="utf-8")
    assert "Content-Security-Policy" in html and "default-src 'none'" in html
    assert re.search(r"<script[^>]*\bsrc=", html) is None and "http-equiv" in html


def test_cli_unknown_stack_is_exit_2_naming_the_known_ones():
    result = invoke("cu129-nope", CU131)
    assert result.exit_code == 2
    assert "unknown stack id 'cu129-nope' for FROM" in result.stderr
    for known in (CU128, PRUNED, CU130, CU131):
        assert known in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1 and result.stderr.startswith("stackforge: error: ")


def test_cli_from_and_to_equal_is_exit_2():
    for args in ((CU131, CU131), ("--from-cuda", "13.1", "--to-cuda", "13.1")):
        result = invoke(*args)
        assert result.exit_code == 2, result.output
        assert "FROM and TO are the same" in result.stderr
    # the same stack reached two ways (an id and its family) is refused as well
    result = invoke(CU131, "--from-cuda", "13.1")
    assert result.exit_code == 2 and f"FROM and TO are the same stack ({CU131})" in result.stderr


def test_cli_cuda_family_without_stacks_is_exit_2_naming_what_there_is():
    result = invoke("--from-cuda", "12.9", "--to-cuda", "13.1")
    assert result.exit_code == 2
    assert "no stack with CUDA 12.9 for --from-cuda" in result.stderr
    assert "the stacks have CUDA 12.8, 13.0, 13.1" in result.stderr and CU128 in result.stderr


def test_cli_wrong_number_of_stacks_and_a_hostile_version_are_exit_2():
    assert invoke(CU128).exit_code == 2
    assert invoke(CU128, CU130, "--to-cuda", "13.1").exit_code == 2
    result = invoke("--from-cuda", "12.8;rm", "--to-cuda", "13.1")
    assert result.exit_code == 2 and "--from-cuda" in result.stderr


def test_cli_predicted_only_side(tmp_path):
    workspace = write_workspace(tmp_path, without=(CU128,))
    result = invoke("--from-cuda", "12.8", "--to-cuda", "13.1", "--format", "md", workspace=workspace)
    assert result.exit_code == 0, result.output
    assert "| evidence | **predicted only** — no probe result | measured |" in result.stdout


def test_a_built_image_never_probed_is_named_as_such(tmp_path):
    write_build_record(tmp_path, BuildRecord(stack_id=CU128, stack=STACKS[CU128], derived={},
                                             status=BuildStatus.BUILT, image_tag="stackforge/cu128:abc",
                                             image_size=7_000_000_000))
    records = [r for r in seed_records() if r.stack_id != CU128]
    report = upgrade(records, *by_cuda("12.8", "13.1"), size_of=image_sizes_from_builds(tmp_path))
    assert report.before.image == "" and not report.before.measured
    assert ("| image | `stackforge/cu128:abc` (built, never probed on this target: no evidence it works) | "
            in write_upgrade(report, "md"))
    assert upgrade_to_json(report)["from"]["built_image"] == "stackforge/cu128:abc"


def test_the_committed_workspace_is_what_the_fixtures_write(tmp_path):
    """tests/data/upgrade is regenerated from matrix_fixtures, never edited by hand (see upgrade_fixtures)."""
    write_workspace(tmp_path)
    written = sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*") if p.is_file())
    committed = sorted(p.relative_to(UPGRADE_DATA) for p in UPGRADE_DATA.rglob("*") if p.is_file())
    assert written == committed
    changed = [str(p) for p in written if (tmp_path / p).read_bytes() != (UPGRADE_DATA / p).read_bytes()]
    assert not changed, f"regenerate with: python tests/upgrade_fixtures.py tests/data/upgrade ({changed})"


def test_a_cuda_family_side_takes_the_stack_of_the_other_sides_flavour(tmp_path):
    # The default matrix has a devel and a wheels CUDA 12.8 stack and one wheels CUDA 13.1 stack: FROM is the
    # wheels one, so the report compares the upgrade, not two flavours, and says why it was taken.
    result = CliRunner().invoke(cli, ["upgrade", "--from-cuda", "12.8", "--to-cuda", "13.1", "--target",
                                      "rtx-pro-6000-x8-pcie", "--results", str(tmp_path), "--format", "json"])
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    assert doc["from"]["stack_id"] == "cu128-torch2.9.1-fi0.6.3-sgl0.5.9-py311-wheels-debian12"
    assert doc["to"]["stack_id"] == "cu131-torch2.14.1-fi0.7.2-sgl0.5.23-py311-wheels-debian12"
    assert "taken of the other side's flavour (wheels)" in doc["from"]["why"]
    # A stack named explicitly is taken as given, whatever its flavour.
    named = CliRunner().invoke(cli, ["upgrade", "cu128-torch2.9.1-fi0.6.3-sgl0.5.9-py312", "--to-cuda", "13.1",
                                     "--target", "rtx-pro-6000-x8-pcie", "--results", str(tmp_path), "--format",
                                     "json"])
    assert named.exit_code == 0, named.output
    assert json.loads(named.stdout)["from"]["stack_id"].endswith("-py312")
