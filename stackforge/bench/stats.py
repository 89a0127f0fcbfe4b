"""Statistics over repeated measurements, and the physical link peaks that give them context.

Everything here is a pure function of its arguments. A bench reports the *median* of its repeats
(robust to one slow outlier such as a clock ramp or a page fault), the min and max, and the
coefficient of variation, so a reader can tell a real regression from noise (sglang#24563:
"bugs can hide within the noise"). The statistics are computed by ``_sfshared.summarize``
(``stackforge/inimage/_sfshared.py``), which the in-image bench scripts import too;
:func:`summarize` gives its result a type.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass

from stackforge.inimage import _sfshared


@dataclass(frozen=True, slots=True)
class Summary:
    """Spread of one measurement over its repeats (warm-up runs already dropped).

    Attributes:
        n: number of samples.
        median, minimum, maximum, mean: in the unit of the samples.
        stdev: sample standard deviation (n-1 in the denominator); 0.0 for a single sample.
        cv: coefficient of variation, ``stdev / mean``; 0.0 for a single sample or a zero mean.
    """

    n: int
    median: float
    minimum: float
    maximum: float
    mean: float
    stdev: float
    cv: float

    def to_json(self) -> dict[str, float]:
        return asdict(self)


def summarize(samples: Sequence[float]) -> Summary:
    """Median, min, max, mean, sample stdev and coefficient of variation of ``samples``.

    Raises:
        ValueError: no samples, or a sample that is not a finite number.
    """
    return Summary(**_sfshared.summarize(samples))


def drop_warmup(samples: Sequence[float], warmup: int) -> tuple[float, ...]:
    """The samples after the first ``warmup`` ones (JIT, allocator and clock warm-up are not data).

    Raises:
        ValueError: a negative warm-up count, or nothing left after dropping it.
    """
    if warmup < 0:
        raise ValueError(f"warmup must be >= 0, got {warmup}")
    kept = tuple(samples[warmup:])
    if not kept:
        raise ValueError(f"no samples left after dropping {warmup} warm-up run(s) of {len(samples)}")
    return kept


def repeat(measure: Callable[[], float], *, repeats: int, warmup: int = 1) -> tuple[float, ...]:
    """Call ``measure`` ``warmup`` times (results discarded), then ``repeats`` times; return those.

    Raises:
        ValueError: ``repeats`` < 1 or ``warmup`` < 0.
    """
    if repeats < 1:
        raise ValueError(f"repeats must be >= 1, got {repeats}")
    samples = [measure() for _ in range(warmup + repeats)]
    return drop_warmup(samples, warmup)


# ------------------------------------------------------------------------------------ physical peaks


@dataclass(frozen=True, slots=True)
class LinkPeak:
    """The nominal one-direction bandwidth of one GPU's link, to put a measured busbw in context.

    Attributes:
        name: e.g. ``"PCIe Gen5 x16"`` or ``"NVLink 4"``.
        gbps: GB/s (1e9 bytes) in one direction, per GPU -- the unit nccl-tests' busbw compares to.
        source: where the number comes from.
    """

    name: str
    gbps: float
    source: str

    def to_json(self) -> dict[str, object]:
        return asdict(self)


# PCIe: per lane, GT/s x 128b/130b line code / 8 bits (Gen3 and later use 128b/130b; PCI-SIG
# base specifications 3.0/4.0/5.0). x16 Gen4 = 31.5 GB/s and Gen5 = 63.0 GB/s per direction,
# before packet (TLP/DLLP) overhead, which real DMA traffic also pays (~ 80-90 % is achievable).
_PCIE_GT_PER_S = {3: 8.0, 4: 16.0, 5: 32.0}
_PCIE_SOURCE = "PCI-SIG base spec: {gt:g} GT/s per lane, 128b/130b encoding, 16 lanes, one direction"


def pcie_x16_gbps(generation: int) -> float:
    """One-direction bandwidth of a PCIe x16 link of ``generation`` (3, 4 or 5) in GB/s.

    Raises:
        ValueError: a generation without a 128b/130b rate in this table.
    """
    if generation not in _PCIE_GT_PER_S:
        raise ValueError(f"unknown PCIe generation {generation!r}; known: {sorted(_PCIE_GT_PER_S)}")
    return _PCIE_GT_PER_S[generation] * 16 * (128 / 130) / 8


def pcie_peak(generation: int) -> LinkPeak:
    """:class:`LinkPeak` of a PCIe x16 link."""
    return LinkPeak(f"PCIe Gen{generation} x16", pcie_x16_gbps(generation),
                    _PCIE_SOURCE.format(gt=_PCIE_GT_PER_S.get(generation, 0)))


# NVLink: NVIDIA quotes the per-GPU *total* (both directions) bandwidth; busbw is one direction,
# so the peak is half the quoted figure. A measured NVLS all-reduce can exceed it because the
# switch does the reduction (nccl-tests#153), which is why the algorithm is recorded beside busbw.
NVLINK_PEAKS: dict[int, LinkPeak] = {
    3: LinkPeak("NVLink 3", 300.0, "NVIDIA A100 datasheet: NVLink 600 GB/s per GPU (12 links x 50 GB/s, "
                                   "both directions); 300 GB/s one direction"),
    4: LinkPeak("NVLink 4", 450.0, "NVIDIA H100 datasheet: NVLink 900 GB/s per GPU (18 links x 50 GB/s, "
                                   "both directions); 450 GB/s one direction"),
    5: LinkPeak("NVLink 5", 900.0, "NVIDIA Blackwell (B200) datasheet: fifth-generation NVLink 1.8 TB/s per "
                                   "GPU (18 links x 100 GB/s, both directions); 900 GB/s one direction"),
}

# Which link generation a GPU generation carries (compute capability major.minor -> generation).
# PCIe: Volta/Turing Gen3, Ampere/Ada Gen4, Hopper and Blackwell (incl. RTX PRO 6000, sm_120) Gen5.
_PCIE_GEN_BY_ARCH = {"7.0": 3, "7.5": 3, "8.0": 4, "8.6": 4, "8.7": 4, "8.9": 4, "9.0": 5,
                     "10.0": 5, "10.3": 5, "12.0": 5, "12.1": 5}
# SXM parts with NVSwitch/NVLink: A100 (8.0) NVLink 3, H100/H200 (9.0) NVLink 4, B200/B300 (10.x) 5.
# Consumer/workstation parts (8.6, 8.9, 12.x) have no such NVLink: no peak rather than a wrong one.
_NVLINK_GEN_BY_ARCH = {"8.0": 3, "9.0": 4, "10.0": 5, "10.3": 5}


def link_peak_for(interconnect: str, arch: str) -> LinkPeak | None:
    """The per-GPU one-direction link peak of a target, or ``None`` when it is not known.

    Args:
        interconnect: ``"pcie"``, ``"nvlink"`` or ``"nvswitch"`` (a :class:`stackforge.core.model.Interconnect`
            value).
        arch: compute capability ``"major.minor"``, e.g. ``"12.0"``.
    """
    if interconnect == "pcie":
        generation = _PCIE_GEN_BY_ARCH.get(arch)
        return pcie_peak(generation) if generation is not None else None
    if interconnect in ("nvlink", "nvswitch"):
        generation = _NVLINK_GEN_BY_ARCH.get(arch)
        return NVLINK_PEAKS[generation] if generation is not None else None
    return None


def efficiency(measured_gbps: float, peak_gbps: float) -> float:
    """Measured bandwidth as a fraction of the peak (``busbw / peak``); may exceed 1 with NVLS.

    Raises:
        ValueError: a non-positive peak.
    """
    if peak_gbps <= 0:
        raise ValueError(f"peak must be positive, got {peak_gbps!r}")
    return measured_gbps / peak_gbps
