"""The SGLang wheel readers (stackforge.wheels.readers.sglang): synthetic trees holding SGLang's own
lines (the release each comes from is named above it), then real wheels from PyPI at the boundaries."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import zipfile
from pathlib import Path

import pytest

from stackforge.core.wheel_readings import ReadContext, Reading, ReadingStatus
from stackforge.wheels.bisect import site_text
from stackforge.wheels.readers import sglang as sg

COMM = "sglang/srt/distributed/device_communicators"

SM120_X8_PCIE = ReadContext(arch="12.0", gpu_count=8, interconnect="pcie")
SM90_X8_NVSWITCH = ReadContext(arch="9.0", gpu_count=8, interconnect="nvswitch", multicast=True)


def write(root: Path, relative: str, text: str) -> Path:
    path = root / relative
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(textwrap.dedent(text).lstrip("\n"), encoding="utf-8")
    return path


def read(fact: str, root: Path, ctx: ReadContext) -> Reading:
    spec = next(s for s in sg.READERS if s.fact == fact)
    reading = spec.reader(root, ctx)
    assert reading.fact == fact
    assert_sites(root, reading)
    return reading


def assert_sites(root: Path, reading: Reading) -> None:
    """Every site's code is the file's line at site.line; line 0 is an absence: of the file (no code,
    and the file is not there), or of a name in a file that is there (the code says which)."""
    assert reading.sites, reading
    assert "\n" not in reading.summary
    for found in reading.sites:
        if found.line == 0:
            assert (root / found.path).is_file() == bool(found.code), found
            continue
        lines = (root / found.path).read_text(encoding="utf-8").splitlines()
        assert found.code == lines[found.line - 1].strip(), found


# sglang 0.5.14 srt/distributed/device_communicators/all_reduce_utils.py:1-16
TABLE = '''
MiB = 1024 * 1024

TORCH_SYMM_MEM_ALL_REDUCE_MAX_SIZES = {
    9: {
        2: 64 * MiB,  # 64 MB
        4: 64 * MiB,  # 64 MB
        6: 128 * MiB,  # 128 MB
        8: 128 * MiB,  # 128 MB
    },
    10: {
        2: 64 * MiB,  # 64 MB
        4: 64 * MiB,  # 64 MB
        6: 128 * MiB,  # 128 MB
        8: 128 * MiB,  # 128 MB
    },
}
'''

# sglang 0.5.13.post1 torch_symm_mem.py TorchSymmMemCommunicator.__init__ (the table indexed: KeyError)
SYMM_INDEXED = '''
class TorchSymmMemCommunicator:
    def __init__(self, group: ProcessGroup, device: Union[int, str, torch.device]):
        self.disabled = True
        self.device_capability = torch.cuda.get_device_capability(device)[0]
        if self.device_capability < 9:
            logger.warning(
                "TorchSymmMemCommunicator: Device capability %s not supported, "
                "communicator is not available.",
                self.device_capability,
            )
            return
        if (
            self.world_size
            not in TORCH_SYMM_MEM_ALL_REDUCE_MAX_SIZES[self.device_capability]
        ):
            return
'''

# sglang 0.5.14 torch_symm_mem.py:77-109 (the table looked up with .get: disabled; then multicast)
SYMM_GET = '''
class TorchSymmMemCommunicator:
    def __init__(self, group: ProcessGroup, device: Union[int, str, torch.device]):
        self.device_capability = torch.cuda.get_device_capability(device)[0]
        supported_max_sizes = TORCH_SYMM_MEM_ALL_REDUCE_MAX_SIZES.get(
            self.device_capability
        )
        if supported_max_sizes is None:
            logger.warning(
                "TorchSymmMemCommunicator: Device capability %s not supported, "
                "communicator is not available.",
                self.device_capability,
            )
            return
        if self.world_size not in supported_max_sizes:
            return
        self.max_size = supported_max_sizes[self.world_size]
        handle = torch_symm_mem.rendezvous(self.buffer, self.group.group_name)
        if handle.multicast_ptr == 0:
            logger.warning(
                "TorchSymmMemCommunicator: torch symmetric memory "
                "multicast operations are not supported."
            )
            self.buffer = None
            self.disabled = True
            return
'''


def symm_tree(root: Path, communicator: str) -> Path:
    write(root, f"{COMM}/all_reduce_utils.py", TABLE)
    write(root, f"{COMM}/torch_symm_mem.py", communicator)
    return root


class TestTorchSymmMem:
    def test_indexed_table_raises_keyerror_for_sm120(self, tmp_path: Path) -> None:
        reading = read("torch-symm-mem", symm_tree(tmp_path, SYMM_INDEXED), SM120_X8_PCIE)
        assert reading.status is ReadingStatus.UNAVAILABLE
        assert "KeyError" in reading.summary and "capability 12" in reading.summary
        assert reading.sites[0].code == "not in TORCH_SYMM_MEM_ALL_REDUCE_MAX_SIZES[self.device_capability]"
        assert reading.depends_on == ("arch", "gpu_count")

    def test_get_lookup_disables_sm120(self, tmp_path: Path) -> None:
        reading = read("torch-symm-mem", symm_tree(tmp_path, SYMM_GET), SM120_X8_PCIE)
        assert reading.status is ReadingStatus.UNAVAILABLE
        assert "KeyError" not in reading.summary and "disabled" in reading.summary
        assert reading.sites[0].code == "supported_max_sizes = TORCH_SYMM_MEM_ALL_REDUCE_MAX_SIZES.get("

    @pytest.mark.parametrize("communicator", [SYMM_INDEXED, SYMM_GET])
    def test_table_admits_sm90_at_the_sizes_it_lists(self, tmp_path: Path, communicator: str) -> None:
        root = symm_tree(tmp_path, communicator)
        eight = read("torch-symm-mem", root, SM90_X8_NVSWITCH)
        assert eight.status is ReadingStatus.AVAILABLE and "128 MiB" in eight.summary
        three = read("torch-symm-mem", root, ReadContext(arch="9.0", gpu_count=3, interconnect="nvswitch"))
        assert three.status is ReadingStatus.UNAVAILABLE and "[2, 4, 6, 8]" in three.summary

    def test_without_multicast_the_admitted_size_is_disabled(self, tmp_path: Path) -> None:
        root = symm_tree(tmp_path, SYMM_GET)
        reading = read("torch-symm-mem", root, ReadContext(arch="9.0", gpu_count=8, interconnect="nvswitch"))
        assert reading.status is ReadingStatus.UNAVAILABLE and "multicast" in reading.summary
        assert reading.sites[-1].code == "if handle.multicast_ptr == 0:"
        assert "multicast" in reading.depends_on

    def test_capability_floor(self, tmp_path: Path) -> None:
        reading = read("torch-symm-mem", symm_tree(tmp_path, SYMM_INDEXED),
                       ReadContext(arch="8.0", gpu_count=8, interconnect="nvlink"))
        assert reading.status is ReadingStatus.UNAVAILABLE
        assert reading.sites[0].code == "if self.device_capability < 9:"

    def test_no_communicator_is_absent(self, tmp_path: Path) -> None:
        write(tmp_path, f"{COMM}/custom_all_reduce.py", "x = 1\n")
        reading = read("torch-symm-mem", tmp_path, SM120_X8_PCIE)
        assert reading.status is ReadingStatus.ABSENT


# sglang 0.5.14 custom_all_reduce.py:39-41 and custom_all_reduce_utils.py:465-470
CAR_CLASS = '''
class CustomAllreduce:
    _SUPPORTED_WORLD_SIZES = [2, 4, 6, 8]
    _MAX_CAR_SIZE = 8192 * 1024
'''
CAR_UTILS = '''
def can_use_custom_all_reduce_with_nvlink(group, device, world_size, cls_name, supported_world_size):
    full_nvlink = is_full_nvlink(physical_device_ids, world_size)
    if world_size > 2 and not full_nvlink:
        logger.warning(
            f"{cls_name} is disabled because it's not supported on"
            " more than two PCIe-only GPUs. To silence this warning, "
            "specify disable_custom_all_reduce=True explicitly."
        )
        return None
'''


class TestCustomAllreduce:
    @pytest.fixture
    def root(self, tmp_path: Path) -> Path:
        write(tmp_path, f"{COMM}/custom_all_reduce.py", CAR_CLASS)
        write(tmp_path, f"{COMM}/custom_all_reduce_utils.py", CAR_UTILS)
        return tmp_path

    def test_pcie_beyond_two_gpus_is_disabled(self, root: Path) -> None:
        reading = read("custom-allreduce", root, SM120_X8_PCIE)
        assert reading.status is ReadingStatus.UNAVAILABLE
        assert "world_size > 2 and not full_nvlink" in reading.summary
        assert [s.code for s in reading.sites] == ["_SUPPORTED_WORLD_SIZES = [2, 4, 6, 8]",
                                                   "if world_size > 2 and not full_nvlink:"]

    @pytest.mark.parametrize(("ctx", "status"), [
        (SM90_X8_NVSWITCH, ReadingStatus.AVAILABLE),
        (ReadContext(arch="12.0", gpu_count=2, interconnect="pcie"), ReadingStatus.AVAILABLE),
        (ReadContext(arch="9.0", gpu_count=3, interconnect="nvswitch"), ReadingStatus.UNAVAILABLE),
        (ReadContext(arch="9.0", gpu_count=1, interconnect="nvswitch"), ReadingStatus.UNAVAILABLE),
    ])
    def test_world_sizes_and_interconnect(self, root: Path, ctx: ReadContext, status: ReadingStatus) -> None:
        assert read("custom-allreduce", root, ctx).status is status

    def test_absent_without_the_file(self, tmp_path: Path) -> None:
        assert read("custom-allreduce", tmp_path, SM120_X8_PCIE).status is ReadingStatus.ABSENT


# sglang 0.5.14 srt/layers/flashinfer_comm_fusion.py:47-51
FUSION_GATE = '''
def _resolve_backend(backend: str, is_multi_node: bool = False) -> str:
    """Resolve the requested FlashInfer allreduce fusion backend."""
    if not (is_sm90_supported() or is_sm100_supported()):
        raise ValueError(
            "FlashInfer allreduce fusion requires SM90 or SM10X NVIDIA GPUs."
        )
'''


class TestArFusionGate:
    def test_rejects_sm120_admits_sm90(self, tmp_path: Path) -> None:
        write(tmp_path, "sglang/srt/layers/flashinfer_comm_fusion.py", FUSION_GATE)
        rejected = read("flashinfer-ar-fusion", tmp_path, SM120_X8_PCIE)
        assert rejected.status is ReadingStatus.UNAVAILABLE
        assert "requires SM90 or SM10X" in rejected.summary
        assert [s.code for s in rejected.sites] == ["if not (is_sm90_supported() or is_sm100_supported()):",
                                                   "raise ValueError("]
        assert read("flashinfer-ar-fusion", tmp_path, SM90_X8_NVSWITCH).status is ReadingStatus.AVAILABLE

    def test_file_without_the_gate_admits_the_arch(self, tmp_path: Path) -> None:
        write(tmp_path, "sglang/srt/layers/flashinfer_comm_fusion.py",
              "def ensure_workspace_initialized():\n    pass\n")
        reading = read("flashinfer-ar-fusion", tmp_path, SM120_X8_PCIE)
        assert reading.status is ReadingStatus.AVAILABLE
        # The file is there (0.5.13.post1): its evidence must not say the file is not in the release.
        assert site_text(reading.sites[0]) == ("sglang/srt/layers/flashinfer_comm_fusion.py: "
                                               "no def _resolve_backend in this file")

    def test_no_fusion_file_is_cited_as_absent(self, tmp_path: Path) -> None:
        (tmp_path / "sglang").mkdir()
        reading = read("flashinfer-ar-fusion", tmp_path, SM120_X8_PCIE)
        assert site_text(reading.sites[0]) == "sglang/srt/layers/flashinfer_comm_fusion.py: not in this release"


# sglang 0.5.4.post2 srt/utils/common.py:195-200 and srt/server_args.py (field defaults :271 :332 :473,
# the GptOss auto-enable :939-941)
COMMON = '''
def is_blackwell_supported(device=None) -> bool:
    if not is_cuda_alike():
        return False
    return (torch.cuda.get_device_capability(device)[0] in [10, 12]) and (
        torch.version.cuda >= "12.8"
    )
'''
SERVER_ARGS_AUTOENABLE = '''
@dataclasses.dataclass
class ServerArgs:
    tp_size: int = 1
    nnodes: int = 1
    enable_dp_attention: bool = False

    def _handle_model_specific_adjustments(self):
        hf_config = self.get_hf_config()
        model_arch = hf_config.architectures[0]
        if model_arch in ["GptOssForCausalLM"]:
            if is_blackwell_supported():
                if not self.enable_dp_attention:
                    self.enable_flashinfer_allreduce_fusion = True
'''


class TestArFusionAutoenable:
    def test_blackwell_flag_turns_it_on_for_sm120(self, tmp_path: Path) -> None:
        write(tmp_path, "sglang/srt/utils/common.py", COMMON)
        write(tmp_path, "sglang/srt/server_args.py", SERVER_ARGS_AUTOENABLE)
        reading = read("flashinfer-ar-fusion:autoenable", tmp_path, SM120_X8_PCIE)
        assert reading.status is ReadingStatus.AVAILABLE and "GptOssForCausalLM" in reading.summary
        assert reading.sites[0].code == "self.enable_flashinfer_allreduce_fusion = True"
        hopper = read("flashinfer-ar-fusion:autoenable", tmp_path, SM90_X8_NVSWITCH)
        assert hopper.status is ReadingStatus.UNAVAILABLE

    def test_flags_from_layers_utils(self, tmp_path: Path) -> None:
        # sglang 0.5.1: server_args.py:2224-2245 reads is_sm100_supported from srt/layers/utils.py:40-43
        write(tmp_path, "sglang/srt/utils.py", "def is_cuda():\n    return True\n")
        write(tmp_path, "sglang/srt/layers/utils.py", '''
        def is_sm100_supported(device=None) -> bool:
            return (torch.cuda.get_device_capability(device)[0] == 10) and (
                torch.version.cuda >= "12.8"
            )
        ''')
        write(tmp_path, "sglang/srt/server_args.py", '''
        @dataclasses.dataclass
        class ServerArgs:
            enable_dp_attention: bool = False

            def model_specific_adjustments(self):
                hf_config = self.get_hf_config()
                model_arch = hf_config.architectures[0]
                if model_arch in ["GptOssForCausalLM"]:
                    if is_sm100_supported():
                        if not self.enable_dp_attention:
                            self.enable_flashinfer_allreduce_fusion = True
        ''')
        sm120 = read("flashinfer-ar-fusion:autoenable", tmp_path, SM120_X8_PCIE)
        assert sm120.status is ReadingStatus.UNAVAILABLE
        sm100 = read("flashinfer-ar-fusion:autoenable", tmp_path, ReadContext("10.0", 8, "nvlink"))
        assert sm100.status is ReadingStatus.AVAILABLE

    def test_no_autoenable_is_absent(self, tmp_path: Path) -> None:
        write(tmp_path, "sglang/srt/server_args.py", "class ServerArgs:\n    tp_size: int = 1\n")
        assert read("flashinfer-ar-fusion:autoenable", tmp_path, SM120_X8_PCIE).status is ReadingStatus.ABSENT


# sglang 0.5.14-0.5.19 srt/utils/common.py: the flags the overrides pass reads
COMMON_SM = '''
def is_sm100_supported(device=None) -> bool:
    if not is_cuda_alike():
        return False
    return (torch.cuda.get_device_capability(device)[0] == 10) and (
        torch.version.cuda >= "12.8"
    )


def is_sm90_supported(device=None) -> bool:
    if not is_cuda_alike():
        return False
    return (torch.cuda.get_device_capability(device)[0] == 9) and (
        torch.version.cuda >= "12.3"
    )
'''
# sglang 0.5.15 srt/arg_groups/overrides.py:1352-1396 (the pass; its view.* fields are ServerArgs' own,
# srt/server_args.py, as there is no arg_groups/fields/ before 0.5.20), with 0.5.19's Qwen3.5 return
# of None (:976-989) in front: that return turns the fusion off.
OVERRIDES_PASS = '''
from sglang.srt.utils.common import (
    is_sm90_supported,
    is_sm100_supported,
)

_FLASHINFER_ALLREDUCE_FUSION_ARCHS = frozenset(
    {
        "DeepseekV3ForCausalLM",
        "GptOssForCausalLM",
    }
)


@register_post_process
def _flashinfer_allreduce_fusion_auto_enable(view: Any) -> dict:
    model_arch = view.get_model_config().hf_config.architectures[0]
    if envs.SGLANG_FLASHINFER_MNNVL_CUTEDSL_AR_FUSION.get() and model_arch in {
        "Qwen3_5MoeForCausalLM",
    }:
        return {"flashinfer_allreduce_fusion_backend": None}
    if (
        view.flashinfer_allreduce_fusion_backend is None
        and model_arch in _FLASHINFER_ALLREDUCE_FUSION_ARCHS
        and (is_sm90_supported() or is_sm100_supported())
        and view.tp_size > 1
        and not view.enable_dp_attention
        and (view.nnodes == 1 or is_sm100_supported())
        and view.moe_a2a_backend == "none"
    ):
        logger.info(
            f"Auto-enabling FlashInfer AllReduce Fusion on SM90/SM10X for {model_arch}"
        )
        return {"flashinfer_allreduce_fusion_backend": "auto"}
    return {}
'''
SERVER_ARGS_FIELDS = '''
class ServerArgs:
    tp_size: A[int, "The tensor parallelism size."] = 1
    nnodes: A[int, "The number of nodes."] = 1
    enable_dp_attention: A[bool, "Enabling data parallelism for attention."] = False
    moe_a2a_backend: A[str, "Choose the backend for MoE A2A."] = "none"
    flashinfer_allreduce_fusion_backend: A[Optional[str], "FlashInfer allreduce fusion backend."] = None
'''


class TestArFusionAutoenablePass:
    @pytest.fixture
    def root(self, tmp_path: Path) -> Path:
        write(tmp_path, "sglang/srt/utils/common.py", COMMON_SM)
        write(tmp_path, "sglang/srt/server_args.py", SERVER_ARGS_FIELDS)
        write(tmp_path, "sglang/srt/arg_groups/overrides.py", OVERRIDES_PASS)
        return tmp_path

    def test_fields_from_server_args_decide_hopper(self, root: Path) -> None:
        hopper = read("flashinfer-ar-fusion:autoenable", root, SM90_X8_NVSWITCH)
        assert hopper.status is ReadingStatus.AVAILABLE
        assert "DeepseekV3ForCausalLM" in hopper.summary and "Qwen3_5MoeForCausalLM" not in hopper.summary

    def test_a_return_of_none_is_no_site(self, root: Path) -> None:
        reading = read("flashinfer-ar-fusion:autoenable", root, SM120_X8_PCIE)
        assert reading.status is ReadingStatus.UNAVAILABLE
        assert [s.code for s in reading.sites] == ['return {"flashinfer_allreduce_fusion_backend": "auto"}']


# sglang 0.5.10 srt/server_args.py:2364-2390 (prefill SM100 only; decode SM90/SM100/SM120)
TRTLLM_0510 = '''
class ServerArgs:
    def _handle_attention_backend_compatibility(self):
        if (
            self.attention_backend == "trtllm_mha"
            or self.decode_attention_backend == "trtllm_mha"
            or self.prefill_attention_backend == "trtllm_mha"
        ):
            prefill_backend = (
                self.prefill_attention_backend
                if self.prefill_attention_backend is not None
                else self.attention_backend
            )
            if prefill_backend == "trtllm_mha" and not is_sm100_supported():
                raise ValueError(
                    "TRTLLM MHA backend for prefill is only supported on Blackwell GPUs (SM100). Please use a different prefill backend."
                )
            decode_backend = (
                self.decode_attention_backend
                if self.decode_attention_backend is not None
                else self.attention_backend
            )
            if decode_backend == "trtllm_mha" and not (
                is_sm90_supported() or is_sm100_supported() or is_sm120_supported()
            ):
                raise ValueError(
                    "TRTLLM MHA backend for decode is only supported on Hopper (SM90), Blackwell (SM100) and (SM120) GPUs. Please use a different decode backend."
                )
'''
# sglang 0.5.9 srt/server_args.py:1894-1902 (one check for both phases: SM100 only)
TRTLLM_059 = '''
class ServerArgs:
    def _handle_attention_backend_compatibility(self):
        if (
            self.attention_backend == "trtllm_mha"
            or self.decode_attention_backend == "trtllm_mha"
            or self.prefill_attention_backend == "trtllm_mha"
        ):
            if not is_sm100_supported():
                raise ValueError(
                    "TRTLLM MHA backend is only supported on Blackwell GPUs (SM100). Please use a different backend."
                )
'''

# sglang 0.5.23 srt/arg_groups/attention_hook.py:199-220 (SM120 prefill admitted, but not with an fp8 KV cache)
TRTLLM_0523 = '''
def handle_attention_backend_compatibility(server_args: Any):
    prefill_backend, decode_backend = attention_backends_of(resolved_view(server_args))
    if "trtllm_mha" in (prefill_backend, decode_backend):
        if prefill_backend == "trtllm_mha" and not (
            get_platform().is_sm90 or get_platform().is_sm100 or get_platform().is_sm120
        ):
            raise ValueError(
                "TRTLLM MHA backend for prefill requires Hopper (SM90), Blackwell (SM100), or SM120 GPUs. "
                "Please use a different prefill backend."
            )
        if (
            prefill_backend == "trtllm_mha"
            and get_platform().is_sm120
            and (
                cfg.kv_cache_dtype == "fp8_e4m3"
                or (
                    envs.SGLANG_SKIP_SOFTMAX_PREFILL_THRESHOLD_SCALE_FACTOR.get() or 0.0
                )
                > 0
            )
        ):
            raise ValueError(
                "TRTLLM FMHAv2 prefill on SM120 does not support "
                "fp8_e4m3 KV cache or skip-softmax."
            )
'''


class TestTrtllmMha:
    def test_0_5_10_refuses_prefill_and_allows_decode_on_sm120(self, tmp_path: Path) -> None:
        write(tmp_path, "sglang/srt/server_args.py", TRTLLM_0510)
        prefill = read("sglang-trtllm-mha-prefill", tmp_path, SM120_X8_PCIE)
        decode = read("sglang-trtllm-mha-decode", tmp_path, SM120_X8_PCIE)
        assert prefill.status is ReadingStatus.UNAVAILABLE
        assert prefill.sites[0].code == 'if prefill_backend == "trtllm_mha" and not is_sm100_supported():'
        assert decode.status is ReadingStatus.AVAILABLE
        assert decode.sites[0].code == 'if decode_backend == "trtllm_mha" and not ('

    def test_0_5_9_refuses_both_on_sm120(self, tmp_path: Path) -> None:
        write(tmp_path, "sglang/srt/server_args.py", TRTLLM_059)
        for fact in ("sglang-trtllm-mha-prefill", "sglang-trtllm-mha-decode"):
            reading = read(fact, tmp_path, SM120_X8_PCIE)
            assert reading.status is ReadingStatus.UNAVAILABLE
            assert reading.sites[0].code == "if not is_sm100_supported():"

    def test_0_5_23_admits_prefill_on_sm120_and_names_the_fp8_exception(self, tmp_path: Path) -> None:
        write(tmp_path, "sglang/srt/server_args.py", "class ServerArgs:\n    pass\n")
        write(tmp_path, "sglang/srt/arg_groups/attention_hook.py", TRTLLM_0523)
        prefill = read("sglang-trtllm-mha-prefill", tmp_path, SM120_X8_PCIE)
        assert prefill.status is ReadingStatus.AVAILABLE
        assert "also raises when cfg.kv_cache_dtype == 'fp8_e4m3'" in prefill.summary
        assert [s.line for s in prefill.sites] == [4, 12]
        hopper = read("sglang-trtllm-mha-prefill", tmp_path, SM90_X8_NVSWITCH)
        assert hopper.status is ReadingStatus.AVAILABLE and "also raises" not in hopper.summary
        # the decode check is not in this excerpt: no arch check refuses decode here
        assert read("sglang-trtllm-mha-decode", tmp_path, SM120_X8_PCIE).status is ReadingStatus.AVAILABLE

    def test_no_backend_is_absent(self, tmp_path: Path) -> None:
        write(tmp_path, "sglang/srt/server_args.py", 'ATTENTION_BACKENDS = ["flashinfer", "triton"]\n')
        assert read("sglang-trtllm-mha-decode", tmp_path, SM120_X8_PCIE).status is ReadingStatus.ABSENT


class TestOptions:
    def test_argparse_string(self, tmp_path: Path) -> None:
        # sglang 0.5.13.post1 srt/server_args.py:6596-6598
        write(tmp_path, "sglang/srt/server_args.py", '''
        parser.add_argument(
            "--enable-torch-symm-mem",
            action="store_true",
        )
        ''')
        reading = read("torch-symm-mem:flag", tmp_path, SM120_X8_PCIE)
        assert reading.status is ReadingStatus.AVAILABLE and reading.sites[0].line == 2

    def test_annotated_field(self, tmp_path: Path) -> None:
        # sglang 0.5.23 srt/arg_groups/fields/exec_.py:836 (the option is made from the field's name)
        write(tmp_path, "sglang/srt/server_args.py", "class ServerArgs:\n    pass\n")
        write(tmp_path, "sglang/srt/arg_groups/fields/exec_.py", '''
        class ExecArgs(msgspec.Struct):
            moe_a2a_backend: A[
                Literal["none", "deepep", "mooncake", "nixl", "mori", "ascend_fuseep", "flashinfer"],
                "Choose the backend for MoE A2A.",
            ] = "none"
        ''')
        reading = read("ep-a2a", tmp_path, SM120_X8_PCIE)
        assert reading.status is ReadingStatus.AVAILABLE
        assert reading.sites[0].code == "moe_a2a_backend: A["

    def test_undeclared_option_is_absent(self, tmp_path: Path) -> None:
        write(tmp_path, "sglang/srt/server_args.py", 'parser.add_argument("--enable-symm-mem")\n')
        assert read("torch-symm-mem:flag", tmp_path, SM120_X8_PCIE).status is ReadingStatus.ABSENT


# sglang 0.5.22 srt/environ.py:1395 and device_communicators/pcie_ipc_ar.py:77, :225
ENVIRON = '''
class Envs:
    SGLANG_ENABLE_PCIE_IPC_ALLREDUCE = EnvBool(False)
    SGLANG_PCIE_IPC_MAX_NUMEL = EnvInt(0)
'''
PCIE_IPC = '''
# The kernels build IPC channels for these world sizes only.
_SUPPORTED_WORLD_SIZES = (2, 4, 8)


class PcieIpcCommunicator:
    def __init__(self, group, device, cpu_group=None):
        try:
            from flashinfer.comm import PcieIpcAllReduceWorkspace
        except ImportError:
            return
'''


class TestPcieIpc:
    def test_world_sizes_of_the_pcie_ipc_backend(self, tmp_path: Path) -> None:
        write(tmp_path, "sglang/srt/environ.py", ENVIRON)
        write(tmp_path, f"{COMM}/pcie_ipc_ar.py", PCIE_IPC)
        eight = read("sglang-pcie-ipc-ar", tmp_path, SM120_X8_PCIE)
        assert eight.status is ReadingStatus.AVAILABLE
        assert [s.code for s in eight.sites] == ["SGLANG_ENABLE_PCIE_IPC_ALLREDUCE = EnvBool(False)",
                                                "_SUPPORTED_WORLD_SIZES = (2, 4, 8)",
                                                "from flashinfer.comm import PcieIpcAllReduceWorkspace"]
        six = read("sglang-pcie-ipc-ar", tmp_path, ReadContext(arch="12.0", gpu_count=6, interconnect="pcie"))
        assert six.status is ReadingStatus.UNAVAILABLE

    def test_absent_before_it_existed(self, tmp_path: Path) -> None:
        write(tmp_path, "sglang/srt/environ.py", "class Envs:\n    SGLANG_USE_AITER = EnvBool(False)\n")
        assert read("sglang-pcie-ipc-ar", tmp_path, SM120_X8_PCIE).status is ReadingStatus.ABSENT


def test_registry_names_the_facts_once() -> None:
    facts = [spec.fact for spec in sg.READERS]
    assert sorted(facts) == sorted({"torch-symm-mem", "torch-symm-mem:flag", "custom-allreduce",
                                    "flashinfer-ar-fusion", "flashinfer-ar-fusion:autoenable",
                                    "sglang-trtllm-mha-prefill", "sglang-trtllm-mha-decode", "sglang-pcie-ipc-ar", "ep-a2a"})
    assert {spec.dist for spec in sg.READERS} == {"sglang"}


# --------------------------------------------------------------------------------------------
# Real wheels from PyPI (network): the boundaries the readers must find
# --------------------------------------------------------------------------------------------

REAL_VERSIONS = ("0.5.4.post1", "0.5.4.post2", "0.5.9", "0.5.10", "0.5.13.post1", "0.5.14")


def unpacked_wheel(version: str, into: Path) -> Path:
    """``pip download --no-deps sglang==VERSION`` and the wheel unpacked (never installed)."""
    download = into / "download"
    proc = subprocess.run([sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--only-binary=:all:",
                           f"sglang=={version}", "-d", str(download)], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    wheel = next(download.glob("*.whl"))
    root = into / "unpacked"
    with zipfile.ZipFile(wheel) as archive:
        archive.extractall(root)
    return root


# The in-image gate probes' static path and these readers decide with the same code
# (stackforge/inimage/_sglang_source.py): over one tree, for each node, the probe's status is the reading's.
SCRIPTS = Path(__file__).resolve().parents[1] / "stackforge" / "probes" / "scripts"
AS_PROBE_STATUS = {ReadingStatus.AVAILABLE: "pass", ReadingStatus.UNAVAILABLE: "fail",
                   ReadingStatus.UNDECIDED: "undecided"}
NODES = [SM120_X8_PCIE, ReadContext(arch="12.0", gpu_count=2, interconnect="pcie"),
         ReadContext(arch="9.0", gpu_count=8, interconnect="nvswitch", multicast=True),
         ReadContext(arch="9.0", gpu_count=3, interconnect="nvswitch", multicast=True),
         ReadContext(arch="10.0", gpu_count=4, interconnect="nvlink", multicast=True),
         ReadContext(arch="8.0", gpu_count=8, interconnect="nvlink", multicast=True)]
# sglang 0.5.14 torch_symm_mem.py with the table's lookup taken out: how a missing capability fails is unknown
SYMM_NO_LOOKUP = '''
class TorchSymmMemCommunicator:
    def __init__(self, group: ProcessGroup, device: Union[int, str, torch.device]):
        self.device_capability = torch.cuda.get_device_capability(device)[0]
'''


def static_probe(monkeypatch: pytest.MonkeyPatch, root: Path, script: str, function: str, ctx: ReadContext) -> str:
    """The status of ``script``'s static path (the one it takes when SGLang does not import) over the
    sglang package under ``root``, run in this process for the node ``ctx`` describes."""
    import importlib

    (root / "sglang" / "__init__.py").touch()
    monkeypatch.syspath_prepend(str(SCRIPTS))
    monkeypatch.syspath_prepend(str(root))
    importlib.invalidate_caches()
    sf, node_module = importlib.import_module("_sfprobe"), importlib.import_module("_sglang_node")
    node = node_module.Node(sf.parse_arch(ctx.arch), ctx.gpu_count, ctx.interconnect)
    verdict = getattr(importlib.import_module(script), function)(node, "not imported in this test")
    return verdict.status


class TestProbeAndReaderDecideAlike:
    @pytest.mark.parametrize("communicator", [SYMM_INDEXED, SYMM_GET, SYMM_NO_LOOKUP])
    @pytest.mark.parametrize("ctx", NODES, ids=lambda c: f"{c.arch}x{c.gpu_count}-{c.interconnect}")
    def test_symm_mem(self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, communicator: str,
                      ctx: ReadContext) -> None:
        root = symm_tree(tmp_path, communicator)
        reading = read("torch-symm-mem", root, ctx)
        probe = static_probe(monkeypatch, root, "sglang_symm_mem", "static_symm_mem", ctx)
        assert probe == AS_PROBE_STATUS[reading.status], (reading, probe)

    @pytest.mark.parametrize("ctx", NODES, ids=lambda c: f"{c.arch}x{c.gpu_count}-{c.interconnect}")
    def test_custom_allreduce(self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, ctx: ReadContext) -> None:
        write(tmp_path, f"{COMM}/custom_all_reduce.py", CAR_CLASS)
        write(tmp_path, f"{COMM}/custom_all_reduce_utils.py", CAR_UTILS)
        reading = read("custom-allreduce", tmp_path, ctx)
        probe = static_probe(monkeypatch, tmp_path, "sglang_custom_ar", "static_custom_ar", ctx)
        assert probe == AS_PROBE_STATUS[reading.status], (reading, probe)

    @pytest.mark.parametrize("ctx", NODES, ids=lambda c: f"{c.arch}x{c.gpu_count}-{c.interconnect}")
    def test_ar_fusion_gate(self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, ctx: ReadContext) -> None:
        write(tmp_path, "sglang/srt/layers/flashinfer_comm_fusion.py", FUSION_GATE)
        reading = read("flashinfer-ar-fusion", tmp_path, ctx)
        probe = static_probe(monkeypatch, tmp_path, "sglang_ar_fusion", "static_ar_fusion", ctx)
        assert probe == AS_PROBE_STATUS[reading.status], (reading, probe)


@pytest.fixture(scope="module")
def wheels(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return {v: unpacked_wheel(v, tmp_path_factory.mktemp(f"sglang-{v}")) for v in REAL_VERSIONS}


@pytest.mark.pypi
class TestRealWheels:
    def test_symm_mem_keyerror_until_0_5_13_post1_get_from_0_5_14(self, wheels: dict[str, Path]) -> None:
        before = read("torch-symm-mem", wheels["0.5.13.post1"], SM120_X8_PCIE)
        after = read("torch-symm-mem", wheels["0.5.14"], SM120_X8_PCIE)
        assert before.status is after.status is ReadingStatus.UNAVAILABLE
        assert "KeyError" in before.summary and before.sites[0].line == 85
        assert before.sites[0].path == f"{COMM}/torch_symm_mem.py"
        assert "KeyError" not in after.summary and after.sites[0].line == 78
        assert ".get(" in after.sites[0].code
        for version in ("0.5.13.post1", "0.5.14"):
            hopper = read("torch-symm-mem", wheels[version], SM90_X8_NVSWITCH)
            assert hopper.status is ReadingStatus.AVAILABLE
            no_multicast = ReadContext(arch="9.0", gpu_count=8, interconnect="pcie")
            assert read("torch-symm-mem", wheels[version], no_multicast).status is ReadingStatus.UNAVAILABLE

    def test_ar_fusion_gate_appears_in_0_5_14(self, wheels: dict[str, Path]) -> None:
        assert read("flashinfer-ar-fusion", wheels["0.5.13.post1"], SM120_X8_PCIE).status is ReadingStatus.AVAILABLE
        gate = read("flashinfer-ar-fusion", wheels["0.5.14"], SM120_X8_PCIE)
        assert gate.status is ReadingStatus.UNAVAILABLE
        assert [s.line for s in gate.sites] == [49, 50]
        assert "FlashInfer allreduce fusion requires SM90 or SM10X NVIDIA GPUs." in gate.summary

    def test_autoenable_on_sm120_from_0_5_4_post2(self, wheels: dict[str, Path]) -> None:
        before = read("flashinfer-ar-fusion:autoenable", wheels["0.5.4.post1"], SM120_X8_PCIE)
        after = read("flashinfer-ar-fusion:autoenable", wheels["0.5.4.post2"], SM120_X8_PCIE)
        assert before.status is ReadingStatus.UNAVAILABLE
        assert after.status is ReadingStatus.AVAILABLE and "GptOssForCausalLM" in after.summary
        # 0.5.14 sets flashinfer_allreduce_fusion_backend = "auto", on sm_90 / sm_100 only
        hopper = read("flashinfer-ar-fusion:autoenable", wheels["0.5.14"], SM90_X8_NVSWITCH)
        assert hopper.status is ReadingStatus.AVAILABLE
        assert read("flashinfer-ar-fusion:autoenable", wheels["0.5.14"], SM120_X8_PCIE).status \
            is ReadingStatus.UNAVAILABLE

    def test_trtllm_decode_on_sm120_from_0_5_10(self, wheels: dict[str, Path]) -> None:
        assert read("sglang-trtllm-mha-decode", wheels["0.5.9"], SM120_X8_PCIE).status is ReadingStatus.UNAVAILABLE
        assert read("sglang-trtllm-mha-decode", wheels["0.5.10"], SM120_X8_PCIE).status is ReadingStatus.AVAILABLE
        assert read("sglang-trtllm-mha-prefill", wheels["0.5.10"], SM120_X8_PCIE).status is ReadingStatus.UNAVAILABLE

    def test_custom_allreduce_and_options(self, wheels: dict[str, Path]) -> None:
        for version, root in wheels.items():
            assert read("custom-allreduce", root, SM120_X8_PCIE).status is ReadingStatus.UNAVAILABLE, version
            assert read("custom-allreduce", root, SM90_X8_NVSWITCH).status is ReadingStatus.AVAILABLE, version
            # the option moved from an argparse string to a ServerArgs field in 0.5.14
            assert read("torch-symm-mem:flag", root, SM120_X8_PCIE).status is ReadingStatus.AVAILABLE, version
            assert read("ep-a2a", root, SM120_X8_PCIE).status is ReadingStatus.AVAILABLE, version
            assert read("sglang-pcie-ipc-ar", root, SM120_X8_PCIE).status is ReadingStatus.ABSENT, version
