"""The resolver edge: ``uv pip compile`` on the host, answering PEP 751 ``pylock.toml`` text.

uv is a dependency of stackforge (the ``uv`` wheel carries the binary): it resolves a full stack in
seconds where pip's resolver can backtrack for an hour, reads the same indexes, find-links and CA
bundle, resolves for another Python and platform than the host's (``--python-version``,
``--python-platform``), and writes the standard lock format with every file's sha256. Nothing here
touches Docker or the image; the one subprocess goes through :mod:`stackforge.edges.runner`.
"""

from __future__ import annotations

import re
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from stackforge.core.errors import CommandError, HostError, SpecError
from stackforge.edges import runner
from stackforge.edges.pip_config import redact_urls

DEFAULT_RESOLVE_TIMEOUT_S = 300.0
_UNREACHABLE = re.compile(r"(error sending request|dns error|failed to lookup address|Connection refused|"
                          r"tcp connect error|Network is unreachable|operation timed out|Could not connect)",
                          re.IGNORECASE)
_URL = re.compile(r"https?://[^\s`'\")]+")


class ResolutionConflict(SpecError):
    """The stack's requirements cannot be satisfied together (the resolver's words are the message).

    ``explanation`` is the resolver's account alone, without the requirements it was given.
    """

    def __init__(self, message: str, *, explanation: str = "", remedy: str = "") -> None:
        super().__init__(message, remedy=remedy)
        self.explanation = explanation or message


@dataclass(frozen=True, slots=True)
class ResolverIndexes:
    """Where the resolver looks: the same places the image's pip looks."""

    index_url: str | None = None            # None: PyPI
    extra_index_urls: tuple[str, ...] = ()
    find_links: tuple[str, ...] = ()
    ca_bundle: Path | None = None
    cache_dir: Path | None = None            # None: uv's default cache

    @classmethod
    def of_images(cls, index_url: str | None, extra_index_urls: Sequence[str], wheelhouse: Path | None,
                  ca_bundle: Path | None) -> ResolverIndexes:
        """The places an image's pip installs from (``build``/``render`` options), for the resolver."""
        return cls(index_url=index_url, extra_index_urls=tuple(extra_index_urls),
                   find_links=(str(Path(wheelhouse).resolve()),) if wheelhouse else (), ca_bundle=ca_bundle)

    def argv(self) -> list[str]:
        argv = []
        if self.index_url:
            argv += ["--index-url", self.index_url]
        for url in self.extra_index_urls:
            argv += ["--extra-index-url", url]
        for location in self.find_links:
            argv += ["--find-links", location]
        if self.extra_index_urls or self.find_links:
            # pip takes the best version from every index; uv's default stops at the first index that has
            # the package. The lock must hold what the image's pip would pick.
            argv += ["--index-strategy", "unsafe-best-match"]
        return argv


def uv_binary() -> str:
    """The uv executable of the ``uv`` package stackforge depends on (else one on PATH)."""
    try:
        from uv import find_uv_bin
        return find_uv_bin()
    except (ImportError, FileNotFoundError):
        found = runner.which("uv")
        if found:
            return found
    raise HostError("uv is not installed: stackforge resolves stack locks with it",
                    remedy="pip install uv (it is a dependency of stackforge: reinstall stackforge)")


def uv_version() -> str:
    result = runner.run([uv_binary(), "--version"], timeout=30)
    return result.output_tail.strip() if result.succeeded else "uv (version unknown)"


def compile_pylock(requirements: Sequence[str], *, python: str, platform: str, indexes: ResolverIndexes,
                   constraints: Sequence[str] = (), no_deps: bool = False,
                   timeout: float = DEFAULT_RESOLVE_TIMEOUT_S, log_path: Path | None = None) -> str:
    """Resolve ``requirements`` for CPython ``python`` on ``platform``; return the PEP 751 text.

    Raises:
        ResolutionConflict: no set of versions satisfies them (exit 2), with the resolver's explanation.
        HostError: an index could not be reached (exit 3), naming it.
        CommandError: the resolver failed otherwise, or ran past ``timeout``.
    """
    with tempfile.TemporaryDirectory(prefix="stackforge-resolve-") as scratch:
        folder = Path(scratch)
        (folder / "requirements.in").write_text("".join(f"{r}\n" for r in requirements), encoding="utf-8")
        argv = [uv_binary(), "pip", "compile", "requirements.in", "--format", "pylock.toml", "-o", "pylock.toml",
                "--generate-hashes", "--python-version", python, "--python-platform", platform, "--quiet",
                "--no-progress", *indexes.argv()]
        if constraints:
            (folder / "constraints.txt").write_text("".join(f"{c}\n" for c in constraints), encoding="utf-8")
            argv += ["--constraints", "constraints.txt"]
        if no_deps:
            argv.append("--no-deps")
        env = {"UV_NO_CONFIG": "1", "UV_PYTHON_DOWNLOADS": "never"}
        if indexes.cache_dir is not None:
            env["UV_CACHE_DIR"] = str(indexes.cache_dir)
        if indexes.ca_bundle is not None:
            env["SSL_CERT_FILE"] = str(indexes.ca_bundle)   # a path: the bundle's content stays on disk
        result = runner.run(argv, timeout=timeout, env=env, cwd=folder, log_path=log_path, tail_chars=20_000)
        if result.succeeded:
            return (folder / "pylock.toml").read_text(encoding="utf-8")
    raise _failure(result, requirements)


def _failure(result: runner.CommandResult, requirements: Sequence[str]) -> Exception:
    text = redact_urls(result.output_tail)
    if result.timed_out:
        return CommandError(f"the resolver ran past its limit ({result.describe()})",
                            remedy="a network this slow needs --resolve-timeout, or a nearer index")
    if "No solution found" in text:
        explanation = _explanation(text)
        return ResolutionConflict(f"the requirements conflict ({', '.join(requirements)}): {explanation}",
                                  explanation=explanation,
                                  remedy="change the stack's pins (stackforge plan --explain STACK shows the rules)")
    if _UNREACHABLE.search(text):
        urls = _URL.findall(text)
        where = f" ({urls[0]})" if urls else ""
        return HostError(f"the resolver could not reach an index{where}: {_last_error(text)}",
                         remedy="check the network or the index options (--index-url, --extra-index-url, "
                                "--find-links)")
    return CommandError(f"the resolver failed ({result.describe()}): {_last_error(text)}")


def _explanation(text: str) -> str:
    """uv's own account of the conflict, on one line (the lines after 'No solution found')."""
    lines = text[text.index("No solution found"):].splitlines()[1:]
    cleaned = [re.sub(r"^[\s╰─▶│]+", "", line).strip().removeprefix("cause:").strip() for line in lines]
    return " ".join(line for line in cleaned if line and not line.startswith("hint:"))[:1500]


def _last_error(text: str) -> str:
    lines = [line.strip(" ×╰─▶│").removeprefix("cause:").removeprefix("Caused by:").strip()
             for line in text.strip().splitlines() if line.strip()]
    return " / ".join(lines[-3:])[:600] if lines else "no output"
