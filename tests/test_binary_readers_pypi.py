"""Integration: the binary readers against PyPI itself (network), by HTTP range requests, bounded.

sglang-kernel 0.4.10 (373 MB): the tail and its smallest shared object, ``sgl_kernel/spatial_ops.abi3.so``
(about 33 KB compressed), inflated and its fatbins parsed: about 100 KB read. flashinfer-cubin 0.6.13
(458 MB): the central directory only (about 4 MB: 15,970 members).
"""

from __future__ import annotations

import pytest

from stackforge.core.wheel_readings import ReadContext, ReadingStatus
from stackforge.edges.index import IndexConfig, new_session
from stackforge.edges.ranges import RemoteZip
from stackforge.wheels.abi import _Wanted, find_wheel
from stackforge.wheels.readers import binaries

pytestmark = pytest.mark.pypi

MEMBER = "sgl_kernel/spatial_ops.abi3.so"
SM120 = ReadContext(arch="12.0", gpu_count=8, interconnect="pcie")


def _remote(dist: str, version: str, tmp_path) -> RemoteZip:
    indexes = IndexConfig()
    session = new_session(indexes)
    file = find_wheel(_Wanted(dist, version, "pypi", "3.11"), indexes=indexes, session=session, cache=tmp_path)
    remote = RemoteZip(file.url, session=session)
    assert remote.ranged, "PyPI's file host answers ranges"
    return remote


def test_the_fatbins_of_one_real_kernel_object_for_100_kb(tmp_path):
    remote = _remote("sglang-kernel", "0.4.10", tmp_path)
    member = next(m for m in remote.members() if m.name == MEMBER)
    code = remote.read_members(lambda name: name == MEMBER,
                               lambda data: binaries.member_code(data, remote, 160 << 20))[MEMBER]
    assert code.complete and "sm_120a" in code.sass and "sm_90a" in code.sass, code
    assert remote.fetched <= 64 * 1024 + 1_300_000 + member.compressed_size + 1024, remote.fetched
    scan = binaries.BinaryScan((code,))
    reading = binaries.read_kernel_coverage(scan, SM120)
    assert reading.status is ReadingStatus.AVAILABLE, reading


def test_a_real_cubin_wheel_read_from_its_central_directory(tmp_path):
    remote = _remote("flashinfer-cubin", "0.6.13", tmp_path)
    scan = binaries.scan_names(remote, 0)
    assert remote.fetched < remote.size / 50, remote.fetched
    archs = {code for member in scan.members for code in member.sass}
    assert {"sm_100a", "sm_100f", "sm_103a"} <= archs, archs
    # the deep-gemm cubins name no arch: nothing covers sm_120 and what is unnamed stays undecided
    assert binaries.read_kernel_coverage(scan, SM120).status is ReadingStatus.UNDECIDED
    assert binaries.read_kernel_coverage(scan, ReadContext("10.0", 8, "nvlink")).status is ReadingStatus.AVAILABLE
