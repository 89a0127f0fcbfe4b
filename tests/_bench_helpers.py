"""Helpers shared by the bench tests (not a test module).

The bench scripts run in their own interpreter, as they do inside images. The all-reduce and GEMM
harness tests need one with torch: the CPU wheel from the machine's wheelhouse, in a venv outside
the project (``STACKFORGE_TEST_TORCH_PYTHON``, default ``/tmp/sf-bench-venv/bin/python``). A CUDA
torch is never installed for tests.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

from stackforge.edges import runner
from stackforge.inimage._sfshared import parse_result_line

REPO = Path(__file__).resolve().parent.parent
SCRIPTS = REPO / "stackforge" / "bench" / "scripts"
TESTS = REPO / "tests"
TORCH_VENV_HINT = ("python3.11 -m venv /tmp/sf-bench-venv && /tmp/sf-bench-venv/bin/pip install torch==2.13.0 "
                   "(the CPU wheel from /opt/wheels), or set STACKFORGE_TEST_TORCH_PYTHON")


def _has_torch(python: str) -> bool:
    try:
        return subprocess.run([python, "-c", "import torch"], capture_output=True, timeout=120).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


def torch_python() -> str:
    """An interpreter with torch for the harness tests; skips the test (with how to get one) if none."""
    candidates = [os.environ.get("STACKFORGE_TEST_TORCH_PYTHON", ""), "/tmp/sf-bench-venv/bin/python", sys.executable]
    for python in candidates:
        if python and Path(python).exists() and _has_torch(python):
            return python
    pytest.skip(f"needs a Python with torch (CPU build): {TORCH_VENV_HINT}")


def cuda_visible(python: str) -> bool:
    """Whether this interpreter's torch sees a CUDA device: decides GPU-only skips before running a script."""
    done = subprocess.run([python, "-c", "import torch; print(torch.cuda.is_available())"], capture_output=True,
                          text=True, timeout=120)
    return done.stdout.strip() == "True"


def python_without_torch() -> str:
    """An interpreter that lacks torch (the test interpreter usually does), to check the skip path."""
    for python in (sys.executable, "/usr/bin/python3"):
        if Path(python).exists() and not _has_torch(python):
            return python
    pytest.skip("every interpreter here has torch; the no-torch path needs one without")


def load_script(name: str) -> ModuleType:
    """Import an in-image script as a module (its top level only defines things).

    Run as a script, its folder is ``sys.path[0]``, where it finds ``_sfbench``; imported by path
    it is not, so the folder is put on ``sys.path`` here, as the interpreter would.
    """
    if str(SCRIPTS) not in sys.path:
        sys.path.insert(0, str(SCRIPTS))
    spec = importlib.util.spec_from_file_location(f"sf_bench_{name}", SCRIPTS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    assert spec.loader is not None
    spec.loader.exec_module(module)
    return module


def run_script(python: str, name: str, *args: str, timeout: float = 300, env: dict | None = None,
               cwd: Path | None = None) -> tuple[dict, runner.CommandResult]:
    """Run a bench script through stackforge's runner; return its STACKFORGE_RESULT payload and the run.

    The result line must be the last line of the output: that is the contract.
    """
    result = runner.run([python, str(SCRIPTS / f"{name}.py"), *args], timeout=timeout,
                        env={"PYTHONUNBUFFERED": "1", **(env or {})}, cwd=cwd, tail_chars=200_000)
    assert not result.timed_out, result.output_tail[-3000:]
    last = result.output_tail.strip().splitlines()[-1]
    assert last.startswith("STACKFORGE_RESULT "), f"last line is not the result line: {last[:300]}"
    payload = parse_result_line(result.output_tail)
    assert payload is not None, result.output_tail[-3000:]
    return payload, result


def pid_alive(pid: int) -> bool:
    """True while ``pid`` exists and is not a zombie."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"
