"""Repeat statistics and the physical link peaks used to read a busbw."""

from __future__ import annotations

import itertools
import statistics

import pytest

from stackforge.bench import stats


def test_summarize_known_values():
    s = stats.summarize([3.0, 1.0, 2.0, 10.0])
    assert (s.n, s.median, s.minimum, s.maximum, s.mean) == (4, 2.5, 1.0, 10.0, 4.0)
    assert s.stdev == pytest.approx(statistics.stdev([3.0, 1.0, 2.0, 10.0]))
    assert s.cv == pytest.approx(s.stdev / 4.0)


def test_summarize_single_and_constant_samples_have_no_spread():
    assert stats.summarize([7.5]).cv == 0.0
    assert stats.summarize([2.0, 2.0, 2.0]).cv == 0.0
    assert stats.summarize([0.0, 0.0]).cv == 0.0   # zero mean: no division by zero


def test_median_resists_one_outlier_but_cv_shows_it():
    quiet = stats.summarize([10.0, 10.1, 9.9, 10.0, 10.0])
    noisy = stats.summarize([10.0, 10.1, 9.9, 10.0, 50.0])
    assert noisy.median == quiet.median == 10.0
    assert noisy.cv > 10 * quiet.cv


def test_summarize_rejects_empty_and_non_finite():
    with pytest.raises(ValueError, match="zero samples"):
        stats.summarize([])
    with pytest.raises(ValueError, match="finite"):
        stats.summarize([1.0, float("inf")])


def test_coefficient_of_variation():
    assert stats.summarize([1.0, 3.0]).cv == pytest.approx(statistics.stdev([1.0, 3.0]) / 2.0)


def test_drop_warmup():
    assert stats.drop_warmup([100.0, 1.0, 2.0], 1) == (1.0, 2.0)
    assert stats.drop_warmup([1.0, 2.0], 0) == (1.0, 2.0)
    with pytest.raises(ValueError, match="no samples left"):
        stats.drop_warmup([1.0], 1)
    with pytest.raises(ValueError):
        stats.drop_warmup([1.0], -1)


def test_repeat_discards_warmup_calls():
    counter = itertools.count(1)
    samples = stats.repeat(lambda: float(next(counter)), repeats=3, warmup=2)
    assert samples == (3.0, 4.0, 5.0)
    with pytest.raises(ValueError):
        stats.repeat(lambda: 1.0, repeats=0)


def test_pcie_x16_one_direction():
    # 16 GT/s x 16 lanes x 128/130 / 8 bits = 31.5 GB/s; Gen5 doubles it; Gen3 halves it.
    assert stats.pcie_x16_gbps(4) == pytest.approx(31.5077, abs=1e-3)
    assert stats.pcie_x16_gbps(5) == pytest.approx(63.0154, abs=1e-3)
    assert stats.pcie_x16_gbps(3) == pytest.approx(15.7538, abs=1e-3)
    with pytest.raises(ValueError):
        stats.pcie_x16_gbps(7)


def test_nvlink_peaks_are_half_the_quoted_bidirectional_figures():
    quoted_total = {3: 600.0, 4: 900.0, 5: 1800.0}   # A100, H100, B200 datasheets, GB/s per GPU
    for generation, total in quoted_total.items():
        peak = stats.NVLINK_PEAKS[generation]
        assert peak.gbps == total / 2
        assert "datasheet" in peak.source


def test_link_peak_for_targets():
    assert stats.link_peak_for("pcie", "12.0").name == "PCIe Gen5 x16"     # RTX PRO 6000
    assert stats.link_peak_for("pcie", "8.9").name == "PCIe Gen4 x16"      # L40S / 4090
    assert stats.link_peak_for("nvswitch", "9.0").gbps == 450.0            # H100/H200 NVLink 4
    assert stats.link_peak_for("nvswitch", "10.0").gbps == 900.0           # B200 NVLink 5
    assert stats.link_peak_for("nvlink", "8.0").gbps == 300.0              # A100 NVLink 3
    assert stats.link_peak_for("nvlink", "12.0") is None                   # no such part: no number
    assert stats.link_peak_for("pcie", "99.0") is None
    assert stats.link_peak_for("infiniband", "9.0") is None


def test_efficiency():
    assert stats.efficiency(31.5, 63.0) == 0.5
    assert stats.efficiency(480.0, 450.0) > 1.0   # NVLS reduces in the switch: allowed, not clamped
    with pytest.raises(ValueError):
        stats.efficiency(1.0, 0.0)
