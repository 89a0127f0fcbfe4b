"""The wheel tier's readers: one pure function per (fact, distribution).

Each module reads one distribution's unpacked wheel (:mod:`.flashinfer` for flashinfer-python,
:mod:`.sglang` for sglang, :mod:`.metadata` for any distribution's METADATA, :mod:`.binaries` for the
compiled code of torch and the kernel packages, read by HTTP ranges) and exports
``READERS``, a tuple of :class:`~stackforge.core.wheel_readings.ReaderSpec` built by
:func:`._reader.specs` from each reader's :func:`._reader.reads` declaration. This registry joins them;
:func:`reader_for` is the one lookup the tier, ``bisect`` and ``compat verify`` use.
"""

from __future__ import annotations

from stackforge.core.errors import SpecError
from stackforge.core.wheel_readings import ReaderSpec
from stackforge.wheels.readers import binaries, flashinfer, metadata, sglang

READERS: tuple[ReaderSpec, ...] = flashinfer.READERS + sglang.READERS + metadata.READERS + binaries.READERS


def reader_for(fact: str, dist: str) -> ReaderSpec:
    """The reader of ``fact`` in ``dist``'s wheel; bad input (exit 2) naming the known ones otherwise."""
    for spec in READERS:
        if spec.fact == fact and spec.dist == dist:
            return spec
    known = ", ".join(sorted(spec.fact for spec in READERS if spec.dist == dist))
    if known:
        raise SpecError(f"no wheel reader for fact {fact!r} of {dist}", remedy=f"facts read from {dist}: {known}")
    dists = ", ".join(sorted({spec.dist for spec in READERS}))
    raise SpecError(f"no wheel reader for distribution {dist!r}", remedy=f"distributions with readers: {dists}")
