"""Virtual environments that hold real torch / FlashInfer / SGLang releases for the probe-script tests.

The probe scripts must be tested against the projects' real code, so the tests build small venvs
under ``/tmp/sf-probe-venvs`` (``SF_PROBE_VENVS`` overrides) and run the scripts in them as
subprocesses. Each venv is built once and reused while its recipe is unchanged (a marker file holds
the recipe); a file lock keeps concurrent sessions from building the same venv twice.

torch is always the small CPU wheel from the machine's wheelhouse (pip's find-links, ``/opt/wheels``
here; ``SF_TORCH_CPU_WHEEL`` names another): a CUDA torch from PyPI is gigabytes. FlashInfer and
SGLang are installed with ``--no-deps`` plus only what importing the modules the probes touch needs.
When pip cannot reach the index the test is skipped with pip's own words.
"""

from __future__ import annotations

import fcntl
import glob
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

VENV_ROOT = Path(os.environ.get("SF_PROBE_VENVS", "/tmp/sf-probe-venvs"))
PIP_TIMEOUT_S = 1200
NETWORK_TROUBLE = re.compile(r"NewConnectionError|Max retries exceeded|Temporary failure in name resolution|"
                             r"Network is unreachable|Could not fetch URL|No matching distribution found|"
                             r"Connection refused|Read timed out|ProxyError|SSLError")

# What importing FlashInfer's JIT modules needs (from flashinfer-python's requires, minus the
# cuDNN / CUTLASS-DSL / NCCL Python packages that only other modules import).
FLASHINFER_IMPORT_DEPS = ("ninja", "numpy", "packaging>=24.2", "requests", "tabulate", "tqdm", "einops", "click",
                          "nvidia-ml-py")
# What importing SGLang 0.5.9's device_communicators modules pulls in (found by importing them).
SGLANG_059_IMPORT_DEPS = ("pybase64", "ipython", "pydantic", "aiohttp", "orjson", "triton", "pyzmq", "pillow",
                          "starlette", "psutil", "requests", "numpy")
# What importing SGLang 0.5.23's device_communicators modules and custom_all_reduce_v2 pulls in (found
# by importing them the way the custom all-reduce tests do).
SGLANG_0523_IMPORT_DEPS = (*SGLANG_059_IMPORT_DEPS, "packaging", "msgspec", "tqdm", "apache-tvm-ffi>=0.1.11,<0.2")
# What importing SGLang 0.5.4.post3's sglang.srt.server_args pulls in (found by importing it), at
# the versions that SGLang pins where it pins one. 0.5.6.post2 / 0.5.7 also need torchvision (configs ->
# internvl_utils), whose PyPI wheels are CUDA builds that do not load against the CPU torch.
SGLANG_0543_SERVER_ARGS_DEPS = ("pybase64", "ipython", "pydantic", "aiohttp", "orjson", "safetensors", "triton",
                                "pyzmq", "fastapi", "pillow", "openai==2.6.1", "partial_json_parser",
                                "transformers==4.57.1", "dill", "sentencepiece")


def torch_cpu_wheel() -> str:
    """The local CPU torch wheel for this Python, or skip."""
    explicit = os.environ.get("SF_TORCH_CPU_WHEEL")
    tag = f"cp{sys.version_info.major}{sys.version_info.minor}"
    candidates = [explicit] if explicit else sorted(glob.glob(f"/opt/wheels/torch-*+cpu-{tag}-{tag}-*.whl"))
    if not candidates or not os.path.isfile(candidates[-1]):
        pytest.skip(f"no local CPU torch wheel for {tag} (looked in /opt/wheels; set SF_TORCH_CPU_WHEEL)")
    return candidates[-1]


def torch_cuda_wheel() -> str:
    """A local CUDA build of torch for this Python (pip's local indexes here), or skip: the only
    way to see a real compiled arch list, and too big (gigabytes with its CUDA wheels) to fetch."""
    explicit = os.environ.get("SF_CUDA_TORCH_WHEEL")
    tag = f"cp{sys.version_info.major}{sys.version_info.minor}"
    found = [explicit] if explicit else sorted(
        p for root in ("/opt/pypi-more/files", "/opt/pypi/files", "/opt/wheels")
        for p in glob.glob(f"{root}/torch-*-{tag}-{tag}-manylinux*.whl") if "+cpu" not in p)
    if not found or not os.path.isfile(found[-1]):
        pytest.skip("no local CUDA torch wheel (set SF_CUDA_TORCH_WHEEL to one)")
    return found[-1]


def _run(argv: list[str], timeout: float = PIP_TIMEOUT_S) -> subprocess.CompletedProcess:
    return subprocess.run(argv, check=False, capture_output=True, text=True, timeout=timeout)


def build_venv(name: str, steps: list[list[str]]) -> Path:
    """A venv ``name`` after ``pip install <step>`` for every step; returns its python.

    Reused when it was built from the same steps. Skips the test when pip cannot reach the index,
    fails it when pip fails for another reason.
    """
    VENV_ROOT.mkdir(parents=True, exist_ok=True)
    root = VENV_ROOT / name
    python = root / "bin" / "python"
    recipe = json.dumps({"python": sys.version, "steps": steps})
    with open(VENV_ROOT / f"{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        marker = root / ".sf-recipe"
        if python.exists() and marker.exists() and marker.read_text() == recipe:
            return python
        shutil.rmtree(root, ignore_errors=True)
        created = _run([sys.executable, "-m", "venv", str(root)], timeout=300)
        if created.returncode != 0:
            pytest.fail(f"python -m venv {root} failed: {created.stderr[-2000:]}")
        for step in steps:
            result = _run([str(python), "-m", "pip", "install", "--disable-pip-version-check", "-q", *step])
            if result.returncode != 0:
                output = result.stdout + result.stderr
                shutil.rmtree(root, ignore_errors=True)
                if NETWORK_TROUBLE.search(output):
                    pytest.skip(f"pip cannot reach the index for {name}: {output.strip()[-400:]}")
                pytest.fail(f"pip install {' '.join(step)} failed in {name}:\n{output[-3000:]}")
        marker.write_text(recipe)
    return python


def bare_venv() -> Path:
    """A venv with nothing installed (no torch, no FlashInfer, no SGLang)."""
    VENV_ROOT.mkdir(parents=True, exist_ok=True)
    root = VENV_ROOT / "bare"
    python = root / "bin" / "python"
    with open(VENV_ROOT / "bare.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not python.exists():
            result = _run([sys.executable, "-m", "venv", "--without-pip", str(root)], timeout=120)
            if result.returncode != 0:
                pytest.fail(f"python -m venv {root} failed: {result.stderr[-2000:]}")
    return python


def torch_steps() -> list[list[str]]:
    return [[torch_cpu_wheel()]]


def flashinfer_steps(version: str, tvm_ffi: str) -> list[list[str]]:
    """torch CPU + flashinfer-python ``version`` (no deps) + what its JIT modules import."""
    return [*torch_steps(), ["--no-deps", f"flashinfer-python=={version}"], [tvm_ffi, *FLASHINFER_IMPORT_DEPS]]
