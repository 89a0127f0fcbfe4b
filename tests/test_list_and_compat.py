"""``stackforge list``, ``--compat DIR`` / STACKFORGE_COMPAT, and ``--version``."""

from __future__ import annotations

import datetime
import json
import re
from pathlib import Path

from click.testing import CliRunner

from stackforge.cli import cli
from stackforge.core.textfit import fit_table
from stackforge.plan.planner import load_knowledge
from stackforge.plan.rules import FEATURES
from stackforge.plan.user_compat import load_about
from stackforge.probes.catalog import catalog

COMPAT = Path(__file__).resolve().parents[1] / "compat"

USER_RULE = """\
schema: 1
rules:
  - id: team-sm120-no-nvfp4
    when:
      arch: {in: ["12.0"]}
      flashinfer: "<0.8"
    then: {effect: feature_unavailable, feature: nvfp4-gemm}
    reason: "Our own measurement on the lab box."
    sources:
      - {ref: "lab notebook 2026-11-30", confidence: inferred}
"""

USER_TARGETS = """\
schema: 1
targets:
  lab-rtx-x4:
    gpu: "NVIDIA RTX PRO 6000 Blackwell"
    arch: "12.0"
    gpu_count: 4
    interconnect: pcie
    min_driver: "580.95.05"
"""


def invoke(*args: str, env: dict[str, str] | None = None):
    return CliRunner().invoke(cli, list(args), env=env)


def user_dir(tmp_path: Path, rules: str = USER_RULE, targets: str | None = USER_TARGETS) -> Path:
    folder = tmp_path / "my-compat"
    (folder / "rules").mkdir(parents=True)
    (folder / "rules" / "team.yaml").write_text(rules)
    if targets is not None:
        (folder / "targets.yaml").write_text(targets)
    return folder


# --------------------------------------------------------------------------- list

def test_list_targets_json_has_the_shipped_profiles():
    result = invoke("list", "targets", "--json")
    assert result.exit_code == 0, result.output
    data = json.loads(result.output)
    assert data["schema"] == "stackforge.list" and data["kind"] == "targets"
    names = {item["name"]: item for item in data["items"]}
    assert names.keys() == load_knowledge().targets.keys()
    rtx = names["rtx-pro-6000-x8-pcie"]
    assert (rtx["arch"], rtx["gpu_count"], rtx["interconnect"], rtx["min_driver"]) == ("12.0", 8, "pcie", "570.26")


def test_list_features_names_the_probes_that_decide_each():
    data = json.loads(invoke("list", "features", "--json").output)
    features = {item["name"]: item for item in data["items"]}
    assert set(FEATURES) <= features.keys()
    assert features["flashinfer-ar-fusion"]["probes"] == ["gate.flashinfer.ar-fusion", "gate.sglang.ar-fusion"]
    assert features["nccl-nvls"]["probes"] == [] and features["nccl-nvls"]["rules"] >= 1
    assert all(item["description"] for item in data["items"]), "every feature needs a description in knowledge.yaml"


def test_every_feature_has_a_description_in_knowledge_yaml():
    described = load_about().features.keys()
    assert set(FEATURES) | {p.feature for p in catalog()} == set(described)


def test_list_probes_and_rules():
    probes = json.loads(invoke("list", "probes", "--json").output)["items"]
    ar = next(p for p in probes if p["id"] == "runtime.sglang.custom-allreduce")
    assert (ar["tier"], ar["feature"]) == ("runtime", "custom-allreduce")
    assert ar["preconditions"] == ">=2 GPUs, GPU of the target arch, packages: torch sglang"
    # The wheel tier is in the tier list too, under the probe ids its records carry.
    symm = next(p for p in probes if p["id"] == "wheel.sglang.torch-symm-mem")
    assert (symm["tier"], symm["feature"]) == ("wheel", "torch-symm-mem") and symm["description"]
    rules = json.loads(invoke("list", "rules", "--json").output)["items"]
    gate = next(r for r in rules if r["id"] == "flashinfer-ar-fusion-sm12-gate")
    assert gate["effect"] == "feature_unavailable" and gate["feature"] == "flashinfer-ar-fusion"
    assert "arch in [12.0, 12.1]" in gate["when"] and gate["source"]
    assert len(rules) == len(load_knowledge().rules)


def test_list_output_fits_columns():
    for kind in ("targets", "features", "probes", "rules"):
        result = invoke("list", kind, env={"COLUMNS": "80"})
        assert result.exit_code == 0
        assert max(len(line) for line in result.output.splitlines()) <= 80, kind
    wide = invoke("list", "rules", env={"COLUMNS": "400"}).output
    assert "flashinfer-ar-fusion-sm12-gate" in wide and "…" not in wide


def test_list_wraps_long_cells_and_keeps_names_whole():
    lines = fit_table([("a-long-rule-id", "word " * 20)], ("ID", "TEXT"), 40)
    assert lines[2].startswith("a-long-rule-id  word") and max(len(line) for line in lines) <= 40
    assert " ".join(lines).count("word") == 20                          # wrapped, never cut


def test_list_rejects_an_unknown_kind():
    assert invoke("list", "stacks").exit_code == 2


# --------------------------------------------------------------------------- --compat DIR

def test_user_rules_and_targets_reach_list_and_plan(tmp_path):
    folder = user_dir(tmp_path)
    targets = json.loads(invoke("--compat", str(folder), "list", "targets", "--json").output)
    assert "lab-rtx-x4" in {t["name"] for t in targets["items"]}
    rules = json.loads(invoke("list", "rules", "--json", env={"STACKFORGE_COMPAT": str(folder)}).output)
    team = next(r for r in rules["items"] if r["id"] == "team-sm120-no-nvfp4")
    assert team["origin"].endswith("rules/team.yaml:3")
    plan = invoke("--compat", str(folder), "plan", "--json", "--target", "lab-rtx-x4", "--cuda", "13.1")
    assert plan.exit_code == 0, plan.output
    payload = json.loads(plan.output)
    cells = payload["cells"]
    assert cells and all(c["target"] == "lab-rtx-x4" for c in cells)
    assert any(rule == "team-sm120-no-nvfp4" for c in cells for rule in c["findings"])
    assert payload["rules"]["team-sm120-no-nvfp4"]["origin"].endswith("rules/team.yaml:3")


def test_yml_files_are_read_like_yaml(tmp_path):
    """DIR/rules/mine.yml and DIR/targets.yml were silently ignored (only *.yaml was globbed)."""
    folder = tmp_path / "my-compat"
    (folder / "rules").mkdir(parents=True)
    (folder / "rules" / "mine.yml").write_text(USER_RULE)
    (folder / "targets.yml").write_text(USER_TARGETS)
    rules = json.loads(invoke("--compat", str(folder), "list", "rules", "--json").output)
    mine = next(r for r in rules["items"] if r["id"] == "team-sm120-no-nvfp4")
    assert mine["origin"].endswith("rules/mine.yml:3")
    targets = json.loads(invoke("--compat", str(folder), "list", "targets", "--json").output)
    assert "lab-rtx-x4" in {t["name"] for t in targets["items"]}
    (folder / "tables.yml").write_text("schema: 1\n")
    assert invoke("--compat", str(folder), "list", "rules").exit_code == 2


def test_without_compat_the_user_target_is_unknown(tmp_path):
    result = invoke("plan", "--target", "lab-rtx-x4")
    assert result.exit_code == 2 and "unknown target(s): lab-rtx-x4" in result.output


def test_a_user_rule_replaces_the_shipped_one_with_a_notice(tmp_path):
    shipped = next(r for r in load_knowledge().rules if r.id == "flashinfer-ar-fusion-sm12-gate")
    override = USER_RULE.replace("team-sm120-no-nvfp4", shipped.id)
    folder = user_dir(tmp_path, rules=override, targets=USER_TARGETS.replace("lab-rtx-x4", "rtx-5090-x1"))
    result = CliRunner().invoke(cli, ["--compat", str(folder), "list", "rules", "--json"])
    assert result.exit_code == 0
    notices = [line for line in result.stderr.splitlines() if line.startswith("stackforge: notice:")]
    assert any(f"rule {shipped.id} from" in n and shipped.origin in n for n in notices)
    assert any("target rtx-5090-x1" in n for n in notices)
    rules = json.loads(result.stdout)["items"]
    replaced = [r for r in rules if r["id"] == shipped.id]
    assert len(replaced) == 1 and replaced[0]["feature"] == "nvfp4-gemm"
    assert len(rules) == len(load_knowledge().rules)


def test_malformed_user_yaml_exits_2_with_file_and_line(tmp_path):
    folder = user_dir(tmp_path, rules=USER_RULE.replace('arch: {in: ["12.0"]}', 'arch: [12.0'), targets=None)
    result = invoke("--compat", str(folder), "list", "rules")
    assert result.exit_code == 2
    assert re.search(r"stackforge: error: .*rules/team\.yaml:\d+: malformed YAML", result.output)


def test_an_unknown_fact_in_a_user_rule_exits_2_with_file_and_line(tmp_path):
    folder = user_dir(tmp_path, rules=USER_RULE.replace('arch: {in: ["12.0"]}', 'gpu_arch: "12.0"'), targets=None)
    result = invoke("plan", env={"STACKFORGE_COMPAT": str(folder)})
    assert result.exit_code == 2 and "team.yaml:5: unknown fact 'gpu_arch'" in result.output


def test_a_rule_id_twice_in_the_user_dir_exits_2(tmp_path):
    folder = user_dir(tmp_path, targets=None)
    (folder / "more.yaml").write_text(USER_RULE)
    result = invoke("--compat", str(folder), "list", "rules")
    assert result.exit_code == 2 and "duplicate rule id 'team-sm120-no-nvfp4'" in result.output


def test_tables_cannot_be_overridden(tmp_path):
    folder = user_dir(tmp_path, targets=None)
    (folder / "tables.yaml").write_text("schema: 1\n")
    result = invoke("--compat", str(folder), "list", "rules")
    assert result.exit_code == 2 and "tables.yaml cannot be overridden" in result.output


def test_compat_must_be_a_directory(tmp_path):
    assert invoke("--compat", str(tmp_path / "nope"), "list", "rules").exit_code == 2


# --------------------------------------------------------------------------- --version

def test_version_prints_the_rule_count_and_knowledge_date():
    result = invoke("--version")
    assert result.exit_code == 0
    knowledge = load_knowledge()
    curated = sum(1 for r in knowledge.rules if r.origin.startswith("compat/rules/"))
    assert (f"knowledge base: {len(knowledge.rules)} rules ({curated} in compat/rules, "
            f"{len(knowledge.rules) - curated} from SGLang's pins), {len(knowledge.targets)} targets") in result.output
    assert f"checked {load_about().knowledge_date.isoformat()}" in result.output


def test_version_counts_user_rules(tmp_path):
    result = invoke("--compat", str(user_dir(tmp_path)), "--version")
    assert result.exit_code == 0
    assert f"{len(load_knowledge().rules) + 1} rules" in result.output.splitlines()[-1]
    assert "(1 user rule(s), 1 user target(s))" in result.output


def test_knowledge_date_is_not_older_than_any_dated_source():
    """A source ref citing a date after knowledge_date means the date was not bumped."""
    cited = [datetime.date.fromisoformat(d) for path in COMPAT.rglob("*.yaml")
             for d in re.findall(r"\b(20\d\d-\d\d-\d\d)\b", path.read_text()) if path.name != "knowledge.yaml"]
    assert cited and max(cited) <= load_about(COMPAT / "knowledge.yaml").knowledge_date


def test_deadends_plans_with_the_user_compat_data(tmp_path):
    """The report commands (matrix, deadends, pick) plan through the same overlay as `plan`."""
    from matrix_fixtures import record

    from stackforge.results.store import finish_run, start_run, write_record

    stack_id = "cu131-torch2.14.1-fi0.7.2-sgl0.5.23-py311-wheels-debian12"
    run_dir = start_run(tmp_path / "results", command=["stackforge", "probe"], run_id="20261130T000000Z-lab")
    write_record(run_dir, record(stack_id, "flashinfer-jit", "pass", run_id="20261130T000000Z-lab",
                                 target="lab-rtx-x4"))
    finish_run(run_dir)
    args = ["deadends", "--matrix", "default", "--target", "lab-rtx-x4", "--results", str(tmp_path / "results"),
            "--format", "json"]
    without = invoke(*args)
    assert without.exit_code == 2 and "unknown target(s): lab-rtx-x4" in without.output
    result = invoke("--compat", str(user_dir(tmp_path)), *args)
    assert result.exit_code == 0, result.output
    assert "team-sm120-no-nvfp4" in result.output
