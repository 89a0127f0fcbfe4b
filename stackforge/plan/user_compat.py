"""User compatibility data (``--compat DIR`` / ``STACKFORGE_COMPAT``) merged over the shipped ``compat/``.

A user directory holds extra rules and target profiles in the shipped formats, so a team can teach
stackforge about its own hardware or a fix it found without editing site-packages:

* ``DIR/targets.yaml``: target profiles (same format as ``compat/targets.yaml``);
* ``DIR/rules/*.yaml`` and every other ``DIR/*.yaml``: rule files (same format as ``compat/rules/``).

``.yml`` is read as ``.yaml`` everywhere here (``rules/mine.yml``, ``targets.yml``): a file a team
named the other common way is never silently ignored.

A user rule id or target name that the shipped data also has **replaces** the shipped entry, and the
replacement is reported (:func:`override_notices`) so it is never silent. Two user files defining
the same rule id are a load error (exit 2), as in the shipped data. ``tables.yaml`` is not
overridable: derived facts (torch variants, pins) must stay consistent with the shipped rules.

Also here: :func:`load_about`, the knowledge base's own metadata (``compat/knowledge.yaml``: its date
and the features it speaks of).
"""

from __future__ import annotations

import datetime
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from stackforge.core.data import data_dir
from stackforge.core.errors import SpecError
from stackforge.core.model import Target
from stackforge.core.yamlio import check_keys, load_file, require_mapping
from stackforge.plan.features import load_feature_catalog
from stackforge.plan.rule_lint import check_rules
from stackforge.plan.rules import Rule, load_rules, load_targets

ENV_VAR = "STACKFORGE_COMPAT"
TARGETS_FILE = "targets.yaml"
NOT_OVERRIDABLE = ("tables.yaml", "knowledge.yaml")
YAML_SUFFIXES = (".yaml", ".yml")


@dataclass(frozen=True, slots=True)
class UserCompat:
    """Rules and targets loaded from one user directory."""

    source: str
    rules: tuple[Rule, ...] = ()
    targets: dict[str, Target] = field(default_factory=dict)
    files: tuple[str, ...] = ()


def user_rule_files(folder: Path) -> tuple[Path, ...]:
    """The rule files of a user directory: ``rules/*.yaml`` and the top-level ``*.yaml`` but targets
    (``.yml`` too)."""
    targets = _spellings(TARGETS_FILE)
    top = [p for p in _yaml_files(folder) if p.name not in targets]
    return tuple(top + _yaml_files(folder / "rules"))


def _yaml_files(folder: Path) -> list[Path]:
    return sorted(p for p in folder.glob("*") if p.suffix in YAML_SUFFIXES and p.is_file())


def _spellings(name: str) -> tuple[str, ...]:
    """``targets.yaml`` -> ``("targets.yaml", "targets.yml")``."""
    stem = name.rsplit(".", 1)[0]
    return tuple(stem + suffix for suffix in YAML_SUFFIXES)


def _targets_file(folder: Path) -> Path | None:
    """``DIR/targets.yaml`` or ``DIR/targets.yml``; both at once is ambiguous, so an error."""
    found = [folder / name for name in _spellings(TARGETS_FILE) if (folder / name).is_file()]
    if len(found) > 1:
        raise SpecError(f"both {found[0].name} and {found[1].name} in {folder}", source=str(folder),
                        remedy="keep one targets file")
    return found[0] if found else None


def load_user_compat(folder: Path) -> UserCompat:
    """Load and validate a user directory; malformed YAML raises :class:`SpecError` with ``file:line``."""
    if not folder.is_dir():
        raise SpecError(f"--compat {folder}: not a directory", remedy=f"point --compat or {ENV_VAR} at a folder")
    for name in (spelling for protected in NOT_OVERRIDABLE for spelling in _spellings(protected)):
        if (folder / name).exists():
            raise SpecError(f"{name} cannot be overridden from a user compat directory", source=str(folder / name),
                            remedy="put only rule files and targets.yaml there (see compat/README.md)")
    rule_files = user_rule_files(folder)
    rules = load_rules(list(rule_files)) if rule_files else ()
    check_rules(rules)   # the directory's own rules; plan and compat verify lint them with the shipped ones
    targets_path = _targets_file(folder)
    targets = load_targets(targets_path) if targets_path is not None else {}
    files = tuple(str(p) for p in rule_files) + ((str(targets_path),) if targets else ())
    return UserCompat(source=str(folder), rules=rules, targets=targets, files=files)


def merge_rules(shipped: tuple[Rule, ...], user: tuple[Rule, ...]) -> tuple[Rule, ...]:
    """Shipped rules with user rules on top: same id replaces in place, new ids come last."""
    by_id = {rule.id: rule for rule in user}
    merged = tuple(by_id.pop(rule.id, rule) for rule in shipped)
    return merged + tuple(rule for rule in user if rule.id in by_id)


def merge_targets(shipped: dict[str, Target], user: dict[str, Target]) -> dict[str, Target]:
    """Shipped targets with user targets on top (same name replaces)."""
    return {**shipped, **user}


def override_notices(shipped_rules: Sequence[Rule], shipped_targets: Mapping[str, Target],
                     user: UserCompat) -> tuple[str, ...]:
    """One line per shipped rule or target that the user directory replaces."""
    origins = {rule.id: rule.origin for rule in shipped_rules}
    lines = [f"rule {rule.id} from {rule.origin} replaces the shipped one ({origins[rule.id]})"
             for rule in user.rules if rule.id in origins]
    lines += [f"target {name} from {user.source}/{TARGETS_FILE} replaces the shipped profile"
              for name in user.targets if name in shipped_targets]
    return tuple(lines)


# --------------------------------------------------------------------------- the knowledge base's metadata

@dataclass(frozen=True, slots=True)
class About:
    """``compat/knowledge.yaml``: when the knowledge base was last checked, and the question each feature answers
    (its tiers and hardware needs: :mod:`stackforge.plan.features`)."""

    knowledge_date: datetime.date
    features: dict[str, str]


def load_about(path: Path | None = None) -> About:
    """Read ``compat/knowledge.yaml`` (the shipped one by default)."""
    path = path or data_dir("compat") / "knowledge.yaml"
    doc = require_mapping(load_file(path), what="knowledge file", source=str(path))
    check_keys(doc, allowed={"schema", "knowledge_date", "features"}, what="knowledge file",
               required={"schema", "knowledge_date", "features"})
    try:
        date = datetime.date.fromisoformat(str(doc["knowledge_date"]))
    except ValueError:
        raise SpecError(f"knowledge_date must be YYYY-MM-DD, got {doc['knowledge_date']!r}", source=str(path),
                        line=doc.line_of("knowledge_date")) from None
    return About(knowledge_date=date, features=load_feature_catalog(path).questions())
