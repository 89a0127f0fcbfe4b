"""Schema and consistency checks for the compat data (compat/*.yaml).

These tests read the YAML directly (pyyaml + packaging only) so that the data can be checked
without stackforge's own loader. They fail on: a file that does not parse, an unknown fact or
feature, a specifier that does not parse, a rule without a reason or sources, a duplicate id,
and data in tables.yaml that contradicts the rules that encode the same facts.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import yaml
from packaging.specifiers import InvalidSpecifier, SpecifierSet
from packaging.version import InvalidVersion, Version

COMPAT_DIR = Path(__file__).resolve().parents[1] / "compat"
RULE_FILES = sorted((COMPAT_DIR / "rules").glob("*.yaml"))
EXPECTED_RULE_FILES = {"cuda.yaml", "torch.yaml", "flashinfer.yaml", "sglang.yaml", "comm.yaml", "driver.yaml"}

VERSION_FACTS = {"cuda", "torch", "torch_cuda", "flashinfer", "sglang", "kernel", "python", "arch", "driver_min", "nccl"}
IDENTIFIER_VALUES: dict[str, set[str] | None] = {
    "flavour": {"devel", "runtime", "wheels"},
    "os": {"ubuntu24.04", "ubuntu22.04", "debian12", "debian13"},
    "torch_variant": {"cu126", "cu128", "cu129", "cu130", "cu132"},
    "kernel_package": {"sgl-kernel", "sglang-kernel"},
    "interconnect": {"pcie", "nvlink", "nvswitch"},
    "target": None,  # checked against targets.yaml
}
NUMBER_FACTS = {"gpu_count"}
BOOLEAN_FACTS = {"multicast", "nvcc"}
ALL_FACTS = VERSION_FACTS | set(IDENTIFIER_VALUES) | NUMBER_FACTS | BOOLEAN_FACTS

FEATURES = {
    "torch-kernels", "nvcc-codegen", "flashinfer-jit", "flashinfer-ar-fusion", "custom-allreduce",
    "torch-symm-mem", "nccl-graph-tree", "nccl-graph-ring", "nccl-global-tree", "nccl-nvls", "ep-a2a", "kernel-arch-coverage", "trtllm-gen-fmha",
    "sglang-trtllm-mha-prefill", "sglang-trtllm-mha-decode", "nvfp4-gemm", "flashinfer-mnnvl", "pcie-allreduce",
}
EFFECTS = {"incompatible", "feature_unavailable", "hazard", "requires"}
CONFIDENCES = {"verified", "secondary", "inferred"}
NUMBER_OPS = {"gt", "ge", "lt", "le", "eq"}

RULE_KEYS = {"id", "when", "then", "reason", "remedy", "sources", "witness", "unwitnessed"}
REQUIRED_RULE_KEYS = {"id", "when", "then", "reason", "sources"}
THEN_KEYS = {"effect", "feature", "component", "error", "requires"}
SOURCE_KEYS = {"ref", "url", "confidence"}
KEBAB = re.compile(r"^[a-z0-9]+(-[a-z0-9]+)*$")
ARCH = re.compile(r"^\d+\.\d+$")
MINOR = re.compile(r"^\d+\.\d+$")

REQUIRED_TABLES = {
    "torch_variant_for_toolkit", "torch_variants", "torch_arch_list", "cuda_driver_floor", "cuda_toolkit_driver",
    "cuda_image_tags", "os_python", "toolkit_wheels",
}
TARGET_KEYS = {"gpu", "arch", "gpu_count", "interconnect", "multicast", "min_driver", "description", "sources"}


# ----------------------------------------------------------------------------- loading

def _load(path: Path) -> Any:
    with path.open(encoding="utf-8") as handle:
        return yaml.safe_load(handle)


def _all_rules() -> list[tuple[str, dict[str, Any]]]:
    """Every rule with the name of the file it came from."""
    return [(path.name, rule) for path in RULE_FILES for rule in _load(path)["rules"]]


def _rules_by_id() -> dict[str, dict[str, Any]]:
    return {rule["id"]: rule for _, rule in _all_rules()}


def _tables() -> dict[str, Any]:
    return _load(COMPAT_DIR / "tables.yaml")["tables"]


def _targets() -> dict[str, Any]:
    return _load(COMPAT_DIR / "targets.yaml")["targets"]


ALL_RULES = _all_rules()
RULE_PARAMS = [pytest.param(rule, id=rule.get("id", f"{name}-unnamed")) for name, rule in ALL_RULES]


# ----------------------------------------------------------------------------- helpers

def _check_source(source: Any, where: str) -> None:
    assert isinstance(source, dict), f"{where}: a source must be a mapping"
    assert set(source) <= SOURCE_KEYS, f"{where}: unknown source keys {set(source) - SOURCE_KEYS}"
    assert isinstance(source.get("ref"), str) and source["ref"].strip(), f"{where}: source needs a ref"
    assert source.get("confidence") in CONFIDENCES, f"{where}: confidence must be one of {CONFIDENCES}"
    if "url" in source:
        assert isinstance(source["url"], str) and source["url"].startswith("https://"), f"{where}: bad url"


def _check_specifier(text: Any, where: str) -> SpecifierSet:
    assert isinstance(text, str) and text.strip(), f"{where}: specifier must be a non-empty string"
    try:
        return SpecifierSet(text)
    except InvalidSpecifier as exc:  # pragma: no cover - the assert message is the point
        raise AssertionError(f"{where}: invalid PEP 440 specifier {text!r}: {exc}") from exc


def _check_version(text: Any, where: str) -> Version:
    assert isinstance(text, str), f"{where}: version must be a quoted string, got {text!r}"
    try:
        return Version(text)
    except InvalidVersion as exc:  # pragma: no cover
        raise AssertionError(f"{where}: invalid version {text!r}") from exc


def _check_set_condition(condition: dict[str, Any], where: str) -> list[Any]:
    assert len(condition) == 1 and set(condition) <= {"in", "not_in"}, (
        f"{where}: a set condition is exactly one of in / not_in, got {sorted(condition)}"
    )
    values = next(iter(condition.values()))
    assert isinstance(values, list) and values, f"{where}: in / not_in needs a non-empty list"
    return values


def _check_condition(fact: str, condition: Any, where: str, target_names: set[str]) -> None:
    if fact in VERSION_FACTS:
        if isinstance(condition, dict):
            for value in _check_set_condition(condition, where):
                _check_version(value, where)
                if fact == "arch":
                    assert ARCH.match(value), f"{where}: arch must look like '12.0', got {value!r}"
        else:
            _check_specifier(condition, where)
    elif fact in IDENTIFIER_VALUES:
        allowed = target_names if fact == "target" else IDENTIFIER_VALUES[fact]
        values = _check_set_condition(condition, where) if isinstance(condition, dict) else [condition]
        for value in values:
            assert isinstance(value, str), f"{where}: identifier values are strings"
            assert value in allowed, f"{where}: {fact}={value!r} is not one of {sorted(allowed)}"
    elif fact in NUMBER_FACTS:
        assert isinstance(condition, dict) and len(condition) == 1, f"{where}: use one of {NUMBER_OPS}"
        if set(condition) <= {"in", "not_in"}:
            values = _check_set_condition(condition, where)
            assert all(isinstance(v, int) and not isinstance(v, bool) for v in values), f"{where}: ints only"
            return
        (op, number), = condition.items()
        assert op in NUMBER_OPS, f"{where}: unknown number operator {op!r}"
        assert isinstance(number, int) and not isinstance(number, bool), f"{where}: {op} needs an int"
    elif fact in BOOLEAN_FACTS:
        assert isinstance(condition, bool), f"{where}: {fact} takes true/false"
    else:  # pragma: no cover - guarded by the caller
        raise AssertionError(f"{where}: unknown fact {fact!r}")


def _version_matches(condition: Any, value: str) -> bool:
    """Match a version condition against one value (used for table/rule cross-checks only)."""
    if isinstance(condition, dict):
        values = {Version(v) for v in next(iter(condition.values()))}
        inside = Version(value) in values
        return inside if "in" in condition else not inside
    return SpecifierSet(condition).contains(Version(value), prereleases=True)


def _identifier_matches(condition: Any, value: str) -> bool:
    if isinstance(condition, dict):
        values = set(next(iter(condition.values())))
        return (value in values) if "in" in condition else (value not in values)
    return condition == value


def _fires(rule: dict[str, Any], facts: dict[str, str]) -> bool:
    """True when every condition of `rule` holds for `facts`, restricted to version/identifier facts.

    A rule that mentions a fact absent from `facts` does not fire: the cross-checks below only
    pass the facts the rules under test are about.
    """
    for fact, condition in rule["when"].items():
        if fact not in facts:
            return False
        if fact in VERSION_FACTS:
            if not _version_matches(condition, facts[fact]):
                return False
        elif not _identifier_matches(condition, facts[fact]):
            return False
    return True


# ----------------------------------------------------------------------------- files

def test_rule_files_are_the_agreed_topics() -> None:
    assert {path.name for path in RULE_FILES} == EXPECTED_RULE_FILES


@pytest.mark.parametrize("path", sorted(COMPAT_DIR.rglob("*.yaml")), ids=lambda p: p.name)
def test_every_file_parses_with_schema_1(path: Path) -> None:
    document = _load(path)
    assert isinstance(document, dict), f"{path.name}: top level must be a mapping"
    assert document.get("schema") == 1, f"{path.name}: schema must be 1"


@pytest.mark.parametrize("path", RULE_FILES, ids=lambda p: p.name)
def test_rule_file_shape(path: Path) -> None:
    document = _load(path)
    assert set(document) == {"schema", "rules"}, f"{path.name}: only schema and rules at top level"
    assert isinstance(document["rules"], list) and document["rules"], f"{path.name}: rules must be a list"


def test_at_least_30_rules() -> None:
    assert len(ALL_RULES) >= 30, f"only {len(ALL_RULES)} rules"


def test_rule_ids_are_unique_kebab_case() -> None:
    ids = [rule.get("id") for _, rule in ALL_RULES]
    duplicates = sorted({i for i in ids if ids.count(i) > 1})
    assert not duplicates, f"duplicate rule ids: {duplicates}"
    bad = [i for i in ids if not isinstance(i, str) or not KEBAB.match(i)]
    assert not bad, f"rule ids must be kebab-case: {bad}"


# ----------------------------------------------------------------------------- rules

@pytest.mark.parametrize("rule", RULE_PARAMS)
def test_rule_has_reason_and_sources(rule: dict[str, Any]) -> None:
    assert set(rule) <= RULE_KEYS, f"unknown keys {set(rule) - RULE_KEYS}"
    assert REQUIRED_RULE_KEYS <= set(rule), f"missing keys {REQUIRED_RULE_KEYS - set(rule)}"
    assert isinstance(rule["reason"], str) and len(rule["reason"].strip()) >= 20, "reason must explain"
    if "remedy" in rule:
        assert isinstance(rule["remedy"], str) and rule["remedy"].strip()
        assert "\n" not in rule["remedy"].strip(), "remedy is one line"
    assert isinstance(rule["sources"], list) and rule["sources"], "at least one source"
    for index, source in enumerate(rule["sources"]):
        _check_source(source, f"{rule['id']} sources[{index}]")


@pytest.mark.parametrize("rule", RULE_PARAMS)
def test_rule_when_uses_known_facts_and_valid_conditions(rule: dict[str, Any]) -> None:
    when = rule["when"]
    assert isinstance(when, dict) and when, "when must be a non-empty mapping"
    unknown = set(when) - ALL_FACTS
    assert not unknown, f"unknown facts {sorted(unknown)}"
    target_names = set(_targets())
    for fact, condition in when.items():
        _check_condition(fact, condition, f"{rule['id']} when.{fact}", target_names)


@pytest.mark.parametrize("rule", RULE_PARAMS)
def test_rule_then_is_well_formed(rule: dict[str, Any]) -> None:
    then = rule["then"]
    assert isinstance(then, dict), "then must be a mapping"
    assert set(then) <= THEN_KEYS, f"unknown then keys {set(then) - THEN_KEYS}"
    effect = then.get("effect")
    assert effect in EFFECTS, f"effect must be one of {EFFECTS}"
    if effect in {"feature_unavailable", "hazard"}:
        assert "feature" in then, f"{effect} needs a feature"
    if "feature" in then:
        assert then["feature"] in FEATURES, f"unknown feature {then['feature']!r}"
    if effect == "requires":
        requires = then.get("requires")
        assert isinstance(requires, dict) and requires, "requires needs requires: {driver|env}"
        assert set(requires) <= {"driver", "env"}, f"unknown requires keys {set(requires)}"
        if "driver" in requires:
            _check_specifier(requires["driver"], f"{rule['id']} requires.driver")
        if "env" in requires:
            env = requires["env"]
            assert isinstance(env, dict) and env
            assert all(isinstance(k, str) and isinstance(v, str) for k, v in env.items()), "env is str->str"
    else:
        assert "requires" not in then, "only effect: requires carries requires"
    for key in ("component", "error"):
        if key in then:
            assert isinstance(then[key], str) and then[key].strip(), f"{key} must be a non-empty string"


def test_incompatible_rules_never_rest_on_a_feature_probe() -> None:
    """An incompatible rule prunes a whole cell: it must not be keyed on a single feature's flag."""
    for _, rule in ALL_RULES:
        if rule["then"]["effect"] == "incompatible":
            assert rule["then"].get("feature") in {None, "torch-kernels", "kernel-arch-coverage"}, rule["id"]


# ----------------------------------------------------------------------------- tables

def test_tables_present_and_sourced() -> None:
    tables = _tables()
    missing = REQUIRED_TABLES - set(tables)
    assert not missing, f"missing tables {sorted(missing)}"
    for name, table in tables.items():
        assert isinstance(table, dict), name
        _check_source(table.get("source"), f"tables.{name}.source")
        assert ("map" in table) != ("rows" in table), f"tables.{name}: exactly one of map / rows"
        assert set(table) <= {"source", "note", "map", "rows", "reason"}, f"tables.{name}: unknown keys"
        if "note" in table:
            assert isinstance(table["note"], str)


def test_torch_variant_for_toolkit() -> None:
    table = _tables()["torch_variant_for_toolkit"]["map"]
    for toolkit, variant in table.items():
        assert MINOR.match(toolkit), toolkit
        assert variant in IDENTIFIER_VALUES["torch_variant"], variant
        # A toolkit never takes a torch variant built for a newer CUDA than itself.
        assert Version(f"{variant[2:-1]}.{variant[-1]}") <= Version(toolkit), (toolkit, variant)


def test_torch_variants_rows() -> None:
    for row in _tables()["torch_variants"]["rows"]:
        _check_specifier(row["torch"], "torch_variants.torch")
        assert row["variants"] and all(re.match(r"^cu\d{3}$", v) for v in row["variants"]), row
        assert row["pypi_default"] in row["variants"], row


def test_torch_arch_list_rows() -> None:
    for row in _tables()["torch_arch_list"]["rows"]:
        _check_specifier(row["torch"], "torch_arch_list.torch")
        archs = row["archs"].split(";")
        assert all(re.match(r"^\d+\.\d+(\+PTX)?$", a) for a in archs), row
        assert all("+PTX" not in a for a in archs[:-1]), f"+PTX only on the last arch: {row}"


def test_driver_and_image_tables() -> None:
    tables = _tables()
    drivers = tables["cuda_toolkit_driver"]["map"]
    tags = tables["cuda_image_tags"]["map"]
    for toolkit, driver in drivers.items():
        assert MINOR.match(toolkit)
        _check_version(driver, f"cuda_toolkit_driver[{toolkit}]")
        assert toolkit in tags, f"no image tag for toolkit {toolkit}"
    # Newer toolkits never need an older driver.
    ordered = sorted(drivers, key=Version)
    assert [Version(drivers[t]) for t in ordered] == sorted(Version(drivers[t]) for t in ordered)
    for toolkit, tag in tags.items():
        assert re.match(r"^\d+\.\d+\.\d+$", tag) and tag.startswith(f"{toolkit}."), (toolkit, tag)


def test_os_python() -> None:
    table = _tables()["os_python"]["map"]
    assert set(table) == IDENTIFIER_VALUES["os"]
    for python in table.values():
        assert MINOR.match(python), python


def _pin_rows() -> list[dict]:
    """compat/sglang_pins.yaml's rows (generated by `stackforge compat pins --write`)."""
    return yaml.safe_load((COMPAT_DIR / "sglang_pins.yaml").read_text())["rows"]


def test_sglang_pins_rows() -> None:
    rows = _pin_rows()
    assert "sglang_pins" not in _tables(), "the pins are generated into sglang_pins.yaml, not typed in tables.yaml"
    for row in rows:
        for key in ("sglang", "torch", "flashinfer", "kernel"):
            _check_version(row[key], f"sglang_pins[{row['sglang']}].{key}")
        assert row["kernel_package"] in IDENTIFIER_VALUES["kernel_package"], row
        _check_specifier(row["python"], f"sglang_pins[{row['sglang']}].python")
        assert row["metadata"]["file"].startswith(f"sglang-{row['sglang']}-") and len(row["metadata"]["sha256"]) == 64
        if "cuda_python" in row:
            _check_specifier(row["cuda_python"], f"sglang_pins[{row['sglang']}].cuda_python")
    versions = [Version(row["sglang"]) for row in rows]
    assert versions == sorted(versions) and len(set(versions)) == len(versions), "one row per version, in order"
    # The two default-matrix stacks are pinned exactly as the matrix uses them.
    by_version = {row["sglang"]: row for row in rows}
    assert by_version["0.5.9"]["flashinfer"] == "0.6.3" and by_version["0.5.9"]["kernel"] == "0.3.21"
    assert by_version["0.5.23"]["torch"] == "2.14.1" and by_version["0.5.23"]["kernel"] == "0.4.10"


def test_toolkit_wheels_sets_are_coherent() -> None:
    table = _tables()["toolkit_wheels"]
    for minor, packages in table["map"].items():
        assert MINOR.match(minor)
        for package, version in packages.items():
            assert _check_version(version, f"toolkit_wheels[{minor}].{package}").release[:2] == Version(
                minor
            ).release, f"{package}=={version} is not a {minor} wheel"
        major = Version(minor).major
        if major >= 13:
            expected = {"nvidia-cuda-nvcc", "nvidia-nvvm", "nvidia-cuda-crt", "nvidia-cuda-cccl", "nvidia-cuda-runtime"}
            assert set(packages) == expected, minor
            # nvcc, nvvm and crt must be one version (ptxas rejects newer PTX otherwise).
            assert len({packages[p] for p in ("nvidia-cuda-nvcc", "nvidia-nvvm", "nvidia-cuda-crt")}) == 1
        else:
            assert all(p.endswith("-cu12") for p in packages), f"12.x wheels carry the -cu12 suffix: {minor}"
            assert "nvidia-cuda-nvcc-cu12" in packages


def test_tables_agree_with_torch_variant_rules() -> None:
    """The variant-existence rules prune exactly the (torch, variant) pairs the table lacks."""
    rules = [
        rule for _, rule in ALL_RULES
        if rule["then"]["effect"] == "incompatible" and set(rule["when"]) == {"torch", "torch_variant"}
    ]
    assert rules, "expected variant-existence rules in torch.yaml"
    rows = _tables()["torch_variants"]["rows"]
    for row in rows:
        minor = SpecifierSet(row["torch"])
        torch = next(f"2.{m}.0" for m in range(0, 40) if minor.contains(f"2.{m}.0"))
        for variant in sorted(IDENTIFIER_VALUES["torch_variant"]):
            pruned = any(_fires(rule, {"torch": torch, "torch_variant": variant}) for rule in rules)
            assert pruned == (variant not in row["variants"]), (torch, variant, pruned)


def test_tables_agree_with_sglang_package_and_python_rules() -> None:
    """Each pinned SGLang release passes the kernel-package and Python rules with its own pins."""
    rules = _rules_by_id()
    kernel_rules = [rules["sglang-kernel-renamed"], rules["sglang-kernel-old-name"]]
    python_rules = [rules["sglang-python-min-311"], rules["sglang-python-min-310"]]
    for row in _pin_rows():
        other = ({"sgl-kernel", "sglang-kernel"} - {row["kernel_package"]}).pop()
        own = {"sglang": row["sglang"], "kernel_package": row["kernel_package"]}
        wrong = {"sglang": row["sglang"], "kernel_package": other}
        assert not any(_fires(rule, own) for rule in kernel_rules), row["sglang"]
        assert any(_fires(rule, wrong) for rule in kernel_rules), row["sglang"]
        minimum = Version(next(iter(SpecifierSet(row["python"]))).version)
        if minimum >= Version("3.10"):
            just_below = f"{minimum.major}.{minimum.minor - 1}"
            assert any(_fires(rule, {"sglang": row["sglang"], "python": just_below}) for rule in python_rules), (
                row["sglang"], just_below
            )
            at_min = f"{minimum.major}.{minimum.minor}"
            assert not any(_fires(rule, {"sglang": row["sglang"], "python": at_min}) for rule in python_rules)


def test_default_toolkits_are_covered_by_every_toolkit_table() -> None:
    tables = _tables()
    for toolkit in ("12.8", "13.0", "13.1"):
        assert toolkit in tables["torch_variant_for_toolkit"]["map"]
        assert toolkit in tables["cuda_toolkit_driver"]["map"]
        assert toolkit in tables["cuda_image_tags"]["map"]
        assert toolkit in tables["toolkit_wheels"]["map"]


# ----------------------------------------------------------------------------- targets

def test_targets_are_valid() -> None:
    targets = _targets()
    for name in ("rtx-pro-6000-x8-pcie", "rtx-pro-6000-x2-pcie", "rtx-5090-x1", "h100-x8-nvswitch",
                 "h200-x8-nvswitch", "h200-x1", "b200-x8"):
        assert name in targets, name
    for name, target in targets.items():
        assert KEBAB.match(name), name
        assert set(target) <= TARGET_KEYS, f"{name}: unknown keys {set(target) - TARGET_KEYS}"
        assert TARGET_KEYS - {"sources"} <= set(target), f"{name}: missing {TARGET_KEYS - set(target)}"
        assert isinstance(target["arch"], str) and ARCH.match(target["arch"]), name
        assert isinstance(target["gpu_count"], int) and target["gpu_count"] >= 1, name
        assert target["interconnect"] in IDENTIFIER_VALUES["interconnect"], name
        assert isinstance(target["multicast"], bool), name
        _check_version(target["min_driver"], f"{name}.min_driver")
        for index, source in enumerate(target.get("sources", [])):
            _check_source(source, f"{name}.sources[{index}]")
        if target["interconnect"] == "pcie":
            assert target["multicast"] is False, f"{name}: PCIe-only GPUs have no NVLS multicast"


def test_story_target_is_the_pcie_blackwell_box() -> None:
    target = _targets()["rtx-pro-6000-x8-pcie"]
    assert (target["arch"], target["gpu_count"], target["interconnect"], target["multicast"]) == (
        "12.0", 8, "pcie", False
    )


# ----------------------------------------------------------------------------- public sources
#
# A prediction shows its sources to whoever reads the matrix, so every source must be something
# that reader can open: a public repository file, a PyPI release, an NVIDIA page, an issue, or a
# file of this repository. Notes kept outside the repository (research write-ups, design notes, a
# shared folder) are not: their markers below fail the check. A path into this repository that a
# ref names must exist.

REPO_ROOT = COMPAT_DIR.parent
PRIVATE_MARKERS = re.compile(r"compat_facts|\bresearch\b|DESIGN\.md|shared/|/work/", re.IGNORECASE)
REPO_PATH = re.compile(r"(?:^|[\s(\"'`])((?:compat|stackforge|tests|matrices|dockerfiles)/[\w./-]*\w)")


def _sourced_entries() -> list[tuple[str, dict[str, Any]]]:
    """Every source in rules, tables and targets, named by file, entry and position."""
    entries = [
        (f"rules/{name}:{rule['id']}:sources[{index}]", source)
        for name, rule in ALL_RULES
        for index, source in enumerate(rule.get("sources", []))
    ]
    entries += [(f"tables.yaml:{name}:source", table["source"]) for name, table in _tables().items()]
    entries += [
        (f"targets.yaml:{name}:sources[{index}]", source)
        for name, target in _targets().items()
        for index, source in enumerate(target.get("sources", []))
    ]
    return entries


SOURCE_PARAMS = [pytest.param(source, id=where) for where, source in _sourced_entries()]
DATA_FILES = sorted([COMPAT_DIR / "tables.yaml", COMPAT_DIR / "targets.yaml", *RULE_FILES])
HEADER_PARAMS = [pytest.param(path, id=str(path.relative_to(COMPAT_DIR))) for path in DATA_FILES]


def _private_or_missing(text: str) -> list[str]:
    """What in `text` points at notes outside this repository or at a repository path that is absent."""
    problems = [f"private notes {match.group(0)!r}" for match in PRIVATE_MARKERS.finditer(text)]
    problems += [
        f"missing repository path {match.group(1)!r}"
        for match in REPO_PATH.finditer(text)
        if not (REPO_ROOT / match.group(1)).exists()
    ]
    return problems


@pytest.mark.parametrize("source", SOURCE_PARAMS)
def test_source_is_public_or_in_this_repository(source: dict[str, Any]) -> None:
    text = " ".join(str(source.get(key, "")) for key in ("ref", "url"))
    assert not _private_or_missing(text), f"{_private_or_missing(text)} in {source}"


@pytest.mark.parametrize("rule", RULE_PARAMS)
def test_rule_text_names_no_private_notes(rule: dict[str, Any]) -> None:
    text = " ".join(str(rule.get(key, "")) for key in ("reason", "remedy"))
    assert not _private_or_missing(text), f"{rule['id']}: {_private_or_missing(text)}"


@pytest.mark.parametrize("path", HEADER_PARAMS)
def test_file_comments_name_no_private_notes(path: Path) -> None:
    comments = [line for line in path.read_text(encoding="utf-8").splitlines() if line.lstrip().startswith("#")]
    problems = [(line, _private_or_missing(line)) for line in comments if _private_or_missing(line)]
    assert not problems, f"{path.name}: {problems}"


def test_compat_readme_names_no_private_notes() -> None:
    text = (COMPAT_DIR / "README.md").read_text(encoding="utf-8")
    assert not PRIVATE_MARKERS.search(text), PRIVATE_MARKERS.findall(text)


def test_private_marker_check_catches_the_old_citations() -> None:
    """The check itself: refs of the shapes it must reject are rejected, public ones pass."""
    for bad in ("research compat_facts.md §2c", "shared/research/notes.md", "stackforge DESIGN.md 'Base flavours'",
                "compat/rules/no-such-file.yaml"):
        assert _private_or_missing(bad), bad
    for good in ("PyPI sglang==0.5.14 wheel: sglang/srt/layers/flashinfer_comm_fusion.py:47-51",
                 "NVIDIA/nccl#317", "compat/tables.yaml cuda_toolkit_driver",
                 "pytorch/test-infra tools/scripts/generate_binary_build_matrix.py@626d4e70"):
        assert not _private_or_missing(good), good


# ----------------------------------------------------------------------------- witnesses

WITNESS_KEYS = {"dist", "fact", "inside", "context", "over", "shows"}
WITNESS_DIST_FACT = {"flashinfer-python": "flashinfer", "sglang": "sglang", "sgl-kernel": "kernel",
                     "sglang-kernel": "kernel"}
READING_STATUSES = {"available", "unavailable", "absent", "undecided"}
CONTEXT_KEYS = {"arch", "gpu_count", "interconnect", "multicast", "cuda", "nvcc", "torch_cuda", "python",
                "kernel_package"}


@pytest.mark.parametrize("rule", RULE_PARAMS)
def test_rule_says_how_the_wheels_check_it_or_why_they_cannot(rule: dict[str, Any]) -> None:
    """Every rule has a witness (a wheel reading that checks it) or says why none can."""
    assert ("witness" in rule) != ("unwitnessed" in rule), "exactly one of witness / unwitnessed"
    if "unwitnessed" in rule:
        assert isinstance(rule["unwitnessed"], str) and len(rule["unwitnessed"].strip()) >= 15
        return
    witness = rule["witness"]
    assert isinstance(witness, dict) and set(witness) <= WITNESS_KEYS, f"witness keys: {sorted(witness)}"
    assert witness["dist"] in WITNESS_DIST_FACT, f"unknown witness dist {witness['dist']!r}"
    inside = witness["inside"] if isinstance(witness["inside"], list) else [witness["inside"]]
    assert set(inside) <= READING_STATUSES, f"inside must be reading statuses, got {inside}"
    assert set(witness.get("context", {})) <= CONTEXT_KEYS
    if "over" in witness:
        _check_specifier(witness["over"], f"{rule['id']} witness.over")
    # A witnessed rule either bounds the witness's distribution or names the releases it claims.
    assert WITNESS_DIST_FACT[witness["dist"]] in rule["when"] or "over" in witness, (
        "a witness needs a version bound on its distribution or an `over` range")


def test_witness_facts_are_those_the_loader_knows() -> None:
    from stackforge.plan.rules import METADATA_FACTS, WITNESS_FACTS

    for _, rule in ALL_RULES:
        if "witness" in rule:
            witness = rule["witness"]
            assert witness["fact"] in WITNESS_FACTS.get(witness["dist"], ()) + METADATA_FACTS, rule["id"]
