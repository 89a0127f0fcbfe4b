"""What pip on this host is configured with (index, extra indexes, find-links, CA bundle), read in one place.

pip is asked (``python -m pip config list``) rather than its files parsed: pip layers several files
(``/etc/xdg/pip/pip.conf``, ``/etc/pip.conf``, the virtual environment's ``pip.conf``,
``~/.config/pip/pip.conf``, the legacy ``~/.pip/pip.conf``, ``PIP_CONFIG_FILE``, which may be
``os.devnull`` to mean "none"), honours ``XDG_CONFIG_DIRS``, and has changed that list across
releases. ``pip config list`` prints the merged result, one ``section.option='value'`` line per key,
with the ``PIP_*`` environment as the ``:env:`` section. ``pip config get`` is no substitute: without
``--global``/``--user``/``--site`` it reads only the user (or site) file, so a bundle set in
/etc/pip.conf is "No such key" to it.

Precedence is pip's own: the environment (``PIP_CERT``) over the ``install`` section over ``global``.
"""

from __future__ import annotations

import ast
import functools
import os
import re
import sys
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from stackforge.core.errors import SpecError, StackforgeError
from stackforge.edges import runner

PIP_CONFIG_TIMEOUT_S = 60.0
#: The index pip asks when nothing says otherwise.
PYPI_SIMPLE = "https://pypi.org/simple"
_SECTION_RANK = {"global": 1, "install": 2, ":env:": 3}


@dataclass(frozen=True, slots=True)
class PipSetting:
    """One option's value and where pip got it (``PIP_INDEX_URL``, ``pip config global.cert``)."""

    value: str
    origin: str


@dataclass(frozen=True, slots=True)
class PipConfig:
    """pip's merged configuration: option name (``index-url``, ``cert``) -> the value pip uses."""

    settings: Mapping[str, PipSetting] = field(default_factory=dict)

    def setting(self, option: str, environ: Mapping[str, str] | None = None) -> PipSetting | None:
        """The value pip would use for ``option``; ``environ``'s ``PIP_<OPTION>`` wins, as in pip."""
        env_name = "PIP_" + option.upper().replace("-", "_")
        if environ and environ.get(env_name):
            return PipSetting(environ[env_name], env_name)
        return self.settings.get(option)

    def values(self, environ: Mapping[str, str] | None = None) -> dict[str, str]:
        """Every option pip would use, as plain values (``environ``'s ``PIP_*`` on top)."""
        merged = {option: setting.value for option, setting in self.settings.items()}
        for name, value in (environ or {}).items():
            if name.startswith("PIP_") and value:
                merged[name[4:].lower().replace("_", "-")] = value
        return merged


def trusted_ca_bundles(pip_cert: PipSetting | None, environ: Mapping[str, str]) -> tuple[PipSetting, ...]:
    """The CA bundles a pip here would trust, first choice first: its ``cert`` setting (``pip_cert``,
    PIP_CERT before the config files), then ``REQUESTS_CA_BUNDLE``, which pip's HTTP client honours."""
    requests_bundle = environ.get("REQUESTS_CA_BUNDLE")
    found = (pip_cert, PipSetting(requests_bundle, "REQUESTS_CA_BUNDLE") if requests_bundle else None)
    return tuple(setting for setting in found if setting is not None)


def parse_pip_config_list(text: str) -> PipConfig:
    """The output of ``pip config list`` as a :class:`PipConfig` (pure)."""
    best: dict[str, tuple[int, PipSetting]] = {}
    for line in text.splitlines():
        key, sep, raw = line.strip().partition("=")
        section, dot, option = key.strip().rpartition(".")
        if not sep or not dot or section not in _SECTION_RANK:
            continue
        value = _unquoted(raw.strip())
        if not value:
            continue
        origin = "PIP_" + option.upper().replace("-", "_") if section == ":env:" else f"pip config {section}.{option}"
        rank = _SECTION_RANK[section]
        if option not in best or rank > best[option][0]:
            best[option] = (rank, PipSetting(value, origin))
    return PipConfig({option: setting for option, (_, setting) in best.items()})


def _unquoted(value: str) -> str:
    """A value as ``pip config list`` prints it (Python's repr: ``'\\nhttps://a\\nhttps://b'`` for a
    multi-line setting) back to the text pip uses; a value that is no Python literal loses its quotes only."""
    try:
        literal = ast.literal_eval(value)
    except (ValueError, SyntaxError, MemoryError, RecursionError):
        literal = None
    if isinstance(literal, str):
        return literal
    if len(value) >= 2 and value[0] == value[-1] and value[0] in "'\"":
        return value[1:-1]
    return value


def without_credentials(url: str) -> str:
    """``url`` without a ``user:password@`` part: index URLs are shown on the terminal, in --json and logs."""
    scheme, sep, rest = url.partition("://")
    host, slash, path = rest.partition("/")
    return f"{scheme}{sep}{host.rpartition('@')[2]}{slash}{path}" if sep else url


# ``scheme://userinfo@``: any URL in a text (an exception's "for url: ...") that carries credentials.
_USERINFO = re.compile(r"(\b[A-Za-z][A-Za-z0-9+.-]*://)[^/\s@]*@")
# ``user:password@host/...`` without a scheme: a registry or cache reference (``--push``, ``ref=`` of
# ``--cache-from``), at the start of the text or after a space, ``,`` or ``=``. The colon is required,
# so ``repo@sha256:...`` (a digest) is no credential.
_REF_USERINFO = re.compile(r"(^|[\s,=])[^/\s@,=:]+:[^/\s@,=]*@")


def redact_urls(text: str, urls: Iterable[str] = ()) -> str:
    """``text`` (an exception's message, a command line) with the credentials of ``urls``, of any URL in
    it and of any ``user:password@host`` reference in it removed. The one redaction of URL credentials:
    every command uses it before it prints or logs an index URL or a registry reference."""
    for url in urls:
        if url and url != without_credentials(url):
            text = text.replace(url, without_credentials(url))
    return _REF_USERINFO.sub(r"\1", _USERINFO.sub(r"\1", text))


def refuse_credentials(value: str, *, what: str, remedy: str) -> None:
    """Raise :class:`SpecError` when ``value`` (an index URL, a ``--push`` prefix, a ``--cache-from``
    value) carries ``user:password@``; the message shows it redacted."""
    if redact_urls(value) != value:
        raise SpecError(f"{what} {redact_urls(value)!r} carries credentials (user:password@), and they would "
                        f"reach the resolver, a log or the image", remedy=remedy)


def read_pip_config(python: str = sys.executable, *, timeout: float = PIP_CONFIG_TIMEOUT_S) -> PipConfig:
    """pip's configuration for ``python``'s pip; empty when pip cannot be asked (no pip, pip failed).

    Asking pip costs a subprocess (~0.7 s); within one process the answer is reused for as long as
    everything pip reads it from is the same: its environment variables and every configuration file
    it reads (path, size, modification time).
    """
    return _pip_config_for(python, timeout, _config_inputs())


def _config_inputs() -> tuple[tuple[str, ...], ...]:
    """What ``pip config list`` depends on: PIP_* and the variables that place its files, and those files' stats."""
    names = ("HOME", "XDG_CONFIG_HOME", "XDG_CONFIG_DIRS", "VIRTUAL_ENV", "APPDATA")
    env = tuple(sorted((k, v) for k, v in os.environ.items() if k.startswith("PIP_") or k in names))
    home = Path(os.environ.get("HOME", "~")).expanduser()
    xdg = os.environ.get("XDG_CONFIG_HOME") or str(home / ".config")
    dirs = (os.environ.get("XDG_CONFIG_DIRS") or "/etc/xdg").split(":")
    files = [*(Path(d) / "pip" / "pip.conf" for d in dirs), Path("/etc/pip.conf"), Path(xdg) / "pip" / "pip.conf",
             home / ".pip" / "pip.conf", Path(sys.prefix) / "pip.conf",
             *([Path(os.environ["PIP_CONFIG_FILE"])] if os.environ.get("PIP_CONFIG_FILE") else [])]
    stats = tuple((str(f), *_stat(f)) for f in files)
    return (tuple(map(str, sum(env, ()))), *stats)


def _stat(path: Path) -> tuple[str, str]:
    try:
        stat = path.stat()
    except OSError:
        return ("absent", "")
    return (str(stat.st_size), str(stat.st_mtime_ns))


@functools.lru_cache(maxsize=16)
def _pip_config_for(python: str, timeout: float, inputs: tuple[tuple[str, ...], ...]) -> PipConfig:
    """``inputs`` is only the cache key (see :func:`_config_inputs`)."""
    try:
        result = runner.run([python, "-m", "pip", "config", "list"], timeout=timeout,
                            env={"PIP_DISABLE_PIP_VERSION_CHECK": "1"})
    except StackforgeError:
        return PipConfig()
    return parse_pip_config_list(result.output_tail) if result.succeeded else PipConfig()
