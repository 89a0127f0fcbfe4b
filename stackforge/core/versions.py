"""Validation of the version strings and identifiers that end up in Dockerfiles, tags and paths.

Every value from a matrix file flows into a ``RUN pip install ...`` line, an image tag and a file
name. We therefore accept only a conservative character set *before* anything else sees the value:
no whitespace, no shell or Dockerfile metacharacters, no newlines.
"""

from __future__ import annotations

import re
from functools import lru_cache

from packaging.specifiers import InvalidSpecifier, SpecifierSet
from packaging.version import InvalidVersion, Version

from stackforge.core.errors import SpecError, UnsafeValueError

# PEP 440 public and local versions only need these characters.
_SAFE_VERSION = re.compile(r"[0-9A-Za-z][0-9A-Za-z.+!_-]{0,63}")
# Names of OS flavours, targets, variants, packages, features.
_SAFE_IDENTIFIER = re.compile(r"[a-z0-9][a-z0-9._-]{0,63}")
_SAFE_SPECIFIER = re.compile(r"[0-9A-Za-z.,*<>=!~ +_-]{1,200}")


def _show(value: object) -> str:
    """repr() keeps hostile values (newlines, quotes) visible and on one line; empty or structured
    YAML values are named in words (``nothing``, ``a list``), never by a Python type or repr."""
    if value is None or isinstance(value, (list, dict, bool)):
        from stackforge.core.yamlio import describe
        return f"({describe(value)})"
    return repr(value) if len(repr(value)) <= 80 else repr(value)[:77] + "..."


def validate_version(value: object, *, what: str, source: str = "", line: int | None = None) -> str:
    """Return ``value`` as a safe PEP 440 version string, or raise.

    Raises:
        UnsafeValueError: the value contains characters that could inject shell or Dockerfile text.
        SpecError: the value is not a PEP 440 version.
    """
    text = str(value)
    if not _SAFE_VERSION.fullmatch(text):
        raise UnsafeValueError(
            f"{what} {_show(value)} is not a plain version string (only letters, digits and . + ! _ - are allowed)",
            source=source, line=line)
    try:
        Version(text)
    except InvalidVersion:
        raise SpecError(f"{what} {_show(value)} is not a valid PEP 440 version", source=source, line=line) from None
    return text


def validate_identifier(value: object, *, what: str, source: str = "", line: int | None = None) -> str:
    """Return ``value`` as a safe lower-case identifier (letters, digits, ``.``, ``_``, ``-``)."""
    text = str(value)
    if not _SAFE_IDENTIFIER.fullmatch(text):
        raise UnsafeValueError(
            f"{what} {_show(value)} is not a plain identifier (lower-case letters, digits and . _ - only)",
            source=source, line=line)
    return text


def validate_specifier(value: object, *, what: str, source: str = "", line: int | None = None) -> SpecifierSet:
    """Parse a PEP 440 specifier set such as ``>=0.3.1,<0.6.17``."""
    text = str(value)
    if not _SAFE_SPECIFIER.fullmatch(text):
        raise UnsafeValueError(f"{what} {_show(value)} contains characters not allowed in a specifier",
                               source=source, line=line)
    try:
        return SpecifierSet(text)
    except InvalidSpecifier:
        raise SpecError(f"{what} {_show(value)} is not a valid PEP 440 specifier (e.g. '>=2.7,<2.10')",
                        source=source, line=line) from None


@lru_cache(maxsize=4096)
def parse_version(text: str) -> Version:
    """Parse a version string that was validated before (cached: matrices repeat few versions)."""
    return Version(text)


@lru_cache(maxsize=4096)
def minor_of(version: str) -> str:
    """``"13.1.0"`` -> ``"13.1"``."""
    release = parse_version(version).release
    return f"{release[0]}.{release[1] if len(release) > 1 else 0}"


@lru_cache(maxsize=4096)
def compact(version: str) -> str:
    """``"13.1"`` -> ``"131"`` (for ids like ``cu131``); ``"3.12"`` -> ``"312"``."""
    return minor_of(version).replace(".", "")
