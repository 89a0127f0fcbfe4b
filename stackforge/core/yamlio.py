"""YAML loading that remembers where each value came from.

Errors in user files must point at ``file:line``. The loader below returns ``Node`` mappings and
sequences that carry the line of every key and item, and keeps floats as their original text:
``cuda: 12.10`` must stay ``"12.10"``, not become the float ``12.1``.

Aliases are bounded: a 700-byte "billion laughs" (an anchor of nine aliases of an anchor of nine...)
loads instantly as shared objects, but every reader that walks it (a ``str()`` of a ``name``, a check of
each item) walks the expansion: gigabytes and minutes. A document whose aliases add more than
:data:`MAX_ALIAS_NODES` nodes to what is written is refused before anything is built from it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from stackforge.core.errors import SpecError


class LineDict(dict):
    """A mapping from YAML with the 1-based line of itself (``line``) and of each key (``lines``)."""

    __slots__ = ("line", "lines", "source")

    def line_of(self, key: str) -> int:
        """Line of ``key`` if known, else the mapping's own line."""
        return self.lines.get(key, self.line)


class LineList(list):
    """A sequence from YAML with the 1-based line of itself and of each item."""

    __slots__ = ("line", "lines", "source")

    def line_of(self, index: int) -> int:
        return self.lines[index] if index < len(self.lines) else self.line


class _Loader(getattr(yaml, "CSafeLoader", yaml.SafeLoader)):  # type: ignore[misc]
    """SafeLoader (no arbitrary objects) that records lines and keeps floats as text; libyaml's parser
    where PyYAML has it (the same nodes and marks, about ten times faster), the pure-Python one otherwise."""


def _construct_mapping(loader: _Loader, node: yaml.MappingNode) -> LineDict:
    result = LineDict()
    result.line, result.lines, result.source = node.start_mark.line + 1, {}, loader.name
    for key_node, value_node in node.value:
        key = loader.construct_object(key_node, deep=True)
        if not isinstance(key, (str, int)):
            raise SpecError(f"mapping key {key!r} must be a string", source=loader.name,
                            line=key_node.start_mark.line + 1)
        key = str(key)
        if key in result:
            raise SpecError(f"duplicate key {key!r}", source=loader.name, line=key_node.start_mark.line + 1)
        result[key] = loader.construct_object(value_node, deep=True)
        result.lines[key] = key_node.start_mark.line + 1
    return result


def _construct_sequence(loader: _Loader, node: yaml.SequenceNode) -> LineList:
    result = LineList(loader.construct_object(child, deep=True) for child in node.value)
    result.line, result.source = node.start_mark.line + 1, loader.name
    result.lines = [child.start_mark.line + 1 for child in node.value]
    return result


def _construct_float_as_text(loader: _Loader, node: yaml.ScalarNode) -> str:
    return str(node.value)


_Loader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_mapping)
_Loader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_SEQUENCE_TAG, _construct_sequence)
_Loader.add_constructor("tag:yaml.org,2002:float", _construct_float_as_text)


#: The most nodes aliases may add to a document beyond the nodes written in it. The shipped files add at
#: most a few hundred (``compat/knowledge.yaml``'s shared ``needs`` and ``sources``); an alias bomb adds
#: millions from a few lines.
MAX_ALIAS_NODES = 10_000


class AliasBombError(SpecError):
    """A YAML document whose aliases expand it past :data:`MAX_ALIAS_NODES` extra nodes."""

    code = "spec.alias_bomb"


def _check_alias_expansion(root: yaml.Node | None, *, source: str) -> None:
    """Refuse a document whose expanded node count passes the written count by more than the cap.

    Counts each distinct node's expanded size once (post-order, memoised by identity, no recursion: a
    nested document must not exhaust the stack here), so the check costs what the file has, not what
    it expands to. A node that contains itself is left to the constructor, which refuses it.
    """
    if root is None:
        return
    sizes: dict[int, int] = {}
    on_path: set[int] = set()
    stack: list[tuple[yaml.Node, bool]] = [(root, False)]
    while stack:
        node, children_done = stack.pop()
        key = id(node)
        if key in sizes:
            continue
        children = _children(node)
        if not children_done:
            if key in on_path:
                continue
            on_path.add(key)
            stack.append((node, True))
            stack.extend((child, False) for child in children if id(child) not in sizes)
            continue
        on_path.discard(key)
        sizes[key] = 1 + sum(sizes.get(id(child), 1) for child in children)
    expanded, written = sizes[id(root)], len(sizes)
    if expanded - written > MAX_ALIAS_NODES:
        first_alias = _first_shared(root)
        raise AliasBombError(f"YAML aliases expand this document to {expanded:,} nodes from {written:,} written "
                             f"(more than {MAX_ALIAS_NODES:,} added by aliases)", source=source,
                             line=first_alias.start_mark.line + 1 if first_alias else None,
                             remedy="write the values out instead of nesting aliases of aliases")


def _children(node: yaml.Node) -> list[yaml.Node]:
    if isinstance(node, yaml.SequenceNode):
        return list(node.value)
    if isinstance(node, yaml.MappingNode):
        return [part for pair in node.value for part in pair]
    return []


def _first_shared(root: yaml.Node) -> yaml.Node | None:
    """The first node (in document order) that is reached twice: where an alias repeats an anchor."""
    seen: set[int] = set()
    stack = [root]
    while stack:
        node = stack.pop()
        if id(node) in seen:
            return node
        seen.add(id(node))
        stack.extend(reversed(_children(node)))
    return None


def load_text(text: str, *, source: str) -> Any:
    """Parse YAML ``text``; ``source`` names it in errors (usually the file path).

    Raises:
        AliasBombError: aliases add more than :data:`MAX_ALIAS_NODES` nodes (checked before construction).
        SpecError: malformed YAML, with the line.
    """
    loader = _Loader(text)
    loader.name = source
    try:
        root = loader.get_single_node()
        _check_alias_expansion(root, source=source)
        return loader.construct_document(root) if root is not None else None
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        line = mark.line + 1 if mark else None
        problem = " ".join(str(exc.problem or exc.context or "malformed YAML").split())
        raise SpecError(f"malformed YAML: {problem}", source=source, line=line) from None
    except yaml.YAMLError as exc:
        raise SpecError(f"malformed YAML: {' '.join(str(exc).split())}", source=source) from None
    finally:
        loader.dispose()


def load_file(path: Path) -> Any:
    """Read and parse one YAML file; a missing or unreadable file is a ``SpecError``."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise SpecError(f"cannot read file: {exc.strerror}", source=str(path)) from None
    except UnicodeDecodeError:
        raise SpecError("file is not UTF-8 text", source=str(path)) from None
    return load_text(text, source=str(path))


def describe(value: Any) -> str:
    """What a YAML value is, in the words of someone who wrote the file (never a Python type name)."""
    if value is None:
        return "nothing"
    if isinstance(value, bool):
        return f"{'true' if value else 'false'} (a yes/no value)"
    if isinstance(value, dict):
        return "a mapping" if value else "an empty mapping"
    if isinstance(value, list):
        return "a list" if value else "an empty list"
    if isinstance(value, (int, float)):
        return f"the number {value}"
    text = str(value)
    return f"the text {text!r}" if len(text) <= 60 else f"the text {text[:57]!r}..."


def require_mapping(value: Any, *, what: str, source: str, line: int | None = None) -> LineDict:
    """Check that ``value`` is a mapping (as loaded by this module)."""
    if not isinstance(value, LineDict):
        raise SpecError(f"{what} must be a mapping (key: value lines), got {describe(value)}", source=source,
                        line=getattr(value, "line", line))
    return value


def check_keys(mapping: LineDict, *, allowed: set[str] | frozenset[str], what: str,
               required: set[str] | frozenset[str] = frozenset()) -> None:
    """Reject unknown keys (listing the valid ones) and missing required keys."""
    for key in mapping:
        if key not in allowed:
            raise SpecError(f"unknown key {key!r} in {what}; valid keys: {', '.join(sorted(allowed))}",
                            source=mapping.source, line=mapping.line_of(key))
    missing = sorted(set(required) - set(mapping))
    if missing:
        raise SpecError(f"{what} is missing required key(s): {', '.join(missing)}", source=mapping.source,
                        line=mapping.line)
