"""Virtual environments that hold real torch / FlashInfer / SGLang releases for the probe-script tests.

The probe scripts must be tested against the projects' real code, so the tests build small venvs
under ``/tmp/sf-probe-venvs`` (``SF_PROBE_VENVS`` overrides) and run the scripts in them as
subprocesses. Each venv is built once and reused while its recipe is unchanged (a marker file holds
the recipe; its mtime is when the venv was last used); a file lock keeps concurrent sessions from
building the same venv twice.

The cache has a cap (``SF_PROBE_VENVS_CAP_GB``, default: stackforge.doctor.disk_budget's
PROBE_VENVS_CAP_GB): before a venv is built and when the session ends, the least recently used venvs
are removed until the folder is under it. Never removed: a venv this session uses, one another session
holds the lock of, or one used in the last hour (another session may be running in it).

torch is the small CPU wheel from the machine's wheelhouse (pip's find-links, ``/opt/wheels`` here;
``SF_TORCH_CPU_WHEEL`` names another) in every venv but one: ``torch-cuda-fi-0.7.2``
(test_probe_scripts.py's ``cuda_torch_python``; 6.1 GB with its nvidia-* wheels) holds a CUDA build
of torch because its two tests read what only a CUDA build has: the compiled arch list
(``torch._C._cuda_getArchFlags()``, test_torch_arch_cuda_build_reads_the_compiled_arch_list) and
``torch.version.cuda``, from which FlashInfer 0.7.2 takes its CUDA version when there is no nvcc
(test_fi072_runtime_flavour_resolves_from_torch_but_cannot_jit_without_nvcc). FlashInfer and SGLang are
installed with ``--no-deps`` plus only what importing the modules the probes touch needs. When pip
cannot reach the index the test is skipped with pip's own words.
"""

from __future__ import annotations

import atexit
import fcntl
import glob
import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from stackforge.doctor.disk_budget import GB, PROBE_VENVS_CAP_GB, PROBE_VENVS_DEFAULT, PROBE_VENVS_ENV

VENV_ROOT = Path(os.environ.get(PROBE_VENVS_ENV, PROBE_VENVS_DEFAULT))
CAP_BYTES = int(float(os.environ.get("SF_PROBE_VENVS_CAP_GB", PROBE_VENVS_CAP_GB)) * GB)
#: A venv used this recently may be in use by another session: never evicted.
IN_USE_S = 3600
MARKER = ".sf-recipe"
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
    _used(name)
    with open(VENV_ROOT / f"{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        marker = root / MARKER
        if python.exists() and marker.exists() and marker.read_text() == recipe:
            os.utime(marker)          # used now: the last to be evicted
            return python
        shutil.rmtree(root, ignore_errors=True)
        evict(CAP_BYTES)              # room for the new venv
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


# ------------------------------------------------------------------------------------------- the cap

_USED_HERE: set[str] = set()


def _used(name: str) -> None:
    """Remember that this session uses ``name`` (never evicted while it runs); evict at its end."""
    if not _USED_HERE:
        atexit.register(lambda: evict(CAP_BYTES, session_over=True))
    _USED_HERE.add(name)


def du_bytes(path: Path) -> int:
    done = subprocess.run(["du", "-s", "-B1", str(path)], check=False, capture_output=True, text=True, timeout=300)
    first = done.stdout.split()
    return int(first[0]) if first and first[0].isdigit() else 0


def evict(cap_bytes: int, *, session_over: bool = False, now: float | None = None) -> list[str]:
    """Remove the least recently used venvs until the cache is under ``cap_bytes``; the names removed.

    Kept whatever the size: the venvs this session uses (until ``session_over``), the ones whose lock
    another session holds, and the ones used in the last IN_USE_S seconds by another session.
    """
    if not VENV_ROOT.is_dir():
        return []
    now = time.time() if now is None else now
    venvs = {p.name: p for p in VENV_ROOT.iterdir() if p.is_dir()}
    sizes = {name: du_bytes(path) for name, path in venvs.items()}
    total = sum(sizes.values())
    removed = []
    for name in sorted(venvs, key=lambda n: _last_used(venvs[n])):
        if total <= cap_bytes:
            break
        ours = name in _USED_HERE
        if (ours and not session_over) or (not ours and now - _last_used(venvs[name]) < IN_USE_S):
            continue
        with open(VENV_ROOT / f"{name}.lock", "w") as lock:
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:       # another session is building or checking it
                continue
            shutil.rmtree(venvs[name], ignore_errors=True)
        total -= sizes[name]
        removed.append(name)
    return removed


def _last_used(root: Path) -> float:
    for path in (root / MARKER, root):
        try:
            return path.stat().st_mtime
        except OSError:
            continue
    return 0.0


def bare_venv() -> Path:
    """A venv with nothing installed (no torch, no FlashInfer, no SGLang)."""
    VENV_ROOT.mkdir(parents=True, exist_ok=True)
    root = VENV_ROOT / "bare"
    python = root / "bin" / "python"
    _used("bare")
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
