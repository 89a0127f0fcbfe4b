"""Read a failed build's log tail: is it worth a retry, and which line says why it failed?

Pure functions over text. A failure is *transient* when the network hiccuped (connection reset, read
timeout, a 5xx from the index); those are retried with backoff. It is *permanent* when pip said
what is wrong (no such version, conflicting pins); retrying those only burns minutes. Permanent wins
when both appear, because pip prints its retry warnings before giving up with the real reason.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from enum import Enum


class FailureKind(str, Enum):
    TRANSIENT = "transient"  # retry with backoff
    PERMANENT = "permanent"  # pip / the Dockerfile said what is wrong
    UNKNOWN = "unknown"      # no known signature: not retried


@dataclass(frozen=True, slots=True)
class Diagnosis:
    """What a log tail says: the kind of failure and the line that decided it (evidence)."""

    kind: FailureKind
    line: str

    @property
    def retryable(self) -> bool:
        return self.kind is FailureKind.TRANSIENT


_PERMANENT = tuple(re.compile(p, re.IGNORECASE) for p in (
    r"No matching distribution found for .+",
    r"Could not find a version that satisfies the requirement .+",
    r"ResolutionImpossible.*",
    r"Cannot install .+ because these package versions have conflicting dependencies.*",
    r"The conflict is caused by.*",
    r"\S+ has requirement .+, but you have .+",
    r"ERROR: Invalid requirement.*",
    r"invalid reference format.*",
    r"failed to solve with frontend dockerfile.*",
    r"dockerfile parse error.*",
    r"unknown instruction.*",
))
_TRANSIENT = tuple(re.compile(p, re.IGNORECASE) for p in (
    r"Connection reset by peer.*",
    r"ConnectionResetError.*",
    r"Connection aborted.*",
    r"Read timed out.*",
    r"ReadTimeoutError.*",
    r"IncompleteRead.*",
    r"ProtocolError.*",
    r"Temporary failure in name resolution.*",
    r"TLS handshake timeout.*",
    r"i/o timeout.*",
    r"HTTP error (?:500|502|503|504).*",
    r"(?:500|502|503|504) (?:Internal Server Error|Bad Gateway|Service Unavailable|Gateway Time-?out).*",
    r"THESE PACKAGES DO NOT MATCH THE HASHES.*",   # a truncated download
    r"unexpected EOF.*",
))
_ERROR_LINE = re.compile(r"(?:^|\s)(?:ERROR|error|Error)\b[:\s].*")


def diagnose(tail: str) -> Diagnosis:
    """Classify a failed build from the end of its output."""
    permanent = _last_match(tail, _PERMANENT)
    if permanent:
        return Diagnosis(FailureKind.PERMANENT, permanent)
    transient = _last_match(tail, _TRANSIENT)
    if transient:
        return Diagnosis(FailureKind.TRANSIENT, transient)
    return Diagnosis(FailureKind.UNKNOWN, last_error_line(tail))


def last_error_line(tail: str) -> str:
    """The last line that looks like an error, else the last non-empty line (trimmed to 300 chars)."""
    lines = [_strip_prefix(line) for line in tail.splitlines() if line.strip()]
    for line in reversed(lines):
        if _ERROR_LINE.search(line):
            return _trim(line)
    return _trim(lines[-1]) if lines else ""


def _last_match(tail: str, patterns: tuple[re.Pattern[str], ...]) -> str:
    for line in reversed(tail.splitlines()):
        for pattern in patterns:
            found = pattern.search(line)
            if found:
                return _trim(found.group(0))
    return ""


def _strip_prefix(line: str) -> str:
    """Drop BuildKit's ``#12 3.456`` step prefix so the reason reads like pip's own output."""
    return re.sub(r"^#\d+\s+\d+(?:\.\d+)?\s+", "", line.strip())


def _trim(text: str, limit: int = 300) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 3] + "..."
