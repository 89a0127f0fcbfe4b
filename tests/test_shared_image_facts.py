"""The image facts shared by the build's verification and every probe record (``_sfshared.py``).

The verification container has nothing mounted, so ``stackforge.build.verify`` sends the shared
file itself as its ``python -c`` program; these tests run that program for real in this machine's
Python and read the shared readers with a stand-in torch (no torch is installed for unit tests).
"""

from __future__ import annotations

import json
import subprocess
import sys
from types import SimpleNamespace

from stackforge.build import verify
from stackforge.inimage import _sfshared


def fake_torch(arch_flags=None, *, raises=False, cuda="13.0"):
    def get_flags():
        if raises:
            raise RuntimeError("no CUDA support compiled in")
        return arch_flags
    has_getter = arch_flags is not None or raises
    c_module = SimpleNamespace(_cuda_getArchFlags=get_flags) if has_getter else SimpleNamespace()
    return SimpleNamespace(__version__="2.14.1+cu130", version=SimpleNamespace(cuda=cuda, git_version="5c48"),
                           _C=c_module)


def test_torch_build_facts_read_the_compile_time_arch_flags():
    assert _sfshared.torch_build_facts(fake_torch("sm_90 sm_120")) == {
        "version": "2.14.1+cu130", "cuda": "13.0", "git_version": "5c48", "arch_flags": "sm_90 sm_120"}
    assert _sfshared.torch_build_facts(fake_torch())["arch_flags"] is None           # no such function
    assert _sfshared.torch_build_facts(fake_torch(raises=True))["arch_flags"] is None
    assert _sfshared.torch_build_facts(fake_torch("", cuda=None))["cuda"] is None    # a CPU build


def test_installed_versions_name_only_what_is_installed():
    versions = _sfshared.installed_versions(["pytest", "no-such-distribution-sf"])
    assert list(versions) == ["pytest"] and versions["pytest"].split(".")[0].isdigit()


def test_verify_program_prints_the_facts_in_a_real_interpreter():
    done = subprocess.run([sys.executable, "-c", verify.facts_program(), "pytest", "no-such-distribution-sf"],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    line = done.stdout.strip().splitlines()[-1]
    assert line.startswith("STACKFORGE_FACTS ")
    facts = json.loads(line.removeprefix("STACKFORGE_FACTS "))
    assert facts["python"] == "%d.%d.%d" % sys.version_info[:3]
    assert list(facts["packages"]) == ["pytest"]
    # Without torch the reason is kept; with torch its build facts (arch flags a string, "" if unknown).
    assert "torch_error" in facts or set(facts["torch"]) == {"version", "cuda", "git_version", "arch_flags"}
