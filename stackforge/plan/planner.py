"""The plan: a matrix expanded into stack x target cells, judged by the rules.

Pure: ``plan_matrix(matrix, knowledge, ...)`` -> :class:`Plan`. A pruned cell keeps every rule
that pruned it, with reason and sources; nothing is silently dropped. Predictions are what the
rules say about each feature; they are never mixed with measurements.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from packaging.specifiers import SpecifierSet

from stackforge.core.data import display_path
from stackforge.core.envelope import check_envelope
from stackforge.core.errors import RecordError, SpecError
from stackforge.core.model import Matrix, Stack, Target
from stackforge.core.records import Prediction
from stackforge.core.versions import parse_version, validate_specifier
from stackforge.plan.derive import Derived, DriverFloor, Tables, cell_driver_floor, derive, load_tables
from stackforge.plan.matrix_file import filter_stacks, load_matrix
from stackforge.plan.pins_file import PINS_ORIGIN
from stackforge.plan.rules import (
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
PLAN_SCHEMA_VERSION = 1


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

    @property
    def stack_id(self) -> str:
        return self.stack.id

    @property
    def pruned(self) -> bool:
        return any(f.rule.effect is Effect.INCOMPATIBLE for f in self.findings)

    @property
    def status(self) -> str:
        return "pruned" if self.pruned else "kept"

    def pruning_findings(self) -> tuple[Finding, ...]:
        """The findings that prune the cell (``incompatible`` rules)."""
        return tuple(f for f in self.findings if f.rule.effect is Effect.INCOMPATIBLE)

    def to_json(self) -> dict[str, Any]:
        return {"stack_id": self.stack.id, "stack": self.stack.to_json(), "target": self.target.name,
                "status": self.status, "derived": self.derived.to_json(),
                "driver_floor": self.driver_floor.to_json(),
                "findings": [f.to_json() for f in self.findings],
                "predictions": [p.to_json() for p in self.predictions]}

    @classmethod
    def from_json(cls, data: Mapping[str, Any], targets: Mapping[str, Target]) -> PlanCell:
        """Inverse of :meth:`to_json`; ``targets`` are the plan's profiles by name."""
        floor = data["driver_floor"] or {}
        return cls(stack=Stack.from_json(dict(data["stack"])), target=targets[str(data["target"])],
                   derived=Derived.from_json(dict(data["derived"])),
                   findings=tuple(Finding.from_json(f) for f in data.get("findings", ())),
                   predictions=tuple(Prediction.from_json(p) for p in data.get("predictions", ())),
                   driver_floor=DriverFloor(version=floor.get("version"),
                                            because=tuple(str(b) for b in floor.get("because") or ())))


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
        """Stacks worth building: kept for at least one target (in matrix order)."""
        kept = {c.stack.id for c in self.cells if not c.pruned}
        return tuple(s for s in dict.fromkeys(c.stack for c in self.cells) if s.id in kept)

    def cells_for(self, stack: Stack) -> tuple[PlanCell, ...]:
        return tuple(c for c in self.cells if c.stack == stack)

    def cells_for_target(self, target: str) -> tuple[PlanCell, ...]:
        return tuple(c for c in self.cells if c.target.name == target)

    def target(self, name: str) -> Target | None:
        return next((t for t in self.targets if t.name == name), None)

    def to_json(self) -> dict[str, Any]:
        kept = sum(not c.pruned for c in self.cells)
        return {"schema": PLAN_SCHEMA, "schema_version": PLAN_SCHEMA_VERSION,
                "matrix": {"name": self.matrix.name, "source": display_path(self.matrix.source)},
                "targets": {t.name: t.to_json() for t in self.targets},
                "summary": {"cells": len(self.cells), "kept": kept, "pruned": len(self.cells) - kept,
                            "excluded_by_matrix": self.matrix.excluded},
                "cells": [c.to_json() for c in self.cells]}

    @classmethod
    def from_json(cls, data: Any, *, path: str = "") -> Plan:
        """Read a plan document (``stackforge plan --json``).

        The findings' rules come back without their conditions (the document records that they
        fired, not why); everything else is as the planner made it.

        Raises:
            RecordError: not a plan, a newer schema version, a plan from before cells carried their
                driver floor, or a malformed cell (with ``path``).
        """
        check_envelope(data, schema=PLAN_SCHEMA, supported=PLAN_SCHEMA_VERSION, what="plan", path=path,
                       make_one="make one with `stackforge plan --json`")
        _refuse_plan_without_driver_floor(data, path)
        try:
            targets = {str(name): Target.from_json(dict(profile))
                       for name, profile in (data.get("targets") or {}).items()}
            cells = tuple(PlanCell.from_json(c, targets) for c in data["cells"])
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
                cuda: str | tuple[str, ...] | None = None, only: tuple[str, ...] = ()) -> Plan:
    """Expand and judge a matrix (optionally for other targets, some toolkits, or some stack ids)."""
    chosen = resolve_targets(targets or matrix.targets, knowledge)
    stacks = filter_stacks(matrix.stacks, cuda=cuda, only=only)
    evaluator = Evaluator(knowledge.rules)
    cells = []
    for stack in stacks:
        derived = derive(stack, knowledge.tables)
        cells.extend(evaluate_cell(stack, t, knowledge, evaluator, derived) for t in chosen)
    return Plan(matrix=matrix, targets=chosen, cells=tuple(cells))


def plan_file(matrix_path: Path, *, user_compat: UserCompat | None = None, **kwargs: Any) -> Plan:
    """Load a matrix file and the shipped knowledge (with a user compat directory on top), then plan."""
    knowledge = load_knowledge(user=user_compat)
    matrix = load_matrix(matrix_path, os_names=knowledge.tables.os_python)
    return plan_matrix(matrix, with_release_pins(knowledge, matrix.sglang_pins, lock=display_path(matrix.lock)
                                                 if matrix.lock else ""), **kwargs)
