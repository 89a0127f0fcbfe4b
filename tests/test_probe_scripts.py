"""The probe scripts, run for real: as subprocesses, in venvs holding real torch / FlashInfer / SGLang.

Every test parses the script's last stdout line (the STACKFORGE_RESULT contract) and checks the
status and the evidence text, which must be the projects' own words (FlashInfer's exception, SGLang's
log message, nvcc's error). Runtime probes are checked for their no-GPU skip and, on gloo, for the
multi-process harness itself; GPU paths are marked ``gpu`` and skip without one.
"""

from __future__ import annotations

import importlib
import json
import os
import shutil
import signal
import struct
import subprocess
import sys
import textwrap
from pathlib import Path

import _probe_venvs as venvs
import pytest
from _skips import require_host_gpus, skip_gpu_only

REPO = Path(__file__).resolve().parents[1]
SCRIPTS = REPO / "stackforge" / "probes" / "scripts"
MISBEHAVE = REPO / "tests" / "probes_misbehave"
NO_GPU = "no CUDA device visible (torch.cuda.device_count()==0)"
FI_GATE_TEXT = "No supported CUDA architectures found for major versions [9, 10]."


# --------------------------------------------------------------------------------------------- helpers

def run_script(python: Path | str, script: str | Path, *args: str, env: dict[str, str] | None = None,
               timeout: float = 300) -> dict:
    """Run a probe script; the parsed result line, which must be the last stdout line."""
    path = script if isinstance(script, Path) else SCRIPTS / script
    full_env = {**os.environ, "PYTHONDONTWRITEBYTECODE": "1", **(env or {})}
    proc = subprocess.run([str(python), str(path), *args], check=False, capture_output=True, text=True, timeout=timeout,
                          env=full_env)
    lines = proc.stdout.rstrip("\n").splitlines()
    assert lines, f"no stdout; stderr:\n{proc.stderr[-3000:]}"
    last = lines[-1]
    assert last.startswith("STACKFORGE_RESULT "), f"last line is not a result:\n{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}"
    payload = json.loads(last[len("STACKFORGE_RESULT "):])
    assert set(payload) == {"status", "reason", "evidence", "metrics", "facts"}
    assert payload["status"] in ("pass", "fail", "skip", "error", "undecided", "timeout")
    assert "\n" not in payload["reason"]
    assert proc.returncode == 0
    return payload


def pythonpath(root: Path) -> dict[str, str]:
    """``PYTHONPATH`` with ``root`` first, keeping the in-image package (tests/conftest.py) the scripts import."""
    return {"PYTHONPATH": os.pathsep.join(p for p in (str(root), os.environ.get("PYTHONPATH", "")) if p)}


def nvcc_home() -> tuple[str, str] | None:
    """(CUDA home, release) of an nvcc on this machine, found the way the probes find one."""
    sys.path.insert(0, str(SCRIPTS))
    try:
        import _sfprobe as sf
    finally:
        sys.path.pop(0)
    nvcc = sf.find_nvcc()
    if nvcc is None:
        return None
    release, _ = sf.nvcc_version(nvcc)
    real = os.path.realpath(nvcc)
    return (os.path.dirname(os.path.dirname(real)), release) if release else None


def needs_nvcc(minimum: str = "12.8") -> tuple[str, str]:
    found = nvcc_home()
    if found is None:
        pytest.skip("no nvcc on this machine")
    home, release = found
    if tuple(map(int, release.split("."))) < tuple(map(int, minimum.split("."))):
        pytest.skip(f"nvcc {release} here; this test needs >= {minimum}")
    return home, release


# --------------------------------------------------------------------------------------------- venvs

@pytest.fixture(scope="session")
def bare_python() -> Path:
    return venvs.bare_venv()


@pytest.fixture(scope="session")
def torch_python() -> Path:
    return venvs.build_venv("torch-cpu", venvs.torch_steps())


@pytest.fixture(scope="session")
def fi063_python() -> Path:
    """FlashInfer 0.6.3 with SGLang 0.5.9 (the pair SGLang 0.5.9 pins), SGLang importable: the
    SGLang probe runs SGLang's own constructors here (live)."""
    return venvs.build_venv("fi-0.6.3-sgl-0.5.9", [
        *venvs.flashinfer_steps("0.6.3", "apache-tvm-ffi>=0.1.6,<0.2,!=0.1.8,!=0.1.8.post0"),
        ["--no-deps", "sglang==0.5.9"], list(venvs.SGLANG_059_IMPORT_DEPS)])


@pytest.fixture(scope="session")
def fi072_python() -> Path:
    """FlashInfer 0.7.2 with SGLang 0.5.23 (the pair SGLang 0.5.23 pins), SGLang without its
    dependencies: it does not import, so the SGLang probe reads its files (static)."""
    return venvs.build_venv("fi-0.7.2-sgl-0.5.23", [
        *venvs.flashinfer_steps("0.7.2", "apache-tvm-ffi>=0.1.11,<0.2"), ["--no-deps", "sglang==0.5.23"]])


@pytest.fixture(scope="session")
def sglang0523_live_python() -> Path:
    """SGLang 0.5.23 importable with a CPU torch (the venv tests/test_sglang_custom_ar_dispatch.py
    builds, same recipe): the SGLang probe runs its communicator constructors here (live)."""
    return venvs.build_venv("sgl-0.5.23-custom-ar", [
        *venvs.torch_steps(), ["--no-deps", "sglang==0.5.23"], list(venvs.SGLANG_0523_IMPORT_DEPS)])


@pytest.fixture(scope="session")
def sglang053_python() -> Path:
    """SGLang 0.5.3.post3 alone (no torch): static reading of symm_mem.py's table lookup."""
    return venvs.build_venv("sglang-0.5.3.post3-nodeps", [["--no-deps", "sglang==0.5.3.post3"]])


@pytest.fixture(scope="session")
def fi050_python() -> Path:
    """FlashInfer 0.5.0 with SGLang 0.5.4.post3 (the pair it pins), sglang.srt.server_args importable:
    the SGLang probe runs ServerArgs' own auto-enable of allreduce fusion here (live)."""
    return venvs.build_venv("fi-0.5.0-sgl-0.5.4.post3", [
        *venvs.flashinfer_steps("0.5.0", "apache-tvm-ffi>=0.1,<0.2"), ["--no-deps", "sglang==0.5.4.post3"],
        list(venvs.SGLANG_0543_SERVER_ARGS_DEPS)])


@pytest.fixture(scope="session")
def sglang057_python() -> Path:
    """SGLang 0.5.7 alone (no torch, no FlashInfer): static reading of ServerArgs' auto-enable."""
    return venvs.build_venv("sglang-0.5.7-nodeps", [["--no-deps", "sglang==0.5.7"]])


@pytest.fixture(scope="session")
def cuda_torch_python() -> Path:
    """A real CUDA torch (local wheel; skipped without one) with FlashInfer 0.7.2: the runtime
    flavour of an image, torch knows its CUDA version but there is no nvcc."""
    return venvs.build_venv("torch-cuda-fi-0.7.2", [
        [venvs.torch_cuda_wheel()], ["--no-deps", "flashinfer-python==0.7.2"],
        ["apache-tvm-ffi>=0.1.11,<0.2", *venvs.FLASHINFER_IMPORT_DEPS]])


# --------------------------------------------------------------------------------------------- contract

def test_script_that_raises_reports_error_with_traceback(tmp_path, bare_python):
    script = tmp_path / "broken.py"
    script.write_text(f"import sys\nsys.path.insert(0, {str(SCRIPTS)!r})\nimport _sfprobe as sf\n"
                      "def main(argv):\n    print('some log')\n    raise RuntimeError('boom in probe')\n"
                      "sf.run_main(main)\n")
    result = run_script(bare_python, script)
    assert result["status"] == "error"
    assert "RuntimeError: boom in probe" in result["reason"]
    assert "Traceback" in result["evidence"]


def test_bad_target_argument_is_an_error_result(bare_python):
    result = run_script(bare_python, "torch_arch.py", "--arch", "sm_120")
    assert result["status"] == "error"
    assert "arguments rejected" in result["reason"]


# --------------------------------------------------------------------------------------------- torch_arch

def test_torch_arch_without_torch_skips(bare_python):
    result = run_script(bare_python, "torch_arch.py", "--arch", "12.0", "--gpus", "8")
    assert result["status"] == "skip"
    assert result["reason"] == "torch is not installed in this image"
    assert "No module named 'torch'" in result["evidence"]


def test_torch_arch_cpu_build_fails_honestly(torch_python):
    result = run_script(torch_python, "torch_arch.py", "--arch", "12.0", "--gpus", "8")
    assert result["status"] == "fail"
    assert result["reason"] == "torch is a CPU build: torch.version.cuda is None"
    assert "torch.version.cuda = None" in result["evidence"]
    assert result["facts"]["versions"]["torch"].endswith("+cpu")
    assert result["facts"]["torch_cuda"] is None


def test_torch_arch_cuda_build_reads_the_compiled_arch_list(cuda_torch_python):
    """No GPU here, so torch.cuda.get_arch_list() is []; the probe still reads the compiled list."""
    result = run_script(cuda_torch_python, "torch_arch.py", "--arch", "12.0", "--gpus", "8")
    assert result["status"] == "pass", result
    assert "sm_120" in result["metrics"]["sass_for_target"]
    assert "torch._C._cuda_getArchFlags() = '" in result["evidence"]
    assert result["facts"]["torch_cuda"] and "sm_120" in result["facts"]["torch_arch_list"]
    volta = run_script(cuda_torch_python, "torch_arch.py", "--arch", "7.0")
    if "sm_70" in volta["metrics"]["sass"]:
        pytest.skip("this CUDA torch still carries sm_70")
    assert volta["status"] == "fail"
    assert "has neither SASS for sm_70 nor PTX <= compute_70" in volta["reason"]


# --------------------------------------------------------------------------------------------- nvcc_codegen

def test_nvcc_codegen_skips_without_nvcc(bare_python, tmp_path):
    result = run_script(bare_python, "nvcc_codegen.py", "--arch", "12.0", "--nvcc", str(tmp_path / "nvcc"))
    assert result["status"] == "skip"
    # Outside a stackforge image there is no stack.json to name the flavour.
    assert result["reason"] == "no nvcc in this flavour: nothing to generate sm_120 code with"
    assert "nvcc" not in result["facts"]


def test_no_nvcc_reason_names_the_flavour_stackforge_built_the_image_as(tmp_path):
    """In a stackforge image the reason names the flavour from /opt/stackforge/stack.json; a missing,
    unreadable or foreign file leaves it out rather than guessing."""
    sys.path.insert(0, str(SCRIPTS))
    try:
        import _sfprobe as sf
    finally:
        sys.path.pop(0)
    stack_json = tmp_path / "stack.json"
    stack_json.write_text(json.dumps({"stack_id": "cu128-x", "stack": {"cuda": "12.8", "flavour": "wheels"}}))
    assert sf.image_flavour(str(stack_json)) == "wheels"
    assert sf.no_nvcc("x", flavour=sf.image_flavour(str(stack_json))) == "no nvcc in this flavour (wheels): x"
    for text in ("not json", "[1, 2]", json.dumps({"stack": {"flavour": 3}}), json.dumps({"stack": "x"})):
        stack_json.write_text(text)
        assert sf.image_flavour(str(stack_json)) == ""
    assert sf.image_flavour(str(tmp_path / "absent.json")) == ""
    assert sf.no_nvcc("x", flavour="") == "no nvcc in this flavour: x"


def test_missing_nvcc_says_where_flashinfer_looked():
    """FlashInfer without a CUDA home (no nvcc, no /usr/local/cuda: the CUDA 12.x wheels flavour) gives
    its own error instead of a path; the reason quotes it rather than pasting it into a path."""
    sys.path.insert(0, str(SCRIPTS))
    try:
        import flashinfer_gates as fg
    finally:
        sys.path.pop(0)
    unresolved = fg.Toolkit("<RuntimeError: Could not find nvcc and default cuda_home='/usr/local/cuda' doesn't exist>",
                            "12.8", "", "", "")
    assert fg.missing_nvcc(unresolved) == ("no nvcc and no CUDA home (RuntimeError: Could not find nvcc and default "
                                           "cuda_home='/usr/local/cuda' doesn't exist)")
    assert fg.missing_nvcc(fg.Toolkit("/usr/local/cuda", "12.8", "", "", "")) == "no nvcc at /usr/local/cuda/bin/nvcc"


def test_nvcc_codegen_compiles_for_sm120(bare_python):
    _, release = needs_nvcc("12.8")
    result = run_script(bare_python, "nvcc_codegen.py", "--arch", "12.0")
    assert result["status"] == "pass", result
    assert f"release {release}" in result["evidence"]
    assert "sm_120 cubin (ELF SM 120)" in result["reason"]
    assert result["metrics"]["variants"]["sm_120"] == "ok"


def test_nvcc_codegen_fails_where_the_toolkit_dropped_the_arch(bare_python):
    needs_nvcc("13.0")  # CUDA 13 removed Volta: nvcc's own error is the evidence
    result = run_script(bare_python, "nvcc_codegen.py", "--arch", "7.0")
    assert result["status"] == "fail"
    assert "Unsupported gpu architecture 'sm_70'" in result["evidence"]


# --------------------------------------------------------------------------------------------- FlashInfer

def test_flashinfer_absent_skips(torch_python):
    result = run_script(torch_python, "flashinfer_gates.py", "--arch", "12.0", "--gpus", "8")
    assert result["status"] == "skip"
    assert "FlashInfer is not installed" in result["reason"]


def test_fi063_ar_fusion_rejects_sm120_with_flashinfer_own_words(fi063_python):
    result = run_script(fi063_python, "flashinfer_gates.py", "--arch", "12.0", "--gpus", "8",
                        "--feature", "flashinfer-ar-fusion", env={"CUDA_HOME": "/nonexistent"})
    assert result["status"] == "fail"
    assert f"RuntimeError: {FI_GATE_TEXT}" in result["evidence"]
    assert "flashinfer.jit.comm.gen_trtllm_comm_module" in result["evidence"]
    assert result["metrics"]["FLASHINFER_CUDA_ARCH_LIST"] == "12.0a"   # FI 0.6.3's own device detection
    assert result["metrics"]["modules"]["allreduce-fusion"] == "rejected"
    assert result["metrics"]["modules"]["pcie-ipc-allreduce"] == "absent"


def test_fi063_ar_fusion_admits_sm90(fi063_python):
    """Same FlashInfer, Hopper target: the gate's [9, 10] admits it (the probe is not a constant)."""
    home, _ = needs_nvcc("12.8")
    result = run_script(fi063_python, "flashinfer_gates.py", "--arch", "9.0", "--gpus", "8",
                        "--feature", "flashinfer-ar-fusion", env={"CUDA_HOME": home})
    assert result["status"] == "pass", result
    assert result["metrics"]["evidence_level"] == "admitted"   # gate only: nothing built without --build
    assert "compute_90a,code=sm_90a" in result["reason"]


def test_fi072_ar_fusion_admits_sm120_with_nvcc(fi072_python):
    home, release = needs_nvcc("12.9")
    result = run_script(fi072_python, "flashinfer_gates.py", "--arch", "12.0", "--gpus", "8",
                        "--feature", "flashinfer-ar-fusion", env={"CUDA_HOME": home})
    assert result["status"] == "pass", result
    assert "-gencode=arch=compute_120f,code=sm_120f" in result["evidence"]
    assert result["metrics"]["FLASHINFER_CUDA_ARCH_LIST"] == "12.0f"  # _normalize_cuda_arch with CUDA >= 12.9
    assert result["metrics"]["fi_cuda_version"] == release
    assert result["metrics"]["modules"]["mnnvl-allreduce"] == "rejected"   # 0.7.2 gates MNNVL to [9, 10]


def test_fi072_cpu_torch_without_nvcc_cannot_resolve_the_arch(fi072_python):
    """FlashInfer >= 0.6.7 needs the CUDA version (nvcc, else torch.version.cuda) to name an SM12x
    target; a CPU torch and no nvcc leave it none, and FlashInfer's own message says so."""
    result = run_script(fi072_python, "flashinfer_gates.py", "--arch", "12.0", "--gpus", "8",
                        "--feature", "flashinfer-ar-fusion", env={"CUDA_HOME": "/nonexistent"})
    assert result["status"] == "fail"
    assert "nvcc not found and PyTorch is not built with CUDA support" in result["reason"]
    assert result["metrics"]["target_archs"] == ""


def test_fi072_runtime_flavour_resolves_from_torch_but_cannot_jit_without_nvcc(cuda_torch_python):
    """CUDA torch, no nvcc: FlashInfer takes the CUDA version from torch.version.cuda, so its gate
    admits sm_120 (12.0f), but nothing can be compiled in such an image."""
    result = run_script(cuda_torch_python, "flashinfer_gates.py", "--arch", "12.0", "--gpus", "8",
                        "--feature", "flashinfer-ar-fusion", env={"CUDA_HOME": "/nonexistent"})
    assert result["metrics"]["FLASHINFER_CUDA_ARCH_LIST"] == "12.0f"
    assert result["metrics"]["fi_cuda_version"] == result["facts"]["torch_cuda"]
    assert result["metrics"]["modules"]["allreduce-fusion"] == "admitted"
    # The image cannot build the module: a fail a CPU can see, worded as the flavour's, marked jit_possible False.
    assert result["status"] == "fail" and result["metrics"]["jit_possible"] is False
    assert result["reason"].startswith("no nvcc in this flavour: ")
    assert "cannot build the module (no nvcc at /nonexistent/bin/nvcc" in result["reason"]
    jit = run_script(cuda_torch_python, "flashinfer_gates.py", "--arch", "12.0", "--gpus", "8",
                     "--feature", "flashinfer-jit", env={"CUDA_HOME": "/nonexistent"})
    assert jit["status"] == "fail"
    assert jit["metrics"]["jit_possible"] is False
    assert jit["reason"].startswith("no nvcc in this flavour: ")
    assert "finds no nvcc at /nonexistent/bin/nvcc" in jit["reason"]


def test_fi072_explicit_arch_list_admits_but_no_nvcc_cannot_build_it(fi072_python):
    result = run_script(fi072_python, "flashinfer_gates.py", "--arch", "12.0", "--gpus", "8",
                        "--feature", "flashinfer-ar-fusion", "--fi-arch-list", "12.0a",
                        env={"CUDA_HOME": "/nonexistent"})
    assert result["status"] == "fail"
    assert result["metrics"]["jit_possible"] is False
    assert result["metrics"]["modules"]["allreduce-fusion"] == "admitted"
    assert "compute_120a,code=sm_120a" in result["evidence"]
    assert result["reason"].startswith("no nvcc in this flavour: ")
    assert "cannot build the module (no nvcc" in result["reason"]


def cuda_home_view(root: Path, home: str) -> Path:
    """A CUDA home of links to ``home``'s folders but an empty ``lib64``: the toolkit of an image
    whose libraries are not where FlashInfer's link line looks (-L$CUDA_HOME/lib64, lib64/stubs)."""
    view = root / "cuda"
    (view / "lib64" / "stubs").mkdir(parents=True)
    for entry in Path(home).iterdir():
        if entry.name != "lib64":
            (view / entry.name).symlink_to(entry)
    return view


def add_link_libraries(view: Path, home: str, tmp: Path) -> None:
    """Give the view what FlashInfer links against: the toolkit's libcudart.so and a libcuda.so link
    stub (the toolkit's own stub where it ships one; this machine's toolkit has none, so one is built:
    a link stub only has to exist for ``-lcuda``, the driver provides the real one at load time)."""
    (view / "lib64" / "libcudart.so").symlink_to(Path(home) / "lib64" / "libcudart.so")
    stub = Path(home) / "lib64" / "stubs" / "libcuda.so"
    if stub.exists():
        (view / "lib64" / "stubs" / "libcuda.so").symlink_to(stub)
        return
    (tmp / "stub.c").write_text("")
    subprocess.run(["cc", "-shared", "-fPIC", "-o", str(view / "lib64" / "stubs" / "libcuda.so"), str(tmp / "stub.c")],
                   check=True)


def test_fi072_jit_builds_and_links_for_sm120_and_reuses_its_build_cache(fi072_python, tmp_path):
    """A real FlashInfer JIT build (its own ninja file, nvcc for compute_120f, the link): first where the
    link cannot find libcudart (a fail in the linker's words, as the same image would fail on a GPU
    host), then with the libraries there (built), then again over the kept workspace (ninja: nothing to
    do, the .so is there: built, from the build cache of the run that built it). The page module: this
    machine's toolkit has no cuRAND / cuBLAS headers, which norm and sampling include."""
    home, _ = needs_nvcc("12.9")
    view = cuda_home_view(tmp_path, home)
    argv = ("--arch", "12.0", "--gpus", "8", "--feature", "flashinfer-jit", "--build", "--build-modules", "page",
            "--workspace", str(tmp_path / "ws"))
    env = {"CUDA_HOME": str(view), "MAX_JOBS": "2"}
    unlinked = run_script(fi072_python, "flashinfer_gates.py", *argv, "--cache-label", "r1", env=env, timeout=600)
    assert unlinked["status"] == "fail", unlinked
    assert unlinked["reason"].startswith("FlashInfer 0.7.2's page module does not link for sm_120 (link): ")
    assert "cannot find -lcudart" in unlinked["reason"]
    assert unlinked["metrics"]["builds"]["page"]["stage"] == "link"
    assert "evidence_level" not in unlinked["metrics"]

    add_link_libraries(view, home, tmp_path)
    linked = run_script(fi072_python, "flashinfer_gates.py", *argv, "--cache-label", "r2", env=env, timeout=600)
    assert linked["status"] == "pass", linked
    assert linked["metrics"]["evidence_level"] == "built"
    assert "built (compiled and linked) its page module for -gencode=arch=compute_120f,code=sm_120f" in linked["reason"]
    assert "nothing was loaded or run (no GPU)" in linked["reason"] and "build cache" not in linked["reason"]
    assert f"-L{view}/lib64/stubs -lcudart -lcuda -o " in linked["evidence"]
    library = Path(linked["metrics"]["builds"]["page"]["library"])
    assert library.is_file() and library.read_bytes()[:4] == b"\x7fELF"

    warm = run_script(fi072_python, "flashinfer_gates.py", *argv, "--cache-label", "r3", env=env, timeout=600)
    assert warm["status"] == "pass", warm
    assert warm["metrics"]["builds"]["page"]["cached"] is True
    assert "(from the build cache of run r2, " in warm["reason"]
    assert warm["metrics"]["builds"]["page"]["seconds"] < 30


# --------------------------------------------------------------------------------------------- SGLang

SGLANG_GATE_SCRIPTS = ("sglang_symm_mem.py", "sglang_custom_ar.py", "sglang_ar_fusion.py")


@pytest.mark.parametrize("script", SGLANG_GATE_SCRIPTS)
def test_sglang_absent_skips(torch_python, script):
    result = run_script(torch_python, script, "--arch", "12.0", "--gpus", "8")
    assert result["status"] == "skip"
    assert result["reason"] == "SGLang is not installed in this image"


def test_sglang_0523_static_custom_ar_pcie(fi072_python):
    eight = run_script(fi072_python, "sglang_custom_ar.py", "--arch", "12.0", "--gpus", "8",
                       "--interconnect", "pcie")
    assert eight["status"] == "fail"
    assert "not supported on more than two PCIe-only GPUs" in eight["reason"]
    assert eight["metrics"]["method"] == "static"
    assert "world_size > 2 and not full_nvlink" in eight["evidence"]
    two = run_script(fi072_python, "sglang_custom_ar.py", "--arch", "12.0", "--gpus", "2",
                     "--interconnect", "pcie")
    assert two["status"] == "pass"
    nvswitch = run_script(fi072_python, "sglang_custom_ar.py", "--arch", "12.0", "--gpus", "8",
                          "--interconnect", "nvswitch")
    assert nvswitch["status"] == "pass"


def test_sglang_0523_static_symm_mem_disables_sm120_cleanly(fi072_python):
    result = run_script(fi072_python, "sglang_symm_mem.py", "--arch", "12.0", "--gpus", "8")
    assert result["status"] == "fail"
    assert "TorchSymmMemCommunicator: Device capability 12 not supported" in result["reason"]
    assert "TORCH_SYMM_MEM_ALL_REDUCE_MAX_SIZES = {9:" in result["evidence"]
    hopper = run_script(fi072_python, "sglang_symm_mem.py", "--arch", "9.0", "--gpus", "8")
    assert hopper["status"] == "pass"
    assert "multicast" in hopper["reason"]


def test_sglang_0523_live_symm_mem_on_hopper_is_the_tables_decision_not_a_server_context_error(
        sglang0523_live_python):
    """0.5.23's TorchSymmMemCommunicator reads get_exec() (torch_symm_mem.py:104) after its table checks;
    outside a server that raises "config namespace 'exec' not published". That was reported as a fail;
    the table (all_reduce_utils.py:3, keys 9 and 10, sizes 2/4/6/8) is what decides."""
    hopper = run_script(sglang0523_live_python, "sglang_symm_mem.py", "--arch", "9.0", "--gpus", "8",
                        "--interconnect", "nvswitch")
    assert hopper["metrics"]["method"] == "live", hopper
    assert hopper["status"] == "pass", hopper
    assert "SGLang's size table decides: TORCH_SYMM_MEM_ALL_REDUCE_MAX_SIZES (all_reduce_utils.py:3)" \
        in hopper["reason"]
    assert "passed its table checks (torch_symm_mem.py:80-91) live" in hopper["reason"]
    assert "server-only state (torch_symm_mem.py:104)" in hopper["reason"]
    assert "torch_symm_mem.py:104 `get_exec().comm.enable_scattered_sconv`" in hopper["evidence"]
    assert "ValueError: config namespace 'exec' not published (runtime_context.py:1069)" in hopper["evidence"]
    assert "Traceback (most recent call last)" in hopper["evidence"]          # the traceback, as evidence
    blackwell_pc = run_script(sglang0523_live_python, "sglang_symm_mem.py", "--arch", "12.0", "--gpus", "8",
                              "--interconnect", "pcie")
    assert blackwell_pc["status"] == "fail"                                   # SGLang's own clean disable
    assert "TorchSymmMemCommunicator: Device capability 12 not supported" in blackwell_pc["reason"]


FAKE_RUNTIME_CONTEXT = """\
class _Context:
    _config_bags = None

    def config_bag(self, name):
        if not self._config_bags or name not in self._config_bags:
            raise ValueError(f"config namespace {name!r} not published")
        return self._config_bags[name]


_CONTEXT = _Context()


def get_exec():
    return _CONTEXT.config_bag("exec")
"""
FAKE_SYMM_MEM = """\
import logging
import types

import torch
import torch.distributed as dist

from sglang.srt.distributed.device_communicators.all_reduce_utils import TORCH_SYMM_MEM_ALL_REDUCE_MAX_SIZES
from sglang.srt.runtime_context import get_exec

torch_symm_mem = types.SimpleNamespace(empty=None)
logger = logging.getLogger(__name__)


class TorchSymmMemCommunicator:
    def __init__(self, group, device):
        self.disabled = True
        {before_table}
        self.device_capability = torch.cuda.get_device_capability(device)[0]
        sizes = TORCH_SYMM_MEM_ALL_REDUCE_MAX_SIZES.get(self.device_capability)
        if sizes is None:
            logger.warning("TorchSymmMemCommunicator: Device capability %s not supported, "
                           "communicator is not available.", self.device_capability)
            return
        if dist.get_world_size(group) not in sizes:
            logger.warning("TorchSymmMemCommunicator: World size %d not supported, "
                           "communicator is not available.", dist.get_world_size(group))
            return
        self.buffer = torch_symm_mem.empty(1024)
"""


def fake_sglang(root: Path, before_table: str) -> Path:
    """A package named sglang with a symmetric-memory communicator whose constructor runs
    ``before_table`` ahead of its size table (keys 9 and 10, sizes 4 and 8)."""
    comm = root / "sglang" / "srt" / "distributed" / "device_communicators"
    comm.mkdir(parents=True)
    for folder in (root / "sglang", root / "sglang" / "srt", comm.parent, comm):
        (folder / "__init__.py").write_text("")
    (root / "sglang" / "srt" / "runtime_context.py").write_text(FAKE_RUNTIME_CONTEXT)
    (comm / "all_reduce_utils.py").write_text("TORCH_SYMM_MEM_ALL_REDUCE_MAX_SIZES = {9: {4: 1, 8: 2}, 10: {4: 1, 8: 2}}\n")
    (comm / "torch_symm_mem.py").write_text(FAKE_SYMM_MEM.replace("{before_table}", before_table))
    info = root / "sglang-0.0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: sglang\nVersion: 0.0.1\n")
    return root


def test_symm_mem_stopped_by_server_only_state_before_its_table_is_undecided_or_the_tables_no(
        torch_python, tmp_path):
    root = fake_sglang(tmp_path / "context-first", "get_exec()  # server-only state, ahead of the table")
    env = pythonpath(root)
    admitted = run_script(torch_python, "sglang_symm_mem.py", "--arch", "9.0", "--gpus", "8", "--interconnect",
                          "nvswitch", env=env)
    assert admitted["status"] == "undecided", admitted               # the table admits, but nothing before it ran
    assert "stopped at server-only state before its table checks" in admitted["reason"]
    assert "ValueError: config namespace 'exec' not published (runtime_context.py:" in admitted["evidence"]
    assert "[table] TORCH_SYMM_MEM_ALL_REDUCE_MAX_SIZES = {9: {4: 1, 8: 2}, 10: {4: 1, 8: 2}}" in admitted["evidence"]
    assert admitted["metrics"]["feature_status"]["torch-symm-mem"] == "undecided"
    denied = run_script(torch_python, "sglang_symm_mem.py", "--arch", "12.0", "--gpus", "8", env=env)
    assert denied["status"] == "fail"                                 # no entry for 12: the table says no
    assert "SGLang's size table decides: no entry for capability 12 (keys [9, 10])" in denied["reason"]
    assert "all_reduce_utils.py:1" in denied["reason"] and "torch_symm_mem.py:" in denied["reason"]
    odd_size = run_script(torch_python, "sglang_symm_mem.py", "--arch", "9.0", "--gpus", "2", env=env)
    assert "no world size 2 for capability 9 (sizes [4, 8])" in odd_size["reason"] and odd_size["status"] == "fail"


def test_symm_mem_error_raised_by_the_communicator_itself_stays_its_result(torch_python, tmp_path):
    # The same words raised by the communicator's own code (not runtime_context.py) are SGLang's answer.
    root = fake_sglang(tmp_path / "own-error", "raise ValueError(\"config namespace 'exec' not published\")")
    result = run_script(torch_python, "sglang_symm_mem.py", "--arch", "9.0", "--gpus", "8",
                        env=pythonpath(root))
    assert result["status"] == "fail", result
    assert "raises ValueError: config namespace 'exec' not published" in result["reason"]


def test_a_static_answer_says_static_even_when_its_evidence_names_no_reading(torch_python, tmp_path):
    """The method is the path that decided: a package without the communicator's files is read
    statically (the import failed), and its skip / error says ``static``, not ``live``."""
    root = tmp_path / "bare"
    (root / "sglang").mkdir(parents=True)
    (root / "sglang" / "__init__.py").write_text("")
    (root / "sglang-0.0.1.dist-info").mkdir()
    (root / "sglang-0.0.1.dist-info" / "METADATA").write_text("Metadata-Version: 2.1\nName: sglang\nVersion: 0.0.1\n")
    env = pythonpath(root)
    symm = run_script(torch_python, "sglang_symm_mem.py", "--arch", "9.0", "--gpus", "8", env=env)
    assert symm["status"] == "skip" and "no torch symmetric-memory communicator" in symm["reason"], symm
    assert symm["metrics"]["method"] == "static"
    assert symm["metrics"]["feature_status"] == {"torch-symm-mem": "skip"}   # only the feature asked for
    car = run_script(torch_python, "sglang_custom_ar.py", "--arch", "9.0", "--gpus", "8", env=env)
    assert car["status"] == "error" and "no custom_all_reduce.py in this SGLang" in car["reason"], car
    assert car["metrics"]["method"] == "static"


def test_sglang_053_static_symm_mem_keyerror(sglang053_python):
    result = run_script(sglang053_python, "sglang_symm_mem.py", "--arch", "12.0", "--gpus", "4")
    assert result["status"] == "fail"
    assert "KeyError: 12" in result["reason"]
    assert "SYMM_MEM_ALL_REDUCE_MAX_SIZES = {9:" in result["evidence"]
    assert "symm_mem.py" in result["evidence"]


def test_sglang_059_live_gates(fi063_python):
    symm = run_script(fi063_python, "sglang_symm_mem.py", "--arch", "12.0", "--gpus", "8")
    assert symm["metrics"]["method"] == "live", symm
    assert symm["status"] == "fail"
    assert "KeyError: 12" in symm["reason"]
    car = run_script(fi063_python, "sglang_custom_ar.py", "--arch", "12.0", "--gpus", "4",
                     "--interconnect", "pcie")
    assert car["status"] == "fail"
    assert "Custom allreduce is disabled because it's not supported on more than two PCIe-only GPUs" in car["reason"]
    hopper = run_script(fi063_python, "sglang_custom_ar.py", "--arch", "9.0", "--gpus", "8",
                        "--interconnect", "nvswitch")
    assert hopper["status"] == "pass"
    assert "reached the P2P check" in hopper["evidence"]


def test_sglang_0523_ar_fusion_rejects_sm120_in_sglang_own_words(fi072_python):
    result = run_script(fi072_python, "sglang_ar_fusion.py", "--arch", "12.0", "--gpus", "8")
    assert result["status"] == "fail", result
    assert "FlashInfer allreduce fusion requires SM90 or SM10X NVIDIA GPUs." in result["reason"]
    assert result["metrics"]["method"] == "static"  # the no-deps venv cannot import the module
    assert "_resolve_backend" in result["evidence"] and "not run" in result["evidence"]
    assert "get_platform().is_sm90 or get_platform().is_sm100" in result["evidence"]
    hopper = run_script(fi072_python, "sglang_ar_fusion.py", "--arch", "9.0", "--gpus", "8")
    assert hopper["status"] == "pass", hopper
    assert "the arch check passes" in hopper["evidence"]


def test_sglang_0523_autoenable_pass_is_off_on_sm120(fi072_python):
    # 0.5.23 moved the auto-enable into arg_groups/overrides.py; it asks get_platform().is_sm90 / is_sm100.
    result = run_script(fi072_python, "sglang_ar_fusion.py", "--arch", "12.0", "--gpus", "8",
                        "--interconnect", "pcie")
    metrics = result["metrics"]
    assert metrics["autoenable_method"] == "static", result["evidence"]  # overrides.py does not import here
    assert metrics["sglang_autoenables_ar_fusion"] == [] and "autoenable_undecided" not in metrics
    assert "overrides.py:1001 _flashinfer_allreduce_fusion_auto_enable" in result["evidence"]
    assert "run from model_hook.py:747" in result["evidence"]
    assert "'is_sm90': [9], 'is_sm100': [10]" in result["evidence"]
    assert "GptOssForCausalLM: returns a backend: False" in result["evidence"]
    assert result["status"] == "fail"  # from _resolve_backend, unchanged
    assert "FlashInfer allreduce fusion requires SM90 or SM10X NVIDIA GPUs." in result["reason"]


def test_sglang_0523_autoenable_pass_is_on_for_hopper_but_not_mimo(fi072_python):
    result = run_script(fi072_python, "sglang_ar_fusion.py", "--arch", "9.0", "--gpus", "8",
                        "--interconnect", "nvswitch")
    metrics = result["metrics"]
    assert metrics["autoenable_method"] == "static", result["evidence"]
    on = metrics["sglang_autoenables_ar_fusion"]
    # _FLASHINFER_ALLREDUCE_FUSION_ARCHS (19 names); MiMo returns {} early unless get_platform().is_sm100.
    assert len(on) == 19 and {"DeepseekV3ForCausalLM", "GptOssForCausalLM", "Qwen3MoeForCausalLM"} <= set(on)
    assert not any(arch.startswith("MiMo") for arch in on) and "autoenable_undecided" not in metrics
    assert "MiMoV2ForCausalLM: returns a backend: False" in result["evidence"]
    # attn_dp_enabled_of(view) read from its own file: attn_dp_size and ep_join_mode at their defaults.
    assert "not (view.attn_dp_size > 1 or view.ep_join_mode == 'scale')" in result["evidence"]
    assert result["status"] == metrics["flashinfer_gate"], result
    single = run_script(fi072_python, "sglang_ar_fusion.py", "--arch", "9.0", "--gpus", "1")
    assert single["metrics"]["sglang_autoenables_ar_fusion"] == []  # view.tp_size > 1


def test_sglang_059_has_no_ar_fusion_gate_of_its_own(fi063_python):
    result = run_script(fi063_python, "sglang_ar_fusion.py", "--arch", "12.0", "--gpus", "8")
    assert result["status"] == "skip", result
    assert result["metrics"]["method"] == "live"
    assert "sglang.srt.layers.flashinfer_comm_fusion has no function _resolve_backend" in result["evidence"]
    assert "gate.flashinfer.ar-fusion" in result["reason"]
    # Read in the wheels: flashinfer_comm_fusion.py:47 defines it in 0.5.14, 0.5.13.post1 has none.
    assert "SGLang has one from 0.5.14" in result["reason"]


def ar_fusion(python: Path, arch: str, gpus: str) -> dict:
    return run_script(python, "sglang_ar_fusion.py", "--arch", arch, "--gpus", gpus)


def test_sglang_0543_autoenables_ar_fusion_on_sm120_that_flashinfer_050_rejects(fi050_python):
    result = ar_fusion(fi050_python, "12.0", "8")
    assert result["status"] == "fail", result
    metrics = result["metrics"]
    assert metrics["autoenable_method"] == "live", result["evidence"]
    assert metrics["sglang_autoenables_ar_fusion"] == ["GptOssForCausalLM"]
    assert "turns FlashInfer allreduce fusion on by itself for GptOssForCausalLM on sm_120" in result["reason"]
    assert "FlashInfer 0.5.0 rejects sm_120" in result["reason"] and FI_GATE_TEXT in result["reason"]
    # SGLang's own code ran: its condition (file:line), its log line, and the flag it left per architecture.
    assert "server_args.py:953 ServerArgs._handle_model_specific_adjustments" in result["evidence"]
    assert "is_blackwell_supported()" in result["evidence"]
    assert "SGLang logged: Enable FlashInfer AllReduce Fusion on sm100 for GptOssForCausalLM" in result["evidence"]
    assert "DeepseekV3ForCausalLM: enable_flashinfer_allreduce_fusion=False" in result["evidence"]


def test_sglang_0543_autoenable_follows_the_arch_and_gpu_count(fi050_python):
    hopper = ar_fusion(fi050_python, "9.0", "8")  # 0.5.4.post3 asks is_sm100 / is_blackwell only
    assert hopper["metrics"]["autoenable_method"] == "live"
    assert hopper["metrics"]["sglang_autoenables_ar_fusion"] == []
    assert hopper["status"] == "skip" and "flashinfer_gate" not in hopper["metrics"]
    blackwell = ar_fusion(fi050_python, "10.0", "8")
    assert blackwell["metrics"]["sglang_autoenables_ar_fusion"] == ["DeepseekV3ForCausalLM", "GptOssForCausalLM"]
    # FlashInfer 0.5.0 admits sm_100; whether it can build the module here (nvcc) decides, as it would in an image.
    assert blackwell["status"] == blackwell["metrics"]["flashinfer_gate"], blackwell
    single = ar_fusion(fi050_python, "12.0", "1")
    assert single["status"] == "skip", single
    assert single["metrics"]["sglang_autoenables_ar_fusion"] == ["GptOssForCausalLM"]
    assert "fuses only with more than one GPU" in single["reason"]


def test_sglang_057_static_autoenable_names_four_architectures(sglang057_python):
    expected = ["DeepseekV3ForCausalLM", "GptOssForCausalLM", "Glm4MoeForCausalLM", "Qwen3MoeForCausalLM"]
    for arch in ("12.0", "9.0"):  # 0.5.7: is_sm90_supported() or is_blackwell_supported() (majors 10, 12)
        result = ar_fusion(sglang057_python, arch, "8")
        assert result["metrics"]["autoenable_method"] == "static", result
        assert result["metrics"]["sglang_autoenables_ar_fusion"] == expected
        assert "server_args.py:1493" in result["evidence"]
        assert "'is_blackwell_supported': [10, 12]" in result["evidence"]
        assert result["status"] == "skip"  # no FlashInfer in this venv: nothing would build the module
        assert "FlashInfer is not installed" in result["reason"]


def test_sglang_059_autoenables_ar_fusion_on_sm90_sm100_only(fi063_python):
    blackwell = ar_fusion(fi063_python, "12.0", "8")
    assert blackwell["metrics"]["sglang_autoenables_ar_fusion"] == []
    assert "(is_sm90_supported() or is_sm100_supported())" in blackwell["evidence"]
    assert blackwell["status"] == "skip"
    hopper = ar_fusion(fi063_python, "9.0", "8")
    assert "KimiK25ForConditionalGeneration" in hopper["metrics"]["sglang_autoenables_ar_fusion"]
    assert hopper["status"] == hopper["metrics"]["flashinfer_gate"], hopper


# --------------------------------------------------------------------------------------------- kernel_cubins

def synthetic_fatbin(entries: list[tuple[int, int, int]]) -> bytes:
    """A fatbin container in the documented layout: (kind, arch, flags) entries, empty payloads."""
    body = b""
    for kind, arch, flags in entries:
        header = struct.pack("<HHIQIIHHIIIQQQ", kind, 0x0101, 64, 0, 0, 0, 0, 0, arch, 0, 0, flags, 0, 0)
        body += header
    return struct.pack("<IHHQ", 0xBA55ED50, 1, 16, len(body)) + body


def test_kernel_cubins_reads_a_fatbin_layout(bare_python, tmp_path):
    package = tmp_path / "sgl_kernel"
    package.mkdir()
    (package / "ops.fatbin").write_bytes(synthetic_fatbin([(2, 90, 0x100011), (2, 120, 0x1100011), (1, 120, 0x8011)]))
    result = run_script(bare_python, "kernel_cubins.py", "--arch", "12.0", "--method", "parse", "--path",
                        str(package))
    assert result["status"] == "pass"
    assert "ops.fatbin: sm_90a sm_120a ptx: compute_120" in result["evidence"]
    hopper_only = tmp_path / "flashinfer_jit_cache"
    hopper_only.mkdir()
    (hopper_only / "fa3.fatbin").write_bytes(synthetic_fatbin([(2, 90, 0x100011)]))
    result = run_script(bare_python, "kernel_cubins.py", "--arch", "12.0", "--method", "parse", "--path",
                        str(hopper_only))
    assert result["status"] == "fail"
    assert "no code for sm_120 in flashinfer_jit_cache (sm_90a)" in result["reason"]


def test_kernel_cubins_reads_a_real_shared_object(bare_python, tmp_path):
    """nvcc builds a .so with known targets; the parser must list exactly those (and agree with
    cuobjdump where one is around)."""
    home, _ = needs_nvcc("12.9")
    source = tmp_path / "k.cu"
    source.write_text('extern "C" __global__ void k(float* y) { y[threadIdx.x] += 1.0f; }\n')
    package = tmp_path / "sgl_kernel"
    package.mkdir()
    build = subprocess.run(check=False, args=[os.path.join(home, "bin", "nvcc"), "-shared", "-Xcompiler", "-fPIC", "-Xfatbin",
                            "-compress-all", "-gencode", "arch=compute_120a,code=sm_120a", "-gencode",
                            "arch=compute_100f,code=sm_100f", "-gencode", "arch=compute_90,code=compute_90",
                            "-o", str(package / "common_ops.so"), str(source)], capture_output=True, text=True,
                           timeout=300)
    if build.returncode != 0:
        pytest.skip(f"nvcc cannot link a shared object here: {build.stderr[-300:]}")
    result = run_script(bare_python, "kernel_cubins.py", "--arch", "12.0", "--method", "parse", "--path",
                        str(package))
    assert result["status"] == "pass"
    assert "common_ops.so: sm_100f sm_120a ptx: compute_90" in result["evidence"]
    blackwell_dc = run_script(bare_python, "kernel_cubins.py", "--arch", "10.3", "--method", "parse", "--path",
                              str(package))
    assert blackwell_dc["status"] == "pass"          # sm_100f runs on 10.3
    volta = run_script(bare_python, "kernel_cubins.py", "--arch", "7.0", "--method", "parse", "--path", str(package))
    assert volta["status"] == "fail"
    cuobjdump = shutil.which("cuobjdump") or os.environ.get("SF_CUOBJDUMP")
    if cuobjdump:
        other = run_script(bare_python, "kernel_cubins.py", "--arch", "12.0", "--method", "cuobjdump",
                           "--cuobjdump", cuobjdump, "--path", str(package))
        assert "sm_120a" in other["evidence"] and "compute_90" in other["evidence"]


def flashinfer_cubin_layout(root: Path, extra: dict[str, list[tuple[int, int, int]]] | None = None) -> Path:
    """A flashinfer_cubin package laid out like the 0.6.13 wheel (cubins/<hash>/<family>/...), the files
    synthetic fatbins with the archs the real ones carry (sm_100f, sm_103a)."""
    package = root / "flashinfer_cubin"
    files = {"cubins/158f6fa1/fmha/trtllm-gen/fmhaSm100fKernel_QkvE4m3OBfloat16H128PagedKv.cubin": [(2, 100, 0x200011)],
             "cubins/d2c5915b/batched_gemm-91e0ba0-896b90b/Bmm_Bfloat16_E4m3E4m3_Fp32_sm103a.cubin": [(2, 103, 0x100011)],
             "cubins/10f64528/gemm-91e0ba0-2710384/Gemm_Bfloat16_E4m3E4m3_Fp32_t128x8x128_sm100f.cubin": [(2, 100, 0x200011)],
             "cubins/a72d85b0/deep-gemm/kernel.fp8_m_grouped_gemm.007404769193.cubin": [(2, 100, 0x200011)],
             **(extra or {})}
    for relative, entries in files.items():
        path = package / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(synthetic_fatbin(entries))
    return package


def test_kernel_cubins_judges_only_the_kernels_the_target_would_use(bare_python, tmp_path):
    """flashinfer-cubin's trtllm-gen / DeepGEMM cubins are SM10x-only by design: no sm_90 / sm_120 code in
    them is no gap (this was a fail), and the evidence says what was excluded, why, and from which source."""
    package = flashinfer_cubin_layout(tmp_path)
    for arch, sm in (("12.0", "sm_120"), ("9.0", "sm_90")):
        result = run_script(bare_python, "kernel_cubins.py", "--arch", arch, "--method", "parse", "--path",
                            str(package))
        assert result["status"] == "skip", result
        assert result["reason"].startswith(f"no kernel that {sm} would use in flashinfer_cubin; not judged")
        assert "trtllm-gen FMHA (1 files)" in result["reason"] and "DeepGEMM (1 files)" in result["reason"]
        assert (f"excluded, not used on {sm}: trtllm-gen FMHA, 1 files (built for compute capability 10.x only"
                in result["evidence"])
        assert "flashinfer/artifacts.py:141-142" in result["evidence"]
        assert "deep_gemm.py:1382" in result["evidence"]
        assert result["metrics"]["packages"]["flashinfer_cubin"]["excluded"] == {
            "trtllm-gen FMHA": 1, "trtllm-gen batched GEMM (fused MoE)": 1, "trtllm-gen GEMM": 1, "DeepGEMM": 1}
    blackwell = run_script(bare_python, "kernel_cubins.py", "--arch", "10.0", "--method", "parse", "--path",
                           str(package))
    assert blackwell["status"] == "pass"                     # SM10x uses them: judged, and they cover it
    assert "flashinfer_cubin: 3/4 files" in blackwell["reason"] and "not judged" not in blackwell["reason"]


def test_kernel_cubins_exclusions_hide_no_real_gap(bare_python, tmp_path):
    # A flashinfer_cubin file outside the SM10x-only families is judged like any other.
    package = flashinfer_cubin_layout(tmp_path, {"cubins/aaaa/fmha/cudnn/sdpa_sm90.cubin": [(2, 90, 0x100011)]})
    result = run_script(bare_python, "kernel_cubins.py", "--arch", "12.0", "--method", "parse", "--path",
                        str(package))
    assert result["status"] == "fail", result
    assert result["reason"].startswith("no code for sm_120 in flashinfer_cubin (sm_90a); not judged")
    # Another package is judged whatever flashinfer_cubin holds.
    kernels = tmp_path / "sgl_kernel"
    kernels.mkdir()
    (kernels / "common_ops.fatbin").write_bytes(synthetic_fatbin([(2, 120, 0x200011)]))
    both = run_script(bare_python, "kernel_cubins.py", "--arch", "12.0", "--method", "parse", "--path",
                      str(flashinfer_cubin_layout(tmp_path / "clean")), "--path", str(kernels))
    assert both["status"] == "pass", both
    assert both["reason"].startswith("sgl_kernel carry code for sm_120 (sgl_kernel: 1/1 files")
    assert "not judged, built for other GPUs by design: flashinfer_cubin: trtllm-gen" in both["reason"]


def test_kernel_cubins_names_the_files_that_lack_the_target_and_what_they_cost(bare_python, tmp_path):
    """sglang-kernel's FA3 and FlashMLA objects carry no sm_120 code (0.4.2: sm_80 sm_86 sm_90a and sm_90a
    sm_100a sm_103a): the package still covers sm_120 through common_ops, and the reason says which files do
    not and which backends that rules out."""
    package = tmp_path / "sgl_kernel"
    (package / "sm100").mkdir(parents=True)
    (package / "sm100" / "common_ops.abi3.so").write_bytes(synthetic_fatbin([(2, 120, 0x100011)]))
    (package / "flash_ops.abi3.so").write_bytes(synthetic_fatbin([(2, 80, 0x11), (2, 86, 0x11), (2, 90, 0x100011)]))
    (package / "flashmla_ops.abi3.so").write_bytes(synthetic_fatbin([(2, 90, 0x100011), (2, 100, 0x100011)]))
    result = run_script(bare_python, "kernel_cubins.py", "--arch", "12.0", "--method", "parse", "--path",
                        str(package))
    assert result["status"] == "pass", result
    assert "sgl_kernel: 1/3 files" in result["reason"]
    assert ("no code for sm_120 in sgl_kernel/flash_ops.abi3.so (FlashAttention 3: SGLang's fa3 attention backend"
            in result["reason"])
    assert "sgl_kernel/flashmla_ops.abi3.so (FlashMLA: SGLang's flashmla attention backend)" in result["reason"]
    assert "attention_registry.py:241-245" in result["evidence"]
    assert sorted(result["metrics"]["packages"]["sgl_kernel"]["not_covering"]) == ["flash_ops.abi3.so",
                                                                                  "flashmla_ops.abi3.so"]


def test_kernel_cubins_names_a_few_of_many_files_that_lack_the_target(bare_python, tmp_path):
    """flashinfer-cubin 0.6.3 holds hundreds of sm_103a-only cubins a sm_100 target has no code in: the reason
    names three (those whose cost is known first) and counts the rest, the evidence lists the first twelve, the
    metrics a hundred and the total."""
    package = tmp_path / "sgl_kernel"
    package.mkdir()
    (package / "common_ops.fatbin").write_bytes(synthetic_fatbin([(2, 100, 0x100011)]))
    for i in range(130):
        (package / f"k{i:03d}.fatbin").write_bytes(synthetic_fatbin([(2, 103, 0x100011)]))
    (package / "zz").mkdir()   # a file whose cost is known comes first wherever it lies
    (package / "zz" / "flash_ops.abi3.so").write_bytes(synthetic_fatbin([(2, 90, 0x100011)]))
    result = run_script(bare_python, "kernel_cubins.py", "--arch", "10.0", "--method", "parse", "--path",
                        str(package))
    assert result["status"] == "pass", result
    reason = result["reason"].split("; no code for sm_100 in ")[1]
    assert reason.startswith("sgl_kernel/zz/flash_ops.abi3.so (FlashAttention 3:"), reason
    assert reason.endswith("sgl_kernel/k000.fatbin, sgl_kernel/k001.fatbin, 128 more sgl_kernel files (the evidence "
                           "lists the first 12)")
    assert "no code for sm_100: k010.fatbin" in result["evidence"] and "k011.fatbin" not in result["evidence"]
    assert "... and 119 more files with no code for sm_100" in result["evidence"]
    metrics = result["metrics"]["packages"]["sgl_kernel"]
    assert len(metrics["not_covering"]) == 100 and metrics["not_covering_total"] == 131


def test_kernel_cubins_skips_without_kernel_packages(bare_python):
    result = run_script(bare_python, "kernel_cubins.py", "--arch", "12.0")
    assert result["status"] == "skip"
    assert "no kernel packages" in result["reason"]


# --------------------------------------------------------------------------------------------- runtime

def test_nccl_graph_gloo_harness_passes_with_two_processes(torch_python):
    result = run_script(torch_python, "nccl_graph.py", "--backend", "gloo", "--gpus", "2", "--algo", "tree",
                        "--phase-timeout", "60", timeout=180)
    assert result["status"] == "pass", result
    assert result["reason"].startswith("gloo harness: 2 ranks rendezvoused")
    assert "says nothing about NCCL" in result["reason"]
    assert "rank 1 eager ok" in result["evidence"] and "rank 0 graph_capture skip" in result["evidence"]
    assert result["metrics"]["NCCL_ALGO"] == "allreduce:tree"


EP_SMALL = ("--backend", "gloo", "--gpus", "2", "--tokens", "64", "--hidden", "32", "--topk", "4", "--experts", "8",
            "--phase-timeout", "60")


def test_ep_all_to_all_gloo_harness_verifies_every_row(torch_python):
    result = run_script(torch_python, "ep_all_to_all.py", *EP_SMALL, timeout=180)
    assert result["status"] == "pass", result
    assert result["reason"].startswith("gloo harness: 2 ranks exchanged counts and 512 (token, expert) rows")
    assert "says nothing about NCCL" in result["reason"]
    metrics = result["metrics"]
    # every (token, slot) pair of both ranks (2 x 64 x 4) was checked at its receiver and back home
    assert metrics["dispatch_rows_verified"] == metrics["combine_rows_verified"] == 512
    assert metrics["dispatch_send_bytes_max_rank"] == 64 * 4 * 32 * 4          # float32 rows
    assert metrics["dispatch_us_max_rank"] > 0 and metrics["combine_us_max_rank"] > 0
    assert metrics["deepep"].startswith("absent: no deep_ep module")
    assert "rank 1 dispatch ok" in result["evidence"] and "rank 0 graph_capture skip" in result["evidence"]


def test_ep_a2a_without_deepep_is_a_skip_before_torch_runs(bare_python):
    """ep-a2a (decide-by sglang, NCCL) is DeepEP's verdict: in an image without DeepEP it is a skip saying so,
    decided before any rank starts, so a hang or crash of torch's all_to_all can never be filed under it."""
    result = run_script(bare_python, "ep_all_to_all.py", "--backend", "nccl", "--gpus", "8", "--arch", "12.0")
    assert result["status"] == "skip", result
    assert result["reason"].startswith("DeepEP not in this image (no deep_ep module")
    assert "torch's all_to_all is torch-a2a's probe" in result["reason"]
    no_deepep = run_script(bare_python, "ep_all_to_all.py", "--backend", "nccl", "--gpus", "8", "--no-deepep")
    assert no_deepep["reason"].startswith("DeepEP not run (--no-deepep)")


def test_sglang_custom_allreduce_jit_is_built_before_the_timed_phases():
    """SGLang 0.5.23's CustomAllReduceV2 JIT-compiles three modules on first use: the probe builds them in its
    own 'jit' phase (own budget, own time); the legacy class runs prebuilt kernels and builds nothing."""
    import types
    sf = script_module("_sfprobe")
    calls = []
    fake = types.ModuleType(sf.SGLANG_JIT_ALL_REDUCE)
    fake._init_communicator = lambda: calls.append("communicator")
    fake._init_ipc_manager = lambda: calls.append("ipc")
    fake.get_all_reduce_module = lambda dtype, world_size: calls.append(f"kernel {dtype} {world_size}")
    torch = types.SimpleNamespace(bfloat16="bf16")

    CustomAllReduceV2 = type("CustomAllReduceV2", (), {})   # noqa: N806 - SGLang's class names
    CustomAllreduce = type("CustomAllreduce", (), {})       # noqa: N806

    sys.modules[sf.SGLANG_JIT_ALL_REDUCE] = fake
    try:
        built = sf.warm_sglang_custom_allreduce_jit(CustomAllReduceV2, 8, torch)
    finally:
        del sys.modules[sf.SGLANG_JIT_ALL_REDUCE]
    assert calls == ["communicator", "ipc", "kernel bf16 8"]
    assert built["jit"] == "_init_communicator, _init_ipc_manager, get_all_reduce_module(bfloat16, 8)"
    assert built["jit_s"] >= 0
    assert sf.warm_sglang_custom_allreduce_jit(CustomAllreduce, 8, torch) == {
        "jit": "nothing to build: CustomAllreduce runs prebuilt kernels"}


def test_ep_a2a_is_undecided_when_torch_fails_before_deepeps_round():
    sf, ep = script_module("_sfprobe"), ep_module()
    hung = sf.ScriptResult("fail", "nccl all_to_all_single ...: rank 3 made no progress in phase 'dispatch' for 120 s "
                           "(hang); all ranks were killed", "log")
    result = ep.torch_failed_first(hung)
    assert result.status == "undecided" and result.evidence == "log"
    assert result.reason.startswith("DeepEP's round was not reached: torch's all_to_all_single failed first (fail: ")


@pytest.mark.parametrize("phase", ["dispatch", "combine"])
def test_ep_all_to_all_check_fails_on_one_damaged_value(torch_python, phase):
    """--corrupt-rank changes one received value on rank 1: the exact check must name that row."""
    result = run_script(torch_python, "ep_all_to_all.py", *EP_SMALL, "--corrupt-rank", "1", "--corrupt-phase", phase,
                        timeout=180)
    assert result["status"] == "fail", result
    assert f"rank 1 {phase} fail: AssertionError: {phase}: 1 of " in result["evidence"]
    assert "rows differ; first row 0: expected (src " in result["evidence"]


def test_ep_all_to_all_deepep_dispatch_check_catches_damage(torch_python):
    """The DeepEP checks (GPU-only in the probe) on a DeepEP-shaped inbox built on CPU: intact passes,
    one changed value or a wrong per-expert count fails."""
    code = f"""
import sys
sys.path.insert(0, {str(SCRIPTS)!r})
import torch
import ep_all_to_all as ep

shape, world, rank, seed = ep.Shape(tokens=64, hidden=16, topk=4, experts=8), 2, 1, 0
per_rank = shape.experts // world
blocks, ends, per_expert = [], [], [0] * per_rank
for src in range(world):
    experts = ep.routing(torch, src, shape, seed)
    tokens = ((experts // per_rank) == rank).any(dim=1).nonzero().flatten()
    rows = ep.encode_rows(torch, src, tokens, torch.zeros_like(tokens), shape.hidden, torch.bfloat16, "cpu")
    blocks.append(rows.flip(0))  # DeepEP promises no order inside a source's block
    ends.append(sum(b.shape[0] for b in blocks))
    for i in range(per_rank):
        per_expert[i] += int((experts == rank * per_rank + i).sum())
recv_x, prefix = torch.cat(blocks), torch.tensor([[0, end] for end in ends])
ep.check_deepep_dispatch(torch, recv_x, per_expert, prefix, rank, world, shape, seed)
print("intact", recv_x.shape[0])
damaged = recv_x.clone()
damaged[3, 9] += 1
for inbox, counts in ((damaged, per_expert), (recv_x, [per_expert[0] + 1, *per_expert[1:]])):
    try:
        ep.check_deepep_dispatch(torch, inbox, counts, prefix, rank, world, shape, seed)
    except AssertionError as exc:
        print("caught", exc)
"""
    proc = subprocess.run([str(torch_python), "-c", code], check=True, capture_output=True, text=True, timeout=120)
    lines = proc.stdout.splitlines()
    assert lines[0].startswith("intact ") and int(lines[0].split()[1]) > 0
    assert lines[1].startswith("caught DeepEP dispatch from rank 0: 1 of ")
    assert lines[2].startswith("caught DeepEP tokens per local expert: [")
    assert len(lines) == 3


def deepep_calls() -> dict[str, tuple[int, set[str]]]:
    """What ep_all_to_all.py calls on DeepEP: method -> (positional arguments, keyword names)."""
    import ast

    calls: dict[str, tuple[int, set[str]]] = {}
    for node in ast.walk(ast.parse((SCRIPTS / "ep_all_to_all.py").read_text())):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            owner = ast.unparse(node.func.value)
            if owner in ("buffer", "deep_ep"):
                name = "__init__" if node.func.attr == "Buffer" else node.func.attr
                calls[name] = (len(node.args), {k.arg for k in node.keywords if k.arg})
    return calls


def test_ep_all_to_all_calls_deepep_as_its_release_defines_it():
    """The DeepEP calls (GPU-only) against the real deep_ep/buffers/legacy.py of the sgl-deep-ep wheel
    (DeepEP 2.1.0 as SGLang ships it): names, positional arity, keyword names, the tuple sizes the
    probe unpacks and the handle's first element (the rank prefix matrix)."""
    import ast

    python = venvs.build_venv("sgl-deep-ep-0.1.2.post1-nodeps", [["--no-deps", "sgl-deep-ep==0.1.2.post1"]])
    legacy = next(python.parent.parent.glob("lib/python3*/site-packages/deep_ep/buffers/legacy.py"))
    buffer = next(n for n in ast.parse(legacy.read_text()).body if isinstance(n, ast.ClassDef) and n.name == "Buffer")
    methods = {n.name: n for n in buffer.body if isinstance(n, ast.FunctionDef)}
    calls = deepep_calls()
    assert set(calls) == {"__init__", "get_dispatch_layout", "dispatch", "combine", "destroy"}
    for name, (positional, keywords) in calls.items():
        params = [a.arg for a in methods[name].args.args][1:]  # without self
        assert positional <= len(params) and keywords <= set(params), (name, params)
    assert "explicitly_destroy" in [a.arg for a in methods["__init__"].args.args]
    # the probe unpacks 5 from get_dispatch_layout, 6 from dispatch, 3 from combine
    for name, size in (("get_dispatch_layout", 5), ("dispatch", 6), ("combine", 3)):
        tuples = [r.value for r in ast.walk(methods[name]) if isinstance(r, ast.Return) and isinstance(r.value, ast.Tuple)]
        assert tuples and all(len(t.elts) == size for t in tuples), name
    handle = next(n for n in ast.walk(methods["dispatch"]) if isinstance(n, ast.Assign)
                  and [ast.unparse(t) for t in n.targets] == ["handle"])
    assert ast.unparse(handle.value.elts[0]) == "rank_prefix_matrix"


def script_module(name: str):
    """An in-image script (or helper) imported in this interpreter, the way the scripts import each other."""
    sys.path.insert(0, str(SCRIPTS))
    try:
        return importlib.import_module(name)
    finally:
        sys.path.pop(0)


def ep_module():
    return script_module("ep_all_to_all")


def test_ep_a2a_is_decided_by_deepep_torch_a2a_by_torch():
    ep = ep_module()
    sf = ep.sf
    core = [sf.RankEvent(rank, phase, "ok", data={"rows": 10}) for rank in (0, 1)
            for phase in ("init", "dispatch", "combine", "graph_replay")]
    built = [sf.RankEvent(rank, "deepep_buffer", "ok", data={"version": "1.2.1"}) for rank in (0, 1)]
    hung_in_deepep = sf.RanksOutcome((*core, *built), (-9, -9), (1, "deepep_round", 121.0))
    judged, stuck = ep.split_deepep(hung_in_deepep)
    assert sf.ranks_result(judged, "x") is None
    metrics = ep.deepep_metrics(hung_in_deepep, "nccl", True, "distribution deep-ep", stuck)
    assert metrics["deepep"] == ("fail: hang: rank 1 made no progress in phase 'deepep_round' for 121 s; "
                                 "all ranks were killed")
    assert metrics["deepep_version"] == "1.2.1"
    metrics = {**metrics, "dispatch_rows_verified": 20}
    torch_result = ep.decide("nccl", 2, "x", metrics, judged)      # torch-a2a: torch's all-to-all was fine
    assert torch_result.status == "pass" and torch_result.reason.endswith("DeepEP: " + metrics["deepep"])
    result = ep.sglang_backend_result(torch_result, metrics, 2)    # ep-a2a: what SGLang would run hung
    assert result.status == "fail"
    assert result.reason == ("SGLang --moe-a2a-backend deepep on 2 GPUs: DeepEP hang: rank 1 made no progress in "
                             "phase 'deepep_round' for 121 s; all ranks were killed; torch all_to_all_single: pass")
    assert metrics["torch_all_to_all"].startswith("pass: x: 20 (token, expert) rows")
    hung_in_dispatch = sf.RanksOutcome(tuple(core[:1]), (-9, -9), (1, "dispatch", 121.0))
    judged, stuck = ep.split_deepep(hung_in_dispatch)
    assert stuck == "" and sf.ranks_result(judged, "x").status == "fail"


@pytest.mark.parametrize("script,args", [
    ("nccl_graph.py", ("--algo", "tree")),
    ("nccl_graph.py", ("--algo", "ring")),
    ("nccl_graph.py", ("--algo", "tree", "--variant", "global")),
    ("symm_mem.py", ()),
    ("custom_allreduce.py", ()),
    ("p2p_matrix.py", ()),
    # ep_all_to_all.py deciding ep-a2a skips for the missing DeepEP first (test_ep_a2a_without_deepep_...).
    ("ep_all_to_all.py", ("--backend", "nccl", "--decide-by", "torch", "--no-deepep")),
    ("flashinfer_run.py", ()),
])
def test_runtime_probes_skip_without_a_gpu(torch_python, script, args):
    result = run_script(torch_python, script, "--arch", "12.0", "--gpus", "8", "--interconnect", "pcie", *args)
    if result["facts"].get("cuda_device_count"):
        skip_gpu_only("a GPU is visible here")
    assert result["status"] == "skip"
    assert result["reason"] == NO_GPU


@pytest.mark.parametrize("mode,reason", [
    ("ok", "all ranks finished"),
    ("hang", "rank 1 made no progress in phase 'work' for 3 s (hang); all ranks were killed"),
    ("crash", "rank 1 died (SIGSEGV) in phase 'work'"),
    ("fail", "rank 1 failed in phase 'work': AssertionError: rank 1 computed the wrong sum"),
    # A first JIT compile twice as long as the phase timeout: no hang inside its own budget, a hang without one.
    ("slow-jit", "all ranks finished"),
    ("slow-jit-unbudgeted", "made no progress in phase 'jit' for 3 s (hang); all ranks were killed"),
])
def test_rank_harness_detects_hangs_crashes_and_failures(bare_python, mode, reason):
    result = run_script(bare_python, MISBEHAVE / "ranks.py", "--mode", mode, "--phase-timeout", "3", timeout=120)
    assert reason in result["reason"]
    assert result["status"] == ("pass" if mode in ("ok", "slow-jit") else "fail")
    assert result["metrics"]["seconds"] < 30          # stuck peers are killed, not waited for


@pytest.mark.gpu
def test_nccl_graph_on_gpus():
    """On a machine with 2+ GPUs and a CUDA torch in this interpreter: the real NCCL path."""
    require_host_gpus(2)
    try:
        import torch
    except ImportError:
        pytest.skip("torch not installed in the test interpreter")
    if torch.cuda.device_count() < 2:
        pytest.skip(f"needs 2 GPUs, {torch.cuda.device_count()} visible")
    result = run_script(sys.executable, "nccl_graph.py", "--gpus", "2", "--algo", "ring", timeout=600)
    assert result["status"] in ("pass", "fail")
    assert "graph_capture" in result["evidence"]


# --------------------------------------------------------------------------------------------- misbehaving

def test_misbehaving_probes_behave_badly(bare_python):
    with pytest.raises(subprocess.TimeoutExpired) as hung:
        subprocess.run([str(bare_python), str(MISBEHAVE / "hang.py")], check=False, capture_output=True, text=True, timeout=3)
    assert b"starting" in (hung.value.stdout or b"") or "starting" in str(hung.value.stdout)
    crashed = subprocess.run([str(bare_python), str(MISBEHAVE / "segv.py")], check=False, capture_output=True, text=True,
                             timeout=60)
    assert crashed.returncode == -11
    assert "segv probe: line 1" in crashed.stdout


# --------------------------------------------------------------------------------------------- NCCL Tree, global

NCCL_LOG = Path(__file__).resolve().parent / "data" / "nccl" / "global_tree_allgather.txt"


def nccl_graph_module():
    return script_module("nccl_graph")


def nccl_log_lines() -> list[str]:
    return [line for line in NCCL_LOG.read_text().splitlines() if not line.startswith("#")]


def test_nccl_refusal_is_read_from_the_nccl_log_and_from_torchs_error():
    nccl_graph = nccl_graph_module()
    sf = nccl_graph.sf
    warn, _, torch_error = nccl_log_lines()[0], nccl_log_lines()[1], "\n".join(nccl_log_lines()[2:])
    words = "no algorithm/protocol available for function AllGather with datatype ncclInt8. NCCL_ALGO was set to Tree."
    for text in (warn, torch_error, sf.one_line(torch_error)):
        assert nccl_graph.nccl_refusal(text) == {"words": words, "function": "AllGather", "datatype": "ncclInt8",
                                                 "NCCL_ALGO": "Tree"}
    # releases before 2.19 say "No algorithm/protocol ..." and may have no NCCL_ALGO tail
    older = nccl_graph.nccl_refusal("NCCL WARN No algorithm/protocol available for function Broadcast with datatype "
                                    "ncclInt8")
    assert older is not None and older["function"] == "Broadcast" and older["NCCL_ALGO"] == ""
    assert nccl_graph.nccl_refusal("ncclInvalidUsage: Duplicate GPU detected") is None


def test_nccl_global_tree_result_quotes_nccl_per_collective():
    """Ranks that met the refusal in all_gather, reduce_scatter and broadcast (the error torch raises,
    as the rank harness reports it) and passed all_reduce: a fail with NCCL's words per collective."""
    nccl_graph = nccl_graph_module()
    sf = nccl_graph.sf
    error = sf.describe_exception(RuntimeError("\n".join(nccl_log_lines()[2:])))
    events = [sf.RankEvent(rank, "init", "ok") for rank in (0, 1)]
    for rank in (0, 1):
        events.append(sf.RankEvent(rank, "all_reduce", "ok", data={"graph_us": 20.0 + rank}))
        for name, function in (("all_gather", "AllGather"), ("reduce_scatter", "ReduceScatter"),
                               ("broadcast", "Broadcast")):
            events.append(sf.RankEvent(rank, name, "check-fail", sf.one_line(error.replace("AllGather", function))))
    outcome = sf.RanksOutcome(tuple(events), (0, 0), None, ())
    metrics: dict = {}
    result = nccl_graph.global_result("nccl", "nccl all 4, 2 ranks, NCCL_ALGO=Tree", metrics, outcome)
    assert result.status == "fail"
    assert metrics["collectives"] == {
        "all_reduce": "pass (graph_us 21.0)",
        **{name: f"NCCL: no algorithm/protocol available for function {function} with datatype ncclInt8. "
                 "NCCL_ALGO was set to Tree."
           for name, function in (("all_gather", "AllGather"), ("reduce_scatter", "ReduceScatter"),
                                  ("broadcast", "Broadcast"))}}
    assert result.reason.startswith("nccl all 4, 2 ranks, NCCL_ALGO=Tree: 3 of 4 collectives failed: "
                                     "all_reduce: pass")
    assert "broadcast: NCCL: no algorithm/protocol available for function Broadcast" in result.reason


def test_nccl_algo_the_image_sets_is_kept_when_it_is_the_variants_own():
    nccl_graph = nccl_graph_module()
    assert nccl_graph.nccl_algo_setting("per-collective", "tree", {}) == ("allreduce:tree", "probe")
    assert nccl_graph.nccl_algo_setting("global", "tree", {}) == ("Tree", "probe")
    assert nccl_graph.nccl_algo_setting("global", "tree", {"NCCL_ALGO": "tree"}) == ("tree", "image")
    assert nccl_graph.nccl_algo_setting("per-collective", "ring", {"NCCL_ALGO": "allreduce:ring"}) == \
        ("allreduce:ring", "image")
    for variant, algo, own in (("global", "tree", "TREE"), ("per-collective", "ring", "allreduce:Ring")):
        assert nccl_graph.image_forces_other_algo(variant, algo, {"NCCL_ALGO": own}) is None
        assert nccl_graph.image_forces_other_algo(variant, algo, {}) is None


def test_nccl_algo_the_image_forces_otherwise_is_a_skip_naming_it(torch_python):
    """An image with NCCL_ALGO=allreduce:tree says nothing about a global NCCL_ALGO=Tree (nor the
    reverse): the ranks would run with the image's value, so the verdict is a skip, not a pass."""
    nccl_graph = nccl_graph_module()
    assert nccl_graph.image_forces_other_algo("global", "tree", {"NCCL_ALGO": "allreduce:tree"}) == "allreduce:tree"
    assert nccl_graph.image_forces_other_algo("per-collective", "tree", {"NCCL_ALGO": "Tree"}) == "Tree"
    assert nccl_graph.image_forces_other_algo("per-collective", "tree", {"NCCL_ALGO": "allreduce:ring"}) == \
        "allreduce:ring"
    result = run_script(torch_python, "nccl_graph.py", "--backend", "gloo", "--gpus", "2", "--variant", "global",
                        "--phase-timeout", "60", env={"NCCL_ALGO": "allreduce:tree"}, timeout=180)
    assert result["status"] == "skip", result
    assert result["reason"] == ("the image forces NCCL_ALGO=allreduce:tree; nccl-global-tree cannot be decided "
                                "here")
    assert result["evidence"] == "NCCL_ALGO=allreduce:tree"


def test_nccl_global_gloo_harness_runs_every_collective(torch_python):
    result = run_script(torch_python, "nccl_graph.py", "--backend", "gloo", "--gpus", "2", "--variant", "global",
                        "--phase-timeout", "60", env={"NCCL_ALGO": "tree"}, timeout=180)
    assert result["status"] == "pass", result
    metrics = result["metrics"]
    assert metrics["NCCL_ALGO"] == "tree" and metrics["NCCL_ALGO_source"] == "image"
    assert "NCCL_ALGO=tree (set by the image)" in result["reason"]
    assert set(metrics["collectives"]) == {"all_reduce", "all_gather", "reduce_scatter", "broadcast"}
    assert metrics["collectives"]["reduce_scatter"] == "skipped: gloo has no reduce_scatter"
    for name in ("all_reduce", "all_gather", "broadcast"):
        assert metrics["collectives"][name].startswith("pass (eager_us "), metrics


def test_ep_a2a_without_deepep_is_a_skip_that_names_torchs_result():
    ep = ep_module()
    sf = ep.sf
    torch_result = sf.ScriptResult("pass", "x: 20 (token, expert) rows exact", "log")
    absent = {"deepep": "absent: no deep_ep module and no deep-ep/sgl-deep-ep/sgl-deep-ep-v25 distribution"}
    result = ep.sglang_backend_result(torch_result, absent, 4)
    assert result.status == "skip"
    assert result.reason.startswith("no all-to-all backend SGLang could use in this image (absent: no deep_ep")
    assert "torch's all_to_all_single: pass, see torch-a2a" in result.reason
    passed = ep.sglang_backend_result(torch_result, {"deepep": "pass", "deepep_round_us_max_rank": 812.5,
                                                      "deepep_version": "1.2.1"}, 4)
    assert passed.status == "pass" and "DeepEP's intranode dispatch/combine round matched (812.5 us" in passed.reason


# --------------------------------------------------------------------------------------------- nothing outlives a probe

def alive(pid: int) -> bool:
    """A process that exists and is not a zombie (a zombie is dead, only not reaped yet)."""
    try:
        with open(f"/proc/{pid}/stat") as handle:
            return handle.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except OSError:
        return False


def wait_for_pidfile(path: Path, timeout_s: float = 60) -> int:
    import time
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if path.exists() and path.read_text().strip():
            return int(path.read_text())
        time.sleep(0.1)
    raise AssertionError(f"{path} never written")


@pytest.mark.parametrize("mode, phase_timeout", [("orphan", "30"), ("orphan-hang", "3")])
def test_a_ranks_grandchild_in_its_own_session_is_gone_after_the_run(bare_python, tmp_path, mode, phase_timeout):
    """A rank starts ``sleep 600`` in a new session that ignores SIGTERM, then finishes or hangs
    until the phase timeout: when the harness returns, the grandchild is gone too."""
    pidfile = tmp_path / "grandchild.pid"
    result = run_script(bare_python, MISBEHAVE / "ranks.py", "--mode", mode, "--phase-timeout", phase_timeout,
                        "--pidfile", str(pidfile), timeout=120)
    assert result["status"] == ("pass" if mode == "orphan" else "fail"), result
    grandchild = int(pidfile.read_text())
    assert not alive(grandchild), f"rank 1's grandchild {grandchild} outlived the run ({mode})"


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_stopping_the_probe_ends_ranks_and_their_grandchildren(bare_python, tmp_path, signum):
    """The runner stops a probe at its timeout with SIGTERM (an interrupt is SIGINT): the ranks and
    the grandchild one of them started in its own session go with it."""
    import time
    pidfile = tmp_path / "grandchild.pid"
    probe = subprocess.Popen([str(bare_python), str(MISBEHAVE / "ranks.py"), "--mode", "orphan-hang",
                              "--phase-timeout", "600", "--pidfile", str(pidfile)],
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        grandchild = wait_for_pidfile(pidfile)
        time.sleep(0.5)
        ranks = [int(p) for p in Path(f"/proc/{probe.pid}/task/{probe.pid}/children").read_text().split()]
        probe.send_signal(signum)
        probe.wait(timeout=30)
    finally:
        if probe.poll() is None:
            probe.kill()
    assert not alive(grandchild), "the grandchild outlived the stopped probe"
    # multiprocessing's resource tracker (a child too) leaves on its own once the probe's pipe closes
    deadline = time.monotonic() + 10
    while any(alive(pid) for pid in ranks) and time.monotonic() < deadline:
        time.sleep(0.1)
    survivors = [pid for pid in ranks if alive(pid)]
    assert len(ranks) >= 2 and not survivors, survivors


# --------------------------------------------------------------------------------------------- P2P: a real copy

def p2p_module():
    sys.path.insert(0, str(SCRIPTS))
    try:
        import p2p_matrix
    finally:
        sys.path.pop(0)
    return p2p_matrix


ALL_YES = [[True, True], [True, True]]


def test_p2p_passes_only_when_every_copy_arrived():
    p2p = p2p_module()
    sf = p2p.sf
    events = (sf.RankEvent(0, "copy 0->1", "ok", data={"gbps": 51.2}), sf.RankEvent(0, "copy 1->0", "ok",
                                                                                       data={"gbps": 49.8}))
    result = p2p.decide(2, ALL_YES, [(0, 1), (1, 0)], sf.RanksOutcome(events, (0,), None, ()))
    assert result.status == "pass"
    assert result.reason == ("all 2 ordered pairs of 2 GPUs report peer access and a 64 MiB copy over each arrived "
                             "intact (49.8-51.2 GB/s)")


def test_p2p_the_driver_says_yes_but_the_copy_hangs_or_lies():
    """The RTX PRO 6000 IOMMU/ACS case: can_device_access_peer is True, the copy hangs or returns garbage."""
    p2p = p2p_module()
    sf = p2p.sf
    hung = sf.RanksOutcome((sf.RankEvent(0, "copy 0->1", "start"),), (-9,), (0, "copy 0->1", 61.0), ())
    result = p2p.decide(2, ALL_YES, [(0, 1), (1, 0)], hung)
    assert result.status == "fail"
    assert result.reason.startswith("the driver admits peer access but 2 of 2 copies failed (0->1: hang: no "
                                     "progress for 61 s; the copy was killed; 1->0: not reached")
    garbage = sf.RanksOutcome((sf.RankEvent(0, "copy 0->1", "check-fail",
                                            "AssertionError: 16777216 of 16777216 int32 values differ after the "
                                            "copy 0->1"), sf.RankEvent(0, "copy 1->0", "ok", data={"gbps": 40.0})),
                              (0,), None, ())
    result = p2p.decide(2, ALL_YES, [(0, 1), (1, 0)], garbage)
    assert result.status == "fail" and "1 of 2 copies failed (0->1: AssertionError: 16777216 of" in result.reason
    assert result.metrics["copies"] == {"0->1": "AssertionError: 16777216 of 16777216 int32 values differ after "
                                                "the copy 0->1", "1->0": "ok 40.0 GB/s"}


def test_p2p_pairs_the_driver_refuses_are_not_copied_and_fail():
    p2p = p2p_module()
    result = p2p.decide(2, [[True, False], [False, True]], [], None)
    assert result.status == "fail" and result.reason == "2 of 2 GPU pairs have no peer access (0->1, 1->0)"


GRAPH_REPLAY = textwrap.dedent("""
    import contextlib, sys, types
    sys.path.insert(0, {scripts!r})
    import torch
    import nccl_graph

    class Graph:
        \"\"\"A CUDA graph stand-in: records the collectives issued while capturing; replay reruns
        them, or does nothing (a broken replay).\"\"\"
        def __init__(self):
            self.captured = []
        def replay(self):
            if REPLAY_WORKS:
                for op in self.captured:
                    op()

    capturing = []

    @contextlib.contextmanager
    def graph(g):
        capturing.append(g)
        yield
        capturing.pop()

    cuda = types.SimpleNamespace(
        Stream=lambda: types.SimpleNamespace(wait_stream=lambda other: None),
        current_stream=lambda: types.SimpleNamespace(wait_stream=lambda other: None),
        stream=lambda s: contextlib.nullcontext(), synchronize=lambda: None, CUDAGraph=Graph, graph=graph)
    fake_torch = types.SimpleNamespace(full=torch.full, arange=torch.arange, float32=torch.float32, cuda=cuda)

    def issue(op):  # as under capture: recorded, not run
        (capturing[-1].captured.append if capturing else (lambda f: f()))(op)

    RANK, WORLD = 1, 2  # rank 1 of 2; rank 0 contributes 1 everywhere
    def all_reduce(t):
        issue(lambda: t.add_(1.0))
    def all_gather_into_tensor(out, shard):
        issue(lambda: (out[:shard.numel()].fill_(1.0), out[shard.numel():].copy_(shard)))
    def reduce_scatter_tensor(out, inp):
        issue(lambda: out.copy_(inp[out.numel():] + 1.0))
    def broadcast(t, src):
        issue(lambda: t.fill_(1.0))
    dist = types.SimpleNamespace(all_reduce=all_reduce, all_gather_into_tensor=all_gather_into_tensor,
                                 reduce_scatter_tensor=reduce_scatter_tensor, broadcast=broadcast)

    for REPLAY_WORKS in (True, False):
        for name in nccl_graph.GLOBAL_COLLECTIVES:
            try:
                nccl_graph.run_collective(fake_torch, dist, name, "cpu", RANK, WORLD, True,
                                          {{"numel": 8, "iters": 2}})
                print(REPLAY_WORKS, name, "pass")
            except AssertionError as error:
                print(REPLAY_WORKS, name, "fail", error)
""")


def test_nccl_global_graph_replay_check_fails_when_the_replay_does_nothing(torch_python, tmp_path):
    """The warm-up leaves the right answer in the outputs: only a replay that really ran the
    collective may pass the "graph replay" check (stand-in CUDA graph, a rank of 2 on CPU)."""
    script = tmp_path / "replay.py"
    script.write_text(GRAPH_REPLAY.format(scripts=str(SCRIPTS)))
    done = subprocess.run([str(torch_python), str(script)], capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    lines = done.stdout.splitlines()
    for name in ("all_reduce", "all_gather", "reduce_scatter", "broadcast"):
        assert f"True {name} pass" in lines, lines
        failed = [line for line in lines if line.startswith(f"False {name} fail")]
        assert failed and "graph replay" in failed[0], lines
