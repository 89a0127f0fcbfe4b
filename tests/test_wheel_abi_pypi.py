"""Integration: the ABI reading against PyPI itself (network), by HTTP range requests.

One real extension wheel, sglang-kernel 0.4.10 (373 MB, the CUDA 13.1 stack's kernel): its tail
(64 KiB, the central directory with it) and one member, ``sgl_kernel/spatial_ops.abi3.so`` (33 KB
compressed): about 100 KB read in all, 0.03 % of the wheel.
"""

from __future__ import annotations

import pytest

from stackforge.edges.index import IndexConfig, new_session
from stackforge.edges.ranges import RemoteZip
from stackforge.wheels.abi import _Wanted, find_wheel, is_torch_symbol
from stackforge.wheels.elf import dynamic_symbols

pytestmark = pytest.mark.pypi

MEMBER = "sgl_kernel/spatial_ops.abi3.so"


def test_one_member_of_a_real_kernel_wheel_names_its_torch_symbols_for_100_kb(tmp_path):
    indexes = IndexConfig()   # PyPI's simple index: the wheel's URL and sha256 from there
    session = new_session(indexes)
    file = find_wheel(_Wanted("sglang-kernel", "0.4.10", "pypi", "3.11"), indexes=indexes, session=session,
                      cache=tmp_path)
    assert file.url.startswith("https://files.pythonhosted.org/") and len(file.sha256) == 64
    remote = RemoteZip(file.url, session=session)
    assert remote.ranged, "PyPI's file host answers ranges"
    member = next(m for m in remote.members() if m.name == MEMBER)
    read = remote.read_members(lambda name: name == MEMBER,
                               lambda data: dynamic_symbols(data.at, limit=data.size))
    table = read[MEMBER]
    needed = {name for name in table.undefined if is_torch_symbol(name)}
    assert any(name.startswith("_ZN3c10") for name in needed), sorted(table.undefined)[:20]
    assert any(name.startswith(("_ZN5torch", "_ZN2at")) for name in needed)
    assert table.located.startswith("layout")   # its table is at the front: found without .dynamic
    # the tail (64 KiB) and the member's local header and compressed bytes, nothing else
    assert remote.fetched <= 64 * 1024 + member.compressed_size + 1024, remote.fetched
    assert remote.fetched < remote.size / 1000
