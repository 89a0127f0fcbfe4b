"""Which CA bundle a build trusts: ``--ca-bundle PATH``, ``--ca-bundle none``, or the one pip here trusts.

Behind a TLS re-signing proxy pip on the host works because its configuration names the proxy's CA;
a build that does not get the same bundle fails with ``certificate verify failed`` (see
:mod:`stackforge.build.classify`). So ``build`` and ``render`` default to the bundle pip on this
host is configured with, looked up in the order scripts/main-job.sh uses: pip's ``global.cert``,
then ``PIP_CERT``, then ``REQUESTS_CA_BUNDLE``. ``--ca-bundle none`` turns that off; an explicit path
wins. Only the path is ever shown; the bundle reaches builds as a BuildKit secret or through the
classic builder's asset server, never as a layer, label or log line.

pip's ``global.cert`` is read by asking pip (``python -m pip config list``) rather than by parsing
its files: pip layers several files (``/etc/xdg/pip/pip.conf``, ``/etc/pip.conf``, the
virtual environment's ``pip.conf``, ``~/.config/pip/pip.conf``, the legacy ``~/.pip/pip.conf``,
``PIP_CONFIG_FILE``, which may also be ``os.devnull`` to mean "none"), honours ``XDG_CONFIG_DIRS``,
and has changed that list across releases. Asking pip gives exactly the answer pip itself uses, for
the pip of the Python stackforge runs in, at the cost of one short subprocess.
"""

from __future__ import annotations

import ast
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from enum import Enum
from pathlib import Path

from stackforge import runner
from stackforge.errors import HostError, SpecError

#: ``--ca-bundle none``: build without any CA bundle, even when pip here has one.
NO_CA_BUNDLE = "none"
PIP_CONFIG_TIMEOUT_S = 60.0


class CaSource(str, Enum):
    """Where the CA bundle of a build came from."""

    OPTION = "--ca-bundle"
    PIP_CONFIG = "pip config global.cert"
    PIP_CERT = "PIP_CERT"
    REQUESTS_CA_BUNDLE = "REQUESTS_CA_BUNDLE"
    DISABLED = "--ca-bundle none"
    NOT_FOUND = "none configured"


@dataclass(frozen=True, slots=True)
class CaChoice:
    """The CA bundle a build uses (None: none) and where it came from."""

    path: Path | None
    source: CaSource

    def describe(self) -> str:
        """One line for the terminal and the logs: the path and its source, never the content."""
        if self.path is None:
            return f"CA bundle: none ({self.source.value})"
        return f"CA bundle: {self.path} (from {self.source.value})"


def choose_ca_bundle(option: str | None, *, pip_cert: str | None, environ: Mapping[str, str]) -> CaChoice:
    """The bundle for ``--ca-bundle`` given as ``option`` (None when not given).

    Defaults are taken only when they name an existing file (as scripts/main-job.sh does); an explicit
    path that is not a file is an error.

    Raises:
        SpecError: an explicit ``--ca-bundle`` that is not a file.
    """
    if option is not None:
        if option.strip().lower() == NO_CA_BUNDLE:
            return CaChoice(None, CaSource.DISABLED)
        path = Path(option)
        if not path.is_file():
            raise SpecError(f"--ca-bundle {option}: no such file",
                            remedy=f"give a PEM bundle, or --ca-bundle {NO_CA_BUNDLE} to build without one")
        return CaChoice(path, CaSource.OPTION)
    candidates = ((pip_cert, CaSource.PIP_CONFIG), (environ.get("PIP_CERT"), CaSource.PIP_CERT),
                  (environ.get("REQUESTS_CA_BUNDLE"), CaSource.REQUESTS_CA_BUNDLE))
    for value, source in candidates:
        if value and Path(value).is_file():
            return CaChoice(Path(value), source)
    return CaChoice(None, CaSource.NOT_FOUND)


def pip_config_cert(python: str = sys.executable, *, timeout: float = PIP_CONFIG_TIMEOUT_S) -> str | None:
    """pip's ``global.cert`` for ``python``'s pip, or None (not set, no pip, or pip failed)."""
    try:
        result = runner.run([python, "-m", "pip", "config", "list"], timeout=timeout,
                            env={"PIP_DISABLE_PIP_VERSION_CHECK": "1"})
    except HostError:
        return None
    return global_cert(result.output_tail) if result.succeeded else None


def global_cert(config_list: str) -> str | None:
    """The ``global.cert`` value in the output of ``pip config list`` (``key='value'`` lines), or None.

    ``pip config list`` prints the merged configuration (global, user, site files and
    ``PIP_CONFIG_FILE``, each overriding the one before), one line per key. ``pip config get`` is
    no substitute: without ``--global``/``--user``/``--site`` it reads only the user (or site) file,
    so a bundle set in /etc/pip.conf is "No such key" to it.
    """
    for line in config_list.splitlines():
        key, sep, value = line.strip().partition("=")
        if sep and key == "global.cert":
            try:
                parsed = ast.literal_eval(value)
            except (ValueError, SyntaxError):
                return None
            return parsed if isinstance(parsed, str) and parsed else None
    return None


def resolve_ca_bundle(option: str | None, environ: Mapping[str, str]) -> CaChoice:
    """:func:`choose_ca_bundle` with pip asked for its ``global.cert`` only when the option is not given."""
    pip_cert = pip_config_cert() if option is None else None
    return choose_ca_bundle(option, pip_cert=pip_cert, environ=environ)
