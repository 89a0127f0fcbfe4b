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

An axis may follow the index instead (:mod:`stackforge.plan.selectors`), and the torch, FlashInfer and
kernel versions may come from each SGLang release's own pins::

    axes:
      sglang: {latest: 2}
    derive: {from: sglang}

What the selectors chose and the pins are read from the matrix's lock file (:mod:`stackforge.plan.lock`,
written by ``stackforge plan --update-lock``), never from the network while loading.

Expansion follows GitHub Actions: the cartesian product of ``axes``, minus every combination that
matches an ``exclude`` entry, then each ``include`` entry extends the combinations whose axis
values it matches (without overwriting an axis value) or, if it matches none, is added as a new
combination. Every value is validated here, before it can reach a Dockerfile: versions must be written
as packaging spells them (``2.14.1``, not ``v2.14.1``), two spellings of one version (``2.14.1`` and
``2.14.1.0``) are one value and refused together, ``python`` must be a CPython minor stackforge knows
(``compat/tables.yaml`` ``python_versions``), a target is named once, and ``name`` / ``description`` are
one line of text (:data:`MAX_NAME_CHARS`, :data:`MAX_DESCRIPTION_CHARS`).
"""

from __future__ import annotations

import itertools
import math
import re
from collections.abc import Collection
from pathlib import Path
from typing import Any

from packaging.version import Version

from stackforge.core.errors import SpecError
from stackforge.core.model import FLASHINFER_ADDONS, Flavour, Matrix, Stack
from stackforge.core.versions import minor_of, parse_version, validate_identifier, validate_version
from stackforge.core.yamlio import LineDict, check_keys, describe, load_file, require_mapping
from stackforge.plan.lock import MatrixLock, check_lock_matches, lock_path_for, read_lock
from stackforge.plan.selectors import Selector, parse_selector

MATRIX_FILE_SCHEMA = 1
VERSION_KEYS = ("cuda", "torch", "flashinfer", "sglang", "python", "kernel")
IDENTIFIER_KEYS = ("flavour", "os", "torch_variant")
LIST_KEYS = ("flashinfer_addons",)
STACK_KEYS = frozenset(VERSION_KEYS + IDENTIFIER_KEYS + LIST_KEYS)
REQUIRED_STACK_KEYS = frozenset({"cuda", "torch", "flashinfer", "sglang", "python"})
TOP_KEYS = frozenset({"schema", "name", "description", "targets", "defaults", "axes", "include", "exclude",
                      "derive"})
#: What ``derive: {from: sglang}`` sets from each SGLang release's pins (key in the pins row -> stack key).
DERIVED_FROM_SGLANG = {"torch": "torch", "flashinfer": "flashinfer", "kernel": "kernel"}
#: ``name`` and ``description`` are one line of text: they head reports, PR comments and page titles.
MAX_NAME_CHARS = 100
MAX_DESCRIPTION_CHARS = 1_000
# Any control character (a newline, a tab, an escape, DEL, the C1 range): not one line of plain text.
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f\u2028\u2029]")

Combo = dict[str, Any]


def load_matrix(path: Path, *, os_names: Collection[str] = (), python_versions: Collection[str] = (),
                max_combinations: int | None = None) -> Matrix:
    """Load, validate and expand one matrix file. Raises SpecError with ``file:line`` on bad input.

    ``os_names``: the base OS names stackforge knows (``compat/tables.yaml`` os_python); when given,
    any other ``os`` value is refused where it is written, with the valid names. ``python_versions``:
    the CPython minors it knows (``compat/tables.yaml`` python_versions); when given, the same for ``python``.
    ``max_combinations``: refuse axes that multiply (with the include entries) to more, before expanding.
    """
    doc = require_mapping(load_file(path), what="matrix file", source=str(path))
    check_keys(doc, allowed=TOP_KEYS, what="matrix file", required={"schema", "targets"})
    _check_schema(doc)
    name = _one_line(doc, "name", MAX_NAME_CHARS) if "name" in doc else path.stem
    description = _one_line(doc, "description", MAX_DESCRIPTION_CHARS) if "description" in doc else ""
    if os_names:
        _check_os_names(doc, frozenset(os_names))
    axes, selectors = _load_axes(doc.get("axes", _empty_like(doc)), source=doc.source, line=doc.line_of("axes"))
    derive_from = _derive_from(doc, axes, selectors)
    lock = None
    if selectors or derive_from:
        lock = _locked_axes(path, axes, selectors, derive_from)
    defaults = (_load_entry(doc["defaults"], what="defaults", source=doc.source, line=doc.line_of("defaults"))
                if "defaults" in doc else {})
    excludes = [_load_entry(e, what="exclude entry") for e in _entries(doc, "exclude")]
    includes = [_load_entry(e, what="include entry") for e in _entries(doc, "include")]
    if max_combinations is not None:
        _check_combinations(axes, len(includes), max_combinations, doc)
    combos, excluded = _expand(axes, excludes, includes)
    stacks = _to_stacks(combos, defaults, doc)
    if not stacks:
        raise SpecError("the matrix has no stacks: axes and include add no combination"
                        + (f" ({excluded} excluded)" if excluded else ""), source=doc.source,
                        line=doc.line_of("axes") if "axes" in doc else doc.line,
                        remedy="give axes values, e.g. axes: {cuda: [\"13.1\"], ...}, or an include entry")
    if python_versions:
        _check_pythons(stacks, frozenset(python_versions), doc)
    return Matrix(name=name, source=str(path), stacks=stacks,
                  targets=_load_targets(doc), excluded=excluded, description=description,
                  sglang_pins={p.sglang: p.as_row() for p in lock.pins} if lock else {},
                  lock=str(lock_path_for(path)) if lock else "")


def selectors_of(path: Path) -> tuple[tuple[Selector, ...], str | None, tuple[str, ...]]:
    """A matrix file's selectors, what it derives from (``None``: nothing) and the SGLang versions it lists
    (validated; empty when the axis is a selector or absent), without reading its lock."""
    doc = require_mapping(load_file(path), what="matrix file", source=str(path))
    axes, selectors = _load_axes(doc.get("axes", _empty_like(doc)), source=doc.source, line=doc.line_of("axes"))
    return tuple(selectors), _derive_from(doc, axes, selectors), tuple(axes.get("sglang", ()))


def _derive_from(doc: LineDict, axes: dict[str, list[Any]], selectors: list[Selector]) -> str | None:
    """``derive: {from: sglang}`` checked: the axes it sets must not be written as well."""
    if "derive" not in doc:
        return None
    derive = require_mapping(doc["derive"], what="derive", source=doc.source, line=doc.line_of("derive"))
    check_keys(derive, allowed={"from"}, what="derive", required={"from"})
    if derive["from"] != "sglang":
        raise SpecError(f"derive: from must be sglang (the release whose pins set torch, flashinfer and kernel), "
                        f"got {describe(derive['from'])}", source=doc.source, line=derive.line_of("from"))
    written = [k for k in DERIVED_FROM_SGLANG.values() if k in axes or any(s.axis == k for s in selectors)]
    if written:
        raise SpecError(f"derive: {{from: sglang}} sets {', '.join(written)} from each SGLang release's pins; "
                        f"remove the axis", source=doc.source, line=doc.line_of("derive"))
    if "sglang" not in axes and not any(s.axis == "sglang" for s in selectors):
        raise SpecError("derive: {from: sglang} needs an sglang axis (a list or a selector)", source=doc.source,
                        line=doc.line_of("derive"))
    return "sglang"


def _locked_axes(path: Path, axes: dict[str, list[Any]], selectors: list[Selector],
                 derive_from: str | None) -> MatrixLock:
    """Fill the selector axes from the lock and, with ``derive``, make each SGLang value carry its pins."""
    lock_path = lock_path_for(path)
    lock = read_lock(lock_path)
    for selector in selectors:
        locked = lock.axis(selector.axis)
        axes[selector.axis] = list(locked.versions) if locked else []
    check_lock_matches(lock, selectors, {"sglang": axes.get("sglang", [])} if derive_from else {}, path=lock_path)
    if derive_from:
        axes["sglang"] = [_with_pins(version, lock, lock_path) for version in axes["sglang"]]
    return lock


def _with_pins(sglang: str, lock: MatrixLock, lock_path: Path) -> dict[str, str]:
    """One SGLang axis value with the versions its release pins (a combination, expanded together)."""
    pins = lock.pins_of(sglang)
    row = pins.as_row() if pins else {}
    combo = {"sglang": sglang}
    for key, stack_key in DERIVED_FROM_SGLANG.items():
        value = row.get(key)
        if value is None:
            continue
        if value[:1] in "<>=!~":
            raise SpecError(f"sglang {sglang} requires {key}{value}, a range, not one version; derive takes exact "
                            f"pins only", source=str(lock_path), remedy=f"list {stack_key} versions in the matrix instead")
        combo[stack_key] = validate_version(value, what=stack_key, source=str(lock_path))
    return combo


def _empty_like(parent: LineDict) -> LineDict:
    """An empty mapping that still knows where its parent was (for error lines)."""
    empty = LineDict()
    empty.line, empty.lines, empty.source = parent.line, {}, parent.source
    return empty


def _check_combinations(axes: dict[str, list[Any]], includes: int, cap: int, doc: LineDict) -> None:
    """Axes multiply before exclude removes anything: refuse a product past ``cap`` before it is built."""
    product = math.prod(len(values) for values in axes.values()) if axes else 0
    if product + includes > cap:
        sizes = " x ".join(f"{len(values)} {key}" for key, values in axes.items())
        raise SpecError(f"the axes multiply to {product + includes:,} combinations ({sizes}"
                        + (f", + {includes} include" if includes else "") + f"), more than the cap of {cap:,}",
                        source=doc.source, line=doc.line_of("axes") if "axes" in doc else doc.line,
                        remedy="list fewer values, or raise the cap with --max-cells N (plan, render; a report "
                               "reads `plan --max-cells N --json > plan.json` with --plan)")


def _one_line(doc: LineDict, key: str, limit: int) -> str:
    """``name`` / ``description``: text (never a list, a mapping or an alias tree), one line, at most ``limit``
    characters, no control characters."""
    value = doc[key]
    if not isinstance(value, (str, int)) or isinstance(value, bool):
        raise SpecError(f"{key} must be one line of text, got {describe(value)}", source=doc.source,
                        line=doc.line_of(key))
    text = str(value)
    bad = _CONTROL.search(text)
    if bad:
        raise SpecError(f"{key} must be one line of text; it holds the control character "
                        f"U+{ord(bad.group()):04X} at character {bad.start() + 1}", source=doc.source,
                        line=doc.line_of(key), remedy=f"write the {key} on one line, without newlines or tabs")
    if len(text) > limit:
        raise SpecError(f"{key} is {len(text):,} characters long; at most {limit:,}", source=doc.source,
                        line=doc.line_of(key), remedy=f"shorten the {key}")
    return text


def _check_pythons(stacks: tuple[Stack, ...], known: frozenset[str], doc: LineDict) -> None:
    """Every stack's ``python`` is a CPython minor stackforge knows (``3.99`` names no Python or base image)."""
    for stack in stacks:
        if minor_of(stack.python) not in known:
            raise SpecError(f"unknown python {stack.python!r} (stack {stack.id}); known: "
                            f"{', '.join(sorted(known, key=parse_version))}", source=doc.source,
                            line=_line_of_value(doc, "python", stack.python),
                            remedy="add the version to compat/tables.yaml python_versions (with a source) "
                                   "to use another")


def _line_of_value(doc: LineDict, key: str, value: str) -> int:
    """Where ``key: value`` is written (axes, defaults, include), else the matrix's own line."""
    places: list[Any] = []
    axes = doc.get("axes")
    if isinstance(axes, LineDict) and isinstance(axes.get(key), list):
        places += [(v, axes[key].line_of(i)) for i, v in enumerate(axes[key])]
    entries = [doc.get("defaults"), *(doc["include"] if isinstance(doc.get("include"), list) else ())]
    places += [(e[key], e.line_of(key)) for e in entries if isinstance(e, LineDict) and key in e]
    return next((line for v, line in places if str(v) == value), doc.line)


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
    targets: dict[str, int] = {}
    for i, item in enumerate(value):
        name = validate_identifier(item, what="target", source=doc.source, line=value.line_of(i))
        if name in targets:
            raise SpecError(f"target {name!r} is listed twice (first at line {targets[name]})", source=doc.source,
                            line=value.line_of(i), remedy="list each target once")
        targets[name] = value.line_of(i)
    return tuple(targets)


def _load_axes(axes: Any, *, source: str, line: int) -> tuple[dict[str, list[Any]], list[Selector]]:
    """The listed axes, and the axes written as selectors (filled in from the lock later)."""
    axes = require_mapping(axes, what="axes", source=source, line=line)
    check_keys(axes, allowed=STACK_KEYS, what="axes")
    loaded: dict[str, list[Any]] = {}
    selectors: list[Selector] = []
    for key, values in axes.items():
        if isinstance(values, dict):
            selectors.append(parse_selector(key, dict(values), source=axes.source, line=axes.line_of(key)))
            continue
        if not isinstance(values, list) or not values:
            raise SpecError(f"axis {key!r} must be a non-empty list, got {describe(values)}", source=axes.source,
                            line=axes.line_of(key))
        loaded[key] = [_value(key, v, source=axes.source, line=values.line_of(i)) for i, v in enumerate(values)]
        if key in VERSION_KEYS:
            _refuse_equal_versions(key, loaded[key], values)
    return loaded, selectors


def _refuse_equal_versions(key: str, versions: list[str], written: Any) -> None:
    """Two spellings of one version in an axis (``2.14.1``, ``2.14.1.0``) would be two stacks of one install."""
    first: dict[Version, tuple[str, int]] = {}
    for i, version in enumerate(versions):
        parsed = parse_version(version)
        if parsed in first:
            spelling, line = first[parsed]
            what = "twice" if spelling == version else f"as {spelling!r} (line {line}) and {version!r}"
            raise SpecError(f"axis {key} lists version {spelling} {what}: one version, one value",
                            source=written.source, line=written.line_of(i), remedy="list each version once")
        first[parsed] = (version, written.line_of(i))


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
        return _canonical(validate_version(value, what=key, source=source, line=line), key=key, source=source,
                          line=line)
    if key == "flavour":
        text = validate_identifier(value, what="flavour", source=source, line=line)
        if text not in {f.value for f in Flavour}:
            raise SpecError(f"unknown flavour {text!r}; valid: {', '.join(f.value for f in Flavour)}",
                            source=source, line=line)
        return text
    if key in IDENTIFIER_KEYS:
        return validate_identifier(value, what=key, source=source, line=line)
    return _addons(value, source=source, line=line)


def _canonical(version: str, *, key: str, source: str, line: int) -> str:
    """A version written as packaging spells it: ``v2.14.1``, ``2.14.01`` or ``2.9.1-post1`` name the same
    release as ``2.14.1``, ``2.14.1``, ``2.9.1.post1`` but would give other ids, tags and pip lines."""
    canonical = str(Version(version))
    if canonical != version:
        raise SpecError(f"{key} {version!r} is not written as a plain version", source=source, line=line,
                        remedy=f"write {canonical!r}")
    return version


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
    # A derived SGLang value is a combination ({sglang, torch, flashinfer, kernel}) expanded together.
    product = [_flat(zip(keys, values)) for values in itertools.product(*axes.values())] if keys else []
    kept = [c for c in product if not any(_matches(c, e) for e in excludes)]
    extra: list[Combo] = []
    axis_keys = set(keys).union(*(v for values in axes.values() for v in values if isinstance(v, dict)))
    for entry in includes:
        on_axes = {k: v for k, v in entry.items() if k in axis_keys}
        rest = {k: v for k, v in entry.items() if k not in axis_keys}
        targets = [c for c in kept if _matches(c, on_axes)] if keys else []
        for combo in targets:
            combo.update(rest)
        if not targets:
            extra.append(dict(entry))
    return kept + extra, len(product) - len(kept)


def _flat(pairs: Any) -> Combo:
    combo: Combo = {}
    for key, value in pairs:
        combo.update(value if isinstance(value, dict) else {key: value})
    return combo


def _to_stacks(combos: list[Combo], defaults: Combo, doc: LineDict) -> tuple[Stack, ...]:
    stacks: dict[str, Stack] = {}
    by_value: dict[frozenset[tuple[str, Any]], str] = {}
    parsed: dict[Any, Any] = {}          # each spelling parsed once: a matrix repeats its few values many times
    spelled_twice = _spelled_twice(combos, defaults, parsed)
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
        stack_id = stack.id
        stacks.setdefault(stack_id, stack)
        # Two include entries may spell one version two ways (13.1, 13.1.0): one stack, written twice.
        same = by_value.setdefault(_value_key(full, parsed), stack_id) if spelled_twice else stack_id
        if same != stack_id:
            raise SpecError(f"stacks {same} and {stack_id} are one stack: their versions are equal, "
                            f"spelled two ways", source=doc.source, line=line,
                            remedy="spell each version one way in axes, defaults and include")
    return tuple(stacks.values())


def _spelled_twice(combos: list[Combo], defaults: Combo, parsed: dict[Any, Any]) -> bool:
    """Whether some version is written two ways anywhere in the cells (``13.1`` and ``13.1.0``): only then can two
    cells be one stack under two ids, so only then is each cell's value key worth making."""
    for key in VERSION_KEYS:
        spellings = {combo.get(key, defaults.get(key)) for combo in combos} - {None}
        versions = set()
        for raw in spellings:
            if raw not in parsed:
                parsed[raw] = parse_version(raw)
            versions.add(parsed[raw])
        if len(versions) != len(spellings):
            return True
    return False


def _value_key(full: Combo, parsed: dict[Any, Any]) -> frozenset[tuple[str, Any]]:
    """A stack's values with each version parsed (``parsed``: spelling -> version, filled as it goes), so equal
    versions compare equal however spelled."""
    def value(key: str, raw: Any) -> Any:
        if key not in VERSION_KEYS:
            return raw
        if raw not in parsed:
            parsed[raw] = parse_version(raw)
        return parsed[raw]
    return frozenset((k, value(k, v)) for k, v in full.items())


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
