"""Read a failed build's log: what caused it, which line says so, what to do, and is a retry worth it?

Pure functions over text. :func:`diagnose` names the *cause* of a failure (:class:`Cause`: TLS, DNS,
proxy, refused connection, other network trouble, no space left, no such version, conflicting pins,
an sdist that fetches from another index while it builds, an invalid Dockerfile), keeps the deciding
log line as evidence, and gives the remedy. The *kind* follows from the matched signature: transient
failures (connection reset, read timeout, a 5xx, a temporary DNS failure) are retried with backoff;
permanent ones are not, because retrying only burns minutes.

Why the order matters: pip reports a failed connection as a warning and goes on, so the last ERROR
line of a build that could not reach its index is pip's "No matching distribution found for
torch==2.14.1 (from versions: none)", or even "ResolutionImpossible" when a constraint names the
package. The connection failure above it is the cause; the "no such version" line is its echo. But a
connection warning pip *recovered* from (a retry that then got an answer) is not: when the index
answered, pip's verdict is the cause. So the signatures are tried in :data:`SIGNATURES` order (the
first cause with a matching line wins):

1. no space left: nothing else can succeed, whatever else the log says;
2. an sdist whose build fetches from another index (its own network error is inside the sdist build);
3. TLS, proxy, DNS, refused connection, when pip gave up on an index ("(from versions: none)", or
   "Could not fetch URL ..."), or gave no verdict at all: then "no such version" is an echo;
4. pip's own verdicts (no such version, conflicting pins) and an invalid Dockerfile;
5. transient network trouble (reset, timeout, 5xx): pip prints its retry warnings before it gives up
   with the real reason, so a verdict in 4. wins over them.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from enum import Enum


class FailureKind(str, Enum):
    TRANSIENT = "transient"  # retry with backoff
    PERMANENT = "permanent"  # pip / the Dockerfile / the host said what is wrong
    UNKNOWN = "unknown"      # no known signature: not retried


class Cause(str, Enum):
    """Why a build failed, as told by its log."""

    NO_SPACE = "no-space"
    SDIST_BUILD_FETCH = "sdist-build-fetch"
    TLS = "tls"
    PROXY = "proxy"
    DNS = "dns"
    UNREACHABLE = "unreachable"
    NO_SUCH_VERSION = "no-such-version"
    CONFLICT = "conflict"
    DOCKERFILE = "dockerfile"
    NETWORK_OTHER = "network-other"
    UNKNOWN = "unknown"


#: What to do about each cause (one line; shown in the record's reason and the build summary).
REMEDIES: dict[Cause, str] = {
    Cause.NO_SPACE: "free disk space for the Docker engine (`docker system df`; remove old stackforge images, "
                    "`docker builder prune`) or move its data-root to a larger disk",
    Cause.SDIST_BUILD_FETCH: "the package is an sdist whose build downloads from another index: pass that index "
                             "with --extra-index-url (pip then takes its wheel directly) or put the wheel in "
                             "--find-links",
    Cause.TLS: "pass --ca-bundle PATH with the CA that signs the index's certificate (by default build uses the "
               "bundle pip on this host trusts: PIP_CERT, pip's cert setting, REQUESTS_CA_BUNDLE)",
    Cause.PROXY: "check HTTPS_PROXY / HTTP_PROXY / NO_PROXY where stackforge runs (the build gets the same values)",
    Cause.DNS: "the build cannot resolve the index's host name: check DNS on the engine's host (builds use the "
               "host network) or pass --index-url a mirror it can resolve",
    Cause.UNREACHABLE: "nothing answers at the index's address: check --index-url / --extra-index-url and the "
                       "engine host's network",
    Cause.NO_SUCH_VERSION: "the index has no such release for this Python and platform: check the pins with "
                           "`stackforge plan --preflight`, or pass --index-url / --extra-index-url / --find-links "
                           "where it is",
    Cause.CONFLICT: "the pins conflict: read the 'conflict is caused by' lines in the log and "
                    "`stackforge plan --explain <stack-id>`",
    Cause.DOCKERFILE: "the rendered Dockerfile is invalid: inspect it with `stackforge render` and report it",
    Cause.NETWORK_OTHER: "a network failure that retries did not get past: rerun with --resume, or pass "
                         "--index-url a closer mirror",
    Cause.UNKNOWN: "see the build log",
}


@dataclass(frozen=True, slots=True)
class Signature:
    """Log lines that tell one cause; ``patterns`` in order of how well their match reads as evidence."""

    cause: Cause
    kind: FailureKind
    patterns: tuple[re.Pattern[str], ...]


def _signature(cause: Cause, kind: FailureKind, *patterns: str) -> Signature:
    return Signature(cause, kind, tuple(re.compile(p, re.IGNORECASE) for p in patterns))


_P, _T = FailureKind.PERMANENT, FailureKind.TRANSIENT
#: wheel-stub placeholder sdists (cuda-tile, some nvidia-* on PyPI) name themselves when their download fails.
_WHEEL_STUB = _signature(Cause.SDIST_BUILD_FETCH, _P, r"The installation of \S+ for version \S+ failed\..*")

#: Tried in this order; the first signature with a matching line decides (see the module docstring).
SIGNATURES: tuple[Signature, ...] = (
    _signature(Cause.NO_SPACE, _P, r"No space left on device.*", r"\[Errno 28\].*", r"ENOSPC.*",
               r"disk quota exceeded.*"),
    # wheel-stub placeholders (cuda-tile, nvidia-* on PyPI) say so themselves; other sdists show a
    # network error between pip's "Preparing metadata / Building wheel ... did not run successfully"
    # and the end of that subprocess's output (see _sdist_fetch).
    _WHEEL_STUB,
    _signature(Cause.TLS, _P,
               r"certificate verify failed: [^'\"()\]]+",
               r"x509: certificate signed by unknown authority.*",
               r"tls: failed to verify certificate.*",
               r"SSLCertVerificationError.*",
               r"There was a problem confirming the ssl certificate.*",
               r"SSLError\(.*",
               r"wrong version number.*"),
    _signature(Cause.PROXY, _P,
               r"Cannot connect to proxy",
               r"Tunnel connection failed: [^'\"()]*",
               r"407 Proxy Authentication Required",
               r"proxyconnect tcp: [^\"]*",
               r"ProxyError\('[^']*'"),
    _signature(Cause.DNS, _P,
               r"Name or service not known",
               r"Failed to resolve '[^']+'",
               r"NameResolutionError",
               r"Could not resolve host: \S+",
               r"lookup \S+ on \S+: no such host",
               r"nodename nor servname provided"),
    _signature(Cause.DNS, _T, r"Temporary failure in name resolution"),
    _signature(Cause.UNREACHABLE, _P,
               r"Failed to establish a new connection: \[Errno 111\] Connection refused",
               r"Connection refused",
               r"No route to host",
               r"Network is unreachable"),
    _signature(Cause.NO_SUCH_VERSION, _P,
               r"No matching distribution found for .+",
               r"Could not find a version that satisfies the requirement .+"),
    _signature(Cause.CONFLICT, _P,
               r"Cannot install .+ because these package versions have conflicting dependencies.*",
               r"ResolutionImpossible.*",
               r"The conflict is caused by.*",
               r"\S+ has requirement .+, but you have .+"),
    _signature(Cause.DOCKERFILE, _P,
               r"ERROR: Invalid requirement.*",
               r"invalid reference format.*",
               r"failed to solve with frontend dockerfile.*",
               r"dockerfile parse error.*",
               r"unknown instruction.*"),
    _signature(Cause.NETWORK_OTHER, _T,
               r"Connection reset by peer.*",
               r"ConnectionResetError.*",
               r"Connection aborted.*",
               r"Read timed out.*",
               r"ReadTimeoutError.*",
               r"IncompleteRead.*",
               r"ProtocolError.*",
               r"TLS handshake timeout.*",
               r"i/o timeout.*",
               r"HTTP error (?:500|502|503|504).*",
               r"(?:500|502|503|504) (?:Internal Server Error|Bad Gateway|Service Unavailable|Gateway Time-?out).*",
               r"THESE PACKAGES DO NOT MATCH THE HASHES.*",   # a truncated download
               r"unexpected EOF.*"),
)

_ERROR_LINE = re.compile(r"(?:^|\s)(?:ERROR|error|Error)\b[:\s].*")
_SDIST_FAILED = re.compile(r"(?:Preparing metadata \(pyproject\.toml\)|Building wheel for \S+ \(pyproject\.toml\)|"
                           r"Getting requirements to build wheel) did not run successfully", re.IGNORECASE)
_SDIST_FETCH_ERROR = re.compile(r"urlopen error|gaierror|URLError|ConnectionError|HTTPError|"
                                r"Name or service not known|Connection refused|certificate verify failed",
                                re.IGNORECASE)
_PLACEHOLDER_INDEX = re.compile(r"downloads a real wheel package\s+from (https?://\S+?)\.?\s", re.IGNORECASE)
_CONNECTION_CAUSES = frozenset({Cause.TLS, Cause.PROXY, Cause.DNS, Cause.UNREACHABLE, Cause.NETWORK_OTHER})
_VERDICT_CAUSES = frozenset({Cause.NO_SUCH_VERSION, Cause.CONFLICT})
#: pip's words for an index that gave it nothing: no versions listed, or a page it gave up fetching
#: (not .../simple/pip/: that is pip's own version check after the install, not a requirement's page).
_INDEX_GAVE_NOTHING = re.compile(r"\(from versions: none\)|Could not fetch URL (?!\S*/simple/pip/:)\S+: ",
                                 re.IGNORECASE)
#: Where pip was connecting to, in the order its messages name it best.
_TARGETS = tuple(re.compile(p) for p in (r"Could not fetch URL (\S+?): ", r"Looking in indexes: (\S+)",
                                         r"host='([^']+)'", r"after connection broken by .*': (/\S+)"))


@dataclass(frozen=True, slots=True)
class Diagnosis:
    """What a build log says: the cause, the line that decided it (evidence), the remedy, the kind."""

    kind: FailureKind
    line: str
    cause: Cause = Cause.UNKNOWN
    remedy: str = REMEDIES[Cause.UNKNOWN]

    @property
    def retryable(self) -> bool:
        return self.kind is FailureKind.TRANSIENT

    def one_line(self) -> str:
        """``<cause>: <evidence> (remedy: <remedy>)``: what the record's reason and the summary show."""
        evidence = self.line or "no error line in the log"
        return f"{self.cause.value}: {evidence} (remedy: {self.remedy})"


def diagnose(log: str) -> Diagnosis:
    """The cause of a failed build, from its output (the tail is enough; the whole log works too)."""
    lines = [_strip_prefix(line) for line in log.splitlines() if line.strip()]
    sdist = _sdist_fetch(lines)
    for signature in SIGNATURES:
        if signature is _WHEEL_STUB:
            if sdist is not None:   # wheel-stub's own words, or a download error inside any sdist build
                return sdist
            continue
        evidence = _first_match(lines, signature.patterns)
        if evidence and signature.cause in _CONNECTION_CAUSES and _pip_verdict_stands(lines):
            continue   # pip recovered from this connection trouble: its verdict below decides
        if evidence:
            if signature.cause in _CONNECTION_CAUSES:
                evidence = _with_target(evidence, lines)
            return Diagnosis(signature.kind, evidence, signature.cause, _remedy(signature.cause, lines))
    return Diagnosis(FailureKind.UNKNOWN, last_error_line(log), Cause.UNKNOWN, REMEDIES[Cause.UNKNOWN])


#: pip's own words while its resolver backtracks (it prints them and keeps going, sometimes for hours).
_BACKTRACKING = re.compile(r"(This is taking longer than usual|pip is looking at multiple versions of ([\w.-]+))")


def backtracking_note(tail: str) -> str:
    """For a build that ran out of time: "while pip was backtracking (...)" when the log says so, else "".

    A step that still resolves inside the image (a build with --no-lock) can spend its whole limit
    in pip's resolver; the timeout alone would hide that.
    """
    lines = [_strip_prefix(line) for line in tail.splitlines()]
    packages = list(dict.fromkeys(m.group(2) for line in lines if (m := _BACKTRACKING.search(line)) and m.group(2)))
    if not packages and not any(_BACKTRACKING.search(line) for line in lines):
        return ""
    through = f" through {', '.join(packages[:6])}{' ...' if len(packages) > 6 else ''}" if packages else ""
    said = _trim(next(line for line in reversed(lines) if _BACKTRACKING.search(line)))
    return (f'while pip was backtracking{through} (the log: "{said}"); build with the stack lock (the default, '
            "not --no-lock): it resolves on the host in seconds and no image step resolves")


def last_error_line(tail: str) -> str:
    """The last line that looks like an error, else the last non-empty line (trimmed to 300 chars)."""
    lines = [_strip_prefix(line) for line in tail.splitlines() if line.strip()]
    for line in reversed(lines):
        if _ERROR_LINE.search(line):
            return _trim(line)
    return _trim(lines[-1]) if lines else ""


def _pip_verdict_stands(lines: list[str]) -> bool:
    """pip gave a verdict (no such version, conflict) and the index did answer it.

    A connection failure is the cause only when pip got nothing from an index ("(from versions:
    none)", "Could not fetch URL ...") or said nothing itself; a retry warning it got past is not.
    """
    verdict = any(_first_match(lines, signature.patterns)
                  for signature in SIGNATURES if signature.cause in _VERDICT_CAUSES)
    return verdict and not any(_INDEX_GAVE_NOTHING.search(line) for line in lines)


def _sdist_fetch(lines: list[str]) -> Diagnosis | None:
    """An sdist's build step failed and its own output shows a download error, or says it downloads."""
    placeholder = _first_match(lines, _WHEEL_STUB.patterns)
    if placeholder:
        return Diagnosis(FailureKind.PERMANENT, placeholder, Cause.SDIST_BUILD_FETCH,
                         _remedy(Cause.SDIST_BUILD_FETCH, lines))
    for index, line in enumerate(lines):
        if _SDIST_FAILED.search(line):
            # pip prints the subprocess's output right after the "did not run successfully" line.
            inside = lines[index + 1:]
            end = next((i for i, text in enumerate(inside) if "[end of output]" in text), len(inside))
            fetch = next((text for text in reversed(inside[:end]) if _SDIST_FETCH_ERROR.search(text)), None)
            if fetch is not None:
                return Diagnosis(FailureKind.PERMANENT, _trim(f"{line.lstrip('× ')} {fetch}"),
                                 Cause.SDIST_BUILD_FETCH, REMEDIES[Cause.SDIST_BUILD_FETCH])
    return None


def _with_target(evidence: str, lines: list[str]) -> str:
    """``evidence (<url or host>)`` when the log says where pip was connecting to."""
    for pattern in _TARGETS:
        for line in lines:
            found = pattern.search(line)
            if found:
                return _trim(f"{evidence} ({found.group(1)})")
    return evidence


def _remedy(cause: Cause, lines: list[str]) -> str:
    """The cause's remedy, made concrete where the log names what to pass (a placeholder's index)."""
    if cause is Cause.SDIST_BUILD_FETCH:
        # The placeholder's message wraps its sentence over two lines.
        found = _PLACEHOLDER_INDEX.search(" ".join(lines) + " ")
        if found:
            return (f"the package is an sdist that downloads its wheel from {found.group(1)} while it builds: "
                    f"pass --extra-index-url {found.group(1)} (pip then takes the wheel directly) or put "
                    f"the wheel in --find-links")
    return REMEDIES[cause]


def _first_match(lines: list[str], patterns: tuple[re.Pattern[str], ...]) -> str:
    """The first line matched by the first pattern that matches anywhere (patterns in evidence order)."""
    for pattern in patterns:
        for line in lines:
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
