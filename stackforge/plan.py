"""The plan: a matrix expanded into stack x target cells, judged by the rules.

Pure: ``plan_matrix(matrix, knowledge, ...)`` -> :class:`Plan`. A pruned cell keeps every rule
that pruned it, with reason and sources; nothing is silently dropped. Predictions are what the
rules say about each feature; they are never mixed with measurements.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from packaging.specifiers import SpecifierSet

from stackforge.data import display_path
from stackforge.derive import Derived, DriverFloor, Tables, cell_driver_floor, derive, load_tables
from stackforge.errors import SpecError
from stackforge.matrix import filter_stacks, load_matrix
from stackforge.model import Matrix, Stack, Target
from stackforge.records import Prediction, Verdict
from stackforge.rules import (FEATURES, Condition, Effect, Evaluator, Finding, Rule, load_rules, load_targets)
from stackforge.user_compat import UserCompat, merge_rules, merge_targets
from stackforge.versions import parse_version, validate_specifier

PLAN_SCHEMA = "stackforge.plan"
PLAN_SCHEMA_VERSION = 1


@dataclass(frozen=True, slots=True)
class Knowledge:
    """Everything the planner knows: rules (curated + generated from pins), tables and targets."""

    rules: tuple[Rule, ...]
    tables: Tables
    targets: dict[str, Target]


@dataclass(frozen=True, slots=True)
class Cell:
    """One stack judged for one target."""

    stack: Stack
    target: Target
    derived: Derived
    findings: tuple[Finding, ...]

    @property
    def pruned(self) -> bool:
        return any(f.rule.effect is Effect.INCOMPATIBLE for f in self.findings)

    @property
    def status(self) -> str:
        return "pruned" if self.pruned else "kept"

    def driver_floor(self) -> DriverFloor:
        """The one driver floor of this cell (CUDA family, target hardware, ``requires`` rules)."""
        requires = [(f.rule.id, str(f.rule.requires["driver"])) for f in self.findings
                    if f.rule.requires and f.rule.requires.get("driver")]
        return cell_driver_floor(self.derived.min_driver, self.derived.min_driver_reason, self.target.name,
                                 self.target.min_driver, requires)

    def predictions(self) -> tuple[Prediction, ...]:
        """One prediction per feature: unavailable beats hazard; no rule means unknown until probed."""
        return tuple(_predict(feature, self.findings) for feature in FEATURES)

    def to_json(self) -> dict[str, Any]:
        return {"stack_id": self.stack.id, "stack": self.stack.to_json(), "target": self.target.name,
                "status": self.status, "derived": self.derived.to_json(),
                "driver_floor": self.driver_floor().to_json(),
                "findings": [f.to_json() for f in self.findings],
                "predictions": [p.to_json() for p in self.predictions()]}


@dataclass(frozen=True, slots=True)
class Plan:
    """A matrix, judged: every cell with its findings."""

    matrix: Matrix
    targets: tuple[Target, ...]
    cells: tuple[Cell, ...]

    def kept_stacks(self) -> tuple[Stack, ...]:
        """Stacks worth building: kept for at least one target (in matrix order)."""
        kept = {c.stack.id for c in self.cells if not c.pruned}
        return tuple(s for s in dict.fromkeys(c.stack for c in self.cells) if s.id in kept)

    def cells_for(self, stack: Stack) -> tuple[Cell, ...]:
        return tuple(c for c in self.cells if c.stack == stack)

    def to_json(self) -> dict[str, Any]:
        kept = sum(not c.pruned for c in self.cells)
        return {"schema": PLAN_SCHEMA, "schema_version": PLAN_SCHEMA_VERSION,
                "matrix": {"name": self.matrix.name, "source": display_path(self.matrix.source)},
                "targets": {t.name: t.to_json() for t in self.targets},
                "summary": {"cells": len(self.cells), "kept": kept, "pruned": len(self.cells) - kept,
                            "excluded_by_matrix": self.matrix.excluded},
                "cells": [c.to_json() for c in self.cells]}


def _predict(feature: str, findings: tuple[Finding, ...]) -> Prediction:
    relevant = [f.rule for f in findings if f.rule.feature == feature]
    for verdict, effect in ((Verdict.UNAVAILABLE, Effect.FEATURE_UNAVAILABLE), (Verdict.HAZARD, Effect.HAZARD)):
        rule = next((r for r in relevant if r.effect is effect), None)
        if rule is not None:
            return Prediction(feature=feature, verdict=verdict, rule=rule.id, reason=rule.reason, error=rule.error,
                              remedy=rule.remedy, sources=tuple(s.to_json() for s in rule.sources),
                              unwitnessed=rule.unwitnessed)
    return Prediction(feature=feature, verdict=Verdict.NO_RULE)


# --------------------------------------------------------------------------- knowledge

def load_knowledge(compat_dir: Path | None = None, user: UserCompat | None = None) -> Knowledge:
    """Rules, tables and targets from ``compat/`` (the shipped one by default), with a user
    directory's rules and targets on top when given (see :mod:`stackforge.user_compat`)."""
    rule_files = sorted((compat_dir / "rules").glob("*.yaml")) if compat_dir else None
    tables = load_tables(compat_dir / "tables.yaml" if compat_dir else None)
    targets = load_targets(compat_dir / "targets.yaml" if compat_dir else None)
    rules = load_rules(rule_files) + pin_rules(tables)
    if user is not None:
        rules, targets = merge_rules(rules, user.rules), merge_targets(targets, user.targets)
    return Knowledge(rules=rules, tables=tables, targets=targets)


def pin_rules(tables: Tables) -> tuple[Rule, ...]:
    """Rules generated from SGLang's own pins (data in tables.yaml): a stack that breaks them is pruned."""
    sources = tables.sources["sglang_pins"]
    rules: list[Rule] = []
    for sglang, pins in tables.sglang_pins.items():
        for fact in ("torch", "flashinfer", "python"):
            if fact not in pins:
                continue
            wanted = pins[fact] if pins[fact][0] in "<>=!~" else f"=={pins[fact]}"
            rules.append(Rule(
                id=f"sglang-{sglang}-pins-{fact}",
                conditions=(Condition("sglang", "in", frozenset({parse_version(sglang)})),
                            Condition(fact, "not_spec", _specifier(wanted))),
                effect=Effect.INCOMPATIBLE, component=fact, sources=sources, origin="compat/tables.yaml:sglang_pins",
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
        "driver_min": derived.min_driver, "flavour": stack.flavour.value, "os": stack.os,
        "torch_variant": derived.torch_variant, "kernel_package": derived.kernel_package,
        "interconnect": target.interconnect.value, "target": target.name, "gpu_count": target.gpu_count,
        "multicast": target.multicast, "nvcc": derived.has_nvcc,
    }


def evaluate_cell(stack: Stack, target: Target, knowledge: Knowledge, evaluator: Evaluator | None = None,
                  derived: Derived | None = None) -> Cell:
    """Judge one stack for one target."""
    derived = derived or derive(stack, knowledge.tables)
    evaluator = evaluator or Evaluator(knowledge.rules)
    fired = evaluator.fired(cell_facts(stack, target, derived))
    return Cell(stack=stack, target=target, derived=derived, findings=tuple(Finding(r) for r in fired))


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
    return plan_matrix(load_matrix(matrix_path, os_names=knowledge.tables.os_python), knowledge, **kwargs)
