"""Bad matrix input: one clear line with file:line, exit code 2, nothing written."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from stackforge.cli import cli
from stackforge.core.errors import SpecError, UnsafeValueError
from stackforge.plan.matrix_file import load_matrix

GOOD = """\
schema: 1
targets: [rtx-pro-6000-x8-pcie]
axes:
  cuda: ["13.1"]
  torch: ["2.14.1"]
  flashinfer: ["0.7.2"]
  sglang: ["0.5.23"]
  python: ["3.11"]
"""


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "m.yaml"
    path.write_text(text)
    return path


def run_plan(path: Path, *extra: str):
    return CliRunner().invoke(cli, ["plan", "--matrix", str(path), *extra])


def test_good_matrix_loads(tmp_path):
    matrix = load_matrix(write(tmp_path, GOOD))
    assert [s.id for s in matrix.stacks] == ["cu131-torch2.14.1-fi0.7.2-sgl0.5.23-py311"]


def test_floats_keep_their_text(tmp_path):
    # YAML would read 12.10 as the float 12.1; a version must keep its text.
    matrix = load_matrix(write(tmp_path, GOOD.replace('cuda: ["13.1"]', "cuda: [12.10]")))
    assert matrix.stacks[0].cuda == "12.10"


@pytest.mark.parametrize("text, line, fragment", [
    (GOOD.replace("axes:", "axes: [unclosed"), 4, "malformed YAML"),
    (GOOD + "  cudnn: ['9']\n", 9, "unknown key 'cudnn' in axes; valid keys: cuda, flashinfer"),
    (GOOD + "colour: blue\n", 9, "unknown key 'colour' in matrix file; valid keys:"),
    (GOOD.replace('"2.14.1"', '"two"'), 5, "is not a valid PEP 440 version"),
    (GOOD.replace("schema: 1", "schema: 7"), 1, "unsupported matrix schema"),
    (GOOD + "exclude:\n  - {torch: '2.14.1', gpu: h100}\n", 10, "unknown key 'gpu' in exclude entry"),
])
def test_bad_input_names_file_and_line(tmp_path, text, line, fragment):
    path = write(tmp_path, text)
    with pytest.raises(SpecError) as info:
        load_matrix(path)
    assert f"{path}:{line}:" in str(info.value)
    assert fragment in str(info.value)
    result = run_plan(path)
    assert result.exit_code == 2
    assert fragment in result.output
    assert len([ln for ln in result.output.splitlines() if ln.strip()]) == 1, result.output


@pytest.mark.parametrize("hostile", [
    "2.9.1; rm -rf /",
    "2.9.1\nRUN curl x|sh",
    "2.9.1 && curl evil",
    "$(reboot)",
    "2.9.1`id`",
    "2.9.1\\\nRUN id",
])
def test_hostile_version_strings_are_rejected_at_load(tmp_path, hostile):
    import json
    text = GOOD.replace('torch: ["2.14.1"]', f"torch: [{json.dumps(hostile)}]")
    path = write(tmp_path, text)
    with pytest.raises(UnsafeValueError) as info:
        load_matrix(path)
    assert f"{path}:5:" in str(info.value)
    result = run_plan(path, "--json")
    assert result.exit_code == 2
    assert "not a plain version string" in result.output
    assert "{" not in result.output  # no JSON was written
    assert list(tmp_path.iterdir()) == [path]


def test_hostile_identifier_is_rejected(tmp_path):
    path = write(tmp_path, GOOD + "defaults: {os: 'ubuntu24.04;id'}\n")
    with pytest.raises(UnsafeValueError, match="not a plain identifier"):
        load_matrix(path)


def test_missing_file_is_one_line(tmp_path):
    result = run_plan(tmp_path / "nope.yaml")
    assert result.exit_code == 2
    assert "cannot read file" in result.output


def test_include_exclude_follow_github_actions(tmp_path):
    text = """\
schema: 1
targets: [t]
defaults: {python: "3.12"}
axes:
  cuda: ["12.8", "13.1"]
  torch: ["2.9.1", "2.14.1"]
  flashinfer: ["0.6.3"]
  sglang: ["0.5.9"]
exclude:
  - {cuda: "12.8", torch: "2.14.1"}
include:
  - {cuda: "13.1", torch: "2.14.1", os: debian12, flavour: wheels}
  - {cuda: "12.9", torch: "2.9.1", flashinfer: "0.6.3", sglang: "0.5.9"}
"""
    matrix = load_matrix(write(tmp_path, text))
    ids = [s.id for s in matrix.stacks]
    assert matrix.excluded == 1
    assert ids == [
        "cu128-torch2.9.1-fi0.6.3-sgl0.5.9-py312",
        "cu131-torch2.9.1-fi0.6.3-sgl0.5.9-py312",
        "cu131-torch2.14.1-fi0.6.3-sgl0.5.9-py312-wheels-debian12",   # extended, not added
        "cu129-torch2.9.1-fi0.6.3-sgl0.5.9-py312",                    # matched nothing: added
    ]


def test_incomplete_include_names_its_line(tmp_path):
    text = "schema: 1\ntargets: [t]\ninclude:\n  - {cuda: '13.1', torch: '2.14.1'}\n"
    with pytest.raises(SpecError, match=r"m.yaml:4: a matrix cell lacks flashinfer, python, sglang"):
        load_matrix(write(tmp_path, text))


@pytest.mark.parametrize("text, line", [
    (GOOD + "defaults: {os: ubuntu24.4}\n", 9),
    (GOOD + "  os: [ubuntu24.04, ubuntu24.4]\n", 9),
    (GOOD + "include:\n  - {cuda: '13.1', os: ubuntu24.4}\n", 10),
])
def test_unknown_os_is_refused_where_it_is_written(tmp_path, text, line):
    # 'ubuntu24.4' used to render FROM nvidia/cuda:13.1.0-devel-ubuntu24.4.
    path = write(tmp_path, text)
    result = run_plan(path)
    assert result.exit_code == 2
    assert result.output == (f"stackforge: error: {path}:{line}: unknown os 'ubuntu24.4'; valid: debian12, debian13, "
                             "ubuntu22.04, ubuntu24.04 (hint: add the OS to compat/tables.yaml os_python (with a "
                             "source) to use another)\n")


@pytest.mark.parametrize("text, words", [
    (GOOD.replace('cuda: ["13.1"]', "cuda: [null]"), "cuda must be a version string, got nothing"),
    (GOOD.replace('torch: ["2.14.1"]', "torch: []"), "axis 'torch' must be a non-empty list, got an empty list"),
    (GOOD + "defaults: [python, os]\n", "defaults must be a mapping (key: value lines), got a list"),
    (GOOD + "defaults:\n", "defaults must be a mapping (key: value lines), got nothing"),
    (GOOD.replace('python: ["3.11"]', "python: ['3.11']\n  os: [[ubuntu]]"), "unknown os (a list); valid: debian12"),
    (GOOD.replace('python: ["3.11"]', "python: ['3.11']\n  flavour: [[devel]]"),
     "flavour (a list) is not a plain identifier"),
])
def test_messages_name_values_in_user_words(tmp_path, text, words):
    path = write(tmp_path, text)
    result = run_plan(path)
    assert result.exit_code == 2
    assert words in result.output and f"{path}:" in result.output
    for leak in ("NoneType", "LineList", "LineDict", "None", "[]"):
        assert leak not in result.output.split(": error: ", 1)[1]
