"""The compatibility knowledge base: rules as data (``compat/rules/*.yaml``), evaluated fast.

A rule says *when* (conditions over the facts of one stack x target cell) *then* what happens
(incompatible, a feature unavailable, a hazard, or a requirement), with a human reason and sources.
Conditions are compiled once; their answers are memoised per distinct fact value, because a
matrix repeats few versions across many cells.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path
from typing import Any, Mapping, Sequence

from packaging.specifiers import SpecifierSet

from stackforge.core.data import data_dir, display_path
from stackforge.core.errors import SpecError, UnsafeValueError
from stackforge.core.model import Interconnect, Target
from stackforge.core.records import Prediction, Verdict
from stackforge.core.versions import parse_version, validate_identifier, validate_specifier, validate_version
from stackforge.core.wheel_readings import ReadContext, ReadingStatus
from stackforge.core.yamlio import LineDict, check_keys, load_file, require_mapping

RULES_SCHEMA = 1

# The facts a rule may test, by kind. Anything else in a `when` is a load error.
FACT_KINDS: dict[str, str] = {
    "cuda": "version", "torch": "version", "torch_cuda": "version", "flashinfer": "version",
    "sglang": "version", "kernel": "version", "python": "version", "arch": "version", "driver_min": "version",
    "nccl": "version",
    "flavour": "identifier", "os": "identifier", "torch_variant": "identifier", "kernel_package": "identifier",
    "interconnect": "identifier", "target": "identifier",
    "gpu_count": "number",
    "multicast": "boolean", "nvcc": "boolean",
}

FEATURES: tuple[str, ...] = (
    "torch-kernels", "nvcc-codegen", "flashinfer-jit", "flashinfer-ar-fusion", "custom-allreduce",
    "torch-symm-mem", "nccl-graph-tree", "nccl-graph-ring", "nccl-global-tree", "nccl-nvls", "ep-a2a", "kernel-arch-coverage", "trtllm-gen-fmha",
    "sglang-trtllm-mha-prefill", "sglang-trtllm-mha-decode", "nvfp4-gemm", "flashinfer-mnnvl", "pcie-allreduce",
)

CONFIDENCES = ("verified", "secondary", "inferred")

# Which `when` fact holds the version of each distribution a wheel reader reads (a rule's bound on
# that fact is what `stackforge compat verify` checks in the releases on both sides of it).
WITNESS_DISTS: dict[str, str] = {
    "flashinfer-python": "flashinfer", "sglang": "sglang", "sgl-kernel": "kernel", "sglang-kernel": "kernel",
}
# The facts a wheel reader decides, per distribution (docs/ and stackforge/wheels/readers/ use the same
# names); metadata facts are read from any distribution's METADATA.
WITNESS_FACTS: dict[str, tuple[str, ...]] = {
    "flashinfer-python": ("flashinfer-ar-fusion", "flashinfer-ar-fusion:gate-present", "flashinfer-mnnvl",
                          "flashinfer-jit", "trtllm-gen-fmha", "nvfp4-gemm", "flashinfer-pcie-ipc-ar"),
    "sglang": ("torch-symm-mem", "torch-symm-mem:flag", "custom-allreduce", "flashinfer-ar-fusion",
               "flashinfer-ar-fusion:autoenable", "sglang-trtllm-mha-prefill", "sglang-trtllm-mha-decode", "sglang-pcie-ipc-ar",
               "ep-a2a"),
}
METADATA_FACTS = ("metadata:requires-python", "metadata:torch-pin", "metadata:kernel-package")
WITNESS_CONTEXT_KEYS = tuple(ReadContext.__dataclass_fields__)
_NUMBER_OPS = ("gt", "ge", "lt", "le", "eq")
_SET_OPS = ("in", "not_in")


class Effect(str, Enum):
    """What a rule does to a cell when its conditions hold."""

    INCOMPATIBLE = "incompatible"                # the cell is pruned
    FEATURE_UNAVAILABLE = "feature_unavailable"  # a predicted dead end for one feature
    HAZARD = "hazard"                            # something may auto-enable and crash, or corrupt silently
    REQUIRES = "requires"                        # a requirement: minimum driver, env var


@dataclass(frozen=True, slots=True)
class Source:
    """Where a rule's knowledge comes from, and how sure we are."""

    ref: str
    confidence: str
    url: str = ""

    def to_json(self) -> dict[str, str]:
        data = {"ref": self.ref, "confidence": self.confidence}
        if self.url:
            data["url"] = self.url
        return data


@dataclass(frozen=True, slots=True)
class Condition:
    """One compiled test of one fact (``flashinfer: ">=0.3.1,<0.6.17"``)."""

    fact: str
    op: str       # spec | not_spec | in | not_in | eq | gt | ge | lt | le
    operand: Any

    def holds(self, value: Any) -> bool:
        """Whether the condition holds for ``value``; an absent fact (``None``) never holds."""
        if value is None:
            return False
        op, operand = self.op, self.operand
        if op == "spec":
            return operand.contains(parse_version(value), prereleases=True)
        if op == "not_spec":
            return not operand.contains(parse_version(value), prereleases=True)
        if op in _SET_OPS:
            key = parse_version(value) if FACT_KINDS[self.fact] == "version" else value
            return (key in operand) == (op == "in")
        if op == "gt":
            return value > operand
        if op == "ge":
            return value >= operand
        if op == "lt":
            return value < operand
        if op == "le":
            return value <= operand
        return value == operand


@dataclass(frozen=True, slots=True)
class Witness:
    """Which wheel reading checks a rule: ``fact`` read from ``dist``'s wheels reads ``inside`` (one of
    these statuses) for every release inside the rule's bound on that distribution, and something else
    outside it. ``context`` overrides or completes the read context (``{python: "3.10"}``); ``over``
    limits the releases looked at (and, for a rule with no bound on ``dist``, is the range it claims);
    ``shows`` tells two rules with the same status apart by the code read (``"[self.device_capability]"``
    for a KeyError, ``".get("`` for a clean disable)."""

    dist: str
    fact: str
    inside: tuple[ReadingStatus, ...]
    context: Mapping[str, Any] = field(default_factory=dict)
    over: SpecifierSet | None = None
    shows: str = ""   # text the reading's code or summary shows inside the bound (and not outside)

    @property
    def version_fact(self) -> str:
        """The ``when`` fact that holds this distribution's version (``sglang``, ``flashinfer``, ``kernel``)."""
        return WITNESS_DISTS[self.dist]


@dataclass(frozen=True, slots=True)
class Rule:
    """One piece of compatibility knowledge."""

    id: str
    conditions: tuple[Condition, ...]
    effect: Effect
    reason: str
    sources: tuple[Source, ...]
    feature: str | None = None
    component: str = ""
    error: str = ""
    remedy: str = ""
    requires: Mapping[str, Any] = field(default_factory=dict)
    origin: str = ""   # file:line
    witness: Witness | None = None   # how a wheel reader checks the rule (stackforge compat verify)
    unwitnessed: str = ""            # why no wheel reader can check it, when the data says so

    @property
    def confidence(self) -> str:
        """The strongest confidence among the rule's sources."""
        return min((s.confidence for s in self.sources), key=CONFIDENCES.index)


@dataclass(frozen=True, slots=True)
class Finding:
    """A rule that fired for one cell."""

    rule: Rule

    def to_json(self) -> dict[str, Any]:
        rule = self.rule
        return {"rule": rule.id, "effect": rule.effect.value, "feature": rule.feature, "component": rule.component,
                "reason": rule.reason, "error": rule.error, "remedy": rule.remedy,
                "requires": dict(rule.requires), "confidence": rule.confidence,
                "sources": [s.to_json() for s in rule.sources], "origin": rule.origin}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Finding:
        """Inverse of :meth:`to_json`, but for the rule's conditions: a finding records that the rule
        fired, not the test that made it fire, so the rule comes back with none."""
        sources = tuple(Source(ref=str(s["ref"]), confidence=str(s["confidence"]), url=str(s.get("url", "")))
                        for s in data.get("sources", ()))
        feature = data.get("feature")
        return cls(Rule(id=str(data["rule"]), conditions=(), effect=Effect(data["effect"]),
                        reason=str(data.get("reason", "")), sources=sources,
                        feature=None if feature is None else str(feature),
                        component=str(data.get("component", "")),
                        error=str(data.get("error", "")), remedy=str(data.get("remedy", "")),
                        requires=dict(data.get("requires") or {}), origin=str(data.get("origin", ""))))


class Evaluator:
    """Evaluates rules against fact dicts, memoising each condition per distinct value.

    Create one per plan (it holds a cache, so it is deliberately not module state).
    """

    def __init__(self, rules: tuple[Rule, ...]) -> None:
        # Every condition gets one bit. For each fact value seen, the bits of the conditions it
        # satisfies are computed once; a cell's facts OR into one mask, and a rule fires when all
        # of its bits are set. This keeps ~100 rules x 10,000 cells well under a second.
        by_fact: dict[str, list[tuple[int, Condition]]] = {}
        self._rule_masks: list[tuple[Rule, int]] = []
        bit = 0
        for rule in rules:
            mask = 0
            for condition in rule.conditions:
                by_fact.setdefault(condition.fact, []).append((1 << bit, condition))
                mask |= 1 << bit
                bit += 1
            self._rule_masks.append((rule, mask))
        self._by_fact = tuple(by_fact.items())
        self._value_bits: dict[tuple[str, Any], int] = {}
        self._predictions: dict[str, Prediction] = {}
        self._judged: dict[int, tuple[tuple[Finding, ...], tuple[Prediction, ...]]] = {}

    def prediction(self, rule: Rule) -> Prediction:
        """What ``rule`` predicts for its feature, made once per rule of this evaluator (a matrix's cells
        share a handful of rules, and making a prediction copies the rule's sources)."""
        made = self._predictions.get(rule.id)
        if made is None:
            made = self._predictions[rule.id] = rule_prediction(rule)
        return made

    def fired(self, facts: Mapping[str, Any]) -> tuple[Rule, ...]:
        """The rules whose every condition holds for ``facts``."""
        return self._rules_of(self._mask(facts))

    def judge(self, facts: Mapping[str, Any]) -> tuple[tuple[Finding, ...], tuple[Prediction, ...]]:
        """The findings of the rules that fire for ``facts``, and one prediction per feature (FEATURES order).

        Cells whose facts satisfy the same conditions fire the same rules: both are made once per such set and
        shared (a matrix of thousands of cells has a few dozen)."""
        mask = self._mask(facts)
        judged = self._judged.get(mask)
        if judged is None:
            rules = self._rules_of(mask)
            judged = self._judged[mask] = (tuple(Finding(rule) for rule in rules), self._feature_predictions(rules))
        return judged

    def _mask(self, facts: Mapping[str, Any]) -> int:
        value_bits = self._value_bits
        mask = 0
        for fact, conditions in self._by_fact:
            key = (fact, facts.get(fact))
            bits = value_bits.get(key)
            if bits is None:
                bits = value_bits[key] = sum(b for b, c in conditions if c.holds(key[1]))
            mask |= bits
        return mask

    def _rules_of(self, mask: int) -> tuple[Rule, ...]:
        return tuple(rule for rule, needed in self._rule_masks if mask & needed == needed)

    def _feature_predictions(self, rules: Sequence[Rule]) -> tuple[Prediction, ...]:
        """Per feature: the first rule making it unavailable, else the first hazard, else no rule."""
        chosen: dict[str, Rule] = {}
        for rule in rules:
            if rule.feature is None or rule.effect not in PREDICTED_VERDICTS:
                continue
            held = chosen.get(rule.feature)
            if held is None or (held.effect is Effect.HAZARD and rule.effect is Effect.FEATURE_UNAVAILABLE):
                chosen[rule.feature] = rule
        return tuple(self.prediction(chosen[feature]) if feature in chosen
                     else Prediction(feature=feature, verdict=Verdict.NO_RULE) for feature in FEATURES)


#: The verdict each feature-level effect predicts.
PREDICTED_VERDICTS = {Effect.FEATURE_UNAVAILABLE: Verdict.UNAVAILABLE, Effect.HAZARD: Verdict.HAZARD}


def rule_prediction(rule: Rule) -> Prediction:
    """The prediction a feature_unavailable or hazard rule makes for its feature."""
    return Prediction(feature=str(rule.feature), verdict=PREDICTED_VERDICTS[rule.effect], rule=rule.id,
                      reason=rule.reason, error=rule.error, remedy=rule.remedy,
                      sources=tuple(s.to_json() for s in rule.sources), unwitnessed=rule.unwitnessed)


# --------------------------------------------------------------------------- loading

def load_rules(paths: list[Path] | None = None) -> tuple[Rule, ...]:
    """Load every rule file (default: the shipped ``compat/rules/*.yaml``); ids must be unique."""
    files = paths if paths is not None else sorted((data_dir("compat") / "rules").glob("*.yaml"))
    rules: list[Rule] = []
    seen: dict[str, str] = {}
    for path in files:
        for rule in _load_rule_file(path):
            if rule.id in seen:
                raise SpecError(f"duplicate rule id {rule.id!r} (first defined at {seen[rule.id]})",
                                source=rule.origin)
            seen[rule.id] = rule.origin
            rules.append(rule)
    return tuple(rules)


def _load_rule_file(path: Path) -> list[Rule]:
    doc = require_mapping(load_file(path), what="rules file", source=str(path))
    check_keys(doc, allowed={"schema", "rules", "description"}, what="rules file", required={"schema", "rules"})
    if str(doc["schema"]) != str(RULES_SCHEMA):
        raise SpecError(f"unsupported rules schema {doc['schema']!r}", source=str(path), line=doc.line_of("schema"))
    entries = doc["rules"]
    if not isinstance(entries, list):
        raise SpecError("rules must be a list", source=str(path), line=doc.line_of("rules"))
    return [parse_rule(require_mapping(e, what="rule", source=str(path))) for e in entries]


def parse_rule(entry: LineDict) -> Rule:
    """Build one :class:`Rule` from its YAML mapping, validating every field."""
    check_keys(entry, allowed={"id", "when", "then", "reason", "remedy", "sources", "witness", "unwitnessed"},
               what="rule", required={"id", "when", "then", "reason", "sources"})
    rule_id = validate_identifier(entry["id"], what="rule id", source=entry.source, line=entry.line_of("id"))
    when = require_mapping(entry["when"], what=f"rule {rule_id} when", source=entry.source)
    then = require_mapping(entry["then"], what=f"rule {rule_id} then", source=entry.source)
    check_keys(then, allowed={"effect", "feature", "component", "error", "requires"}, what=f"rule {rule_id} then",
               required={"effect"})
    effect = _effect(then, rule_id)
    feature = _feature(then, effect, rule_id)
    return Rule(id=rule_id, conditions=tuple(parse_condition(f, v, where=when) for f, v in when.items()),
                effect=effect, reason=_text(entry, "reason"), sources=_sources(entry, rule_id), feature=feature,
                component=str(then.get("component", "")), error=str(then.get("error", "")),
                remedy=str(entry.get("remedy", "")), requires=_requires(then, effect, rule_id),
                origin=f"{display_path(entry.source)}:{entry.line}", witness=_witness(entry, rule_id),
                unwitnessed=_unwitnessed(entry, rule_id))


def _witness(entry: LineDict, rule_id: str) -> Witness | None:
    """The rule's ``witness:`` mapping, validated against the readers' vocabulary."""
    raw = entry.get("witness")
    if raw is None:
        return None
    value = require_mapping(raw, what=f"rule {rule_id} witness", source=entry.source)
    check_keys(value, allowed={"dist", "fact", "inside", "context", "over", "shows"}, what=f"rule {rule_id} witness",
               required={"dist", "fact", "inside"})
    source, line = value.source, value.line
    dist, fact = value["dist"], value["fact"]
    if dist not in WITNESS_DISTS:
        raise SpecError(f"rule {rule_id}: witness dist {dist!r} is not read by any wheel reader; valid: "
                        f"{', '.join(WITNESS_DISTS)}", source=source, line=value.line_of("dist"))
    facts = WITNESS_FACTS.get(dist, ()) + METADATA_FACTS
    if fact not in facts:
        raise SpecError(f"rule {rule_id}: unknown witness fact {fact!r} for {dist}; valid: {', '.join(facts)}",
                        source=source, line=value.line_of("fact"))
    statuses = value["inside"] if isinstance(value["inside"], list) else [value["inside"]]
    valid = [s.value for s in ReadingStatus]
    if not statuses or any(s not in valid for s in statuses):
        raise SpecError(f"rule {rule_id}: witness inside {value['inside']!r} is not a reading status; valid: "
                        f"{', '.join(valid)}", source=source, line=value.line_of("inside"))
    return Witness(dist=str(dist), fact=str(fact), inside=tuple(ReadingStatus(s) for s in statuses),
                   context=_witness_context(value, rule_id), shows=str(value.get("shows", "")),
                   over=(validate_specifier(value["over"], what="witness over", source=source, line=line)
                         if "over" in value else None))


def _witness_context(value: LineDict, rule_id: str) -> dict[str, Any]:
    raw = value.get("context")
    if raw is None:
        return {}
    context = require_mapping(raw, what=f"rule {rule_id} witness context", source=value.source)
    unknown = sorted(set(context) - set(WITNESS_CONTEXT_KEYS))
    if unknown:
        raise SpecError(f"rule {rule_id}: unknown witness context key(s) {', '.join(unknown)}; valid: "
                        f"{', '.join(WITNESS_CONTEXT_KEYS)}", source=context.source, line=context.line)
    return dict(context)


def _unwitnessed(entry: LineDict, rule_id: str) -> str:
    if "unwitnessed" not in entry:
        return ""
    if "witness" in entry:
        raise SpecError(f"rule {rule_id}: both witness and unwitnessed; keep one", source=entry.source,
                        line=entry.line_of("unwitnessed"))
    return _text(entry, "unwitnessed")


def _text(entry: LineDict, key: str) -> str:
    value = entry.get(key)
    if not isinstance(value, str) or not value.strip():
        raise SpecError(f"rule field {key!r} must be a non-empty string", source=entry.source, line=entry.line_of(key))
    return " ".join(value.split())


def _effect(then: LineDict, rule_id: str) -> Effect:
    try:
        return Effect(then["effect"])
    except ValueError:
        raise SpecError(f"rule {rule_id}: unknown effect {then['effect']!r}; valid: "
                        f"{', '.join(e.value for e in Effect)}", source=then.source, line=then.line_of("effect")) from None


def _feature(then: LineDict, effect: Effect, rule_id: str) -> str | None:
    feature = then.get("feature")
    if feature is None:
        if effect in (Effect.FEATURE_UNAVAILABLE, Effect.HAZARD):
            raise SpecError(f"rule {rule_id}: effect {effect.value} needs a feature", source=then.source, line=then.line)
        return None
    if feature not in FEATURES:
        raise SpecError(f"rule {rule_id}: unknown feature {feature!r}; valid: {', '.join(FEATURES)}",
                        source=then.source, line=then.line_of("feature"))
    return str(feature)


def _requires(then: LineDict, effect: Effect, rule_id: str) -> dict[str, Any]:
    value = then.get("requires")
    if value is None:
        if effect is Effect.REQUIRES:
            raise SpecError(f"rule {rule_id}: effect requires needs a 'requires' mapping", source=then.source,
                            line=then.line)
        return {}
    value = require_mapping(value, what=f"rule {rule_id} requires", source=then.source)
    check_keys(value, allowed={"driver", "env"}, what=f"rule {rule_id} requires")
    if "driver" in value:
        validate_specifier(value["driver"], what="requires.driver", source=value.source, line=value.line_of("driver"))
    if "env" in value:
        _check_env(require_mapping(value["env"], what=f"rule {rule_id} requires.env", source=value.source,
                                   line=value.line_of("env")), rule_id)
    return {k: (dict(v) if isinstance(v, dict) else str(v)) for k, v in value.items()}


def _check_env(env: LineDict, rule_id: str) -> None:
    """``requires.env`` names variables a user sets in a shell or a job file: a name is a shell name and a
    value one line, so neither can carry a command or a second line into what is printed for them."""
    for name, setting in env.items():
        if not isinstance(name, str) or not _ENV_NAME.fullmatch(name):
            raise UnsafeValueError(f"rule {rule_id}: requires.env name {name!r} is not a variable name "
                                   "(letters, digits and _, not starting with a digit)", source=env.source,
                                   line=env.line_of(name), remedy="name the environment variable itself")
        if isinstance(setting, (dict, list)) or any(ord(ch) < 32 or ord(ch) == 127 for ch in str(setting)):
            raise UnsafeValueError(f"rule {rule_id}: requires.env {name} must be one line of text",
                                   source=env.source, line=env.line_of(name))


_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def _sources(entry: LineDict, rule_id: str) -> tuple[Source, ...]:
    raw = entry["sources"]
    if not isinstance(raw, list) or not raw:
        raise SpecError(f"rule {rule_id}: sources must be a non-empty list", source=entry.source,
                        line=entry.line_of("sources"))
    return tuple(parse_source(require_mapping(s, what="source", source=entry.source)) for s in raw)


def parse_source(item: LineDict) -> Source:
    """One ``{ref, url?, confidence}`` source entry."""
    check_keys(item, allowed={"ref", "url", "confidence"}, what="source", required={"ref", "confidence"})
    if item["confidence"] not in CONFIDENCES:
        raise SpecError(f"unknown confidence {item['confidence']!r}; valid: {', '.join(CONFIDENCES)}",
                        source=item.source, line=item.line_of("confidence"))
    return Source(ref=str(item["ref"]), confidence=str(item["confidence"]), url=str(item.get("url", "")))


def parse_condition(fact: str, spec: Any, *, where: LineDict) -> Condition:
    """Compile the condition ``fact: spec`` (see compat/README.md for the forms)."""
    source, line = where.source, where.line_of(fact)
    kind = FACT_KINDS.get(fact)
    if kind is None:
        raise SpecError(f"unknown fact {fact!r}; valid facts: {', '.join(sorted(FACT_KINDS))}", source=source, line=line)
    if isinstance(spec, dict):
        return _mapping_condition(fact, kind, spec, source=source, line=line)
    if kind == "boolean":
        if not isinstance(spec, bool):
            raise SpecError(f"fact {fact!r} takes true or false", source=source, line=line)
        return Condition(fact, "eq", spec)
    if kind == "version":
        return Condition(fact, "spec", validate_specifier(spec, what=f"{fact} specifier", source=source, line=line))
    if kind == "identifier":
        return Condition(fact, "eq", _identifier(fact, spec, source, line))
    return Condition(fact, "eq", _number(fact, spec, source, line))


def _mapping_condition(fact: str, kind: str, spec: dict, *, source: str, line: int) -> Condition:
    if len(spec) != 1:
        raise SpecError(f"condition on {fact!r} must have exactly one operator", source=source, line=line)
    (op, operand), = spec.items()
    if op in _SET_OPS and isinstance(operand, list) and kind != "boolean":
        if kind == "version":
            members = frozenset(parse_version(validate_version(v, what=fact, source=source, line=line)) for v in operand)
        elif kind == "number":
            members = frozenset(_number(fact, v, source, line) for v in operand)
        else:
            members = frozenset(_identifier(fact, v, source, line) for v in operand)
        return Condition(fact, op, members)
    if op == "not" and kind == "version":
        return Condition(fact, "not_spec", validate_specifier(operand, what=f"{fact} specifier", source=source, line=line))
    if op in _NUMBER_OPS and kind == "number":
        return Condition(fact, op, _number(fact, operand, source, line))
    raise SpecError(f"operator {op!r} does not apply to {kind} fact {fact!r}", source=source, line=line)


def _identifier(fact: str, value: Any, source: str, line: int) -> str:
    return validate_identifier(value, what=f"{fact} value", source=source, line=line)


def _number(fact: str, value: Any, source: str, line: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise SpecError(f"fact {fact!r} takes an integer, got {value!r}", source=source, line=line)
    return value


# --------------------------------------------------------------------------- targets

TARGET_KEYS = frozenset({"gpu", "arch", "gpu_count", "interconnect", "multicast", "min_driver", "description", "sources",
                         "rdma", "nodes"})


def load_targets(path: Path | None = None) -> dict[str, Target]:
    """Hardware profiles from ``compat/targets.yaml`` (plus a user file when given)."""
    path = path or data_dir("compat") / "targets.yaml"
    doc = require_mapping(load_file(path), what="targets file", source=str(path))
    check_keys(doc, allowed={"schema", "targets", "description"}, what="targets file", required={"schema", "targets"})
    entries = require_mapping(doc["targets"], what="targets", source=str(path))
    return {validate_identifier(name, what="target name", source=str(path), line=entries.line_of(name)):
            _target(name, require_mapping(entry, what=f"target {name}", source=str(path)))
            for name, entry in entries.items()}


def _target(name: str, entry: LineDict) -> Target:
    check_keys(entry, allowed=TARGET_KEYS, what=f"target {name}", required={"gpu", "arch", "gpu_count", "interconnect"})
    try:
        interconnect = Interconnect(entry["interconnect"])
    except ValueError:
        raise SpecError(f"target {name}: unknown interconnect {entry['interconnect']!r}; valid: "
                        f"{', '.join(i.value for i in Interconnect)}", source=entry.source,
                        line=entry.line_of("interconnect")) from None
    count = entry["gpu_count"]
    if isinstance(count, bool) or not isinstance(count, int) or count < 1:
        raise SpecError(f"target {name}: gpu_count must be a positive integer", source=entry.source,
                        line=entry.line_of("gpu_count"))
    min_driver = entry.get("min_driver")
    nodes = entry.get("nodes", 1)
    if isinstance(nodes, bool) or not isinstance(nodes, int) or nodes < 1:
        raise SpecError(f"target {name}: nodes must be a positive integer", source=entry.source,
                        line=entry.line_of("nodes"))
    return Target(name=name, gpu=str(entry["gpu"]), interconnect=interconnect, gpu_count=count,
                  arch=validate_version(entry["arch"], what="arch", source=entry.source, line=entry.line_of("arch")),
                  multicast=bool(entry.get("multicast", False)),
                  min_driver=None if min_driver is None else validate_version(min_driver, what="min_driver",
                                                                              source=entry.source),
                  description=str(entry.get("description", "")), rdma=bool(entry.get("rdma", False)),
                  nodes=nodes)


def specifier_text(spec: SpecifierSet) -> str:
    """Human form of a specifier set, sorted for stable output."""
    return ",".join(sorted(str(s) for s in spec))


def features_only_nvcc_decides(rules: Sequence[Rule]) -> frozenset[str]:
    """Features some rule makes unavailable for the lack of nvcc alone (its one condition is
    ``nvcc``): they follow the image's flavour (devel, or toolkit wheels that carry nvcc), not the
    versions of the stack."""
    return frozenset(rule.feature for rule in rules
                     if rule.feature and rule.effect is Effect.FEATURE_UNAVAILABLE
                     and [condition.fact for condition in rule.conditions] == ["nvcc"])
