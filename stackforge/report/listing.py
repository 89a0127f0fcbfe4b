"""``stackforge list``: the known targets, features, probes and rules as rows (pure).

Each kind becomes a :class:`Listing` (headers and rows of text, plus the JSON items) from data
passed in explicitly: the knowledge (shipped compat/ with any ``--compat`` directory on top), the
probe catalog and the feature descriptions of ``compat/knowledge.yaml``. The CLI lays the rows
out with :func:`stackforge.core.textfit.fit_table` (cells wrap, names stay whole, nothing is cut).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from stackforge.core.model import Target
from stackforge.core.wheel_readings import ReaderSpec
from stackforge.plan.rules import Condition, Rule, specifier_text
from stackforge.probes.catalog import ProbeSpec, known_features

if TYPE_CHECKING:
    from stackforge.plan.user_compat import UserCompat

KINDS = ("targets", "features", "probes", "rules")
LIST_SCHEMA = "stackforge.list"
LIST_SCHEMA_VERSION = 1
_NUMBER_SIGNS = {"gt": ">", "ge": ">=", "lt": "<", "le": "<=", "eq": "=="}


@dataclass(frozen=True, slots=True)
class Listing:
    """One kind of thing, as a table and as JSON items."""

    kind: str
    headers: tuple[str, ...]
    rows: tuple[tuple[str, ...], ...]
    items: tuple[dict[str, Any], ...]

    def to_json(self) -> dict[str, Any]:
        return {"schema": LIST_SCHEMA, "schema_version": LIST_SCHEMA_VERSION, "kind": self.kind,
                "count": len(self.items), "items": list(self.items)}


def list_targets(targets: dict[str, Target]) -> Listing:
    """name, arch, GPU count, interconnect, driver floor (the oldest driver known to run the GPU)."""
    ordered = [targets[name] for name in sorted(targets)]
    rows = tuple((t.name, f"{t.sm} ({t.arch})", str(t.gpu_count), t.interconnect.value,
                  "yes" if t.multicast else "no", t.min_driver or "-", t.gpu) for t in ordered)
    items = tuple({"name": t.name, **t.to_json()} for t in ordered)
    return Listing("targets", ("TARGET", "ARCH", "GPUS", "INTERCONNECT", "MULTICAST", "MIN DRIVER", "GPU"),
                   rows, items)


def list_features(descriptions: dict[str, str], probes: Sequence[ProbeSpec], rules: Sequence[Rule]) -> Listing:
    """Every feature the rules or probes speak of, with its description and the probes that decide it."""
    items = []
    for name in known_features(probes):
        deciding = [p.id for p in probes if p.feature == name]
        rule_count = sum(1 for r in rules if r.feature == name)
        items.append({"name": name, "description": descriptions.get(name, ""), "probes": deciding,
                      "rules": rule_count})
    rows = tuple((i["name"], ", ".join(i["probes"]) or "(rules only)", str(i["rules"]), i["description"])
                 for i in items)
    return Listing("features", ("FEATURE", "PROBES", "RULES", "DESCRIPTION"), rows, tuple(items))


def list_probes(probes: Sequence[ProbeSpec], wheel_readers: Sequence[ReaderSpec] = ()) -> Listing:
    """id, tier, feature, preconditions, description: the in-image probes, then the wheel tier's
    readers under the probe ids their records carry (``wheel.<dist>.<fact>``)."""
    from stackforge.wheels.tier import wheel_probe_id

    items = tuple({"id": p.id, "tier": p.tier, "feature": p.feature, "preconditions": preconditions_text(p),
                   "default_timeout_s": p.default_timeout_s, "description": p.description} for p in probes)
    items += tuple({"id": wheel_probe_id(r.dist, r.fact), "tier": "wheel", "feature": r.fact,
                    "preconditions": f"a {r.dist} wheel on the index (no image, no GPU)",
                    "default_timeout_s": None, "description": r.what} for r in wheel_readers)
    rows = tuple((i["id"], i["tier"], i["feature"], i["preconditions"] or "-", i["description"]) for i in items)
    return Listing("probes", ("PROBE", "TIER", "FEATURE", "PRECONDITIONS", "DESCRIPTION"), rows, items)


def list_rules(rules: Sequence[Rule]) -> Listing:
    """id, effect, feature, a summary of ``when``, the first source."""
    items = tuple({"id": r.id, "effect": r.effect.value, "feature": r.feature, "when": when_text(r),
                   "source": r.sources[0].ref if r.sources else "", "confidence": r.confidence,
                   "origin": r.origin} for r in rules)
    rows = tuple((i["id"], i["effect"], i["feature"] or "-", i["when"], i["source"]) for i in items)
    return Listing("rules", ("RULE", "EFFECT", "FEATURE", "WHEN", "FIRST SOURCE"), rows, items)


def list_kind(kind: str, user_compat: UserCompat | None = None) -> Listing:
    """``stackforge list KIND``: the shipped knowledge (with ``user_compat`` merged in) as one listing."""
    from stackforge.plan.planner import load_knowledge
    from stackforge.plan.user_compat import load_about
    from stackforge.probes.catalog import catalog

    knowledge = load_knowledge(user=user_compat)
    if kind == "targets":
        return list_targets(knowledge.targets)
    if kind == "features":
        return list_features(load_about().features, catalog(), knowledge.rules)
    if kind == "probes":
        from stackforge.wheels.readers import READERS

        return list_probes(catalog(), READERS)
    return list_rules(knowledge.rules)


def preconditions_text(probe: ProbeSpec) -> str:
    """``>=2 GPUs, GPU of the target arch, nvcc, packages: torch``."""
    pre = probe.preconditions
    parts = []
    if pre.min_gpus:
        parts.append(f">={pre.min_gpus} GPU{'s' if pre.min_gpus > 1 else ''}")
    if pre.needs_gpu_arch:
        parts.append("GPU of the target arch")
    if pre.needs_nvcc:
        parts.append("nvcc")
    if pre.needs_packages:
        parts.append(f"packages: {' '.join(pre.needs_packages)}")
    return ", ".join(parts)


def when_text(rule: Rule) -> str:
    """A rule's conditions in one line: ``arch in [12.0, 12.1]; flashinfer>=0.3.1,<0.6.17``."""
    return "; ".join(condition_text(c) for c in rule.conditions) or "always"


def condition_text(condition: Condition) -> str:
    fact, op, operand = condition.fact, condition.op, condition.operand
    if op == "spec":
        return f"{fact}{specifier_text(operand)}"
    if op == "not_spec":
        return f"{fact} not {specifier_text(operand)}"
    if op in ("in", "not_in"):
        members = ", ".join(sorted((str(m) for m in operand), key=_natural))
        return f"{fact} {op.replace('_', ' ')} [{members}]"
    if isinstance(operand, bool):
        return f"{fact}={str(operand).lower()}"
    return f"{fact}{_NUMBER_SIGNS.get(op, '==') if isinstance(operand, int) else '='}{operand}"


def _natural(text: str) -> tuple:
    return tuple(int(part) if part.isdigit() else part for part in text.replace("-", ".").split("."))
