"""Which SGLang custom all-reduce class the runtime probe and the bench construct.

SGLang's ``GroupCoordinator`` asks ``dispatch_custom_allreduce`` for the class: without arguments in
0.5.9, with ``group=, device=`` in 0.5.23 (where full-NVLink CUDA groups get the JIT-compiled
``CustomAllReduceV2``); older releases name ``CustomAllreduce`` directly.
``_sfprobe.sglang_custom_allreduce_class`` follows whichever the installed release has. The
selection logic is tested here against stand-in modules (the 0.5.23 dispatcher cannot run without a
GPU), and against the real SGLang 0.5.9 dispatcher in its venv.
"""

from __future__ import annotations

import functools
import subprocess
import sys
import textwrap
import types
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SCRIPTS = REPO / "stackforge" / "probes" / "scripts"
sys.path.insert(0, str(SCRIPTS))
import _sfprobe as sf  # noqa: E402  (in-image helper, not a package module)
from test_probe_scripts import fi063_python  # noqa: E402,F401  (the venv fixture with SGLang 0.5.9)


class CustomAllreduce:
    pass


class CustomAllReduceV2:
    pass


def stand_in(monkeypatch: pytest.MonkeyPatch, **attributes: object) -> None:
    module = types.ModuleType(sf.SGLANG_CUSTOM_AR_MODULE)
    for name, value in attributes.items():
        setattr(module, name, value)
    monkeypatch.setitem(sys.modules, sf.SGLANG_CUSTOM_AR_MODULE, module)


def test_release_without_a_dispatcher_gets_the_legacy_class(monkeypatch):
    stand_in(monkeypatch, CustomAllreduce=CustomAllreduce)
    assert sf.sglang_custom_allreduce_class("group", "cuda:0") == (CustomAllreduce, "CustomAllreduce")


def test_dispatcher_without_arguments_is_called_bare(monkeypatch):
    stand_in(monkeypatch, CustomAllreduce=CustomAllreduce, dispatch_custom_allreduce=lambda: CustomAllreduce)
    assert sf.sglang_custom_allreduce_class("group", "cuda:0") == (CustomAllreduce, "CustomAllreduce")


def test_dispatcher_with_group_and_device_sees_them(monkeypatch):
    seen = {}

    def dispatch_custom_allreduce(group, device):
        seen.update(group=group, device=device)
        return CustomAllReduceV2 if group == "nvlink-clique" else CustomAllreduce

    stand_in(monkeypatch, CustomAllreduce=CustomAllreduce, dispatch_custom_allreduce=dispatch_custom_allreduce)
    assert sf.sglang_custom_allreduce_class("nvlink-clique", "cuda:3") == (CustomAllReduceV2, "CustomAllReduceV2")
    assert seen == {"group": "nvlink-clique", "device": "cuda:3"}
    assert sf.sglang_custom_allreduce_class("pcie", "cuda:0")[1] == "CustomAllreduce"


def test_partial_is_named_after_its_class(monkeypatch):
    chosen = functools.partial(CustomAllReduceV2, enable_register_for_capturing=True)
    stand_in(monkeypatch, dispatch_custom_allreduce=lambda group, device: chosen)
    assert sf.sglang_custom_allreduce_class(None, None) == (chosen, "CustomAllReduceV2(partial)")


def test_real_sglang_059_dispatcher_picks_custom_allreduce_on_cuda(fi063_python):
    """SGLang 0.5.9's own dispatcher, asked as on a CUDA build (the venv's torch is the CPU wheel, so
    SGLang's ``_is_cuda`` is set by hand; everything else is SGLang's code)."""
    code = textwrap.dedent(f"""
        import importlib, sys
        sys.path.insert(0, {str(SCRIPTS)!r})
        import _sfprobe as sf
        module = importlib.import_module(sf.SGLANG_CUSTOM_AR_MODULE)
        module._is_cuda = True
        chosen, name = sf.sglang_custom_allreduce_class(None, None)
        print(name, chosen.__module__)
    """)
    done = subprocess.run([str(fi063_python), "-c", code], capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.split() == ["CustomAllreduce", sf.SGLANG_CUSTOM_AR_MODULE]
