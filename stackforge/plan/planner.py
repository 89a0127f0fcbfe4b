"""The plan: a matrix expanded into stack x target cells, judged by the rules.

Pure: ``plan_matrix(matrix, knowledge, ...)`` -> :class:`Plan`. A pruned cell keeps every rule
that pruned it, with reason and sources; nothing is silently dropped. Predictions are what the
rules say about each feature; they are never mixed with measurements.

The plan JSON (schema_version 2) states each rule that fired once, in a top-level ``rules`` table keyed
by rule id, and each distinct set of predictions once, in ``prediction_sets`` (feature -> rule id); a cell
names its findings by rule id and its predictions by the set's index. A matrix of 10^5 cells fires a few
dozen distinct rules, and repeating each in full per cell made ~190 KB a cell.
:meth:`Plan.json_chunks` writes the document a cell at a time, so printing it holds one cell's text.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from packaging.specifiers import SpecifierSet

from stackforge.core.data import data_dir, display_path
from stackforge.core.envelope import check_envelope, report_json_text
from stackforge.core.errors import RecordError, SpecError
from stackforge.core.model import Matrix, Stack, Target
from stackforge.core.records import Prediction, Verdict
from stackforge.core.versions import parse_version, validate_specifier
from stackforge.core.yamlio import load_file, require_mapping
from stackforge.plan.derive import Derived, DriverFloor, Tables, cell_driver_floor, derive, load_tables
from stackforge.plan.matrix_file import filter_stacks, load_matrix
from stackforge.plan.pins_file import PINS_ORIGIN
from stackforge.plan.rule_lint import check_rules
from stackforge.plan.rules import (
    FEATURES,
    PREDICTED_VERDICTS,
    Condition,
    Effect,
    Evaluator,
    Finding,
    Rule,
    Source,
    load_rules,
    load_targets,
)
from stackforge.plan.user_compat import UserCompat, merge_rules, merge_targets

PLAN_SCHEMA = "stackforge.plan"
#: Past this many cells a command warns: reports and CI shards grow with the cells (docs/matrix-format.md).
WARN_CELLS = 10_000
#: Past this many cells (or axis combinations) planning is refused unless ``--max-cells N`` raises the cap:
#: a few lines of axes can multiply to millions of cells, each judged, stored and printed.
MAX_CELLS = 200_000
#: 2: cells name their findings and predictions by rule id; the rules are in the top-level ``rules`` table.
#: 1 (still read): each cell carried its findings and predictions in full.
PLAN_SCHEMA_VERSION = 2


@dataclass(frozen=True, slots=True)
class Knowledge:
    """Everything the planner knows: rules (curated + generated from pins), tables and targets."""

    rules: tuple[Rule, ...]
    tables: Tables
    targets: dict[str, Target]


@dataclass(frozen=True, slots=True)
class PlanCell:
    """One stack judged for one target: the rules that fired, what they predict per feature, and the
    driver floor (both worked out once, when the cell is judged, and carried as the plan JSON states them)."""

    stack: Stack
    target: Target
    derived: Derived
    findings: tuple[Finding, ...]
    predictions: tuple[Prediction, ...]
    driver_floor: DriverFloor
    #: an external image's own stack id (``probe --image``: ``image-<name>-<id>``); None for a matrix stack
    external_id: str | None = None

    @property
    def stack_id(self) -> str:
        return self.external_id or self.stack.id

    @property
    def pruned(self) -> bool:
        return any(f.rule.effect is Effect.INCOMPATIBLE for f in self.findings)

    @property
    def status(self) -> str:
        return "pruned" if self.pruned else "kept"

    def pruning_findings(self) -> tuple[Finding, ...]:
        """The findings that prune the cell (``incompatible`` rules)."""
        return tuple(f for f in self.findings if f.rule.effect is Effect.INCOMPATIBLE)

    def to_json(self, prediction_set: int) -> dict[str, Any]:
        """The cell as the plan JSON states it: findings as rule ids (in firing order), predictions as the
        index of their set in the plan's ``prediction_sets`` (:func:`prediction_set`)."""
        return {"stack_id": self.stack_id, "stack": self.stack.to_json(), "target": self.target.name,
                "status": self.status, "derived": self.derived.to_json(),
                "driver_floor": self.driver_floor.to_json(),
                "findings": [f.rule.id for f in self.findings], "prediction_set": prediction_set}

    @classmethod
    def from_json(cls, data: Mapping[str, Any], targets: Mapping[str, Target],
                  tables: tuple[Mapping[str, Any], list[Any]] | None = None) -> PlanCell:
        """Inverse of :meth:`to_json`; ``targets`` are the plan's profiles by name, ``tables`` the plan's
        ``rules`` and ``prediction_sets`` (``None``: a schema 1 cell, with findings and predictions in full)."""
        floor = data["driver_floor"] or {}
        if tables is None:
            findings = tuple(Finding.from_json(f) for f in data.get("findings", ()))
            predictions = tuple(Prediction.from_json(p) for p in data.get("predictions", ()))
        else:
            rules, sets = tables
            findings = tuple(_finding(rules, rule_id) for rule_id in data.get("findings", ()))
            index = data["prediction_set"]
            if not isinstance(index, int) or isinstance(index, bool) or not 0 <= index < len(sets):
                raise ValueError(f"prediction_set {index!r} is not an index of the plan's prediction_sets")
            predictions = _predictions(dict(sets[index]), rules)
        stack = Stack.from_json(dict(data["stack"]))
        named = str(data.get("stack_id") or stack.id)
        return cls(stack=stack, target=targets[str(data["target"])],
                   derived=Derived.from_json(dict(data["derived"])), findings=findings, predictions=predictions,
                   driver_floor=DriverFloor(version=floor.get("version"),
                                            because=tuple(str(b) for b in floor.get("because") or ())),
                   external_id=named if named != stack.id else None)


def _rule_entry(rules: Mapping[str, Mapping[str, Any]], rule_id: Any) -> Mapping[str, Any]:
    entry = rules.get(str(rule_id))
    if not isinstance(entry, Mapping):
        raise ValueError(f"a cell names rule {rule_id!r}, which the plan's rules table lacks")
    return entry


def _finding(rules: Mapping[str, Mapping[str, Any]], rule_id: Any) -> Finding:
    """A finding of the rules table, with the rule's word on why no wheel reading decides it (a finding's
    own JSON does not carry it; the table does, for the predictions)."""
    entry = _rule_entry(rules, rule_id)
    finding = Finding.from_json({**entry, "rule": rule_id})
    unwitnessed = str(entry.get("unwitnessed", ""))
    return Finding(replace(finding.rule, unwitnessed=unwitnessed)) if unwitnessed else finding


def _predictions(by_feature: dict[str, Any], rules: Mapping[str, Mapping[str, Any]]) -> tuple[Prediction, ...]:
    """One prediction per feature (FEATURES order, then any feature this stackforge does not know): the named
    rule's, else ``no_rule``."""
    features = FEATURES + tuple(f for f in by_feature if f not in FEATURES)
    return tuple(_rule_prediction(str(feature), str(by_feature[feature]), rules) if feature in by_feature
                 else Prediction(feature=feature, verdict=Verdict.NO_RULE) for feature in features)


def _rule_prediction(feature: str, rule_id: str, rules: Mapping[str, Mapping[str, Any]]) -> Prediction:
    """What a rule of the table predicts (as :func:`stackforge.plan.rules.rule_prediction` made it)."""
    entry = _rule_entry(rules, rule_id)
    return Prediction(feature=feature, verdict=PREDICTED_VERDICTS[Effect(entry["effect"])], rule=rule_id,
                      reason=str(entry.get("reason", "")), error=str(entry.get("error", "")),
                      remedy=str(entry.get("remedy", "")), sources=tuple(dict(s) for s in entry.get("sources", ())),
                      unwitnessed=str(entry.get("unwitnessed", "")))


def prediction_set(predictions: tuple[Prediction, ...]) -> dict[str, str]:
    """Per feature a rule predicts, that rule's id; a feature no rule speaks of is left out (``no_rule``)."""
    return {p.feature: p.rule for p in predictions if p.verdict is not Verdict.NO_RULE}


def rule_entry(rule: Rule) -> dict[str, Any]:
    """A fired rule as the plan's ``rules`` table states it (a finding's JSON without the id it is keyed by)."""
    entry = Finding(rule).to_json()
    del entry["rule"]
    if rule.unwitnessed:
        entry["unwitnessed"] = rule.unwitnessed
    return entry


def judged_cell(stack: Stack, target: Target, derived: Derived, findings: tuple[Finding, ...],
                predictions: tuple[Prediction, ...]) -> PlanCell:
    """A cell with its driver floor worked out from the findings."""
    return PlanCell(stack=stack, target=target, derived=derived, findings=findings, predictions=predictions,
                    driver_floor=_driver_floor(target, derived, findings))


def _driver_floor(target: Target, derived: Derived, findings: tuple[Finding, ...]) -> DriverFloor:
    """The one driver floor of a cell (CUDA family, target hardware, ``requires`` rules)."""
    requires = tuple((f.rule.id, str(f.rule.requires["driver"])) for f in findings
                     if f.rule.requires and f.rule.requires.get("driver"))
    return cell_driver_floor(derived.min_driver, derived.min_driver_reason, target.name, target.min_driver,
                             requires)


@dataclass(frozen=True, slots=True)
class Plan:
    """A matrix, judged: every cell with its findings. The one plan model: planning makes it, ``plan
    --json`` writes it (:meth:`to_json`), and the reports, pick and CI read it back (:meth:`from_json`)."""

    matrix: Matrix
    targets: tuple[Target, ...]
    cells: tuple[PlanCell, ...]

    @classmethod
    def empty(cls) -> Plan:
        """A plan that knows nothing: a report is then built from records alone."""
        return cls(matrix=Matrix(name="", source="", stacks=(), targets=()), targets=(), cells=())

    def kept_stacks(self) -> tuple[Stack, ...]:
        """Stacks worth building: kept for at least one target (in matrix order); external images are no
        stacks to build."""
        built_here = [c for c in self.cells if c.external_id is None]
        kept = {c.stack.id for c in built_here if not c.pruned}
        return tuple(s for s in dict.fromkeys(c.stack for c in built_here) if s.id in kept)

    def cells_for(self, stack: Stack) -> tuple[PlanCell, ...]:
        return tuple(c for c in self.cells if c.stack == stack)

    def cells_for_target(self, target: str) -> tuple[PlanCell, ...]:
        return tuple(c for c in self.cells if c.target.name == target)

    def target(self, name: str) -> Target | None:
        return next((t for t in self.targets if t.name == name), None)

    def to_json(self) -> dict[str, Any]:
        """The whole document in memory (tests, small plans); ``plan --json`` streams :meth:`json_chunks`."""
        head, set_of = self._head()
        return {**head, "cells": [c.to_json(set_of(c)) for c in self.cells]}

    def _head(self) -> tuple[dict[str, Any], Any]:
        """Everything but the cells (the envelope, matrix, targets, summary, the rules that fired, each once
        keyed by id in first-fired order, and the distinct prediction sets), and a cell's set index."""
        kept = sum(not c.pruned for c in self.cells)
        rules: dict[str, Rule] = {}
        seen: set[int] = set()
        sets: dict[str, int] = {}
        index_of: dict[int, int] = {}    # id(predictions tuple) -> its set's index
        for cell in self.cells:
            # Cells judged alike share one findings tuple and one predictions tuple: each is walked once.
            if id(cell.findings) not in seen:
                seen.add(id(cell.findings))
                for finding in cell.findings:
                    rules.setdefault(finding.rule.id, finding.rule)
            if id(cell.predictions) not in index_of:
                key = json.dumps(prediction_set(cell.predictions))
                index_of[id(cell.predictions)] = sets.setdefault(key, len(sets))
        head = {"schema": PLAN_SCHEMA, "schema_version": PLAN_SCHEMA_VERSION,
                "matrix": {"name": self.matrix.name, "source": display_path(self.matrix.source)},
                "targets": {t.name: t.to_json() for t in self.targets},
                "summary": {"cells": len(self.cells), "kept": kept, "pruned": len(self.cells) - kept,
                            "excluded_by_matrix": self.matrix.excluded},
                "rules": {rule_id: rule_entry(rule) for rule_id, rule in rules.items()},
                "prediction_sets": [json.loads(key) for key in sets]}
        return head, lambda cell: index_of[id(cell.predictions)]

    def json_chunks(self, extra: Mapping[str, Any] | None = None) -> Iterator[str]:
        """The plan JSON as text pieces, one cell at a time (one line each), then ``extra`` keys (preflight).

        The same document as :meth:`to_json` (plus ``extra``); the head and ``extra`` are indented as
        every ``--json`` answer is, each cell is one compact line so that 10^5 cells stay a few hundred MB.
        """
        head, set_of = self._head()
        yield report_json_text(head).rstrip("\n")[:-2] + ',\n  "cells": ['
        for index, cell in enumerate(self.cells):
            yield ",\n    " if index else "\n    "
            yield json.dumps(cell.to_json(set_of(cell)), ensure_ascii=False, separators=(",", ":"))
        yield "\n  ]" if self.cells else "]"
        for key, value in (extra or {}).items():
            text = report_json_text(value).rstrip("\n").replace("\n", "\n  ")
            yield f",\n  {json.dumps(key)}: {text}"
        yield "\n}\n"

    @classmethod
    def from_json(cls, data: Any, *, path: str = "") -> Plan:
        """Read a plan document (``stackforge plan --json``).

        The findings' rules come back without their conditions (the document records that they
        fired, not why); everything else is as the planner made it.

        Raises:
            RecordError: not a plan, a newer schema version, a plan from before cells carried their
                driver floor, or a malformed cell (with ``path``).
        """
        version = check_envelope(data, schema=PLAN_SCHEMA, supported=PLAN_SCHEMA_VERSION, what="plan", path=path,
                                 make_one="make one with `stackforge plan --json`")
        _refuse_plan_without_driver_floor(data, path)
        try:
            targets = {str(name): Target.from_json(dict(profile))
                       for name, profile in (data.get("targets") or {}).items()}
            tables = None
            if version >= 2:
                rules, sets = data.get("rules"), data.get("prediction_sets")
                if not isinstance(rules, Mapping) or not isinstance(sets, list):
                    raise ValueError("the plan lacks its rules or prediction_sets table")
                tables = (rules, sets)
            cells = tuple(PlanCell.from_json(c, targets, tables) for c in data["cells"])
            matrix = data.get("matrix") or {}
            stacks = tuple(dict.fromkeys(c.stack for c in cells))
            return cls(matrix=Matrix(name=str(matrix.get("name", "")), source=str(matrix.get("source", "")),
                                     stacks=stacks, targets=tuple(targets),
                                     excluded=int((data.get("summary") or {}).get("excluded_by_matrix", 0))),
                       targets=tuple(targets.values()), cells=cells)
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise RecordError(f"malformed plan: {type(exc).__name__}: {exc}", path=path) from None

    @classmethod
    def read(cls, path: Path) -> Plan:
        """Read a plan file (``stackforge plan --json > plan.json``): the one plan reader of every command.

        Raises:
            RecordError: the file is missing, unreadable or not JSON (``not JSON`` with the line), or
                :meth:`from_json` refuses it; always with ``path``.
        """
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            raise RecordError("plan file does not exist", path=str(path),
                              remedy="make one with `stackforge plan --json > plan.json`") from None
        except json.JSONDecodeError as exc:
            raise RecordError(f"cannot read plan JSON: not JSON ({exc.msg} at line {exc.lineno})",
                              path=str(path)) from None
        except (OSError, UnicodeDecodeError) as exc:
            raise RecordError(f"cannot read plan JSON: {exc}", path=str(path)) from None
        return cls.from_json(data, path=str(path))


def _refuse_plan_without_driver_floor(data: Mapping[str, Any], path: str) -> None:
    """Plan JSON from an older stackforge has no cell ``driver_floor``, and its ``derived.min_driver``
    meant the toolkit's GA driver (now the CUDA family's floor): reading it would give another floor.

    Raises:
        RecordError: a cell lacks ``driver_floor``.
    """
    cells = data.get("cells") or ()
    if any(isinstance(cell, Mapping) and "driver_floor" not in cell for cell in cells):
        raise RecordError("plan JSON written by an older stackforge (its cells have no driver_floor)",
                          path=path, remedy="re-run `stackforge plan --json` to write it again")




# --------------------------------------------------------------------------- knowledge

def load_knowledge(compat_dir: Path | None = None, user: UserCompat | None = None) -> Knowledge:
    """Rules, tables and targets from ``compat/`` (the shipped one by default), with a user
    directory's rules and targets on top when given (see :mod:`stackforge.plan.user_compat`)."""
    rule_files = sorted((compat_dir / "rules").glob("*.yaml")) if compat_dir else None
    tables = load_tables(compat_dir / "tables.yaml" if compat_dir else None)
    targets = load_targets(compat_dir / "targets.yaml" if compat_dir else None)
    rules = load_rules(rule_files) + pin_rules(tables)
    if user is not None:
        rules, targets = merge_rules(rules, user.rules), merge_targets(targets, user.targets)
    return Knowledge(rules=rules, tables=tables, targets=targets)


def known_pythons(tables_path: Path | None = None) -> tuple[str, ...]:
    """The CPython minors a matrix may name: ``compat/tables.yaml`` ``python_versions`` (the shipped file by
    default; a file without the table knows none, and the matrix's ``python`` is then not checked)."""
    path = tables_path or data_dir("compat") / "tables.yaml"
    tables = require_mapping(load_file(path), what="tables file", source=str(path)).get("tables")
    table = tables.get("python_versions") if isinstance(tables, dict) else None
    versions = table.get("map") if isinstance(table, dict) else None
    return tuple(str(v) for v in versions) if isinstance(versions, dict) else ()


def pin_rules(tables: Tables) -> tuple[Rule, ...]:
    """Rules generated from SGLang's own pins (compat/sglang_pins.yaml, generated from each release's
    METADATA): a stack that breaks them is pruned."""
    return release_pin_rules(tables.sglang_pins, sources=tables.sources["sglang_pins"], origin=PINS_ORIGIN)


def with_release_pins(knowledge: Knowledge, pins: Mapping[str, Mapping[str, str]], *, lock: str) -> Knowledge:
    """The knowledge with the SGLang pins a matrix's lock read from the index: they replace the table's rows
    for the same releases (derivation and pin rules alike), and their rules name the lock as origin."""
    if not pins:
        return knowledge
    rows = {version: dict(row) for version, row in pins.items()}
    tables = replace(knowledge.tables, sglang_pins={**knowledge.tables.sglang_pins, **rows})
    replaced = {f"sglang-{version}-pins-" for version in rows}
    kept = tuple(rule for rule in knowledge.rules
                 if not (rule.origin == PINS_ORIGIN and rule.id.startswith(tuple(replaced))))
    sources = (Source(ref=f"{lock}: each release's Requires-Dist / Requires-Python, read from its wheel's METADATA "
                          f"on the index (file and sha256 in the lock)", confidence="verified"),)
    return replace(knowledge, tables=tables,
                   rules=kept + release_pin_rules(rows, sources=sources, origin=f"{lock}:pins"))


def release_pin_rules(pins_by_release: Mapping[str, Mapping[str, str]], *, sources: tuple[Source, ...],
                      origin: str) -> tuple[Rule, ...]:
    """One rule per (SGLang release x pinned torch / flashinfer / python): a stack that breaks it is pruned."""
    rules: list[Rule] = []
    for sglang, pins in pins_by_release.items():
        for fact in ("torch", "flashinfer", "python"):
            if fact not in pins:
                continue
            wanted = pins[fact] if pins[fact][0] in "<>=!~" else f"=={pins[fact]}"
            rules.append(Rule(
                id=f"sglang-{sglang}-pins-{fact}",
                conditions=(Condition("sglang", "in", frozenset({parse_version(sglang)})),
                            Condition(fact, "not_spec", _specifier(wanted))),
                effect=Effect.INCOMPATIBLE, component=fact, sources=sources, origin=origin,
                reason=f"SGLang {sglang} requires {fact}{wanted}; pip would replace or refuse any other {fact}.",
                remedy=f"use {fact}{wanted} with sglang {sglang}"))
    return tuple(rules)


def _specifier(text: str) -> SpecifierSet:
    return validate_specifier(text, what="pin", source="compat/tables.yaml")


# --------------------------------------------------------------------------- planning

def cell_facts(stack: Stack, target: Target, derived: Derived) -> dict[str, Any]:
    """The flat facts a rule's ``when`` sees for one cell."""
    return {
        "cuda": stack.cuda, "torch": stack.torch, "torch_cuda": derived.torch_cuda, "flashinfer": stack.flashinfer,
        "sglang": stack.sglang, "kernel": derived.kernel_version, "python": stack.python, "arch": target.arch,
        "driver_min": derived.min_driver, "nccl": derived.nccl, "flavour": stack.flavour.value, "os": stack.os,
        "torch_variant": derived.torch_variant, "kernel_package": derived.kernel_package,
        "interconnect": target.interconnect.value, "target": target.name, "gpu_count": target.gpu_count,
        "multicast": target.multicast, "nvcc": derived.has_nvcc,
    }


def evaluate_cell(stack: Stack, target: Target, knowledge: Knowledge, evaluator: Evaluator | None = None,
                  derived: Derived | None = None) -> PlanCell:
    """Judge one stack for one target."""
    derived = derived or derive(stack, knowledge.tables)
    evaluator = evaluator or Evaluator(knowledge.rules)
    findings, predictions = evaluator.judge(cell_facts(stack, target, derived))
    return judged_cell(stack, target, derived, findings, predictions)


def resolve_targets(names: tuple[str, ...], knowledge: Knowledge) -> tuple[Target, ...]:
    """Target profiles by name; an unknown name lists the known ones."""
    unknown = [n for n in names if n not in knowledge.targets]
    if unknown:
        raise SpecError(f"unknown target(s): {', '.join(unknown)}; known: {', '.join(sorted(knowledge.targets))}",
                        remedy="add a profile to targets.yaml in a --compat DIR (or to compat/targets.yaml)")
    return tuple(knowledge.targets[n] for n in names)


def plan_matrix(matrix: Matrix, knowledge: Knowledge, *, targets: tuple[str, ...] = (),
                cuda: str | tuple[str, ...] | None = None, only: tuple[str, ...] = (),
                max_cells: int | None = None) -> Plan:
    """Expand and judge a matrix (optionally for other targets, some toolkits, or some stack ids).

    Raises:
        SpecError: more cells than ``max_cells`` (default :data:`MAX_CELLS`), before any is judged.
    """
    chosen = resolve_targets(targets or matrix.targets, knowledge)
    stacks = filter_stacks(matrix.stacks, cuda=cuda, only=only)
    check_cell_count(len(stacks) * len(chosen), max_cells=max_cells, what=f"{len(stacks):,} stack(s) x "
                     f"{len(chosen)} target(s)", source=matrix.source)
    evaluator = Evaluator(knowledge.rules)
    cells = []
    for stack in stacks:
        derived = derive(stack, knowledge.tables)
        cells.extend(evaluate_cell(stack, t, knowledge, evaluator, derived) for t in chosen)
    return Plan(matrix=matrix, targets=chosen, cells=tuple(cells))


def check_cell_count(count: int, *, max_cells: int | None, what: str, source: str = "") -> None:
    """Refuse ``count`` cells past the cap (``max_cells``, default :data:`MAX_CELLS`).

    Raises:
        SpecError: too many, naming the count, what makes it, the cap and the ways out.
    """
    cap = MAX_CELLS if max_cells is None else max_cells
    if count > cap:
        raise SpecError(f"the matrix makes {count:,} cells ({what}), more than the cap of {cap:,}",
                        source=display_path(source) if source else "",
                        remedy="narrow it with --cuda, --only or --target, or raise the cap with --max-cells N "
                               "(plan, render; a report reads `plan --max-cells N --json > plan.json` with --plan)")


def large_plan_warning(plan: Plan) -> str | None:
    """The warning a command prints for a plan past :data:`WARN_CELLS` cells, else None."""
    if len(plan.cells) <= WARN_CELLS:
        return None
    return (f"the plan has {len(plan.cells):,} cells (more than {WARN_CELLS:,}): reports page their rows, "
            f"and --only / --cuda / --target narrow it")


def plan_file(matrix_path: Path, *, user_compat: UserCompat | None = None, max_cells: int | None = None,
              **kwargs: Any) -> Plan:
    """Load a matrix file and the shipped knowledge (with a user compat directory on top), then plan.

    ``max_cells`` caps both the combinations the matrix's axes expand to and the cells planned
    (default :data:`MAX_CELLS`).
    """
    knowledge = load_knowledge(user=user_compat)
    check_rules(knowledge.rules)   # contradictory, catch-all or never-firing rules: exit 2, naming them
    matrix = load_matrix(matrix_path, os_names=knowledge.tables.os_python, python_versions=known_pythons(),
                         max_combinations=MAX_CELLS if max_cells is None else max_cells)
    return plan_matrix(matrix, with_release_pins(knowledge, matrix.sglang_pins, lock=display_path(matrix.lock)
                                                 if matrix.lock else ""), max_cells=max_cells, **kwargs)
