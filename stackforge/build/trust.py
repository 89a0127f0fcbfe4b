"""Which CA bundle a build trusts: ``--ca-bundle PATH``, ``--ca-bundle none``, or the one pip here trusts.

Behind a TLS re-signing proxy pip on the host works because its configuration names the proxy's CA;
a build that does not get the same bundle fails with ``certificate verify failed`` (see
:mod:`stackforge.build.classify`). So ``build`` and ``render`` default to the bundle pip on this
host is configured with (pip's ``cert`` setting, ``PIP_CERT`` first, as pip reads it: see
:mod:`stackforge.edges.pip_config`), then ``REQUESTS_CA_BUNDLE``. ``--ca-bundle none`` turns that off; an
explicit path wins. Only the path is ever shown; the bundle reaches builds as a BuildKit secret or
through the classic builder's asset server, never as a layer, label or log line.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from enum import Enum
from pathlib import Path

from stackforge.core.errors import SpecError
from stackforge.edges.pip_config import PipSetting, read_pip_config, trusted_ca_bundles

#: ``--ca-bundle none``: build without any CA bundle, even when pip here has one.
NO_CA_BUNDLE = "none"


class CaSource(str, Enum):
    """Where the CA bundle of a build came from."""

    OPTION = "--ca-bundle"
    PIP_CONFIG = "pip config cert"
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


def choose_ca_bundle(option: str | None, *, pip_cert: PipSetting | None, environ: Mapping[str, str]) -> CaChoice:
    """The bundle for ``--ca-bundle`` given as ``option`` (None when not given).

    Defaults are taken only when they name an existing file; an explicit path that is not a file is
    an error.

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
    for candidate in trusted_ca_bundles(pip_cert, environ):
        if Path(candidate.value).is_file():
            return CaChoice(Path(candidate.value), _ca_source(candidate.origin))
    return CaChoice(None, CaSource.NOT_FOUND)


def _ca_source(origin: str) -> CaSource:
    """The CaSource of a :func:`~stackforge.edges.pip_config.trusted_ca_bundles` entry's origin."""
    if origin in (CaSource.PIP_CERT.value, CaSource.REQUESTS_CA_BUNDLE.value):
        return CaSource(origin)
    return CaSource.PIP_CONFIG


def resolve_ca_bundle(option: str | None, environ: Mapping[str, str]) -> CaChoice:
    """:func:`choose_ca_bundle` with pip asked for its ``cert`` only when the option is not given."""
    pip_cert = read_pip_config().setting("cert", environ) if option is None else None
    return choose_ca_bundle(option, pip_cert=pip_cert, environ=environ)
