"""Bounded inputs (issue #32 item 5, and item 14's matrix-file defects).

A few hundred bytes of input must not cost minutes or gigabytes: YAML alias bombs are refused by the one
loader, ``name`` / ``description`` are one line of text, a matrix names each target and version once, the
cells are counted before they are judged, ``plan --json`` states each rule once and writes a cell at a
time, and the HTML matrix draws a bounded number of rows.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from stackforge.cli import cli
from stackforge.core import yamlio
from stackforge.core.errors import RecordError, SpecError
from stackforge.core.yamlio import MAX_ALIAS_NODES, AliasBombError, load_file, load_text
from stackforge.plan import planner
from stackforge.plan.matrix_file import MAX_DESCRIPTION_CHARS, MAX_NAME_CHARS, load_matrix
from stackforge.plan.planner import MAX_CELLS, Plan, load_knowledge, plan_file, plan_matrix

REPO = Path(__file__).resolve().parents[1]
TARGET = "rtx-pro-6000-x8-pcie"
AXES = """\
axes:
  cuda: ["13.1"]
  torch: ["2.14.1"]
  flashinfer: ["0.7.2"]
  sglang: ["0.5.23"]
  python: ["3.11"]
defaults: {flavour: wheels, os: debian12}
"""
GOOD = f"schema: 1\nname: ok\ntargets: [{TARGET}]\n" + AXES


def bomb(levels: int = 9) -> str:
    """A flow list of anchors, each nine aliases of the one before: ~700 bytes, 9**levels leaves."""
    parts = ['&a0 ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]']
    parts += [f"&a{i} [" + ",".join([f"*a{i - 1}"] * 9) + "]" for i in range(1, levels)]
    return "[" + ", ".join(parts) + "]"


def write(tmp_path: Path, text: str, name: str = "m.yaml") -> Path:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


def plan_cli(*args: str):
    return CliRunner().invoke(cli, ["plan", *args])


def one_line_error(result, exit_code: int = 2) -> str:
    assert result.exit_code == exit_code, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("stackforge: error: "), result.stderr
    assert "Traceback" not in result.output
    return lines[0]


# ---------------------------------------------------------------------------------------------- alias bombs

@pytest.mark.parametrize("key", ["name", "description"])
def test_an_alias_bomb_in_name_or_description_is_refused_by_the_node_guard(tmp_path, key):
    text = f"schema: 1\n{key}: {bomb()}\ntargets: [{TARGET}]\n" + AXES
    assert len(text.encode()) < 1_000
    path = write(tmp_path, text)
    with pytest.raises(AliasBombError) as caught:
        load_matrix(path)
    assert f"more than {MAX_ALIAS_NODES:,} added by aliases" in str(caught.value)
    line = one_line_error(plan_cli("--matrix", str(path)))
    assert f"{path}:2: YAML aliases expand this document to " in line
    assert f"(more than {MAX_ALIAS_NODES:,} added by aliases)" in line


def test_an_alias_bomb_in_a_lock_index_is_refused(tmp_path):
    from stackforge.plan.lock import read_lock

    lock = write(tmp_path, f"schema: 1\nindex: {bomb()}\naxes: {{}}\n", "m.lock.yaml")
    with pytest.raises(SpecError, match=r"YAML aliases expand this document to [\d,]+ nodes"):
        read_lock(lock)


def test_the_guard_counts_each_shared_node_once_and_lets_ordinary_anchors_through():
    # compat/knowledge.yaml shares its `needs` and `sources` by anchors: it loads as before.
    assert load_file(REPO / "compat" / "knowledge.yaml")["schema"] == 1
    # Just under the cap loads (the guard is on what aliases add, not on aliases).
    assert len(load_text("a: &a [" + ",".join(["x"] * 1000) + "]\nb: [" + ",".join(["*a"] * 9) + "]",
                         source="ok.yaml")["b"]) == 9
    with pytest.raises(AliasBombError):
        load_text("a: &a [" + ",".join(["x"] * 1000) + "]\nb: [" + ",".join(["*a"] * 11) + "]", source="no.yaml")


def test_a_self_containing_alias_is_still_a_one_line_error():
    with pytest.raises(SpecError, match="recursive"):
        yamlio.load_text("a: &a [*a]", source="r.yaml")


# ---------------------------------------------------------------------------------------------- name, description

@pytest.mark.parametrize("key, value, words", [
    ("name", '"two\\nlines"', "control character U+000A"),
    ("name", '"tab\\there"', "control character U+0009"),
    ("description", '"\\e[31mred"', "control character U+001B"),
    ("name", "[a, b]", "must be one line of text, got a list"),
    ("description", "{a: 1}", "must be one line of text, got a mapping"),
    ("name", "x" * (MAX_NAME_CHARS + 1), f"at most {MAX_NAME_CHARS}"),
    ("description", "x" * (MAX_DESCRIPTION_CHARS + 1), f"at most {MAX_DESCRIPTION_CHARS:,}"),
])
def test_name_and_description_are_one_line_of_text(tmp_path, key, value, words):
    path = write(tmp_path, f"schema: 1\n{key}: {value}\ntargets: [{TARGET}]\n" + AXES)
    line = one_line_error(plan_cli("--matrix", str(path)))
    assert f"{path}:2: {key} " in line and words in line


def test_a_one_line_name_and_description_are_kept(tmp_path):
    path = write(tmp_path, f"schema: 1\nname: nightly\ndescription: 'the nightly: CUDA 13'\ntargets: [{TARGET}]\n"
                 + AXES)
    matrix = load_matrix(path)
    assert (matrix.name, matrix.description) == ("nightly", "the nightly: CUDA 13")


# ---------------------------------------------------------------------------------------------- matrix-file defects

def test_a_target_listed_twice_is_refused(tmp_path):
    path = write(tmp_path, f"schema: 1\ntargets:\n  - {TARGET}\n  - {TARGET}\n" + AXES)
    line = one_line_error(plan_cli("--matrix", str(path)))
    assert f"{path}:4: target '{TARGET}' is listed twice (first at line 3)" in line


def test_an_unknown_python_is_refused_with_the_known_ones(tmp_path):
    path = write(tmp_path, GOOD.replace('python: ["3.11"]', 'python: ["3.99"]'))
    line = one_line_error(plan_cli("--matrix", str(path)))
    assert f"{path}:9: unknown python '3.99'" in line and "known: 3.9, 3.10, 3.11, 3.12, 3.13, 3.14" in line
    assert "compat/tables.yaml python_versions" in line
    # The data is the table: a version it lists is accepted (3.14 has python:3.14-slim images).
    assert "3.14" in planner.known_pythons()
    assert plan_cli("--matrix", str(write(tmp_path, GOOD.replace('"3.11"]', '"3.14"]'), "ok.yaml"))).exit_code == 0


def test_two_spellings_of_one_version_are_one_value(tmp_path):
    path = write(tmp_path, GOOD.replace('torch: ["2.14.1"]', 'torch: ["2.14.1", "2.14.1.0"]'))
    line = one_line_error(plan_cli("--matrix", str(path)))
    assert f"{path}:6: axis torch lists version 2.14.1 as '2.14.1' (line 6) and '2.14.1.0'" in line


def test_a_version_written_with_v_or_not_as_packaging_spells_it_is_refused_with_the_canonical_one(tmp_path):
    for written, canonical in (("v2.14.1", "2.14.1"), ("2.14.01", "2.14.1"), ("2.14.1-post1", "2.14.1.post1")):
        path = write(tmp_path, GOOD.replace('"2.14.1"', f'"{written}"'))
        line = one_line_error(plan_cli("--matrix", str(path)))
        assert f"{path}:6: torch '{written}' is not written as a plain version (hint: write '{canonical}')" in line


def test_include_entries_spelling_one_stack_two_ways_are_refused(tmp_path):
    entry = '{cuda: "13.1", torch: "TORCH", flashinfer: "0.7.2", sglang: "0.5.23", python: "3.11"}'
    path = write(tmp_path, f"schema: 1\ntargets: [{TARGET}]\ndefaults: {{flavour: wheels, os: debian12}}\n"
                 f"include:\n  - {entry.replace('TORCH', '2.14.1')}\n  - {entry.replace('TORCH', '2.14.1.0')}\n")
    line = one_line_error(plan_cli("--matrix", str(path)))
    assert "are one stack: their versions are equal, spelled two ways" in line and f"{path}:6:" in line


# ---------------------------------------------------------------------------------------------- cell counts

def test_axes_past_the_cell_cap_are_refused_before_they_are_expanded(tmp_path):
    twelve = ", ".join(f'"{i}.0"' for i in range(1, 13))
    path = write(tmp_path, f"schema: 1\ntargets: [{TARGET}]\naxes:\n" + "".join(
        f"  {axis}: [{twelve}]\n" for axis in ("cuda", "torch", "flashinfer", "sglang", "kernel"))
        + '  python: ["3.11"]\n')
    line = one_line_error(plan_cli("--matrix", str(path)))
    assert f"{path}:3: the axes multiply to 248,832 combinations" in line
    assert f"more than the cap of {MAX_CELLS:,}" in line and "--max-cells N" in line


def test_cells_past_max_cells_are_refused_and_the_option_raises_the_cap(tmp_path):
    path = write(tmp_path, GOOD)
    two_targets = ("--target", TARGET, "--target", "h200-x8-nvswitch")
    line = one_line_error(plan_cli("--matrix", str(path), *two_targets, "--max-cells", "1"))
    assert "the matrix makes 2 cells (1 stack(s) x 2 target(s)), more than the cap of 1" in line
    assert plan_cli("--matrix", str(path), *two_targets, "--max-cells", "2").exit_code == 0
    refused = plan_cli("--matrix", str(path), "--max-cells", "0")
    assert refused.exit_code == 2 and "'--max-cells': 0 is not in the range x>=1" in refused.output


def test_a_large_plan_warns(tmp_path, monkeypatch):
    monkeypatch.setattr(planner, "WARN_CELLS", 0)
    result = plan_cli("--matrix", str(write(tmp_path, GOOD)), "--json")
    assert result.exit_code == 0, result.output
    assert "stackforge: warning: the plan has 1 cells (more than 0)" in result.stderr
    json.loads(result.stdout)     # the warning is on stderr: stdout stays one JSON document


# ---------------------------------------------------------------------------------------------- plan --json

def _synthetic_plan(tmp_path: Path, cells: int) -> Plan:
    from benchmarks.plan_scale import synthetic_matrix

    knowledge = load_knowledge()
    return plan_matrix(load_matrix(write(tmp_path, synthetic_matrix(knowledge, cells), "s.yaml")), knowledge)


def test_plan_json_states_each_rule_once_and_cells_name_them(tmp_path):
    plan = _synthetic_plan(tmp_path, 400)
    text = "".join(plan.json_chunks())
    data = json.loads(text)
    assert data["schema_version"] == 2
    fired = {f.rule.id for c in plan.cells for f in c.findings}
    assert set(data["rules"]) == fired and all("reason" in entry for entry in data["rules"].values())
    for cell, written in zip(plan.cells, data["cells"]):
        assert written["findings"] == [f.rule.id for f in cell.findings]
        assert all(isinstance(rule_id, str) for rule_id in written["findings"])
    assert len(text.encode()) / len(plan.cells) < 2_048, "a cell repeats what the tables hold"
    # Read back, every cell has the findings and predictions the planner made.
    again = Plan.from_json(data)
    for made, read in zip(plan.cells, again.cells):
        assert read.predictions == made.predictions
        assert [(f.rule.id, f.rule.reason, f.rule.sources) for f in read.findings] == \
               [(f.rule.id, f.rule.reason, f.rule.sources) for f in made.findings]


def test_plan_json_is_written_a_cell_at_a_time(tmp_path):
    plan = _synthetic_plan(tmp_path, 50)
    chunks = list(plan.json_chunks({"preflight": {"ok": True}}))
    assert len(chunks) >= 2 * len(plan.cells)                  # the head, then each cell on its own
    assert max(len(c) for c in chunks[1:]) < 2_048
    assert json.loads("".join(chunks)) == {**plan.to_json(), "preflight": {"ok": True}}


def test_the_cli_prints_the_streamed_document(tmp_path):
    result = plan_cli("--matrix", str(REPO / "matrices" / "default.yaml"), "--json")
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert data == plan_file(REPO / "matrices" / "default.yaml").to_json()
    cell_lines = [line for line in result.stdout.splitlines() if line.lstrip().startswith('{"stack_id"')]
    assert len(cell_lines) == len(data["cells"])                  # one line per cell


def test_a_cell_naming_a_rule_the_table_lacks_is_a_malformed_plan(tmp_path):
    data = plan_file(REPO / "matrices" / "default.yaml").to_json()
    data["cells"][0]["findings"].append("no-such-rule")
    with pytest.raises(RecordError, match="which the plan's rules table lacks"):
        Plan.from_json(data, path="plan.json")
    data = plan_file(REPO / "matrices" / "default.yaml").to_json()
    data["cells"][0]["prediction_set"] = 99
    with pytest.raises(RecordError, match="prediction_set 99"):
        Plan.from_json(data, path="plan.json")


def test_a_schema_1_plan_is_still_read():
    from tests.matrix_fixtures import plan_dict

    plan = Plan.from_json(plan_dict())
    assert plan.cells and any(c.findings for c in plan.cells)


# ---------------------------------------------------------------------------------------------- HTML matrix

def test_the_html_matrix_draws_a_bounded_number_of_rows(monkeypatch):
    from stackforge.report import compat_matrix_html
    from stackforge.report.compat_matrix import build_matrix
    from tests.matrix_fixtures import PRUNED, TARGET as SEED_TARGET, plan_dict, seed_records

    report = build_matrix(seed_records(), Plan.from_json(plan_dict()), SEED_TARGET)
    assert len(report.rows) == 4
    monkeypatch.setattr(compat_matrix_html, "MAX_HTML_ROWS", 2)
    text = compat_matrix_html.write_matrix_html(report)
    body = text.split("<tbody>")[1].split("</tbody>")[0]
    assert body.count("<tr") == 2
    assert PRUNED not in body                              # kept stacks first: they are the answer
    assert "+2 more rows (1 of them pruned) not drawn: a page holds 2." in text
    assert "--format csv" in text and '2 of 2 stacks shown' in text
    monkeypatch.setattr(compat_matrix_html, "MAX_HTML_ROWS", 500)
    assert "more rows" not in compat_matrix_html.write_matrix_html(report)


def test_render_takes_max_cells_too(tmp_path):
    path = write(tmp_path, GOOD)
    out = tmp_path / "contexts"
    result = CliRunner().invoke(cli, ["render", "--matrix", str(path), "--target", TARGET, "--target",
                                      "h200-x8-nvswitch", "--max-cells", "1", "--out", str(out), "--no-lock"])
    assert result.exit_code == 2, result.output
    assert "the matrix makes 2 cells (1 stack(s) x 2 target(s)), more than the cap of 1" in result.stderr
    assert not out.exists() or not any(out.iterdir())
