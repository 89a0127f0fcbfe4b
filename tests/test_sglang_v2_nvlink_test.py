"""V2's own NVLink test is one that needs full NVLink by itself: a `world_size > K and not full_nvlink`
in V2's file is the shared PCIe gate (more than K GPUs), never "V2 refuses every PCIe world size"."""

from __future__ import annotations

import ast
import textwrap

from stackforge.inimage import _sglang_source as source


def _line(code: str) -> int:
    return source.nvlink_required_line(ast.parse(textwrap.dedent(code)))


def test_the_shared_world_size_gate_is_not_v2s_own_nvlink_test() -> None:
    assert _line("""
        def can_use(world_size, full_nvlink):
            if world_size > 2 and not full_nvlink:
                return False
            return True
        """) == 0


def test_v2s_own_nvlink_tests_are_found_beside_the_shared_gate() -> None:
    assert _line("""
        if world_size > 2 and not full_nvlink:
            pass
        if full_nvlink != True:
            return
        """) == 4
    assert _line("def ok(full_nvlink):\n    return full_nvlink is True\n") == 2
