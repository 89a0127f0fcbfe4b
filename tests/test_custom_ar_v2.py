"""SGLang's CustomAllReduceV2 as the readers and the in-image gate check see it, and an sdist whose
package tree lacks a whole subpackage (issue 33 item 5).

Synthetic trees hold SGLang's own lines (the release each comes from is named above it); the real
wheels from PyPI are read at the bounds (marked ``pypi``).
"""

from __future__ import annotations

import importlib
import subprocess
import sys
import textwrap
import types
import zipfile
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from stackforge.cli import cli
from stackforge.core.wheel_readings import CodeSite, ReadContext, Reading, ReadingStatus
from stackforge.edges.index import IndexConfig, configured_indexes
from stackforge.inimage import _sglang_source as source
from stackforge.wheels.cache import WheelCache
from stackforge.wheels.readers import READERS
from stackforge.wheels.readers import sglang as sg
from stackforge.wheels.readers._ast import missing_subpackage
from stackforge.wheels.tier import read_release
from test_probe_scripts import sglang0523_live_python  # noqa: F401  (SGLang 0.5.23 venv, CPU torch)
from tests._wheel_helpers import COMM_SPEC, LoopbackIndex, make_sdist, serve

COMM = "sglang/srt/distributed/device_communicators"
SCRIPTS = Path(__file__).resolve().parents[1] / "stackforge" / "probes" / "scripts"

PCIE_2 = ReadContext(arch="12.0", gpu_count=2, interconnect="pcie")
PCIE_8 = ReadContext(arch="12.0", gpu_count=8, interconnect="pcie")
NVSWITCH_3 = ReadContext(arch="9.0", gpu_count=3, interconnect="nvswitch", multicast=True)
NVSWITCH_8 = ReadContext(arch="9.0", gpu_count=8, interconnect="nvswitch", multicast=True)
NVSWITCH_16 = ReadContext(arch="9.0", gpu_count=16, interconnect="nvswitch", multicast=True)
NODES = (PCIE_2, PCIE_8, NVSWITCH_3, NVSWITCH_8, NVSWITCH_16)

# sglang 0.5.12 custom_all_reduce.py: the legacy class (its world sizes) and the dispatch, V2 unconditional
DISPATCH_0512 = '''
class CustomAllreduce:
    _SUPPORTED_WORLD_SIZES = [2, 4, 6, 8]


def dispatch_custom_allreduce():
    if _is_cuda and envs.SGLANG_OPT_USE_CUSTOM_ALL_REDUCE_V2.get():
        from .custom_all_reduce_v2 import CustomAllReduceV2

        logger.debug("[AR] Using CustomAllReduceV2 (JIT-compiled)")
        return CustomAllReduceV2

    if _is_cuda or _is_musa:
        return CustomAllreduce
'''
# sglang 0.5.13 custom_all_reduce.py: V2 only when can_use_custom_all_reduce_v2 admits the group
DISPATCH_0513 = '''
class CustomAllreduce:
    _SUPPORTED_WORLD_SIZES = [2, 4, 6, 8]


def dispatch_custom_allreduce(
    group: ProcessGroup,
    device: torch.device,
):
    if _is_cuda and envs.SGLANG_OPT_USE_CUSTOM_ALL_REDUCE_V2.get():
        from .custom_all_reduce_v2 import (
            CustomAllReduceV2,
            can_use_custom_all_reduce_v2,
        )

        if can_use_custom_all_reduce_v2(group=group, device=device):
            logger.debug("[AR] Using CustomAllReduceV2 (JIT-compiled)")
            return CustomAllReduceV2

    if _is_cuda or _is_musa:
        return CustomAllreduce
'''
# sglang 0.5.11 custom_all_reduce.py: V2 opt-in
DISPATCH_0511 = '''
class CustomAllreduce:
    _SUPPORTED_WORLD_SIZES = [2, 4, 6, 8]


def dispatch_custom_allreduce():
    if _is_cuda and get_bool_env_var("SGLANG_USE_JIT_ALL_REDUCE", default="false"):
        from .custom_all_reduce_v2 import CustomAllReduceV2

        return CustomAllReduceV2

    if _is_cuda or _is_musa:
        return CustomAllreduce
'''
# sglang 0.5.12 custom_all_reduce_v2.py:41-50 and _init_config (one branch of its two)
V2_0512 = '''
class CustomAllReduceV2:
    def __init__(self, group, device, max_pull_size=None, max_push_size=None):
        _init_config()
        self.disabled = True
        full_nvlink = can_use_custom_all_reduce_with_nvlink(
            group=group,
            device=device,
            supported_world_size=list(THRESHOLD_2_SHOT_MAP.keys()),
            cls_name="CustomAllReduceV2",
        )
        if full_nvlink != True:
            return


def _init_config():
    global THRESHOLD_2_SHOT_MAP
    THRESHOLD_2_SHOT_MAP = {
        2: ModeConfig(2 * MB, INF),
        3: ModeConfig(512 * KB, 512 * KB),
        4: ModeConfig(384 * KB, 256 * KB),
        5: ModeConfig(256 * KB, 256 * KB),
        6: ModeConfig(192 * KB, 192 * KB),
        7: ModeConfig(192 * KB, 192 * KB),
        8: ModeConfig(160 * KB, 160 * KB),
    }


THRESHOLD_2_SHOT_MAP: Dict[int, ModeConfig] = {}
'''
# sglang 0.5.13 custom_all_reduce_v2.py:200-212 (the map as in 0.5.12)
V2_0513 = V2_0512.replace("        if full_nvlink != True:\n            return\n", "") + '''

def can_use_custom_all_reduce_v2(group, device) -> bool:
    full_nvlink = can_use_custom_all_reduce_with_nvlink(
        group=group,
        device=device,
        supported_world_size=list(THRESHOLD_2_SHOT_MAP.keys()),
        cls_name="CustomAllReduceV2",
    )
    return full_nvlink is True
'''
# sglang 0.5.23 custom_all_reduce_v2.py:582-597: the world sizes come from a per-arch config function
V2_0523 = '''
def can_use_custom_all_reduce_v2(group, device) -> bool:
    supported = get_supported_world_sizes()
    if dist.get_world_size(group=group) not in supported:
        return False
    full_nvlink = can_use_custom_all_reduce_with_nvlink(
        group=group,
        device=device,
        supported_world_size=list(supported),
        cls_name="CustomAllReduceV2",
    )
    return full_nvlink is True
'''
# sglang 0.5.12 custom_all_reduce_utils.py:464-470 (the shared gate)
UTILS = '''
def can_use_custom_all_reduce_with_nvlink(group, device, supported_world_size, cls_name):
    if world_size not in supported_world_size:
        logger.warning(
            f"{cls_name} is disabled due to an unsupported world"
            f" size: {world_size}. Supported world sizes: {supported_world_size}. "
        )
        return
    full_nvlink = is_full_nvlink(physical_device_ids, world_size)
    if world_size > 2 and not full_nvlink:
        logger.warning(
            f"{cls_name} is disabled because it's not supported on"
            " more than two PCIe-only GPUs. To silence this warning, "
            "specify disable_custom_all_reduce=True explicitly."
        )
        return
'''
ENVIRON = '''
class Envs:
    SGLANG_OPT_USE_CUSTOM_ALL_REDUCE_V2 = EnvBool({default})
'''


def write(root: Path, relative: str, text: str) -> None:
    path = root / relative
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(textwrap.dedent(text).lstrip("\n"), encoding="utf-8")


def tree(root: Path, dispatch: str, v2: str | None, *, default: bool = True) -> Path:
    write(root, f"{COMM}/custom_all_reduce.py", dispatch)
    write(root, f"{COMM}/custom_all_reduce_utils.py", UTILS)
    write(root, "sglang/srt/environ.py", ENVIRON.format(default=default))
    if v2 is not None:
        write(root, f"{COMM}/custom_all_reduce_v2.py", v2)
    return root


def read(root: Path, ctx: ReadContext) -> Reading:
    spec = next(s for s in sg.READERS if s.fact == "custom-allreduce")
    reading = spec.reader(root, ctx)
    for found in reading.sites:   # every cited line is the file's line
        if found.line:
            assert found.code == (root / found.path).read_text().splitlines()[found.line - 1].strip(), found
    return reading


A, U, D = ReadingStatus.AVAILABLE, ReadingStatus.UNAVAILABLE, ReadingStatus.UNDECIDED
RELEASES = {   # shape -> (dispatch, V2 file, readings at NODES)
    "0.5.11": (DISPATCH_0511, V2_0512, (A, U, U, A, U)),
    "0.5.12": (DISPATCH_0512, V2_0512, (U, U, A, A, U)),
    "0.5.13": (DISPATCH_0513, V2_0513, (A, U, A, A, U)),
    # V2 kept only when the per-arch sizes admit; the legacy class admits 8 GPUs either way
    "0.5.23": (DISPATCH_0513, V2_0523, (A, U, D, A, D)),
}


class TestReader:
    @pytest.mark.parametrize("release", RELEASES)
    def test_each_release_shape(self, tmp_path: Path, release: str) -> None:
        dispatch, v2, expected = RELEASES[release]
        root = tree(tmp_path, dispatch, v2)
        got = tuple(read(root, ctx).status for ctx in NODES)
        assert got == expected, release

    def test_two_pcie_gpus_under_a_v2_without_fallback_cite_the_nvlink_test(self, tmp_path: Path) -> None:
        reading = read(tree(tmp_path, DISPATCH_0512, V2_0512), PCIE_2)
        assert reading.status is U
        assert "needs full NVLink" in reading.summary and "no fallback to CustomAllreduce" in reading.summary
        codes = [s.code for s in reading.sites]
        assert "if full_nvlink != True:" in codes
        assert "if _is_cuda and envs.SGLANG_OPT_USE_CUSTOM_ALL_REDUCE_V2.get():" in codes

    def test_the_fallback_is_cited_where_v2_refuses(self, tmp_path: Path) -> None:
        reading = read(tree(tmp_path, DISPATCH_0513, V2_0513), PCIE_2)
        assert reading.status is A
        assert "if can_use_custom_all_reduce_v2(group=group, device=device):" in [s.code for s in reading.sites]
        assert "falls back to CustomAllreduce" in reading.summary

    def test_a_v2_switched_off_by_default_is_the_legacy_class(self, tmp_path: Path) -> None:
        # the decision follows the switch's default, not a release number
        root = tree(tmp_path, DISPATCH_0512, V2_0512, default=False)
        assert read(root, PCIE_2).status is A
        assert read(root, NVSWITCH_3).status is U
        assert "CustomAllReduceV2" not in read(root, PCIE_2).summary

    def test_a_switch_not_read_is_undecided(self, tmp_path: Path) -> None:
        root = tree(tmp_path, DISPATCH_0512.replace("envs.SGLANG_OPT_USE_CUSTOM_ALL_REDUCE_V2.get()",
                                                    "use_v2()"), V2_0512)
        reading = read(root, PCIE_2)
        assert reading.status is D and "switch" in reading.summary

    def test_no_v2_file_behind_a_default_switch_is_undecided(self, tmp_path: Path) -> None:
        assert read(tree(tmp_path, DISPATCH_0512, None), PCIE_2).status is D

    def test_the_gate_reads_v2_sizes_and_lines(self, tmp_path: Path) -> None:
        gate = source.custom_ar_gate(str(tree(tmp_path, DISPATCH_0512, V2_0512)))
        assert isinstance(gate, source.CustomArGate) and gate.v2 is not None
        assert gate.v2.sizes == [2, 3, 4, 5, 6, 7, 8] and gate.v2.switch == "SGLANG_OPT_USE_CUSTOM_ALL_REDUCE_V2"
        assert gate.v2.nvlink_line == 11 and gate.v2.fallback_line == 0
        assert gate.decide(2, full_nvlink=False) == "v2-nvlink"
        assert gate.decide(16, full_nvlink=True) == "v2-world-size"


def static_probe(monkeypatch: pytest.MonkeyPatch, root: Path, ctx: ReadContext) -> str:
    """The status of sglang_custom_ar.py's static path over the sglang package under ``root``."""
    (root / "sglang" / "__init__.py").touch()
    monkeypatch.syspath_prepend(str(SCRIPTS))
    monkeypatch.syspath_prepend(str(root))
    importlib.invalidate_caches()
    sf, node_module = importlib.import_module("_sfprobe"), importlib.import_module("_sglang_node")
    node = node_module.Node(sf.parse_arch(ctx.arch), ctx.gpu_count, ctx.interconnect)
    return importlib.import_module("sglang_custom_ar").static_custom_ar(node, "not imported in this test").status


class TestInImageGateCheck:
    @pytest.mark.parametrize("release", RELEASES)
    def test_the_static_path_decides_as_the_reader(self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                   release: str) -> None:
        dispatch, v2, _ = RELEASES[release]
        root = tree(tmp_path, dispatch, v2)
        as_probe = {A: "pass", U: "fail", D: "undecided"}
        for ctx in NODES:
            assert static_probe(monkeypatch, root, ctx) == as_probe[read(root, ctx).status], (release, ctx)


# --------------------------------------------------------------------------------------------
# An sdist lacking a whole subpackage
# --------------------------------------------------------------------------------------------

class TestSdistMissingSubpackage:
    def test_only_a_whole_missing_subpackage_counts(self, tmp_path: Path) -> None:
        write(tmp_path, "flashinfer/__init__.py", "")
        write(tmp_path, "flashinfer/jit/__init__.py", "")
        absent = CodeSite("flashinfer/comm/trtllm_ar.py", 0, "")
        assert missing_subpackage(tmp_path, (CodeSite("flashinfer/jit/comm.py", 0, ""), absent)) == "flashinfer/comm"
        assert missing_subpackage(tmp_path, (CodeSite("flashinfer/jit/comm.py", 0, ""),)) is None   # a file gap
        assert missing_subpackage(tmp_path, (CodeSite("flashinfer/version.py", 0, ""),)) is None   # top level
        # a site naming what a present file lacks is no absence of the file
        assert missing_subpackage(tmp_path, (CodeSite("flashinfer/comm/x.py", 0, "no def f in this file"),)) is None

    def test_the_tier_reads_absent_for_a_missing_subpackage(self, tmp_path: Path) -> None:
        index = LoopbackIndex()
        index.add("flashinfer-python", make_sdist(tmp_path / "w", "flashinfer-python", "0.2.7",
                                                  {"flashinfer/__init__.py": ""}))
        index.add("flashinfer-python", make_sdist(tmp_path / "w", "flashinfer-python", "0.2.8",
                                                  {"flashinfer/__init__.py": "", "flashinfer/jit/__init__.py": ""}))
        url, server = serve(index)
        try:
            indexes = IndexConfig(index_url=url)
            cache = WheelCache.open(indexes, tmp_path / "cache")
            whole = read_release(COMM_SPEC, "0.2.7", PCIE_8, indexes=indexes, cache=cache)
            gap = read_release(COMM_SPEC, "0.2.8", PCIE_8, indexes=indexes, cache=cache)
        finally:
            server.shutdown()
        assert whole.status is ReadingStatus.ABSENT and "no flashinfer/jit/ at all" in whole.summary
        assert gap.status is ReadingStatus.UNDECIDED and "a file an sdist lacks proves nothing" in gap.summary


# --------------------------------------------------------------------------------------------
# Real wheels and sdists from PyPI (network)
# --------------------------------------------------------------------------------------------

SGLANG_VERSIONS = ("0.5.11", "0.5.12", "0.5.12.post1", "0.5.13")


def unpacked_sglang(version: str, into: Path) -> Path:
    """``pip download --no-deps sglang==VERSION`` and the wheel unpacked (never installed)."""
    download = into / "download"
    proc = subprocess.run([sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--only-binary=:all:",
                           f"sglang=={version}", "-d", str(download)], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    root = into / "unpacked"
    with zipfile.ZipFile(next(download.glob("*.whl"))) as archive:
        archive.extractall(root)
    return root


@pytest.fixture(scope="module")
def sglang_wheels(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return {v: unpacked_sglang(v, tmp_path_factory.mktemp(f"sglang-{v}")) for v in SGLANG_VERSIONS}


@pytest.mark.pypi
class TestRealWheels:
    def test_two_pcie_gpus_lose_custom_allreduce_in_0_5_12_only(self, sglang_wheels: dict[str, Path]) -> None:
        got = {v: read(root, PCIE_2) for v, root in sglang_wheels.items()}
        assert {v: r.status for v, r in got.items()} == {"0.5.11": A, "0.5.12": U, "0.5.12.post1": U, "0.5.13": A}
        for version in ("0.5.12", "0.5.12.post1"):
            sites = {(s.path, s.line) for s in got[version].sites}
            assert (f"{COMM}/custom_all_reduce_v2.py", 49) in sites and (f"{COMM}/custom_all_reduce.py", 352) in sites
        assert (f"{COMM}/custom_all_reduce.py", 361) in {(s.path, s.line) for s in got["0.5.13"].sites}

    def test_other_nodes(self, sglang_wheels: dict[str, Path]) -> None:
        for version, root in sglang_wheels.items():
            assert read(root, PCIE_8).status is U, version
            assert read(root, NVSWITCH_8).status is A, version
            assert read(root, NVSWITCH_16).status is U, version
            # V2 admits 3 fully NVLinked GPUs from 0.5.12; the legacy class never did
            assert read(root, NVSWITCH_3).status is (U if version == "0.5.11" else A), version

    def test_flashinfer_0_2_7_sdist_lacks_flashinfer_comm(self, tmp_path: Path) -> None:
        indexes = configured_indexes()
        cache = WheelCache.open(indexes, tmp_path / "cache")
        spec = next(s for s in READERS if s.dist == "flashinfer-python" and s.fact == "flashinfer-pcie-ipc-ar")
        assert read_release(spec, "0.2.7", PCIE_8, indexes=indexes, cache=cache).status is ReadingStatus.ABSENT
        # 0.2.7.post1's sdist has flashinfer/comm without pcie_ipc_ar.py: a file gap, undecided
        assert read_release(spec, "0.2.7.post1", PCIE_8, indexes=indexes, cache=cache).status \
            is ReadingStatus.UNDECIDED


CUSTOM_AR_RULES = ("sglang-custom-ar-v2-pcie-no-fallback", "sglang-custom-ar-pcie-gt2",
                   "sglang-custom-ar-world-size-gt8")


def moved_rule(tmp_path: Path, rule_id: str, bound: str) -> Path:
    """A --compat folder holding one shipped rule with its sglang bound replaced."""
    shipped = yaml.safe_load((Path(__file__).resolve().parents[1] / "compat" / "rules" / "sglang.yaml").read_text())
    (rule,) = [r for r in shipped["rules"] if r["id"] == rule_id]
    rule["when"]["sglang"] = bound
    folder = tmp_path / "compat"
    (folder / "rules").mkdir(parents=True)
    (folder / "rules" / "moved.yaml").write_text(yaml.safe_dump({"schema": 1, "rules": [rule]}, sort_keys=False))
    return folder


@pytest.mark.pypi
class TestCompatVerify:
    def test_the_custom_ar_rules_are_confirmed(self) -> None:
        result = CliRunner().invoke(cli, ["compat", "verify", *[a for r in CUSTOM_AR_RULES for a in ("--rule", r)]])
        assert result.exit_code == 0, result.output
        for rule_id in CUSTOM_AR_RULES:
            assert f"{'CONFIRMED':<14} {rule_id}" in result.output
        assert "0.5.12.post1   last release inside" in result.output
        assert "0.5.13         first release outside" in result.output

    @pytest.mark.parametrize("bound", [">=0.5.11,<0.5.13", ">=0.5.12,<0.5.12.post1", ">=0.5.12,<0.5.14"])
    def test_a_bound_moved_by_one_release_is_wrong(self, tmp_path: Path, bound: str) -> None:
        rule_id = CUSTOM_AR_RULES[0]
        result = CliRunner().invoke(cli, ["--compat", str(moved_rule(tmp_path, rule_id, bound)), "compat", "verify",
                                          "--rule", rule_id])
        assert result.exit_code == 1, result.output
        assert f"{'WRONG':<14} {rule_id}" in result.output


# --------------------------------------------------------------------------------------------
# The in-image gate check's live path: SGLang's dispatch and constructors run for the node
# --------------------------------------------------------------------------------------------
# Executable stand-ins with the control flow of sglang 0.5.12 / 0.5.13 (the files above are excerpts):
# what needs a process group, NVML, a GPU or nvcc raises, as it would without them, unless patched.

LIVE_ENVIRON = '''
class EnvBool:
    def __init__(self, default):
        self.default = default

    def get(self):
        return self.default


class Envs:
    SGLANG_OPT_USE_CUSTOM_ALL_REDUCE_V2 = EnvBool(True)


envs = Envs()
'''
LIVE_UTILS = '''
import logging

import torch

logger = logging.getLogger(__name__)


def in_the_same_node_as(group, source_rank=0):
    raise RuntimeError("needs a process group")


def is_full_nvlink(physical_device_ids, world_size):
    raise RuntimeError("needs NVML")


def can_p2p(rank, world_size):
    raise RuntimeError("needs GPUs")


def can_use_custom_all_reduce_with_nvlink(group, device, supported_world_size, cls_name):
    world_size = torch.distributed.get_world_size(group=group)
    if world_size == 1:
        return
    if not all(in_the_same_node_as(group, source_rank=0)):
        return
    if world_size not in supported_world_size:
        logger.warning(f"{cls_name} is disabled due to an unsupported world size: {world_size}.")
        return
    full_nvlink = is_full_nvlink(list(range(world_size)), world_size)
    if world_size > 2 and not full_nvlink:
        logger.warning(f"{cls_name} is disabled because it's not supported on more than two PCIe-only GPUs.")
        return
    if not can_p2p(0, world_size):
        return
    return full_nvlink
'''
LIVE_LEGACY = '''
import logging

from sglang.srt.environ import envs

from .custom_all_reduce_utils import can_use_custom_all_reduce_with_nvlink

logger = logging.getLogger(__name__)
_is_cuda = False
_is_musa = False


class CustomAllreduce:
    _SUPPORTED_WORLD_SIZES = [2, 4, 6, 8]

    def __init__(self, group, device):
        self.disabled = True
        full_nvlink = can_use_custom_all_reduce_with_nvlink(
            group=group, device=device, supported_world_size=self._SUPPORTED_WORLD_SIZES, cls_name="CustomAllreduce")
        if full_nvlink is None:
            return
        self.disabled = False
'''
LIVE_DISPATCH = {
    "0.5.12": '''

def dispatch_custom_allreduce():
    if _is_cuda and envs.SGLANG_OPT_USE_CUSTOM_ALL_REDUCE_V2.get():
        from .custom_all_reduce_v2 import CustomAllReduceV2

        return CustomAllReduceV2
    if _is_cuda or _is_musa:
        return CustomAllreduce
''',
    "0.5.13": '''

def dispatch_custom_allreduce(group, device):
    if _is_cuda and envs.SGLANG_OPT_USE_CUSTOM_ALL_REDUCE_V2.get():
        from .custom_all_reduce_v2 import CustomAllReduceV2, can_use_custom_all_reduce_v2

        if can_use_custom_all_reduce_v2(group=group, device=device):
            return CustomAllReduceV2
    if _is_cuda or _is_musa:
        return CustomAllreduce
''',
}
LIVE_V2 = {
    "0.5.12": '''
from .custom_all_reduce_utils import can_use_custom_all_reduce_with_nvlink


def get_custom_all_reduce_cls():
    raise RuntimeError("the JIT kernel needs nvcc and a GPU")


class CustomAllReduceV2:
    def __init__(self, group, device):
        self.disabled = True
        full_nvlink = can_use_custom_all_reduce_with_nvlink(
            group=group,
            device=device,
            supported_world_size=list(THRESHOLD_2_SHOT_MAP.keys()),
            cls_name="CustomAllReduceV2",
        )
        if full_nvlink != True:
            return
        self.obj = get_custom_all_reduce_cls()(rank=0)
        self.disabled = False


THRESHOLD_2_SHOT_MAP = {2: 1, 3: 1, 4: 1, 5: 1, 6: 1, 7: 1, 8: 1}
''',
    "0.5.13": '''
from .custom_all_reduce_utils import can_use_custom_all_reduce_with_nvlink


def get_custom_all_reduce_cls():
    raise RuntimeError("the JIT kernel needs nvcc and a GPU")


class CustomAllReduceV2:
    def __init__(self, group, device):
        self.disabled = True
        if not can_use_custom_all_reduce_v2(group=group, device=device):
            return
        self.obj = get_custom_all_reduce_cls()(rank=0)
        self.disabled = False


def can_use_custom_all_reduce_v2(group, device):
    full_nvlink = can_use_custom_all_reduce_with_nvlink(
        group=group,
        device=device,
        supported_world_size=list(THRESHOLD_2_SHOT_MAP.keys()),
        cls_name="CustomAllReduceV2",
    )
    return full_nvlink is True


THRESHOLD_2_SHOT_MAP = {2: 1, 3: 1, 4: 1, 5: 1, 6: 1, 7: 1, 8: 1}
''',
}


def stand_in_torch() -> types.ModuleType:
    """torch as far as the gate's emulation reaches: what it patches, and ``torch.device``."""
    torch = types.ModuleType("torch")

    def needs_a_gpu(*args: object, **kwargs: object) -> object:
        raise RuntimeError("needs a GPU")

    torch.cuda = types.SimpleNamespace(get_device_capability=needs_a_gpu, device_count=needs_a_gpu,
                                       set_device=needs_a_gpu)
    torch.distributed = types.SimpleNamespace(get_world_size=needs_a_gpu, get_rank=needs_a_gpu,
                                              get_backend=needs_a_gpu, all_gather=needs_a_gpu)
    torch.device = lambda kind, index=None: types.SimpleNamespace(type=kind, index=index)
    return torch


@pytest.fixture
def live_release(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """A function: a release shape -> (the live gate, the static gate, the stand-in torch), over a fresh tree."""
    for name in [n for n in sys.modules if n == "sglang" or n.startswith("sglang.")]:
        monkeypatch.delitem(sys.modules, name)
    torch = stand_in_torch()
    monkeypatch.setitem(sys.modules, "torch", torch)
    monkeypatch.syspath_prepend(str(SCRIPTS))
    monkeypatch.syspath_prepend(str(tmp_path))

    def make(release: str):
        for package in ("sglang", "sglang/srt", "sglang/srt/distributed", COMM):
            write(tmp_path, f"{package}/__init__.py", "")
        write(tmp_path, "sglang/srt/environ.py", LIVE_ENVIRON)
        write(tmp_path, f"{COMM}/custom_all_reduce_utils.py", LIVE_UTILS)
        write(tmp_path, f"{COMM}/custom_all_reduce.py", LIVE_LEGACY + LIVE_DISPATCH[release])
        write(tmp_path, f"{COMM}/custom_all_reduce_v2.py", LIVE_V2[release])
        importlib.invalidate_caches()
        script = importlib.import_module("sglang_custom_ar")
        return script.live_custom_ar, script.static_custom_ar, torch

    yield make
    for name in [n for n in sys.modules if n == "sglang" or n.startswith("sglang.")]:
        sys.modules.pop(name, None)


LIVE_EXPECTED = {   # release -> statuses at PCIE_2, PCIE_8, NVSWITCH_3, NVSWITCH_8
    "0.5.12": ("fail", "fail", "pass", "pass"),
    "0.5.13": ("pass", "fail", "pass", "pass"),
}


class TestLiveGateCheck:
    @pytest.mark.parametrize("release", LIVE_EXPECTED)
    def test_the_live_path_builds_what_the_dispatch_picks(self, live_release, release: str) -> None:
        live, static, torch = live_release(release)
        sf, node_module = importlib.import_module("_sfprobe"), importlib.import_module("_sglang_node")
        got = []
        for ctx in (PCIE_2, PCIE_8, NVSWITCH_3, NVSWITCH_8):
            node = node_module.Node(sf.parse_arch(ctx.arch), ctx.gpu_count, ctx.interconnect)
            result = live(torch, node)
            assert not isinstance(result, str), result
            assert result.status == static(node, "not imported in this test").status, (ctx, result)
            got.append(result.status)
        assert tuple(got) == LIVE_EXPECTED[release]

    def test_two_pcie_gpus_name_v2_in_0_5_12(self, live_release) -> None:
        live, _, torch = live_release("0.5.12")
        sf, node_module = importlib.import_module("_sfprobe"), importlib.import_module("_sglang_node")
        result = live(torch, node_module.Node(sf.parse_arch("12.0"), 2, "pcie"))
        assert result.status == "fail" and "CustomAllReduceV2 (picked by dispatch_custom_allreduce)" in result.evidence
        assert "[live]" in result.evidence


@pytest.mark.pypi
def test_real_sglang_0523_live_follows_the_dispatch(sglang0523_live_python: Path) -> None:
    """SGLang 0.5.23 importable with a CPU torch: V2 keeps 3 fully NVLinked GPUs (its per-arch world
    sizes), refuses 2 PCIe GPUs and falls back to CustomAllreduce, which keeps them."""
    from test_probe_scripts import run_script

    def status(arch: str, gpus: int, interconnect: str) -> dict:
        return run_script(sglang0523_live_python, "sglang_custom_ar.py", "--arch", arch, "--gpus", str(gpus),
                          "--interconnect", interconnect)

    three = status("9.0", 3, "nvswitch")
    assert (three["status"], three["metrics"]["method"]) == ("pass", "live")
    assert "CustomAllReduceV2 (picked by dispatch_custom_allreduce)" in three["evidence"]
    two = status("12.0", 2, "pcie")
    assert (two["status"], two["metrics"]["method"]) == ("pass", "live")
    assert "CustomAllreduce (picked by dispatch_custom_allreduce)" in two["evidence"]
    sixteen = status("9.0", 16, "nvswitch")
    assert (sixteen["status"], sixteen["metrics"]["method"]) == ("fail", "live")
