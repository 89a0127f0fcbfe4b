"""Matrix files (``matrices/*.yaml``): axes, include/exclude like GitHub Actions, and targets.

    schema: 1
    name: default
    targets: [rtx-pro-6000-x8-pcie]
    defaults: {python: "3.12", flavour: devel, os: ubuntu24.04}
    axes:
      cuda: ["12.8", "13.1"]
      torch: ["2.9.1", "2.14.1"]
    exclude:
      - {cuda: "13.1", torch: "2.9.1"}
    include:
      - {cuda: "13.1", torch: "2.14.1", flavour: wheels}

Expansion follows GitHub Actions: the cartesian product of ``axes``, minus every combination that
matches an ``exclude`` entry, then each ``include`` entry extends the combinations whose axis
values it matches (without overwriting an axis value) or, if it matches none, is added as a new
combination. Every value is validated here, before it can reach a Dockerfile.
"""

from __future__ import annotations

import itertools
from collections.abc import Collection
from pathlib import Path
from typing import Any

from stackforge.core.errors import SpecError
from stackforge.core.model import FLASHINFER_ADDONS, Flavour, Matrix, Stack
from stackforge.core.versions import parse_version, validate_identifier, validate_version
from stackforge.core.yamlio import LineDict, check_keys, describe, load_file, require_mapping

MATRIX_FILE_SCHEMA = 1
VERSION_KEYS = ("cuda", "torch", "flashinfer", "sglang", "python", "kernel")
IDENTIFIER_KEYS = ("flavour", "os", "torch_variant")
LIST_KEYS = ("flashinfer_addons",)
STACK_KEYS = frozenset(VERSION_KEYS + IDENTIFIER_KEYS + LIST_KEYS)
REQUIRED_STACK_KEYS = frozenset({"cuda", "torch", "flashinfer", "sglang", "python"})
TOP_KEYS = frozenset({"schema", "name", "description", "targets", "defaults", "axes", "include", "exclude"})

Combo = dict[str, Any]


def load_matrix(path: Path, *, os_names: Collection[str] = ()) -> Matrix:
    """Load, validate and expand one matrix file. Raises SpecError with ``file:line`` on bad input.

    ``os_names``: the base OS names stackforge knows (``compat/tables.yaml`` os_python); when given,
    any other ``os`` value is refused where it is written, with the valid names.
    """
    doc = require_mapping(load_file(path), what="matrix file", source=str(path))
    check_keys(doc, allowed=TOP_KEYS, what="matrix file", required={"schema", "targets"})
    _check_schema(doc)
    if os_names:
        _check_os_names(doc, frozenset(os_names))
    axes = _load_axes(doc.get("axes", _empty_like(doc)), source=doc.source, line=doc.line_of("axes"))
    defaults = (_load_entry(doc["defaults"], what="defaults", source=doc.source, line=doc.line_of("defaults"))
                if "defaults" in doc else {})
    excludes = [_load_entry(e, what="exclude entry") for e in _entries(doc, "exclude")]
    includes = [_load_entry(e, what="include entry") for e in _entries(doc, "include")]
    combos, excluded = _expand(axes, excludes, includes)
    stacks = _to_stacks(combos, defaults, doc)
    if not stacks:
        raise SpecError("the matrix has no stacks: axes and include add no combination"
                        + (f" ({excluded} excluded)" if excluded else ""), source=doc.source,
                        line=doc.line_of("axes") if "axes" in doc else doc.line,
                        remedy="give axes values, e.g. axes: {cuda: [\"13.1\"], ...}, or an include entry")
    return Matrix(name=str(doc.get("name", path.stem)), source=str(path), stacks=stacks,
                  targets=_load_targets(doc), excluded=excluded, description=str(doc.get("description", "")))


def _empty_like(parent: LineDict) -> LineDict:
    """An empty mapping that still knows where its parent was (for error lines)."""
    empty = LineDict()
    empty.line, empty.lines, empty.source = parent.line, {}, parent.source
    return empty


def _check_os_names(doc: LineDict, known: frozenset[str]) -> None:
    """Every ``os`` value of axes, defaults, include and exclude must be a known base OS."""
    places: list[tuple[Any, int]] = []
    axes = doc.get("axes")
    if isinstance(axes, LineDict) and isinstance(axes.get("os"), list):
        places += [(v, axes["os"].line_of(i)) for i, v in enumerate(axes["os"])]
    entries = [doc.get("defaults")] + [e for key in ("include", "exclude") if isinstance(doc.get(key), list)
                                       for e in doc[key]]
    places += [(e["os"], e.line_of("os")) for e in entries if isinstance(e, LineDict) and "os" in e]
    for value, line in places:
        if str(value) not in known:
            raise SpecError(f"unknown os {repr(value) if isinstance(value, str) else f'({describe(value)})'}; "
                            f"valid: {', '.join(sorted(known))}", source=doc.source, line=line,
                            remedy="add the OS to compat/tables.yaml os_python (with a source) to use another")


def _check_schema(doc: LineDict) -> None:
    if str(doc["schema"]) != str(MATRIX_FILE_SCHEMA):
        raise SpecError(f"unsupported matrix schema {doc['schema']!r}; "
                        f"this stackforge reads schema {MATRIX_FILE_SCHEMA}",
                        source=doc.source, line=doc.line_of("schema"))


def _entries(doc: LineDict, key: str) -> list[LineDict]:
    value = doc.get(key, [])
    if not isinstance(value, list):
        raise SpecError(f"{key} must be a list of mappings", source=doc.source, line=doc.line_of(key))
    return [require_mapping(item, what=f"{key} entry", source=doc.source, line=doc.line_of(key)) for item in value]


def _load_targets(doc: LineDict) -> tuple[str, ...]:
    value = doc["targets"]
    if not isinstance(value, list) or not value:
        raise SpecError("targets must be a non-empty list of target profile names", source=doc.source,
                        line=doc.line_of("targets"))
    return tuple(validate_identifier(t, what="target", source=doc.source, line=value.line_of(i))
                 for i, t in enumerate(value))


def _load_axes(axes: Any, *, source: str, line: int) -> dict[str, list[Any]]:
    axes = require_mapping(axes, what="axes", source=source, line=line)
    check_keys(axes, allowed=STACK_KEYS, what="axes")
    loaded: dict[str, list[Any]] = {}
    for key, values in axes.items():
        if not isinstance(values, list) or not values:
            raise SpecError(f"axis {key!r} must be a non-empty list, got {describe(values)}", source=axes.source,
                            line=axes.line_of(key))
        loaded[key] = [_value(key, v, source=axes.source, line=values.line_of(i)) for i, v in enumerate(values)]
    return loaded


def _load_entry(entry: Any, *, what: str, source: str = "", line: int | None = None) -> Combo:
    entry = require_mapping(entry, what=what, source=getattr(entry, "source", source), line=line)
    check_keys(entry, allowed=STACK_KEYS, what=what)
    combo: Combo = {k: _value(k, v, source=entry.source, line=entry.line_of(k)) for k, v in entry.items()}
    combo["_line"] = entry.line
    return combo


def _value(key: str, value: Any, *, source: str, line: int) -> Any:
    """Validate one axis value for its key; returns the normalised value."""
    if key in VERSION_KEYS:
        if value is None or isinstance(value, (bool, list, dict)):
            raise SpecError(f"{key} must be a version string, got {describe(value)}", source=source, line=line)
        return validate_version(value, what=key, source=source, line=line)
    if key == "flavour":
        text = validate_identifier(value, what="flavour", source=source, line=line)
        if text not in {f.value for f in Flavour}:
            raise SpecError(f"unknown flavour {text!r}; valid: {', '.join(f.value for f in Flavour)}",
                            source=source, line=line)
        return text
    if key in IDENTIFIER_KEYS:
        return validate_identifier(value, what=key, source=source, line=line)
    return _addons(value, source=source, line=line)


def _addons(value: Any, *, source: str, line: int) -> tuple[str, ...]:
    items = value if isinstance(value, list) else [value]
    for item in items:
        if item not in FLASHINFER_ADDONS:
            raise SpecError(f"unknown flashinfer addon {item!r}; valid: {', '.join(FLASHINFER_ADDONS)}",
                            source=source, line=line)
    return tuple(sorted(set(items)))


def _matches(combo: Combo, entry: Combo) -> bool:
    return all(_same(k, combo.get(k), v) for k, v in entry.items() if not k.startswith("_"))


def _same(key: str, a: Any, b: Any) -> bool:
    """Equality that knows ``"13.1"`` and ``"13.1.0"`` are the same version."""
    if a is None or b is None:
        return a is b
    if key in VERSION_KEYS:
        return parse_version(a) == parse_version(b)
    return a == b


def _expand(axes: dict[str, list[Any]], excludes: list[Combo], includes: list[Combo]) -> tuple[list[Combo], int]:
    keys = list(axes)
    product = [dict(zip(keys, values)) for values in itertools.product(*axes.values())] if keys else []
    kept = [c for c in product if not any(_matches(c, e) for e in excludes)]
    extra: list[Combo] = []
    for entry in includes:
        on_axes = {k: v for k, v in entry.items() if k in axes}
        rest = {k: v for k, v in entry.items() if k not in axes}
        targets = [c for c in kept if _matches(c, on_axes)] if keys else []
        for combo in targets:
            combo.update(rest)
        if not targets:
            extra.append(dict(entry))
    return kept + extra, len(product) - len(kept)


def _to_stacks(combos: list[Combo], defaults: Combo, doc: LineDict) -> tuple[Stack, ...]:
    stacks: dict[str, Stack] = {}
    for combo in combos:
        full = {**{k: v for k, v in defaults.items() if not k.startswith("_")}, **combo}
        line = full.pop("_line", doc.line_of("axes") if "axes" in doc else doc.line)
        missing = sorted(REQUIRED_STACK_KEYS - set(full))
        if missing:
            raise SpecError(f"a matrix cell lacks {', '.join(missing)} (set them in axes, defaults or the include entry)",
                            source=doc.source, line=line)
        if "flavour" in full:
            full["flavour"] = Flavour(full["flavour"])
        stack = Stack(**full)
        stacks.setdefault(stack.id, stack)
    return tuple(stacks.values())


def filter_stacks(stacks: tuple[Stack, ...], *, cuda: str | tuple[str, ...] | None = None,
                  only: tuple[str, ...] = ()) -> tuple[Stack, ...]:
    """Select stacks by toolkit version(s) (``--cuda 13.1 --cuda 12.8``) and/or exact ids (``--only``).

    Raises:
        SpecError: a toolkit no stack has, or an unknown id; the message lists what the matrix has.
    """
    selected = stacks
    wanted_cuda = (cuda,) if isinstance(cuda, str) else tuple(cuda or ())
    if wanted_cuda:
        wanted = {parse_version(validate_version(c, what="--cuda")) for c in wanted_cuda}
        have = sorted({s.cuda for s in stacks}, key=parse_version)
        missing = [c for c in wanted_cuda if not any(parse_version(h) == parse_version(c) for h in have)]
        if missing:
            raise SpecError(f"no stack of this matrix has CUDA {', '.join(missing)}; its stacks have CUDA "
                            f"{', '.join(have) or '(none)'}", remedy="pick one of those, or add the version to the matrix")
        selected = tuple(s for s in selected if parse_version(s.cuda) in wanted)
    if only:
        known = {s.id for s in stacks}
        unknown = [i for i in only if i not in known]
        if unknown:
            raise SpecError(f"unknown stack id(s): {', '.join(unknown)}; known: {', '.join(sorted(known))}")
        selected = tuple(s for s in selected if s.id in only)
    if stacks and not selected:
        raise SpecError(f"no stack matches both --cuda {', '.join(wanted_cuda)} and --only {', '.join(only)}",
                        remedy="drop one of the filters")
    return selected
